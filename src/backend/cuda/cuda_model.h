// CudaModel: the whole DeepSeek V4 forward on one GPU behind the backend::Model seam, over the
// engine's paged state. The PageArena hands out page ids (Storage::kNone: no host copy); this
// model mirrors the pages in one device pool. Weights are uploaded once in their checkpoint
// formats. Each forward plans its index data on the host (forward_plan.h), copies it with one
// transfer and chains the kernels of kernels/cuda on one stream; batches of sequences run as one
// pass. Decode steps (one token per sequence) run with fixed shapes padded to a power-of-two
// batch and are replayed from CUDA graphs captured per shape (bit-identical to eager launches).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "backend/cuda/device_sampler.h"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/forward_plan.h"
#include "backend/cuda/host_pack.h"
#include "backend/cuda/side_streams.h"
#include "backend/cuda/state_pool.h"
#include "backend/cuda/workspace.h"
#include "backend/deferred_drafts.h"
#include "backend/model.h"
#include "base/thread_pool.h"
#include "comm/comm.h"
#include "device/allocator.h"
#include "device/stream.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/moe.h"
#include "parallel/dispatch.h"

namespace dsinfer::gpu {

struct LinearCtx;  // launch_helpers.h

struct CudaModelOptions {
  int device = 0;
  // Expert parallelism (docs/parallel.md): this rank's communicator. The routed experts are
  // sharded over comm->size() ranks (this rank uploads only its shard) and every MoE layer
  // exchanges (token, slot) pairs through it. Null: all experts local (no exchange). A size-1
  // communicator runs the same exchange path on one GPU.
  std::shared_ptr<comm::Comm> comm;
  bool cuda_graphs = true;        // replay decode steps from CUDA graphs
  int64_t max_graph_batch = 256;  // decode batches above this run eagerly
  // Forwards where every sequence has the same number of tokens, up to this many (speculative
  // verifications: the pending token + its drafts, with the MTP pass when every item runs it
  // without its logits), are fixed-shape steps too: graph-replayed and on the kernels of decode
  // steps. 1: single-token steps only. DSINFER_GRAPH_TOKENS in the environment overrides it.
  int64_t max_graph_tokens = 8;
  // A layer's independent branches (the shared expert, the K=V head and compressor, the CSA
  // indexer's compressor, the ring write; the list: side_streams.h) on side streams beside the
  // main chain; the same bits either way.
  // DSINFER_SIDE_STREAMS=0 in the environment turns them off.
  bool side_streams = true;
  // Threads that plan a large pass's layers side by side (forward_plan.h, PlanContext::pool;
  // the same plan as one thread's): 1 plans on the calling thread alone (the default: on an H100
  // host the pool did not move a step beyond the noise, docs/performance.md, thirty-fifth
  // session); 0 picks half the hardware threads, at most 8. DSINFER_PLAN_THREADS in the
  // environment overrides it.
  int plan_threads = 1;
  // Every linear on the kernels whose summation order is the same at every batch size, so a
  // token's logits do not depend on what else is in the batch (no wgmma GEMMs: slower prefill).
  bool batch_invariant = false;
  // `deepseek` numerics without expert parallelism: re-encode the MXFP4 routed experts once into
  // E4M3 for the grouped wgmma path of prefill-sized batches and of decode steps with more pairs
  // per expert than the expert GEMV takes (moe_sm90.h; 2x the expert bytes), layer by layer while
  // moe_fp8_reserve_bytes of device memory stay free.
  bool moe_fp8_copy = true;
  // (DSINFER_MOE_FP8_COPY=0 in the environment: none; the shared expert's copy is made either
  // way.) The MXFP4 routed experts also run the same grouped path on the W4A8 wgmma GEMMs that
  // read them as they are (moe_w4a8_sm90.h; bit for bit the copy's results; block exponents of
  // 1/64 of the experts' bytes): every launch of a layer without a copy (it did not fit, or the
  // option is off), and those of up to 32 pairs per expert where there is one. On the H200
  // (V4-Flash's routed experts, one layer) 0.92-1.0x the copy's time at 128-1,024 tokens, 1.5x
  // at 8,192; 3-6x faster than the W4A8 mma.sync tiles. Off (DSINFER_MOE_W4A8=0): the copies
  // only, and the layers without one keep the tiles.
  bool moe_w4a8 = true;
  int64_t moe_fp8_reserve_bytes = int64_t{8} << 30;
  // Decode steps beyond the expert GEMV (more pairs per expert than it takes) run the grouped
  // wgmma path when a layer's routed experts are at least this many bytes (streamed from HBM:
  // 5x the W4A8 tiles' speed at V4-Flash's shapes); smaller sets stay on the W4A8 tiles, which
  // launch fewer kernels (the bundled model's 0.8 MB of experts: 16% faster at batch 64).
  int64_t moe_grouped_decode_min_bytes = int64_t{64} << 20;
  // `deepseek` numerics: the state's K=V rows and index keys as storage records
  // (numeric/records.h, state::RowFormat::kRecord: 3.5x / 7.5x fewer bytes than fp32 rows, the
  // same values, bit for bit the same outputs). Off, or DSINFER_KV_RECORDS=0 in the environment:
  // fp32 rows (for comparisons).
  bool kv_records = true;
  // A drafting call's first pass (its sequences' catch-up rows and last position) in slots of at
  // least min(steps + 1, max_rollback + 1) rows per sequence when graph-replayed, not of the most
  // catch-up rows + 1: after a verification of `steps` drafts a sequence is behind by the drafts
  // it accepted, so the slot, part of the graph key, stays one value per (batch, steps) instead
  // of one per acceptance outcome, and auto's depth changes meet fewer first captures (auto ran
  // several times a fixed depth's warm-ups in the H200's benches; in the simulated device of
  // tests/unit/engine/auto_sim_test.cc, 3-4% of auto's tokens/s at batch 16 after a change of
  // traffic, docs/speculative.md). Unmeasured on a GPU so far. The rows past a
  // sequence's own are padding (read row 0, write nothing). Off, or DSINFER_DRAFT_SLOT=exact in
  // the environment: the most catch-up rows + 1.
  bool draft_slot_by_steps = true;
  // Drafts of a graph-replayed drafting call (every sequence the same steps) left on the device
  // when the caller allows it (DraftItem::may_defer): the call returns once its launches are
  // queued, the verification's forward scatters the picks into its token rows on the device
  // (cuda::launch_scatter_tokens) and the picks come back with its results, so that drafting and
  // verification run back to back without the host round trip between them (batch 1 of the
  // bundled model: ~45 us of GPU idle per ~1 ms step). Off, or DSINFER_DEFER_DRAFTS=0: each
  // drafting call waits for its picks.
  bool defer_drafts = true;
  // write_state_pages' pinned staging ring (gpu::AsyncPageWrites): buffers and bytes per buffer.
  int promote_staging_slots = 4;
  int64_t promote_staging_slot_bytes = int64_t{16} << 20;
};

struct CudaModelStats {
  int64_t forwards = 0;
  int64_t graph_replays = 0;
  int64_t graph_captures = 0;
  int64_t shape_warmups = 0;   // fixed-shape runs before their graph replays (Model::shape_warmups)
  int64_t moe_fp8_layers = 0;  // layers with the re-encoded experts (CudaModelOptions)
  int64_t moe_w4a8_layers = 0;  // layers whose routed experts may run the grouped W4A8 GEMMs
  int64_t moe_gemv_layers = 0;  // routed expert sets the decode GEMVs may run (moe_gemv.h)
  // MoE launches of decode-shaped steps on the grouped wgmma path (use_moe_sm90): a graph's
  // capture counts once, its replays do not.
  int64_t moe_grouped_decode = 0;
  // Host time spent planning forwards (key lists, page tables, the pack) until the plan's copy
  // is enqueued: the part of a forward the GPU waits for (issue 13's step loop hides it).
  int64_t host_plan_ns = 0;
  // Decode forwards and drafting calls on the device (timing events on the stream: from the plan's
  // upload to the last result copy) and the GPU's idle time between consecutive ones, end of one
  // to start of the next: the host's share of a decode step that the GPU waits for (issue 13's
  // step-loop target). In milliseconds; decode_gaps counts the gaps measured.
  double decode_gpu_ms = 0;
  double decode_idle_ms = 0;
  int64_t decode_gaps = 0;
  // The host's time in the same calls by phase (backend::Model::DeviceTiming), milliseconds.
  double host_before_ms = 0;
  double host_launch_ms = 0;
  double host_wait_ms = 0;
  double host_after_ms = 0;
  double host_checks_ms = 0;  // of host_before_ms (DeviceTiming::host_checks_ms)
  double host_plan_ms = 0;    // of host_before_ms (DeviceTiming::host_plan_ms)
  int64_t weight_bytes = 0;
  int64_t pool_bytes = 0;
  int64_t workspace_bytes = 0;
};

class CudaModel final : public backend::Model {
 public:
  static Result<std::unique_ptr<CudaModel>> create(const model::ModelConfig& config,
                                                   const model::ModelWeights& weights,
                                                   model::Numerics numerics,
                                                   const CudaModelOptions& options = {});
  ~CudaModel() override;

  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const backend::ForwardOptions& options,
                 backend::ForwardOutputs* out) override;
  // (Completes the drafts a drafting call left on the device, DraftItem::deferred, whatever
  // the outcome.)
  Status forward_batch(std::span<backend::ForwardItem> items) override;
  state::PageArena::Storage state_storage() const override {
    return state::PageArena::Storage::kNone;
  }
  Status health() const override;
  // ForwardOptions::sample: sampled on the device (DeviceSampler, kernels/cuda/sampling.h).
  bool can_sample() const override { return true; }
  // Asynchronous scheduling (ForwardOptions::may_defer / device_token): a forward whose items all
  // sample in the backend may return once its work is queued; the next forward takes its picks
  // on the device and, once its own work is queued, waits for them and writes them out.
  bool can_defer_samples() const override { return true; }
  Status complete_deferred_samples() override;
  int64_t shape_warmups() const override { return stats_.shape_warmups; }
  DeviceTiming decode_timing() const override {
    return {stats_.decode_gpu_ms,
            stats_.decode_idle_ms,
            stats_.host_before_ms,
            stats_.host_launch_ms,
            stats_.host_wait_ms,
            stats_.host_after_ms,
            stats_.host_checks_ms,
            stats_.host_plan_ms};
  }
  bool fixed_shape_warm(int64_t batch, int64_t tokens_per_seq) const override;
  bool prefers_uniform_steps() const override {
    return options_.cuda_graphs && options_.max_graph_tokens > 1;
  }
  // V4's MTP block drafting on the device (mtp_draft.cc); not under expert parallelism.
  bool can_draft() const override;
  // Its window floor travels in the pass plan (forward_plan.h: span_pos).
  bool can_resume_drafting() const override { return can_draft(); }
  Status mtp_draft_batch(std::span<backend::DraftItem> items) override;
  bool lockstep() const override { return options_.comm != nullptr; }
  Result<int64_t> all_ranks_sum(int64_t v) override;
  const char* name() const override { return "cuda"; }
  const model::ModelConfig& config() const override { return config_; }
  model::Numerics numerics() const override { return numerics_; }
  // deepseek numerics: the storage records (numeric/records.h) where the model has their layout
  // (CudaModelOptions::kv_records); fp32 rows otherwise.
  state::RowFormat row_format() const override { return row_format_; }
  CudaModelStats stats() const;
  void set_cuda_graphs(bool on) { options_.cuda_graphs = on && options_.comm == nullptr; }

  // Copies the device pool's contents of `page` (page_floats floats) to the host (tests).
  Status read_page(int32_t page, std::vector<float>* out);
  // Copies page contents within the arena's device mirror (SequenceState::fork_from's pairs).
  Status copy_pages(const state::PageArena& arena,
                    const std::vector<std::pair<int32_t, int32_t>>& pairs);
  Status copy_state_pages(const state::PageArena& arena,
                          const std::vector<std::pair<int32_t, int32_t>>& pairs) override {
    return copy_pages(arena, pairs);
  }
  // The prefix cache's page transfers (backend::Model): device pool pages to and from host
  // memory, in the order of `pages`, on the forward stream. Reads are synchronous on return;
  // writes are staged in pinned memory and queued without waiting (gpu::AsyncPageWrites), ahead
  // of the next forward by stream order, `src` free again on return.
  Status read_state_pages(const state::PageArena& arena,
                          std::span<const int32_t> pages,
                          float* dst) override;
  Status write_state_pages(state::PageArena& arena,
                           std::span<const int32_t> pages,
                           const float* src) override;
  // The same reads in the background (gpu::AsyncPageReads: a side stream ordered after the
  // forward stream, pinned staging, completion polled with an event).
  bool async_state_reads() const override { return true; }
  Result<int64_t> begin_read_state_pages(const state::PageArena& arena,
                                         std::span<const int32_t> pages,
                                         float* dst) override;
  Result<bool> poll_state_read(int64_t ticket) override { return reads_.poll(ticket); }
  Status wait_state_read(int64_t ticket) override { return reads_.wait(ticket); }
  int64_t state_reads_in_flight() const { return reads_.in_flight(); }
  // write_state_pages' staging ring: buffers whose copies are still running, and how often a
  // write had to wait for one (the ring wrapped onto copies not done yet).
  int64_t state_writes_in_flight() { return writes_.in_flight(); }
  int64_t state_write_waits() const { return writes_.waits(); }
  // Per-layer timing of eager forwards (CUDA events between the embedding, every decoder layer,
  // the MTP block and the head). Off by default; graph replays are not profiled.
  void set_profile(bool on) { profile_ = on; }
  // Milliseconds of the last profiled forward: [embed, layer 0 .. layer L-1, mtp, head].
  const std::vector<float>& last_profile_ms() const { return profile_ms_; }

 private:
  // The graph limits of the options, shared by run_batch and fixed_shape_warm: whether a
  // fixed-shape step of `batch` sequences may be replayed, and the most tokens per sequence such a
  // step has.
  bool graph_batch(int64_t batch) const {
    return options_.cuda_graphs && batch >= 1 && batch <= options_.max_graph_batch;
  }
  int64_t graph_max_tokens() const { return std::max<int64_t>(options_.max_graph_tokens, 1); }
  CudaModel(const model::ModelConfig& config, model::Numerics numerics, CudaModelOptions options);
  struct Launch;

  Status run_empty_pass();
  Status run_batch(std::span<backend::ForwardItem> items, const std::vector<size_t>& active);
  // Runs `launch` on stream_ as a fixed-shape step: replayed from the graph captured for `key`,
  // else eagerly (profiled when profile_eager). A key is captured the first time it comes once
  // some graph exists (the process's first fixed shape runs eagerly first: it sizes the
  // workspace and sets the kernels' attributes), else the second time; a first-time capture
  // that fails runs the step eagerly instead. out0 / out1: where the launches leave their
  // outputs (recorded with a capture, restored on replay).
  Status run_fixed_shape(const std::vector<int64_t>& key,
                         const std::function<Status()>& launch,
                         float** out0,
                         float** out1,
                         bool profile_eager);
  // Captures `launch` into graphs_[key] (nothing added when it fails).
  Status capture_graph(const std::vector<int64_t>& key,
                       const std::function<Status()>& launch,
                       float** out0,
                       float** out1);
  Status ensure_pool(const state::PageArena& arena);
  Status ensure_device_buffer(void** buf, int64_t* cap, int64_t bytes, const char* what);
  Status launch_all(Launch& L);
  // The MTP block over the catch-up positions of drafting items without drafts
  // (DraftItem::catch_up, num_steps 0), one eager pass without the head (mtp_draft.cc).
  Status mtp_catch_up_only(std::span<backend::DraftItem> items,
                           const std::vector<size_t>& which,
                           const state::PageArena& arena);
  // Copies the plan's host arrays to the device (one transfer through pinned staging).
  Status upload_pack(const HostPack& pack, uint8_t** dev);
  // head_refs (>= 0): the head runs over head_rows rows gathered from the block's output (local
  // refs into it) instead of over every row (a drafting call's first pass with catch-up rows).
  Status launch_mtp(const PassPlan& plan,
                    int32_t src_refs,
                    int32_t broadcast,
                    const float* local,
                    uint8_t* pack,
                    const HostPack& hp,
                    float* streams_out,
                    float** logits,
                    int32_t head_refs = -1,
                    int64_t head_rows = 0);
  // The post step of the last sub-layer, carried to the next sub-layer's mixing kernel
  // (cuda::HcPending) in one of two buffer sets; launch_layer applies it itself when told the
  // layer is the last of its stack. Allocated outside the layers' workspace scopes.
  struct HcCarry {
    float* f[2] = {};
    float* post[2] = {};
    float* comb[2] = {};
    int next = 0;          // the buffer set of the next sub-layer
    bool pending = false;  // set 1 - next holds a post step not yet applied to x
  };
  Status alloc_hc_carry(int64_t n, HcCarry* carry);
  Status launch_layer(const DLayer& w,
                      const model::LayerPlan& plan,
                      const LayerPass& lp,
                      int64_t n,
                      const int32_t* tokens,
                      const int64_t* positions,
                      uint8_t* pack,
                      const HostPack& hp,
                      float** x,
                      float** x_alt,
                      HcCarry* carry,
                      bool flush);
  Status launch_attention(const DAttention& w,
                          const model::LayerPlan& plan,
                          const LayerPass& lp,
                          int64_t n,
                          const int64_t* positions,
                          uint8_t* pack,
                          const HostPack& hp,
                          const float* u,
                          float* f);
  Status launch_compressor(const DCompressor& w,
                           const model::LayerPlan& plan,
                           const CompressorPlan& cp,
                           bool index,
                           int64_t n,
                           const int64_t* positions,
                           uint8_t* pack,
                           const HostPack& hp,
                           const float* u,
                           const cuda::Bf16SplitActs* us,
                           cudaStream_t s);
  // The pass's attention key lists, expanded on the device (paged.h: launch_expand_keys).
  Status expand_keys(const PassPlan& plan, uint8_t* pack, const HostPack& hp);
  Status fp8_experts(const cuda::ExpertFfnParams& p,
                     WeightFormat format,
                     bool gemv,
                     const cuda::Fp8Acts& xq,
                     cudaStream_t s);
  Status launch_moe(const DMoe& w,
                    const model::LayerPlan& plan,
                    int64_t n,
                    const int32_t* tokens,
                    const float* u,
                    float* f);
  Status launch_routed_ep(const DMoe& w,
                          int64_t n,
                          const float* u,
                          const int32_t* ids,
                          const float* gates,
                          const float* shared,
                          float* f);
  Status launch_head(
      const DHyperConn& hc_head, const float* norm, const float* x, int64_t rows, float* logits);
  const float* inv_freq(model::RopeTable t) const {
    return t == model::RopeTable::kMain ? weights_->inv_freq_main : weights_->inv_freq_compress;
  }
  bool q8() const { return numerics_ == model::Numerics::kDeepSeek; }
  bool records() const { return row_format_ == state::RowFormat::kRecord; }
  // Row widths (floats) of the state's K=V rows and index keys.
  int64_t kv_width() const { return state::kv_row_floats(config_, row_format_); }
  int64_t index_width() const { return state::index_row_floats(config_, row_format_); }
  LinearCtx lin() const;  // forward_launch.cc
  // Whether this MoE call of n tokens takes the grouped wgmma path (moe_sm90.h).
  static constexpr int64_t kMoeSm90MinTokens = 128;
  bool use_moe_sm90(const DMoe& w, int64_t n) const;
  // On that path, the W4A8 GEMMs rather than the FP8 copy (a layer may have both).
  static constexpr int64_t kW4a8MaxMeanPairs = 32;
  bool use_moe_w4a8(const DMoe& w, int64_t n) const;
  bool use_moe_sm90_rows(int64_t n) const;
  Status moe_sm90_scratch(cuda::MoeSm90Params* p);  // from the workspace, 256-byte aligned

  model::ModelConfig config_;
  model::Numerics numerics_;
  state::RowFormat row_format_ = state::RowFormat::kFloat;
  CudaModelOptions options_;
  std::unique_ptr<DeviceWeights> weights_;
  std::optional<parallel::ExpertPartition> partition_;  // set with options_.comm
  device::Stream stream_;
  SideStreams sides_;
  std::unique_ptr<ThreadPool> plan_pool_;  // null: plans on the calling thread
  std::unique_ptr<Workspace> ws_;
  // The device mirror of each arena this model has seen: pool_/arena_ are the current one.
  std::map<const state::PageArena*, StatePool> pools_;
  const state::PageArena* arena_ = nullptr;
  float* pool_ = nullptr;
  AsyncPageReads reads_;  // drained before a pool moves or is freed
  // write_state_pages: queued on stream_ without waiting (stream order protects the pool,
  // including its growth, which copies on stream_); drained before the pools are freed.
  AsyncPageWrites writes_;
  void* pack_dev_ = nullptr;
  int64_t pack_cap_ = 0;
  device::PinnedBuffer pinned_;
  device::PinnedBuffer logits_pinned_;  // logits (and MTP logits) copied back, reused
  DeviceSampler sampler_;
  // Drafting (mtp_draft.cc): every step's picks on the device, and their copy back.
  void* draft_picks_ = nullptr;
  int64_t draft_picks_cap_ = 0;
  device::PinnedBuffer draft_results_;
  void* draft_streams_[2] = {nullptr, nullptr};  // MTP drafting: a step's streams, ping-pong
  // A drafting call's drafts left on the device (DraftItem::deferred): where each sequence's
  // picks lie in draft_picks_ and where its item wants them written once draft_results_ holds
  // their copy. complete_deferred_drafts() waits for that copy (stream order: after everything
  // queued so far) and writes them.
  backend::DeferredDrafts deferred_;
  Status complete_deferred_drafts();
  // Tokens a forward takes on the device (item active[k]'s tokens at rows spans[k].begin ...):
  // the drafts a drafting call left there (ForwardOptions::device_drafts: tokens 1..k, from
  // draft_picks_) and the previous forward's picks (ForwardOptions::device_token: token 0, from
  // the sampler's output). Each kind's source indices and token rows in the plan's pack.
  struct TokenScatter {
    int32_t src = -1, dst = -1;  // pack arrays
    int64_t n = 0;               // 0: none (nothing added)
  };
  void plan_token_scatters(std::span<const backend::ForwardItem> items,
                           std::span<const size_t> active,
                           std::span<const SeqSpan> spans,
                           HostPack& pack,
                           TokenScatter* drafts,
                           TokenScatter* picks) const;
  Status forward_batch_impl(std::span<backend::ForwardItem> items);
  // Asynchronous scheduling: the picks a forward left on the device (ForwardOptions::may_defer),
  // by sequence (sorted: a later forward's device tokens look their rows up) and by output.
  struct DeferredPicks {
    std::vector<std::pair<const state::SequenceState*, int64_t>> rows;  // sequence -> pick row
    std::vector<std::pair<backend::ForwardOutputs*, size_t>> outs;      // output -> pick row
    int which = 0;         // the sampler's buffer set (DeviceSampler::result)
    int window = 0;        // the forward's timing window, accounted once the picks are in
    bool decode = false;   // ... as a decode-shaped one
    bool pending = false;  // outputs not written yet
    int64_t find(const state::SequenceState* st) const;  // its pick row, -1: none
  };
  // picks_: the latest forward's (pending until written); prior_picks_: during a forward, the
  // previous one's, whose rows its device tokens read and which it writes out after its launch.
  DeferredPicks picks_, prior_picks_;
  cudaEvent_t picks_ready_[2] = {nullptr, nullptr};  // per sampler set: its results are home
  Status deliver_picks(DeferredPicks& p);
  // Set by upload_pack after its copy from pinned_ is queued: the next upload_pack waits for it
  // before it writes pinned_ again (a deferred drafting call returns with its copy queued).
  cudaEvent_t staging_free_ = nullptr;
  // A drafting call left its launches open (deferred drafts): the next forward's timing window
  // starts at that call's start instead (mark_launch_start keeps it).
  bool launch_open_ = false;
  // The current call's host phases (CudaModelStats::host_*_ms): its start and the ends of its
  // first three phases (host_mark), added to the stats at its end when it was decode-shaped.
  struct HostPhases {
    std::chrono::steady_clock::time_point t[4];
    int reached = 0;  // phases ended so far
    // Inside `before` (a forward's, run_batch): where its checks end and its plan is laid out.
    std::chrono::steady_clock::time_point checked, planned;
    bool has_parts = false;
  };
  HostPhases host_phases_;
  std::vector<const state::SequenceState*> seen_states_;  // forward_batch_impl's scratch
  void host_begin();
  void host_mark(int phase);  // phase 1..3 ends now (its first mark; later ones are ignored)
  void host_end(bool decode);
  bool call_decode_ = false;  // the current call is decode-shaped (run_batch, drafting)
  Status mtp_draft_impl(std::span<backend::DraftItem> items);
  int64_t draft_cap_[2] = {0, 0};
  // Decode graphs by layout; invalidated when a buffer they point into moves.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    float* logits = nullptr;  // where the captured launches leave their outputs
    float* mtp_logits = nullptr;
  };
  std::map<std::vector<int64_t>, Graph> graphs_;
  std::map<std::vector<int64_t>, int> seen_;
  // (padded sequences, tokens per sequence) of the main passes with a captured graph (any layout:
  // the plan's array layout also moves with the contexts' power-of-two bounds).
  std::set<std::pair<int64_t, int64_t>> warm_shapes_;
  void clear_graphs();
  Status mark(size_t i);
  CudaModelStats stats_;
  bool profile_ = false;
  bool decode_step_ = false;  // the batch being launched is one token per sequence
  HostPack spare_pack_;       // the plan pack's storage, kept from forward to forward
  bool profiling_now_ = false;
  std::vector<cudaEvent_t> events_;
  // CudaModelStats::decode_gpu_ms / decode_idle_ms: each launch window's (a forward's or drafting
  // call's work, from the plan's upload to the last result copy) start and end events, in a ring
  // of three (a forward whose picks are deferred is accounted during the next call, after that
  // call's window started), and the last accounted decode window (-1: the call before was not
  // decode-shaped). Events not created (an error): nothing measured.
  cudaEvent_t win_start_[3] = {nullptr, nullptr, nullptr};
  cudaEvent_t win_end_[3] = {nullptr, nullptr, nullptr};
  bool win_events_ = false;
  int win_ = 0;
  int prev_win_ = -1;
  void mark_launch_start();
  void mark_launch_end();
  // After the window's work is done: its GPU time and the idle gap since the previous one.
  void account_decode_gap(bool decode) { account_window(decode, win_); }
  void account_window(bool decode, int window);
  std::vector<float> profile_ms_;
};

}  // namespace dsinfer::gpu
