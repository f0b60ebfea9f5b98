#include "api/detail/json_reader.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace dsinfer::api::detail {

Path Path::key(std::string_view k) const {
  Path p = *this;
  p.segs_.push_back(Seg{std::string(k), 0, false});
  return p;
}

Path Path::index(size_t i) const {
  Path p = *this;
  p.segs_.push_back(Seg{std::string(), i, true});
  return p;
}

std::string Path::render(Dialect d) const {
  std::string out;
  for (const Seg& s : segs_) {
    if (s.is_index) {
      if (d == Dialect::kOpenAI) {
        out += '[' + std::to_string(s.idx) + ']';
      } else {
        if (!out.empty())
          out += '.';
        out += std::to_string(s.idx);
      }
    } else {
      if (!out.empty())
        out += '.';
      out += s.key;
    }
  }
  return out;
}

namespace {

ApiError body_error(Dialect d, std::string message) {
  (void)d;
  return invalid_request("", std::move(message));
}

}  // namespace

bool nests_deeper_than(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

JsonShape json_shape(std::string_view text) {
  JsonShape shape;
  // Per open container: keys so far (objects), or SIZE_MAX for arrays.
  std::vector<size_t> keys;
  bool in_string = false;
  bool escaped = false;
  size_t values = 1;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '{':
      case '[':
        keys.push_back(c == '{' ? 0 : SIZE_MAX);
        shape.max_depth = std::max(shape.max_depth, static_cast<int>(keys.size()));
        if (shape.max_depth > kMaxJsonDepth)
          return shape;  // refused anyway; the stack stays small
        break;
      case '}':
      case ']':
        if (!keys.empty())
          keys.pop_back();
        break;
      case ':':
        if (!keys.empty() && keys.back() != SIZE_MAX)
          shape.max_object_keys = std::max(shape.max_object_keys, ++keys.back());
        break;
      case ',':
        ++values;
        break;
      default:
        break;
    }
  }
  shape.values = values;
  return shape;
}

Err parse_body(std::string_view body, Dialect d, Json* out) {
  // Reject deep nesting before parsing: serialisers further down recurse.
  const JsonShape shape = json_shape(body);
  if (shape.max_depth > kMaxJsonDepth) {
    return body_error(
        d, "The request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels.");
  }
  if (shape.max_object_keys > kMaxObjectKeys) {
    return body_error(d,
                      "The request body has a JSON object with more than " +
                          std::to_string(kMaxObjectKeys) + " keys.");
  }
  if (shape.values > kMaxJsonValues) {
    return body_error(
        d, "The request body has more than " + std::to_string(kMaxJsonValues) + " JSON values.");
  }
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return body_error(d,
                      "We could not parse the JSON body of your request. The body must be a "
                      "valid JSON object.");
  }
  if (!j.is_object()) {
    return body_error(
        d, std::string("The request body must be a JSON object, but got ") + json_kind(j) + ".");
  }
  *out = std::move(j);
  return std::nullopt;
}

const char* json_kind(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    default:
      return "an unsupported value";
  }
}

const Json* find(const Json& obj, std::string_view key) {
  if (!obj.is_object())
    return nullptr;
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null())
    return nullptr;
  return &*it;
}

ApiError Reader::missing(const Path& p) const {
  std::string name = p.render(d_);
  std::string msg = d_ == Dialect::kOpenAI ? "Missing required parameter: '" + name + "'."
                                           : name + ": Field required";
  return invalid_request(p.render(Dialect::kOpenAI), std::move(msg));
}

ApiError Reader::type_error(const Path& p, std::string_view expected, const Json& got) const {
  std::string name = p.render(d_);
  std::string msg;
  if (d_ == Dialect::kOpenAI) {
    msg = "Invalid type for '" + name + "': expected " + std::string(expected) + ", but got " +
          json_kind(got) + " instead.";
  } else {
    msg = name + ": Input should be " + std::string(expected) + ", got " + json_kind(got);
  }
  return invalid_request(p.render(Dialect::kOpenAI), std::move(msg));
}

ApiError Reader::invalid(const Path& p, const std::string& detail) const {
  std::string name = p.render(d_);
  std::string msg;
  if (name.empty()) {
    msg = detail;
  } else if (d_ == Dialect::kOpenAI) {
    msg = "Invalid value for '" + name + "': " + detail;
  } else {
    msg = name + ": " + detail;
  }
  return invalid_request(p.render(Dialect::kOpenAI), std::move(msg));
}

Err Reader::as_string(const Json& v, const Path& p, std::string* out) const {
  if (!v.is_string())
    return type_error(p, "a string", v);
  *out = v.get<std::string>();
  return std::nullopt;
}

Err Reader::as_object(const Json& v, const Path& p) const {
  if (!v.is_object())
    return type_error(p, "an object", v);
  return std::nullopt;
}

Err Reader::as_int(const Json& v, const Path& p, int64_t* out) const {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return invalid(p, "integer out of range.");
    }
    *out = static_cast<int64_t>(u);
    return std::nullopt;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return std::nullopt;
  }
  if (v.is_number_float()) {
    double x = v.get<double>();
    // Accept integral floats (2.0), as Python servers do.
    if (std::isfinite(x) && std::trunc(x) == x && std::fabs(x) <= 9007199254740992.0) {
      *out = static_cast<int64_t>(x);
      return std::nullopt;
    }
  }
  return type_error(p, "an integer", v);
}

namespace {

// The shape of opt_string / opt_bool / opt_number / opt_int: absent or null leaves *out unset;
// otherwise `as(value, path, &x)` checks and converts the value.
template <typename T, typename As>
Err opt_scalar(
    const Json& obj, const Path& obj_path, std::string_view key, As&& as, std::optional<T>* out) {
  const Json* v = find(obj, key);
  if (!v)
    return std::nullopt;
  T x{};
  DSI_API_TRY(as(*v, obj_path.key(key), &x));
  *out = std::move(x);
  return std::nullopt;
}

using IsKind = bool (Json::*)() const noexcept;

// The shape of opt_object / opt_array: *out is the value, or nullptr when absent or null.
Err opt_node(const Reader& r,
             const Json& obj,
             const Path& obj_path,
             std::string_view key,
             IsKind is_kind,
             std::string_view expected,
             const Json** out) {
  *out = nullptr;
  const Json* v = find(obj, key);
  if (!v)
    return std::nullopt;
  if (!(v->*is_kind)())
    return r.type_error(obj_path.key(key), expected, *v);
  *out = v;
  return std::nullopt;
}

// req_object / req_array: as opt_node, but absent or null is a "missing" error.
Err req_node(const Reader& r,
             const Json& obj,
             const Path& obj_path,
             std::string_view key,
             IsKind is_kind,
             std::string_view expected,
             const Json** out) {
  DSI_API_TRY(opt_node(r, obj, obj_path, key, is_kind, expected, out));
  if (!*out)
    return r.missing(obj_path.key(key));
  return std::nullopt;
}

}  // namespace

Err Reader::opt_string(const Json& obj,
                       const Path& obj_path,
                       std::string_view key,
                       std::optional<std::string>* out) const {
  auto as = [this](const Json& v, const Path& p, std::string* x) { return as_string(v, p, x); };
  return opt_scalar(obj, obj_path, key, as, out);
}

Err Reader::req_string(const Json& obj,
                       const Path& obj_path,
                       std::string_view key,
                       std::string* out) const {
  const Json* v = find(obj, key);
  if (!v)
    return missing(obj_path.key(key));
  return as_string(*v, obj_path.key(key), out);
}

Err Reader::opt_bool(const Json& obj,
                     const Path& obj_path,
                     std::string_view key,
                     std::optional<bool>* out) const {
  auto as = [this](const Json& v, const Path& p, bool* x) -> Err {
    if (!v.is_boolean())
      return type_error(p, "a boolean", v);
    *x = v.get<bool>();
    return std::nullopt;
  };
  return opt_scalar(obj, obj_path, key, as, out);
}

Err Reader::opt_number(const Json& obj,
                       const Path& obj_path,
                       std::string_view key,
                       std::optional<double>* out) const {
  auto as = [this](const Json& v, const Path& p, double* x) -> Err {
    if (!v.is_number())
      return type_error(p, "a number", v);
    *x = v.get<double>();
    if (!std::isfinite(*x))
      return invalid(p, "number out of range.");
    return std::nullopt;
  };
  return opt_scalar(obj, obj_path, key, as, out);
}

Err Reader::opt_int(const Json& obj,
                    const Path& obj_path,
                    std::string_view key,
                    std::optional<int64_t>* out) const {
  auto as = [this](const Json& v, const Path& p, int64_t* x) { return as_int(v, p, x); };
  return opt_scalar(obj, obj_path, key, as, out);
}

Err Reader::opt_object(const Json& obj,
                       const Path& obj_path,
                       std::string_view key,
                       const Json** out) const {
  return opt_node(*this, obj, obj_path, key, &Json::is_object, "an object", out);
}

Err Reader::req_object(const Json& obj,
                       const Path& obj_path,
                       std::string_view key,
                       const Json** out) const {
  return req_node(*this, obj, obj_path, key, &Json::is_object, "an object", out);
}

Err Reader::opt_array(const Json& obj,
                      const Path& obj_path,
                      std::string_view key,
                      const Json** out) const {
  return opt_node(*this, obj, obj_path, key, &Json::is_array, "an array", out);
}

Err Reader::req_array(const Json& obj,
                      const Path& obj_path,
                      std::string_view key,
                      const Json** out) const {
  return req_node(*this, obj, obj_path, key, &Json::is_array, "an array", out);
}

}  // namespace dsinfer::api::detail
