// Dense linear over checkpoint-format weights (gemm.h); the tile is in gemm.cuh.
#include <algorithm>

#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch_util.h"

namespace dsinfer::cuda {
namespace {

constexpr int64_t kMaxGridY = 65535;

__global__ void __launch_bounds__(kGemmThreads) linear_kernel(LinearParams p) {
  __shared__ GemmSmem sm;
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.w.cols;
  const int64_t ldy = p.ldy > 0 ? p.ldy : p.rows;
  const int64_t r0 = p.row_begin + static_cast<int64_t>(blockIdx.x) * kGemmTileR;
  const int64_t r_end = p.row_begin + p.rows;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kGemmTileT; t0 < p.n;
       t0 += static_cast<int64_t>(gridDim.y) * kGemmTileT) {
    if (threadIdx.x < kGemmTileT)
      sm.src[threadIdx.x] = t0 + threadIdx.x < p.n ? t0 + threadIdx.x : -1;
    __syncthreads();
    float acc[kGemmRowsPerThread];
    gemm_tile(p.w, r0, r_end, p.x, ldx, p.quantize_activations, sm, acc);
    const int64_t t = t0 + gemm_tile_token();
    if (t < p.n) {
#pragma unroll
      for (int j = 0; j < kGemmRowsPerThread; ++j) {
        const int64_t r = r0 + gemm_tile_row(j);
        if (r < r_end) {
          float* y = p.y + t * ldy + (r - p.row_begin);
          *y = p.accumulate ? *y + acc[j] : acc[j];
        }
      }
    }
  }
}

}  // namespace

Status launch_linear(const LinearParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_weight(p.w, "linear"));
  LinearParams q = p;
  if (q.rows < 0)
    q.rows = q.w.rows - q.row_begin;
  DSI_RETURN_IF_ERROR(check_nonneg("linear", {q.n, q.ldx, q.ldy, q.row_begin, q.rows}));
  DSI_RETURN_IF_ERROR(
      require(q.row_begin + q.rows <= q.w.rows, "linear", "row range exceeds the weight"));
  DSI_RETURN_IF_ERROR(require(q.ldx == 0 || q.ldx >= q.w.cols, "linear", "ldx < cols"));
  DSI_RETURN_IF_ERROR(require(q.ldy == 0 || q.ldy >= q.rows, "linear", "ldy < rows"));
  if (q.n == 0 || q.rows == 0)
    return Status();
  if (!q.y || (!q.x && q.w.cols > 0))
    return null_pointer("linear");
  const dim3 grid(static_cast<unsigned>(ceil_div(q.rows, kGemmTileR)),
                  static_cast<unsigned>(std::min(ceil_div(q.n, kGemmTileT), kMaxGridY)));
  if (grid.x > 0x7fffffffu)
    return invalid_argument("linear: too many output rows");
  linear_kernel<<<grid, kGemmThreads, 0, stream>>>(q);
  return launched("linear launch");
}

}  // namespace dsinfer::cuda
