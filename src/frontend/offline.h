// Offline batch requests, shared by `dsinfer generate` and the Python package (python/): one
// JSON object per request (the JSONL request format: prompt | prompt_token_ids | messages, plus
// the sampling fields) -> prompt ids + engine RequestSpec, and the finished request -> the JSON
// result object. One code path, so the CLI and the Python API run and report a request alike.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/request.h"
#include "recipe/output_parser.h"
#include "recipe/types.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::frontend {

// Values a request line does not set (the CLI's flags).
struct OfflineDefaults {
  int64_t max_tokens = 128;
  sampling::SamplingConfig sampling;  // logprobs / top_logprobs from `logprobs` below
  int32_t logprobs = 0;               // top logprobs per token (0 = none reported)
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // appended to every request's own
  bool ignore_eos = false;
  bool thinking = false;  // chat messages: thinking mode
  // >= 0: prepended to every text prompt (`prompt`; not token ids or rendered chat messages,
  // which carry their own): DeepSeek V4.1's "release" tokenizer policy adds BOS to plain text.
  int32_t text_prompt_bos = -1;
};

// One request line, resolved to engine input.
struct OfflineJob {
  std::vector<int32_t> prompt;
  engine::RequestSpec spec;  // prompt and stop checker filled in by make_offline_job
  std::vector<std::string> stops;
  bool chat = false;
  recipe::OutputParserOptions parser;
  int32_t logprobs = 0;  // top logprobs per token to report
  std::string error;     // set: the line failed validation (the request is not submitted)
};

// Builds a job from a JSON object. Messages go through the Chat Completions decoder (with
// optional `tools`) and the DeepSeek prompt format; text prompts through `tok` (null: the model
// has no tokenizer.json, and only prompt_token_ids work). Errors land in job.error, naming the
// field; job.spec is ready for Engine::submit when job.error is empty.
OfflineJob make_offline_job(const nlohmann::ordered_json& line,
                            const OfflineDefaults& defaults,
                            const tokenizer::Tokenizer* tok,
                            recipe::ModelVersion version);

// A generated token's log-probability and the top alternatives (as the engine reported them).
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<sampling::TokenLogprob> top;
};

// The result object of a finished request: "index", "text" (cut at a stop string),
// "output_token_ids", "finish_reason", ["stop_reason"], ["error"], "prompt_tokens",
// "completion_tokens", "ttft_s", "latency_s"; chat jobs also "reasoning_content", "content" and
// "tool_calls" ([{"name", "arguments"}]); with job.logprobs > 0, "logprobs": one
// {"token", "logprob", "top": [[token, logprob], ...]} per output token.
nlohmann::ordered_json offline_result(int64_t index,
                                      const OfflineJob& job,
                                      const engine::Request& r,
                                      const tokenizer::Tokenizer* tok,
                                      const std::vector<TokenLogprobs>& logprobs);

}  // namespace dsinfer::frontend
