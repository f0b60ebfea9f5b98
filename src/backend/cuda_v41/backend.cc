// CudaV41Backend: opening, the device pool of state pages, per-forward scratch and staging, and
// the thin launch wrappers the forward (forward.cc) chains.
#include "backend/cuda_v41/backend.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cuda/launch_helpers.h"
#include "backend/cuda/select_device.h"
#include "base/check.h"
#include "base/strings.h"
#include "device/device_error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/paged.h"
#include "kernels/cuda/v41.h"

namespace dsinfer::gpu_v41 {

namespace {
constexpr int64_t kStagingChunk = int64_t{8} << 20;
int64_t align256(int64_t v) {
  return (v + 255) / 256 * 256;
}
}  // namespace

Result<std::unique_ptr<CudaV41Backend>> CudaV41Backend::open(
    const std::string& dir,
    const cpu_v41::V41BackendOptions& options,
    const CudaV41Options& cuda_options) {
  DSI_RETURN_IF_ERROR(gpu::select_device(cuda_options.device));
  std::unique_ptr<CudaV41Backend> b(new CudaV41Backend());
  // The `device` Engram placement: the CPU backend's store maps the tables (no host copy); they
  // are read from the map once, by the upload below.
  cpu_v41::V41BackendOptions cpu_options = options;
  const bool device_tables = options.engram.placement == cpu_v41::EngramPlacement::kDevice;
  if (device_tables)
    cpu_options.engram.placement = cpu_v41::EngramPlacement::kMapped;
  DSI_ASSIGN_OR_RETURN(b->cpu_, cpu_v41::V41Backend::open(dir, cpu_options));
  b->c_ = &b->cpu_->checkpoint().config();
  b->keep_rows_ = options.prefill_keep_rows;
  const model_v41::V41Config& c = *b->c_;
  const cpu_v41::V41CpuModel& m = b->cpu_->v41();
  if (c.hc_mult < 1 || (2 + c.hc_mult) * c.hc_mult > 32)
    return invalid_argument("the CUDA V4.1 backend supports hc_mult 1..4");
  b->dspark_ = m.has_dspark();
  DSI_ASSIGN_OR_RETURN(b->weights_, V41DeviceWeights::upload(c, m.weights(), b->dspark_));
  if (device_tables || cuda_options.engram_both)
    DSI_RETURN_IF_ERROR(b->weights_->upload_engram_tables(c, m.weights()));
  b->engram_on_device_ = device_tables;
  b->dspark_target_index_.assign(static_cast<size_t>(c.num_hidden_layers), -1);
  for (size_t i = 0; i < c.dspark_target_layer_ids.size(); ++i) {
    b->dspark_target_index_[static_cast<size_t>(c.dspark_target_layer_ids[i])] =
        static_cast<int>(i);
  }
  DSI_ASSIGN_OR_RETURN(b->stream_, device::Stream::create(true));
  b->alloc_ = std::make_unique<device::CachingAllocator>();
  return b;
}

CudaV41Backend::~CudaV41Backend() {
  (void)reads_.drain();  // no background read may outlive the pools
  (void)writes_.drain();
  if (stream_.valid())
    (void)cudaStreamSynchronize(stream_.get());
  temps_.clear();
  kept_.clear();
  for (auto& [arena, pool] : pools_) (void)cudaFree(pool.p);
}

Status CudaV41Backend::set_engram_on_device(bool on) {
  if (on && weights_->engram_tables.size() != c_->engram_layer_ids.size()) {
    return Status(StatusCode::kFailedPrecondition,
                  "the Engram tables are not on the device (open the CUDA V4.1 backend with the "
                  "`device` Engram placement or CudaV41Options::engram_both)");
  }
  engram_on_device_ = on;
  return Status();
}

Status CudaV41Backend::health() const {
  return device::check_cuda(cudaGetLastError(), "CUDA V4.1 backend");
}

Status CudaV41Backend::ensure_pool(const state::PageArena& arena) {
  gpu::StatePool& pool = pools_[&arena];
  if (pool.pages < arena.num_pages())
    DSI_RETURN_IF_ERROR(reads_.drain());  // the pool is about to move
  bool grew = false;
  DSI_RETURN_IF_ERROR(gpu::grow_state_pool(&pool, arena, stream_.get(), "V4.1 state pool", &grew));
  pool_ = pool.p;
  page_floats_ = arena.page_floats();
  return Status();
}

Status CudaV41Backend::copy_state_pages(const state::PageArena& arena,
                                        const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  if (pairs.empty())
    return Status();
  DSI_RETURN_IF_ERROR(ensure_pool(arena));
  reads_.check_not_reading(pairs, "copy_state_pages");
  return gpu::copy_pool_pages(pool_, page_floats_, pairs, stream_.get());
}

Status CudaV41Backend::read_state_pages(const state::PageArena& arena,
                                        std::span<const int32_t> pages,
                                        float* dst) {
  DSI_RETURN_IF_ERROR(ensure_pool(arena));
  return gpu::read_pool_pages(pool_, page_floats_, pages, dst, stream_.get());
}

Status CudaV41Backend::write_state_pages(state::PageArena& arena,
                                         std::span<const int32_t> pages,
                                         const float* src) {
  DSI_RETURN_IF_ERROR(ensure_pool(arena));
  reads_.check_not_reading(pages, "write_state_pages");
  // Queued on the compute stream without waiting: the next forward reads the pages after it.
  return writes_.write(pool_, page_floats_, pages, src, stream_.get());
}

Result<int64_t> CudaV41Backend::begin_read_state_pages(const state::PageArena& arena,
                                                       std::span<const int32_t> pages,
                                                       float* dst) {
  DSI_RETURN_IF_ERROR(ensure_pool(arena));
  return reads_.begin(pool_, page_floats_, pages, dst, stream_.get());
}

template <typename T>
Result<T*> CudaV41Backend::tmp(int64_t count, bool keep) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
  DSI_ASSIGN_OR_RETURN(device::DeviceBuffer buf,
                       device::DeviceBuffer::allocate(*alloc_, bytes, stream_.get()));
  T* p = buf.as<T>();
  (keep ? kept_ : temps_).push_back(std::move(buf));
  return p;
}

Result<void*> CudaV41Backend::upload_bytes(const void* src, int64_t bytes) {
  const int64_t room = align256(std::max<int64_t>(bytes, 1));
  // Staging chunks stay alive until the pass ends (the copies read them asynchronously).
  if (staging_.empty() || staging_used_ + room > static_cast<int64_t>(staging_.back().size())) {
    DSI_ASSIGN_OR_RETURN(
        device::PinnedBuffer pb,
        device::PinnedBuffer::allocate(static_cast<size_t>(std::max(room, kStagingChunk))));
    staging_.push_back(std::move(pb));
    staging_used_ = 0;
  }
  auto* host = static_cast<uint8_t*>(staging_.back().get()) + staging_used_;
  staging_used_ += room;
  if (bytes > 0)
    std::memcpy(host, src, static_cast<size_t>(bytes));
  DSI_ASSIGN_OR_RETURN(uint8_t * dev, tmp<uint8_t>(room));
  if (bytes > 0) {
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpyAsync(
            dev, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_.get()),
        "staging forward data"));
  }
  return static_cast<void*>(dev);
}

template <typename T>
Result<T*> CudaV41Backend::upload(const std::vector<T>& v) {
  DSI_ASSIGN_OR_RETURN(void* p, upload_bytes(v.data(), static_cast<int64_t>(v.size() * sizeof(T))));
  return static_cast<T*>(p);
}

template Result<float*> CudaV41Backend::tmp<float>(int64_t, bool);
template Result<int32_t*> CudaV41Backend::tmp<int32_t>(int64_t, bool);
template Result<int64_t*> CudaV41Backend::tmp<int64_t>(int64_t, bool);
template Result<uint8_t*> CudaV41Backend::tmp<uint8_t>(int64_t, bool);
template Result<float*> CudaV41Backend::upload<float>(const std::vector<float>&);
template Result<int32_t*> CudaV41Backend::upload<int32_t>(const std::vector<int32_t>&);
template Result<int64_t*> CudaV41Backend::upload<int64_t>(const std::vector<int64_t>&);

void CudaV41Backend::recycle_staging() {
  // The stream is idle: every staged copy is done. Keep the largest chunk.
  if (staging_.size() > 1) {
    auto big = std::max_element(staging_.begin(), staging_.end(), [](const auto& a, const auto& b) {
      return a.size() < b.size();
    });
    device::PinnedBuffer keep = std::move(*big);
    staging_.clear();
    staging_.push_back(std::move(keep));
  }
  staging_used_ = 0;
}

void CudaV41Backend::end_pass() {
  // Called once the stream is idle: scratch back to the cache, staging kept (one chunk).
  temps_.clear();
  kept_.clear();
  recycle_staging();
}

Status CudaV41Backend::rms(float* x, int64_t rows, int64_t dim, const float* weight) {
  return gpu::rms_norm(x, rows, dim, weight, static_cast<float>(c_->rms_norm_eps), stream_.get());
}

Status CudaV41Backend::collapse(const float* x, const float* pi, int64_t n, float* out, bool mean) {
  cuda::V41CollapseParams p;
  p.x = x;
  p.pi = pi;
  p.n = n;
  p.hc = c_->hc_mult;
  p.hidden = c_->hidden_size;
  p.mean = mean;
  p.out = out;
  return cuda::launch_v41_collapse(p, stream_.get());
}

Status CudaV41Backend::quant(float* x, int64_t rows, int64_t len, cuda::V41Quant kind, bool clamp) {
  cuda::V41QuantParams p;
  p.x = x;
  p.rows = rows;
  p.len = len;
  p.kind = kind;
  p.clamp_scale = clamp;
  return cuda::launch_v41_quant(p, stream_.get());
}

Status CudaV41Backend::gather(
    const float* local, const int64_t* refs, int64_t n, int64_t width, float* dst) {
  cuda::GatherRowsParams p;
  p.local = local;
  p.src_refs = refs;
  p.n = n;
  p.width = width;
  p.dst = dst;
  return cuda::launch_gather_rows(p, stream_.get());
}

Status CudaV41Backend::top_k(
    const float* scores, int64_t ld, const int64_t* count, int64_t nq, int64_t k, int32_t* out) {
  cuda::TopKParams p;
  p.scores = scores;
  p.ld = ld;
  p.n = count;
  p.nq = nq;
  p.k = k;
  p.out = out;
  return cuda::launch_top_k(p, stream_.get());
}

Status CudaV41Backend::copy_rows(void* dst,
                                 int64_t dst_pitch,
                                 const void* src,
                                 int64_t src_pitch,
                                 int64_t width,
                                 int64_t rows,
                                 const char* what) {
  return device::check_cuda(cudaMemcpy2DAsync(dst,
                                              static_cast<size_t>(dst_pitch),
                                              src,
                                              static_cast<size_t>(src_pitch),
                                              static_cast<size_t>(width),
                                              static_cast<size_t>(rows),
                                              cudaMemcpyDeviceToDevice,
                                              stream_.get()),
                            what);
}

Status CudaV41Backend::axpy(float* y, const float* add, int64_t n, float div) {
  cuda::V41AxpyParams p;
  p.y = y;
  p.add = add;
  p.div = div;
  p.n = n;
  return cuda::launch_v41_axpy(p, stream_.get());
}

Status CudaV41Backend::linear(
    const MatrixRef& w, const float* x, int64_t n, float* y, int64_t ldy) {
  // Few rows over BF16 weights (the head, router, compressor and indexer projections in decode):
  // the bandwidth-bound GEMV; everything else on the tile kernel over any weight format.
  if (n <= cuda::kGemvMaxTokens && cuda::gemv_supports(w) &&
      (reinterpret_cast<uintptr_t>(x) & 15u) == 0) {
    cuda::GemvParams g;
    g.w = w;
    g.x = x;
    g.n = n;
    g.y = y;
    g.ldy = ldy;
    return cuda::launch_gemv_bf16(g, stream_.get());
  }
  cuda::LinearParams p;
  p.w = w;
  p.x = x;
  p.n = n;
  p.y = y;
  p.ldy = ldy;
  return cuda::launch_linear(p, stream_.get());
}

Status CudaV41Backend::rope(float* x,
                            int64_t tokens,
                            int64_t heads,
                            int64_t dim,
                            const int64_t* pos,
                            const float* inv,
                            bool inverse) {
  return gpu::rope(
      x, tokens, heads, dim, pos, inv, c_->qk_rope_head_dim / 2, inverse, stream_.get());
}

Status CudaV41Backend::scatter(const float* src,
                               int64_t n,
                               int64_t width,
                               int64_t ld_src,
                               const std::vector<int64_t>& dest_offsets) {
  if (n == 0)
    return Status();
  DSI_CHECK(static_cast<int64_t>(dest_offsets.size()) == n,
            "scatter: %lld destinations for %lld",
            static_cast<long long>(dest_offsets.size()),
            static_cast<long long>(n));
  DSI_ASSIGN_OR_RETURN(int64_t * refs, upload(dest_offsets));
  cuda::ScatterRowsParams p;
  p.src = src;
  p.n = n;
  p.width = width;
  p.ld_src = ld_src;
  p.pool = pool_;
  p.dest_refs = refs;
  return cuda::launch_scatter_rows(p, stream_.get());
}

}  // namespace dsinfer::gpu_v41
