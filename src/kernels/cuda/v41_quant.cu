// V4.1's record simulations and the ratio-r compressor pooling on the GPU (v41.h), the twins of
// cpu_v41::fp8_window_quant / fp4_index_quant / fp4_compressed_quant and of the pooling loop of
// V41CpuModel::compress, with the same float operations in the same order.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/v41.h"
#include "numeric/float_formats.h"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

// The smallest power of two >= t (t > 0), as the CPU's frexp-based helper.
__device__ __forceinline__ float pow2_ceil_v41(float t) {
  int e = 0;
  const float m = frexpf(t, &e);
  return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

__device__ __forceinline__ float e4m3_round(float v) {
  return numeric::fp8_e4m3_to_f32(numeric::f32_to_fp8_e4m3(v));
}

// Nearest E2M1 value of v (|v| <= 6), ties to the even code.
__device__ __forceinline__ float e2m1_round(float v) {
  constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = fabsf(v);
  int lo = 0;
  while (lo < 7 && kGrid[lo + 1] <= a) ++lo;
  int pick = lo;
  if (lo < 7) {
    const float dlo = a - kGrid[lo], dhi = kGrid[lo + 1] - a;
    if (dhi < dlo || (dhi == dlo && (lo + 1) % 2 == 0))
      pick = lo + 1;
  }
  return signbit(v) ? -kGrid[pick] : kGrid[pick];
}

// std::clamp(v, lo, hi).
__device__ __forceinline__ float clampf(float v, float lo, float hi) {
  return v < lo ? lo : (hi < v ? hi : v);
}

__global__ void v41_quant_kernel(V41QuantParams p, int64_t block) {
  const int64_t per_row = p.len / block;
  const int64_t total = p.rows * per_row;
  const int64_t ld = p.ld > 0 ? p.ld : p.len;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float* x = p.x + (i / per_row) * ld + (i % per_row) * block;
    float amax = 0.0f;
    for (int64_t j = 0; j < block; ++j) amax = fmaxf(amax, fabsf(x[j]));
    if (p.kind == V41Quant::kFp8Window) {
      const float s = pow2_ceil_v41(fmaxf(amax, 1e-4f) * (1.0f / 448.0f));
      for (int64_t j = 0; j < block; ++j) x[j] = e4m3_round(clampf(x[j] / s, -448.0f, 448.0f)) * s;
    } else if (p.kind == V41Quant::kFp4Index) {
      const float s = pow2_ceil_v41(fmaxf(amax, 6.0f * ldexpf(1.0f, -126)) * (1.0f / 6.0f));
      for (int64_t j = 0; j < block; ++j) x[j] = e2m1_round(clampf(x[j] / s, -6.0f, 6.0f)) * s;
    } else {
      float s = fmaxf(amax, 6.0f * ldexpf(1.0f, -9)) / 6.0f;
      if (p.clamp_scale)
        s = fminf(s, 448.0f);
      s = e4m3_round(s);
      // A scale past E4M3's range rounds to NaN and the block is NaN, written as the scale's own
      // NaN bits (the CPU's): the arithmetic below would give the GPU's canonical NaN instead.
      if (isnan(s)) {
        for (int64_t j = 0; j < block; ++j) x[j] = s;
        continue;
      }
      for (int64_t j = 0; j < block; ++j) x[j] = e2m1_round(clampf(x[j] / s, -6.0f, 6.0f)) * s;
    }
  }
}

__global__ void v41_pool_kernel(V41PoolParams p) {
  const int64_t total = p.entries * p.d;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = i / p.d, c = i % p.d;
    const int64_t* refs = p.member_refs + g * p.ratio;
    float m = -INFINITY;
    for (int64_t r = 0; r < p.ratio; ++r)
      m = fmaxf(m, kv_ref_ptr(p.pool, p.local, refs[r])[p.d + c]);
    float den = 0.0f, num = 0.0f;
    for (int64_t r = 0; r < p.ratio; ++r)
      den += expf(kv_ref_ptr(p.pool, p.local, refs[r])[p.d + c] - m);
    for (int64_t r = 0; r < p.ratio; ++r) {
      const float* row = kv_ref_ptr(p.pool, p.local, refs[r]);
      num = __fadd_rn(num, __fmul_rn(expf(row[p.d + c] - m) / den, row[c]));  // no FMA: the CPU's
    }
    p.out[i] = num;
  }
}

unsigned grid_for(int64_t total) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(total, kThreads), 1, kMaxBlocks));
}

}  // namespace

Status launch_v41_quant(const V41QuantParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("v41_quant", {p.rows, p.ld, p.len}));
  const int64_t block = p.kind == V41Quant::kFp4Compressed ? 16 : 32;
  DSI_RETURN_IF_ERROR(
      require(p.len % block == 0, "v41_quant", "len is not a multiple of the block"));
  DSI_RETURN_IF_ERROR(require(p.ld == 0 || p.ld >= p.len, "v41_quant", "ld < len"));
  if (p.rows == 0 || p.len == 0)
    return Status();
  if (!p.x)
    return null_pointer("v41_quant");
  v41_quant_kernel<<<grid_for(p.rows * (p.len / block)), kThreads, 0, stream>>>(p, block);
  return launched("v41_quant launch");
}

Status launch_v41_pool(const V41PoolParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("v41_pool", {p.entries, p.d}));
  DSI_RETURN_IF_ERROR(require(p.ratio >= 1 && p.ratio <= 16, "v41_pool", "ratio not in [1, 16]"));
  if (p.entries == 0 || p.d == 0)
    return Status();
  if (!p.member_refs || !p.out)
    return null_pointer("v41_pool");
  v41_pool_kernel<<<grid_for(p.entries * p.d), kThreads, 0, stream>>>(p);
  return launched("v41_pool launch");
}

}  // namespace dsinfer::cuda
