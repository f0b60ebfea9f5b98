// Anthropic Messages response encoding (spec §3.2).
#include "api/detail/blocks.h"
#include "api/detail/common.h"
#include "api/messages.h"

namespace dsinfer::api {

using detail::Block;
using detail::BlockOp;
using detail::Json;
using recipe::FinishReason;

const char* messages_stop_reason(FinishReason f) {
  switch (f) {
    case FinishReason::kLength:
      return "max_tokens";
    case FinishReason::kStopSequence:
      return "stop_sequence";
    case FinishReason::kToolCalls:
      return "tool_use";
    case FinishReason::kStop:
    case FinishReason::kAborted:
    case FinishReason::kError:
      return "end_turn";
  }
  return "end_turn";
}

namespace {

// Anthropic counts cache reads apart from input_tokens.
Json usage_json(const recipe::Usage& u) {
  Json j = Json::object();
  j["input_tokens"] = u.prompt_tokens - u.cached_prompt_tokens;
  j["output_tokens"] = u.completion_tokens;
  j["cache_creation_input_tokens"] = 0;
  j["cache_read_input_tokens"] = u.cached_prompt_tokens;
  return j;
}

// Tool arguments as an `input` object ({} when they are not a JSON object).
Json tool_input(const std::string& args) {
  if (!detail::is_json_text(args))
    return Json::object();
  Json j = Json::parse(args, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Json::object();
  return j;
}

Json block_json(const Block& b, bool empty) {
  Json j = Json::object();
  switch (b.kind) {
    case Block::Kind::kReasoning:
      j["type"] = "thinking";
      j["thinking"] = empty ? std::string() : b.text;
      j["signature"] = "";
      break;
    case Block::Kind::kText:
      j["type"] = "text";
      j["text"] = empty ? std::string() : b.text;
      break;
    case Block::Kind::kTool:
      j["type"] = "tool_use";
      j["id"] = b.tool_id;
      j["name"] = b.tool_name;
      j["input"] = empty ? Json::object() : tool_input(b.text);
      break;
  }
  return j;
}

ResponseMeta fill_meta(ResponseMeta meta, const recipe::GenerationRequest& request) {
  if (meta.id.empty())
    meta.id = "msg_" + detail::IdGen(detail::mix_seed(meta.seed, 1)).alnum(24);
  if (meta.model.empty())
    meta.model = request.model;
  return meta;
}

Json message_json(const ResponseMeta& meta,
                  Json content,
                  const Json& stop_reason,
                  const Json& stop_sequence,
                  const recipe::Usage& usage) {
  Json m = Json::object();
  m["id"] = meta.id;
  m["type"] = "message";
  m["role"] = "assistant";
  m["model"] = meta.model;
  m["content"] = std::move(content);
  m["stop_reason"] = stop_reason;
  m["stop_sequence"] = stop_sequence;
  m["usage"] = usage_json(usage);
  return m;
}

}  // namespace

MessagesStreamEncoder::MessagesStreamEncoder(const recipe::GenerationRequest& request,
                                             ResponseMeta meta)
    : meta_(fill_meta(std::move(meta), request)),
      tracker_(std::make_unique<detail::BlockTracker>(
          [seed = meta_.seed](int i) { return detail::anthropic_tool_use_id(seed, i); })) {}

MessagesStreamEncoder::~MessagesStreamEncoder() = default;

std::string MessagesStreamEncoder::start(const recipe::Usage& prompt_usage) {
  if (started_)
    return "";
  started_ = true;
  recipe::Usage u = prompt_usage;
  u.completion_tokens = 0;
  Json ev = Json::object();
  ev["type"] = "message_start";
  ev["message"] = message_json(meta_, Json::array(), nullptr, nullptr, u);
  return detail::sse_event("message_start", ev);
}

namespace {

std::string render_ops(const std::vector<BlockOp>& ops, const std::vector<Block>& blocks) {
  std::string out;
  for (const BlockOp& op : ops) {
    const Block& b = blocks[op.block];
    Json ev = Json::object();
    switch (op.type) {
      case BlockOp::Type::kOpen:
        ev["type"] = "content_block_start";
        ev["index"] = op.block;
        ev["content_block"] = block_json(b, /*empty=*/true);
        out += detail::sse_event("content_block_start", ev);
        break;
      case BlockOp::Type::kDelta: {
        Json delta = Json::object();
        if (b.kind == Block::Kind::kReasoning) {
          delta["type"] = "thinking_delta";
          delta["thinking"] = op.text;
        } else if (b.kind == Block::Kind::kText) {
          delta["type"] = "text_delta";
          delta["text"] = op.text;
        } else {
          delta["type"] = "input_json_delta";
          delta["partial_json"] = op.text;
        }
        ev["type"] = "content_block_delta";
        ev["index"] = op.block;
        ev["delta"] = std::move(delta);
        out += detail::sse_event("content_block_delta", ev);
        break;
      }
      case BlockOp::Type::kClose:
        ev["type"] = "content_block_stop";
        ev["index"] = op.block;
        out += detail::sse_event("content_block_stop", ev);
        break;
    }
  }
  return out;
}

}  // namespace

std::string MessagesStreamEncoder::add(const recipe::OutputEvent& event) {
  if (done_)
    return "";
  std::string out = start();
  out += render_ops(tracker_->apply(event), tracker_->blocks());
  return out;
}

std::string MessagesStreamEncoder::finish(const recipe::Usage& usage) {
  if (done_)
    return "";
  std::string out = start(usage);
  out += render_ops(tracker_->close_open(), tracker_->blocks());
  done_ = true;
  const FinishReason f = tracker_->finish_reason();
  Json delta = Json::object();
  delta["stop_reason"] = messages_stop_reason(f);
  delta["stop_sequence"] =
      f == FinishReason::kStopSequence ? Json(tracker_->stop_sequence()) : Json(nullptr);
  Json ev = Json::object();
  ev["type"] = "message_delta";
  ev["delta"] = std::move(delta);
  ev["usage"] = usage_json(usage);
  out += detail::sse_event("message_delta", ev);
  out += detail::sse_event("message_stop", Json{{"type", "message_stop"}});
  return out;
}

std::string MessagesStreamEncoder::error(const ApiError& e) {
  if (done_)
    return "";
  done_ = true;
  Json err = Json::object();
  err["type"] = anthropic_error_type(e);
  err["message"] = e.message;
  Json ev = Json::object();
  ev["type"] = "error";
  ev["error"] = std::move(err);
  return detail::sse_event("error", ev);
}

std::string MessagesStreamEncoder::ping() const {
  return detail::sse_event("ping", Json{{"type", "ping"}});
}

std::string MessagesStreamEncoder::response_json(const recipe::Usage& usage) const {
  Json content = Json::array();
  for (const Block& b : tracker_->blocks()) content.push_back(block_json(b, /*empty=*/false));
  const FinishReason f = tracker_->finish_reason();
  Json stop_sequence =
      f == FinishReason::kStopSequence ? Json(tracker_->stop_sequence()) : Json(nullptr);
  return detail::dump(
      message_json(meta_, std::move(content), messages_stop_reason(f), stop_sequence, usage));
}

std::string build_messages_response(const recipe::GenerationRequest& request,
                                    const ResponseMeta& meta,
                                    const std::vector<recipe::OutputEvent>& events,
                                    const recipe::Usage& usage) {
  return detail::build_response<MessagesStreamEncoder>(request, meta, events, usage);
}

}  // namespace dsinfer::api
