// Few-token BF16 linear (gemv.h): one warp per group of kRows weight rows, lanes striding K by 8
// values (one 16-byte load per row per step, several in flight), x read through the L1 cache.
#include <algorithm>

#include "kernels/cuda/gemv.h"
#include "kernels/cuda/launch_util.h"

namespace dsinfer::cuda {
namespace {

constexpr int kRows = 4;  // weight rows per warp
constexpr int kWarps = 8;

__device__ __forceinline__ float bf16_lo(uint32_t v) {
  return __uint_as_float(v << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}

template <int N>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_bf16_kernel(GemvParams p, int64_t ldx, int64_t ldy) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * kRows;
  if (r0 >= p.w.rows)
    return;  // warp-uniform
  const int64_t K = p.w.cols;
  const uint16_t* w = static_cast<const uint16_t*>(p.w.data);
  float acc[kRows][N];
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int t = 0; t < N; ++t) acc[i][t] = 0.0f;
  for (int64_t k = static_cast<int64_t>(lane) * 8; k < K; k += 256) {
    uint4 wv[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t r = min(r0 + i, p.w.rows - 1);  // clamped rows are computed, not stored
      wv[i] = __ldg(reinterpret_cast<const uint4*>(w + r * K + k));
    }
#pragma unroll
    for (int t = 0; t < N; ++t) {
      if (t >= p.n)
        break;  // bucket padding: no such token
      const float4 x0 = __ldg(reinterpret_cast<const float4*>(p.x + t * ldx + k));
      const float4 x1 = __ldg(reinterpret_cast<const float4*>(p.x + t * ldx + k + 4));
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        float a = acc[i][t];
        a = fmaf(bf16_lo(wv[i].x), x0.x, a);
        a = fmaf(bf16_hi(wv[i].x), x0.y, a);
        a = fmaf(bf16_lo(wv[i].y), x0.z, a);
        a = fmaf(bf16_hi(wv[i].y), x0.w, a);
        a = fmaf(bf16_lo(wv[i].z), x1.x, a);
        a = fmaf(bf16_hi(wv[i].z), x1.y, a);
        a = fmaf(bf16_lo(wv[i].w), x1.z, a);
        a = fmaf(bf16_hi(wv[i].w), x1.w, a);
        acc[i][t] = a;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float v = acc[i][t];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      acc[i][t] = v;
    }
  if (lane < kRows * N) {  // lane (i, t) stores one output
    const int i = lane / N;
    const int t = lane % N;
    float v = 0.0f;
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
      for (int tt = 0; tt < N; ++tt)
        if (ii == i && tt == t)
          v = acc[ii][tt];
    const int64_t r = r0 + i;
    if (r < p.w.rows && t < p.n) {
      float* y = p.y + t * ldy + r;
      *y = p.accumulate ? *y + v : v;
    }
  }
}

template <int N>
Status launch_n(const GemvParams& p, int64_t ldx, int64_t ldy, cudaStream_t s) {
  const int64_t blocks = ceil_div(p.w.rows, kRows * kWarps);
  gemv_bf16_kernel<N><<<static_cast<unsigned>(blocks), kWarps * 32, 0, s>>>(p, ldx, ldy);
  return launched("gemv_bf16 launch");
}

}  // namespace

bool gemv_supports(const MatrixRef& w) {
  return w.format == WeightFormat::kFloat && w.dtype == DType::kBF16 && w.cols % 8 == 0 &&
         (reinterpret_cast<uintptr_t>(w.data) & 15u) == 0;
}

Status launch_gemv_bf16(const GemvParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("gemv_bf16", {p.n, p.ldx, p.ldy}));
  DSI_RETURN_IF_ERROR(require(
      gemv_supports(p.w), "gemv_bf16", "weights must be BF16 with cols % 8 == 0, 16-byte aligned"));
  DSI_RETURN_IF_ERROR(require(p.n <= kGemvMaxTokens, "gemv_bf16", "more than 8 tokens"));
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.w.cols;
  const int64_t ldy = p.ldy > 0 ? p.ldy : p.w.rows;
  DSI_RETURN_IF_ERROR(
      require(ldx >= p.w.cols && ldx % 4 == 0 && (reinterpret_cast<uintptr_t>(p.x) & 15u) == 0,
              "gemv_bf16",
              "x rows must be 16-byte aligned and >= cols"));
  DSI_RETURN_IF_ERROR(require(ldy >= p.w.rows, "gemv_bf16", "ldy < rows"));
  if (p.n == 0 || p.w.rows == 0)
    return Status();
  if (!p.y || (!p.x && p.w.cols > 0))
    return null_pointer("gemv_bf16");
  // Token-count buckets; the per-token arithmetic is the same in every bucket.
  if (p.n <= 1)
    return launch_n<1>(p, ldx, ldy, stream);
  if (p.n <= 2)
    return launch_n<2>(p, ldx, ldy, stream);
  if (p.n <= 4)
    return launch_n<4>(p, ldx, ldy, stream);
  return launch_n<8>(p, ldx, ldy, stream);
}

}  // namespace dsinfer::cuda
