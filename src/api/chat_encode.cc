// Chat Completions response encoding: chat.completion and chat.completion.chunk (spec §3.1).
#include "api/chat.h"
#include "api/detail/blocks.h"
#include "api/detail/common.h"

namespace dsinfer::api {

using detail::Block;
using detail::BlockOp;
using detail::Json;
using recipe::FinishReason;

const char* chat_finish_reason(FinishReason f) {
  switch (f) {
    case FinishReason::kStop:
    case FinishReason::kStopSequence:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kToolCalls:
      return "tool_calls";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kError:
      return "insufficient_system_resource";
  }
  return "stop";
}

namespace {

Json usage_json(const recipe::Usage& u) {
  Json j = Json::object();
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["prompt_tokens_details"] = Json{{"cached_tokens", u.cached_prompt_tokens}};
  j["prompt_cache_hit_tokens"] = u.cached_prompt_tokens;
  j["prompt_cache_miss_tokens"] = u.prompt_tokens - u.cached_prompt_tokens;
  j["completion_tokens_details"] = Json{{"reasoning_tokens", u.reasoning_tokens}};
  return j;
}

// The envelope of a completion or chunk: {id, object, created, model, system_fingerprint,
// choices: [choice]}.
Json completion_json(const ResponseMeta& meta, const char* object, Json choice) {
  Json j = Json::object();
  j["id"] = meta.id;
  j["object"] = object;
  j["created"] = meta.created;
  j["model"] = meta.model;
  j["system_fingerprint"] = meta.system_fingerprint;
  j["choices"] = Json::array({std::move(choice)});
  return j;
}

ResponseMeta fill_meta(ResponseMeta meta, const recipe::GenerationRequest& request) {
  if (meta.id.empty())
    meta.id = detail::IdGen(detail::mix_seed(meta.seed, 1)).uuid();
  if (meta.model.empty())
    meta.model = request.model;
  return meta;
}

}  // namespace

ChatStreamEncoder::ChatStreamEncoder(const recipe::GenerationRequest& request,
                                     ResponseMeta meta,
                                     int choice_index)
    : meta_(fill_meta(std::move(meta), request)),
      choice_index_(choice_index),
      include_usage_(request.include_usage),
      logprobs_(request.sampling.logprobs),
      tracker_(std::make_unique<detail::BlockTracker>(
          [seed = meta_.seed](int i) { return detail::openai_tool_call_id(seed, i); })) {}

ChatStreamEncoder::~ChatStreamEncoder() = default;

namespace {

// {"content": [logprob objects], "refusal": null}
Json logprobs_json(const std::vector<recipe::TokenLogprob>& lps) {
  Json content = Json::array();
  for (const recipe::TokenLogprob& t : lps) content.push_back(detail::openai_logprob(t));
  return Json{{"content", std::move(content)}, {"refusal", nullptr}};
}

std::string make_chunk(const ResponseMeta& meta,
                       int index,
                       Json delta,
                       const char* finish_reason,
                       bool include_usage,
                       const recipe::Usage* usage,
                       Json logprobs = nullptr) {
  Json choice = Json::object();
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason ? Json(finish_reason) : Json(nullptr);
  Json c = completion_json(meta, "chat.completion.chunk", std::move(choice));
  if (usage) {
    c["usage"] = usage_json(*usage);
  } else if (include_usage) {
    c["usage"] = nullptr;
  }
  return detail::sse_data(c);
}

}  // namespace

std::string ChatStreamEncoder::start() {
  if (started_)
    return "";
  started_ = true;
  return make_chunk(meta_,
                    choice_index_,
                    Json{{"role", "assistant"}, {"content", ""}},
                    nullptr,
                    include_usage_,
                    nullptr);
}

std::string ChatStreamEncoder::add(const recipe::OutputEvent& event) {
  if (done_)
    return "";
  std::string out = start();
  if (logprobs_ && !event.logprobs.empty()) {
    all_logprobs_.insert(all_logprobs_.end(), event.logprobs.begin(), event.logprobs.end());
    carry_logprobs_.insert(carry_logprobs_.end(), event.logprobs.begin(), event.logprobs.end());
  }
  for (const BlockOp& op : tracker_->apply(event)) {
    const Block& b = tracker_->blocks()[op.block];
    Json delta;
    Json lp = nullptr;
    if (b.kind == Block::Kind::kTool) {
      Json call = Json::object();
      call["index"] = b.tool_ordinal;
      if (op.type == BlockOp::Type::kOpen) {
        call["id"] = b.tool_id;
        call["type"] = "function";
        call["function"] = Json{{"name", b.tool_name}, {"arguments", ""}};
      } else if (op.type == BlockOp::Type::kDelta) {
        call["function"] = Json{{"arguments", op.text}};
      } else {
        continue;
      }
      delta = Json{{"tool_calls", Json::array({std::move(call)})}};
    } else {
      if (op.type != BlockOp::Type::kDelta)
        continue;
      if (b.kind == Block::Kind::kReasoning) {
        delta = Json{{"content", nullptr}, {"reasoning_content", op.text}};
      } else {
        delta = Json{{"content", op.text}, {"reasoning_content", nullptr}};
        if (!carry_logprobs_.empty()) {
          lp = logprobs_json(carry_logprobs_);
          carry_logprobs_.clear();
        }
      }
    }
    out += make_chunk(
        meta_, choice_index_, std::move(delta), nullptr, include_usage_, nullptr, std::move(lp));
  }
  return out;
}

std::string ChatStreamEncoder::close_choice(const recipe::Usage* usage) {
  if (done_)
    return "";
  std::string out = start();
  tracker_->close_open();
  done_ = true;
  Json lp = nullptr;
  if (!carry_logprobs_.empty()) {
    lp = logprobs_json(carry_logprobs_);
    carry_logprobs_.clear();
  }
  out += make_chunk(meta_,
                    choice_index_,
                    Json{{"content", ""}},
                    chat_finish_reason(tracker_->finish_reason()),
                    include_usage_,
                    usage,
                    std::move(lp));
  return out;
}

std::string ChatStreamEncoder::finish(const recipe::Usage& usage) {
  if (done_)
    return "";
  return close_choice(&usage) + "data: [DONE]\n\n";
}

std::string ChatStreamEncoder::finish_choice() {
  return close_choice(nullptr);
}

std::string chat_choices_done(const ChatStreamEncoder& first, const recipe::Usage& usage) {
  std::string out;
  if (first.include_usage_) {
    Json c = completion_json(first.meta(), "chat.completion.chunk", Json());
    c["choices"] = Json::array();
    c["usage"] = usage_json(usage);
    out += detail::sse_data(c);
  }
  out += "data: [DONE]\n\n";
  return out;
}

std::string ChatStreamEncoder::error(const ApiError& e) {
  if (done_)
    return "";
  done_ = true;
  return "data: " + render_openai_error(e) + "\n\ndata: [DONE]\n\n";
}

namespace {

// The non-streaming choice object of one encoder's blocks.
Json choice_json(const detail::BlockTracker& tracker,
                 int index,
                 bool logprobs,
                 const std::vector<recipe::TokenLogprob>& all_logprobs) {
  std::string content;
  std::optional<std::string> reasoning;
  Json calls = Json::array();
  for (const Block& b : tracker.blocks()) {
    switch (b.kind) {
      case Block::Kind::kReasoning:
        reasoning = reasoning.value_or("") + b.text;
        break;
      case Block::Kind::kText:
        content += b.text;
        break;
      case Block::Kind::kTool: {
        Json call = Json::object();
        call["id"] = b.tool_id;
        call["type"] = "function";
        call["function"] = Json{{"name", b.tool_name}, {"arguments", b.text}};
        calls.push_back(std::move(call));
        break;
      }
    }
  }
  Json message = Json::object();
  message["role"] = "assistant";
  message["content"] = content;
  message["reasoning_content"] = reasoning ? Json(*reasoning) : Json(nullptr);
  if (!calls.empty())
    message["tool_calls"] = std::move(calls);
  Json choice = Json::object();
  choice["index"] = index;
  choice["message"] = std::move(message);
  choice["logprobs"] = logprobs ? logprobs_json(all_logprobs) : Json(nullptr);
  choice["finish_reason"] = chat_finish_reason(tracker.finish_reason());
  return choice;
}

}  // namespace

std::string ChatStreamEncoder::response_json(const recipe::Usage& usage) const {
  Json j = completion_json(
      meta_, "chat.completion", choice_json(*tracker_, choice_index_, logprobs_, all_logprobs_));
  j["usage"] = usage_json(usage);
  return detail::dump(j);
}

std::string build_chat_choices_response(const std::vector<const ChatStreamEncoder*>& choices,
                                        const recipe::Usage& usage,
                                        bool renumber) {
  DSI_CHECK(!choices.empty(), "no choices");
  Json j = completion_json(choices[0]->meta_, "chat.completion", Json());
  j["choices"] = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChatStreamEncoder* c = choices[i];
    const int index = renumber ? static_cast<int>(i) : c->choice_index_;
    j["choices"].push_back(choice_json(*c->tracker_, index, c->logprobs_, c->all_logprobs_));
  }
  j["usage"] = usage_json(usage);
  return detail::dump(j);
}

std::string build_chat_response(const recipe::GenerationRequest& request,
                                const ResponseMeta& meta,
                                const std::vector<recipe::OutputEvent>& events,
                                const recipe::Usage& usage) {
  return detail::build_response<ChatStreamEncoder>(request, meta, events, usage);
}

}  // namespace dsinfer::api
