#include "recipe/pyjson.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

namespace dsinfer::recipe {
namespace {

void dump_into(const nlohmann::ordered_json& v, FloatStyle fs, std::string* out) {
  using V = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case V::null:
    case V::discarded:
      out->append("null");
      return;
    case V::boolean:
      out->append(v.get<bool>() ? "true" : "false");
      return;
    case V::number_integer:
      out->append(std::to_string(v.get<int64_t>()));
      return;
    case V::number_unsigned:
      out->append(std::to_string(v.get<uint64_t>()));
      return;
    case V::number_float:
      out->append(py_float_repr(v.get<double>(), fs));
      return;
    case V::string:
      out->push_back('"');
      py_json_escape_append(v.get_ref<const std::string&>(), out);
      out->push_back('"');
      return;
    case V::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first)
          out->append(", ");
        first = false;
        dump_into(e, fs, out);
      }
      out->push_back(']');
      return;
    }
    case V::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, value] : v.items()) {
        if (!first)
          out->append(", ");
        first = false;
        out->push_back('"');
        py_json_escape_append(key, out);
        out->append("\": ");
        dump_into(value, fs, out);
      }
      out->push_back('}');
      return;
    }
    case V::binary: {
      // Not produced by the JSON parser; written as the list of byte values.
      out->push_back('[');
      bool first = true;
      for (uint8_t b : v.get_binary()) {
        if (!first)
          out->append(", ");
        first = false;
        out->append(std::to_string(b));
      }
      out->push_back(']');
      return;
    }
  }
}

}  // namespace

void py_json_escape_append(std::string_view s, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(ch);
        }
    }
  }
}

std::string py_json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  py_json_escape_append(s, &out);
  out.push_back('"');
  return out;
}

std::string py_float_repr(double x, FloatStyle style) {
  if (std::isnan(x))
    return "NaN";
  if (std::isinf(x))
    return x > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits in scientific form: "[-]d[.ddd]e[+-]xx".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  bool neg = false;
  if (!sci.empty() && sci[0] == '-') {
    neg = true;
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.')
      digits.push_back(c);
  }
  const int exp10 = std::atoi(std::string(sci.substr(e + 1)).c_str());
  // Python (format_float_short, repr mode): value = 0.DIGITS * 10^decpt.
  const int decpt = exp10 + 1;
  std::string out = neg ? "-" : "";
  const int nd = static_cast<int>(digits.size());
  const bool v4 = style == FloatStyle::kV4;
  if ((v4 ? decpt <= -5 : decpt <= -4) || decpt > 16) {
    out.push_back(digits[0]);
    if (nd > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    char eb[16];
    std::snprintf(eb,
                  sizeof(eb),
                  v4 && exp10 < 0 ? "e%c%d" : "e%c%02d",
                  exp10 < 0 ? '-' : '+',
                  std::abs(exp10));
    out.append(eb);
  } else if (decpt <= 0) {
    out.append("0.");
    out.append(static_cast<size_t>(-decpt), '0');
    out.append(digits);
  } else if (decpt >= nd) {
    out.append(digits);
    out.append(static_cast<size_t>(decpt - nd), '0');
    out.append(".0");
  } else {
    out.append(digits, 0, static_cast<size_t>(decpt));
    out.push_back('.');
    out.append(digits, static_cast<size_t>(decpt), std::string::npos);
  }
  return out;
}

std::string py_json_dumps(const nlohmann::ordered_json& v, FloatStyle floats) {
  std::string out;
  dump_into(v, floats, &out);
  return out;
}

Result<std::string> py_json_normalize(std::string_view text) {
  // nlohmann's lexer treats a NUL byte as the end of input; Python rejects it.
  if (text.find('\0') != std::string_view::npos)
    return invalid_argument("not valid JSON");
  auto v = nlohmann::ordered_json::parse(text.begin(),
                                         text.end(),
                                         nullptr,
                                         /*allow_exceptions=*/false);
  if (v.is_discarded())
    return invalid_argument("not valid JSON");
  return py_json_dumps(v);
}

}  // namespace dsinfer::recipe
