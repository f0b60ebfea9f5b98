#include "api/detail/json_reader.h"

#include <cmath>
#include <limits>

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

Err parse_body(std::string_view body, Dialect d, Json* out) {
  // Reject deep nesting before parsing: serialisers further down recurse.
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : body) {
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
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return body_error(d,
                          "The request body nests JSON deeper than " +
                              std::to_string(kMaxJsonDepth) + " levels.");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
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

Err Reader::opt_string(const Json& obj,
                       const Path& obj_path,
                       std::string_view key,
                       std::optional<std::string>* out) const {
  const Json* v = find(obj, key);
  if (!v)
    return std::nullopt;
  std::string s;
  DSI_API_TRY(as_string(*v, obj_path.key(key), &s));
  *out = std::move(s);
  return std::nullopt;
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
  const Json* v = find(obj, key);
  if (!v)
    return std::nullopt;
  if (!v->is_boolean())
    return type_error(obj_path.key(key), "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

Err Reader::opt_number(const Json& obj,
                       const Path& obj_path,
                       std::string_view key,
                       std::optional<double>* out) const {
  const Json* v = find(obj, key);
  if (!v)
    return std::nullopt;
  if (!v->is_number())
    return type_error(obj_path.key(key), "a number", *v);
  double x = v->get<double>();
  if (!std::isfinite(x))
    return invalid(obj_path.key(key), "number out of range.");
  *out = x;
  return std::nullopt;
}

Err Reader::opt_int(const Json& obj,
                    const Path& obj_path,
                    std::string_view key,
                    std::optional<int64_t>* out) const {
  const Json* v = find(obj, key);
  if (!v)
    return std::nullopt;
  int64_t x = 0;
  DSI_API_TRY(as_int(*v, obj_path.key(key), &x));
  *out = x;
  return std::nullopt;
}

Err Reader::opt_object(const Json& obj,
                       const Path& obj_path,
                       std::string_view key,
                       const Json** out) const {
  *out = nullptr;
  const Json* v = find(obj, key);
  if (!v)
    return std::nullopt;
  if (!v->is_object())
    return type_error(obj_path.key(key), "an object", *v);
  *out = v;
  return std::nullopt;
}

Err Reader::req_object(const Json& obj,
                       const Path& obj_path,
                       std::string_view key,
                       const Json** out) const {
  DSI_API_TRY(opt_object(obj, obj_path, key, out));
  if (!*out)
    return missing(obj_path.key(key));
  return std::nullopt;
}

Err Reader::opt_array(const Json& obj,
                      const Path& obj_path,
                      std::string_view key,
                      const Json** out) const {
  *out = nullptr;
  const Json* v = find(obj, key);
  if (!v)
    return std::nullopt;
  if (!v->is_array())
    return type_error(obj_path.key(key), "an array", *v);
  *out = v;
  return std::nullopt;
}

Err Reader::req_array(const Json& obj,
                      const Path& obj_path,
                      std::string_view key,
                      const Json** out) const {
  DSI_API_TRY(opt_array(obj, obj_path, key, out));
  if (!*out)
    return missing(obj_path.key(key));
  return std::nullopt;
}

}  // namespace dsinfer::api::detail
