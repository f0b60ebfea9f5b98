// Request preparation shared by the CLI and the server.
#include "frontend/prepare.h"

#include <algorithm>

#include "base/strings.h"

namespace dsinfer::frontend {

Result<PreparedPrompt> prepare_conversation(const recipe::GenerationRequest& request,
                                            const tokenizer::Tokenizer& tok,
                                            recipe::ModelVersion version,
                                            size_t max_text_bytes) {
  PreparedPrompt p;
  recipe::RenderOptions ro;
  auto text = recipe::render_prompt(request.conversation, version, ro);
  if (!text.ok())
    return text.status();
  p.text = std::move(text).value();
  if (p.text.size() > max_text_bytes) {
    return invalid_argument(str_format(
        "prompt is too long: %zu bytes rendered (at most %zu)", p.text.size(), max_text_bytes));
  }
  auto ids = tok.encode(p.text, /*allow_special=*/true);
  if (!ids.ok())
    return ids.status();
  p.tokens = std::move(ids).value();
  p.parser = recipe::parser_options_for(request.conversation, version, ro);
  p.parser.stop_sequences = request.sampling.stop;
  return p;
}

size_t max_token_bytes(const tokenizer::Tokenizer& tok) {
  size_t m = 1;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) m = std::max(m, tok.token_bytes(id).size());
  return m;
}

sampling::SamplingConfig to_sampling(const recipe::SamplingParams& p, uint64_t default_seed) {
  sampling::SamplingConfig c;
  c.temperature = p.temperature;
  c.top_p = p.top_p;
  c.top_k = p.top_k;
  c.min_p = p.min_p;
  c.presence_penalty = p.presence_penalty;
  c.frequency_penalty = p.frequency_penalty;
  c.repetition_penalty = p.repetition_penalty;
  c.seed = p.seed.value_or(default_seed);
  c.logprobs = p.logprobs;
  c.top_logprobs = p.top_logprobs;
  return c;
}

TextStopChecker::TextStopChecker(const tokenizer::Tokenizer& tok, std::vector<std::string> stops)
    : decoder_(tok), stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& s : stops_) max_len_ = std::max(max_len_, s.size());
}

bool TextStopChecker::on_token(int32_t token) {
  if (stops_.empty())
    return false;
  auto piece = decoder_.feed(token);
  if (!piece.ok())
    return false;
  tail_ += *piece;
  for (const auto& s : stops_) {
    if (tail_.find(s) != std::string::npos) {
      matched_ = s;
      return true;
    }
  }
  if (tail_.size() > 2 * max_len_ + 16)
    tail_.erase(0, tail_.size() - max_len_);
  return false;
}

std::string truncate_at_stop(std::string& text, const std::vector<std::string>& stops) {
  size_t best = std::string::npos;
  std::string which;
  for (const auto& s : stops) {
    if (s.empty())
      continue;
    const size_t at = text.find(s);
    if (at != std::string::npos && at < best) {
      best = at;
      which = s;
    }
  }
  if (best != std::string::npos)
    text.resize(best);
  return which;
}

}  // namespace dsinfer::frontend
