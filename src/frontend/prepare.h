// The glue between the API/recipe layer and the engine, shared by `dsinfer generate` and the
// server: decoded requests -> prompt token ids + engine RequestSpec; a stop-string checker over
// streamed tokens; sampling-parameter mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/request.h"
#include "recipe/encoder.h"
#include "recipe/output_parser.h"
#include "recipe/types.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::frontend {

struct PreparedPrompt {
  std::string text;  // the rendered prompt (empty for raw token ids)
  std::vector<int32_t> tokens;
  recipe::OutputParserOptions parser;  // how to parse what the model generates
};

// Token ids of a rendered prompt, as deepseek-recipe's prompt encoding computes them: the plain
// text between the control-token ranges is tokenized with added tokens disallowed (a spelling of
// `<｜Assistant｜>` or `｜DSML｜` in a message, a tool schema or a tool result stays text), and
// each control token the encoder placed is inserted by its added-token id. InvalidArgument when a
// control token is not in the tokenizer's added vocabulary (e.g. V4.1's `<｜System｜>` with a V4
// tokenizer.json).
Result<std::vector<int32_t>> encode_prompt(const tokenizer::Tokenizer& tok,
                                           const recipe::RenderedPrompt& prompt);

// Renders a conversation with the DeepSeek prompt format and tokenizes it with encode_prompt:
// request text is always text, only the template's control tokens become control-token ids.
// A rendered prompt longer than `max_text_bytes` is refused (invalid_argument, the message
// starting "prompt is too long") before it is tokenized.
Result<PreparedPrompt> prepare_conversation(const recipe::GenerationRequest& request,
                                            const tokenizer::Tokenizer& tok,
                                            recipe::ModelVersion version,
                                            size_t max_text_bytes = SIZE_MAX);

// The longest token of `tok` in bytes: a prompt of B bytes has at least B / this many tokens
// (for a tokenizer without a normalizer that shrinks text).
size_t max_token_bytes(const tokenizer::Tokenizer& tok);

// Parses generated token ids as the server does: added (control) tokens are fed to the parser as
// control text, every other token as plain text (a special-token spelling made of ordinary
// tokens stays text).
recipe::ParsedMessage parse_output_tokens(const tokenizer::Tokenizer& tok,
                                          std::span<const int32_t> ids,
                                          const recipe::OutputParserOptions& options,
                                          recipe::FinishReason backend_reason);

// Engine sampling config from API sampling params (seed: the request's or `default_seed`).
sampling::SamplingConfig to_sampling(const recipe::SamplingParams& p, uint64_t default_seed);

// Stops when any stop string appears in the decoded output; remembers which one.
class TextStopChecker : public engine::StopChecker {
 public:
  TextStopChecker(const tokenizer::Tokenizer& tok, std::vector<std::string> stops);
  bool on_token(int32_t token) override;
  const std::string& matched() const { return matched_; }

 private:
  tokenizer::IncrementalDecoder decoder_;
  std::vector<std::string> stops_;
  std::string tail_;  // last decoded bytes, long enough to contain any stop string
  size_t max_len_ = 0;
  std::string matched_;
};

// Cuts `text` at the first occurrence of any stop string; returns the matched one (or "").
std::string truncate_at_stop(std::string& text, const std::vector<std::string>& stops);

}  // namespace dsinfer::frontend
