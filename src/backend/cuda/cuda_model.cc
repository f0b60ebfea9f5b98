// CudaModel: creation, per-item validation, batch planning (spans, head rows, MTP inputs, final
// streams), the device pool per arena, the one-transfer upload of the plan, eager launches and
// CUDA graph capture/replay of fixed-shape decode steps, and the outputs.
#include "backend/cuda/cuda_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>

#include "backend/cuda/launch_helpers.h"
#include "backend/cuda/select_device.h"
#include "backend/cuda/state_pool.h"
#include "backend/forward_as_batch.h"
#include "base/check.h"
#include "base/strings.h"
#include "device/device_error.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged.h"
#include "kernels/cuda/sampling.h"

namespace dsinfer::gpu {

// Everything launch_all needs: the plan (array ids into the pack) and, after the launches, the
// device addresses of the outputs.
struct CudaModel::Launch {
  HostPack pack;
  uint8_t* dev = nullptr;  // the pack on the device
  PassPlan main;
  int64_t head_rows = 0;
  int32_t head_src = -1;    // [head_rows] refs into the final x (local)
  int32_t final_dest = -1;  // [N] final-stream rows kept for MTP (pool refs or none)
  bool has_mtp = false;
  bool mtp_head = false;  // some item wants the MTP pass's logits (a drafting engine does not)
  PassPlan mtp;
  int32_t mtp_src = -1;        // [Nm] refs: final streams (pool) or rows of x (local)
  int32_t mtp_broadcast = -1;  // [Nm * hc] local refs into the e_proj output
  float* logits = nullptr;
  float* mtp_logits = nullptr;
};

CudaModel::CudaModel(const model::ModelConfig& config,
                     model::Numerics numerics,
                     CudaModelOptions options)
    : config_(config),
      numerics_(numerics),
      options_(options),
      writes_(options.promote_staging_slots, options.promote_staging_slot_bytes) {
  const char* env = std::getenv("DSINFER_KV_RECORDS");
  const bool off = env != nullptr && std::string_view(env) == "0";
  if (numerics == model::Numerics::kDeepSeek && state::records_fit(config) && options.kv_records &&
      !off)
    row_format_ = state::RowFormat::kRecord;
}

CudaModel::~CudaModel() {
  (void)reads_.drain();  // no background read may outlive the pools
  (void)writes_.drain();
  clear_graphs();
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : {win_start_[0],
                        win_start_[1],
                        win_start_[2],
                        win_end_[0],
                        win_end_[1],
                        win_end_[2],
                        picks_ready_[0],
                        picks_ready_[1],
                        staging_free_}) {
    if (e)
      (void)cudaEventDestroy(e);
  }
  for (auto& [arena, pool] : pools_) {
    const cudaError_t err = cudaFree(pool.p);
    DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
  }
  for (void* p : {pack_dev_, draft_streams_[0], draft_streams_[1], draft_picks_}) {
    if (p) {
      const cudaError_t err = cudaFree(p);
      DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
    }
  }
}

namespace {
// An integer setting from the environment, when set: a value that is not a number in [lo, hi]
// leaves *value as it is, with a warning.
template <typename T>
void env_int(const char* name, long long lo, long long hi, T* value) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0')
    return;
  char* end = nullptr;
  const long long t = std::strtoll(v, &end, 10);
  if (*end == '\0' && t >= lo && t <= hi) {
    *value = static_cast<T>(t);
    return;
  }
  std::fprintf(stderr,
               "dsinfer: warning: %s=%s is not a number in %lld..%lld; using %lld\n",
               name,
               v,
               lo,
               hi,
               static_cast<long long>(*value));
}
}  // namespace

Result<std::unique_ptr<CudaModel>> CudaModel::create(const model::ModelConfig& config,
                                                     const model::ModelWeights& weights,
                                                     model::Numerics numerics,
                                                     const CudaModelOptions& options) {
  DSI_RETURN_IF_ERROR(gpu::select_device(options.device));
  std::unique_ptr<CudaModel> m(new CudaModel(config, numerics, options));
  env_int("DSINFER_GRAPH_TOKENS", 1, 64, &m->options_.max_graph_tokens);
  if (const char* v = std::getenv("DSINFER_SIDE_STREAMS"); v != nullptr && *v != '\0')
    m->options_.side_streams = std::strcmp(v, "0") != 0;
  if (const char* v = std::getenv("DSINFER_DRAFT_SLOT"); v != nullptr && *v != '\0')
    m->options_.draft_slot_by_steps = std::strcmp(v, "exact") != 0;
  if (const char* v = std::getenv("DSINFER_DEFER_DRAFTS"); v != nullptr && *v != '\0')
    m->options_.defer_drafts = std::strcmp(v, "0") != 0;
  env_int("DSINFER_PLAN_THREADS", 0, 256, &m->options_.plan_threads);
  int plan_threads = m->options_.plan_threads;
  if (plan_threads <= 0)
    plan_threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 8);
  if (plan_threads > 1)
    m->plan_pool_ = std::make_unique<ThreadPool>(plan_threads);
  int64_t expert_first = 0;
  int64_t expert_count = -1;
  if (options.comm != nullptr) {
    DSI_ASSIGN_OR_RETURN(
        auto part, parallel::ExpertPartition::make(config.n_routed_experts, options.comm->size()));
    expert_first = part.first(options.comm->rank());
    expert_count = part.count(options.comm->rank());
    m->partition_ = part;
    m->options_.cuda_graphs = false;  // host round trips per MoE layer
  }
  DSI_ASSIGN_OR_RETURN(m->weights_,
                       DeviceWeights::upload(m->config_, weights, expert_first, expert_count));
  if (const char* v = std::getenv("DSINFER_MOE_FP8_COPY"); v != nullptr && *v != '\0')
    m->options_.moe_fp8_copy = std::strcmp(v, "0") != 0;
  if (const char* v = std::getenv("DSINFER_MOE_W4A8"); v != nullptr && *v != '\0')
    m->options_.moe_w4a8 = std::strcmp(v, "0") != 0;
  const bool grouped =
      numerics == model::Numerics::kDeepSeek && options.comm == nullptr && !options.batch_invariant;
  if (grouped) {  // the shared experts' copies whatever moe_fp8_copy says
    DSI_ASSIGN_OR_RETURN(
        m->stats_.moe_fp8_layers,
        m->weights_->add_moe_fp8_copies(options.moe_fp8_reserve_bytes, m->options_.moe_fp8_copy));
  }
  if (grouped && m->options_.moe_w4a8) {  // every MXFP4 layer, with a copy or not
    DSI_ASSIGN_OR_RETURN(m->stats_.moe_w4a8_layers, m->weights_->add_moe_w4a8());
  }
  if (!options.batch_invariant) {
    DSI_RETURN_IF_ERROR(m->weights_->add_wo_a_bf16_copies().status());
    DSI_ASSIGN_OR_RETURN(m->stats_.moe_gemv_layers, m->weights_->enable_expert_gemv());
  }
  DSI_ASSIGN_OR_RETURN(m->stream_, device::Stream::create(true));
  DSI_ASSIGN_OR_RETURN(m->sides_, SideStreams::create(m->options_.side_streams));
  m->ws_ = std::make_unique<Workspace>();
  m->stats_.weight_bytes = m->weights_->bytes();
  return m;
}

Status CudaModel::health() const {
  DSI_RETURN_IF_ERROR(device::device_failure());
  return options_.comm ? options_.comm->health() : Status();
}

CudaModelStats CudaModel::stats() const {
  CudaModelStats s = stats_;
  s.workspace_bytes = ws_->bytes();
  s.pool_bytes = 0;
  for (const auto& [a, p] : pools_) s.pool_bytes += p.pages * a->page_bytes();
  return s;
}

void CudaModel::clear_graphs() {
  for (auto& [key, g] : graphs_) {
    if (g.exec)
      (void)cudaGraphExecDestroy(g.exec);
  }
  graphs_.clear();
  warm_shapes_.clear();
}

bool CudaModel::fixed_shape_warm(int64_t batch, int64_t tokens_per_seq) const {
  if (!graph_batch(batch) || tokens_per_seq > graph_max_tokens())
    return true;  // never replayed: every such step runs eagerly
  return warm_shapes_.count({pow2_at_least(batch), tokens_per_seq}) > 0;
}

Status CudaModel::ensure_pool(const state::PageArena& arena) {
  StatePool& pool = pools_[&arena];
  if (pool.pages < arena.num_pages())
    DSI_RETURN_IF_ERROR(reads_.drain());  // the pool is about to move
  bool grew = false;
  DSI_RETURN_IF_ERROR(grow_state_pool(&pool, arena, stream_.get(), "state pool", &grew));
  if (grew)
    clear_graphs();
  arena_ = &arena;
  pool_ = pool.p;
  return Status();
}

Status CudaModel::ensure_device_buffer(void** buf, int64_t* cap, int64_t bytes, const char* what) {
  if (*cap >= bytes)
    return Status();
  DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), what));
  if (*buf)
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaFree(*buf), "cudaFree"));
  *buf = nullptr;
  *cap = 0;
  const int64_t n = std::max<int64_t>(bytes * 2, 1 << 20);
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(buf, static_cast<size_t>(n)), what));
  *cap = n;
  clear_graphs();
  return Status();
}

Status CudaModel::read_page(int32_t page, std::vector<float>* out) {
  DSI_CHECK(arena_ != nullptr && page >= 0, "read_page before any forward");
  const int64_t floats = arena_->page_floats();
  out->resize(static_cast<size_t>(floats));
  DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "read_page"));
  return device::check_cuda(cudaMemcpy(out->data(),
                                       pool_ + page * floats,
                                       static_cast<size_t>(floats * 4),
                                       cudaMemcpyDeviceToHost),
                            "read_page");
}

Status CudaModel::copy_pages(const state::PageArena& arena,
                             const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  DSI_RETURN_IF_ERROR(ensure_pool(arena));
  reads_.check_not_reading(pairs, "copy_state_pages");
  return copy_pool_pages(pool_, arena.page_floats(), pairs, stream_.get());
}

Status CudaModel::read_state_pages(const state::PageArena& arena,
                                   std::span<const int32_t> pages,
                                   float* dst) {
  DSI_RETURN_IF_ERROR(ensure_pool(arena));
  return read_pool_pages(pool_, arena.page_floats(), pages, dst, stream_.get());
}

Status CudaModel::write_state_pages(state::PageArena& arena,
                                    std::span<const int32_t> pages,
                                    const float* src) {
  DSI_RETURN_IF_ERROR(ensure_pool(arena));
  reads_.check_not_reading(pages, "write_state_pages");
  // Queued on the compute stream without waiting: the next forward reads the pages after it.
  return writes_.write(pool_, arena.page_floats(), pages, src, stream_.get());
}

Result<int64_t> CudaModel::begin_read_state_pages(const state::PageArena& arena,
                                                  std::span<const int32_t> pages,
                                                  float* dst) {
  DSI_RETURN_IF_ERROR(ensure_pool(arena));
  return reads_.begin(pool_, arena.page_floats(), pages, dst, stream_.get());
}

Status CudaModel::mark(size_t i) {
  if (!profiling_now_)
    return Status();
  while (events_.size() <= i) {
    cudaEvent_t e = nullptr;
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaEventCreate(&e), "cudaEventCreate"));
    events_.push_back(e);
  }
  return device::check_cuda(cudaEventRecord(events_[i], stream_.get()), "cudaEventRecord");
}

void CudaModel::mark_launch_start() {
  if (launch_open_)
    return;            // a drafting call's window, still open, takes this launch in
  if (!win_events_) {  // timing events for CudaModelStats::decode_idle_ms (none: not measured)
    win_events_ = true;
    for (int i = 0; i < 3; ++i) {
      for (cudaEvent_t* e : {&win_start_[i], &win_end_[i]}) {
        if (cudaEventCreate(e) != cudaSuccess) {
          *e = nullptr;
          win_events_ = false;
        }
      }
    }
    if (!win_events_)
      (void)cudaGetLastError();
  }
  win_ = (win_ + 1) % 3;
  if (win_events_)
    (void)cudaEventRecord(win_start_[win_], stream_.get());
}

void CudaModel::mark_launch_end() {
  launch_open_ = false;  // (the forward after a deferred drafting call closes its window)
  if (win_events_)
    (void)cudaEventRecord(win_end_[win_], stream_.get());
}

// Once a window's work is done (a forward's or drafting call's final synchronisation, or its
// deferred picks in): its GPU time and, when the window accounted before it was decode-shaped
// too, the idle gap between them (CudaModelStats). Measurement only: a failing event call leaves
// the figures out, never the forward.
void CudaModel::account_window(bool decode, int window) {
  if (!decode || !win_events_) {
    prev_win_ = -1;
    return;
  }
  float busy = 0.0f;
  if (cudaEventElapsedTime(&busy, win_start_[window], win_end_[window]) == cudaSuccess)
    stats_.decode_gpu_ms += busy;
  float idle = 0.0f;
  if (prev_win_ >= 0 && prev_win_ != window &&
      cudaEventElapsedTime(&idle, win_end_[prev_win_], win_start_[window]) == cudaSuccess) {
    stats_.decode_idle_ms += std::max(idle, 0.0f);
    ++stats_.decode_gaps;
  }
  prev_win_ = window;
}

Status CudaModel::forward(state::SequenceState& st,
                          std::span<const int32_t> tokens,
                          const backend::ForwardOptions& options,
                          backend::ForwardOutputs* out) {
  return backend::forward_as_batch(*this, st, tokens, options, out);
}

Status CudaModel::forward_batch(std::span<backend::ForwardItem> items) {
  host_begin();
  // The previous forward's picks still on the device: this forward's device tokens read them,
  // and they are written out once its own work is queued.
  std::swap(prior_picks_, picks_);
  DSI_CHECK(!picks_.pending, "deferred picks of two forwards ago were never written out");
  picks_.rows.clear();
  picks_.outs.clear();
  picks_.pending = false;
  const Status s = forward_batch_impl(items);
  const Status drafts = complete_deferred_drafts();
  const Status prior = deliver_picks(prior_picks_);
  host_end(call_decode_);
  return !s.ok() ? s : !drafts.ok() ? drafts : prior;
}

int64_t CudaModel::DeferredPicks::find(const state::SequenceState* st) const {
  auto it = std::lower_bound(
      rows.begin(), rows.end(), st, [](const auto& e, const state::SequenceState* s) {
        return e.first < s;
      });
  return it != rows.end() && it->first == st ? it->second : -1;
}

Status CudaModel::deliver_picks(DeferredPicks& p) {
  if (!p.pending)
    return Status();
  p.pending = false;
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaEventSynchronize(picks_ready_[p.which]), "deferred picks"));
  for (const auto& [out, row] : p.outs) {
    out->sample = sampler_.result(p.which, row);
    out->sampled = true;
    out->deferred = false;
  }
  account_window(p.decode, p.window);
  return Status();
}

Status CudaModel::complete_deferred_samples() {
  return deliver_picks(picks_);
}

void CudaModel::host_begin() {
  host_phases_.t[0] = std::chrono::steady_clock::now();
  host_phases_.reached = 0;
  host_phases_.has_parts = false;
  call_decode_ = false;
}

void CudaModel::host_mark(int phase) {
  // The first time only: a call of several rounds (drafting one step at a time, each step
  // uploaded, launched and read back) counts its later rounds as `after`, so that the phases
  // stay in order and none is negative.
  if (phase <= host_phases_.reached)
    return;
  host_phases_.t[phase] = std::chrono::steady_clock::now();
  host_phases_.reached = phase;
}

void CudaModel::host_end(bool decode) {
  if (!decode)
    return;
  const auto now = std::chrono::steady_clock::now();
  const auto& t = host_phases_.t;
  const int r = host_phases_.reached;
  // A phase not reached (a drafting call that left its drafts on the device never waits) takes
  // no time: it ends where the call does.
  const auto e1 = r >= 1 ? t[1] : now;
  const auto e2 = r >= 2 ? t[2] : now;
  const auto e3 = r >= 3 ? t[3] : now;
  auto ms = [](std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  stats_.host_before_ms += ms(t[0], e1);
  stats_.host_launch_ms += ms(e1, e2);
  stats_.host_wait_ms += ms(e2, e3);
  stats_.host_after_ms += ms(e3, now);
  if (host_phases_.has_parts && r >= 1) {
    stats_.host_checks_ms += ms(t[0], host_phases_.checked);
    stats_.host_plan_ms += ms(host_phases_.checked, host_phases_.planned);
  }
}

Status CudaModel::complete_deferred_drafts() {
  if (deferred_.empty())
    return Status();
  // Still open: no forward reached its launches after the drafting call (it failed before, or
  // another drafting call came first); the window ends here.
  const bool open = launch_open_;
  if (open)
    mark_launch_end();
  DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "MTP draft"));
  if (open)
    account_decode_gap(true);
  deferred_.deliver(draft_results_.get());
  return Status();
}

void CudaModel::plan_token_scatters(std::span<const backend::ForwardItem> items,
                                    std::span<const size_t> active,
                                    std::span<const SeqSpan> spans,
                                    HostPack& pack,
                                    TokenScatter* drafts,
                                    TokenScatter* picks) const {
  std::vector<int32_t> dsrc, ddst, psrc, pdst;
  for (size_t k = 0; k < active.size(); ++k) {
    const backend::ForwardItem& it = items[active[k]];
    const auto row = static_cast<int32_t>(spans[k].begin);
    if (it.options.device_drafts >= 1) {
      const backend::DeferredDrafts::Entry* d = deferred_.find(it.state);
      DSI_CHECK(d != nullptr && it.options.device_drafts <= d->steps,
                "device drafts of a sequence without as many deferred drafts (checked on entry)");
      for (int32_t j = 0; j < it.options.device_drafts; ++j) {
        dsrc.push_back(static_cast<int32_t>(deferred_.index(*d, j)));
        ddst.push_back(row + 1 + j);
      }
    }
    if (it.options.device_token) {
      const int64_t pick = prior_picks_.find(it.state);
      DSI_CHECK(pick >= 0, "a device token without a deferred pick (checked on entry)");
      psrc.push_back(static_cast<int32_t>(pick));
      pdst.push_back(row);
    }
  }
  for (auto [src, dst, out] : {std::tuple{&dsrc, &ddst, drafts}, std::tuple{&psrc, &pdst, picks}}) {
    if (src->empty())
      continue;
    out->src = pack.add(*src);
    out->dst = pack.add(*dst);
    out->n = static_cast<int64_t>(src->size());
  }
}

Status CudaModel::forward_batch_impl(std::span<backend::ForwardItem> items) {
  DSI_RETURN_IF_ERROR(health());
  const auto& c = config_;
  std::vector<size_t> active;
  // Each sequence once (sorted pointers: a tree's node per item cost more at 256 items).
  seen_states_.clear();
  for (const backend::ForwardItem& it : items) seen_states_.push_back(it.state);
  std::sort(seen_states_.begin(), seen_states_.end());
  const auto dup = std::adjacent_find(seen_states_.begin(), seen_states_.end());
  DSI_CHECK(dup == seen_states_.end(),
            "sequence %lld twice in one batch",
            static_cast<long long>((*dup)->id()));
  for (size_t i = 0; i < items.size(); ++i) {
    backend::ForwardItem& it = items[i];
    it.status = Status();
    if (it.out) {
      it.out->logits.clear();
      it.out->mtp_logits.clear();
      it.out->mtp_count = 0;
      it.out->sampled = false;
      it.out->deferred = false;
      it.out->row_samples.clear();
    }
    if (it.options.device_drafts != 0) {
      const backend::DeferredDrafts::Entry* d = deferred_.find(it.state);
      if (d == nullptr || it.options.device_drafts < 0 || it.options.device_drafts > d->steps ||
          static_cast<int64_t>(it.tokens.size()) < 1 + it.options.device_drafts ||
          it.options.run_mtp) {
        it.status = invalid_argument(
            str_format("%d drafts to take on the device, where the latest drafting call left %d "
                       "for this sequence (of %zu tokens%s)",
                       it.options.device_drafts,
                       d ? d->steps : 0,
                       it.tokens.size(),
                       it.options.run_mtp ? ", with the MTP pass" : ""));
        continue;
      }
    }
    if (it.options.device_token &&
        (it.tokens.empty() || it.options.run_mtp || it.options.device_drafts != 0 ||
         prior_picks_.find(it.state) < 0)) {
      it.status = invalid_argument(
          "a token to take on the device where the previous forward left no pick for this "
          "sequence (or with drafts or the MTP pass)");
      continue;
    }
    bool bad = false;
    for (size_t t = 0; t < it.tokens.size() && !bad; ++t) {
      if (t >= 1 && t <= static_cast<size_t>(it.options.device_drafts))
        continue;  // (placeholders: the drafts are taken on the device)
      if (t == 0 && it.options.device_token)
        continue;  // (a placeholder: the previous forward's pick)
      if (it.tokens[t] < 0 || it.tokens[t] >= c.vocab_size) {
        it.status = invalid_argument(
            str_format("token id %d at index %zu is outside the vocabulary [0, %lld)",
                       it.tokens[t],
                       t,
                       static_cast<long long>(c.vocab_size)));
        bad = true;
      }
    }
    if (bad)
      continue;
    if (Status f = state::check_row_format(*it.state, c, row_format_); !f.ok()) {
      it.status = f;
      continue;
    }
    if (it.options.run_mtp && options_.comm && options_.comm->size() > 1) {
      it.status = unimplemented(
          "MTP under expert parallelism over several ranks is not supported yet (the MTP "
          "block's MoE exchange would have to run on every rank)");
      continue;
    }
    if (const backend::SampleRequest* q = it.options.sample;
        q && (!q->config || q->config->top_logprobs > 0)) {
      it.status = invalid_argument("in-backend sampling needs a config without top_logprobs");
      continue;
    }
    if (!it.options.sample_rows.empty()) {
      bool ok = it.options.want_logits && !it.options.last_logits_only &&
                it.options.sample == nullptr && it.options.sample_rows.size() == it.tokens.size();
      for (const backend::SampleRequest& q : it.options.sample_rows)
        ok = ok && q.config && q.config->top_logprobs == 0 && q.penalties && q.allowed.empty();
      if (!ok) {
        it.status = invalid_argument(
            "in-backend sampling of every row needs all rows' logits, one request per token, "
            "configs without top_logprobs and no masks");
        continue;
      }
    }
    if (it.options.run_mtp && weights_->mtp.empty()) {
      it.status = failed_precondition("MTP requested but the checkpoint has no MTP weights");
      continue;
    }
    state::SequenceState& st = *it.state;
    const int64_t n = static_cast<int64_t>(it.tokens.size());
    if (n == 0)
      continue;
    if (it.options.run_mtp) {
      const int64_t first = st.num_tokens();
      const int64_t mtp_first = st.mtp_num_tokens();
      if (mtp_first < first - 1 ||
          (mtp_first == first - 1 && st.final_streams_row(mtp_first) < 0)) {
        it.status = failed_precondition(str_format(
            "MTP state is behind (at %lld, sequence at %lld); run every forward with MTP on",
            static_cast<long long>(mtp_first),
            static_cast<long long>(first)));
        continue;
      }
    }
    if (!st.reserve(n)) {
      it.status = Status(StatusCode::kResourceExhausted,
                         str_format("no state memory for %lld more tokens of sequence %lld",
                                    static_cast<long long>(n),
                                    static_cast<long long>(st.id())));
      continue;
    }
    active.push_back(i);
  }
  if (active.empty()) {
    // Expert parallelism: the other ranks' tokens still come through this rank's experts.
    if (lockstep()) {
      Status s = run_empty_pass();
      for (backend::ForwardItem& it : items) {
        if (it.status.ok() && !s.ok())
          it.status = s;
      }
      return s;
    }
    return Status();
  }
  Status s = run_batch(items, active);
  if (!s.ok()) {
    // The batch's state metadata may be half-advanced; the device is unusable or a launch was
    // rejected (a bug). Either way every item of the batch failed.
    for (size_t i : active) items[i].status = s;
  }
  return s;
}

Result<int64_t> CudaModel::all_ranks_sum(int64_t v) {
  if (options_.comm == nullptr)
    return v;
  float* buf = nullptr;
  ws_->reset();
  DSI_RETURN_IF_ERROR(ws_->get(&buf, 1));
  // Exact for |sums| < 2^24: counts of requests and tokens.
  const float f = static_cast<float>(v);
  DSI_RETURN_IF_ERROR(device::check_cuda(
      cudaMemcpyAsync(buf, &f, 4, cudaMemcpyHostToDevice, stream_.get()), "all_ranks_sum"));
  DSI_RETURN_IF_ERROR(options_.comm->all_reduce_sum_f32(buf, 1, stream_.get()));
  float out = 0;
  DSI_RETURN_IF_ERROR(device::check_cuda(
      cudaMemcpyAsync(&out, buf, 4, cudaMemcpyDeviceToHost, stream_.get()), "all_ranks_sum"));
  DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "all_ranks_sum"));
  return static_cast<int64_t>(out);
}

Status CudaModel::run_empty_pass() {
  // The MoE exchange of every main layer with no tokens of this rank (the MTP block never runs
  // under expert parallelism over several ranks: run_mtp is refused there).
  ++stats_.forwards;
  ws_->reset();
  for (const DLayer& l : weights_->layers) {
    DSI_RETURN_IF_ERROR(launch_routed_ep(l.moe, 0, nullptr, nullptr, nullptr, nullptr, nullptr));
  }
  return device::sync_stream(stream_.get(), "empty expert-parallel pass");
}

Status CudaModel::capture_graph(const std::vector<int64_t>& key,
                                const std::function<Status()>& launch,
                                float** out0,
                                float** out1) {
  cudaGraph_t graph = nullptr;
  DSI_RETURN_IF_ERROR(device::check_cuda(
      cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeRelaxed), "graph capture"));
  Status ls = launch();
  const cudaError_t end = cudaStreamEndCapture(stream_.get(), &graph);
  if (!ls.ok() || end != cudaSuccess) {
    if (graph)
      (void)cudaGraphDestroy(graph);
    DSI_RETURN_IF_ERROR(ls);
    return device::check_cuda(end, "graph capture");
  }
  Graph rec;
  const cudaError_t inst = cudaGraphInstantiate(&rec.exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  DSI_RETURN_IF_ERROR(device::check_cuda(inst, "graph instantiation"));
  rec.logits = out0 ? *out0 : nullptr;
  rec.mtp_logits = out1 ? *out1 : nullptr;
  graphs_.emplace(key, rec);
  ++stats_.graph_captures;
  return Status();
}

Status CudaModel::run_fixed_shape(const std::vector<int64_t>& key,
                                  const std::function<Status()>& launch,
                                  float** out0,
                                  float** out1,
                                  bool profile_eager) {
  auto g = graphs_.find(key);
  if (g == graphs_.end()) {
    ++stats_.shape_warmups;
    const bool again = seen_[key]++ >= 1;
    if (again || stats_.graph_captures > 0) {
      const Status cs = capture_graph(key, launch, out0, out1);
      if (!cs.ok() && (again || device::device_failed()))
        return cs;
      if (!cs.ok())
        (void)cudaGetLastError();  // a first-time capture refused (not sticky): run it eagerly
      g = graphs_.find(key);
    }
  }
  if (g == graphs_.end()) {
    profiling_now_ = profile_eager && profile_;
    return launch();
  }
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaGraphLaunch(g->second.exec, stream_.get()), "graph launch"));
  if (out0)
    *out0 = g->second.logits;
  if (out1)
    *out1 = g->second.mtp_logits;
  ++stats_.graph_replays;
  return Status();
}

Status CudaModel::run_batch(std::span<backend::ForwardItem> items,
                            const std::vector<size_t>& active) {
  const auto& c = config_;
  const int64_t width = c.hc_mult * c.hidden_size;
  const state::PageArena* arena = items[active[0]].state->arena();
  for (size_t i : active) {
    DSI_CHECK(items[i].state->arena() == arena, "one batch spans two state arenas");
  }
  DSI_RETURN_IF_ERROR(ensure_pool(*arena));
  ++stats_.forwards;
  const auto plan_start = std::chrono::steady_clock::now();
  host_phases_.checked = plan_start;

  // Fixed-shape steps: every sequence the same number of tokens L (a decode step: 1; a
  // speculative verification: the pending token and its drafts), the MTP pass run by all or none
  // of them. Their kernels are the decode steps' (chosen by the row count alone), and they are
  // graph-replayed when the MTP pass, if any, has as many rows for every sequence and
  // nobody asked for its logits (a drafting engine's steady state).
  const int64_t L0 = static_cast<int64_t>(items[active[0]].tokens.size());
  const bool mtp0 = items[active[0]].options.run_mtp;
  bool uniform = L0 >= 1 && L0 <= graph_max_tokens();
  // The MTP pass covers the positions whose next token this forward brings: L after a plain
  // step, L - 1 after a drafting call (the block consumed the pending token); the same count for
  // every sequence, or the step runs eagerly.
  bool mtp_graphable = true;
  int64_t m0 = -1;
  for (size_t i : active) {
    const backend::ForwardItem& it = items[i];
    uniform = uniform && static_cast<int64_t>(it.tokens.size()) == L0 && it.options.run_mtp == mtp0;
    if (it.options.run_mtp) {
      const int64_t m = it.state->num_tokens() + L0 - 1 - it.state->mtp_num_tokens();
      if (m0 < 0)
        m0 = m;
      mtp_graphable =
          mtp_graphable && m == m0 && m >= 0 && m <= L0 && !(it.out && it.options.want_mtp_logits);
    }
  }
  // A function of the batch's shape only, not of whether graphs are on: eager and replayed steps
  // run the same kernels (bit-identical).
  decode_step_ = uniform && (!mtp0 || mtp_graphable);
  const bool decode = graph_batch(static_cast<int64_t>(active.size())) && decode_step_;
  // Spans of the main pass.
  std::vector<SeqSpan> spans;
  std::vector<int32_t> tokens;
  int64_t rows = 0;
  for (size_t i : active) {
    const backend::ForwardItem& it = items[i];
    SeqSpan s;
    s.st = it.state;
    s.first = it.state->num_tokens();
    s.n = static_cast<int64_t>(it.tokens.size());
    s.begin = rows;
    spans.push_back(s);
    tokens.insert(tokens.end(), it.tokens.begin(), it.tokens.end());
    rows += s.n;
  }
  if (decode)  // padded to a power of two of sequences (L rows each): few shapes to capture
    rows = pow2_at_least(static_cast<int64_t>(active.size())) * L0;
  tokens.resize(static_cast<size_t>(rows), 0);

  auto L = std::make_unique<Launch>();
  L->pack = std::move(spare_pack_);  // the previous forward's storage (HostPack::clear)
  L->pack.clear();
  PlanContext ctx;
  ctx.config = &c;
  ctx.page_floats = arena->page_floats();
  ctx.fixed_shape = decode;
  ctx.kv_width = kv_width();
  ctx.pool = plan_pool_.get();
  plan_pass(ctx, spans, tokens, rows, L->pack, &L->main);

  // Head rows: per item the last row or all rows (fixed shape: every row).
  std::vector<int64_t> head_src;
  std::vector<int64_t> head_first(items.size(), -1);
  for (size_t k = 0; k < active.size(); ++k) {
    const backend::ForwardItem& it = items[active[k]];
    if (!it.options.want_logits || !it.out)
      continue;
    const SeqSpan& s = spans[k];
    const int64_t from = it.options.last_logits_only ? s.n - 1 : 0;
    head_first[active[k]] = static_cast<int64_t>(head_src.size());
    for (int64_t t = from; t < s.n; ++t) head_src.push_back(local_ref((s.begin + t) * width));
  }
  if (decode) {
    head_src.clear();
    for (int64_t r = 0; r < rows; ++r) head_src.push_back(local_ref(r * width));
  }
  L->head_rows = static_cast<int64_t>(head_src.size());
  L->head_src = L->pack.add(head_src);

  // MTP pass: positions whose next token became known (main streams: kept rows or this pass).
  std::vector<SeqSpan> mspans;
  std::vector<int32_t> mtokens;
  std::vector<int64_t> msrc;
  std::vector<int64_t> mfirst(items.size(), 0);
  std::vector<int64_t> mrow(items.size(), -1);
  std::vector<int64_t> mcount(items.size(), 0);
  int64_t mrows = 0;
  for (size_t k = 0; k < active.size(); ++k) {
    const backend::ForwardItem& it = items[active[k]];
    if (!it.options.run_mtp)
      continue;
    const SeqSpan& s = spans[k];
    state::SequenceState& st = *it.state;
    const int64_t mtp_first = st.mtp_num_tokens();
    const int64_t mtp_end = s.first + s.n - 1;
    const int64_t m = mtp_end - mtp_first;
    mfirst[active[k]] = mtp_first;
    if (m <= 0)
      continue;
    SeqSpan ms;
    ms.st = &st;
    ms.first = mtp_first;
    ms.n = m;
    ms.begin = mrows;
    ms.mtp = true;
    mspans.push_back(ms);
    mrow[active[k]] = mrows;
    mcount[active[k]] = m;
    for (int64_t pos = mtp_first; pos < mtp_end; ++pos) {
      if (pos < s.first) {
        const int64_t r = st.final_streams_row(pos);
        DSI_CHECK(r >= 0, "final streams of position %lld are gone", static_cast<long long>(pos));
        msrc.push_back(st.final_streams_rows().pool_offset(r));
      } else {
        msrc.push_back(local_ref((s.begin + pos - s.first) * width));
      }
      mtokens.push_back(it.tokens[static_cast<size_t>(pos + 1 - s.first)]);
    }
    mrows += m;
  }
  if (!mspans.empty()) {
    L->has_mtp = true;
    // A fixed-shape step's MTP pass is m0 rows per sequence (checked above), padded as the main
    // pass: padding rows read row 0 of the main pass and write nothing.
    const int64_t mplan = decode ? rows / L0 * m0 : mrows;
    DSI_CHECK(mplan >= mrows,
              "fixed-shape MTP pass of %lld rows in %lld",
              static_cast<long long>(mrows),
              static_cast<long long>(mplan));
    mtokens.resize(static_cast<size_t>(mplan), 0);
    msrc.resize(static_cast<size_t>(mplan), local_ref(0));
    // The MTP pass keeps the MTP layer's state for later drafting; its head (a second pass over
    // the LM head's weights) and the copy of its logits (rows x vocab floats: 66 MB for 128 rows
    // of V4's vocabulary) only when an item asks for them (scoring), not for speculation.
    for (size_t k = 0; k < active.size(); ++k) {
      const backend::ForwardItem& it = items[active[k]];
      L->mtp_head = L->mtp_head || (it.options.run_mtp && it.options.want_mtp_logits &&
                                    it.out != nullptr && mcount[active[k]] > 0);
    }
    plan_pass(ctx, mspans, mtokens, mplan, L->pack, &L->mtp);
    L->mtp_src = L->pack.add(msrc);
    std::vector<int64_t> bcast;
    for (int64_t r = 0; r < mplan; ++r) {
      for (int64_t j = 0; j < c.hc_mult; ++j) bcast.push_back(local_ref(r * c.hidden_size));
    }
    L->mtp_broadcast = L->pack.add(bcast);
  }
  // Final residual streams kept for the next call's MTP (after the MTP reads above).
  if (!weights_->mtp.empty()) {
    std::vector<int64_t> dest(static_cast<size_t>(rows), -1);
    for (const SeqSpan& s : spans) {
      const int64_t keep = std::min<int64_t>(s.n, s.st->max_rollback() + 1);
      for (int64_t t = s.n - keep; t < s.n; ++t) {
        const int64_t r = s.st->mark_final_streams(s.first + t);
        if (r >= 0)
          dest[static_cast<size_t>(s.begin + t)] = s.st->final_streams_rows().pool_offset(r);
      }
    }
    L->final_dest = L->pack.add(dest);
  }

  // Tokens taken on the device: a drafting call's drafts, the previous forward's picks.
  TokenScatter drafts, picks;
  plan_token_scatters(items, active, spans, L->pack, &drafts, &picks);

  // One transfer of the plan.
  L->pack.layout(decode);
  host_phases_.planned = std::chrono::steady_clock::now();
  host_phases_.has_parts = true;
  mark_launch_start();
  DSI_RETURN_IF_ERROR(upload_pack(L->pack, &L->dev));
  host_mark(1);
  call_decode_ = decode;
  stats_.host_plan_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - plan_start)
                             .count();
  DSI_ASSIGN_OR_RETURN(bool moved, ws_->consolidate());
  if (moved)
    clear_graphs();
  // The drafts and picks into the token rows, in stream order after the calls that made them and
  // the plan's copy, before the launches (or the graph) that read them.
  for (auto [from, sc] : {std::pair{static_cast<const int32_t*>(draft_picks_), &drafts},
                          std::pair{sampler_.device_tokens(), &picks}}) {
    if (sc->n == 0)
      continue;
    DSI_RETURN_IF_ERROR(
        cuda::launch_scatter_tokens(from,
                                    L->pack.resolve<int32_t>(L->dev, sc->src),
                                    L->pack.resolve<int32_t>(L->dev, L->main.tokens),
                                    L->pack.resolve<int32_t>(L->dev, sc->dst),
                                    sc->n,
                                    stream_.get()));
  }

  if (decode) {
    std::vector<int64_t> key = L->pack.layout_key();
    key.push_back(rows);
    key.push_back(reinterpret_cast<int64_t>(pool_));
    append_geometry_key(L->main, &key);
    key.push_back(L0);  // tokens per sequence (rows alone would let 2 x 4 replay 8 x 1's graph)
    key.push_back(L->has_mtp ? L->mtp.rows : 0);
    if (L->has_mtp)
      append_geometry_key(L->mtp, &key);
    DSI_RETURN_IF_ERROR(run_fixed_shape(
        key, [&] { return launch_all(*L); }, &L->logits, &L->mtp_logits, /*profile_eager=*/true));
    if (graphs_.count(key) > 0)
      warm_shapes_.insert({rows / L0, L0});
  } else {
    profiling_now_ = profile_;
    DSI_RETURN_IF_ERROR(launch_all(*L));
  }

  // Rows sampled on the device (backend::SampleRequest): only their tokens come back.
  std::vector<DeviceSampler::Row> sample_rows;
  std::vector<int64_t> sample_slot(items.size(), -1);
  bool host_logits = false;  // some item wants its logits on the host
  for (size_t k = 0; k < active.size(); ++k) {
    const backend::ForwardItem& it = items[active[k]];
    if (!it.out || !it.options.want_logits)
      continue;
    if (it.options.sample && it.options.last_logits_only) {
      const SeqSpan& s = spans[k];
      const int64_t row = decode ? s.begin + s.n - 1 : head_first[active[k]];
      sample_slot[active[k]] = static_cast<int64_t>(sample_rows.size());
      sample_rows.push_back({it.options.sample, row});
    } else if (!it.options.sample_rows.empty()) {  // every row (checked above: all its logits)
      const SeqSpan& s = spans[k];
      const int64_t from = decode ? s.begin : head_first[active[k]];
      sample_slot[active[k]] = static_cast<int64_t>(sample_rows.size());
      for (int64_t j = 0; j < s.n; ++j)
        sample_rows.push_back({&it.options.sample_rows[static_cast<size_t>(j)], from + j});
    } else {
      host_logits = true;
    }
  }
  if (!sample_rows.empty()) {
    DSI_RETURN_IF_ERROR(sampler_.launch(L->logits, c.vocab_size, sample_rows, stream_.get()));
  }

  // Outputs, through pinned memory kept from call to call (a batch-64 decode step returns 33 MB
  // of logits: pageable copies and fresh pages cost more than the step's kernels).
  const int64_t main_floats = host_logits ? L->head_rows * c.vocab_size : 0;
  const int64_t mtp_floats = L->mtp_head ? mrows * c.vocab_size : 0;
  const size_t out_bytes = static_cast<size_t>(main_floats + mtp_floats) * sizeof(float);
  if (logits_pinned_.size() < out_bytes) {
    DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "pinned logits"));
    DSI_ASSIGN_OR_RETURN(logits_pinned_, device::PinnedBuffer::allocate(out_bytes));
  }
  const float* logits = logits_pinned_.as<float>();
  const float* mtp_logits = logits + main_floats;
  if (main_floats > 0) {
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaMemcpyAsync(logits_pinned_.get(),
                                                           L->logits,
                                                           static_cast<size_t>(main_floats) * 4,
                                                           cudaMemcpyDeviceToHost,
                                                           stream_.get()),
                                           "copying logits"));
  }
  if (mtp_floats > 0) {
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaMemcpyAsync(logits_pinned_.as<float>() + main_floats,
                                                           L->mtp_logits,
                                                           static_cast<size_t>(mtp_floats) * 4,
                                                           cudaMemcpyDeviceToHost,
                                                           stream_.get()),
                                           "copying MTP logits"));
  }
  // Asynchronous scheduling: every item allows it (ForwardOptions::may_defer) and either samples
  // one row on the device or wants nothing back (a prompt chunk before the prompt's end); no
  // logits come back: return once the work is queued; the picks are written out by the next
  // call (deliver_picks).
  bool defer = !sample_rows.empty() && main_floats == 0 && mtp_floats == 0 && !profiling_now_;
  for (size_t k = 0; k < active.size() && defer; ++k) {
    const backend::ForwardItem& it = items[active[k]];
    const bool picks = it.out && it.options.sample && it.options.sample_rows.empty() &&
                       sample_slot[active[k]] >= 0;
    const bool nothing = sample_slot[active[k]] < 0 && !(it.out && it.options.want_logits);
    defer = it.options.may_defer && (picks || nothing);
  }
  host_mark(2);
  mark_launch_end();
  if (defer) {
    const int which = sampler_.current();
    if (!picks_ready_[which]) {
      DSI_RETURN_IF_ERROR(
          device::check_cuda(cudaEventCreateWithFlags(&picks_ready_[which], cudaEventDisableTiming),
                             "deferred picks event"));
    }
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaEventRecord(picks_ready_[which], stream_.get()),
                                           "deferred picks event"));
    picks_.which = which;
    picks_.window = win_;
    picks_.decode = decode;
    picks_.pending = true;
    for (size_t k = 0; k < active.size(); ++k) {
      const backend::ForwardItem& it = items[active[k]];
      if (sample_slot[active[k]] < 0)
        continue;  // (nothing to write out)
      const auto row = static_cast<size_t>(sample_slot[active[k]]);
      picks_.rows.push_back({it.state, static_cast<int64_t>(row)});
      picks_.outs.push_back({it.out, row});
      it.out->deferred = true;
      it.out->logits.clear();
    }
    std::sort(picks_.rows.begin(), picks_.rows.end());
  } else {
    DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "forward"));
    host_mark(3);
    DSI_RETURN_IF_ERROR(deliver_picks(prior_picks_));  // (home too: its window comes first)
    account_decode_gap(decode);
  }
  spare_pack_ = std::move(L->pack);
  if (profiling_now_) {
    profiling_now_ = false;
    const size_t marks = c.layers.size() + 4;  // start, embed, layers, mtp, head
    profile_ms_.assign(marks - 1, 0.0f);
    for (size_t i = 1; i < marks; ++i) {
      DSI_RETURN_IF_ERROR(device::check_cuda(
          cudaEventElapsedTime(&profile_ms_[i - 1], events_[i - 1], events_[i]), "profile"));
    }
  }

  for (size_t k = 0; k < active.size(); ++k) {
    backend::ForwardItem& it = items[active[k]];
    const SeqSpan& s = spans[k];
    if (it.out && sample_slot[active[k]] >= 0 && !it.options.sample_rows.empty()) {
      const auto first = static_cast<size_t>(sample_slot[active[k]]);
      it.out->row_samples.clear();
      for (int64_t j = 0; j < s.n; ++j)
        it.out->row_samples.push_back(sampler_.result(first + static_cast<size_t>(j)));
      it.out->logits.clear();
    } else if (defer) {
      // (Its pick is written out later: deliver_picks.)
    } else if (it.out && sample_slot[active[k]] >= 0) {
      it.out->sampled = true;
      it.out->sample = sampler_.result(static_cast<size_t>(sample_slot[active[k]]));
      it.out->logits.clear();
    } else if (it.out && it.options.want_logits) {
      const int64_t nrows = it.options.last_logits_only ? 1 : s.n;
      // Fixed shape: the head ran over every row (the item's last one when only it is wanted).
      const int64_t from = decode ? s.begin + s.n - nrows : head_first[active[k]];
      const float* src = logits + from * c.vocab_size;
      it.out->logits.assign(src, src + nrows * c.vocab_size);
    }
    if (it.options.run_mtp) {
      const int64_t m = mcount[active[k]];
      if (it.out) {
        it.out->mtp_first_pos = mfirst[active[k]];
        it.out->mtp_count = m;
        it.out->mtp_logits.clear();
        if (m > 0 && it.options.want_mtp_logits) {
          const float* src = mtp_logits + mrow[active[k]] * c.vocab_size;
          it.out->mtp_logits.assign(src, src + m * c.vocab_size);
        }
      }
      if (m > 0)
        it.state->set_mtp_num_tokens(s.first + s.n - 1);
    }
    it.state->advance(s.n);
  }
  return Status();
}

// The MTP block over plan's rows (spec 3.11): embedding of the next tokens, e_proj, the source
// streams (src_refs: final streams in the pool, or rows of `local`) under hnorm and h_proj, the
// MTP layer, the head. streams_out (optional) receives the layer's output streams [rows, width].
Status CudaModel::launch_mtp(const PassPlan& plan,
                             int32_t src_refs,
                             int32_t broadcast,
                             const float* local,
                             uint8_t* pack,
                             const HostPack& hp,
                             float* streams_out,
                             float** logits,
                             int32_t head_refs,
                             int64_t head_rows) {
  const auto& c = config_;
  const cudaStream_t s = stream_.get();
  const int64_t hc = c.hc_mult;
  const int64_t hidden = c.hidden_size;
  const int64_t width = hc * hidden;
  const DMtp& w = weights_->mtp[0];
  const int64_t nm = plan.rows;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int32_t* mtok = hp.resolve<int32_t>(pack, plan.tokens);
  float* e = nullptr;
  float* eproj = nullptr;
  float* h = nullptr;
  float* xm = nullptr;
  float* xma = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&e, nm * hidden));
  DSI_RETURN_IF_ERROR(ws_->get(&eproj, nm * hidden));
  DSI_RETURN_IF_ERROR(ws_->get(&h, nm * width));
  // The block's streams are built in streams_out where one is given (the layer's output lands
  // back in its input buffer: no copy after it, below).
  if (streams_out != nullptr) {
    xm = streams_out;
  } else {
    DSI_RETURN_IF_ERROR(ws_->get(&xm, nm * width));
  }
  DSI_RETURN_IF_ERROR(ws_->get(&xma, nm * width));
  cuda::EmbedParams me;
  me.table = weights_->embed;
  me.tokens = mtok;
  me.n = nm;
  me.copies = 1;
  me.out = e;
  DSI_RETURN_IF_ERROR(cuda::launch_embed(me, s));
  DSI_RETURN_IF_ERROR(expand_keys(plan, pack, hp));
  // Each norm also writes its projection's FP8 activations where the projection takes them.
  cuda::Fp8Acts eq, hq;
  DSI_ASSIGN_OR_RETURN(
      const cuda::Fp8Acts* eqp,
      rms_norm_for(ws_.get(), w.e_proj, q8(), e, nm, hidden, w.enorm, eps, s, &eq));
  DSI_RETURN_IF_ERROR(linear(lin(), w.e_proj, e, nm, eproj, q8(), s, false, eqp));
  DSI_RETURN_IF_ERROR(cuda::launch_gather_rows({.pool = pool_,
                                                .local = local,
                                                .src_refs = hp.resolve<int64_t>(pack, src_refs),
                                                .n = nm,
                                                .width = width,
                                                .dst = h},
                                               s));
  DSI_ASSIGN_OR_RETURN(
      const cuda::Fp8Acts* hqp,
      rms_norm_for(ws_.get(), w.h_proj, q8(), h, nm * hc, hidden, w.hnorm, eps, s, &hq));
  DSI_RETURN_IF_ERROR(cuda::launch_gather_rows({.local = eproj,
                                                .src_refs = hp.resolve<int64_t>(pack, broadcast),
                                                .n = nm * hc,
                                                .width = hidden,
                                                .dst = xm},
                                               s));
  // h_proj(h) + e_proj(e), as the CPU adds them.
  DSI_RETURN_IF_ERROR(linear(lin(), w.h_proj, h, nm * hc, xm, q8(), s, /*accumulate=*/true, hqp));
  HcCarry carry;
  DSI_RETURN_IF_ERROR(alloc_hc_carry(nm, &carry));
  DSI_RETURN_IF_ERROR(launch_layer(w.layer,
                                   c.mtp_layers[0],
                                   plan.layers[0],
                                   nm,
                                   mtok,
                                   hp.resolve<int64_t>(pack, plan.positions),
                                   pack,
                                   hp,
                                   &xm,
                                   &xma,
                                   &carry,
                                   /*flush=*/true));
  if (streams_out != nullptr && xm != streams_out) {
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpyAsync(
            streams_out, xm, static_cast<size_t>(nm * width) * 4, cudaMemcpyDeviceToDevice, s),
        "copying the MTP streams"));
  }
  if (logits == nullptr)
    return Status();  // the MTP layer's state only (no draft head)
  if (head_refs < 0) {
    DSI_RETURN_IF_ERROR(ws_->get(logits, nm * c.vocab_size));
    return launch_head(w.hc_head, w.norm, xm, nm, *logits);
  }
  float* hx = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&hx, head_rows * width));
  DSI_RETURN_IF_ERROR(ws_->get(logits, head_rows * c.vocab_size));
  DSI_RETURN_IF_ERROR(cuda::launch_gather_rows({.local = xm,
                                                .src_refs = hp.resolve<int64_t>(pack, head_refs),
                                                .n = head_rows,
                                                .width = width,
                                                .dst = hx},
                                               s));
  return launch_head(w.hc_head, w.norm, hx, head_rows, *logits);
}

Status CudaModel::upload_pack(const HostPack& pack, uint8_t** dev) {
  DSI_RETURN_IF_ERROR(
      ensure_device_buffer(&pack_dev_, &pack_cap_, pack.total_bytes(), "cudaMalloc (plan)"));
  const int64_t bytes = pack.host_bytes();  // device-only arrays (key lists) are not copied
  if (static_cast<int64_t>(pinned_.size()) < bytes) {
    DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "pinned staging"));
    DSI_ASSIGN_OR_RETURN(
        pinned_,
        device::PinnedBuffer::allocate(static_cast<size_t>(std::max<int64_t>(2 * bytes, 1 << 20))));
  }
  // The previous upload's copy out of pinned_ may still be queued (a deferred drafting call
  // returns before it runs): wait for it before writing pinned_ again.
  if (staging_free_)
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaEventSynchronize(staging_free_), "pinned staging"));
  pack.copy_to(pinned_.as<uint8_t>(), plan_pool_.get());
  *dev = static_cast<uint8_t*>(pack_dev_);
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaMemcpyAsync(pack_dev_,
                                                         pinned_.get(),
                                                         static_cast<size_t>(bytes),
                                                         cudaMemcpyHostToDevice,
                                                         stream_.get()),
                                         "copying the forward plan"));
  if (!staging_free_)
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaEventCreateWithFlags(&staging_free_, cudaEventDisableTiming), "pinned staging event"));
  return device::check_cuda(cudaEventRecord(staging_free_, stream_.get()), "pinned staging event");
}

Status CudaModel::launch_all(Launch& L) {
  const auto& c = config_;
  const cudaStream_t s = stream_.get();
  const HostPack& hp = L.pack;
  uint8_t* pack = L.dev;
  const int64_t hc = c.hc_mult;
  const int64_t hidden = c.hidden_size;
  const int64_t width = hc * hidden;
  const int64_t n = L.main.rows;
  ws_->reset();
  DSI_RETURN_IF_ERROR(mark(0));
  float* x = nullptr;
  float* xa = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&x, n * width));
  DSI_RETURN_IF_ERROR(ws_->get(&xa, n * width));
  const int32_t* tokens = hp.resolve<int32_t>(pack, L.main.tokens);
  const int64_t* positions = hp.resolve<int64_t>(pack, L.main.positions);
  cuda::EmbedParams ep;
  ep.table = weights_->embed;
  ep.tokens = tokens;
  ep.n = n;
  ep.copies = hc;
  ep.out = x;
  DSI_RETURN_IF_ERROR(cuda::launch_embed(ep, s));
  DSI_RETURN_IF_ERROR(expand_keys(L.main, pack, hp));
  DSI_RETURN_IF_ERROR(mark(1));
  HcCarry carry;
  DSI_RETURN_IF_ERROR(alloc_hc_carry(n, &carry));
  for (size_t l = 0; l < c.layers.size(); ++l) {
    DSI_RETURN_IF_ERROR(launch_layer(weights_->layers[l],
                                     c.layers[l],
                                     L.main.layers[l],
                                     n,
                                     tokens,
                                     positions,
                                     pack,
                                     hp,
                                     &x,
                                     &xa,
                                     &carry,
                                     /*flush=*/l + 1 == c.layers.size()));
    DSI_RETURN_IF_ERROR(mark(2 + l));
  }

  if (L.has_mtp) {
    DSI_RETURN_IF_ERROR(launch_mtp(L.mtp,
                                   L.mtp_src,
                                   L.mtp_broadcast,
                                   x,
                                   pack,
                                   hp,
                                   nullptr,
                                   L.mtp_head ? &L.mtp_logits : nullptr));
  }

  DSI_RETURN_IF_ERROR(mark(2 + c.layers.size()));
  // Head over the requested rows.
  float* hx = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&hx, L.head_rows * width));
  DSI_RETURN_IF_ERROR(ws_->get(&L.logits, L.head_rows * c.vocab_size));
  if (L.head_rows > 0) {
    DSI_RETURN_IF_ERROR(cuda::launch_gather_rows({.local = x,
                                                  .src_refs = hp.resolve<int64_t>(pack, L.head_src),
                                                  .n = L.head_rows,
                                                  .width = width,
                                                  .dst = hx},
                                                 s));
    DSI_RETURN_IF_ERROR(launch_head(weights_->hc_head, weights_->norm, hx, L.head_rows, L.logits));
  }
  if (L.final_dest >= 0) {
    cuda::ScatterRowsParams sp;
    sp.src = x;
    sp.n = n;
    sp.width = width;
    sp.pool = pool_;
    sp.dest_refs = hp.resolve<int64_t>(pack, L.final_dest);
    DSI_RETURN_IF_ERROR(cuda::launch_scatter_rows(sp, s));
  }
  return mark(3 + c.layers.size());
}

}  // namespace dsinfer::gpu
