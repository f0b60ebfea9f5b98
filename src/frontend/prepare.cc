// Request preparation shared by the CLI and the server.
#include "frontend/prepare.h"

#include <algorithm>
#include <optional>
#include <string_view>

#include "base/strings.h"

namespace dsinfer::frontend {

namespace {

// DeepSeek V4.1 reads images through its vision tower, which dsinfer does not run yet: a request
// with image content is refused (V4 renders it as "[Unsupported image_url]" text, as
// deepseek-recipe does; for V4.1 that would silently drop what the user sent).
Status refuse_v41_images(const recipe::Conversation& conv) {
  for (size_t i = 0; i < conv.messages.size(); ++i) {
    for (const recipe::ContentBlock& b : conv.messages[i].blocks) {
      if (b.type == recipe::ContentBlock::Type::kToolResult && b.has_image) {
        return invalid_argument("message " + std::to_string(i) +
                                " has a tool_result with 'image' content: image inputs to "
                                "DeepSeek V4.1 (its vision tower) are not supported yet; send "
                                "text only");
      }
      if (b.type != recipe::ContentBlock::Type::kUnsupported)
        continue;
      const std::string& t = b.unsupported_type;
      if (t == "image_url" || t == "image" || t == "input_image" || t == "video_url") {
        return invalid_argument("message " + std::to_string(i) + " has '" + t +
                                "' content: image inputs to DeepSeek V4.1 (its vision tower) are "
                                "not supported yet; send text only");
      }
    }
  }
  return Status();
}

}  // namespace

Result<std::vector<int32_t>> encode_prompt(const tokenizer::Tokenizer& tok,
                                           const recipe::RenderedPrompt& prompt) {
  std::vector<int32_t> ids;
  const std::string_view text(prompt.text);
  size_t at = 0;
  for (const recipe::SpecialRange& r : prompt.special_ranges) {
    if (r.begin < at || r.end < r.begin || r.end > text.size())
      return invalid_argument("encode_prompt: special ranges out of order");
    DSI_RETURN_IF_ERROR(tok.encode_append(text.substr(at, r.begin - at), false, &ids));
    const std::string_view spelling = text.substr(r.begin, r.end - r.begin);
    const std::optional<int32_t> id = tok.added_token_id(spelling);
    if (!id.has_value()) {
      return invalid_argument("special token \"" + std::string(spelling) +
                              "\" is not in the tokenizer's added vocabulary");
    }
    ids.push_back(*id);
    at = r.end;
  }
  DSI_RETURN_IF_ERROR(tok.encode_append(text.substr(at), false, &ids));
  return ids;
}

Result<PreparedPrompt> prepare_conversation(const recipe::GenerationRequest& request,
                                            const tokenizer::Tokenizer& tok,
                                            recipe::ModelVersion version,
                                            size_t max_text_bytes) {
  PreparedPrompt p;
  if (version == recipe::ModelVersion::kV41)
    DSI_RETURN_IF_ERROR(refuse_v41_images(request.conversation));
  recipe::RenderOptions ro;
  DSI_ASSIGN_OR_RETURN(recipe::RenderedPrompt rendered,
                       recipe::render_conversation(request.conversation, version, ro));
  if (rendered.text.size() > max_text_bytes) {
    return invalid_argument(str_format("prompt is too long: %zu bytes rendered (at most %zu)",
                                       rendered.text.size(),
                                       max_text_bytes));
  }
  DSI_ASSIGN_OR_RETURN(p.tokens, encode_prompt(tok, rendered));
  p.text = std::move(rendered.text);
  p.parser = recipe::parser_options_for(request.conversation, version, ro);
  p.parser.stop_sequences = request.sampling.stop;
  if (!request.parallel_tool_calls)
    p.parser.max_tool_calls = 1;
  return p;
}

size_t max_token_bytes(const tokenizer::Tokenizer& tok) {
  size_t m = 1;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) m = std::max(m, tok.token_bytes(id).size());
  return m;
}

recipe::ParsedMessage parse_output_tokens(const tokenizer::Tokenizer& tok,
                                          std::span<const int32_t> ids,
                                          const recipe::OutputParserOptions& options,
                                          recipe::FinishReason backend_reason) {
  using Kind = recipe::OutputParser::Kind;
  recipe::OutputParser parser(options);
  tokenizer::IncrementalDecoder decoder(tok);
  std::vector<recipe::OutputEvent> events;
  auto add = [&](std::vector<recipe::OutputEvent> evs) {
    events.insert(events.end(), evs.begin(), evs.end());
  };
  for (const int32_t id : ids) {
    if (tok.is_added(id)) {
      const std::string held = decoder.flush();
      if (!held.empty())
        add(parser.feed(held, Kind::kText));
      add(parser.feed(tok.token_bytes(id), Kind::kControl));
      continue;
    }
    auto text = decoder.feed(id);
    if (text.ok() && !text->empty())
      add(parser.feed(*text, Kind::kText));
  }
  const std::string rest = decoder.flush();
  if (!rest.empty())
    add(parser.feed(rest, Kind::kText));
  add(parser.finish(backend_reason));
  return recipe::aggregate_events(events);
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
