// backend::Model: the seam between the engine and a compute backend (CPU reference, CUDA). A
// backend runs the whole DeepSeek V4 forward over sequences whose state lives in a
// state::SequenceState (page ids from the engine's PageArena; the page contents in host memory
// for the CPU backend, in a device mirror for CUDA).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/numerics.h"
#include "sampling/sampler.h"
#include "state/page_arena.h"
#include "state/sequence_state.h"

namespace dsinfer::backend {

// Sampling inside the backend (ForwardOptions::sample, for backends whose can_sample() is
// true): the chunk's last position is sampled where its logits are (on the device, for CUDA)
// and only the token comes back instead of [vocab] floats. The pick is sampling::sample's for the
// same config, penalties, step and mask, up to the order of floating-point sums (a different
// pick needs the uniform draw within a few ulps of a cumulative boundary).
struct SampleRequest {
  const sampling::SamplingConfig* config = nullptr;  // top_logprobs must be 0
  const sampling::PenaltyState* penalties = nullptr;
  // Output tokens counted on top of `penalties` (a verification's drafts before this position:
  // the penalties it is sampled under once they are accepted), without copying the state.
  std::span<const int32_t> extra_output;
  uint64_t step = 0;  // the RNG counter (the engine: the token's absolute position)
  // Structured outputs: the token mask (sampling::sample's `allowed`); it must allow at least
  // one token of the vocabulary. Empty: no mask.
  std::span<const uint32_t> allowed;
};

struct ForwardOutputs {
  std::vector<float> logits;  // [n, vocab] for the chunk's tokens (when want_logits), or
                              // [1, vocab] with last_logits_only; empty when sampled below
  // MTP draft logits for the positions whose next token became known in this call:
  // mtp_first_pos .. mtp_first_pos + mtp_count - 1; row i predicts token (pos + 2).
  std::vector<float> mtp_logits;  // [mtp_count, vocab]
  int64_t mtp_first_pos = 0;
  int64_t mtp_count = 0;
  // With ForwardOptions::sample: the sampled token (logprob set when config->logprobs).
  bool sampled = false;
  sampling::SampleResult sample;
  // With ForwardOptions::sample_rows: every row's pick, in row order ([n]; logits then empty).
  std::vector<sampling::SampleResult> row_samples;
  // With ForwardOptions::may_defer: the backend returned before the pick was known, leaving it
  // on the device (asynchronous scheduling). `sampled` and `sample` are written, and this flag
  // cleared, by the time the backend's next forward_batch or complete_deferred_samples() returns;
  // the outputs must stay where they are until then.
  bool deferred = false;
};

struct ForwardOptions {
  bool want_logits = true;
  bool last_logits_only = false;  // logits of the chunk's last token only ([1, vocab])
  bool run_mtp = false;           // requires MTP weights
  // The sequence's known tokens when the chunk was planned (0 = not given): a chunk that ends at
  // or before it is part of a prefill (a backend with prefill early exit uses it).
  int64_t prefill_end = 0;
  bool want_mtp_logits = true;  // with run_mtp: false = keep the MTP state only (no draft head)
  // With want_logits and last_logits_only, on a backend whose can_sample() is true: sample the
  // last position in the backend (SampleRequest) instead of returning its logits.
  const SampleRequest* sample = nullptr;
  // With want_logits and not last_logits_only, on a backend whose can_sample() is true: sample
  // every row of the chunk in the backend, row i with sample_rows[i] (one per token), instead of
  // returning the logits (a speculative verification: only the picks come back). No masks.
  std::span<const SampleRequest> sample_rows;
  // A verification of drafts the backend left on the device (DraftItem::deferred): tokens[1 ..
  // device_drafts] are this sequence's drafts of the latest drafting call, taken where they lie
  // (the values given there are ignored), and that call's DraftItem tokens and probs are written
  // by the time forward_batch returns. 0: every token as given.
  int32_t device_drafts = 0;
  // Asynchronous scheduling (backends whose can_defer_samples() is true): the host prepares the
  // next step while the device runs this one. may_defer (with `sample`): the pick may stay on the
  // device (ForwardOutputs::deferred); a backend defers a call's picks all or none, and only
  // when every item that samples allows it and no logits come back. device_token: tokens[0] is
  // this sequence's pick that the previous forward_batch call left on the device, taken there
  // (the value given is a placeholder); the rest of the chunk as given.
  bool may_defer = false;
  bool device_token = false;
};

// One sequence's chunk in a batched forward. `status` reports a per-item failure (bad token id,
// no state memory, MTP precondition): that item's state is untouched and the others proceed.
struct ForwardItem {
  state::SequenceState* state = nullptr;
  std::span<const int32_t> tokens;
  ForwardOptions options;
  ForwardOutputs* out = nullptr;  // may be null
  Status status;
};

// One sequence's MTP drafting (speculative decoding, src/spec): the MTP block runs at the
// sequence's last position with `next_token` (sampled, not yet in the state), then num_steps - 1
// more times on its own output streams with its previous draft (spec 3.11 step 6). Each step's
// draft is the argmax of the draft logits; tokens[i] / probs[i] get draft i and its probability
// under the draft softmax. Afterwards the MTP block has consumed next_token (mtp_num_tokens ==
// num_tokens); what the later steps wrote lies beyond it and is overwritten before it is read.
// 0 <= num_steps <= state->max_rollback().
//
// Catch-up: the MTP block may be behind by more than one position (a verification forward ran
// without its MTP pass, ForwardOptions::run_mtp false, keeping the final streams of its
// positions): catch_up then holds the tokens at positions mtp_num_tokens + 1 .. num_tokens - 1,
// and the first step runs the block over those positions too (their final streams, each with
// its next token) before the last one, in one pass. With num_steps 0 only the catch-up runs
// (no drafts; afterwards mtp_num_tokens == num_tokens - 1, what a forward with run_mtp needs).
// catch_up.size() <= state->max_rollback().
struct DraftItem {
  state::SequenceState* state = nullptr;
  int32_t next_token = 0;
  int32_t num_steps = 1;
  std::span<const int32_t> catch_up;
  int32_t* tokens = nullptr;  // [num_steps]
  float* probs = nullptr;     // [num_steps]
  Status status;
  // In: the caller verifies the drafts without reading them first (no penalties that count
  // them), so the backend may return before they are known, leaving them on the device for the
  // next forward_batch (ForwardOptions::device_drafts), which also writes tokens and probs; the
  // drafting call and the verification then run back to back without a host round trip between
  // them. Out: it did (then tokens and probs must stay valid until that forward_batch returns,
  // and any other call of the backend first completes them).
  bool may_defer = false;
  bool deferred = false;
};

// How the prefix cache stores and resumes a backend's sequences (engine/prefix_cache.h,
// docs/kv-store.md).
struct PrefixCacheLayout {
  // 0: a unit may end at any length and its image holds the whole state (a restored sequence
  // continues exactly). > 0, bounded replay: units end only at multiples of save_point tokens,
  // their images leave out `image`'s parts, and a unit of B tokens serves a prompt of N tokens
  // only when B <= N - replay_rows: the backend's prefill of [B, N) rebuilds what was left out.
  int64_t save_point = 0;
  int64_t replay_rows = 0;
  state::ImageOptions image;
  // The layout and mode, for the cache keys' salt (empty: V4's layout; the salt as before).
  std::string salt;
};

// One sequence's block drafting (V4.1's DSpark, spec deepseek-v41.md §7): one pass of the draft
// blocks over [anchor, noise x (block - 1)] after the sequence's last computed position proposes
// `block` tokens, each with a confidence (the estimate that the target accepts it once the drafts
// before it were). anchor is the pending token (sampled, not yet in the state). Drafts are greedy
// (argmax of the draft logits). The state is not changed. 1 <= block <= block_draft_size().
struct BlockDraftItem {
  state::SequenceState* state = nullptr;
  int32_t anchor = 0;
  int32_t* tokens = nullptr;    // [block]
  float* confidence = nullptr;  // [block]
  Status status;
};

class Model {
 public:
  virtual ~Model() = default;
  // Appends `tokens` to the sequence in `st` and computes their logits. Token ids are validated
  // (a bad id is an invalid-argument Status and leaves `st` untouched).
  virtual Status forward(state::SequenceState& st,
                         std::span<const int32_t> tokens,
                         const ForwardOptions& options,
                         ForwardOutputs* out) = 0;
  // Several sequences at once (each sequence at most once). Per-item errors go to item.status;
  // the returned Status is a failure of the whole batch (a device error), after which the
  // backend is unusable. The default runs the items one after another.
  virtual Status forward_batch(std::span<ForwardItem> items) {
    for (ForwardItem& it : items) it.status = forward(*it.state, it.tokens, it.options, it.out);
    return Status();
  }
  // The per-sequence state layout of a model that is not V4 (whose layout SequenceState derives
  // from config()); null for V4. The engine allocates its sequence states from it.
  virtual const state::StateShape* state_shape() const { return nullptr; }
  // How a V4 state's K=V rows and index keys are stored for this backend (state::RowFormat):
  // the engine makes its sequences with it, and forward() refuses sequences laid out otherwise.
  virtual state::RowFormat row_format() const { return state::RowFormat::kFloat; }
  // How the prefix cache may store this backend's sequences; an error (with its reason) when it
  // cannot serve them correctly in the backend's current mode.
  virtual Result<PrefixCacheLayout> prefix_cache_layout() const { return PrefixCacheLayout(); }
  // Model-specific prompt checks at submit (e.g. ids the model reserves for inputs it cannot
  // take); an invalid-argument Status says why.
  virtual Status check_prompt(std::span<const int32_t> tokens) const {
    (void)tokens;
    return Status();
  }
  // The model's tokenizer policy for plain-text prompts: the id put first (BOS), or -1 when text
  // is encoded as is (V4: its chat template carries BOS).
  virtual int32_t text_prompt_bos() const { return -1; }
  // Whether forward honours ForwardOptions::sample (otherwise it returns logits as usual).
  virtual bool can_sample() const { return false; }
  // Whether forward_batch honours ForwardOptions::may_defer and device_token (asynchronous
  // scheduling). complete_deferred_samples() waits for the picks the latest call deferred and
  // writes them into their outputs (a no-op when none are outstanding); a later forward_batch
  // does the same after enqueueing its own work.
  virtual bool can_defer_samples() const { return false; }
  virtual Status complete_deferred_samples() { return Status(); }
  // True when steps whose sequences all feed the same number of tokens run much cheaper than
  // mixed ones (CUDA: replayed from graphs): a speculating engine then drafts and verifies the
  // same number of drafts for every sequence, also past a request's max_tokens near its end (the
  // tokens past it are never emitted), instead of fewer for those requests.
  virtual bool prefers_uniform_steps() const { return false; }
  // How many forwards and drafting steps so far ran a shape for the first times (CUDA: eagerly,
  // then captured into a graph): one-time costs that a step-time measurement must not count.
  virtual int64_t shape_warmups() const { return 0; }
  // The device's time in decode-shaped work (fixed-shape forwards and drafting calls) and idle
  // between consecutive such launches, in milliseconds (CUDA: events on the stream; the host's
  // share of a decode step). Zeros where not measured.
  struct DeviceTiming {
    double busy_ms = 0;
    double idle_ms = 0;
    // The backend's host time in those calls, by phase: before the device can start (checks,
    // planning, the plan's upload), enqueueing the work (launches or a graph, device sampling),
    // blocked until the device is done, and after it (outputs written). The device idles
    // through `before` and through the engine's host work between calls; `after` ends a call.
    double host_before_ms = 0;
    double host_launch_ms = 0;
    double host_wait_ms = 0;
    double host_after_ms = 0;
    // Of `before`: the batch's checks (items validated, state reserved) and the planning (key
    // lists, page tables, the pack laid out: a drafting call's first pack); the rest is the
    // plan's staging and upload.
    double host_checks_ms = 0;
    double host_plan_ms = 0;
    // The host phases by name, in this order: the first kHostPhases partition the calls' host
    // time, the rest are parts of `before` (what bench and /metrics report).
    static constexpr size_t kHostPhases = 4;
    static constexpr std::array<const char*, 6> kHostPhaseNames = {
        "before", "launch", "wait", "after", "before_checks", "before_plan"};
    std::array<double, 6> host_phase_ms() const {
      return {host_before_ms,
              host_launch_ms,
              host_wait_ms,
              host_after_ms,
              host_checks_ms,
              host_plan_ms};
    }
  };
  virtual DeviceTiming decode_timing() const { return {}; }
  // Whether a fixed-shape step of `batch` sequences x `tokens_per_seq` tokens each would replay
  // what an earlier one prepared (CUDA: a captured graph of that padded batch and length) rather
  // than run a shape for the first times. A speculating engine that picks its depth per step
  // prefers a warm depth to a cold one that would gain little. True where nothing is prepared.
  virtual bool fixed_shape_warm(int64_t batch, int64_t tokens_per_seq) const {
    (void)batch;
    (void)tokens_per_seq;
    return true;
  }
  // Whether this backend's MTP block honours a window floor (state::LayerState::window_floor),
  // so that a request whose MTP state fell behind can resume drafting from the kept final
  // streams (SequenceState::resume_mtp). False: such a request decodes on without speculation.
  virtual bool can_resume_drafting() const { return false; }
  // MTP drafting for several sequences (per-item errors in item.status). Backends without it
  // report can_draft() false and the engine does not speculate.
  virtual bool can_draft() const { return false; }
  virtual Status mtp_draft_batch(std::span<DraftItem> items) {
    for (DraftItem& it : items)
      it.status = Status(StatusCode::kUnimplemented, "this backend cannot draft with MTP");
    return Status();
  }
  // Block drafting (per-item errors in item.status): the largest block this backend drafts, 0
  // when it has no block drafter (then the engine uses MTP, if any).
  virtual int32_t block_draft_size() const { return 0; }
  virtual Status block_draft_batch(std::span<BlockDraftItem> items, int32_t block) {
    (void)block;
    for (BlockDraftItem& it : items)
      it.status = Status(StatusCode::kUnimplemented, "this backend has no block drafter");
    return Status();
  }
  // Where the arena's page contents must live for this backend.
  virtual state::PageArena::Storage state_storage() const {
    return state::PageArena::Storage::kHost;
  }
  // Copies state pages within the arena's storage (SequenceState::fork_from's (source,
  // destination) pairs; none with host storage, whose contents fork_from copies itself).
  virtual Status copy_state_pages(const state::PageArena& arena,
                                  const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    (void)arena;
    if (pairs.empty())
      return Status();
    return Status(StatusCode::kUnimplemented, "this backend cannot copy state pages");
  }
  // Prefix cache (state::capture_state / restore_state): copies the contents of arena pages to
  // host memory (`dst`: pages.size() * page_floats floats, in the order of `pages`) and back.
  // Host-storage arenas are copied here; a backend whose pages live on the device overrides
  // both (the CUDA backend: a device<->host copy out of its page pool). A write may return
  // before the device has the pages, provided everything the backend runs afterwards (forwards,
  // page copies, reads) sees them; `src` is free again on return.
  virtual Status read_state_pages(const state::PageArena& arena,
                                  std::span<const int32_t> pages,
                                  float* dst) {
    if (!arena.has_host_storage())
      return Status(StatusCode::kUnimplemented, "this backend cannot read state pages");
    const size_t n = static_cast<size_t>(arena.page_floats());
    for (size_t i = 0; i < pages.size(); ++i)
      std::copy(arena.page(pages[i]), arena.page(pages[i]) + n, dst + i * n);
    return Status();
  }
  virtual Status write_state_pages(state::PageArena& arena,
                                   std::span<const int32_t> pages,
                                   const float* src) {
    if (!arena.has_host_storage())
      return Status(StatusCode::kUnimplemented, "this backend cannot write state pages");
    const size_t n = static_cast<size_t>(arena.page_floats());
    for (size_t i = 0; i < pages.size(); ++i)
      std::copy(src + i * n, src + (i + 1) * n, arena.page(pages[i]));
    return Status();
  }
  // Asynchronous reads of state pages, so that the prefix cache's captures never hold up the
  // step loop. begin_read_state_pages starts copying `pages` into `dst` (the layout of
  // read_state_pages) and returns a ticket. poll_state_read answers at once: true when the copy
  // is done (dst holds the pages), false while it is still running, an error when it failed (dst
  // must not be used). After true or an error the ticket is spent. wait_state_read blocks until
  // the copy ends (for shutdown, never inside the step loop) and spends the ticket the same way.
  // Until the ticket is spent the caller keeps `pages` allocated and unwritten and `dst` alive.
  // async_state_reads() says whether the copy really runs in the background; where it does not
  // (the default, host-storage arenas) begin is the synchronous read and every ticket is done.
  virtual bool async_state_reads() const { return false; }
  virtual Result<int64_t> begin_read_state_pages(const state::PageArena& arena,
                                                 std::span<const int32_t> pages,
                                                 float* dst) {
    DSI_RETURN_IF_ERROR(read_state_pages(arena, pages, dst));
    return int64_t{0};
  }
  virtual Result<bool> poll_state_read(int64_t ticket) {
    (void)ticket;
    return true;
  }
  virtual Status wait_state_read(int64_t ticket) {
    (void)ticket;
    return Status();
  }
  // A latched unrecoverable device error (OK for the CPU).
  virtual Status health() const { return Status(); }
  // Expert parallelism over several processes (one per GPU): every rank's forward_batch runs the
  // same collective exchanges, so every rank must call forward_batch the same number of times —
  // with no items when it has no work of its own (an empty pass that serves the other ranks'
  // tokens). all_ranks_sum() is the collective the driver loop uses to agree on whether any rank
  // still has work. Single-process backends: no lockstep, the sum is the value itself.
  virtual bool lockstep() const { return false; }
  virtual Result<int64_t> all_ranks_sum(int64_t v) { return v; }
  virtual const char* name() const = 0;
  virtual const model::ModelConfig& config() const = 0;
  virtual model::Numerics numerics() const = 0;
};

}  // namespace dsinfer::backend
