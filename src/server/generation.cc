#include "server/generation.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace dsinfer::server {

using recipe::OutputEvent;

OutputPipeline::OutputPipeline(const tokenizer::Tokenizer& tok,
                               recipe::OutputParserOptions options,
                               std::vector<int32_t> script)
    : tok_(&tok),
      decoder_(tok, /*skip_special=*/false),
      parser_(options),
      script_(std::move(script)),
      in_reasoning_(options.start == recipe::ParseStart::kReasoningStart ||
                    options.start == recipe::ParseStart::kReasoning) {}

void OutputPipeline::push(std::vector<OutputEvent> evs, Seen* seen) {
  for (OutputEvent& e : evs) {
    switch (e.type) {
      case OutputEvent::Type::kReasoningDelta:
        in_reasoning_ = true;
        seen->reasoning = true;
        break;
      case OutputEvent::Type::kContentDelta:
        in_reasoning_ = false;
        seen->answer = true;
        seen->content = true;
        break;
      case OutputEvent::Type::kToolCallStart:
      case OutputEvent::Type::kToolCallArgumentsDelta:
      case OutputEvent::Type::kToolCallEnd:
        in_reasoning_ = false;
        seen->answer = true;
        seen->tool = true;
        break;
      case OutputEvent::Type::kFinish:
        finish_reason_ = e.finish;
        break;
    }
    events_.push_back(std::move(e));
  }
}

bool OutputPipeline::feed(int32_t sampled_token) {
  if (finished_)
    return true;
  int32_t token = sampled_token;
  if (!script_.empty()) {
    const size_t i = static_cast<size_t>(tokens_);
    token = i < script_.size() ? script_[i] : script_.back();
  }
  ++tokens_;
  last_kind_ = LastToken::kNone;
  last_token_ = token;
  // A token counts as reasoning when it produced reasoning text, or produced nothing (held back,
  // or `</think>` itself) while the output was in reasoning.
  const bool was_reasoning = in_reasoning_;
  Seen seen;
  if (!parser_.done()) {
    using Kind = recipe::OutputParser::Kind;
    if (tok_->is_added(token)) {
      // A control token: it alone can be a marker. Text held before it is complete by now.
      std::string held = decoder_.flush();
      if (!held.empty())
        push(parser_.feed(held, Kind::kText), &seen);
      push(parser_.feed(tok_->token_bytes(token), Kind::kControl), &seen);
    } else {
      Result<std::string> text = decoder_.feed(token);
      // An id with no token (a model vocabulary padded past the tokenizer's) contributes nothing.
      // Ordinary tokens are text: a special-token spelling they form stays text.
      if (text.ok() && !text->empty())
        push(parser_.feed(*text, Kind::kText), &seen);
    }
  }
  if (seen.reasoning || (was_reasoning && !seen.answer))
    ++reasoning_tokens_;
  const bool text_token = !tok_->is_added(token);
  if (seen.reasoning || seen.tool) {
    last_kind_ = LastToken::kDropHeld;  // held text was markup or reasoning
  } else if (seen.content) {
    last_kind_ = text_token ? LastToken::kContent : LastToken::kCommitHeld;
  } else if (text_token && !in_reasoning_ && !parser_.done()) {
    last_kind_ = LastToken::kHeld;  // nothing yet: its text is held back
  }
  return parser_.done();
}

bool GrammarTokenMask::fill(std::span<uint32_t> bits) {
  masked_ = pipeline_->answering();
  return masked_ && matcher_->fill_mask(bits);
}

void GrammarTokenMask::accept(int32_t token) {
  // A token the mask allowed is always accepted; one chosen without the mask (reasoning, or a
  // mask that allowed nothing of the model's vocabulary) leaves the matcher where it was.
  if (masked_)
    (void)matcher_->accept(token);
  masked_ = false;
}

bool ToolCallTokenMask::fill(std::span<uint32_t> bits) {
  if (in_block_)
    return matcher_->fill_mask(bits);
  return answer_ != nullptr && answer_->fill(bits);
}

void ToolCallTokenMask::accept(int32_t token) {
  if (in_block_) {
    // Chosen under the mask, so the grammar allows it (a refused one leaves the state as it was).
    (void)matcher_->accept(token);
    return;
  }
  if (answer_ != nullptr)
    answer_->accept(token);
  // The DSML token always opens the tool block (in reasoning or content); the grammar starts
  // with it.
  if (token == dsml_ && matcher_->accept(token).ok())
    in_block_ = true;
}

void OutputPipeline::logprobs(float logprob, const std::vector<sampling::TokenLogprob>& top) {
  const LastToken kind = last_kind_;
  last_kind_ = LastToken::kNone;
  if (!report_logprobs_ || kind == LastToken::kNone)
    return;
  if (kind == LastToken::kDropHeld) {
    held_logprobs_.clear();
    return;
  }
  if (kind == LastToken::kContent || kind == LastToken::kCommitHeld) {
    for (auto& h : held_logprobs_) pending_logprobs_.push_back(std::move(h));
    held_logprobs_.clear();
    if (kind == LastToken::kCommitHeld)
      return;
  }
  recipe::TokenLogprob e;
  e.bytes = std::string(tok_->token_bytes(last_token_));
  e.logprob = logprob;
  e.top.reserve(top.size());
  for (const sampling::TokenLogprob& t : top) {
    e.top.push_back({std::string(tok_->token_bytes(t.token)), t.logprob});
  }
  (kind == LastToken::kHeld ? held_logprobs_ : pending_logprobs_).push_back(std::move(e));
}

void OutputPipeline::finish(recipe::FinishReason backend_reason) {
  if (finished_)
    return;
  finished_ = true;
  Seen seen;
  if (!parser_.done()) {
    std::string rest = decoder_.flush();
    if (!rest.empty())
      push(parser_.feed(rest, recipe::OutputParser::Kind::kText), &seen);
  }
  push(parser_.finish(backend_reason), &seen);
  // Held-back text that the end turned into content: its tokens are reported; else dropped.
  if (seen.content && !seen.tool) {
    for (auto& h : held_logprobs_) pending_logprobs_.push_back(std::move(h));
  }
  held_logprobs_.clear();
  last_kind_ = LastToken::kNone;
}

std::vector<OutputEvent> OutputPipeline::take_events() {
  std::vector<OutputEvent> out;
  out.swap(events_);
  if (!pending_logprobs_.empty()) {
    // On the first content event; else on the finish event; else they wait for the next batch.
    OutputEvent* target = nullptr;
    for (OutputEvent& e : out) {
      if (e.type == OutputEvent::Type::kContentDelta) {
        target = &e;
        break;
      }
      if (e.type == OutputEvent::Type::kFinish)
        target = &e;
    }
    if (target != nullptr) {
      target->logprobs = std::move(pending_logprobs_);
      pending_logprobs_.clear();
    }
  }
  return out;
}

std::string last_input_text(const recipe::Conversation& conversation) {
  for (auto it = conversation.messages.rbegin(); it != conversation.messages.rend(); ++it) {
    if (it->role != recipe::Role::kUser && it->role != recipe::Role::kTool)
      continue;
    if (it->blocks.empty())
      return it->content;
    std::string text;
    for (const recipe::ContentBlock& b : it->blocks) {
      if (b.type != recipe::ContentBlock::Type::kUnsupported)
        text += b.text;
    }
    return text;
  }
  return "";
}

Result<std::unique_ptr<ScriptedOutputs>> ScriptedOutputs::load(const std::string& path,
                                                               const tokenizer::Tokenizer& tok,
                                                               int32_t eos_token_id) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return not_found("--debug-scripted-output: cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = from_json(ss.str(), tok, eos_token_id);
  if (!r.ok())
    return r.status().with_context(path);
  return r;
}

Result<std::unique_ptr<ScriptedOutputs>> ScriptedOutputs::from_json(std::string_view json_text,
                                                                    const tokenizer::Tokenizer& tok,
                                                                    int32_t eos_token_id) {
  using nlohmann::json;
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("scripted outputs: not a JSON object");
  auto rules = j.find("rules");
  if (rules == j.end() || !rules->is_array())
    return invalid_argument("scripted outputs: `rules` must be a list");
  std::unique_ptr<ScriptedOutputs> s(new ScriptedOutputs(tok, eos_token_id));
  for (size_t i = 0; i < rules->size(); ++i) {
    const json& r = (*rules)[i];
    auto m = r.is_object() ? r.find("match") : r.end();
    auto o = r.is_object() ? r.find("output") : r.end();
    if (!r.is_object() || m == r.end() || o == r.end() || !m->is_string() || !o->is_string()) {
      return invalid_argument("scripted outputs: rules[" + std::to_string(i) +
                              "] needs string fields `match` and `output`");
    }
    s->rules_.push_back({m->get<std::string>(), o->get<std::string>()});
  }
  return s;
}

std::optional<std::vector<int32_t>> ScriptedOutputs::select(
    const recipe::GenerationRequest& request) const {
  const std::string user = last_input_text(request.conversation);
  for (const Rule& r : rules_) {
    if (user.find(r.match) == std::string::npos)
      continue;
    // The rule's own text may spell markers (it stands for model output, control tokens
    // included); the echoed user text is ordinary text, as a model would copy it.
    static constexpr std::string_view kVar = "{last_user}";
    std::vector<int32_t> out;
    const std::string_view tmpl(r.output);
    size_t from = 0;
    for (size_t at = tmpl.find(kVar); at != std::string_view::npos; at = tmpl.find(kVar, from)) {
      if (!tok_->encode_append(tmpl.substr(from, at - from), /*allow_special=*/true, &out).ok() ||
          !tok_->encode_append(user, /*allow_special=*/false, &out).ok()) {
        return std::nullopt;
      }
      from = at + kVar.size();
    }
    if (!tok_->encode_append(tmpl.substr(from), /*allow_special=*/true, &out).ok())
      return std::nullopt;
    out.push_back(eos_);
    return out;
  }
  return std::nullopt;
}

}  // namespace dsinfer::server
