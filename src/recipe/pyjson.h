// Python-compatible JSON text: byte-exact `json.dumps(value, ensure_ascii=False)` with the
// default separators (", " and ": "), as DeepSeek's reference encoder writes tool schemas,
// response formats and non-string tool-call arguments into the prompt.
//
// Rules: object keys keep insertion order (use nlohmann::ordered_json); non-ASCII is written
// raw; `"` `\` and control characters < 0x20 are escaped (\b \f \n \r \t, else \u00xx with
// lowercase hex; 0x7f is not escaped); integers print as-is; floats print like Python's
// repr(float) (shortest round-trip digits, "1.0" for integral values, exponent form
// "1e-07" / "1e+16" outside 1e-4 <= |x| < 1e16); NaN/inf print as NaN/Infinity/-Infinity.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dsinfer::recipe {

// How floats are written: Python's repr, or the V4 prompt encoding's form (deepseek-recipe's V4
// encoding: positional for 1e-5 <= |x| < 1e16, else exponent form without zero padding of a
// negative exponent: 0.00001, 1e-6, 1.5e-7, 1e+16). Everything else is the same.
enum class FloatStyle { kPython, kV4 };

// json.dumps(v, ensure_ascii=False).
std::string py_json_dumps(const nlohmann::ordered_json& v, FloatStyle floats = FloatStyle::kPython);

// json.dumps(s, ensure_ascii=False) for a string: the quoted, escaped form.
std::string py_json_quote(std::string_view s);
// Appends the escaped body of `s` (no surrounding quotes) to `out`.
void py_json_escape_append(std::string_view s, std::string* out);

// repr(float(x)) as json.dumps writes it (kV4: the V4 encoding's form, see FloatStyle).
std::string py_float_repr(double x, FloatStyle style = FloatStyle::kPython);

// Parses JSON text (nlohmann rules: no NaN/Infinity literals, no trailing data; no NUL byte) and
// re-dumps it with py_json_dumps. InvalidArgument if `text` is not valid JSON.
Result<std::string> py_json_normalize(std::string_view text);

}  // namespace dsinfer::recipe
