// Internal: exception-free, type-checked access to request JSON with errors that name the
// field. Every value is type-checked before any get<>.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/error.h"

namespace dsinfer::api::detail {

using Json = nlohmann::ordered_json;
using Err = std::optional<ApiError>;

// Propagates an Err from a helper.
#define DSI_API_TRY(expr)                              \
  do {                                                 \
    ::dsinfer::api::detail::Err dsi_api_err_ = (expr); \
    if (dsi_api_err_)                                  \
      return std::move(*dsi_api_err_);                 \
  } while (0)

// How error messages spell paths: OpenAI "messages[1].content[0].text", Anthropic
// "messages.1.content.0.text".
enum class Dialect { kOpenAI, kAnthropic };

class Path {
 public:
  Path() = default;
  Path key(std::string_view k) const;
  Path index(size_t i) const;
  std::string render(Dialect d) const;
  bool empty() const { return segs_.empty(); }

 private:
  struct Seg {
    std::string key;
    size_t idx = 0;
    bool is_index = false;
  };
  std::vector<Seg> segs_;
};

// Nesting limit for request bodies (checked on the raw text before parsing).
inline constexpr int kMaxJsonDepth = 128;

// Whether `text` nests arrays/objects deeper than max_depth (brackets inside strings do not
// count). A cheap pre-check before parsing: serialisers further down recurse.
bool nests_deeper_than(std::string_view text, int max_depth);

// Size bounds of a request body's JSON, checked on the raw text before parsing: the parsed type
// keeps object keys in order in a vector, so building an object of n keys costs O(n^2) key
// comparisons. With these bounds the worst body parses in well under a second.
inline constexpr size_t kMaxObjectKeys = 1024;
inline constexpr size_t kMaxJsonValues = size_t{1} << 18;

// The shape of JSON text (brackets, colons and commas inside strings do not count): the deepest
// nesting, the most keys in one object and (about) the number of values.
struct JsonShape {
  int max_depth = 0;
  size_t max_object_keys = 0;
  size_t values = 0;
};
JsonShape json_shape(std::string_view text);

// Parses a request body: 400 on bad JSON, excessive nesting, too many keys in an object or
// values in the body (the bounds above), or a non-object root.
Err parse_body(std::string_view body, Dialect d, Json* out);

// "a string", "an integer", … for messages.
const char* json_kind(const Json& v);

// Lookup: nullptr when the key is absent or null.
const Json* find(const Json& obj, std::string_view key);

class Reader {
 public:
  explicit Reader(Dialect d) : d_(d) {}
  Dialect dialect() const { return d_; }

  ApiError missing(const Path& p) const;
  ApiError type_error(const Path& p, std::string_view expected, const Json& got) const;
  ApiError invalid(const Path& p, const std::string& detail) const;

  // Typed field access on `obj` (an object) at `obj_path`. opt_*: absent/null leaves *out
  // unset. req_*: absent/null is a "missing" error.
  Err opt_string(const Json& obj,
                 const Path& obj_path,
                 std::string_view key,
                 std::optional<std::string>* out) const;
  Err req_string(const Json& obj,
                 const Path& obj_path,
                 std::string_view key,
                 std::string* out) const;
  Err opt_bool(const Json& obj,
               const Path& obj_path,
               std::string_view key,
               std::optional<bool>* out) const;
  Err opt_number(const Json& obj,
                 const Path& obj_path,
                 std::string_view key,
                 std::optional<double>* out) const;
  Err opt_int(const Json& obj,
              const Path& obj_path,
              std::string_view key,
              std::optional<int64_t>* out) const;
  Err opt_object(const Json& obj,
                 const Path& obj_path,
                 std::string_view key,
                 const Json** out) const;
  Err req_object(const Json& obj,
                 const Path& obj_path,
                 std::string_view key,
                 const Json** out) const;
  Err opt_array(const Json& obj,
                const Path& obj_path,
                std::string_view key,
                const Json** out) const;
  Err req_array(const Json& obj,
                const Path& obj_path,
                std::string_view key,
                const Json** out) const;

  // Value-level checks (v at path p).
  Err as_string(const Json& v, const Path& p, std::string* out) const;
  Err as_object(const Json& v, const Path& p) const;
  Err as_int(const Json& v, const Path& p, int64_t* out) const;

 private:
  Dialect d_;
};

// Calls f(element, element_path, index) -> Err for each element of the array `arr` at p once it
// is checked to be an object.
template <typename F>
Err for_each_object(const Reader& r, const Json& arr, const Path& p, F&& f) {
  for (size_t i = 0; i < arr.size(); ++i) {
    const Json& e = arr[i];
    Path ep = p.index(i);
    DSI_API_TRY(r.as_object(e, ep));
    DSI_API_TRY(f(e, ep, i));
  }
  return std::nullopt;
}

// Calls f(element, element_path, type) -> Err for each element of the array `arr` at p once it is
// checked to be an object with a string "type" (content parts and blocks).
template <typename F>
Err for_each_typed(const Reader& r, const Json& arr, const Path& p, F&& f) {
  return for_each_object(r, arr, p, [&](const Json& e, const Path& ep, size_t) -> Err {
    std::string type;
    DSI_API_TRY(r.req_string(e, ep, "type", &type));
    return f(e, ep, type);
  });
}

// Content at p that is a string (copied to *text) or an array of typed parts or blocks (each
// passed to for_each_typed's f); anything else is a type error that expects `expected`.
template <typename F>
Err read_text_or_typed(const Reader& r,
                       const Json& v,
                       const Path& p,
                       std::string_view expected,
                       std::string* text,
                       F&& f) {
  if (v.is_string()) {
    *text = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array())
    return r.type_error(p, expected, v);
  return for_each_typed(r, v, p, f);
}

}  // namespace dsinfer::api::detail
