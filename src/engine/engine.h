// Engine: the offline/online facade over model, state arena, scheduler and sampler. step() is
// the spine: plan -> execute every scheduled chunk -> sample -> stop checks -> emit -> retire.
// Not thread-safe: one thread drives step(); a later server puts an inbox in front of it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "backend/cpu_v41/engram_store.h"
#include "base/status.h"
#include "engine/device_tier.h"
#include "engine/prefix_cache.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "model/checkpoint.h"
#include "spec/config.h"
#include "spec/drafter.h"
#include "spec/stats.h"
#include "spec/verify_length.h"
#include "state/page_arena.h"
#include "state/sequence_state.h"

namespace dsinfer::engine {

enum class Device { kCpu, kCuda };

// The CPU backend's implementation: the reference (backend/cpu, the oracle of the golden tests
// and `score`) or the fast path (backend/cpu/fast: batched GEMMs, threads). The command line
// and the Python package default to kFast; an EngineConfig made in C++ starts at the reference.
enum class CpuKernels { kReference, kFast };
const char* cpu_kernels_name(CpuKernels k);

struct EngineConfig {
  std::string model_dir;
  model::Numerics numerics = model::Numerics::kReference;
  Device device = Device::kCpu;
  CpuKernels cpu_kernels = CpuKernels::kReference;
  int cpu_threads = 0;     // fast CPU path: 0 = the process-wide pool ($DSINFER_CPU_THREADS or all)
  int device_ordinal = 0;  // CUDA device
  bool cuda_graphs = true;  // decode steps replayed from CUDA graphs
  // Sample in the backend where it can (CUDA: on the device, only token ids come back instead
  // of [vocab] logits per sequence); requests that need the logits on the host (top_logprobs,
  // speculative verification, the first token of shared-prompt choices) still get them.
  bool backend_sampling = true;
  // Asynchronous scheduling, on a backend whose can_defer_samples() is true (CUDA): a step whose
  // tokens are all sampled in the backend (decodes, prompts' last chunks; prompt chunks beside
  // them) returns before its picks are known; the host plans and launches the next step while
  // the device runs it (each request's token taken on the device), and reads the picks one step
  // later. Steps with speculation, penalties, token masks or top_logprobs wait for the device as
  // before (docs/gpu.md).
  bool async_scheduling = false;
  // CUDA: every linear on kernels whose summation order does not depend on the batch, so a
  // request's logits are bit-identical whatever else is batched with it (slower prefill).
  bool batch_invariant = false;
  // Expert parallelism (CUDA): 0 = off; N >= 1 = this process is one of N ranks (one process
  // per GPU, started by `dsinfer generate --ep N`; DSINFER_EP_* set), joined over NCCL.
  int expert_parallel = 0;
  int64_t state_budget_bytes = int64_t{1} << 30;  // the one memory budget for sequence state
  int64_t page_bytes = 0;                         // 0 = state::default_page_bytes(model)
  int64_t max_model_len = 0;                      // 0 = model's max_position_embeddings
  // DeepSeek V4.1: prefill early exit, the consumer half on the last K prompt rows (0 = exact).
  int64_t prefill_keep_rows = 0;
  // DeepSeek V4.1: where the Engram tables live (--engram-placement; docs/v41.md). auto: host
  // memory while they fit, else the checkpoint's memory map, rows gathered on the host; host /
  // mapped: all of them there; device: GPU memory, rows gathered on the device (--device cuda).
  cpu_v41::EngramPlacement engram_placement = cpu_v41::EngramPlacement::kAuto;
  int32_t max_top_logprobs = sampling::kDefaultMaxTopLogprobs;  // top_logprobs' upper bound
  SchedulerConfig scheduler;
  // Prefix cache over a KV store (off without a store; off under expert parallelism).
  PrefixCacheConfig prefix_cache;
  // Speculative decoding with the checkpoint's drafter (V4: the MTP block). Off in a C++
  // EngineConfig; the command line defaults to auto where the checkpoint has a drafter.
  spec::Config speculative;
  // auto: the step-time model; when unset, measured on the backend when the engine is created.
  std::optional<spec::StepTimes> step_times;
  // Benchmarks only (`bench --speculative --forced-acceptance P`): each verified draft is accepted
  // with probability P in (0, 1] whatever the target says, and emitted as it was drafted; every
  // step's work (drafting, verification, sampling, rollback) is real, the tokens are not the
  // model's. For models whose drafter accepts nothing (random weights). 0: off.
  double forced_acceptance = 0;
  // The clock the engine reads (seconds, monotonic): step times (auto's start-up measurement and
  // corrections, the step phases) and request timestamps. Unset: std::chrono::steady_clock.
  // Tests run the engine on a simulated device's clock (tests/unit/engine/auto_sim_test.cc), or
  // on a stopped one: steps measured at zero seconds leave auto's step-time model as given.
  std::function<double()> clock;
};

// The backend for config.device (CPU reference or CUDA); errors say why a device is unusable.
Result<std::unique_ptr<backend::Model>> create_model(const EngineConfig& config,
                                                     const model::ModelConfig& mc,
                                                     const model::ModelWeights& weights);

using TokenCallback = std::function<void(const TokenEvent&)>;

struct EngineStats {
  int64_t steps = 0;
  int64_t prompt_tokens = 0;  // prompt tokens prefilled (recomputation included)
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  // Steps launched while the step before them still ran (asynchronous scheduling).
  int64_t async_steps = 0;
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t state_bytes_used = 0;
  int64_t state_bytes_total = 0;
  // The state layout's footprint (Engine::footprint), constant over the engine's life.
  int64_t state_bytes_fixed = 0;     // one sequence at one token (rings, compressor rows)
  double state_bytes_per_token = 0;  // growth per token of context at long contexts
  int64_t state_max_context = 0;     // tokens of context one sequence can hold in the budget
  // Prefix cache.
  int64_t cached_prompt_tokens = 0;  // prompt tokens restored instead of computed
  int64_t cache_lookups = 0;
  int64_t cache_hits = 0;              // admissions that started from a stored unit
  int64_t cache_restore_failures = 0;  // a unit found at submit() but not usable at admission
  int64_t cache_units_stored = 0;
  int64_t cache_store_failures = 0;  // a capture that failed (its unit is not stored)
  // Captures whose pages were read to host memory in the background (async_state_reads
  // backends), and those still being read.
  int64_t cache_async_captures = 0;
  int64_t cache_captures_pending = 0;  // copying, or their images being assembled
  DeviceTierStats device_tier;  // the prefix cache's device tier (hits there never reach the store)
  spec::Config speculative;     // in effect (off when the checkpoint or backend has no drafter)
  spec::Stats spec;
  // Wall seconds of the step loop's phases, summed over steps (`bench --speculative` reports
  // them per step): where a step's time goes on the host beside the backend's calls. draft and
  // forward are the drafter's and the batched forward's calls whole (their device work and
  // synchronisation included); the rest is host work of the engine alone.
  struct StepPhases {
    double schedule = 0;  // the scheduler's plan (admission, preemption, chunking)
    double draft = 0;     // choosing the drafts and the drafter's call
    double prepare = 0;   // the forward's items: tokens, drafts, sampling requests
    double forward = 0;   // Model::forward_batch
    double finish = 0;    // sampling on the host where needed, acceptance, rollback, outputs
    // The phases by name, in this order (what bench and /metrics report).
    static constexpr std::array<const char*, 5> kNames = {
        "schedule", "draft", "prepare", "forward", "finish"};
    std::array<double, 5> seconds() const { return {schedule, draft, prepare, forward, finish}; }
  } phases;
};

// Sequence-state footprint of a model in pages of page_bytes (what `bench` and /metrics report):
// bytes one sequence holds at one token, bytes per further token of context (the average over
// 64k..128k tokens, i.e. with the compressed entries and index keys), and the longest context
// (<= max_len) one sequence can hold in budget_pages. max_rollback: V4's rollback limit.
struct Footprint {
  int64_t page_bytes = 0;
  int64_t fixed_bytes = 0;
  double bytes_per_token = 0;
  int64_t max_context_tokens = 0;
};
Footprint state_footprint(const backend::Model& m,
                          int64_t page_bytes,
                          int64_t max_rollback,
                          int64_t budget_pages,
                          int64_t max_len);

class Engine {
 public:
  // Loads the checkpoint and sizes the state arena. Errors name the file/field/flag.
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config);
  // Same over an already opened checkpoint (tests share one across engines).
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config,
                                                std::shared_ptr<const model::Checkpoint> ckpt);
  // Same with a backend the caller made (over ckpt's weights, or owning its own checkpoint when
  // ckpt is null: DeepSeek V4.1); config.device is not used.
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config,
                                                std::shared_ptr<const model::Checkpoint> ckpt,
                                                std::unique_ptr<backend::Model> model);

  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Bad input (empty prompt, token ids outside the vocabulary,
  // invalid sampling values, prompt + max_tokens beyond the model's or the memory's limit) is an
  // invalid-argument Status and leaves the engine untouched.
  Result<RequestId> submit(RequestSpec spec, TokenCallback on_token = {});
  // Aborts a request (no-op when unknown or finished).
  void abort(RequestId id, const std::string& why = "aborted");
  // One iteration. Returns false when there is nothing left to do.
  bool step();
  void run_until_done();
  // The driver step under expert parallelism over several processes (backend lockstep): all
  // ranks agree whether any of them has work and, if so, all step. Returns whether to go on.
  // Without lockstep it is step().
  Result<bool> step_all_ranks();

  // The request record (valid until release()); null when unknown.
  const Request* request(RequestId id) const;
  // Drops a finished request's record.
  void release(RequestId id);

  EngineStats stats() const;
  // The sequence-state footprint in this engine's pages (state_footprint).
  const Footprint& footprint() const { return footprint_; }
  const model::ModelConfig& model_config() const { return model_->config(); }
  const state::PageArena& arena() const { return *arena_; }
  // OK while the backend is healthy; after a device failure, that failure (every in-flight
  // request has been failed with it and step() returns false).
  Status health() const { return failure_; }
  const backend::Model& model() const { return *model_; }
  // The prefix cache's store (null when off).
  kvstore::KvStore* kv_store() const { return store_.get(); }
  // Speculative decoding in effect, and auto's step-time model (empty unless auto).
  const spec::Config& speculative() const { return spec_; }
  const spec::StepTimes& step_times() const { return step_times_; }
  // Auto's step-cost model (null unless auto): what the measured steps taught it.
  const spec::StepCost* step_cost() const { return cost_.get(); }
  // Prefix-cache captures whose page copy is still running (their units are not in the store
  // yet; step() polls them and stores those that finished).
  int64_t pending_captures() const { return static_cast<int64_t>(captures_.size()); }
  // A capture whose copy finished has its image assembled and stored on the store's worker
  // thread (counted in stats() once stored); this blocks until every such image is stored or
  // has failed (tests; the destructor does it after waiting for the copies). Never called by
  // the step loop.
  void wait_stored_captures();
  // Called with each prefix-cache unit's key and image just before it is stored, on the thread
  // that built the image: the store's worker for background captures, the caller of step() for
  // synchronous ones (tests).
  using StoreObserver = std::function<void(const kvstore::Key128& key, std::string_view image)>;
  void set_store_observer(StoreObserver observer);
  // Runs every integrity checker (scheduler, arena, sequence states); aborts on violation.
  void check_integrity() const;
  double now_s() const;

 private:
  Footprint footprint_;
  class Memory;
  Engine();
  void run_chunks();
  void finish_chunk(const ScheduledChunk& c, const Status& s, backend::ForwardOutputs& out);
  // Speculative decoding: chooses each decode chunk's number of drafts and drafts them
  // (chunk_k_, drafts_); false after a device failure.
  bool plan_drafts();
  // Auto: the depth the cost model picks for b decoding requests (-1: no speculation); the step's
  // choice (it keeps E(depth) for record_tokens and, in a step of decode chunks only, advances
  // the cost model's per-bucket hold and cold-shape counters). mixed: the step also runs prefill
  // chunks (StepCost::choose_mixed).
  int32_t auto_depth(int64_t b, bool mixed);
  // Auto: whether the cost model would run b decoding requests without speculation, asked
  // without a step (at a request's admission): nothing recorded, no counter advanced. The hold
  // and warm-shape substitutions of auto_depth only move between depths >= 1, so the answer is
  // auto_depth's.
  bool auto_says_off(int64_t b);
  // Under auto: requests that stopped speculating resume when speculation pays again (a smaller
  // batch), on a backend whose MTP block can restart from the kept final streams.
  void resume_drafting();
  void refresh_rates();  // rates_ from the predictor's acceptance at each draft position
  // Auto: whether this step's wall time goes to the cost model (a step of decode chunks only,
  // all speculating or none): step_b_ > 0, with its depth in step_depth_; or as a mixed step's
  // (prefill chunks beside decode chunks that all verified at the step's depth >= 1):
  // mixed_b_ > 0, its decode chunks.
  void classify_step();
  static bool is_decode_chunk(const ScheduledChunk& c);
  // Verifies chunk i's drafts against the target's logits (out), emits the accepted tokens and
  // the target's own next token, and rolls the state back past the first rejected draft.
  void finish_verify(size_t i, backend::ForwardOutputs& out);
  void fail_all(const Status& why);
  void finish(Request& r, FinishReason why);
  // Asynchronous scheduling: whether chunk i (item `it`) may leave its pick on the device.
  bool can_defer(size_t i, const backend::ForwardItem& it) const;
  // The step in flight's picks, which the backend has written (a later forward_batch or
  // complete_deferred_samples returned): each request takes its token (accept_token).
  void resolve_in_flight();
  // Waits for the step in flight's picks and resolves them (before work that needs the tokens).
  void drain_in_flight();
  // Stores a sampled token, applies the stop conditions and calls the token callback.
  void accept_token(Request& r, const sampling::SampleResult& sr);
  // Whether chunk c's token is sampled in the backend (ForwardOptions::sample); if so, fills
  // sample_reqs_[slot] (and the mask in sample_masks_[slot]) for it.
  bool prepare_backend_sample(const ScheduledChunk& c, size_t slot);
  // Whether verification chunk c (k drafts) samples every position in the backend
  // (ForwardOptions::sample_rows: only the picks come back, not (k + 1) rows of logits); if so,
  // fills verify_reqs_[slot]: position p sampled as finish_verify would on the host after drafts
  // 0..p-1 were accepted (its step, and those drafts as extra output for the penalties).
  bool prepare_backend_verify(const ScheduledChunk& c, size_t slot, int32_t k);
  // Samples r's next token from `logits` (scratch), under its TokenMask when it has one.
  sampling::SampleResult sample_for(Request& r, std::span<float> logits);
  // Forks `parent`'s prompt state into the requests waiting to share it, each sampling its first
  // token from `logits`; those that cannot fork go to the scheduler to compute their prompt.
  void start_forks(Request& parent, std::span<const float> logits);
  // Hands the requests waiting to share `parent`'s prompt to the scheduler (parent ended).
  void release_forks(RequestId parent);
  // Prefix cache: the lookup at submit(), the restore at admission, a unit stored from r's
  // state at its current length.
  void cache_lookup(Request& r);
  void cache_restore(Request& r, state::SequenceState& st);
  void cache_store(Request& r, const state::SequenceState& st);
  // Stores a captured image of r's first n tokens; the unit's key (none when not stored).
  std::optional<kvstore::Key128> cache_put(Request& r, int64_t n, std::string image);
  // The store entry of r's first n tokens (none when that unit is not stored: too short, or
  // what r was restored from).
  std::optional<kvstore::EntryMeta> unit_meta(const Request& r, int64_t n) const;
  // Asynchronous capture (backend::Model::async_state_reads): forks st (into the device tier,
  // else a fork held for the copy only), starts reading the fork's pages to host memory and
  // returns true; the unit is stored by poll_captures once the copy is done. False when it
  // cannot start (no pages for the fork, no staging): cache_store then captures synchronously.
  // *tier_tried: st was offered to the device tier already.
  struct PendingCapture;
  bool begin_capture(Request& r, const state::SequenceState& st, bool* tier_tried);
  // Stores the units of the captures whose copy finished, drops those whose copy failed; never
  // waits.
  void poll_captures();
  // When c's copy succeeded (`copied` OK), hands the copied pages and the image plan to the
  // store's worker, which assembles and stores the image; else counts a store failure.
  void end_capture(PendingCapture& c, const Status& copied);
  // Waits for every pending capture, ends it and waits until its image is stored (shutdown).
  void drain_captures();
  struct Assemblies;
  // Where r's prefill pauses next to store a unit (-1: nowhere).
  int64_t next_snapshot(const Request& r) const;
  // Bounded replay (cache_layout_.save_point > 0): whether a save point of r at n tokens is
  // stored at once (an interval point or the prompt's repeat point), not held until r ends.
  bool stores_at_once(const Request& r, int64_t n) const;

  EngineConfig config_;
  std::shared_ptr<const model::Checkpoint> ckpt_;
  std::unique_ptr<backend::Model> model_;
  std::unique_ptr<state::PageArena> arena_;
  std::unique_ptr<Memory> memory_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<RequestId, std::unique_ptr<Request>> requests_;
  std::map<RequestId, TokenCallback> callbacks_;
  RequestId next_id_ = 1;
  int64_t max_model_len_ = 0;
  StepPlan plan_;
  std::vector<std::vector<int32_t>> chunk_tokens_;
  std::vector<backend::ForwardOutputs> outs_;
  // Asynchronous scheduling: the step whose picks are still on the device (its requests and
  // their slots in in_flight_outs_, where the backend writes them), none when empty.
  bool defer_ok_ = false;
  std::vector<std::pair<RequestId, size_t>> in_flight_;
  std::vector<std::pair<RequestId, size_t>> resolving_;  // resolve_in_flight's
  std::vector<backend::ForwardOutputs> in_flight_outs_;
  std::vector<backend::ForwardItem> items_;
  std::vector<size_t> item_chunk_;
  Status failure_;  // a device failure: every request failed, step() does nothing more
  sampling::SamplerScratch sampler_scratch_;
  std::vector<uint32_t> mask_bits_;  // a request's TokenMask for the token being sampled
  // In-backend sampling: one request and token mask per chunk of the plan.
  std::vector<backend::SampleRequest> sample_reqs_;
  std::vector<std::vector<backend::SampleRequest>> verify_reqs_;  // [slot][position]
  std::vector<std::vector<uint32_t>> sample_masks_;
  // share_prompt_of: requests waiting for their parent's prompt state, by parent id.
  std::map<RequestId, std::vector<Request*>> pending_forks_;
  std::vector<float> fork_logits_;
  std::vector<std::pair<int32_t, int32_t>> fork_pairs_;
  EngineStats stats_;
  std::mt19937_64 forced_rng_{0x5eed};       // EngineConfig::forced_acceptance's draws
  std::shared_ptr<kvstore::KvStore> store_;  // null: no prefix cache
  std::unique_ptr<DeviceTier> device_tier_;  // null: no device tier
  // A device-tier restore whose page copy failed left a state without its contents: the step
  // fails every request (a device fault) before anything runs on it.
  Status pending_fault_;
  std::unique_ptr<PrefixKeys> prefix_keys_;
  backend::PrefixCacheLayout cache_layout_;  // how this backend's states are stored
  // Bounded replay: the latest save point of a running request after its prompt's repeat
  // point, captured there and stored when the request ends (its length, its image).
  std::map<RequestId, std::pair<int64_t, std::string>> held_units_;
  // Asynchronous captures in flight, oldest first; sequence ids for their forks.
  std::vector<std::unique_ptr<PendingCapture>> captures_;
  int64_t next_capture_id_ = 0;
  std::shared_ptr<Assemblies> assemblies_;  // images assembled off the step loop
  double t0_ = 0;
  // Speculative decoding.
  spec::Config spec_;
  // DSINFER_SPEC_TRACE=1: one stderr line per speculating step (batch, depth, each request's
  // drafts verified and whether it stopped speculating), for tracing auto's choices.
  bool trace_spec_ = false;
  std::unique_ptr<spec::Drafter> drafter_;
  spec::StepTimes step_times_;
  std::unique_ptr<spec::AcceptancePredictor> predictor_;
  // Auto: the step-time model corrected by the steps' measured wall times, and this step's
  // depth (the drafts each speculating request was allowed; -1 none drafted, MTP off).
  std::unique_ptr<spec::StepCost> cost_;
  int32_t step_depth_ = 0;
  int64_t step_b_ = 0;
  int64_t mixed_b_ = 0;
  std::vector<double> rates_;     // the acceptance predictor's rate by draft position
  std::vector<double> expected_;  // auto_depth: E(depth) from rates_ (tokens per request)
  std::vector<uint8_t> warm_;     // auto_depth: per depth, whether its fixed shape is prepared
  std::vector<int32_t> chunk_k_;  // drafts verified by each chunk of the plan
  std::vector<uint8_t> chunk_deferred_;  // its drafts left on the device (DraftRequest::deferred)
  std::vector<spec::Draft> drafts_;      // each chunk's drafts
  // Each chunk's catch-up tokens (spec::DraftRequest::catch_up).
  std::vector<std::vector<int32_t>> catch_up_;
  std::vector<spec::DraftRequest> draft_reqs_;
  std::vector<size_t> draft_chunk_;  // chunk of each draft request / accept_ row
  std::vector<std::vector<double>> accept_;
};

}  // namespace dsinfer::engine
