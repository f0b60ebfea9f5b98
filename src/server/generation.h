// The per-request output path, run on the engine loop thread:
//   generated token ids -> tokenizer::IncrementalDecoder -> recipe::OutputParser -> OutputEvents
// Added (control) tokens reach the parser as control text, every other token as plain text, so a
// special-token spelling the model writes with ordinary tokens stays text.
// with usage accounting (reasoning tokens: tokens generated while the output was in reasoning).
//
// The parser also decides when the output has ended by itself (EOS text, a stop sequence in the
// content, the tool-call block closed): the engine learns it through a StopChecker that feeds
// this pipeline, so generation stops at exactly the token the protocol output ends at.
//
// Test-only: ScriptedOutputs (`dsinfer serve --debug-scripted-output FILE`) replaces the token
// ids the engine sampled by scripted ones before they enter this pipeline. The engine, its
// scheduler and state memory run for real; only the ids the API sees are fixed, so the SDK tests
// can exercise tool calls, thinking and stop sequences with a random-weight model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/request.h"
#include "grammar/grammar.h"
#include "recipe/output_parser.h"
#include "recipe/types.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::server {

class OutputPipeline {
 public:
  // `script`: when non-empty, the i-th fed token is replaced by script[i] (and by its last
  // element past the end; scripts end with EOS).
  OutputPipeline(const tokenizer::Tokenizer& tok,
                 recipe::OutputParserOptions options,
                 std::vector<int32_t> script = {});

  // Feeds the next generated token. Returns true once the output has ended by itself.
  bool feed(int32_t sampled_token);
  // Reports log-probabilities (OpenAI `logprobs`): after each feed(), logprobs() gives the
  // sampled token's. It is kept when that token's text became answer content (not reasoning, a
  // tool call, or a control token such as EOS) and rides on the next content event (or the
  // finish event). A token whose text the parser holds back (a possible marker or stop-sequence
  // prefix) is kept only once that text turns out to be content.
  void set_report_logprobs(bool on) { report_logprobs_ = on; }
  void logprobs(float logprob, const std::vector<sampling::TokenLogprob>& top);
  // Flushes the decoder and ends the parser (emits the kFinish event). Idempotent.
  void finish(recipe::FinishReason backend_reason);

  // Events produced since the last call.
  std::vector<recipe::OutputEvent> take_events();
  bool has_events() const { return !events_.empty(); }

  int64_t tokens() const { return tokens_; }
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  bool done() const { return parser_.done(); }
  // The output is in its answer content: the reasoning block (if any) has closed and the output
  // has not ended. Structured outputs constrain only these tokens.
  bool answering() const { return !finished_ && !parser_.done() && !parser_.in_reasoning(); }
  bool finished() const { return finished_; }
  // The finish reason the parser reported (valid after finish()).
  recipe::FinishReason finish_reason() const { return finish_reason_; }

 private:
  struct Seen {
    bool reasoning = false;  // reasoning text
    bool answer = false;     // content or tool-call events
    bool content = false;    // content events
    bool tool = false;       // tool-call events
  };
  void push(std::vector<recipe::OutputEvent> evs, Seen* seen);

  const tokenizer::Tokenizer* tok_;
  tokenizer::IncrementalDecoder decoder_;
  recipe::OutputParser parser_;
  std::vector<int32_t> script_;
  std::vector<recipe::OutputEvent> events_;
  // What the last fed token's text became, for logprobs().
  enum class LastToken { kNone, kContent, kCommitHeld, kHeld, kDropHeld };
  bool report_logprobs_ = false;
  LastToken last_kind_ = LastToken::kNone;
  int32_t last_token_ = -1;
  std::vector<recipe::TokenLogprob> held_logprobs_;     // tokens whose text is held back
  std::vector<recipe::TokenLogprob> pending_logprobs_;  // content tokens, not yet on an event
  int64_t tokens_ = 0;
  int64_t reasoning_tokens_ = 0;
  bool in_reasoning_ = false;
  bool finished_ = false;
  recipe::FinishReason finish_reason_ = recipe::FinishReason::kStop;
};

// engine::StopChecker over an OutputPipeline (the pipeline must outlive the engine request).
class PipelineStopChecker : public engine::StopChecker {
 public:
  explicit PipelineStopChecker(OutputPipeline* pipeline) : pipeline_(pipeline) {}
  bool on_token(int32_t token) override { return pipeline_->feed(token); }

 private:
  OutputPipeline* pipeline_;
};

// Structured outputs: an engine::TokenMask over a grammar matcher that constrains only the answer
// content. The pipeline (fed every token before the next mask is asked for) says where the output
// is: while it is in reasoning every token is allowed (`</think>` included); from the first
// token after the thinking block closes, the grammar decides, and once it is complete only EOS is
// allowed. The pipeline must outlive the engine request.
class GrammarTokenMask : public engine::TokenMask {
 public:
  GrammarTokenMask(std::unique_ptr<grammar::Matcher> matcher, const OutputPipeline* pipeline)
      : matcher_(std::move(matcher)), pipeline_(pipeline) {}
  bool fill(std::span<uint32_t> bits) override;
  void accept(int32_t token) override;
  const grammar::Matcher& matcher() const { return *matcher_; }

 private:
  std::unique_ptr<grammar::Matcher> matcher_;
  const OutputPipeline* pipeline_;
  bool masked_ = false;  // the mask applied to the token being chosen
};

// Strict tool calls: an engine::TokenMask over the DSML tool-call block's grammar
// (grammar/tool_calls.h). Everything before the block is free (or follows `answer`, the
// structured-output mask, when the request has one): reasoning, content, and the choice to call a
// tool at all. The DSML token that opens the block switches the grammar on; from then on every
// token follows it (the invokes' names, their parameters by the tools' schemas, the block's
// closing tag), and once the block is complete only EOS is allowed. With `in_block` the prompt
// opened the block (tool_choice required / named) and the grammar is on from the first token.
class ToolCallTokenMask : public engine::TokenMask {
 public:
  ToolCallTokenMask(std::unique_ptr<grammar::Matcher> matcher,
                    int32_t dsml_token,
                    bool in_block,
                    std::unique_ptr<engine::TokenMask> answer)
      : matcher_(std::move(matcher)),
        dsml_(dsml_token),
        in_block_(in_block),
        answer_(std::move(answer)) {}
  bool fill(std::span<uint32_t> bits) override;
  void accept(int32_t token) override;
  bool in_block() const { return in_block_; }
  const grammar::Matcher& matcher() const { return *matcher_; }

 private:
  std::unique_ptr<grammar::Matcher> matcher_;
  int32_t dsml_;
  bool in_block_;
  std::unique_ptr<engine::TokenMask> answer_;
};

// Test-only scripted model output. File format (JSON):
//   {"rules": [{"match": "weather", "output": "Let me check.</think>..."}, ...]}
// The first rule whose `match` occurs in the request's last user or tool message
// (last_input_text) applies; its `output` (with `{last_user}` replaced by that text) is tokenized
// with special tokens allowed and EOS appended. Requests no rule matches are generated by the model
// as usual.
class ScriptedOutputs {
 public:
  static Result<std::unique_ptr<ScriptedOutputs>> load(const std::string& path,
                                                       const tokenizer::Tokenizer& tok,
                                                       int32_t eos_token_id);
  static Result<std::unique_ptr<ScriptedOutputs>> from_json(std::string_view json_text,
                                                            const tokenizer::Tokenizer& tok,
                                                            int32_t eos_token_id);

  // The token ids for this request, or nullopt when no rule matches.
  std::optional<std::vector<int32_t>> select(const recipe::GenerationRequest& request) const;
  size_t size() const { return rules_.size(); }

 private:
  struct Rule {
    std::string match;
    std::string output;
  };
  ScriptedOutputs(const tokenizer::Tokenizer& tok, int32_t eos) : tok_(&tok), eos_(eos) {}
  const tokenizer::Tokenizer* tok_;
  int32_t eos_;
  std::vector<Rule> rules_;
};

// The text of the last user or tool message (text and tool-result blocks joined): what the
// model answers next. "" when there is none.
std::string last_input_text(const recipe::Conversation& conversation);

}  // namespace dsinfer::server
