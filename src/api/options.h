// Options shared by the three protocol codecs: what the decoders accept and how the encoders
// name and stamp their responses.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/error.h"
#include "recipe/types.h"

namespace dsinfer::api {

inline constexpr int64_t kMaxOutputTokens = 393216;    // 384K (spec §3)
inline constexpr int32_t kDefaultMaxTopLogprobs = 20;  // OpenAI's top_logprobs bound
inline constexpr int32_t kDefaultMaxChoices = 16;      // Chat Completions `n`

struct DecodeOptions {
  // Model names this server answers to; empty accepts any name. The Messages decoder also
  // accepts any "claude*" name (DeepSeek maps them onto its own models).
  std::vector<std::string> served_models;
  int64_t max_output_tokens = kMaxOutputTokens;  // upper bound of max_tokens & co.
  // Upper bound of top_logprobs (OpenAI's 20; `serve --max-logprobs`, as vLLM's flag).
  int32_t max_top_logprobs = kDefaultMaxTopLogprobs;
  // Upper bound of Chat Completions' `n` (`serve --max-n`).
  int32_t max_choices = kDefaultMaxChoices;
  // Effort used when thinking is on and the request names none (the API default is "high").
  recipe::ReasoningEffort default_effort = recipe::ReasoningEffort::kHigh;
  // Chat Completions: with tools in thinking mode, every assistant turn must carry
  // reasoning_content (DeepSeek's API answers 400 otherwise). Off (deepseek-recipe's default,
  // FillEmpty): a missing reasoning_content is rendered as empty reasoning.
  bool require_reasoning_passback = false;
  // DeepSeek's effective sampling: thinking mode ignores temperature (1.0) and raises top_p to
  // >= 0.95; non-thinking mode fixes top_p at 1.0. Off: pass the requested values through.
  bool apply_thinking_sampling_rules = true;
};

// Fields stamped onto responses. Empty id/model are derived (id from `seed`, model from the
// request). Tool-call and item ids derive from `seed`, so output is deterministic.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;  // unix seconds
  std::string model;
  std::string system_fingerprint = "fp_dsinfer";
  uint64_t seed = 0;
};

// An API effort string after alias mapping.
struct EffortSetting {
  bool thinking_off = false;  // "none"
  recipe::ReasoningEffort effort = recipe::ReasoningEffort::kUnset;
};
// none|minimal|low|medium|high|xhigh|max|ultra (spec §1.5); nullopt for anything else.
std::optional<EffortSetting> parse_effort(std::string_view s);
// "low" / "high" / "max" / "" (unset).
const char* effort_name(recipe::ReasoningEffort e);

// Default output budget when the request gives none: 8K non-thinking, 64K thinking, 128K with
// effort max (spec §3.1).
int64_t default_max_tokens(recipe::ThinkingMode mode, recipe::ReasoningEffort effort);

// The output budget for a request whose prompt is `prompt_tokens` long: the requested
// max_tokens, or the default capped to what the context leaves. 400 when the prompt plus an
// explicit max_tokens exceeds `max_context` (or the prompt alone fills it).
ApiResult<int64_t> resolve_max_tokens(const recipe::GenerationRequest& request,
                                      int64_t prompt_tokens,
                                      int64_t max_context);

}  // namespace dsinfer::api
