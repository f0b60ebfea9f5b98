// OpenAI Responses response encoding: the response object and its SSE events (spec §3.3).
#include <map>

#include "api/detail/blocks.h"
#include "api/detail/common.h"
#include "api/responses.h"

namespace dsinfer::api {

using detail::Block;
using detail::BlockOp;
using detail::Json;
using recipe::FinishReason;

const char* responses_status(FinishReason f) {
  switch (f) {
    case FinishReason::kStop:
    case FinishReason::kStopSequence:
    case FinishReason::kToolCalls:
      return "completed";
    case FinishReason::kLength:
      return "incomplete";
    case FinishReason::kAborted:
    case FinishReason::kError:
      return "failed";
  }
  return "completed";
}

struct ResponsesStreamEncoder::Impl {
  Json echo_tools = Json::array();
  Json echo_tool_choice;
  Json echo_text;
  Json echo_reasoning;
  Json max_output_tokens;
  Json user;
  double temperature = 1.0;
  double top_p = 1.0;
  int top_logprobs = 0;
  bool parallel_tool_calls = true;
  bool logprobs = false;  // the request asked for the output text's logprobs

  bool started = false;
  bool done = false;
  int64_t seq = 0;
  detail::IdGen item_ids{0};
  std::vector<std::string> block_item_ids;
  std::unique_ptr<detail::BlockTracker> tracker;
  std::map<size_t, std::vector<recipe::TokenLogprob>> block_logprobs;  // text block -> all
  std::vector<recipe::TokenLogprob> carry;  // fed, not yet on a text delta

  // The logprobs array of text block `i` (empty when not requested).
  Json logprobs_of(size_t i) const {
    Json a = Json::array();
    auto it = block_logprobs.find(i);
    if (it != block_logprobs.end()) {
      for (const recipe::TokenLogprob& t : it->second) a.push_back(detail::openai_logprob(t));
    }
    return a;
  }

  // The response object for everything fed so far.
  Json object(const ResponseMeta& meta, const recipe::Usage& usage) const;

  std::string event(const std::string& type, Json payload) {
    Json ev = Json::object();
    ev["type"] = type;
    ev["sequence_number"] = seq++;
    for (auto& [k, v] : payload.items()) ev[k] = std::move(v);
    return detail::sse_event(type, ev);
  }
};

namespace {

Json usage_json(const recipe::Usage& u) {
  Json j = Json::object();
  j["input_tokens"] = u.prompt_tokens;
  j["input_tokens_details"] =
      Json{{"cached_tokens", u.cached_prompt_tokens}, {"cache_write_tokens", 0}};
  j["output_tokens"] = u.completion_tokens;
  j["output_tokens_details"] = Json{{"reasoning_tokens", u.reasoning_tokens}};
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  return j;
}

// The output item for a block; `status` "in_progress" gives the empty opening form.
// `logprobs`: the text block's logprobs array.
Json item_json(const Block& b, const std::string& id, const char* status, Json logprobs) {
  const bool opening = std::string(status) == "in_progress";
  Json j = Json::object();
  switch (b.kind) {
    case Block::Kind::kReasoning: {
      j["type"] = "reasoning";
      j["id"] = id;
      j["summary"] = Json::array();
      Json content = Json::array();
      if (!opening)
        content.push_back(Json{{"type", "reasoning_text"}, {"text", b.text}});
      j["content"] = std::move(content);
      j["status"] = status;
      break;
    }
    case Block::Kind::kText: {
      j["type"] = "message";
      j["id"] = id;
      j["status"] = status;
      j["role"] = "assistant";
      Json content = Json::array();
      if (!opening) {
        content.push_back(Json{{"type", "output_text"},
                               {"text", b.text},
                               {"annotations", Json::array()},
                               {"logprobs", std::move(logprobs)}});
      }
      j["content"] = std::move(content);
      break;
    }
    case Block::Kind::kTool:
      j["type"] = "function_call";
      j["id"] = id;
      j["call_id"] = b.tool_id;
      j["name"] = b.tool_name;
      j["arguments"] = opening ? std::string() : b.text;
      j["status"] = status;
      break;
  }
  return j;
}

Json part_json(const Block& b, bool empty, Json logprobs) {
  if (b.kind == Block::Kind::kReasoning) {
    return Json{{"type", "reasoning_text"}, {"text", empty ? std::string() : b.text}};
  }
  return Json{{"type", "output_text"},
              {"text", empty ? std::string() : b.text},
              {"annotations", Json::array()},
              {"logprobs", empty ? Json::array() : std::move(logprobs)}};
}

}  // namespace

ResponsesStreamEncoder::ResponsesStreamEncoder(const recipe::GenerationRequest& request,
                                               ResponseMeta meta)
    : meta_(std::move(meta)), impl_(std::make_unique<Impl>()) {
  if (meta_.id.empty())
    meta_.id = "resp_" + detail::IdGen(detail::mix_seed(meta_.seed, 1)).hex(48);
  if (meta_.model.empty())
    meta_.model = request.model;
  Impl& s = *impl_;
  s.item_ids = detail::IdGen(detail::mix_seed(meta_.seed, 2));
  s.tracker = std::make_unique<detail::BlockTracker>(
      [seed = meta_.seed](int i) { return detail::openai_tool_call_id(seed, i); });

  const recipe::Conversation& conv = request.conversation;
  for (const recipe::ToolSpec& t : conv.tools) {
    Json fn = Json::parse(t.function_json, nullptr, /*allow_exceptions=*/false);
    Json tool = Json::object();
    tool["type"] = "function";
    tool["name"] = t.name;
    const Json* d = detail::find(fn, "description");
    tool["description"] = d && d->is_string() ? *d : Json(nullptr);
    const Json* p = detail::find(fn, "parameters");
    tool["parameters"] = p && p->is_object() ? *p : Json(nullptr);
    const Json* st = detail::find(fn, "strict");
    tool["strict"] = st && st->is_boolean() ? *st : Json(false);
    s.echo_tools.push_back(std::move(tool));
  }
  switch (conv.tool_choice) {
    case recipe::ToolChoice::kNone:
      s.echo_tool_choice = "none";
      break;
    case recipe::ToolChoice::kAuto:
      s.echo_tool_choice = "auto";
      break;
    case recipe::ToolChoice::kRequired:
      s.echo_tool_choice = "required";
      break;
    case recipe::ToolChoice::kNamed:
      s.echo_tool_choice = Json{{"type", "function"}, {"name", conv.tool_choice_name}};
      break;
  }
  Json format = Json{{"type", "text"}};
  if (conv.response_format_json) {
    Json f = Json::parse(*conv.response_format_json, nullptr, /*allow_exceptions=*/false);
    if (f.is_object())
      format = std::move(f);
  } else if (conv.json_output) {
    format = Json{{"type", "json_object"}};
  }
  s.echo_text = Json{{"format", std::move(format)}, {"verbosity", "medium"}};
  Json effort = nullptr;
  if (conv.thinking == recipe::ThinkingMode::kChat) {
    effort = "none";
  } else if (conv.effort != recipe::ReasoningEffort::kUnset) {
    effort = effort_name(conv.effort);
  }
  s.echo_reasoning = Json{{"effort", effort}, {"summary", nullptr}};
  s.max_output_tokens =
      request.sampling.max_tokens ? Json(*request.sampling.max_tokens) : Json(nullptr);
  s.user = request.user.empty() ? Json(nullptr) : Json(request.user);
  s.temperature = request.sampling.temperature;
  s.top_p = request.sampling.top_p;
  s.top_logprobs = request.sampling.top_logprobs;
  s.parallel_tool_calls = request.parallel_tool_calls;
  s.logprobs = request.sampling.logprobs;
}

ResponsesStreamEncoder::~ResponsesStreamEncoder() = default;

std::string ResponsesStreamEncoder::start() {
  Impl& s = *impl_;
  if (s.started)
    return "";
  s.started = true;
  std::string out;
  Json r = s.object(meta_, recipe::Usage{});
  r["status"] = "in_progress";
  r["usage"] = nullptr;
  r["incomplete_details"] = nullptr;
  r["error"] = nullptr;
  r["output"] = Json::array();
  out += s.event("response.created", Json{{"response", r}});
  out += s.event("response.in_progress", Json{{"response", r}});
  return out;
}

std::string ResponsesStreamEncoder::add(const recipe::OutputEvent& event) {
  Impl& s = *impl_;
  if (s.done)
    return "";
  std::string out = start();
  if (s.logprobs)
    s.carry.insert(s.carry.end(), event.logprobs.begin(), event.logprobs.end());
  for (const BlockOp& op : s.tracker->apply(event)) {
    const Block& b = s.tracker->blocks()[op.block];
    // A text delta takes the logprobs fed so far; a text block closing takes what is left.
    Json new_logprobs = Json::array();
    if (b.kind == Block::Kind::kText && op.type != BlockOp::Type::kOpen && !s.carry.empty()) {
      std::vector<recipe::TokenLogprob>& all = s.block_logprobs[op.block];
      for (recipe::TokenLogprob& t : s.carry) {
        new_logprobs.push_back(detail::openai_logprob(t));
        all.push_back(std::move(t));
      }
      s.carry.clear();
    }
    if (op.type == BlockOp::Type::kOpen) {
      std::string prefix = b.kind == Block::Kind::kReasoning ? "rs_"
                           : b.kind == Block::Kind::kText    ? "msg_"
                                                             : "fc_";
      s.block_item_ids.push_back(prefix + s.item_ids.hex(32));
    }
    const std::string& id = s.block_item_ids[op.block];
    const size_t out_index = op.block;
    // Payload of the content events of a reasoning or message item.
    auto content = [&](const char* key, Json value) {
      Json j{{"item_id", id}, {"output_index", out_index}, {"content_index", 0}};
      j[key] = std::move(value);
      return j;
    };
    // Output text deltas carry their tokens' logprobs, dones all of the block's.
    auto output_text = [&](const char* key, const std::string& value, Json logprobs) {
      Json j = content(key, value);
      j["logprobs"] = std::move(logprobs);
      return j;
    };
    switch (op.type) {
      case BlockOp::Type::kOpen:
        out += s.event("response.output_item.added",
                       Json{{"output_index", out_index},
                            {"item", item_json(b, id, "in_progress", Json::array())}});
        if (b.kind != Block::Kind::kTool) {
          out += s.event("response.content_part.added",
                         content("part", part_json(b, true, Json::array())));
        }
        break;
      case BlockOp::Type::kDelta:
        if (b.kind == Block::Kind::kReasoning) {
          out += s.event("response.reasoning_text.delta", content("delta", op.text));
        } else if (b.kind == Block::Kind::kText) {
          out += s.event("response.output_text.delta",
                         output_text("delta", op.text, std::move(new_logprobs)));
        } else {
          out += s.event("response.function_call_arguments.delta",
                         Json{{"item_id", id}, {"output_index", out_index}, {"delta", op.text}});
        }
        break;
      case BlockOp::Type::kClose:
        if (b.kind == Block::Kind::kReasoning) {
          out += s.event("response.reasoning_text.done", content("text", b.text));
        } else if (b.kind == Block::Kind::kText) {
          out += s.event("response.output_text.done",
                         output_text("text", b.text, s.logprobs_of(op.block)));
        } else {
          out += s.event("response.function_call_arguments.done",
                         Json{{"item_id", id},
                              {"output_index", out_index},
                              {"name", b.tool_name},
                              {"arguments", b.text}});
        }
        if (b.kind != Block::Kind::kTool) {
          out += s.event("response.content_part.done",
                         content("part", part_json(b, false, s.logprobs_of(op.block))));
        }
        out += s.event("response.output_item.done",
                       Json{{"output_index", out_index},
                            {"item", item_json(b, id, "completed", s.logprobs_of(op.block))}});
        break;
    }
  }
  return out;
}

std::string ResponsesStreamEncoder::finish(const recipe::Usage& usage) {
  Impl& s = *impl_;
  if (s.done)
    return "";
  std::string out = start();
  // Close an open block through add()'s rendering by feeding a finish event if none came.
  if (!s.tracker->finished()) {
    recipe::OutputEvent fin;
    fin.type = recipe::OutputEvent::Type::kFinish;
    fin.finish = FinishReason::kStop;
    out += add(fin);
  }
  s.done = true;
  const char* status = responses_status(s.tracker->finish_reason());
  Json r = s.object(meta_, usage);
  std::string type = std::string("response.") + status;
  out += s.event(type, Json{{"response", std::move(r)}});
  return out;
}

std::string ResponsesStreamEncoder::error(const ApiError& e) {
  Impl& s = *impl_;
  if (s.done)
    return "";
  s.done = true;
  return s.event("error",
                 Json{{"code", e.code.empty() ? e.type : e.code},
                      {"message", e.message},
                      {"param", e.param.empty() ? Json(nullptr) : Json(e.param)}});
}

Json ResponsesStreamEncoder::Impl::object(const ResponseMeta& meta,
                                          const recipe::Usage& usage) const {
  const Impl& s = *this;
  const FinishReason f = s.tracker->finish_reason();
  const char* status = responses_status(f);
  const std::string st = status;
  Json output = Json::array();
  const auto& blocks = s.tracker->blocks();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const char* item_status = "completed";
    if (st == "incomplete" && i + 1 == blocks.size())
      item_status = "incomplete";
    const std::string id = i < s.block_item_ids.size() ? s.block_item_ids[i] : std::string();
    output.push_back(item_json(blocks[i], id, item_status, s.logprobs_of(i)));
  }
  Json r = Json::object();
  r["id"] = meta.id;
  r["object"] = "response";
  r["created_at"] = meta.created;
  r["status"] = status;
  r["background"] = false;
  if (st == "failed") {
    r["error"] = Json{
        {"code", "server_error"},
        {"message",
         f == FinishReason::kAborted ? "The generation was aborted." : "The generation failed."}};
  } else {
    r["error"] = nullptr;
  }
  r["incomplete_details"] =
      st == "incomplete" ? Json{{"reason", "max_output_tokens"}} : Json(nullptr);
  r["instructions"] = nullptr;
  r["max_output_tokens"] = s.max_output_tokens;
  r["max_tool_calls"] = nullptr;
  r["metadata"] = Json::object();
  r["model"] = meta.model;
  r["output"] = std::move(output);
  r["parallel_tool_calls"] = s.parallel_tool_calls;
  r["previous_response_id"] = nullptr;
  r["reasoning"] = s.echo_reasoning;
  r["service_tier"] = "default";
  r["store"] = false;
  r["temperature"] = s.temperature;
  r["text"] = s.echo_text;
  r["tool_choice"] = s.echo_tool_choice;
  r["tools"] = s.echo_tools;
  r["top_logprobs"] = s.top_logprobs;
  r["top_p"] = s.top_p;
  r["truncation"] = "disabled";
  r["usage"] = usage_json(usage);
  r["user"] = s.user;
  return r;
}

std::string ResponsesStreamEncoder::response_json(const recipe::Usage& usage) const {
  return detail::dump(impl_->object(meta_, usage));
}

std::string build_responses_response(const recipe::GenerationRequest& request,
                                     const ResponseMeta& meta,
                                     const std::vector<recipe::OutputEvent>& events,
                                     const recipe::Usage& usage) {
  return detail::build_response<ResponsesStreamEncoder>(request, meta, events, usage);
}

}  // namespace dsinfer::api
