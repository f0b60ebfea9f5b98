// Host sampler: penalties, temperature, top-k, top-p, min-p, greedy, logprobs. Each request owns
// a counter-based RNG keyed by (seed, counter); the engine passes the generated token's absolute
// position as the counter, so its samples do not depend on what else is in the batch, on arrival
// order or on preemption.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace dsinfer::sampling {

struct SamplingConfig {
  float temperature = 1.0f;         // 0 = greedy
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = 0;                // 0 = off
  float min_p = 0.0f;               // [0, 1]
  float presence_penalty = 0.0f;    // [-2, 2], on generated tokens
  float frequency_penalty = 0.0f;   // [-2, 2], on generated tokens
  float repetition_penalty = 1.0f;  // > 0, on prompt and generated tokens
  uint64_t seed = 0;
  int32_t top_logprobs = 0;  // number of alternatives to report (0..max, validate())
  bool logprobs = false;
};

// top_logprobs' default upper bound (OpenAI's); servers may allow more, up to the hard cap.
inline constexpr int32_t kDefaultMaxTopLogprobs = 20;
inline constexpr int32_t kHardMaxTopLogprobs = 1024;

// Checks ranges (top_logprobs in [0, max_top_logprobs]); the message names the field.
Status validate(const SamplingConfig& c, int32_t max_top_logprobs = kDefaultMaxTopLogprobs);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;           // of the chosen token under the model distribution
  std::vector<TokenLogprob> top;  // top_logprobs alternatives, descending
};

// Counter-based uniform in [0, 1): a pure function of (seed, counter).
double uniform_from(uint64_t seed, uint64_t counter);

// Whether c applies any penalty (repetition, presence or frequency).
bool uses_penalties(const SamplingConfig& c);

// Token-occurrence counts a request keeps for its penalties. A state made with counting = false
// (the engine's, for a request whose config applies no penalty) keeps nothing: counting every
// prompt and generated token in two hash maps was most of the engine's finish phase (batch 256,
// four drafts: 0.25-0.33 of 0.32-0.40 ms per step, thirty-first session).
class PenaltyState {
 public:
  PenaltyState() = default;
  explicit PenaltyState(bool counting) : counting_(counting) {}
  bool counting() const { return counting_; }
  void add_prompt(std::span<const int32_t> tokens);
  void add_output(int32_t token);
  const std::unordered_map<int32_t, int32_t>& output_counts() const { return output_counts_; }
  const std::unordered_map<int32_t, int32_t>& seen() const { return seen_; }

 private:
  bool counting_ = true;
  std::unordered_map<int32_t, int32_t> output_counts_;
  std::unordered_map<int32_t, int32_t> seen_;  // prompt + output (repetition penalty)
};

// Reusable buffers, so that sampling in the steady state does not allocate.
struct SamplerScratch {
  std::vector<int32_t> idx;
  std::vector<double> p;
  std::vector<float> raw;
  std::vector<uint32_t> keys;
  std::vector<uint32_t> tmp_keys;
  // What the last sampled (not greedy) pick computed, for tests comparing implementations: the
  // softmax normaliser, the kept prefix's length and its mass.
  double last_sum = 0.0;
  int64_t last_keep = 0;
  double last_total = 0.0;
};

// Samples one token from `logits` (modified in place as scratch). The RNG draw is
// uniform_from(seed, step); the engine's `step` is the absolute position of the token being
// generated (prompt length + tokens generated so far).
SampleResult sample(std::span<float> logits,
                    const SamplingConfig& c,
                    const PenaltyState& pen,
                    uint64_t step);
// Same with caller-owned scratch buffers (the engine's step loop). `allowed` (optional, structured
// outputs): a token bitmask, bit t%32 of word t/32 set = token t may be chosen; the others are
// removed before penalties, temperature and the top-k/top-p/min-p filters (logprobs still report
// the model's own distribution, as without a mask). A mask that allows no token is ignored.
SampleResult sample(std::span<float> logits,
                    const SamplingConfig& c,
                    const PenaltyState& pen,
                    uint64_t step,
                    SamplerScratch& scratch,
                    std::span<const uint32_t> allowed = {});
// The same with the first implementation's full sort of the vocabulary (O(V log V)); `sample`
// chooses the same token and reports the same logprobs without it. Kept as the reference for
// tests and benchmarks.
SampleResult sample_full_sort(std::span<float> logits,
                              const SamplingConfig& c,
                              const PenaltyState& pen,
                              uint64_t step,
                              SamplerScratch& scratch,
                              std::span<const uint32_t> allowed = {});
// Sets every logit whose token `allowed` excludes (and every one past the mask) to -infinity.
// Returns false, changing nothing, when the mask allows no token of `logits`.
bool apply_token_mask(std::span<float> logits, std::span<const uint32_t> allowed);

}  // namespace dsinfer::sampling
