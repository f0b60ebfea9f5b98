// Anthropic Messages request decoding (spec §3.2).
#include <cstdio>
#include <set>

#include "api/detail/common.h"
#include "api/messages.h"

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

// Block types DeepSeek documents as not supported.
bool is_rejected_block(const std::string& type) {
  return type == "document" || type == "search_result" || type == "redacted_thinking" ||
         type == "code_execution_tool_result" || type == "mcp_tool_use" ||
         type == "mcp_tool_result" || type == "container_upload";
}

Err unsupported_block(const Reader& r, const Path& type_path, const std::string& type) {
  return r.invalid(type_path,
                   "content blocks of type '" + type.substr(0, 64) + "' are not supported.");
}

Err read_system(const Reader& r, const Json& root, GenerationRequest* req) {
  const Json* sys = find(root, "system");
  if (!sys)
    return std::nullopt;
  Path p = Path().key("system");
  std::string text;
  DSI_API_TRY(detail::read_text_or_typed(
      r,
      *sys,
      p,
      "a string or an array of text blocks",
      &text,
      [&](const Json& b, const Path& bp, const std::string& type) -> Err {
        if (type != "text")
          return r.invalid(bp.key("type"), "system blocks must be 'text' blocks.");
        std::string t;
        DSI_API_TRY(r.req_string(b, bp, "text", &t));
        if (!text.empty() && !t.empty())
          text += "\n\n";
        text += t;
        return std::nullopt;
      }));
  if (text.empty())
    return std::nullopt;
  Message m;
  m.role = Role::kSystem;
  m.content = std::move(text);
  req->conversation.messages.push_back(std::move(m));
  return std::nullopt;
}

// Anthropic tools: {"type"?: "custom", "name", "description", "input_schema"}.
Err read_tools(const Reader& r, const Json& root, recipe::Conversation* conv) {
  return detail::for_each_tool(
      r, root, [&](const Json& t, const Path& tp, std::set<std::string>* seen) -> Err {
        std::optional<std::string> type;
        DSI_API_TRY(r.opt_string(t, tp, "type", &type));
        if (type && *type != "custom") {
          return r.invalid(tp.key("type"),
                           "tools of type '" + type->substr(0, 64) +
                               "' are not supported; only client tools are.");
        }
        detail::FunctionFields f;
        DSI_API_TRY(detail::read_function_fields(r, t, tp, seen, &f));
        DSI_API_TRY(r.req_object(t, tp, "input_schema", &f.parameters));
        DSI_API_TRY(r.opt_bool(t, tp, "strict", &f.strict));
        // `strict` is accepted; deepseek-recipe does not normalise Messages tool schemas.
        conv->tools.push_back(
            recipe::ToolSpec{f.name, detail::function_json(f), f.strict.value_or(false)});
        return std::nullopt;
      });
}

// Anthropic tool_choice is always an object: {"type": "auto" | "any" | "tool" | "none", …}.
Err read_tool_choice(const Reader& r, const Json& root, recipe::GenerationRequest* req) {
  recipe::Conversation* conv = &req->conversation;
  detail::default_tool_choice(conv);
  const Json* tc = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "tool_choice", &tc));
  if (!tc)
    return std::nullopt;
  Path p = Path().key("tool_choice");
  std::string type;
  DSI_API_TRY(r.req_string(*tc, p, "type", &type));
  std::optional<bool> dptu;
  DSI_API_TRY(r.opt_bool(*tc, p, "disable_parallel_tool_use", &dptu));
  req->parallel_tool_calls = !dptu.value_or(false);
  if (type == "none") {
    conv->tool_choice = recipe::ToolChoice::kNone;
  } else if (type == "auto") {
    // Keeps the default (auto with tools, none without).
  } else if (type == "any") {
    DSI_API_TRY(
        detail::require_tool_choice(r, p.key("type"), "'any' needs at least one tool.", conv));
    // deepseek-recipe renders `any` as `auto` (no tool block opened after the generation prompt,
    // also accepted in thinking mode); the call is not forced.
    conv->tool_choice = recipe::ToolChoice::kAuto;
  } else if (type == "tool") {
    std::string name;
    DSI_API_TRY(r.req_string(*tc, p, "name", &name));
    return detail::name_tool_choice(r, p.key("name"), name, "tool", " in tools", conv);
  } else {
    return r.invalid(
        p.key("type"),
        "Input should be 'auto', 'any', 'tool' or 'none', got '" + type.substr(0, 64) + "'.");
  }
  return std::nullopt;
}

// Stop sequences per request (Anthropic documents no bound; each one is checked against the
// output as it streams, so the count is bounded).
constexpr size_t kMaxStopSequences = 64;

// An image block must carry a `source` object (the image itself is not rendered: the model
// reads text only).
Err check_image_source(const Reader& r, const Json& block, const Path& bp) {
  const Json* source = nullptr;
  return r.req_object(block, bp, "source", &source);
}

// tool_result content: a string or text/image blocks, reduced to text.
Err read_tool_result_content(
    const Reader& r, const Json& block, const Path& bp, std::string* out, bool* has_image) {
  const Json* c = find(block, "content");
  if (!c)
    return std::nullopt;
  Path cp = bp.key("content");
  bool first = true;
  return detail::read_text_or_typed(
      r,
      *c,
      cp,
      "a string or an array of content blocks",
      out,
      [&](const Json& part, const Path& pp, const std::string& type) -> Err {
        std::string piece;
        if (type == "text") {
          DSI_API_TRY(r.req_string(part, pp, "text", &piece));
        } else if (type == "image") {
          DSI_API_TRY(check_image_source(r, part, pp));
          piece = "[Unsupported image]";
          *has_image = true;
        } else {
          return r.invalid(pp.key("type"), "tool_result content blocks must be 'text' or 'image'.");
        }
        if (!first)
          *out += "\n\n";
        first = false;
        *out += piece;
        return std::nullopt;
      });
}

// One content block (type `type`) of a user message.
Err read_user_block(const Reader& r,
                    const Json& b,
                    const Path& bp,
                    const std::string& type,
                    const std::set<std::string>& known_tool_ids,
                    Message* msg) {
  ContentBlock block;
  if (type == "text") {
    block.type = ContentBlock::Type::kText;
    DSI_API_TRY(r.req_string(b, bp, "text", &block.text));
  } else if (type == "tool_result") {
    block.type = ContentBlock::Type::kToolResult;
    DSI_API_TRY(r.req_string(b, bp, "tool_use_id", &block.tool_use_id));
    if (known_tool_ids.count(block.tool_use_id) == 0) {
      return r.invalid(
          bp.key("tool_use_id"),
          "no earlier tool_use block has id '" + block.tool_use_id.substr(0, 128) + "'.");
    }
    std::optional<bool> is_error;
    DSI_API_TRY(r.opt_bool(b, bp, "is_error", &is_error));  // ignored
    DSI_API_TRY(read_tool_result_content(r, b, bp, &block.text, &block.has_image));
  } else if (type == "image" || type == "server_tool_use" || type == "web_search_tool_result") {
    if (type == "image")
      DSI_API_TRY(check_image_source(r, b, bp));
    block.type = ContentBlock::Type::kUnsupported;
    block.unsupported_type = type;
  } else if (is_rejected_block(type)) {
    return unsupported_block(r, bp.key("type"), type);
  } else if (type == "thinking" || type == "tool_use") {
    return r.invalid(bp.key("type"),
                     "'" + type + "' blocks are only allowed in assistant messages.");
  } else {
    return r.invalid(bp.key("type"), "unknown content block type '" + type.substr(0, 64) + "'.");
  }
  msg->blocks.push_back(std::move(block));
  return std::nullopt;
}

// One content block (type `type`) of an assistant message.
Err read_assistant_block(const Reader& r,
                         const Json& b,
                         const Path& bp,
                         const std::string& type,
                         std::set<std::string>* known_tool_ids,
                         Message* msg) {
  if (type == "text") {
    std::string text;
    DSI_API_TRY(r.req_string(b, bp, "text", &text));
    msg->content += text;
  } else if (type == "thinking") {
    std::string thinking;
    DSI_API_TRY(r.req_string(b, bp, "thinking", &thinking));
    std::optional<std::string> signature;
    DSI_API_TRY(r.opt_string(b, bp, "signature", &signature));  // ignored
    msg->reasoning_content = msg->reasoning_content.value_or("") + thinking;
  } else if (type == "tool_use") {
    recipe::ToolCall call;
    DSI_API_TRY(r.req_string(b, bp, "id", &call.id));
    DSI_API_TRY(r.req_string(b, bp, "name", &call.name));
    const Json* input = nullptr;
    DSI_API_TRY(r.req_object(b, bp, "input", &input));
    call.arguments = detail::py_dumps(*input);
    known_tool_ids->insert(call.id);
    msg->tool_calls.push_back(std::move(call));
  } else if (type == "server_tool_use" || type == "web_search_tool_result") {
    // Server tool history: nothing to render.
  } else if (is_rejected_block(type)) {
    return unsupported_block(r, bp.key("type"), type);
  } else if (type == "image" || type == "tool_result") {
    return r.invalid(bp.key("type"), "'" + type + "' blocks are only allowed in user messages.");
  } else {
    return r.invalid(bp.key("type"), "unknown content block type '" + type.substr(0, 64) + "'.");
  }
  return std::nullopt;
}

Err read_messages(const Reader& r, const Json& root, GenerationRequest* req) {
  const Json* msgs = nullptr;
  DSI_API_TRY(r.req_array(root, Path(), "messages", &msgs));
  if (msgs->empty())
    return r.invalid(Path().key("messages"), "at least one message is required.");
  std::set<std::string> known_tool_ids;
  return detail::for_each_object(
      r, *msgs, Path().key("messages"), [&](const Json& m, const Path& mp, size_t) -> Err {
        std::string role;
        DSI_API_TRY(r.req_string(m, mp, "role", &role));
        Message msg;
        if (role == "user") {
          msg.role = Role::kUser;
        } else if (role == "assistant") {
          msg.role = Role::kAssistant;
        } else {
          return r.invalid(
              mp.key("role"),
              "Input should be 'user' or 'assistant', got '" + role.substr(0, 64) + "'.");
        }
        const Json* content = find(m, "content");
        if (!content)
          return r.missing(mp.key("content"));
        auto block = [&](const Json& b, const Path& bp, const std::string& type) {
          return msg.role == Role::kUser
                     ? read_user_block(r, b, bp, type, known_tool_ids, &msg)
                     : read_assistant_block(r, b, bp, type, &known_tool_ids, &msg);
        };
        DSI_API_TRY(detail::read_text_or_typed(r,
                                               *content,
                                               mp.key("content"),
                                               "a string or an array of content blocks",
                                               &msg.content,
                                               block));
        // A final assistant message is not a prefill: as deepseek-recipe does, it is a complete
        // turn and generation starts a new one (docs/recipe.md).
        req->conversation.messages.push_back(std::move(msg));
        return std::nullopt;
      });
}

Err decode(std::string_view body, const DecodeOptions& opts, GenerationRequest* req) {
  const Reader r(Dialect::kAnthropic);
  Json root;
  DSI_API_TRY(detail::parse_body(body, Dialect::kAnthropic, &root));
  DSI_API_TRY(detail::read_model(r, root, opts, /*accept_claude=*/true, &req->model));
  DSI_API_TRY(detail::read_max_tokens(r, root, "max_tokens", opts, &req->sampling.max_tokens));
  if (!req->sampling.max_tokens)
    return r.missing(Path().key("max_tokens"));
  std::optional<bool> stream;
  DSI_API_TRY(r.opt_bool(root, Path(), "stream", &stream));
  req->stream = stream.value_or(false);

  detail::ThinkingControls tc;
  const Json* thinking = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "thinking", &thinking));
  if (thinking) {
    Path tp = Path().key("thinking");
    std::string type;
    DSI_API_TRY(r.req_string(*thinking, tp, "type", &type));
    if (type == "enabled" || type == "adaptive") {
      tc.enabled = true;
    } else if (type == "disabled") {
      tc.enabled = false;
    } else {
      return r.invalid(
          tp.key("type"),
          "Input should be 'enabled', 'disabled' or 'adaptive', got '" + type.substr(0, 64) + "'.");
    }
    std::optional<int64_t> budget;
    DSI_API_TRY(r.opt_int(*thinking, tp, "budget_tokens", &budget));  // ignored
  }
  const Json* output_config = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "output_config", &output_config));
  if (output_config) {
    if (const Json* e = find(*output_config, "effort")) {
      EffortSetting es;
      DSI_API_TRY(detail::read_effort(r, Path().key("output_config").key("effort"), *e, &es));
      tc.effort = es;
    }
  }
  detail::apply_thinking(tc, opts, &req->conversation);

  DSI_API_TRY(read_tools(r, root, &req->conversation));
  DSI_API_TRY(read_tool_choice(r, root, req));
  DSI_API_TRY(detail::check_tool_choice_mode(r, Path().key("tool_choice"), req->conversation));
  DSI_API_TRY(read_system(r, root, req));
  DSI_API_TRY(read_messages(r, root, req));
  DSI_API_TRY(detail::check_conversation_rules(r, req->conversation, false, Path(), ""));

  // Anthropic's temperature range is 0..1 (OpenAI's 0..2 is checked by the shared reader).
  std::optional<double> temperature;
  DSI_API_TRY(r.opt_number(root, Path(), "temperature", &temperature));
  if (temperature && *temperature > 1.0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", *temperature);
    return r.invalid(Path().key("temperature"),
                     std::string("must be between 0 and 1, got ") + buf + ".");
  }
  DSI_API_TRY(detail::read_temperature_top_p(r, root, opts, req));
  std::optional<int64_t> top_k;
  DSI_API_TRY(r.opt_int(root, Path(), "top_k", &top_k));  // ignored (spec §3.2)
  if (top_k && *top_k < 0) {
    return r.invalid(Path().key("top_k"),
                     "must be greater than or equal to 0, got " + std::to_string(*top_k) + ".");
  }
  if (const Json* ss = find(root, "stop_sequences"); ss && !ss->is_array()) {
    return r.type_error(Path().key("stop_sequences"), "an array of strings", *ss);
  }
  DSI_API_TRY(detail::read_stop(r, root, "stop_sequences", kMaxStopSequences, &req->sampling.stop));
  const Json* metadata = nullptr;
  DSI_API_TRY(r.opt_object(root, Path(), "metadata", &metadata));
  if (metadata) {
    std::optional<std::string> user_id;
    DSI_API_TRY(r.opt_string(*metadata, Path().key("metadata"), "user_id", &user_id));
    if (user_id)
      req->user = *user_id;
  }
  return std::nullopt;
}

}  // namespace

ApiResult<GenerationRequest> decode_messages_request(std::string_view body,
                                                     const DecodeOptions& opts) {
  return detail::decode_request(decode, body, opts);
}

}  // namespace dsinfer::api
