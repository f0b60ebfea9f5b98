// Chat Completions request decoding (spec §3.1).
#include <set>

#include "api/chat.h"
#include "api/detail/common.h"

namespace dsinfer::api {

using detail::Dialect;
using detail::Err;
using detail::find;
using detail::Json;
using detail::Path;
using detail::Reader;
using recipe::ContentBlock;
using recipe::GenerationRequest;
using recipe::Message;
using recipe::Role;

namespace {

// Parts that we do not render but accept (the prompt gets "[Unsupported <type>]").
bool is_placeholder_part(const std::string& type) {
  return type == "image_url" || type == "file" || type == "input_audio" || type == "video_url";
}

// A string or an array of {"type":"text","text":…} parts, concatenated.
// Text content: a string, or text parts concatenated (`separator` between parts; system
// messages join them with a blank line, as deepseek-recipe does).
Err read_text_content(const Reader& r,
                      const Json& v,
                      const Path& p,
                      std::string* out,
                      std::string_view separator = "") {
  size_t parts = 0;
  return detail::read_text_or_typed(
      r,
      v,
      p,
      "a string or an array of content parts",
      out,
      [&](const Json& part, const Path& pp, const std::string& type) -> Err {
        if (type == "text") {
          std::string text;
          DSI_API_TRY(r.req_string(part, pp, "text", &text));
          if (parts++ > 0)
            out->append(separator);
          *out += text;
        } else if (type == "refusal") {
          // Assistant refusals carry no prompt text.
        } else {
          return r.invalid(
              pp.key("type"),
              "'" + type.substr(0, 64) + "' parts are not allowed here; only 'text' parts are.");
        }
        return std::nullopt;
      });
}

// User/tool content: a string (-> content) or parts (-> blocks).
Err read_parts_content(const Reader& r, const Json& v, const Path& p, Message* m) {
  return detail::read_text_or_typed(
      r,
      v,
      p,
      "a string or an array of content parts",
      &m->content,
      [&](const Json& part, const Path& pp, const std::string& type) -> Err {
        ContentBlock b;
        if (type == "text") {
          b.type = ContentBlock::Type::kText;
          DSI_API_TRY(r.req_string(part, pp, "text", &b.text));
        } else if (is_placeholder_part(type)) {
          b.type = ContentBlock::Type::kUnsupported;
          b.unsupported_type = type;
        } else {
          return r.invalid(pp.key("type"),
                           "'" + type.substr(0, 64) +
                               "' is not one of 'text', 'image_url', 'file', 'input_audio'.");
        }
        m->blocks.push_back(std::move(b));
        return std::nullopt;
      });
}

// Chat tools nest the function: {"type": "function", "function": {"name", …}}. Rendered as
// detail::function_json (name, description, parameters).
Err read_tools(const Reader& r, const Json& root, recipe::Conversation* conv) {
  return detail::for_each_tool(
      r, root, [&](const Json& t, const Path& tp, std::set<std::string>* seen) -> Err {
        std::string type;
        DSI_API_TRY(r.req_string(t, tp, "type", &type));
        if (type != "function") {
          return r.invalid(
              tp.key("type"),
              "only 'function' tools are supported, got '" + type.substr(0, 64) + "'.");
        }
        const Json* fn = nullptr;
        DSI_API_TRY(r.req_object(t, tp, "function", &fn));
        return detail::read_openai_function(r, root, *fn, tp.key("function"), seen, conv);
      });
}

// Chat names a tool as {"type": "function", "function": {"name": …}}.
Err read_tool_choice(const Reader& r, const Json& root, recipe::Conversation* conv) {
  const Json* tc = nullptr;
  std::string type;
  DSI_API_TRY(detail::read_openai_tool_choice(
      r, root, "'required' needs at least one tool in 'tools'.", conv, &tc, &type));
  if (!tc)
    return std::nullopt;
  Path p = Path().key("tool_choice");
  if (type != "function")
    return r.invalid(p.key("type"), "must be 'function'.");
  const Json* fn = nullptr;
  DSI_API_TRY(r.req_object(*tc, p, "function", &fn));
  std::string name;
  DSI_API_TRY(r.req_string(*fn, p.key("function"), "name", &name));
  return detail::name_tool_choice(
      r, p.key("function").key("name"), name, "tool", " in 'tools'", conv);
}

Err read_assistant_tool_calls(const Reader& r, const Json& m, const Path& mp, Message* msg) {
  const Json* calls = nullptr;
  DSI_API_TRY(r.opt_array(m, mp, "tool_calls", &calls));
  if (!calls)
    return std::nullopt;
  return detail::for_each_object(
      r, *calls, mp.key("tool_calls"), [&](const Json& c, const Path& cp, size_t) -> Err {
        recipe::ToolCall call;
        DSI_API_TRY(r.req_string(c, cp, "id", &call.id));
        std::optional<std::string> type;
        DSI_API_TRY(r.opt_string(c, cp, "type", &type));
        if (type && *type != "function")
          return r.invalid(cp.key("type"), "must be 'function'.");
        const Json* fn = nullptr;
        DSI_API_TRY(r.req_object(c, cp, "function", &fn));
        Path fp = cp.key("function");
        DSI_API_TRY(r.req_string(*fn, fp, "name", &call.name));
        DSI_API_TRY(r.req_string(*fn, fp, "arguments", &call.arguments));
        // Not validated: text that is not a JSON object renders as {"arguments": text}
        // (deepseek-recipe).
        msg->tool_calls.push_back(std::move(call));
        return std::nullopt;
      });
}

Err read_messages(const Reader& r,
                  const Json& root,
                  const DecodeOptions& opts,
                  GenerationRequest* req) {
  const Json* msgs = nullptr;
  DSI_API_TRY(r.req_array(root, Path(), "messages", &msgs));
  if (msgs->empty())
    return r.invalid(Path().key("messages"), "must contain at least one message.");
  const bool check_reasoning = opts.require_reasoning_passback &&
                               req->conversation.thinking == recipe::ThinkingMode::kThinking &&
                               !req->conversation.tools.empty();
  std::set<std::string> open_call_ids;  // ids of the tool calls that tool messages may answer
  bool after_tool_calls = false;        // the previous message is assistant+tool_calls or tool
  return detail::for_each_object(
      r, *msgs, Path().key("messages"), [&](const Json& m, const Path& mp, size_t i) -> Err {
        std::string role;
        DSI_API_TRY(r.req_string(m, mp, "role", &role));
        Message msg;
        if (role == "system" || role == "latest_reminder") {
          // deepseek-recipe accepts `latest_reminder` (a reminder turn) and has no `developer`
          // role in Chat Completions.
          msg.role = role == "system" ? Role::kSystem : Role::kLatestReminder;
          const Json* c = find(m, "content");
          if (!c)
            return r.missing(mp.key("content"));
          DSI_API_TRY(read_text_content(r, *c, mp.key("content"), &msg.content, "\n\n"));
          after_tool_calls = false;
        } else if (role == "user") {
          msg.role = Role::kUser;
          const Json* c = find(m, "content");
          if (!c)
            return r.missing(mp.key("content"));
          DSI_API_TRY(read_parts_content(r, *c, mp.key("content"), &msg));
          after_tool_calls = false;
        } else if (role == "assistant") {
          msg.role = Role::kAssistant;
          if (const Json* c = find(m, "content")) {
            DSI_API_TRY(read_text_content(r, *c, mp.key("content"), &msg.content));
          }
          std::optional<std::string> reasoning;
          DSI_API_TRY(r.opt_string(m, mp, "reasoning_content", &reasoning));
          msg.reasoning_content = reasoning;
          std::optional<bool> prefix;
          DSI_API_TRY(r.opt_bool(m, mp, "prefix", &prefix));
          if (prefix.value_or(false)) {
            if (i + 1 != msgs->size()) {
              return r.invalid(mp.key("prefix"),
                               "only the last message may be an assistant prefix (prefix: true).");
            }
            msg.prefix = true;
          }
          DSI_API_TRY(read_assistant_tool_calls(r, m, mp, &msg));
          if (check_reasoning && !msg.prefix && !msg.reasoning_content) {
            return r.invalid(
                mp.key("reasoning_content"),
                "The reasoning_content in the thinking mode must be passed back to the "
                "API.");
          }
          // deepseek-recipe's default (ReasoningContentBehavior::FillEmpty): missing reasoning
          // that must be rendered is rendered empty.
          if (!check_reasoning && !msg.reasoning_content)
            msg.reasoning_content = "";
          open_call_ids.clear();
          for (const recipe::ToolCall& c : msg.tool_calls) open_call_ids.insert(c.id);
          after_tool_calls = !msg.tool_calls.empty();
        } else if (role == "tool") {
          msg.role = Role::kTool;
          DSI_API_TRY(r.req_string(m, mp, "tool_call_id", &msg.tool_call_id));
          const Json* c = find(m, "content");
          if (!c)
            return r.missing(mp.key("content"));
          DSI_API_TRY(read_parts_content(r, *c, mp.key("content"), &msg));
          if (!after_tool_calls) {
            return r.invalid(mp.key("role"),
                             "messages with role 'tool' must follow an assistant message with "
                             "'tool_calls'.");
          }
          if (open_call_ids.count(msg.tool_call_id) == 0) {
            return r.invalid(mp.key("tool_call_id"),
                             "'" + msg.tool_call_id.substr(0, 128) +
                                 "' does not match any tool call of the preceding assistant "
                                 "message.");
          }
        } else {
          return r.invalid(mp.key("role"),
                           "'" + role.substr(0, 64) +
                               "' is not one of 'system', 'user', 'assistant', "
                               "'tool', 'latest_reminder'.");
        }
        req->conversation.messages.push_back(std::move(msg));
        return std::nullopt;
      });
}

// vLLM's structured-output extensions: `structured_outputs` {json | regex | grammar} and the older
// top-level `guided_json` / `guided_regex` / `guided_grammar` (a schema is an object or its JSON
// text). One constraint per request, response_format's included.
Err read_structured_outputs(const Reader& r, const Json& root, recipe::GenerationRequest* req) {
  using Kind = recipe::OutputConstraint::Kind;
  struct Field {
    const Json* obj;
    Path path;
    const char* key;
    Kind kind;
  };
  std::vector<Field> fields;
  const Json* so = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "structured_outputs", &so));
  if (so) {
    const Path sp = Path().key("structured_outputs");
    fields.push_back({so, sp, "json", Kind::kJsonSchema});
    fields.push_back({so, sp, "regex", Kind::kRegex});
    fields.push_back({so, sp, "grammar", Kind::kGrammar});
  }
  fields.push_back({&root, Path(), "guided_json", Kind::kJsonSchema});
  fields.push_back({&root, Path(), "guided_regex", Kind::kRegex});
  fields.push_back({&root, Path(), "guided_grammar", Kind::kGrammar});
  for (const Field& f : fields) {
    const Json* v = find(*f.obj, f.key);
    if (!v)
      continue;
    const Path p = f.path.key(f.key);
    if (req->constraint.kind != Kind::kNone) {
      return r.invalid(p,
                       "only one structured output constraint is allowed per request (already "
                       "given: " +
                           req->constraint.param + ").");
    }
    recipe::OutputConstraint c;
    c.kind = f.kind;
    c.param = p.render(r.dialect());
    if (f.kind == Kind::kJsonSchema && (v->is_object() || v->is_boolean())) {
      c.text = v->dump();
    } else if (v->is_string()) {
      c.text = v->get<std::string>();
    } else {
      return r.type_error(
          p, f.kind == Kind::kJsonSchema ? "an object or a string" : "a string", *v);
    }
    req->constraint = std::move(c);
  }
  return std::nullopt;
}

Err read_response_format(const Reader& r, const Json& root, recipe::Conversation* conv) {
  const Json* rf = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "response_format", &rf));
  if (!rf)
    return std::nullopt;
  std::optional<std::string> type;
  Path p = Path().key("response_format");
  DSI_API_TRY(r.opt_string(*rf, p, "type", &type));
  if (!type || *type == "text")
    return std::nullopt;
  if (*type == "json_object") {
    conv->json_output = true;
    return std::nullopt;
  }
  if (*type == "json_schema") {
    // {"type": "json_schema", "json_schema": {"name"?, "schema", "strict"?}}: the schema is
    // rendered (deepseek-recipe).
    const Json* js = nullptr;
    DSI_API_TRY(r.req_object(*rf, p, "json_schema", &js));
    const Json* schema = nullptr;
    DSI_API_TRY(r.req_object(*js, p.key("json_schema"), "schema", &schema));
    conv->json_output = true;
    conv->response_format_json = detail::py_dumps(*schema);
    return std::nullopt;
  }
  return r.invalid(
      p.key("type"),
      "'" + type->substr(0, 64) + "' is not one of 'text', 'json_object', 'json_schema'.");
}

Err read_user_id(const Reader& r, const Json& root, std::string_view key, std::string* out) {
  std::optional<std::string> v;
  DSI_API_TRY(r.opt_string(root, Path(), key, &v));
  if (!v)
    return std::nullopt;
  bool ok = v->size() <= 512;
  for (char c : *v) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '_');
  }
  if (!ok) {
    return r.invalid(Path().key(key), "must be at most 512 characters from [a-zA-Z0-9-_].");
  }
  *out = std::move(*v);
  return std::nullopt;
}

Err decode(std::string_view body, const DecodeOptions& opts, GenerationRequest* req) {
  const Reader r(Dialect::kOpenAI);
  Json root;
  DSI_API_TRY(detail::parse_body(body, Dialect::kOpenAI, &root));
  DSI_API_TRY(detail::read_model(r, root, opts, /*accept_claude=*/false, &req->model));

  std::optional<int64_t> n;
  DSI_API_TRY(r.opt_int(root, Path(), "n", &n));
  if (n && *n < 1)
    return r.invalid(Path().key("n"), "must be at least 1.");
  if (n && *n > opts.max_choices) {
    return r.invalid(Path().key("n"),
                     "must be at most " + std::to_string(opts.max_choices) + ", got " +
                         std::to_string(*n) + ".");
  }
  req->n = static_cast<int32_t>(n.value_or(1));

  std::optional<bool> stream;
  DSI_API_TRY(r.opt_bool(root, Path(), "stream", &stream));
  req->stream = stream.value_or(false);
  std::optional<int64_t> best_of;
  DSI_API_TRY(r.opt_int(root, Path(), "best_of", &best_of));
  if (best_of) {
    if (*best_of < req->n) {
      return r.invalid(Path().key("best_of"),
                       "must be at least n (" + std::to_string(req->n) + "), got " +
                           std::to_string(*best_of) + ".");
    }
    if (*best_of > opts.max_choices) {
      return r.invalid(Path().key("best_of"),
                       "must be at most " + std::to_string(opts.max_choices) + ", got " +
                           std::to_string(*best_of) + ".");
    }
    if (req->stream && *best_of > req->n)
      return r.invalid(Path().key("best_of"), "best_of > n is not supported with stream.");
    req->best_of = static_cast<int32_t>(*best_of);
  }
  const Json* so = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "stream_options", &so));
  if (so) {
    if (!req->stream) {
      return r.invalid(Path().key("stream_options"),
                       "stream_options is only allowed when stream is true.");
    }
    std::optional<bool> include_usage;
    DSI_API_TRY(r.opt_bool(*so, Path().key("stream_options"), "include_usage", &include_usage));
    req->include_usage = include_usage.value_or(false);
  }

  detail::ThinkingControls tc;
  const Json* thinking = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "thinking", &thinking));
  if (thinking) {
    std::optional<std::string> type;
    DSI_API_TRY(r.opt_string(*thinking, Path().key("thinking"), "type", &type));
    if (type) {
      if (*type == "enabled") {
        tc.enabled = true;
      } else if (*type == "disabled") {
        tc.enabled = false;
      } else {
        return r.invalid(Path().key("thinking").key("type"),
                         "'" + type->substr(0, 64) + "' is not one of 'enabled', 'disabled'.");
      }
    }
  }
  if (const Json* e = find(root, "reasoning_effort")) {
    EffortSetting es;
    DSI_API_TRY(detail::read_effort(r, Path().key("reasoning_effort"), *e, &es));
    tc.effort = es;
  }
  detail::apply_thinking(tc, opts, &req->conversation);

  DSI_API_TRY(read_tools(r, root, &req->conversation));
  DSI_API_TRY(read_tool_choice(r, root, &req->conversation));
  DSI_API_TRY(detail::check_tool_choice_mode(r, Path().key("tool_choice"), req->conversation));
  std::optional<bool> parallel;
  DSI_API_TRY(r.opt_bool(root, Path(), "parallel_tool_calls", &parallel));
  req->parallel_tool_calls = parallel.value_or(true);
  DSI_API_TRY(read_response_format(r, root, &req->conversation));
  // The response format constrains the answer too (json_schema: its schema, always enforced).
  if (req->conversation.response_format_json) {
    req->constraint = {recipe::OutputConstraint::Kind::kJsonSchema,
                       *req->conversation.response_format_json,
                       "response_format"};
  } else if (req->conversation.json_output) {
    req->constraint = {recipe::OutputConstraint::Kind::kJsonObject, "", "response_format"};
  }
  DSI_API_TRY(read_structured_outputs(r, root, req));
  DSI_API_TRY(read_messages(r, root, opts, req));
  DSI_API_TRY(detail::check_conversation_rules(
      r,
      req->conversation,
      find(root, "response_format") != nullptr,
      Path().key("response_format"),
      "Prompt must contain the word 'json' in some form to use 'response_format' of type "
      "'json_object'."));

  recipe::SamplingParams& s = req->sampling;
  DSI_API_TRY(detail::read_max_tokens(r, root, "max_tokens", opts, &s.max_tokens));
  std::optional<int64_t> mct;
  DSI_API_TRY(detail::read_max_tokens(r, root, "max_completion_tokens", opts, &mct));
  if (mct)
    s.max_tokens = mct;
  DSI_API_TRY(detail::read_temperature_top_p(r, root, opts, req));
  DSI_API_TRY(detail::read_stop(r, root, "stop", 16, &s.stop));
  std::optional<int64_t> seed;
  DSI_API_TRY(r.opt_int(root, Path(), "seed", &seed));
  if (seed)
    s.seed = static_cast<uint64_t>(*seed);
  std::optional<bool> logprobs;
  DSI_API_TRY(r.opt_bool(root, Path(), "logprobs", &logprobs));
  s.logprobs = logprobs.value_or(false);
  std::optional<int64_t> top_logprobs;
  DSI_API_TRY(detail::read_top_logprobs(r, root, opts, &top_logprobs));
  if (top_logprobs) {
    if (!s.logprobs) {
      return r.invalid(Path().key("top_logprobs"),
                       "logprobs must be true when top_logprobs is set.");
    }
    s.top_logprobs = static_cast<int32_t>(*top_logprobs);
  }
  // Deprecated and ignored, but type-checked.
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    std::optional<double> v;
    DSI_API_TRY(r.opt_number(root, Path(), key, &v));
    if (v && (*v < -2.0 || *v > 2.0))
      return r.invalid(Path().key(key), "must be between -2 and 2.");
  }
  std::optional<std::string> user;
  DSI_API_TRY(r.opt_string(root, Path(), "user", &user));
  DSI_API_TRY(detail::read_metadata(r, root));
  if (user)
    req->user = *user;
  DSI_API_TRY(read_user_id(r, root, "user_id", &req->user));
  return std::nullopt;
}

}  // namespace

ApiResult<GenerationRequest> decode_chat_request(std::string_view body, const DecodeOptions& opts) {
  return detail::decode_request(decode, body, opts);
}

}  // namespace dsinfer::api
