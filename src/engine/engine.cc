// Engine: request validation, the step loop, sampling and stop conditions.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "backend/cpu/fast/fast_model.h"
#include "backend/cpu_v41/backend.h"
#include "base/check.h"
#include "base/strings.h"
#include "spec/measure.h"
#if DSINFER_HAVE_CUDA_BACKEND
#include "backend/cuda/cuda_model.h"
#include "backend/cuda_v41/backend.h"
#include "comm/bootstrap.h"
#include "comm/nccl_comm.h"
#endif

namespace dsinfer::engine {

// The scheduler's memory hooks: one SequenceState per admitted request, in the shared arena.
class Engine::Memory : public MemoryHooks {
 public:
  // shape: the backend's state layout (null: V4's, from the config and max_rollback).
  // format: how V4's K=V rows and index keys are stored (the backend's row_format()).
  Memory(const model::ModelConfig& config,
         const state::StateShape* shape,
         state::PageArena* arena,
         int64_t max_rollback,
         state::RowFormat format)
      : config_(config),
        shape_(shape),
        arena_(arena),
        max_rollback_(max_rollback),
        format_(format) {}
  // A fresh sequence of this engine's layout.
  std::unique_ptr<state::SequenceState> make(int64_t id) const {
    return shape_ ? std::make_unique<state::SequenceState>(*shape_, arena_, id)
                  : std::make_unique<state::SequenceState>(
                        config_, arena_, id, max_rollback_, format_);
  }
  bool admit(Request& r) override {
    if (states_.count(r.id))
      return true;
    auto st = make(r.id);
    while (!st->ok()) {
      st.reset();  // its pages go back to the arena with it
      if (!make_room || !make_room())
        return false;
      st = make(r.id);
    }
    state::SequenceState& ref = *st;
    states_.emplace(r.id, std::move(st));
    if (on_admit)
      on_admit(r, ref);
    return true;
  }
  // Called with each newly allocated state (the prefix cache restores into it).
  std::function<void(Request&, state::SequenceState&)> on_admit;
  // Frees pages held for something other than requests (the prefix cache's device tier) when a
  // request needs them; false when there is nothing left to free.
  std::function<bool()> make_room;
  bool reserve(Request& r, int64_t n) override {
    auto it = states_.find(r.id);
    DSI_CHECK(it != states_.end(),
              "reserve for request %lld without state",
              static_cast<long long>(r.id));
    while (!it->second->reserve(n)) {
      if (!make_room || !make_room())
        return false;
    }
    return true;
  }
  void release(Request& r) override { states_.erase(r.id); }
  state::SequenceState& state(RequestId id) {
    auto it = states_.find(id);
    DSI_CHECK(it != states_.end(), "no state for request %lld", static_cast<long long>(id));
    return *it->second;
  }
  const std::map<RequestId, std::unique_ptr<state::SequenceState>>& states() const {
    return states_;
  }

 private:
  const model::ModelConfig& config_;
  const state::StateShape* shape_;
  state::PageArena* arena_;
  int64_t max_rollback_;  // the most drafts a step verifies
  state::RowFormat format_;
  std::map<RequestId, std::unique_ptr<state::SequenceState>> states_;
};

namespace {
// Pages of a sequence of n tokens, from the backend's state shape or V4's config.
// max_rollback: V4's rollback limit (the most drafts a step verifies); a shape carries its own.
int64_t sequence_pages(const backend::Model& m,
                       int64_t page_bytes,
                       int64_t n,
                       int64_t max_rollback) {
  if (const state::StateShape* s = m.state_shape())
    return state::SequenceState::pages_for(*s, page_bytes, n);
  return state::SequenceState::pages_for(m.config(), page_bytes, n, max_rollback, m.row_format());
}
}  // namespace

const char* cpu_kernels_name(CpuKernels k) {
  return k == CpuKernels::kFast ? "fast" : "reference";
}

namespace {
// A FastCpuModel that owns its thread pool (EngineConfig::cpu_threads > 0).
class OwnedPoolFastModel final : public backend::Model {
 public:
  OwnedPoolFastModel(const model::ModelConfig& mc,
                     const model::ModelWeights& weights,
                     model::Numerics numerics,
                     int threads)
      : pool_(threads), model_(mc, weights, numerics, &pool_) {}
  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const backend::ForwardOptions& options,
                 backend::ForwardOutputs* out) override {
    return model_.forward(st, tokens, options, out);
  }
  Status forward_batch(std::span<backend::ForwardItem> items) override {
    return model_.forward_batch(items);
  }
  bool can_draft() const override { return model_.can_draft(); }
  bool can_resume_drafting() const override { return model_.can_resume_drafting(); }
  Status mtp_draft_batch(std::span<backend::DraftItem> items) override {
    return model_.mtp_draft_batch(items);
  }
  const char* name() const override { return model_.name(); }
  const model::ModelConfig& config() const override { return model_.config(); }
  model::Numerics numerics() const override { return model_.numerics(); }

 private:
  cpu::fast::ThreadPool pool_;
  cpu::fast::FastCpuModel model_;
};
}  // namespace

Result<std::unique_ptr<backend::Model>> create_model(const EngineConfig& config,
                                                     const model::ModelConfig& mc,
                                                     const model::ModelWeights& weights) {
  switch (config.device) {
    case Device::kCpu:
      if (config.expert_parallel > 0)
        return invalid_argument("--ep: expert parallelism needs --device cuda");
      if (config.cpu_threads < 0)
        return invalid_argument("--cpu-threads must be >= 0");
      if (config.cpu_kernels == CpuKernels::kFast) {
        if (config.cpu_threads > 0) {
          return std::unique_ptr<backend::Model>(std::make_unique<OwnedPoolFastModel>(
              mc, weights, config.numerics, config.cpu_threads));
        }
        return std::unique_ptr<backend::Model>(std::make_unique<cpu::fast::FastCpuModel>(
            mc, weights, config.numerics, &cpu::fast::default_pool()));
      }
      return std::unique_ptr<backend::Model>(
          std::make_unique<cpu::CpuModel>(mc, weights, config.numerics));
    case Device::kCuda: {
#if DSINFER_HAVE_CUDA_BACKEND
      gpu::CudaModelOptions co;
      co.device = config.device_ordinal;
      co.cuda_graphs = config.cuda_graphs;
      co.batch_invariant = config.batch_invariant;
      if (config.expert_parallel > 0) {
        // One process per GPU: this process must have been started as a rank by the launcher
        // (dsinfer generate --ep N), which sets DSINFER_EP_RANK/SIZE/ID_FILE.
        if (!comm::rank_env_present()) {
          return Status(StatusCode::kFailedPrecondition,
                        str_format("--ep %d: this process was not started as a rank (%s unset); "
                                   "`dsinfer generate --ep N` launches the ranks itself",
                                   config.expert_parallel,
                                   comm::kEnvRank));
        }
        DSI_ASSIGN_OR_RETURN(comm::Bootstrap boot, comm::bootstrap_from_env());
        if (boot.size != config.expert_parallel) {
          return invalid_argument(
              str_format("--ep %d but %s=%d", config.expert_parallel, comm::kEnvSize, boot.size));
        }
        DSI_ASSIGN_OR_RETURN(
            auto nc, comm::NcclComm::create(boot, boot.rank, boot.size, config.device_ordinal));
        co.comm = std::shared_ptr<comm::Comm>(std::move(nc));
      }
      auto m = gpu::CudaModel::create(mc, weights, config.numerics, co);
      if (!m.ok())
        return m.status();
      return std::unique_ptr<backend::Model>(std::move(m).value());
#else
      return Status(StatusCode::kUnimplemented,
                    "--device cuda: this build has no CUDA backend (configure with "
                    "-DDSINFER_CUDA=ON on a machine with nvcc)");
#endif
    }
  }
  return invalid_argument("unknown device");
}

// A prefix-cache capture whose pages are being read to host memory (begin_capture).
struct Engine::PendingCapture {
  // A fork of the request's state (the device tier's entry or a fork of its own): its pages stay
  // allocated and unwritten while this holds it, whatever happens to the request or the tier.
  std::shared_ptr<const state::SequenceState> st;
  // What the image needs, as plain data: its head and row sources (state::plan_image, taken
  // when the capture began) and the copied pages (plan.pages, filled once the copy is done).
  // end_capture hands both to the store's worker, which assembles the image without st.
  struct Copy {
    state::ImagePlan plan;
    std::vector<float> host;
  };
  std::shared_ptr<Copy> copy;
  int64_t ticket = 0;
  kvstore::EntryMeta meta;  // the store entry, taken from the request when the capture began
};

// The images being assembled on the store's worker (end_capture) and their outcomes, shared with
// the worker's jobs; stats() adds the outcomes to the loop's own counts.
struct Engine::Assemblies {
  std::mutex mu;
  std::condition_variable cv;
  int64_t in_flight = 0;
  int64_t stored = 0;
  int64_t failed = 0;
  StoreObserver observer;
};

// Sequence ids of the capture forks: apart from requests, the device tier and the step-time
// measurement.
constexpr int64_t kCaptureIdBase = int64_t{5} << 60;

Engine::Engine() : assemblies_(std::make_shared<Assemblies>()) {}

Engine::~Engine() {
  // (The picks of a step in flight are written into this engine's outputs: wait for them.)
  if (!in_flight_.empty())
    (void)model_->complete_deferred_samples();
  drain_captures();
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  // DeepSeek V4.1 checkpoints: the V4.1 backends open their own checkpoint.
  if (cpu_v41::is_v41_model_dir(config.model_dir)) {
    cpu_v41::V41BackendOptions o;
    o.numerics = config.numerics;
    o.prefill_keep_rows = config.prefill_keep_rows;
    o.engram.placement = config.engram_placement;
    if (config.device == Device::kCuda) {
#if DSINFER_HAVE_CUDA_BACKEND
      if (config.expert_parallel > 0)
        return unimplemented("--ep: DeepSeek V4.1 runs on one GPU so far");
      gpu_v41::CudaV41Options co;
      co.device = config.device_ordinal;
      // Said once per engine until the GPU tests have run on a device (docs/gpu.md).
      std::fprintf(stderr,
                   "dsinfer: warning: the DeepSeek V4.1 CUDA backend has not been validated on a "
                   "GPU yet (docs/gpu.md); --device cpu is the checked path\n");
      auto m = gpu_v41::CudaV41Backend::open(config.model_dir, o, co);
      if (!m.ok())
        return m.status();
      return create(config, nullptr, std::unique_ptr<backend::Model>(std::move(m).value()));
#else
      return Status(StatusCode::kUnimplemented,
                    "--device cuda: this build has no CUDA backend (configure with "
                    "-DDSINFER_CUDA=ON on a machine with nvcc)");
#endif
    }
    auto m = cpu_v41::V41Backend::open(config.model_dir, o);
    if (!m.ok())
      return m.status();
    return create(config, nullptr, std::unique_ptr<backend::Model>(std::move(m).value()));
  }
  if (config.prefill_keep_rows != 0)
    return invalid_argument("--prefill-keep-rows applies to DeepSeek V4.1 checkpoints only");
  if (config.engram_placement != cpu_v41::EngramPlacement::kAuto)
    return invalid_argument("--engram-placement applies to DeepSeek V4.1 checkpoints only");
  auto ckpt = model::Checkpoint::open(config.model_dir);
  if (!ckpt.ok())
    return ckpt.status();
  return create(config, std::shared_ptr<const model::Checkpoint>(std::move(ckpt).value()));
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config,
                                               std::shared_ptr<const model::Checkpoint> ckpt) {
  auto model = create_model(config, ckpt->config(), ckpt->weights());
  if (!model.ok())
    return model.status();
  return create(config, std::move(ckpt), std::move(model).value());
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config,
                                               std::shared_ptr<const model::Checkpoint> ckpt,
                                               std::unique_ptr<backend::Model> model) {
  const auto& mc = model->config();
  const state::StateShape* shape = model->state_shape();
  const int64_t min_page = shape ? state::min_page_bytes(*shape) : state::min_page_bytes(mc);
  const int64_t page_bytes = config.page_bytes ? config.page_bytes
                             : shape           ? state::default_page_bytes(*shape)
                                               : state::default_page_bytes(mc);
  if (page_bytes < min_page || page_bytes % 4 != 0) {
    return invalid_argument(
        str_format("page size %lld bytes is too small for this model (min %lld)",
                   static_cast<long long>(page_bytes),
                   static_cast<long long>(min_page)));
  }
  const SchedulerConfig& sc = config.scheduler;
  if (sc.max_tokens_per_step < 1 || sc.max_running < 1 || sc.prefill_chunk < 1) {
    return invalid_argument(
        "scheduler limits (max tokens per step, max running sequences, "
        "prefill chunk) must be >= 1");
  }
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = config;
  e->ckpt_ = std::move(ckpt);
  e->model_ = std::move(model);
  e->defer_ok_ =
      config.async_scheduling && e->model_->can_defer_samples() && !e->model_->lockstep();
  // Speculative decoding: the checkpoint's drafter, where this backend can run it.
  e->spec_ = config.speculative;
  if (const char* v = std::getenv("DSINFER_SPEC_TRACE"); v != nullptr && v[0] == '1')
    e->trace_spec_ = true;
  // The reference CPU kernels are the oracle, not a fast path: speculation only when asked for.
  if (e->spec_.defaulted && config.device == Device::kCpu &&
      config.cpu_kernels == CpuKernels::kReference)
    e->spec_ = spec::Config();
  // On CUDA, speculation only when asked for: on the H200 (eleventh session, bundled model) auto
  // gives 1.54x at batch 1 but 0.96x of off at batch 64, where each decode wave's tail meets
  // (batch, depth) shapes whose graphs are not captured yet.
  if (e->spec_.defaulted && config.device == Device::kCuda)
    e->spec_ = spec::Config();
  if (e->spec_.mode != spec::Mode::kOff) {
    const char* why = nullptr;
    if (e->spec_.k < 1 || e->spec_.k > spec::kMaxDrafts)
      return invalid_argument(
          str_format("--speculative: %d drafts (1..%d)", e->spec_.k, spec::kMaxDrafts));
    // A block drafter (V4.1's DSpark) drafts blocks of at most block_draft_size() tokens.
    const int32_t block = e->model_->block_draft_size();
    if (block > 0 && e->spec_.k > block) {
      if (e->spec_.mode != spec::Mode::kAuto)
        return invalid_argument(str_format(
            "--speculative %s: this model's DSpark drafter proposes at most %d drafts (max "
            "backtracking - 1)",
            spec::to_string(e->spec_).c_str(),
            block));
      e->spec_.k = block;
    }
    if (block > 0) {
      if (e->model_->lockstep())
        why = "expert parallelism over several processes does not speculate yet";
    } else if (e->model_->state_shape() != nullptr)
      why = "the checkpoint has no usable DSpark draft blocks";
    else if (mc.mtp_layers.empty() || !e->ckpt_ || !e->ckpt_->has_mtp())
      why = "the checkpoint has no MTP weights";
    else if (e->model_->lockstep())
      why = "expert parallelism over several processes does not speculate yet";
    else if (!e->model_->can_draft())
      why = "this backend cannot draft yet";
    if (why != nullptr) {
      if (!e->spec_.defaulted) {
        return invalid_argument(
            str_format("--speculative %s: %s", spec::to_string(e->spec_).c_str(), why));
      }
      e->spec_ = spec::Config();
    } else {
      e->drafter_ = spec::make_drafter(e->model_.get(), e->spec_.k);
      DSI_CHECK(e->drafter_ != nullptr, "no drafter");
      e->predictor_ = std::make_unique<spec::AcceptancePredictor>(e->spec_.k);
    }
  }
  const int64_t max_rollback = e->spec_.max_drafts();
  e->stats_.speculative = e->spec_;
  e->stats_.spec.resize(max_rollback);
  e->arena_ = state::PageArena::with_budget(
      config.state_budget_bytes, page_bytes, e->model_->state_storage());
  const int64_t one = sequence_pages(*e->model_, page_bytes, 1, max_rollback);
  if (e->arena_->num_pages() < one) {
    return invalid_argument(
        str_format("state memory budget %s is smaller than one sequence's fixed state (%s)",
                   human_bytes(static_cast<uint64_t>(config.state_budget_bytes)).c_str(),
                   human_bytes(static_cast<uint64_t>(one * page_bytes)).c_str()));
  }
  if (config.forced_acceptance < 0 || config.forced_acceptance > 1)
    return invalid_argument("forced acceptance must be in [0, 1]");
  if (e->spec_.mode == spec::Mode::kAuto) {
    if (config.step_times) {
      if (!config.step_times->valid() || config.step_times->max_k() != e->spec_.k)
        return invalid_argument("step-time model does not match --speculative auto's drafts");
      e->step_times_ = *config.step_times;
    } else {
      auto t = spec::measure_step_times(*e->model_,
                                        *e->drafter_,
                                        *e->arena_,
                                        std::min<int64_t>(sc.max_running, 256),
                                        e->spec_.k,
                                        config.backend_sampling && e->model_->can_sample(),
                                        4,
                                        2.0,
                                        config.clock,
                                        e->defer_ok_);
      if (!t.ok())
        return t.status();
      e->step_times_ = std::move(t).value();
    }
    e->cost_ = std::make_unique<spec::StepCost>(
        e->step_times_, e->spec_.k, e->model_->prefers_uniform_steps());
  }
  e->memory_ =
      std::make_unique<Memory>(mc, shape, e->arena_.get(), max_rollback, e->model_->row_format());
  e->scheduler_ = std::make_unique<Scheduler>(sc, e->memory_.get());
  e->max_model_len_ = config.max_model_len > 0
                          ? std::min(config.max_model_len, mc.max_position_embeddings)
                          : mc.max_position_embeddings;
  if (config.prefix_cache.store) {
    const PrefixCacheConfig& pc = config.prefix_cache;
    if (pc.block < 1 || pc.min_tokens < 1 || pc.promote_wait_ms < 0 || pc.interval < 0)
      return invalid_argument(
          "prefix cache: block and min_tokens must be >= 1, promote_wait_ms and interval >= 0");
    // How this backend's states are stored: V4's whole state, V4.1's whole state (exact
    // prefill) or V4.1's bounded replay (early exit); a mode that cannot be served is an error.
    auto layout = e->model_->prefix_cache_layout();
    if (!layout.ok())
      return layout.status();
    e->cache_layout_ = std::move(layout).value();
    const int64_t sp = e->cache_layout_.save_point;
    if (sp > 0 && pc.interval % sp != 0)
      return invalid_argument(
          str_format("prefix cache: --kv-interval %lld is not a multiple of this model's save "
                     "point (%lld tokens; 0 = no interval units)",
                     static_cast<long long>(pc.interval),
                     static_cast<long long>(sp)));
    if (!e->model_->lockstep()) {
      e->store_ = pc.store;
      // Everything that changes the stored state's numbers or layout is in the salt.
      const std::string salt = str_format(
          "%s|model=%lld/%lld/%lld/%lld|numerics=%d|device=%d|cpu=%s|image=1|rollback=%lld",
          pc.salt.c_str(),
          static_cast<long long>(mc.num_hidden_layers),
          static_cast<long long>(mc.hidden_size),
          static_cast<long long>(mc.vocab_size),
          static_cast<long long>(mc.sliding_window),
          static_cast<int>(config.numerics),
          static_cast<int>(config.device),
          cpu_kernels_name(config.cpu_kernels),
          static_cast<long long>(max_rollback));  // ring capacity = window + it
      // Another layout or cache mode (V4.1 exact / bounded replay): another image version and
      // other contents, never mixed with V4's entries or each other's.
      const std::string keyed =
          e->cache_layout_.salt.empty() ? salt : salt + "|image=2|layout=" + e->cache_layout_.salt;
      e->prefix_keys_ = std::make_unique<PrefixKeys>(keyed, pc.block);
      Engine* self = e.get();
      e->memory_->on_admit = [self](Request& r, state::SequenceState& st) {
        self->cache_restore(r, st);
      };
      if (pc.device_bytes < 0)
        return invalid_argument("prefix cache: the device tier's bytes must be >= 0");
      if (pc.device_bytes > 0) {
        Memory* mem = e->memory_.get();
        e->device_tier_ = std::make_unique<DeviceTier>(
            pc.device_bytes,
            [mem](int64_t id) { return mem->make(id); },
            e->model_.get(),
            e->arena_.get());
        DeviceTier* tier = e->device_tier_.get();
        e->memory_->make_room = [tier] { return tier->evict_one(); };
      }
    }
  }
  e->t0_ = 0;
  e->t0_ = e->now_s();
  e->footprint_ = state_footprint(*e->model_,
                                  e->arena_->page_bytes(),
                                  e->spec_.max_drafts(),
                                  e->arena_->num_pages(),
                                  e->max_model_len_);
  return e;
}

double Engine::now_s() const {
  if (config_.clock)
    return config_.clock() - t0_;
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count() - t0_;
}

Result<RequestId> Engine::submit(RequestSpec spec, TokenCallback on_token) {
  const auto& mc = model_->config();
  if (spec.prompt.empty())
    return invalid_argument("prompt is empty");
  DSI_RETURN_IF_ERROR(model_->check_prompt(spec.prompt).with_context("prompt"));
  for (size_t i = 0; i < spec.prompt.size(); ++i) {
    if (spec.prompt[i] < 0 || spec.prompt[i] >= mc.vocab_size) {
      return invalid_argument(
          str_format("prompt token %zu (id %d) is outside the vocabulary [0, %lld)",
                     i,
                     spec.prompt[i],
                     static_cast<long long>(mc.vocab_size)));
    }
  }
  for (int32_t t : spec.stop_token_ids) {
    if (t < 0 || t >= mc.vocab_size) {
      return invalid_argument(str_format("stop_token_ids: %d is outside the vocabulary", t));
    }
  }
  if (spec.max_tokens < 1) {
    return invalid_argument(
        str_format("max_tokens must be >= 1, got %lld", static_cast<long long>(spec.max_tokens)));
  }
  DSI_RETURN_IF_ERROR(sampling::validate(
      spec.sampling, std::min(config_.max_top_logprobs, sampling::kHardMaxTopLogprobs)));
  const int64_t total = static_cast<int64_t>(spec.prompt.size()) + spec.max_tokens;
  if (total > max_model_len_) {
    return invalid_argument(str_format(
        "prompt (%zu tokens) + max_tokens (%lld) exceeds the model's context limit of %lld tokens",
        spec.prompt.size(),
        static_cast<long long>(spec.max_tokens),
        static_cast<long long>(max_model_len_)));
  }
  const int64_t pages = sequence_pages(*model_, arena_->page_bytes(), total, spec_.max_drafts());
  if (pages > arena_->num_pages()) {
    return invalid_argument(str_format(
        "prompt (%zu tokens) + max_tokens (%lld) needs %s of sequence state; the state memory "
        "budget is %s",
        spec.prompt.size(),
        static_cast<long long>(spec.max_tokens),
        human_bytes(static_cast<uint64_t>(pages * arena_->page_bytes())).c_str(),
        human_bytes(static_cast<uint64_t>(arena_->num_pages() * arena_->page_bytes())).c_str()));
  }
  Request* parent = nullptr;
  if (spec.share_prompt_of != 0) {
    auto it = requests_.find(spec.share_prompt_of);
    if (it == requests_.end() || it->second->done() || !it->second->output.empty() ||
        it->second->spec.prompt != spec.prompt) {
      return invalid_argument(
          str_format("share_prompt_of: request %lld is not a request with the same prompt that "
                     "has yet to generate",
                     static_cast<long long>(spec.share_prompt_of)));
    }
    parent = it->second.get();
  }
  auto r = std::make_unique<Request>();
  r->id = next_id_++;
  r->spec = std::move(spec);
  r->penalties = sampling::PenaltyState(sampling::uses_penalties(r->spec.sampling));
  r->penalties.add_prompt(r->spec.prompt);
  r->timings.arrival_s = now_s();
  r->output.reserve(static_cast<size_t>(r->spec.max_tokens));
  Request* raw = r.get();
  requests_.emplace(raw->id, std::move(r));
  if (on_token)
    callbacks_.emplace(raw->id, std::move(on_token));
  raw->state = RequestState::kWaiting;
  cache_lookup(*raw);
  if (parent != nullptr && !model_->lockstep()) {
    pending_forks_[parent->id].push_back(raw);
  } else {
    scheduler_->add(raw);
  }
  return raw->id;
}

void Engine::abort(RequestId id, const std::string& why) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->done())
    return;
  it->second->error = why;
  finish(*it->second, FinishReason::kAbort);
}

void Engine::finish(Request& r, FinishReason why) {
  // The conversation so far is a prefix of the next turn's prompt: store it.
  if (store_ && (why == FinishReason::kStop || why == FinishReason::kLength) &&
      (r.state == RequestState::kDecoding || r.state == RequestState::kPrefilling) &&
      memory_->states().count(r.id)) {
    const state::SequenceState& st = memory_->state(r.id);
    const int64_t sp = cache_layout_.save_point;
    if (sp == 0 || st.num_tokens() % sp == 0) {
      cache_store(r, st);
    } else if (auto h = held_units_.find(r.id); h != held_units_.end()) {
      // Bounded replay: the state of the last save point (the rings have moved on since).
      cache_put(r, h->second.first, std::move(h->second.second));
    }
  }
  held_units_.erase(r.id);
  // (A pick still in flight for it is dropped when it arrives: resolve_in_flight.)
  r.awaiting_pick = false;
  r.pending_tokens = 0;
  r.finish_reason = why;
  r.state = (why == FinishReason::kAbort || why == FinishReason::kError) ? RequestState::kAborted
                                                                         : RequestState::kFinished;
  r.timings.finish_s = now_s();
  scheduler_->remove(&r);
  // A request waiting to share a prompt leaves its parent's list; a parent that ends before its
  // prompt is computed hands its waiting requests to the scheduler.
  if (r.spec.share_prompt_of != 0) {
    auto it = pending_forks_.find(r.spec.share_prompt_of);
    if (it != pending_forks_.end()) {
      std::erase(it->second, &r);
      if (it->second.empty())
        pending_forks_.erase(it);
    }
  }
  release_forks(r.id);
}

void Engine::release_forks(RequestId parent) {
  auto it = pending_forks_.find(parent);
  if (it == pending_forks_.end())
    return;
  std::vector<Request*> children = std::move(it->second);
  pending_forks_.erase(it);
  for (Request* c : children) scheduler_->add(c);
}

void Engine::start_forks(Request& parent, std::span<const float> logits) {
  auto it = pending_forks_.find(parent.id);
  if (it == pending_forks_.end())
    return;
  std::vector<Request*> children = std::move(it->second);
  pending_forks_.erase(it);
  const state::SequenceState& src = memory_->state(parent.id);
  for (Request* c : children) {
    bool forked = false;
    // A fork starts from the parent's state, not from the prefix cache.
    const int64_t cache_len = c->cache_len;
    c->cache_len = 0;
    const bool admitted = memory_->admit(*c);
    c->cache_len = cache_len;
    if (admitted) {
      fork_pairs_.clear();
      state::SequenceState& dst = memory_->state(c->id);
      forked = dst.fork_from(src, &fork_pairs_).ok() &&
               model_->copy_state_pages(*arena_, fork_pairs_).ok() && scheduler_->add_running(c);
      if (!forked)
        memory_->release(*c);
    }
    if (!forked) {
      scheduler_->add(c);  // computes its prompt itself
      continue;
    }
    c->num_computed = parent.num_computed;
    c->state = RequestState::kDecoding;
    // The forked state carries the parent's drafter state: speculating only if the parent did
    // (a parent that ran its prompt without the MTP block leaves that state behind; such a fork
    // can resume later, resume_drafting).
    c->spec_disabled = parent.spec_disabled;
    c->spec_idle_steps = parent.spec_idle_steps;
    c->spec_resume_steps = parent.spec_resume_steps;
    fork_logits_.assign(logits.begin(), logits.end());
    accept_token(*c, sample_for(*c, fork_logits_));
  }
}

// Steps in a row for which auto must find that speculation pays at the step's decode batch
// before a request that stopped speculating resumes (as many as a speculating request needs to
// stop while the acceptance rates still lean on their prior): a batch size at the edge does not
// switch it back and forth.
constexpr int32_t kResumeAfterSteps = 16;

void Engine::run_chunks() {
  // Every scheduled chunk in one batched forward; then sampling and stop checks per chunk.
  const size_t n = plan_.chunks.size();
  if (chunk_tokens_.size() < n)
    chunk_tokens_.resize(n);
  if (outs_.size() < n)
    outs_.resize(n);
  if (drafts_.size() < n) {
    drafts_.resize(n);
    catch_up_.resize(n);
  }
  if (sample_reqs_.size() < n) {
    sample_reqs_.resize(n);
    sample_masks_.resize(n);
    verify_reqs_.resize(n);
  }
  chunk_k_.assign(n, 0);
  chunk_deferred_.assign(n, 0);
  // Timed under auto (its step-cost model) and, with DSINFER_SPEC_TRACE, in every mode (so that
  // a fixed depth's steps can be set beside auto's).
  const bool timed = cost_ || (trace_spec_ && drafter_);
  const double t_step = timed ? now_s() : 0.0;
  const int64_t warmups = timed ? model_->shape_warmups() : 0;
  // (Tokens emitted and verifications this step: the trace's, and auto's gain by depth.)
  const int64_t spec_tokens = stats_.spec.spec_tokens;
  const int64_t spec_steps = stats_.spec.spec_steps;
  step_depth_ = 0;
  // Asynchronous scheduling: the drafter reads a speculating request's last token, so a step in
  // which one may draft (or resume drafting, resume_drafting) first takes the picks in flight.
  if (!in_flight_.empty() && drafter_) {
    bool drafting = false;
    for (const ScheduledChunk& c : plan_.chunks) {
      const Request& r = *c.request;
      drafting |= (r.pending_tokens > 0 && !r.spec_disabled) ||
                  r.spec_resume_steps + 1 >= kResumeAfterSteps;
    }
    if (drafting)
      drain_in_flight();
    if (!failure_.ok())
      return;
  }
  const double t_draft = now_s();
  if (drafter_ && !plan_drafts())
    return;
  const double t_prepare = now_s();
  stats_.phases.draft += t_prepare - t_draft;
  if (timed) {
    classify_step();
    if (!cost_ && step_b_ > 0) {
      // Fixed: the depth its decode chunks verify; a step in which they verify different numbers
      // (a request near its limits) is not traced.
      int32_t k = -1;
      for (size_t i = 0; i < n && k != -2; ++i) {
        if (is_decode_chunk(plan_.chunks[i]))
          k = k < 0 || k == chunk_k_[i] ? chunk_k_[i] : -2;
      }
      if (k == -2)
        step_b_ = 0;
      else if (step_depth_ >= 0)
        step_depth_ = std::max(k, 0);
    }
  }
  items_.clear();
  item_chunk_.clear();
  bool defer = defer_ok_;
  for (size_t i = 0; i < n; ++i) {
    const ScheduledChunk& c = plan_.chunks[i];
    Request& r = *c.request;
    if (r.done())
      continue;
    state::SequenceState& st = memory_->state(r.id);
    DSI_CHECK(st.num_tokens() == c.first_pos,
              "request %lld: state at %lld, chunk at %lld",
              static_cast<long long>(r.id),
              static_cast<long long>(st.num_tokens()),
              static_cast<long long>(c.first_pos));
    if (c.first_pos == 0) {  // (re)computation from the start: speculation starts over
      // Under auto, not at all (not even the drafter's forward work over the prompt) while the
      // cost model says that speculation does not pay at this batch size.
      r.spec_disabled = cost_ && auto_says_off(static_cast<int64_t>(n));
      r.spec_idle_steps = 0;
      r.spec_resume_steps = 0;
    }
    const int32_t k = chunk_k_[i];
    std::vector<int32_t>& tokens = chunk_tokens_[i];
    tokens.resize(static_cast<size_t>(c.num_tokens + k));
    for (int64_t t = 0; t < c.num_tokens; ++t) tokens[t] = r.token_at(c.first_pos + t);
    // A verification: the pending token followed by its drafts, with every position's logits.
    for (int32_t d = 0; d < k; ++d) tokens[c.num_tokens + d] = drafts_[i].tokens[d];
    backend::ForwardItem item;
    // A token still being sampled by the step in flight (the only position token_at answers
    // kPendingToken for): the backend takes it on the device.
    if (r.pending_tokens > 0) {
      DSI_CHECK(
          c.num_tokens == 1 && k == 0 && c.first_pos + 1 == r.num_tokens() && !in_flight_.empty(),
          "request %lld: a pending token outside a plain decode of the step after its "
          "pick's (chunk of %lld at %lld, %d drafts, %lld tokens)",
          static_cast<long long>(r.id),
          static_cast<long long>(c.num_tokens),
          static_cast<long long>(c.first_pos),
          k,
          static_cast<long long>(r.num_tokens()));
      tokens[0] = 0;
      item.options.device_token = true;
    }
    item.state = &st;
    item.tokens = tokens;
    item.options.want_logits = c.samples;
    item.options.last_logits_only = k == 0;
    item.options.prefill_end = r.num_tokens();
    // Drafts still on the device: the backend takes them there (the values copied above are
    // placeholders) and writes drafts_[i] before forward_batch returns.
    if (k > 0 && chunk_deferred_[i])
      item.options.device_drafts = k;
    if (drafter_ && !r.spec_disabled)
      drafter_->prepare(item.options, k);
    outs_[i].sampled = false;
    if (k == 0 && prepare_backend_sample(c, i))
      item.options.sample = &sample_reqs_[i];
    else if (k > 0 && prepare_backend_verify(c, i, k))
      item.options.sample_rows = verify_reqs_[i];
    item.out = &outs_[i];
    defer = defer && can_defer(i, item);
    items_.push_back(item);
    item_chunk_.push_back(i);
  }
  for (backend::ForwardItem& it : items_) it.options.may_defer = defer;
  if (items_.empty() && !model_->lockstep()) {
    // (Drafts left on the device are completed by the forward that verifies them: the drafter
    // resizes their storage at its next call.)
    DSI_CHECK(std::find(chunk_deferred_.begin(), chunk_deferred_.end(), 1) == chunk_deferred_.end(),
              "drafts left on the device without their verification");
    drain_in_flight();
    return;
  }
  const double t_forward = now_s();
  stats_.phases.prepare += t_forward - t_prepare;
  const Status s = model_->forward_batch(items_);
  const double t_finish = now_s();
  stats_.phases.forward += t_finish - t_forward;
  if (!s.ok() && !model_->health().ok()) {
    fail_all(model_->health());
    return;
  }
  // The step before this one, if it left its picks on the device: the call wrote them.
  if (!in_flight_.empty())
    resolve_in_flight();
  bool deferred = false;
  for (size_t k = 0; k < items_.size(); ++k) {
    const size_t i = item_chunk_[k];
    Request& r = *plan_.chunks[i].request;
    // (The backend writes a deferred pick into outs_[i] later, whether or not it is still wanted:
    // the outputs stay where they are, below.)
    deferred |= outs_[i].deferred;
    if (r.done())
      continue;  // (ended by a pick of the step before: this chunk ran for nothing)
    if (outs_[i].deferred) {
      // Launched, its pick still on the device: the request goes on as if it had its token
      // (the next step takes it on the device) unless that token is its last by length. (A
      // prompt's last chunk: the request becomes a decoding one when its first token arrives.)
      const ScheduledChunk& c = plan_.chunks[i];
      const int64_t plen = static_cast<int64_t>(r.spec.prompt.size());
      stats_.prompt_tokens +=
          std::min(c.first_pos + c.num_tokens, plen) - std::min(c.first_pos, plen);
      r.num_computed += c.num_tokens;
      r.awaiting_pick = true;
      const int64_t out = static_cast<int64_t>(r.output.size()) + 1;
      r.pending_tokens = out < r.spec.max_tokens && r.num_tokens() + 1 < max_model_len_ ? 1 : 0;
      in_flight_.push_back({r.id, i});
      continue;
    }
    if (drafter_ && items_[k].status.ok() && plan_.chunks[i].samples &&
        !plan_.chunks[i].request->output.empty() && !outs_[i].sampled) {
      finish_verify(i, outs_[i]);
    } else {
      finish_chunk(plan_.chunks[i], items_[k].status, outs_[i]);
    }
  }
  if (deferred) {
    // The backend writes the picks there at its next call: keep them still (and complete them
    // when no request waits for them any more, so that no later call writes into outs_).
    std::swap(outs_, in_flight_outs_);
    ++stats_.async_steps;
    if (in_flight_.empty()) {
      const Status c = model_->complete_deferred_samples();
      if (!c.ok())
        fail_all(model_->health().ok() ? c : model_->health());
    }
  }
  stats_.phases.finish += now_s() - t_finish;
  // (Not a step that ran a shape for the first times: its eager launches and graph capture
  // are one-time costs, and counted they taught auto that a depth costs far more than it does.)
  const int64_t sb = step_b_ > 0 ? step_b_ : mixed_b_;
  if (timed && sb > 0) {
    const double took = now_s() - t_step;
    const int64_t warmed = model_->shape_warmups() - warmups;
    if (trace_spec_) {
      std::fprintf(stderr,
                   "[spec-trace] step %lld: %lld at depth %d%s took %.3f ms, emitted %lld, %s\n",
                   static_cast<long long>(stats_.steps),
                   static_cast<long long>(sb),
                   step_depth_,
                   step_b_ > 0 ? "" : " beside prefill chunks",
                   took * 1e3,
                   static_cast<long long>(stats_.spec.spec_tokens - spec_tokens),
                   warmed > 0 ? str_format("not recorded (%lld shape warm-ups)",
                                           static_cast<long long>(warmed))
                                    .c_str()
                   : cost_ ? str_format("predicted %.3f",
                                        (cost_->step_s(sb, step_depth_) +
                                         (step_b_ > 0 ? 0.0 : cost_->mixed_extra(sb))) *
                                            1e3)
                                 .c_str()
                           : "fixed");
    }
    // (A step the clock saw take no time teaches nothing: a stopped clock keeps auto's model.)
    if (cost_ && warmed == 0 && took > 0) {
      if (step_b_ > 0)
        cost_->record(step_b_, step_depth_, took);
      else
        cost_->record_mixed(mixed_b_, step_depth_, took);
    }
    // What the step's verifications emitted against what auto's choice counted on.
    const int64_t verified = stats_.spec.spec_steps - spec_steps;
    if (cost_ && step_depth_ >= 1 && verified > 0 &&
        static_cast<size_t>(step_depth_) < expected_.size()) {
      cost_->record_tokens(sb,
                           step_depth_,
                           expected_[static_cast<size_t>(step_depth_)],
                           static_cast<double>(stats_.spec.spec_tokens - spec_tokens) /
                               static_cast<double>(verified),
                           verified);
    }
  }
  // At least AcceptancePredictor::kMinDraftsPerStep first drafts' fading per verifying step.
  if (predictor_ && stats_.spec.spec_steps > spec_steps)
    predictor_->verified_step(stats_.spec.spec_steps - spec_steps);
}

void Engine::refresh_rates() {
  rates_.resize(static_cast<size_t>(spec_.k));
  for (int32_t d = 0; d < spec_.k; ++d)
    rates_[static_cast<size_t>(d)] = predictor_->position_rate(d);
}

bool Engine::auto_says_off(int64_t b) {
  refresh_rates();
  return cost_->choose(b, rates_) < 0;
}

int32_t Engine::auto_depth(int64_t b, bool mixed) {
  refresh_rates();
  // E(depth) from these rates, for record_tokens once the step has run.
  expected_.assign(static_cast<size_t>(spec_.k) + 1, 1.0);
  double reach = 1.0;
  for (int32_t d = 1; d <= spec_.k; ++d) {
    reach *= rates_[static_cast<size_t>(d - 1)];
    expected_[static_cast<size_t>(d)] = expected_[static_cast<size_t>(d - 1)] + reach;
  }
  // Where the rates still lean on their prior, what the step emits against them says how far
  // the prior is off, not what the depth gains (StepCost::gain): no record_tokens. (After auto
  // was off a while the rates drift back to the prior, 0.8; the 4-layer checkpoint's drafts,
  // accepted 0.75 of the time, then set depth 1's gain at batch 1 near 0.95, counted again on
  // top of the rates once they had come down, and auto stayed off where depth 1 gave 1.03x.)
  if (!predictor_->evidenced())
    expected_.clear();
  // A step with prefill chunks: once such steps' own time is measured, the depth that pays best
  // with it (StepCost::choose_mixed), else the decode steps' choice; their hold and cold-shape
  // counters are not advanced (the step is not one of theirs).
  if (mixed)
    return cost_->choose_mixed(b, rates_, cost_->choose(b, rates_));
  if (!model_->prefers_uniform_steps())
    return cost_->choose(b, rates_);
  // The steady form on a backend that replays graphs per shape (a new depth costs captures),
  // preferring depths whose shape the backend has prepared. Depth d verifies d + 1 tokens per
  // sequence.
  warm_.assign(static_cast<size_t>(spec_.k) + 1, 1);
  for (int32_t d = 1; d <= spec_.k; ++d)
    warm_[static_cast<size_t>(d)] = model_->fixed_shape_warm(b, d + 1) ? 1 : 0;
  return cost_->choose_warm(b, rates_, warm_);
}

// A chunk that decodes one token of a running request (the pending token: its last output).
bool Engine::is_decode_chunk(const ScheduledChunk& c) {
  return c.samples && c.num_tokens == 1 && !c.request->output.empty() && !c.request->done();
}

void Engine::classify_step() {
  // Steps of decode chunks only (a prefill's time says nothing of a decode step's), all of them
  // speculating at this step's depth or none of them speculating (then depth -1). Steps with
  // prefill chunks beside decode chunks that all verified the step's depth (>= 1) are mixed
  // steps (StepCost::record_mixed).
  step_b_ = 0;
  mixed_b_ = 0;
  int64_t b = 0, off = 0, other = 0, at_depth = 0;
  for (size_t i = 0; i < plan_.chunks.size(); ++i) {
    const ScheduledChunk& c = plan_.chunks[i];
    if (!is_decode_chunk(c)) {
      ++other;
      continue;
    }
    ++b;
    off += c.request->spec_disabled ? 1 : 0;
    at_depth += i < chunk_k_.size() && chunk_k_[i] == step_depth_ ? 1 : 0;
  }
  if (other > 0) {
    if (b > 0 && step_depth_ >= 1 && at_depth == b)
      mixed_b_ = b;
    return;
  }
  if (b == 0 || (off != 0 && off != b))
    return;
  step_b_ = b;
  step_depth_ = off == b ? -1 : std::max(step_depth_, 0);
}

void Engine::resume_drafting() {
  int64_t decodes = 0;
  bool any_off = false;
  for (const ScheduledChunk& c : plan_.chunks) {
    if (!is_decode_chunk(c))
      continue;
    ++decodes;
    any_off |= c.request->spec_disabled;
  }
  if (!any_off)
    return;
  // The test a new request passes at its first chunk, at the batch this step decodes.
  const bool pays = !auto_says_off(decodes);
  int32_t most = 0;
  for (const ScheduledChunk& c : plan_.chunks) {
    Request& r = *c.request;
    if (!is_decode_chunk(c) || !r.spec_disabled)
      continue;
    r.spec_resume_steps = pays ? r.spec_resume_steps + 1 : 0;
    most = std::max(most, r.spec_resume_steps);
  }
  // On a backend that prefers uniform steps the step's requests resume together, once one of them
  // counted enough steps: they joined the batch in different steps (a wave's prefill runs over
  // several), so their counts differ, and one resuming alone was stopped again by plan_drafts'
  // one-kind-of-step rule while the others' counts went on. They took turns for good: auto on the
  // 4-layer checkpoint at batch 64 stayed off after the first round (0.93x fixed:1, thirty-first
  // session; AutoSim.Flash4InOneEngine).
  const bool together = model_->prefers_uniform_steps() && most >= kResumeAfterSteps;
  for (const ScheduledChunk& c : plan_.chunks) {
    Request& r = *c.request;
    if (!is_decode_chunk(c) || !r.spec_disabled)
      continue;
    // The MTP block restarts from the kept final streams; the next drafting call catches it up.
    if ((together || r.spec_resume_steps >= kResumeAfterSteps) &&
        memory_->state(r.id).resume_mtp()) {
      r.spec_disabled = false;
      r.spec_idle_steps = 0;
      r.spec_resume_steps = 0;
      ++stats_.spec.resumed;
    }
  }
}

bool Engine::plan_drafts() {
  // Decode chunks of requests that speculate: the pending token is the last output token.
  const size_t n = plan_.chunks.size();
  draft_reqs_.clear();
  draft_chunk_.clear();
  accept_.clear();
  std::vector<int32_t> caps;
  if (spec_.mode == spec::Mode::kAuto && cost_ && drafter_ && drafter_->sequential() &&
      model_->can_resume_drafting())
    resume_drafting();
  if (spec_.mode == spec::Mode::kAuto && model_->prefers_uniform_steps()) {
    // One kind of decode step on a backend that prefers uniform steps: once a running request
    // stopped speculating, the others stop too (a plain decode beside verifications, or beside
    // the drafter's forward work, is a mixed step, run without the backend's graphs: auto at
    // batch 64 once ran 48 plain decodes beside 16 verifications at 0.83x off).
    bool any_off = false;
    for (const ScheduledChunk& c : plan_.chunks)
      any_off |= is_decode_chunk(c) && c.request->spec_disabled;
    if (any_off) {
      for (const ScheduledChunk& c : plan_.chunks) {
        if (is_decode_chunk(c))
          c.request->spec_disabled = true;
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ScheduledChunk& c = plan_.chunks[i];
    Request& r = *c.request;
    if (!is_decode_chunk(c) || r.spec_disabled)
      continue;
    // Drafts beyond max_tokens or the context limit could never be emitted. Beyond max_tokens
    // they are still made and verified on a backend that prefers uniform steps (finish_verify
    // stops emitting at max_tokens): every sequence of the step verifies as many, one shape.
    const int64_t out_left = model_->prefers_uniform_steps()
                                 ? std::numeric_limits<int64_t>::max()
                                 : r.spec.max_tokens - static_cast<int64_t>(r.output.size());
    const int64_t left = std::min(out_left, max_model_len_ - r.num_tokens()) - 1;
    const int32_t cap = static_cast<int32_t>(std::min<int64_t>(spec_.k, left));
    draft_chunk_.push_back(i);
    caps.push_back(std::max(cap, 0));
  }
  const bool automatic = spec_.mode == spec::Mode::kAuto;
  if (draft_chunk_.empty()) {
    // Requests decoded, none speculating: auto's evidence for that fades (unobserved_step).
    if (automatic && predictor_) {
      bool decodes = false;
      for (const ScheduledChunk& c : plan_.chunks) decodes |= is_decode_chunk(c);
      if (decodes)
        predictor_->unobserved_step();
    }
    return true;
  }
  const int64_t b = static_cast<int64_t>(draft_chunk_.size());
  // How many to draft: all allowed (fixed), or under auto what the acceptance observed so far
  // makes worth it (a block drafter then drafts its whole block or nothing: one pass proposes
  // them all, and the confidences choose how many to verify afterwards).
  std::vector<int32_t> want(caps);
  if (automatic) {
    // One depth for the step (before drafting every request's drafts have the same predicted
    // acceptance, the rate observed at each position): the one with the most expected tokens
    // per second of measured step time, -1 (no speculation: a plain decode, without the
    // drafter's forward work) included. A request stops speculating when that is -1 (after 16
    // such steps while the acceptance rates still lean on their prior); it resumes when
    // speculation pays again at its batch (resume_drafting, where the backend's MTP block can
    // restart from the kept final streams; elsewhere it decodes on without speculation), and
    // new requests decide again at their first chunk.
    bool mixed = false;
    for (const ScheduledChunk& c : plan_.chunks) mixed |= !is_decode_chunk(c);
    const int32_t depth = auto_depth(b, mixed);
    step_depth_ = depth;
    for (size_t j = 0; j < draft_chunk_.size(); ++j) {
      want[j] = depth < 1 ? 0 : drafter_->sequential() ? std::min(depth, caps[j]) : caps[j];
      Request& r = *plan_.chunks[draft_chunk_[j]].request;
      // Depth 0 (StepCost::choose measuring a one-token step while off is unmeasured) keeps
      // the request speculating: the drafter's forward work runs, only no drafts this step.
      if (depth >= 1) {
        r.spec_idle_steps = 0;
      } else if (depth < 0 && ++r.spec_idle_steps >= (predictor_->settled() ? 1 : 16)) {
        r.spec_disabled = true;
      }
    }
  }
  for (size_t j = 0; j < draft_chunk_.size(); ++j) {
    const size_t i = draft_chunk_[j];
    Request& r = *plan_.chunks[i].request;
    if (r.spec_disabled)
      continue;
    // The positions the drafter's state is behind (an MTP block whose verifications skipped it):
    // caught up in this call, also without drafts (the forward then runs the drafter's work).
    state::SequenceState& st = memory_->state(r.id);
    std::vector<int32_t>& up = catch_up_[i];
    up.clear();
    for (int64_t p = drafter_->catch_up_from(st) + 1; p < st.num_tokens(); ++p)
      up.push_back(r.token_at(p));
    if (want[j] < 1 && up.empty())
      continue;
    spec::DraftRequest q;
    q.state = &st;
    q.next_token = r.output.back();
    q.max_drafts = std::max(want[j], 0);
    q.catch_up = up;
    q.out = &drafts_[i];
    // Drafts verified without being read first may stay on the device until the verification
    // (DraftRequest::may_defer): not where the device sampler's penalties count them
    // (prepare_backend_verify's extra_output), nor for a block drafter, whose confidences choose
    // the verified lengths right after drafting.
    q.may_defer = drafter_->sequential() && !sampling::uses_penalties(r.spec.sampling);
    draft_reqs_.push_back(q);
  }
  if (!draft_reqs_.empty()) {
    const Status s = drafter_->draft(draft_reqs_);
    if (!s.ok()) {
      fail_all(model_->health().ok() ? s : model_->health());
      return false;
    }
  }
  // How many of the drafts to verify: all (fixed; auto with a sequential drafter), or under auto
  // with a block drafter what their confidences make worth it now that drafting is paid for.
  size_t q = 0;
  for (size_t j = 0; j < draft_chunk_.size(); ++j) {
    const size_t i = draft_chunk_[j];
    int32_t k = 0;
    if (q < draft_reqs_.size() && draft_reqs_[q].out == &drafts_[i]) {
      const spec::DraftRequest& dr = draft_reqs_[q++];
      if (dr.status.ok()) {
        k = static_cast<int32_t>(drafts_[i].tokens.size());
        chunk_deferred_[i] = dr.deferred ? 1 : 0;
      } else {  // its drafter state cannot follow it: it decodes on without speculation
        plan_.chunks[i].request->spec_disabled = true;
      }
      stats_.spec.drafted += k;
    }
    chunk_k_[i] = k;
  }
  // (A sequential drafter's drafts are all verified: auto chose their number knowing what the
  // verification costs, and the step times it learns from are those of that depth; cutting the
  // verification short after paying for the drafts made auto measure cheap steps that emitted
  // fewer tokens than it counted on.)
  if (automatic && !drafter_->sequential()) {
    accept_.assign(draft_chunk_.size(), {});
    for (size_t j = 0; j < draft_chunk_.size(); ++j) {
      const size_t i = draft_chunk_[j];
      for (int32_t d = 0; d < chunk_k_[i]; ++d)
        accept_[j].push_back(predictor_->calibrated(d, drafts_[i].confidence[d]));
    }
    const spec::Choice ch = spec::choose_verify_lengths(step_times_, accept_, false);
    int64_t sum = 0;
    for (size_t j = 0; j < draft_chunk_.size(); ++j) {
      chunk_k_[draft_chunk_[j]] = ch.k[j];
      sum += ch.k[j];
    }
    // The step's depth for its measured time: the mean number verified.
    if (step_depth_ >= 1)
      step_depth_ = static_cast<int32_t>((sum + b / 2) / b);
  }
  // Room in the state for the drafts (the scheduler reserved the pending token's); without it
  // the request verifies fewer.
  for (size_t j = 0; j < draft_chunk_.size(); ++j) {
    const size_t i = draft_chunk_[j];
    Request& r = *plan_.chunks[i].request;
    state::SequenceState& st = memory_->state(r.id);
    while (chunk_k_[i] > 0 && !st.reserve(1 + chunk_k_[i])) --chunk_k_[i];
    ++stats_.spec.verify_len[static_cast<size_t>(chunk_k_[i])];
  }
  if (trace_spec_) {
    std::string line = str_format("[spec-trace] step %lld: %lld drafting, depth %d |",
                                  static_cast<long long>(stats_.steps),
                                  static_cast<long long>(b),
                                  step_depth_);
    for (size_t j = 0; j < draft_chunk_.size(); ++j) {
      const Request& r = *plan_.chunks[draft_chunk_[j]].request;
      line += str_format(" %lld:%d%s",
                         static_cast<long long>(r.id),
                         chunk_k_[draft_chunk_[j]],
                         r.spec_disabled ? "x" : "");
    }
    // Auto: the acceptance it predicts per draft position and the emitted tokens per second it
    // predicts for each depth (tools/bench/spec_trace.py sets them beside the measured ones).
    if (cost_ && !rates_.empty()) {
      line += " | a";
      for (double a : rates_) line += str_format(" %.3f", a);
      line += " | rate";
      for (int32_t d = -1; d <= cost_->max_k(); ++d) {
        if (d != 0)
          line += str_format(" %d:%.0f", d, cost_->rate(b, d, rates_));
      }
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  return true;
}

void Engine::finish_verify(size_t i, backend::ForwardOutputs& out) {
  const ScheduledChunk& c = plan_.chunks[i];
  Request& r = *c.request;
  const int32_t k = chunk_k_[i];
  const spec::Draft& d = drafts_[i];
  const int64_t vocab = model_->config().vocab_size;
  const bool in_backend = !out.row_samples.empty();  // prepare_backend_verify
  DSI_CHECK(in_backend ? static_cast<int32_t>(out.row_samples.size()) == k + 1
                       : static_cast<int64_t>(out.logits.size()) == (k + 1) * vocab,
            "verification of %d drafts got %zu logits and %zu picks",
            k,
            out.logits.size(),
            out.row_samples.size());
  r.num_computed += 1 + k;
  // Each position's token is sampled from the target's logits exactly as without speculation
  // (same penalties, mask, seed and absolute-position counter); a draft is accepted when it is
  // that token. This is the rejection rule for a draft that proposes one token with certainty
  // (accept with probability p(d); on rejection sample from p with d removed), so every emitted
  // token has the target's distribution, and the output is the same token for token as without
  // speculation, whatever the number of drafts verified.
  int32_t accepted = 0;
  int32_t emitted = 0;
  for (int32_t p = 0; p <= k; ++p) {
    // In the backend, position p was sampled as if drafts 0..p-1 were accepted, which they are
    // when the loop gets here: the pick sample_for would make now.
    sampling::SampleResult sr =
        in_backend
            ? out.row_samples[static_cast<size_t>(p)]
            : sample_for(
                  r, std::span<float>(out.logits.data() + p * vocab, static_cast<size_t>(vocab)));
    if (p < k && config_.forced_acceptance > 0 &&
        std::generate_canonical<double, 53>(forced_rng_) < config_.forced_acceptance)
      sr.token = d.tokens[p];  // benchmarks only (EngineConfig::forced_acceptance)
    const bool match = p < k && sr.token == d.tokens[p];
    if (p < k) {
      predictor_->record(p, d.confidence[p], match);
      ++stats_.spec.verified[static_cast<size_t>(p)];
      stats_.spec.accepted[static_cast<size_t>(p)] += match ? 1 : 0;
    }
    accept_token(r, sr);
    ++emitted;
    if (r.done() || !match)
      break;
    ++accepted;
  }
  if (k > 0) {
    ++stats_.spec.spec_steps;
    stats_.spec.spec_tokens += emitted;
  }
  if (r.done())
    return;  // its state is gone with it
  // The state holds the pending token and every draft; keep the accepted ones.
  const int64_t reject = k - accepted;
  if (reject > 0) {
    const Status s = memory_->state(r.id).rollback(reject);
    DSI_CHECK(s.ok(), "rollback: %s", s.message().c_str());
    r.num_computed -= reject;
  }
}

void Engine::fail_all(const Status& why) {
  failure_ = why;
  in_flight_.clear();
  for (auto& [id, r] : requests_) {
    if (!r->done()) {
      r->error = why.message();
      finish(*r, FinishReason::kError);
    }
  }
}

void Engine::finish_chunk(const ScheduledChunk& c, const Status& s, backend::ForwardOutputs& out) {
  Request& r = *c.request;
  if (!s.ok()) {
    r.error = s.message();
    finish(r, FinishReason::kError);
    return;
  }
  r.num_computed += c.num_tokens;
  if (store_ && r.num_computed == r.snapshot_at) {
    const state::SequenceState& st = memory_->state(r.id);
    if (cache_layout_.save_point == 0 || stores_at_once(r, r.num_computed)) {
      cache_store(r, st);
    } else if (r.spec.use_cache) {
      // A later save point may supersede it before the request ends: hold the image.
      auto image = state::capture_state(
          st,
          [this](std::span<const int32_t> pages, float* dst) {
            return model_->read_state_pages(*arena_, pages, dst);
          },
          cache_layout_.image);
      if (image.ok())
        held_units_[r.id] = {r.num_computed, std::move(image).value()};
      else
        ++stats_.cache_store_failures;
    }
    r.snapshot_at = next_snapshot(r);
  }
  const int64_t plen = static_cast<int64_t>(r.spec.prompt.size());
  stats_.prompt_tokens += std::min(c.first_pos + c.num_tokens, plen) - std::min(c.first_pos, plen);
  if (!c.samples) {
    r.state = RequestState::kPrefilling;
    return;
  }
  // Sample the next token from the last position's logits. The draw is keyed by (seed, the
  // token's absolute position in the sequence): the same whatever else is in the batch, after a
  // preemption's recomputation, and for a continuation that resubmits earlier output as prompt.
  if (out.sampled) {  // sampled in the backend (prepare_backend_sample)
    if (r.spec.token_mask)
      r.spec.token_mask->accept(out.sample.token);
    accept_token(r, out.sample);
    return;
  }
  const auto& mc = model_->config();
  const std::span<float> logits(out.logits.data(), static_cast<size_t>(mc.vocab_size));
  if (r.output.empty())
    start_forks(r, logits);  // before sample() uses the logits as scratch
  accept_token(r, sample_for(r, logits));
}

bool Engine::can_defer(size_t i, const backend::ForwardItem& it) const {
  // Nothing of the chunk comes back to the host before the next step is planned: a prompt chunk
  // before the prompt's end (no logits), or a chunk whose token is sampled in the backend and
  // whose next step needs nothing of that token but the token itself: no penalties counting it
  // (the device sampler takes them from the host), no token mask (the grammar moves with it),
  // no drafter reading it. Neither where a prefix-cache unit is stored (finish_chunk's snapshot).
  const ScheduledChunk& c = plan_.chunks[i];
  const Request& r = *c.request;
  if (store_ && c.first_pos + c.num_tokens == r.snapshot_at)
    return false;
  if (it.options.run_mtp && it.options.want_mtp_logits)
    return false;
  if (!c.samples)
    return !it.options.want_logits;
  return it.options.sample != nullptr && it.options.sample->allowed.empty() &&
         it.options.sample_rows.empty() && !it.options.run_mtp && it.options.device_drafts == 0 &&
         chunk_k_[i] == 0 && !r.spec.token_mask && !sampling::uses_penalties(r.spec.sampling) &&
         (r.state == RequestState::kDecoding || r.state == RequestState::kPrefilling);
}

void Engine::resolve_in_flight() {
  // (Through a second list, its storage kept from step to step: the step's own deferred picks
  // go into in_flight_ afterwards.)
  resolving_.swap(in_flight_);
  for (const auto& [id, slot] : resolving_) {
    auto it = requests_.find(id);
    if (it == requests_.end() || !it->second->awaiting_pick)
      continue;  // ended (aborted) since its step was launched
    Request& r = *it->second;
    const backend::ForwardOutputs& o = in_flight_outs_[slot];
    DSI_CHECK(!o.deferred && o.sampled,
              "request %lld: the backend did not deliver a deferred pick",
              static_cast<long long>(id));
    r.awaiting_pick = false;
    r.pending_tokens = 0;
    // A request preempted meanwhile stays waiting (its recomputation starts from these tokens).
    const bool waiting = r.state == RequestState::kWaiting;
    accept_token(r, o.sample);
    if (waiting && !r.done())
      r.state = RequestState::kWaiting;
  }
  resolving_.clear();
}

void Engine::drain_in_flight() {
  if (in_flight_.empty())
    return;
  const Status s = model_->complete_deferred_samples();
  if (!s.ok()) {
    fail_all(model_->health().ok() ? s : model_->health());
    return;
  }
  resolve_in_flight();
}

bool Engine::prepare_backend_sample(const ScheduledChunk& c, size_t slot) {
  Request& r = *c.request;
  // The host needs the logits for top_logprobs, for verifying drafts (finish_verify: a chunk
  // with drafts) and for the first token of the choices that share this request's prompt
  // (start_forks). A decode chunk without drafts samples in the backend whether or not the
  // engine speculates: auto's off steps (and depth-0 steps) cost what `--speculative off`'s do.
  if (!config_.backend_sampling || !model_->can_sample() || !c.samples ||
      (drafter_ && chunk_k_[slot] != 0) || r.spec.sampling.top_logprobs > 0 ||
      (r.output.empty() && pending_forks_.count(r.id) > 0)) {
    return false;
  }
  backend::SampleRequest& q = sample_reqs_[slot];
  q = backend::SampleRequest{};
  q.config = &r.spec.sampling;
  q.penalties = &r.penalties;
  q.step = static_cast<uint64_t>(r.num_tokens());  // as sample_for: the token's position
  if (r.spec.token_mask) {
    // The grammar's state only moves when a token is accepted, so the mask can be taken before
    // the forward. A mask that allows no token is ignored, as sampling::sample does.
    const int64_t vocab = model_->config().vocab_size;
    std::vector<uint32_t>& bits = sample_masks_[slot];
    bits.assign(static_cast<size_t>((vocab + 31) / 32), 0u);
    if (r.spec.token_mask->fill(bits)) {
      bool any = false;
      for (size_t w = 0; w < bits.size() && !any; ++w) {
        uint32_t b = bits[w];
        if (static_cast<int64_t>(w * 32 + 32) > vocab)
          b &= (1u << (vocab % 32)) - 1u;
        any = b != 0;
      }
      if (any)
        q.allowed = bits;
    }
  }
  return true;
}

bool Engine::prepare_backend_verify(const ScheduledChunk& c, size_t slot, int32_t k) {
  Request& r = *c.request;
  // Host sampling where the next position's mask depends on the grammar accepting this one's
  // token and where top_logprobs need the logits. (Forced acceptance, benchmarks only, emits the
  // draft in place of a pick: the next position's row was sampled assuming exactly that.)
  if (!config_.backend_sampling || !model_->can_sample() || !c.samples || k < 1 ||
      r.spec.token_mask || r.spec.sampling.top_logprobs > 0 || r.output.empty())
    return false;
  const spec::Draft& d = drafts_[slot];
  std::vector<backend::SampleRequest>& q = verify_reqs_[slot];
  q.assign(static_cast<size_t>(k + 1), backend::SampleRequest{});
  for (int32_t p = 0; p <= k; ++p) {
    backend::SampleRequest& e = q[static_cast<size_t>(p)];
    e.config = &r.spec.sampling;
    e.penalties = &r.penalties;
    e.extra_output = std::span<const int32_t>(d.tokens.data(), static_cast<size_t>(p));
    e.step = static_cast<uint64_t>(r.num_tokens() + p);  // as sample_for after p accepted tokens
  }
  return true;
}

sampling::SampleResult Engine::sample_for(Request& r, std::span<float> logits) {
  // Structured outputs: the request's mask for this token (its grammar's allowed tokens).
  std::span<const uint32_t> allowed;
  if (r.spec.token_mask) {
    mask_bits_.assign((logits.size() + 31) / 32, 0u);
    if (r.spec.token_mask->fill(mask_bits_))
      allowed = mask_bits_;
  }
  const sampling::SampleResult sr = sampling::sample(logits,
                                                     r.spec.sampling,
                                                     r.penalties,
                                                     static_cast<uint64_t>(r.num_tokens()),
                                                     sampler_scratch_,
                                                     allowed);
  if (r.spec.token_mask)
    r.spec.token_mask->accept(sr.token);
  return sr;
}

void Engine::accept_token(Request& r, const sampling::SampleResult& sr) {
  const auto& mc = model_->config();
  r.output.push_back(sr.token);
  r.output_logprobs.push_back(sr.logprob);
  r.penalties.add_output(sr.token);
  r.state = RequestState::kDecoding;
  ++stats_.generated_tokens;
  if (r.timings.first_token_s == 0)
    r.timings.first_token_s = now_s();

  FinishReason why = FinishReason::kNone;
  const bool is_stop_id =
      std::find(r.spec.stop_token_ids.begin(), r.spec.stop_token_ids.end(), sr.token) !=
      r.spec.stop_token_ids.end();
  if ((!r.spec.ignore_eos && sr.token == mc.eos_token_id) || is_stop_id) {
    why = FinishReason::kStop;
  } else if (r.spec.stop_checker && r.spec.stop_checker->on_token(sr.token)) {
    why = FinishReason::kStop;
  } else if (static_cast<int64_t>(r.output.size()) >= r.spec.max_tokens ||
             r.num_tokens() >= max_model_len_) {
    why = FinishReason::kLength;
  }
  if (why != FinishReason::kNone)
    finish(r, why);
  auto cb = callbacks_.find(r.id);
  if (cb != callbacks_.end()) {
    TokenEvent ev;
    ev.id = r.id;
    ev.token = sr.token;
    ev.logprob = sr.logprob;
    ev.top_logprobs = sr.top;
    ev.finished = why != FinishReason::kNone;
    ev.finish_reason = why;
    cb->second(ev);
  }
}

bool Engine::step() {
  poll_captures();
  if (!failure_.ok())
    return false;
  if (scheduler_->idle()) {
    drain_in_flight();  // (picks of requests aborted since)
    // Lockstep (expert parallelism over several processes): an idle rank still runs the pass
    // that serves the other ranks' tokens; the driver decides when every rank is done.
    if (model_->lockstep()) {
      items_.clear();
      const Status s = model_->forward_batch(items_);
      if (!s.ok())
        fail_all(model_->health().ok() ? s : model_->health());
      ++stats_.steps;
    }
    return !captures_.empty();  // polled again next step
  }
  const double t_plan = now_s();
  scheduler_->plan(plan_);
  stats_.phases.schedule += now_s() - t_plan;
  stats_.preemptions += static_cast<int64_t>(plan_.preempted.size());
  if (!pending_fault_.ok()) {  // a state admitted without its contents (cache_restore)
    fail_all(model_->health().ok() ? pending_fault_ : model_->health());
    return false;
  }
  if (plan_.chunks.empty() && !in_flight_.empty()) {
    // Every running request awaits its last pick (or was preempted): take the picks first.
    drain_in_flight();
    return failure_.ok() && (!scheduler_->idle() || !captures_.empty());
  }
  if (plan_.chunks.empty()) {
    // Nothing fits even with every sequence preempted: fail the oldest waiting request instead
    // of spinning (submit() rejects what can never fit, so this is a last resort).
    for (auto& [id, r] : requests_) {
      if (r->state == RequestState::kWaiting) {
        r->error = "the request does not fit in the state memory";
        finish(*r, FinishReason::kError);
        break;
      }
    }
  }
  run_chunks();
  ++stats_.steps;
  return !scheduler_->idle() || !captures_.empty();
}

void Engine::run_until_done() {
  while (true) {
    const Result<bool> more = step_all_ranks();
    if (!more.ok() || !*more)
      return;
    // Only background captures left (their page copies run on the device): wait a little
    // before polling them again instead of spinning a core. Lockstep ranks never wait here (an
    // idle rank still serves the others' passes, and step_all_ranks ends when no rank has work).
    if (!model_->lockstep() && scheduler_->idle() && !captures_.empty())
      std::this_thread::sleep_for(std::chrono::microseconds(150));
  }
}

Result<bool> Engine::step_all_ranks() {
  if (!failure_.ok())
    return false;
  if (!model_->lockstep())
    return step();
  // Every rank calls this the same number of times: agree on whether any rank has work, then
  // step (an idle rank runs an empty pass).
  auto total = model_->all_ranks_sum(scheduler_->idle() ? 0 : 1);
  if (!total.ok()) {
    fail_all(total.status());
    return total.status();
  }
  if (*total == 0)
    return false;
  step();
  return failure_.ok();
}

void Engine::cache_lookup(Request& r) {
  if (!store_ || !r.spec.use_cache)
    return;
  const int64_t plen = static_cast<int64_t>(r.spec.prompt.size());
  // At least one prompt token is computed (its logits); with bounded replay the last
  // replay_rows (K) of them, so that every row the early exit runs through the consumer half is
  // recomputed (units exist at save points only, so the hit is the last one <= N - K).
  const int64_t max_len =
      cache_layout_.save_point > 0 ? plen - cache_layout_.replay_rows : plen - 1;
  if (max_len >= 1) {
    const auto anchors = prefix_keys_->anchors(r.spec.cache_tenant, r.spec.prompt, max_len);
    ++stats_.cache_lookups;
    auto m = store_->match(anchors, r.spec.prompt, prefix_keys_->block(), max_len);
    if (m) {
      r.cache_key = m->key;
      r.cache_len = m->num_tokens;
      if (m->tier != kvstore::Tier::kHost)
        store_->prefetch(m->key);  // SSD -> RAM while the request waits for admission
    }
  }
  r.snapshot_at = next_snapshot(r);
}

bool Engine::stores_at_once(const Request& r, int64_t n) const {
  const int64_t sp = cache_layout_.save_point;
  const int64_t plen = static_cast<int64_t>(r.spec.prompt.size());
  const int64_t interval = config_.prefix_cache.interval;
  const int64_t repeat = (plen - cache_layout_.replay_rows) / sp * sp;
  return n <= plen && ((interval > 0 && n % interval == 0) || n == repeat);
}

int64_t Engine::next_snapshot(const Request& r) const {
  const int64_t sp = cache_layout_.save_point;
  if (sp > 0) {
    // Bounded replay: units only at save points. Inside the prompt the prefill pauses at the
    // interval points, at the repeat point (the last save point <= N - K: the same prompt again
    // restores there) and at the prompt's last save point; after the prompt at every save point
    // a decode step reaches (the last one is stored when the request ends, for the next turn).
    const int64_t plen = static_cast<int64_t>(r.spec.prompt.size());
    const int64_t last_in_prompt = plen / sp * sp;
    int64_t next = (std::max(r.num_computed, r.cache_len) / sp + 1) * sp;
    while (next < plen && next != last_in_prompt && !stores_at_once(r, next)) next += sp;
    while (next < config_.prefix_cache.min_tokens) next += sp;
    return next;
  }
  // Units every `interval` tokens inside the prompt (a shared system prompt or document then
  // hits whatever follows it), and at its first P-1 tokens; none at or below what was restored.
  const int64_t last = static_cast<int64_t>(r.spec.prompt.size()) - 1;
  const int64_t from = std::max(r.num_computed, r.cache_len);
  const int64_t interval = config_.prefix_cache.interval;
  int64_t next = last;
  if (interval > 0) {
    const int64_t k = (from / interval + 1) * interval;
    if (k < last)
      next = k;
  }
  if (next <= from || next < config_.prefix_cache.min_tokens)
    return -1;
  return next;
}

void Engine::cache_restore(Request& r, state::SequenceState& st) {
  r.cached_tokens = 0;
  if (r.cache_len == 0 || !store_)
    return;
  auto hit = [&] {
    r.num_computed = r.cache_len;
    r.cached_tokens = r.cache_len;
    ++stats_.cache_hits;
    stats_.cached_prompt_tokens += r.cache_len;
    // The MTP block's state comes with the prefix (state images and device-tier copies carry
    // it), in step with it when the request that stored it speculated. One that did not (off,
    // or auto keeping it off) left the block behind by the whole prefix, more than a drafting
    // call catches up: this request then decodes without speculation.
    if (drafter_ && !r.spec_disabled && drafter_->catch_up_from(st) + 1 < st.num_tokens())
      r.spec_disabled = true;
  };
  const int64_t sp = cache_layout_.save_point;
  if (sp > 0 && (r.cache_len % sp != 0 || r.cache_len > static_cast<int64_t>(r.spec.prompt.size()) -
                                                            cache_layout_.replay_rows)) {
    ++stats_.cache_restore_failures;  // not a save point bounded replay can resume from
    return;
  }
  // A unit still in the device tier: a page copy inside the arena, no host image (and no store
  // hit counted). A miss there (no pages for the copy) falls back to the store's image.
  if (device_tier_) {
    const Status d = device_tier_->restore(r.cache_key, r.cache_len, st);
    if (d.ok()) {
      hit();
      return;
    }
    if (d.code() != StatusCode::kNotFound) {
      pending_fault_ = d;  // st holds pages without their contents: step() fails everything
      return;
    }
  }
  auto payload = store_->get(r.cache_key, config_.prefix_cache.promote_wait_ms);
  Status s = payload ? Status() : not_found("the cached unit is gone");
  if (s.ok()) {
    auto n = state::state_image_tokens(*payload);
    if (!n.ok() || *n != r.cache_len)
      s = data_loss("the cached unit has another length");
  }
  if (s.ok()) {
    s = state::restore_state(
        *payload,
        st,
        [this](std::span<const int32_t> pages, const float* src) {
          return model_->write_state_pages(*arena_, pages, src);
        },
        cache_layout_.image);
  }
  if (!s.ok()) {
    ++stats_.cache_restore_failures;  // a miss: the prompt is computed from the start
    return;
  }
  hit();
}

void Engine::cache_store(Request& r, const state::SequenceState& st) {
  const int64_t n = st.num_tokens();
  if (!r.spec.use_cache || n < config_.prefix_cache.min_tokens || n == r.cached_tokens)
    return;
  bool tier_tried = false;
  if (model_->async_state_reads() && begin_capture(r, st, &tier_tried))
    return;
  auto image = state::capture_state(
      st,
      [this](std::span<const int32_t> pages, float* dst) {
        return model_->read_state_pages(*arena_, pages, dst);
      },
      cache_layout_.image);
  if (!image.ok()) {
    ++stats_.cache_store_failures;
    return;
  }
  const std::optional<kvstore::Key128> key = cache_put(r, n, std::move(image).value());
  if (key && device_tier_ && !tier_tried)
    device_tier_->put(*key, st);  // best effort: running requests keep their pages first
}

bool Engine::begin_capture(Request& r, const state::SequenceState& st, bool* tier_tried) {
  const int64_t n = st.num_tokens();
  // capture_state's own checks, before anything is forked.
  if (!state::image_pages(st, cache_layout_.image).ok()) {
    ++stats_.cache_store_failures;
    return true;
  }
  std::optional<kvstore::EntryMeta> meta = unit_meta(r, n);
  if (!meta)
    return true;
  std::shared_ptr<const state::SequenceState> copy;
  if (device_tier_) {
    *tier_tried = true;
    if (device_tier_->put(meta->key, st))  // best effort, as in the synchronous path
      copy = device_tier_->share(meta->key, n);
  }
  if (!copy) {
    // No device tier, or no room in it: a fork that lives only until its pages are copied.
    std::shared_ptr<state::SequenceState> fork = memory_->make(kCaptureIdBase + next_capture_id_++);
    std::vector<std::pair<int32_t, int32_t>> pairs;
    if (!fork || !fork->ok() || !fork->fork_from(st, &pairs).ok() ||
        !model_->copy_state_pages(*arena_, pairs).ok())
      return false;  // running requests keep their pages: capture synchronously instead
    copy = std::move(fork);
  }
  auto c = std::make_unique<PendingCapture>();
  c->st = std::move(copy);
  auto plan = state::plan_image(*c->st, cache_layout_.image);
  if (!plan.ok()) {
    ++stats_.cache_store_failures;
    return true;
  }
  c->copy = std::make_shared<PendingCapture::Copy>();
  c->copy->plan = std::move(plan).value();
  c->copy->host.resize(c->copy->plan.pages.size() * static_cast<size_t>(arena_->page_floats()));
  auto ticket = model_->begin_read_state_pages(*arena_, c->copy->plan.pages, c->copy->host.data());
  if (!ticket.ok())
    return false;  // e.g. the backend's staging is full: capture synchronously instead
  c->ticket = *ticket;
  c->meta = std::move(*meta);
  ++stats_.cache_async_captures;
  captures_.push_back(std::move(c));
  return true;
}

void Engine::poll_captures() {
  for (size_t i = 0; i < captures_.size();) {
    const Result<bool> done = model_->poll_state_read(captures_[i]->ticket);
    if (done.ok() && !*done) {
      ++i;
      continue;
    }
    end_capture(*captures_[i], done.status());
    captures_.erase(captures_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void Engine::end_capture(PendingCapture& c, const Status& copied) {
  if (!copied.ok()) {
    ++stats_.cache_store_failures;  // nothing stored: a later lookup misses
    return;
  }
  // The image is assembled and stored on the store's worker, from plain data only (the fork
  // stays here and goes when c does); the outcome is counted there.
  {
    std::lock_guard<std::mutex> l(assemblies_->mu);
    ++assemblies_->in_flight;
  }
  const kvstore::Key128 key = c.meta.key;
  store_->put_built(
      std::move(c.meta),
      [copy = std::move(c.copy), a = assemblies_, key]() -> Result<std::string> {
        auto image = state::assemble_image(copy->plan, copy->host);
        StoreObserver observer;
        {
          std::lock_guard<std::mutex> l(a->mu);
          observer = a->observer;
        }
        if (image.ok() && observer)
          observer(key, *image);
        return image;
      },
      [a = assemblies_](const Status& s) {
        std::lock_guard<std::mutex> l(a->mu);
        ++(s.ok() ? a->stored : a->failed);
        --a->in_flight;
        a->cv.notify_all();
      });
}

void Engine::drain_captures() {
  for (auto& c : captures_) end_capture(*c, model_->wait_state_read(c->ticket));
  captures_.clear();
  wait_stored_captures();
}

void Engine::wait_stored_captures() {
  std::unique_lock<std::mutex> l(assemblies_->mu);
  assemblies_->cv.wait(l, [&] { return assemblies_->in_flight == 0; });
}

void Engine::set_store_observer(StoreObserver observer) {
  std::lock_guard<std::mutex> l(assemblies_->mu);
  assemblies_->observer = std::move(observer);
}

std::optional<kvstore::EntryMeta> Engine::unit_meta(const Request& r, int64_t n) const {
  if (n < config_.prefix_cache.min_tokens || n == r.cached_tokens)
    return std::nullopt;
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = r.token_at(i);
  kvstore::EntryMeta meta;
  prefix_keys_->unit(r.spec.cache_tenant, tokens, n, &meta.key, &meta.anchor);
  const int64_t base = n / prefix_keys_->block() * prefix_keys_->block();
  meta.tail.assign(tokens.begin() + base, tokens.end());
  meta.num_tokens = n;
  meta.retention = r.spec.cache_retention.value_or(config_.prefix_cache.default_retention);
  return meta;
}

std::optional<kvstore::Key128> Engine::cache_put(Request& r, int64_t n, std::string image) {
  std::optional<kvstore::EntryMeta> meta = unit_meta(r, n);
  if (!meta)
    return std::nullopt;
  const kvstore::Key128 key = meta->key;
  StoreObserver observer;
  {
    std::lock_guard<std::mutex> l(assemblies_->mu);
    observer = assemblies_->observer;
  }
  if (observer)
    observer(key, image);
  store_->put(std::move(*meta), std::move(image));
  ++stats_.cache_units_stored;
  return key;
}

const Request* Engine::request(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

void Engine::release(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return;
  if (!it->second->done())
    abort(id, "released");
  callbacks_.erase(id);
  requests_.erase(it);
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.running = scheduler_->num_running();
  s.waiting = scheduler_->num_waiting();
  s.state_bytes_used = arena_->used_bytes();
  s.state_bytes_total = arena_->num_pages() * arena_->page_bytes();
  s.state_bytes_fixed = footprint_.fixed_bytes;
  s.state_bytes_per_token = footprint_.bytes_per_token;
  s.state_max_context = footprint_.max_context_tokens;
  if (device_tier_)
    s.device_tier = device_tier_->stats();
  std::lock_guard<std::mutex> l(assemblies_->mu);
  s.cache_units_stored += assemblies_->stored;
  s.cache_store_failures += assemblies_->failed;
  s.cache_captures_pending = static_cast<int64_t>(captures_.size()) + assemblies_->in_flight;
  return s;
}

Footprint state_footprint(const backend::Model& m,
                          int64_t page_bytes,
                          int64_t max_rollback,
                          int64_t budget_pages,
                          int64_t max_len) {
  Footprint f;
  f.page_bytes = page_bytes;
  auto pages = [&](int64_t n) { return sequence_pages(m, page_bytes, n, max_rollback); };
  f.fixed_bytes = pages(1) * page_bytes;
  constexpr int64_t kA = 65536, kB = 131072;
  f.bytes_per_token =
      static_cast<double>((pages(kB) - pages(kA)) * page_bytes) / static_cast<double>(kB - kA);
  if (pages(1) > budget_pages)
    return f;
  // The longest n <= max_len with pages(n) within the budget (pages(n) grows with n).
  int64_t lo = 1;
  int64_t hi = std::max<int64_t>(max_len, 1);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (pages(mid) <= budget_pages)
      lo = mid;
    else
      hi = mid - 1;
  }
  f.max_context_tokens = lo;
  return f;
}

void Engine::check_integrity() const {
  scheduler_->check_integrity();
  arena_->check_integrity();
  if (device_tier_)
    device_tier_->check_integrity();
  // A capture's pages stay its fork's, unchanged, until the copy is done: never freed, reused or
  // grown into by another sequence.
  for (const auto& c : captures_) {
    c->st->check_integrity();
    auto pages = state::image_pages(*c->st, cache_layout_.image);
    DSI_CHECK(pages.ok() && *pages == c->copy->plan.pages,
              "a pending capture's state changed during its copy");
    for (int32_t p : c->copy->plan.pages) {
      DSI_CHECK(arena_->owner(p).sequence == c->st->id(),
                "page %d of a pending capture is owned by sequence %lld",
                p,
                static_cast<long long>(arena_->owner(p).sequence));
    }
  }
  for (const auto& [id, st] : memory_->states()) {
    st->check_integrity();
    auto it = requests_.find(id);
    DSI_CHECK(
        it != requests_.end(), "state held for unknown request %lld", static_cast<long long>(id));
    DSI_CHECK(st->num_tokens() == it->second->num_computed,
              "request %lld: state has %lld tokens, request computed %lld",
              static_cast<long long>(id),
              static_cast<long long>(st->num_tokens()),
              static_cast<long long>(it->second->num_computed));
  }
}

}  // namespace dsinfer::engine
