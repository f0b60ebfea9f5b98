// CudaV41Backend: DeepSeek V4.1 behind the engine's backend seam (backend::Model) on one GPU.
// The checkpoint, its validation, the engine view, the state layout, the Engram hashing and the
// Engram tables (host memory or mapped, cpu_v41::EngramStore) come from the CPU V4.1 backend it
// opens (with the `device` Engram placement the tables are uploaded and gathered on the GPU); the
// forward runs on the device over the engine's paged state, mirrored in one device pool (the
// PageArena hands out page ids only), with the weights uploaded once in their checkpoint formats.
//
// The forward follows V41CpuModel's order of operations step by step (cuda_v41/forward.cc) on
// the V4 kernels where the math is the same (linears over every weight format, sink attention over
// key lists, RMSNorm, RoPE, indexer scores, top-k, MoE routing / grouping / experts / combine,
// row scatter) and on kernels/cuda/v41.h where V4.1 differs. Prefill early exit (bounded replay)
// as on the CPU. The sequences of a batch run as one pass (their rows side by side); no CUDA
// graphs; the DSpark drafter runs on the device too (greedy drafts).
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu_v41/backend.h"
#include "backend/cuda/state_pool.h"
#include "backend/cuda_v41/device_weights.h"
#include "backend/model.h"
#include "device/allocator.h"
#include "device/stream.h"
#include "kernels/cuda/v41.h"

namespace dsinfer::gpu_v41 {

struct CudaV41Options {
  int device = 0;
  // Upload the Engram tables to the device whatever the placement (the host placements keep
  // their store too), so set_engram_on_device can switch the gather per forward: `bench
  // --engram-compare` times host and device placement in one process.
  bool engram_both = false;
};

class CudaV41Backend final : public backend::Model {
 public:
  static Result<std::unique_ptr<CudaV41Backend>> open(const std::string& dir,
                                                      const cpu_v41::V41BackendOptions& options,
                                                      const CudaV41Options& cuda_options = {});
  ~CudaV41Backend() override;

  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const backend::ForwardOptions& options,
                 backend::ForwardOutputs* out) override;
  // Several sequences in one pass (their rows side by side in every kernel); items with prefill
  // early exit run one at a time. DSINFER_V41_BATCH=0 runs every item alone.
  Status forward_batch(std::span<backend::ForwardItem> items) override;
  // The V4.1 forward itself (as V41CpuModel::forward over a state of v41_state_shape).
  Status forward_v41(state::SequenceState& st,
                     std::span<const int32_t> tokens,
                     const cpu_v41::PrefillExit* exit,
                     cpu_v41::ForwardResult* result,
                     bool last_logits_only);
  const state::StateShape* state_shape() const override { return cpu_->state_shape(); }
  Result<backend::PrefixCacheLayout> prefix_cache_layout() const override {
    return cpu_->prefix_cache_layout();
  }
  Status check_prompt(std::span<const int32_t> tokens) const override {
    return cpu_->check_prompt(tokens);
  }
  int32_t text_prompt_bos() const override { return cpu_->text_prompt_bos(); }
  state::PageArena::Storage state_storage() const override {
    return state::PageArena::Storage::kNone;
  }
  Status copy_state_pages(const state::PageArena& arena,
                          const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
  Status read_state_pages(const state::PageArena& arena,
                          std::span<const int32_t> pages,
                          float* dst) override;
  // Queued on the forward stream without waiting (gpu::AsyncPageWrites), as CudaModel's.
  Status write_state_pages(state::PageArena& arena,
                           std::span<const int32_t> pages,
                           const float* src) override;
  // Background reads (gpu::AsyncPageReads), as CudaModel's.
  bool async_state_reads() const override { return true; }
  Result<int64_t> begin_read_state_pages(const state::PageArena& arena,
                                         std::span<const int32_t> pages,
                                         float* dst) override;
  Result<bool> poll_state_read(int64_t ticket) override { return reads_.poll(ticket); }
  Status wait_state_read(int64_t ticket) override { return reads_.wait(ticket); }
  Status health() const override;
  // The DSpark drafter on the device (dspark_draft.cc): greedy drafts and their confidences, as
  // the CPU backend's; blocks of up to max backtracking - 1 tokens; 0 without DSpark blocks.
  int32_t block_draft_size() const override;
  Status block_draft_batch(std::span<backend::BlockDraftItem> items, int32_t block) override;
  const char* name() const override { return "cuda-v41"; }
  const model::ModelConfig& config() const override { return cpu_->config(); }
  model::Numerics numerics() const override { return cpu_->numerics(); }
  const cpu_v41::V41Backend& cpu() const { return *cpu_; }
  int64_t weight_bytes() const { return weights_->bytes(); }
  // Where the forward takes its Engram rows from: the device tables (gathered by a kernel on the
  // forward stream) or the host store (gathered on its helper thread, then copied). True from
  // open with the `device` placement; set_engram_on_device(true) needs the tables uploaded (the
  // `device` placement or CudaV41Options::engram_both), else FailedPrecondition. Under the
  // `device` placement the host store is the checkpoint's memory map.
  bool engram_on_device() const { return engram_on_device_; }
  Status set_engram_on_device(bool on);
  int64_t engram_device_bytes() const { return weights_->engram_table_bytes(); }

 private:
  CudaV41Backend() = default;
  struct Pass;
  struct Shared;
  Status ensure_pool(const state::PageArena& arena);
  // Scratch of one forward on the device: released at the end of the layer that took it (the
  // allocator's reuse is stream-ordered, and everything runs on one stream), or with `keep` at
  // the end of the forward (values passed between layers). Host arrays are staged through pinned
  // memory into scratch.
  template <typename T>
  Result<T*> tmp(int64_t count, bool keep = false);
  template <typename T>
  Result<T*> upload(const std::vector<T>& v);
  Result<void*> upload_bytes(const void* src, int64_t bytes);
  void end_pass();
  void recycle_staging();

  // One item of a pass: a sequence's chunk, validated and reserved.
  struct Item {
    state::SequenceState* st = nullptr;
    std::span<const int32_t> tokens;
    const cpu_v41::PrefillExit* exit = nullptr;
    bool last_only = false;
    cpu_v41::ForwardResult* result = nullptr;
  };
  // Checks and reserves one item (the CPU backend's checks, in its order).
  Status prepare(const Item& it);
  // Runs prepared items as one pass (rows of all items, token-major); early exit only for a
  // single item. A failure is a device failure (the items' states are then unusable).
  Status run_pass(std::span<Item> items);
  Status layer(int l, Pass& ps, Shared& sh);
  Status attention(
      int l, Pass& ps, const float* x, float* out, Shared& sh, bool compressed_already);
  Status compress(int l, const Pass& ps, const float* x);
  Status indexer(int l, const Pass& ps, const float* x, const float* q_res, Shared& sh);
  Status moe(const DMoe& w, const float* x, int64_t n, int64_t k, float* out);
  Status engram(int l, Pass& ps);
  Status dspark_context(const Pass& ps, const Shared& sh);
  Status draft_one(const state::SequenceState& st,
                   int32_t anchor,
                   int64_t block,
                   int32_t* tokens,
                   float* confidence);
  // The step sequences the forward and the drafter share (steps.cc).
  // The streams of a chunk: X and Xalt [n, hc, hidden] (kept), the token embeddings copied into
  // every stream of X, and the carried mix pi [n, hc] (kept) one-hot on stream 0.
  struct Streams {
    float* X = nullptr;
    float* Xalt = nullptr;
    float* pi = nullptr;
  };
  Result<Streams> embed_streams(const int32_t* tokens, int64_t n);
  // One mHC site: its scratch (pre kept: the next carried mix; the sub-layer's input u and output
  // F), the mixes of X, u = the collapse of X by the carried mix pi, RMS-normed by `norm`.
  struct Site {
    float* pre = nullptr;
    float* post = nullptr;
    float* comb = nullptr;
    float* u = nullptr;
    float* F = nullptr;
  };
  Result<Site> site_in(
      const DHc& hs, const float* norm, const float* X, const float* pi, int64_t n);
  // The post step of a site: x_out = post * F + comb-mix of X.
  Status site_out(const Site& site, const float* X, int64_t n, float* x_out);
  // The attention's projections of x: the normed query residual q_res, the queries q and the KV
  // row kv (normed, RoPE'd at pos with inv, kv FP8-simulated as the window stores it).
  struct Qkv {
    float* q_res = nullptr;
    float* q = nullptr;
    float* kv = nullptr;
  };
  Result<Qkv> attn_qkv(
      const DAttention& a, const float* x, int64_t n, const int64_t* pos, const float* inv);
  // Sink attention of the queries over their key lists (key_begin / key_refs into the pool and
  // the local kv), the inverse RoPE on the output; returns it [n, heads, head_dim].
  Result<float*> attend(const DAttention& a,
                        const Qkv& t,
                        int64_t n,
                        const int64_t* key_begin,
                        const int64_t* key_refs,
                        const int64_t* pos,
                        const float* inv);
  // The grouped low-rank output: wo_a per group of heads, then wo_b into out.
  Status attn_out(const DAttention& a, const float* o, int64_t n, float* out);

  // Thin launch wrappers (backend.cc).
  Status rms(float* x, int64_t rows, int64_t dim, const float* weight);
  // out = the collapse of the streams x by pi (or their mean).
  Status collapse(const float* x, const float* pi, int64_t n, float* out, bool mean = false);
  // The storage simulation of a V4.1 record, in place over rows of len.
  Status quant(float* x, int64_t rows, int64_t len, cuda::V41Quant kind, bool clamp = false);
  // dst[i] = the row refs[i] of local (local references only), width wide.
  Status gather(const float* local, const int64_t* refs, int64_t n, int64_t width, float* dst);
  Status top_k(
      const float* scores, int64_t ld, const int64_t* count, int64_t nq, int64_t k, int32_t* out);
  // rows rows of `width` bytes from src (src_pitch bytes apart) into dst (dst_pitch apart), device
  // to device.
  Status copy_rows(void* dst,
                   int64_t dst_pitch,
                   const void* src,
                   int64_t src_pitch,
                   int64_t width,
                   int64_t rows,
                   const char* what);
  // y = y / div + add (add may be null).
  Status axpy(float* y, const float* add, int64_t n, float div = 1.0f);
  Status linear(const MatrixRef& w, const float* x, int64_t n, float* y, int64_t ldy = 0);
  Status rope(float* x,
              int64_t tokens,
              int64_t heads,
              int64_t dim,
              const int64_t* pos,
              const float* inv,
              bool inverse);
  Status scatter(const float* src,
                 int64_t n,
                 int64_t width,
                 int64_t ld_src,
                 const std::vector<int64_t>& dest_offsets);
  bool deepseek() const { return cpu_->numerics() == model::Numerics::kDeepSeek; }

  std::unique_ptr<cpu_v41::V41Backend> cpu_;
  const model_v41::V41Config* c_ = nullptr;
  std::unique_ptr<V41DeviceWeights> weights_;
  std::vector<int> dspark_target_index_;
  bool dspark_ = false;
  int64_t keep_rows_ = 0;  // prefill early exit: K (0 = exact prefill)
  bool engram_on_device_ = false;
  device::Stream stream_;
  std::unique_ptr<device::CachingAllocator> alloc_;
  std::vector<device::DeviceBuffer> temps_;
  std::vector<device::DeviceBuffer> kept_;
  std::vector<device::PinnedBuffer> staging_;
  int64_t staging_used_ = 0;  // bytes used in staging_.back()
  std::map<const state::PageArena*, gpu::StatePool> pools_;
  gpu::AsyncPageReads reads_;    // drained before a pool moves or is freed
  gpu::AsyncPageWrites writes_;  // write_state_pages, queued on stream_ without waiting
  float* pool_ = nullptr;
  int64_t page_floats_ = 0;
};

}  // namespace dsinfer::gpu_v41
