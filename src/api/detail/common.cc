#include "api/detail/common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "recipe/pyjson.h"

namespace dsinfer::api::detail {

std::string quote(std::string_view value) {
  constexpr size_t kMax = 128;
  if (value.size() <= kMax)
    return std::string(value);
  size_t n = kMax;
  while (n > 0 && (static_cast<unsigned char>(value[n]) & 0xC0) == 0x80) --n;
  return std::string(value.substr(0, n)) + "...";
}

Err read_metadata(const Reader& r, const Json& root) {
  const Json* metadata = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "metadata", &metadata));
  if (!metadata)
    return std::nullopt;
  const Path p = Path().key("metadata");
  if (metadata->size() > 16)
    return r.invalid(p, "must have at most 16 keys, got " + std::to_string(metadata->size()) + ".");
  for (const auto& [key, value] : metadata->items()) {
    if (key.size() > 64)
      return r.invalid(p, "keys must be at most 64 characters long.");
    std::string text;
    DSI_API_TRY(r.as_string(value, p.key(quote(key)), &text));
    if (text.size() > 512)
      return r.invalid(p.key(key), "must be at most 512 characters long.");
  }
  return std::nullopt;
}

Err read_model(const Reader& r,
               const Json& root,
               const DecodeOptions& opts,
               bool accept_claude,
               std::string* out) {
  Path p = Path().key("model");
  DSI_API_TRY(r.req_string(root, Path(), "model", out));
  if (out->empty())
    return r.invalid(p, "must not be empty.");
  if (opts.served_models.empty())
    return std::nullopt;
  if (std::find(opts.served_models.begin(), opts.served_models.end(), *out) !=
      opts.served_models.end()) {
    return std::nullopt;
  }
  if (accept_claude && out->rfind("claude", 0) == 0)
    return std::nullopt;
  std::string served;
  for (const std::string& m : opts.served_models) {
    if (!served.empty())
      served += ", ";
    served += "'" + m + "'";
  }
  // 404 as OpenAI and vLLM answer (Anthropic's shape renders it as not_found_error).
  ApiError e = r.invalid(
      p, "model '" + quote(*out) + "' does not exist; this server serves " + served + ".");
  e.http_status = 404;
  e.code = "model_not_found";
  return e;
}

Err check_tool_name(const Reader& r,
                    const Path& p,
                    const std::string& name,
                    std::set<std::string>* seen) {
  bool ok = !name.empty() && name.size() <= 128;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-')) {
      ok = false;
      break;
    }
  }
  if (!ok) {
    return r.invalid(
        p, "tool names must match ^[a-zA-Z0-9_-]{1,128}$, got '" + name.substr(0, 160) + "'.");
  }
  if (!seen->insert(name).second)
    return r.invalid(p, "duplicate tool name '" + name + "'.");
  return std::nullopt;
}

Err read_top_logprobs(const Reader& r,
                      const Json& root,
                      const DecodeOptions& opts,
                      std::optional<int64_t>* out) {
  DSI_API_TRY(r.opt_int(root, Path(), "top_logprobs", out));
  if (*out && (**out < 0 || **out > opts.max_top_logprobs)) {
    return r.invalid(Path().key("top_logprobs"),
                     "must be between 0 and " + std::to_string(opts.max_top_logprobs) + ", got " +
                         std::to_string(**out) + ".");
  }
  return std::nullopt;
}

Err read_function_fields(const Reader& r,
                         const Json& fn,
                         const Path& fp,
                         std::set<std::string>* seen,
                         FunctionFields* out) {
  DSI_API_TRY(r.req_string(fn, fp, "name", &out->name));
  DSI_API_TRY(check_tool_name(r, fp.key("name"), out->name, seen));
  return r.opt_string(fn, fp, "description", &out->description);
}

std::string function_json(const FunctionFields& f) {
  // deepseek-recipe's tool line: every field present (a missing description is "", missing
  // parameters {}), and the `strict` flag itself is never rendered.
  Json fn = Json::object();
  fn["name"] = f.name;
  fn["description"] = f.description.value_or("");
  fn["parameters"] = f.parameters ? *f.parameters : Json::object();
  return py_dumps(fn);
}

Err read_openai_function(const Reader& r,
                         const Json& root,
                         const Json& fn,
                         const Path& fp,
                         std::set<std::string>* seen,
                         recipe::Conversation* conv) {
  FunctionFields f;
  DSI_API_TRY(read_function_fields(r, fn, fp, seen, &f));
  DSI_API_TRY(r.opt_object(fn, fp, "parameters", &f.parameters));
  DSI_API_TRY(r.opt_bool(fn, fp, "strict", &f.strict));
  Json strict_params;
  const Json* choice = find(root, "tool_choice");
  const bool offered = !(choice && choice->is_string() && *choice == "none");
  if (f.strict.value_or(false) && offered) {
    DSI_API_TRY(normalize_strict_schema(r, f.parameters, fp.key("parameters"), &strict_params));
    f.parameters = &strict_params;
  }
  conv->tools.push_back(recipe::ToolSpec{f.name, function_json(f), f.strict.value_or(false)});
  return std::nullopt;
}

namespace {

Err strict_schema(const Reader& r, const Json& in, const Path& p, Json* out) {
  auto schema_error = [&](const std::string& what) {
    return r.invalid(p, "Invalid tool parameters schema : " + what);
  };
  if (!in.is_object())
    return schema_error("a schema must be an object");
  *out = Json::object();
  auto copy = [&](const char* key) {
    if (const Json* v = find(in, key))
      (*out)[key] = *v;
  };
  const Json* type = find(in, "type");
  if (!type) {
    if (const Json* any = find(in, "anyOf")) {
      if (!any->is_array())
        return schema_error("anyOf must be an array");
      Json list = Json::array();
      for (size_t i = 0; i < any->size(); ++i) {
        Json sub;
        DSI_API_TRY(strict_schema(r, (*any)[i], p, &sub));
        list.push_back(std::move(sub));
      }
      (*out)["anyOf"] = std::move(list);
      copy("description");
      return std::nullopt;
    }
    if (find(in, "$ref")) {
      copy("$ref");
      copy("description");
      return std::nullopt;
    }
    return schema_error("one of `type`, `anyOf`, `$ref` field is required");
  }
  (*out)["type"] = *type;
  const std::string t = type->is_string() ? type->get<std::string>() : std::string();
  if (t == "object") {
    Json props = Json::object();
    if (const Json* ps = find(in, "properties"); ps && ps->is_object()) {
      for (const auto& [k, v] : ps->items()) {
        Json sub;
        DSI_API_TRY(strict_schema(r, v, p, &sub));
        props[k] = std::move(sub);
      }
    }
    Json required = Json::array();
    if (const Json* req = find(in, "required"); req && req->is_array())
      required = *req;
    std::set<std::string> listed;
    for (const Json& k : required) {
      if (k.is_string())
        listed.insert(k.get<std::string>());
    }
    for (const auto& [k, v] : props.items()) {
      if (!listed.count(k))
        return r.invalid(p, "Required properties must match all properties in the object");
    }
    (*out)["properties"] = std::move(props);
    (*out)["additionalProperties"] = false;
    (*out)["required"] = std::move(required);
    copy("description");
  } else if (t == "array") {
    if (const Json* items = find(in, "items")) {
      Json sub;
      DSI_API_TRY(strict_schema(r, *items, p, &sub));
      (*out)["items"] = std::move(sub);
    }
    copy("description");
  } else if (t == "string") {
    copy("description");
    copy("pattern");
    if (const Json* f = find(in, "format")) {
      const std::string fs = f->is_string() ? f->get<std::string>() : f->dump();
      if (fs != "email" && fs != "hostname" && fs != "ipv4" && fs != "ipv6" && fs != "uuid") {
        return schema_error("unknown variant `" + fs.substr(0, 64) +
                            "`, expected one of `email`, `hostname`, `ipv4`, `ipv6`, `uuid`");
      }
      (*out)["format"] = *f;
    }
    copy("enum");
  } else if (t == "number" || t == "integer") {
    copy("description");
    for (const char* k :
         {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "default"}) {
      copy(k);
    }
  } else {
    copy("description");
  }
  return std::nullopt;
}

}  // namespace

Err normalize_strict_schema(const Reader& r, const Json* in, const Path& p, Json* out) {
  if (!in) {
    *out = Json::object();
    (*out)["type"] = "object";
    (*out)["properties"] = Json::object();
    (*out)["additionalProperties"] = false;
    (*out)["required"] = Json::array();
    return std::nullopt;
  }
  return strict_schema(r, *in, p, out);
}

void default_tool_choice(recipe::Conversation* conv) {
  conv->tool_choice = conv->tools.empty() ? recipe::ToolChoice::kNone : recipe::ToolChoice::kAuto;
}

Err require_tool_choice(const Reader& r,
                        const Path& p,
                        std::string_view no_tools_message,
                        recipe::Conversation* conv) {
  if (conv->tools.empty())
    return r.invalid(p, std::string(no_tools_message));
  conv->tool_choice = recipe::ToolChoice::kRequired;
  return std::nullopt;
}

Err name_tool_choice(const Reader& r,
                     const Path& name_path,
                     const std::string& name,
                     std::string_view tool_kind,
                     std::string_view where,
                     recipe::Conversation* conv) {
  bool known = false;
  for (const recipe::ToolSpec& t : conv->tools) known = known || t.name == name;
  if (!known) {
    return r.invalid(name_path,
                     "no " + std::string(tool_kind) + " named '" + name.substr(0, 128) + "'" +
                         std::string(where) + ".");
  }
  conv->tool_choice = recipe::ToolChoice::kNamed;
  conv->tool_choice_name = name;
  return std::nullopt;
}

Err read_openai_tool_choice(const Reader& r,
                            const Json& root,
                            std::string_view required_without_tools,
                            recipe::Conversation* conv,
                            const Json** object,
                            std::string* type) {
  *object = nullptr;
  default_tool_choice(conv);
  const Json* tc = find(root, "tool_choice");
  if (!tc)
    return std::nullopt;
  Path p = Path().key("tool_choice");
  if (tc->is_string()) {
    std::string s = tc->get<std::string>();
    if (s == "none") {
      conv->tool_choice = recipe::ToolChoice::kNone;
    } else if (s == "auto") {
      // Keeps the default (auto with tools, none without).
    } else if (s == "required") {
      DSI_API_TRY(require_tool_choice(r, p, required_without_tools, conv));
    } else {
      return r.invalid(p, "'" + s.substr(0, 64) + "' is not one of 'none', 'auto', 'required'.");
    }
    return std::nullopt;
  }
  if (!tc->is_object())
    return r.type_error(p, "a string or an object", *tc);
  DSI_API_TRY(r.req_string(*tc, p, "type", type));
  *object = tc;
  return std::nullopt;
}

Err read_effort(const Reader& r, const Path& p, const Json& v, EffortSetting* out) {
  std::string s;
  DSI_API_TRY(r.as_string(v, p, &s));
  std::optional<EffortSetting> e = parse_effort(s);
  if (!e) {
    return r.invalid(p,
                     "'" + s.substr(0, 64) +
                         "' is not one of 'none', 'minimal', 'low', 'medium', 'high', "
                         "'xhigh', 'max', 'ultra'.");
  }
  *out = *e;
  return std::nullopt;
}

void apply_thinking(const ThinkingControls& c,
                    const DecodeOptions& opts,
                    recipe::Conversation* conv) {
  bool on = c.enabled.value_or(true);
  // Effort "none" turns thinking off unless thinking was explicitly enabled (deepseek-recipe:
  // then it is ignored and the default effort applies).
  if (c.effort && c.effort->thinking_off && !c.enabled.has_value())
    on = false;
  conv->thinking = on ? recipe::ThinkingMode::kThinking : recipe::ThinkingMode::kChat;
  conv->effort = recipe::ReasoningEffort::kUnset;
  if (on) {
    conv->effort = c.effort && c.effort->effort != recipe::ReasoningEffort::kUnset
                       ? c.effort->effort
                       : opts.default_effort;
  }
}

namespace {

bool mentions_json(std::string_view text) {
  for (size_t i = 0; i + 4 <= text.size(); ++i) {
    if ((text[i] | 0x20) == 'j' && (text[i + 1] | 0x20) == 's' && (text[i + 2] | 0x20) == 'o' &&
        (text[i + 3] | 0x20) == 'n') {
      return true;
    }
  }
  return false;
}

}  // namespace

Err check_conversation_rules(const Reader& r,
                             const recipe::Conversation& conv,
                             bool has_response_format,
                             const Path& response_format_path,
                             const std::string& json_word_message) {
  if (has_response_format && conv.tool_choice != recipe::ToolChoice::kNone) {
    for (const recipe::ToolSpec& t : conv.tools) {
      const bool offered =
          conv.tool_choice != recipe::ToolChoice::kNamed || t.name == conv.tool_choice_name;
      if (offered && t.strict)
        return r.invalid(response_format_path, "response_format should not be used with tools");
    }
  }
  const auto& msgs = conv.messages;
  if (!msgs.empty() && msgs.back().prefix) {
    bool calls = !conv.tools.empty();
    for (const recipe::Message& m : msgs)
      calls = calls || !m.tool_calls.empty() || m.role == recipe::Role::kTool;
    if (calls)
      return r.invalid(Path(), "Function call should not be used with prefix");
  }
  if (conv.json_output && !conv.response_format_json) {
    bool found = false;
    for (const recipe::Message& m : msgs) {
      found = found || mentions_json(m.content);
      for (const recipe::ContentBlock& b : m.blocks) found = found || mentions_json(b.text);
    }
    if (!found)
      return r.invalid(Path(), json_word_message);
  }
  return std::nullopt;
}

Err check_tool_choice_mode(const Reader& r,
                           const Path& tool_choice_path,
                           const recipe::Conversation& conv) {
  if (conv.thinking == recipe::ThinkingMode::kThinking &&
      (conv.tool_choice == recipe::ToolChoice::kRequired ||
       conv.tool_choice == recipe::ToolChoice::kNamed)) {
    return r.invalid(tool_choice_path,
                     "Thinking mode does not support this tool_choice (a required or named "
                     "tool call); disable thinking to use it.");
  }
  return std::nullopt;
}

Err read_temperature_top_p(const Reader& r,
                           const Json& root,
                           const DecodeOptions& opts,
                           recipe::GenerationRequest* req) {
  std::optional<double> temperature;
  std::optional<double> top_p;
  DSI_API_TRY(r.opt_number(root, Path(), "temperature", &temperature));
  DSI_API_TRY(r.opt_number(root, Path(), "top_p", &top_p));
  if (temperature && (*temperature < 0.0 || *temperature > 2.0)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", *temperature);
    return r.invalid(Path().key("temperature"),
                     std::string("must be between 0 and 2, got ") + buf + ".");
  }
  if (top_p && (*top_p <= 0.0 || *top_p > 1.0)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", *top_p);
    return r.invalid(Path().key("top_p"),
                     std::string("must be greater than 0 and at most 1, got ") + buf + ".");
  }
  recipe::SamplingParams& s = req->sampling;
  s.temperature = static_cast<float>(temperature.value_or(1.0));
  s.top_p = static_cast<float>(top_p.value_or(1.0));
  if (opts.apply_thinking_sampling_rules) {
    if (req->conversation.thinking == recipe::ThinkingMode::kThinking) {
      s.temperature = 1.0f;
      s.top_p = std::max(s.top_p, 0.95f);
    } else {
      s.top_p = 1.0f;
    }
  }
  return std::nullopt;
}

Err read_max_tokens(const Reader& r,
                    const Json& root,
                    std::string_view key,
                    const DecodeOptions& opts,
                    std::optional<int64_t>* out) {
  std::optional<int64_t> v;
  DSI_API_TRY(r.opt_int(root, Path(), key, &v));
  if (!v)
    return std::nullopt;
  if (*v < 1 || *v > opts.max_output_tokens) {
    return r.invalid(Path().key(key),
                     "must be between 1 and " + std::to_string(opts.max_output_tokens) + ", got " +
                         std::to_string(*v) + ".");
  }
  *out = v;
  return std::nullopt;
}

Err read_stop(const Reader& r,
              const Json& root,
              std::string_view key,
              size_t max_count,
              std::vector<std::string>* out) {
  const Json* v = find(root, key);
  if (!v)
    return std::nullopt;
  Path p = Path().key(key);
  if (v->is_string()) {
    std::string s = v->get<std::string>();
    if (!s.empty())
      out->push_back(std::move(s));
    return std::nullopt;
  }
  if (!v->is_array())
    return r.type_error(p, "a string or an array of strings", *v);
  if (max_count != 0 && v->size() > max_count) {
    return r.invalid(p,
                     "at most " + std::to_string(max_count) + " stop sequences are allowed, got " +
                         std::to_string(v->size()) + ".");
  }
  for (size_t i = 0; i < v->size(); ++i) {
    std::string s;
    DSI_API_TRY(r.as_string((*v)[i], p.index(i), &s));
    if (!s.empty())
      out->push_back(std::move(s));
  }
  return std::nullopt;
}

bool is_json_text(const std::string& text) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    return true;
  // Same nesting guard as request bodies.
  if (nests_deeper_than(text, kMaxJsonDepth))
    return false;
  return Json::accept(text);
}

std::string py_dumps(const Json& v) {
  return recipe::py_json_dumps(v);
}

std::string dump(const Json& v) {
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {
Json logprob_fields(const std::string& bytes, float logprob) {
  Json j = Json::object();
  j["token"] = bytes;
  j["logprob"] = std::isfinite(logprob) ? static_cast<double>(logprob) : -9999.0;
  Json b = Json::array();
  for (unsigned char c : bytes) b.push_back(static_cast<int>(c));
  j["bytes"] = std::move(b);
  return j;
}
}  // namespace

Json openai_logprob(const recipe::TokenLogprob& t) {
  Json j = logprob_fields(t.bytes, t.logprob);
  Json top = Json::array();
  for (const recipe::TokenAlternative& a : t.top) top.push_back(logprob_fields(a.bytes, a.logprob));
  j["top_logprobs"] = std::move(top);
  return j;
}

std::string sse_data(const Json& v) {
  return "data: " + dump(v) + "\n\n";
}

std::string sse_event(const std::string& name, const Json& v) {
  return "event: " + name + "\ndata: " + dump(v) + "\n\n";
}

uint64_t IdGen::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string IdGen::draw(int n, std::string_view alphabet) {
  std::string s;
  s.reserve(n);
  for (int i = 0; i < n; ++i) s += alphabet[next() % alphabet.size()];
  return s;
}

std::string IdGen::alnum(int n) {
  return draw(n, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz");
}

std::string IdGen::hex(int n) {
  return draw(n, "0123456789abcdef");
}

std::string IdGen::uuid() {
  std::string h = hex(32);
  h[12] = '4';
  h[16] = "89ab"[next() % 4];
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) +
         "-" + h.substr(20);
}

uint64_t mix_seed(uint64_t seed, uint64_t salt) {
  IdGen g(seed ^ (salt * 0xD6E8FEB86659FD93ull));
  return g.next();
}

std::string openai_tool_call_id(uint64_t seed, int index) {
  IdGen g(mix_seed(seed, 0x7001u + static_cast<uint64_t>(index)));
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, "call_%02d_", index % 100);
  return prefix + g.alnum(24);
}

std::string anthropic_tool_use_id(uint64_t seed, int index) {
  IdGen g(mix_seed(seed, 0x7001u + static_cast<uint64_t>(index)));
  return "toolu_" + g.alnum(24);
}

recipe::FinishReason effective_finish(recipe::FinishReason f, bool has_tool_calls) {
  if (has_tool_calls && (f == recipe::FinishReason::kStop))
    return recipe::FinishReason::kToolCalls;
  return f;
}

}  // namespace dsinfer::api::detail
