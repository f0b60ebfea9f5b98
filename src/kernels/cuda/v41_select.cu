// V4.1's two-level top-k on the GPU (v41.h): candidate block scores, the pool mask and its use,
// empty selections dropped; plus the small row update the MoE and the router use.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/v41.h"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;
constexpr float kBf16Max = 3.38953139e38f;

#define GRID_STRIDE(i, total)                                                                \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (total); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void v41_block_scores_kernel(V41BlockScoreParams p, int64_t nb) {
  GRID_STRIDE(i, p.nq * nb) {
    const int64_t q = i / nb, b = i % nb;
    const int64_t vis = p.visible[q];
    const int64_t end = min(min(vis, p.n_keys), (b + 1) * p.block_size);
    float m = -INFINITY;
    for (int64_t g = b * p.block_size; g < end; ++g) m = fmaxf(m, p.scores[q * p.ld + g]);
    if (p.cap_bf16)
      m = fminf(m, kBf16Max);
    if (vis > 0 && b == (min(vis, p.n_keys) - 1) / p.block_size)
      m = INFINITY;
    p.out[i] = m;
  }
}

__global__ void v41_pool_mask_kernel(V41PoolMaskParams p) {
  GRID_STRIDE(i, p.nq * p.k) {
    const int64_t q = i / p.k;
    const int32_t b = p.blocks[i];
    if (b < 0 || b >= p.n_blocks || p.block_scores[q * p.n_blocks + b] == -INFINITY)
      continue;
    const int64_t end = min(p.n_keys, (static_cast<int64_t>(b) + 1) * p.block_size);
    for (int64_t g = static_cast<int64_t>(b) * p.block_size; g < end; ++g)
      p.keep[q * p.n_keys + g] = 1;
  }
}

__global__ void v41_apply_mask_kernel(V41ApplyMaskParams p) {
  GRID_STRIDE(i, p.nq * p.n_keys) {
    const int64_t q = i / p.n_keys, g = i % p.n_keys;
    if (p.keep[i] == 0)
      p.scores[q * p.ld + g] = -INFINITY;
  }
}

__global__ void v41_drop_empty_kernel(V41DropEmptyParams p) {
  GRID_STRIDE(i, p.nq * p.k) {
    const int64_t q = i / p.k;
    const int32_t g = p.idx[i];
    if (g >= 0 && p.scores[q * p.ld + g] == -INFINITY)
      p.idx[i] = -1;
  }
}

__global__ void v41_axpy_kernel(V41AxpyParams p) {
  GRID_STRIDE(i, p.n) {
    const float v = p.y[i] / p.div;
    p.y[i] = p.add ? v + p.add[i] : v;
  }
}

unsigned grid_for(int64_t total) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(total, kThreads), 1, kMaxBlocks));
}

}  // namespace

Status launch_v41_block_scores(const V41BlockScoreParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("v41_block_scores", {p.nq, p.n_keys, p.ld}));
  DSI_RETURN_IF_ERROR(require(p.block_size >= 1, "v41_block_scores", "block_size < 1"));
  const int64_t nb = ceil_div(p.n_keys, p.block_size);
  if (p.nq == 0 || nb == 0)
    return Status();
  if (!p.scores || !p.visible || !p.out)
    return null_pointer("v41_block_scores");
  v41_block_scores_kernel<<<grid_for(p.nq * nb), kThreads, 0, stream>>>(p, nb);
  return launched("v41_block_scores launch");
}

Status launch_v41_pool_mask(const V41PoolMaskParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("v41_pool_mask", {p.nq, p.k, p.n_blocks, p.n_keys}));
  DSI_RETURN_IF_ERROR(require(p.block_size >= 1, "v41_pool_mask", "block_size < 1"));
  if (p.nq == 0 || p.n_keys == 0)
    return Status();
  if (!p.keep || (p.k > 0 && (!p.blocks || !p.block_scores)))
    return null_pointer("v41_pool_mask");
  DSI_RETURN_IF_ERROR(device::check_cuda(
      cudaMemsetAsync(p.keep, 0, static_cast<size_t>(p.nq * p.n_keys), stream), "v41_pool_mask"));
  if (p.k == 0)
    return Status();
  v41_pool_mask_kernel<<<grid_for(p.nq * p.k), kThreads, 0, stream>>>(p);
  return launched("v41_pool_mask launch");
}

Status launch_v41_apply_mask(const V41ApplyMaskParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("v41_apply_mask", {p.nq, p.n_keys, p.ld}));
  if (p.nq == 0 || p.n_keys == 0)
    return Status();
  if (!p.scores || !p.keep)
    return null_pointer("v41_apply_mask");
  v41_apply_mask_kernel<<<grid_for(p.nq * p.n_keys), kThreads, 0, stream>>>(p);
  return launched("v41_apply_mask launch");
}

Status launch_v41_drop_empty(const V41DropEmptyParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("v41_drop_empty", {p.nq, p.k, p.ld}));
  if (p.nq == 0 || p.k == 0)
    return Status();
  if (!p.idx || !p.scores)
    return null_pointer("v41_drop_empty");
  v41_drop_empty_kernel<<<grid_for(p.nq * p.k), kThreads, 0, stream>>>(p);
  return launched("v41_drop_empty launch");
}

Status launch_v41_axpy(const V41AxpyParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("v41_axpy", {p.n}));
  if (p.n == 0)
    return Status();
  if (!p.y)
    return null_pointer("v41_axpy");
  v41_axpy_kernel<<<grid_for(p.n), kThreads, 0, stream>>>(p);
  return launched("v41_axpy launch");
}

}  // namespace dsinfer::cuda
