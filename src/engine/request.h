// Request: what a caller submits (prompt token ids + sampling + stop conditions) and the
// engine-side record of its progress. State machine:
//   kWaiting -> kPrefilling -> kDecoding -> kFinished (with a FinishReason)
//   any non-finished state -> kAborted (abort() or a request-level error)
//   kPrefilling/kDecoding -> kWaiting on preemption (state freed, recomputed later)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvstore/entry_file.h"
#include "kvstore/hash.h"
#include "sampling/sampler.h"

namespace dsinfer::engine {

using RequestId = int64_t;

enum class RequestState { kWaiting, kPrefilling, kDecoding, kFinished, kAborted };
const char* request_state_name(RequestState s);

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

// Optional text-level stop check (stop strings need a detokenizer, which lives above the engine).
// Called with each new token; returns true when the output must stop after this token.
class StopChecker {
 public:
  virtual ~StopChecker() = default;
  virtual bool on_token(int32_t token) = 0;
};

// Optional constraint on which token may come next (structured outputs: a grammar's matcher,
// which lives above the engine). Before sampling each token the engine asks for the mask; after
// choosing, it reports the token. Both run on the engine's thread.
class TokenMask {
 public:
  virtual ~TokenMask() = default;
  // Fills `bits` (one bit per token of the model's vocabulary, bit t%32 of word t/32 set = token
  // t allowed). Returns false when every token is allowed (`bits` is then ignored).
  virtual bool fill(std::span<uint32_t> bits) = 0;
  // The token chosen (after fill() for it).
  virtual void accept(int32_t token) = 0;
};

struct RequestSpec {
  std::vector<int32_t> prompt;  // token ids, non-empty
  sampling::SamplingConfig sampling;
  int64_t max_tokens = 16;              // generated tokens, >= 1
  std::vector<int32_t> stop_token_ids;  // besides EOS
  bool ignore_eos = false;
  std::unique_ptr<StopChecker> stop_checker;  // optional
  std::unique_ptr<TokenMask> token_mask;      // optional (structured outputs)
  // n > 1: the id of a request with the same prompt, submitted earlier and not yet generating.
  // This request waits until that one's prompt is computed, forks its sequence state and samples
  // its first token from the same logits (with its own seed), instead of computing the prompt
  // again. When that is not possible (the other request ended first, no memory or running slot,
  // a backend that cannot copy state pages) it computes its prompt itself: the output is the
  // same either way. 0 = none.
  int64_t share_prompt_of = 0;
  // Prefix cache (EngineConfig::prefix_cache): the tenant that scopes the cache (requests of
  // different tenants never share entries), the retention class of the units this request
  // stores (nullopt: the engine's default), and an opt-out.
  std::string cache_tenant;
  std::optional<kvstore::RetentionClass> cache_retention;
  bool use_cache = true;
};

// One generated token, as delivered to streaming callbacks.
struct TokenEvent {
  RequestId id = 0;
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<sampling::TokenLogprob> top_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
};

struct RequestTimings {
  double arrival_s = 0;      // engine clock
  double first_token_s = 0;  // 0 until the first token
  double finish_s = 0;
};

struct Request {
  RequestId id = 0;
  RequestSpec spec;
  RequestState state = RequestState::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;            // kError / kAborted detail
  std::vector<int32_t> output;  // generated tokens
  std::vector<float> output_logprobs;
  int64_t num_computed = 0;  // tokens of prompt+output already in the state
  int64_t num_preemptions = 0;
  sampling::PenaltyState penalties;
  RequestTimings timings;
  // Prefix cache: prompt tokens restored from the cache at the latest admission, the unit the
  // lookup at submit() found (cache_len tokens; 0 = none), and where the prefill pauses to store
  // a unit (-1 = nowhere).
  int64_t cached_tokens = 0;
  kvstore::Key128 cache_key;
  int64_t cache_len = 0;
  int64_t snapshot_at = -1;
  // Speculative decoding (auto): decode steps in a row for which drafting did not pay, once it
  // stopped drafting those for which it pays again (it resumes after enough of them where the
  // backend can), and whether this request stopped drafting (its forwards then skip the
  // drafter's work; a preemption's recomputation starts over).
  int32_t spec_idle_steps = 0;
  int32_t spec_resume_steps = 0;
  bool spec_disabled = false;
  // Asynchronous scheduling (EngineConfig::async_scheduling): this request's next token is being
  // sampled by a step still running on the device (awaiting_pick), and, when it can go on after
  // that token, the token already counts as one to feed (pending_tokens = 1, its value unknown
  // until the step's outputs arrive: the next step takes it on the device).
  bool awaiting_pick = false;
  int32_t pending_tokens = 0;

  // Tokens the model must see: prompt followed by generated output (and a pending token).
  int64_t num_tokens() const {
    return static_cast<int64_t>(spec.prompt.size() + output.size()) + pending_tokens;
  }
  // The token at position i; kPendingToken for a pending token.
  static constexpr int32_t kPendingToken = -1;
  int32_t token_at(int64_t i) const {
    const int64_t p = static_cast<int64_t>(spec.prompt.size());
    if (i < p)
      return spec.prompt[static_cast<size_t>(i)];
    return i - p < static_cast<int64_t>(output.size()) ? output[static_cast<size_t>(i - p)]
                                                       : kPendingToken;
  }
  bool done() const { return state == RequestState::kFinished || state == RequestState::kAborted; }
};

}  // namespace dsinfer::engine
