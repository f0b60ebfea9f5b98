// OpenAI Responses request decoding (spec §3.3).
#include <algorithm>
#include <map>
#include <set>

#include "api/detail/common.h"
#include "api/responses.h"

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

// Built-in tool types that DeepSeek ignores.
bool is_ignored_tool(const std::string& type) {
  return type == "web_search" || type == "web_search_preview" || type == "file_search" ||
         type == "code_interpreter" || type == "computer_use" || type == "computer_use_preview" ||
         type == "mcp" || type == "image_generation" || type == "local_shell" || type == "shell" ||
         type.rfind("web_search_preview_", 0) == 0 || type.rfind("web_search_", 0) == 0;
}

// Responses tools are flat: {"type": "function", "name", "description", "parameters", "strict"}.
Err read_tools(const Reader& r, const Json& root, recipe::Conversation* conv) {
  return detail::for_each_tool(
      r, root, [&](const Json& t, const Path& tp, std::set<std::string>* seen) -> Err {
        std::string type;
        DSI_API_TRY(r.req_string(t, tp, "type", &type));
        if (is_ignored_tool(type))
          return std::nullopt;
        if (type == "custom") {
          return r.invalid(tp.key("type"), "custom tools are not supported; use function tools.");
        }
        if (type != "function") {
          return r.invalid(tp.key("type"),
                           "tools of type '" + type.substr(0, 64) + "' are not supported.");
        }
        return detail::read_openai_function(r, root, t, tp, seen, conv);
      });
}

// Responses names a tool as {"type": "function", "name": …}.
Err read_tool_choice(const Reader& r, const Json& root, recipe::Conversation* conv) {
  const Json* tc = nullptr;
  std::string type;
  DSI_API_TRY(detail::read_openai_tool_choice(
      r, root, "'required' needs at least one function tool.", conv, &tc, &type));
  if (!tc)
    return std::nullopt;
  Path p = Path().key("tool_choice");
  if (type != "function") {
    return r.invalid(
        p.key("type"),
        "only 'function' tool choices are supported, got '" + type.substr(0, 64) + "'.");
  }
  std::string name;
  DSI_API_TRY(r.req_string(*tc, p, "name", &name));
  return detail::name_tool_choice(r, p.key("name"), name, "function tool", "", conv);
}

Err read_text_format(const Reader& r, const Json& root, recipe::Conversation* conv) {
  const Json* text = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "text", &text));
  if (!text)
    return std::nullopt;
  Path tp = Path().key("text");
  std::optional<std::string> verbosity;
  DSI_API_TRY(r.opt_string(*text, tp, "verbosity", &verbosity));  // ignored
  const Json* format = nullptr;
  DSI_API_TRY(r.opt_object(*text, tp, "format", &format));
  if (!format)
    return std::nullopt;
  Path fp = tp.key("format");
  std::string type;
  DSI_API_TRY(r.req_string(*format, fp, "type", &type));
  if (type == "text")
    return std::nullopt;
  if (type == "json_object") {
    conv->json_output = true;
    return std::nullopt;
  }
  if (type == "json_schema") {
    std::string name;
    DSI_API_TRY(r.req_string(*format, fp, "name", &name));
    const Json* schema = nullptr;
    DSI_API_TRY(r.req_object(*format, fp, "schema", &schema));
    conv->json_output = true;
    // The schema itself is rendered, not the format object around it (deepseek-recipe).
    conv->response_format_json = detail::py_dumps(*schema);
    return std::nullopt;
  }
  return r.invalid(
      fp.key("type"),
      "'" + type.substr(0, 64) + "' is not one of 'text', 'json_object', 'json_schema'.");
}

enum class PartsFor { kUser, kSystem, kAssistant, kToolOutput };

// Message content / tool output: a string or content parts.
Err read_parts(const Reader& r, const Json& v, const Path& p, PartsFor who, Message* m) {
  const bool text_only = who == PartsFor::kSystem || who == PartsFor::kAssistant;
  return detail::read_text_or_typed(
      r,
      v,
      p,
      "a string or an array of content parts",
      &m->content,
      [&](const Json& part, const Path& pp, const std::string& type) -> Err {
        if (type == "input_text" || type == "output_text" || type == "text") {
          std::string text;
          DSI_API_TRY(r.req_string(part, pp, "text", &text));
          if (text_only) {
            m->content += text;
          } else {
            ContentBlock b;
            b.type = ContentBlock::Type::kText;
            b.text = std::move(text);
            m->blocks.push_back(std::move(b));
          }
        } else if (type == "refusal" && who == PartsFor::kAssistant) {
          // no prompt text
        } else if (type == "input_image") {
          if (text_only) {
            return r.invalid(
                pp.key("type"),
                "images are only allowed in user/developer messages and tool outputs.");
          }
          ContentBlock b;
          b.type = ContentBlock::Type::kUnsupported;
          b.unsupported_type = type;
          m->blocks.push_back(std::move(b));
        } else if (type == "input_file") {
          return r.invalid(pp.key("type"), "file inputs are not supported.");
        } else {
          return r.invalid(pp.key("type"),
                           "'" + type.substr(0, 64) +
                               "' is not one of 'input_text', 'output_text', "
                               "'input_image'.");
        }
        return std::nullopt;
      });
}

class ItemReader {
 public:
  ItemReader(const Reader& r, std::vector<Message>* out) : r_(r), out_(out) {}

  Err read(const Json& items) {
    Path base = Path().key("input");
    DSI_API_TRY(detail::for_each_object(
        r_, items, base, [&](const Json& item, const Path& ip, size_t i) -> Err {
          std::optional<std::string> type;
          DSI_API_TRY(r_.opt_string(item, ip, "type", &type));
          if (!type) {
            if (!find(item, "role"))
              return r_.missing(ip.key("type"));
            type = "message";
          }
          if (*type == "message") {
            DSI_API_TRY(message(item, ip));
          } else if (*type == "function_call") {
            DSI_API_TRY(function_call(item, ip, i));
          } else if (*type == "function_call_output") {
            DSI_API_TRY(function_call_output(item, ip));
          } else if (*type == "reasoning") {
            DSI_API_TRY(reasoning(item, ip));
          } else if (*type == "custom_tool_call" || *type == "custom_tool_call_output") {
            return r_.invalid(ip.key("type"), "custom tool items are not supported.");
          } else if (*type == "item_reference") {
            return r_.invalid(ip.key("type"),
                              "item_reference is not supported: this server stores no items; "
                              "send the items themselves.");
          } else if (*type == "web_search_call" || *type == "file_search_call" ||
                     *type == "code_interpreter_call" || *type == "image_generation_call") {
            // History of hosted tools this server does not run: nothing to render.
          } else {
            return r_.invalid(ip.key("type"),
                              "unknown input item type '" + detail::quote(*type) + "'.");
          }
          return std::nullopt;
        }));
    for (const auto& [id, index] : calls_) {
      if (outputs_.count(id) == 0) {
        return r_.invalid(
            base.index(index).key("call_id"),
            "function call '" + id.substr(0, 128) + "' has no matching function_call_output item.");
      }
    }
    return std::nullopt;
  }

 private:
  Message* last_assistant() {
    if (out_->empty() || out_->back().role != Role::kAssistant)
      return nullptr;
    return &out_->back();
  }
  Message* new_assistant() {
    Message m;
    m.role = Role::kAssistant;
    out_->push_back(std::move(m));
    return &out_->back();
  }

  Err message(const Json& item, const Path& ip) {
    std::string role;
    DSI_API_TRY(r_.req_string(item, ip, "role", &role));
    const Json* content = find(item, "content");
    if (!content)
      return r_.missing(ip.key("content"));
    Path cp = ip.key("content");
    Message m;
    if (role == "user" || role == "developer") {
      m.role = Role::kUser;
      m.developer = role == "developer";
      DSI_API_TRY(read_parts(r_, *content, cp, PartsFor::kUser, &m));
    } else if (role == "system") {
      m.role = Role::kSystem;
      DSI_API_TRY(read_parts(r_, *content, cp, PartsFor::kSystem, &m));
    } else if (role == "assistant") {
      m.role = Role::kAssistant;
      DSI_API_TRY(read_parts(r_, *content, cp, PartsFor::kAssistant, &m));
      Message* a = last_assistant();
      if (a && a->content.empty() && a->tool_calls.empty()) {
        a->content = std::move(m.content);
        return std::nullopt;
      }
    } else {
      return r_.invalid(ip.key("role"),
                        "'" + role.substr(0, 64) +
                            "' is not one of 'user', 'assistant', 'system', "
                            "'developer'.");
    }
    out_->push_back(std::move(m));
    return std::nullopt;
  }

  Err function_call(const Json& item, const Path& ip, size_t index) {
    recipe::ToolCall call;
    DSI_API_TRY(r_.req_string(item, ip, "call_id", &call.id));
    if (call.id.empty())
      return r_.invalid(ip.key("call_id"), "must not be empty.");
    DSI_API_TRY(r_.req_string(item, ip, "name", &call.name));
    DSI_API_TRY(r_.req_string(item, ip, "arguments", &call.arguments));
    // Not validated: text that is not a JSON object renders as {"arguments": text}
    // (deepseek-recipe).
    if (!calls_.emplace(call.id, index).second) {
      return r_.invalid(ip.key("call_id"), "duplicate call_id '" + call.id.substr(0, 128) + "'.");
    }
    Message* a = last_assistant();
    if (!a)
      a = new_assistant();
    a->tool_calls.push_back(std::move(call));
    return std::nullopt;
  }

  Err function_call_output(const Json& item, const Path& ip) {
    Message m;
    m.role = Role::kTool;
    DSI_API_TRY(r_.req_string(item, ip, "call_id", &m.tool_call_id));
    if (calls_.count(m.tool_call_id) == 0) {
      return r_.invalid(
          ip.key("call_id"),
          "no earlier function_call has call_id '" + m.tool_call_id.substr(0, 128) + "'.");
    }
    if (!outputs_.insert(m.tool_call_id).second) {
      return r_.invalid(
          ip.key("call_id"),
          "duplicate function_call_output for '" + m.tool_call_id.substr(0, 128) + "'.");
    }
    const Json* output = find(item, "output");
    if (!output)
      return r_.missing(ip.key("output"));
    DSI_API_TRY(read_parts(r_, *output, ip.key("output"), PartsFor::kToolOutput, &m));
    out_->push_back(std::move(m));
    return std::nullopt;
  }

  Err reasoning(const Json& item, const Path& ip) {
    std::string text;
    const Json* content = nullptr;
    DSI_API_TRY(r_.opt_array(item, ip, "content", &content));
    if (content) {
      DSI_API_TRY(detail::for_each_typed(
          r_,
          *content,
          ip.key("content"),
          [&](const Json& part, const Path& pp, const std::string& type) -> Err {
            if (type != "reasoning_text") {
              return r_.invalid(pp.key("type"),
                                "reasoning content parts must be 'reasoning_text'.");
            }
            std::string t;
            DSI_API_TRY(r_.req_string(part, pp, "text", &t));
            text += t;
            return std::nullopt;
          }));
    }
    // `summary` and `encrypted_content` are not supported and ignored.
    Message* a = last_assistant();
    if (!(a && !a->reasoning_content && a->content.empty() && a->tool_calls.empty())) {
      a = new_assistant();
    }
    a->reasoning_content = std::move(text);
    return std::nullopt;
  }

  const Reader& r_;
  std::vector<Message>* out_;
  std::map<std::string, size_t> calls_;  // call_id -> item index
  std::set<std::string> outputs_;
};

Err decode(std::string_view body, const DecodeOptions& opts, GenerationRequest* req) {
  const Reader r(Dialect::kOpenAI);
  Json root;
  DSI_API_TRY(detail::parse_body(body, Dialect::kOpenAI, &root));
  DSI_API_TRY(detail::read_model(r, root, opts, /*accept_claude=*/false, &req->model));
  std::optional<bool> stream;
  DSI_API_TRY(r.opt_bool(root, Path(), "stream", &stream));
  req->stream = stream.value_or(false);

  detail::ThinkingControls tc;
  const Json* reasoning = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "reasoning", &reasoning));
  if (reasoning) {
    if (const Json* e = find(*reasoning, "effort")) {
      EffortSetting es;
      DSI_API_TRY(detail::read_effort(r, Path().key("reasoning").key("effort"), *e, &es));
      tc.effort = es;
    }
    std::optional<std::string> summary;
    DSI_API_TRY(r.opt_string(*reasoning, Path().key("reasoning"), "summary", &summary));
  }
  detail::apply_thinking(tc, opts, &req->conversation);

  DSI_API_TRY(read_tools(r, root, &req->conversation));
  DSI_API_TRY(read_tool_choice(r, root, &req->conversation));
  DSI_API_TRY(detail::check_tool_choice_mode(r, Path().key("tool_choice"), req->conversation));
  DSI_API_TRY(read_text_format(r, root, &req->conversation));
  // text.format constrains the answer (json_schema: its schema, always enforced).
  if (req->conversation.response_format_json) {
    req->constraint = {recipe::OutputConstraint::Kind::kJsonSchema,
                       *req->conversation.response_format_json,
                       "text.format"};
  } else if (req->conversation.json_output) {
    req->constraint = {recipe::OutputConstraint::Kind::kJsonObject, "", "text.format"};
  }

  std::optional<std::string> instructions;
  DSI_API_TRY(r.opt_string(root, Path(), "instructions", &instructions));
  std::vector<Message>& msgs = req->conversation.messages;
  if (instructions) {
    Message m;
    m.role = Role::kSystem;
    m.content = *instructions;
    msgs.push_back(std::move(m));
  }
  const Json* input = find(root, "input");
  if (!input && !instructions) {
    return r.invalid(Path().key("input"),
                     "at least one of 'input' and 'instructions' is required.");
  }
  if (input) {
    if (input->is_string()) {
      Message m;
      m.role = Role::kUser;
      m.content = input->get<std::string>();
      msgs.push_back(std::move(m));
    } else if (input->is_array()) {
      ItemReader items(r, &msgs);
      DSI_API_TRY(items.read(*input));
    } else {
      return r.type_error(Path().key("input"), "a string or an array of input items", *input);
    }
  }

  DSI_API_TRY(detail::check_conversation_rules(
      r,
      req->conversation,
      req->conversation.json_output,
      Path().key("text").key("format"),
      "Response input messages must contain the word 'json' in some form to use 'text.format' "
      "of type 'json_object'."));

  recipe::SamplingParams& s = req->sampling;
  DSI_API_TRY(detail::read_max_tokens(r, root, "max_output_tokens", opts, &s.max_tokens));
  DSI_API_TRY(detail::read_temperature_top_p(r, root, opts, req));
  std::optional<int64_t> top_logprobs;
  DSI_API_TRY(detail::read_top_logprobs(r, root, opts, &top_logprobs));
  if (top_logprobs) {
    s.top_logprobs = static_cast<int32_t>(*top_logprobs);
    s.logprobs = *top_logprobs > 0;
  }
  // include: "message.output_text.logprobs" asks for the output text's logprobs; the other
  // documented values name outputs this server never produces and are accepted.
  const Json* include = nullptr;
  DSI_API_TRY(r.opt_array(root, Path(), "include", &include));
  if (include) {
    static constexpr std::string_view kKnown[] = {"message.output_text.logprobs",
                                                  "reasoning.encrypted_content",
                                                  "message.input_image.image_url",
                                                  "computer_call_output.output.image_url",
                                                  "file_search_call.results",
                                                  "code_interpreter_call.outputs",
                                                  "web_search_call.action.sources",
                                                  "web_search_call.results"};
    for (size_t i = 0; i < include->size(); ++i) {
      std::string v;
      DSI_API_TRY(r.as_string((*include)[i], Path().key("include").index(i), &v));
      if (std::find(std::begin(kKnown), std::end(kKnown), v) == std::end(kKnown)) {
        return r.invalid(Path().key("include").index(i),
                         "unknown include value '" + detail::quote(v) + "'.");
      }
      if (v == "message.output_text.logprobs")
        s.logprobs = true;
    }
  }
  std::optional<bool> parallel;
  DSI_API_TRY(r.opt_bool(root, Path(), "parallel_tool_calls", &parallel));
  req->parallel_tool_calls = parallel.value_or(true);
  std::optional<int64_t> max_tool_calls;
  DSI_API_TRY(r.opt_int(root, Path(), "max_tool_calls", &max_tool_calls));  // ignored
  std::optional<std::string> user;
  DSI_API_TRY(r.opt_string(root, Path(), "user", &user));
  if (user)
    req->user = *user;
  // Stateless server: refuse what needs stored responses instead of silently ignoring it.
  std::optional<std::string> previous;
  DSI_API_TRY(r.opt_string(root, Path(), "previous_response_id", &previous));
  if (previous) {
    return r.invalid(Path().key("previous_response_id"),
                     "is not supported: this server is stateless and stores no responses; send "
                     "the whole conversation in 'input'.");
  }
  std::optional<bool> store;
  DSI_API_TRY(r.opt_bool(root, Path(), "store", &store));
  if (store.value_or(false)) {
    return r.invalid(Path().key("store"),
                     "true is not supported: this server is stateless and stores no responses; "
                     "omit it or set it to false.");
  }
  DSI_API_TRY(detail::read_metadata(r, root));
  return std::nullopt;
}

}  // namespace

ApiResult<GenerationRequest> decode_responses_request(std::string_view body,
                                                      const DecodeOptions& opts) {
  return detail::decode_request(decode, body, opts);
}

}  // namespace dsinfer::api
