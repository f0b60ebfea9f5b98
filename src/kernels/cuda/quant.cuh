// Device versions of the quantisation simulations of numeric/quant.h (fp8_block_simulate,
// fp4_block_simulate, hadamard_transform), shared by the row kernels and the compressor. Same
// IEEE operations in the same order per value: bit-identical to the CPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"
#include "numeric/float_formats.h"
#include "numeric/quant.h"

namespace dsinfer::cuda {

// std::clamp(v, -m, m): NaN passes through.
__device__ __forceinline__ float clamp_sym(float v, float m) {
  return v < -m ? -m : (m < v ? m : v);
}

// The UE8M0 scale of a block with absolute maximum amax (kFp8 / kFp4; 1 otherwise), and one
// value rounded through the format with that scale (kBf16: rounded to BF16).
__device__ __forceinline__ float quant_scale(float amax, QuantSim kind) {
  if (kind == QuantSim::kFp8)
    return numeric::pow2_ceil(fmaxf(amax, numeric::kActAmaxFloor) / numeric::kFp8Max);
  if (kind == QuantSim::kFp4)
    return numeric::pow2_ceil(fmaxf(amax, numeric::kFp4AmaxFloor) / numeric::kFp4Max);
  return 1.0f;
}

__device__ __forceinline__ float quant_value(float x, float s, QuantSim kind) {
  if (kind == QuantSim::kFp8) {
    const float q = clamp_sym(x / s, numeric::kFp8Max);
    return numeric::fp8_e4m3_to_f32(numeric::f32_to_fp8_e4m3(q)) * s;
  }
  if (kind == QuantSim::kFp4) {
    const float q = clamp_sym(x / s, numeric::kFp4Max);
    return numeric::fp4_e2m1_to_f32(numeric::f32_to_fp4_e2m1(q)) * s;
  }
  if (kind == QuantSim::kBf16)
    return numeric::round_to_bf16(x);
  return x;
}

// One warp rounds one block of `len` values at x (global or shared memory) through UE8M0-scaled
// FP8 E4M3 (kFp8) or FP4 E2M1 (kFp4), or to BF16. Every lane of the warp must call it.
__device__ inline void quant_block_warp(float* x, int64_t len, QuantSim kind) {
  const int lane = threadIdx.x & 31;
  float amax = 0.0f;
  for (int64_t i = lane; i < len; i += 32) amax = fmaxf(amax, fabsf(x[i]));
  amax = warp_max(amax);
  const float s = quant_scale(amax, kind);
  for (int64_t i = lane; i < len; i += 32) x[i] = quant_value(x[i], s, kind);
}

// The whole block rounds x[0, len) in blocks of `block` values, one warp per block.
__device__ inline void quant_row_block(float* x, int64_t len, int64_t block, QuantSim kind) {
  const int64_t nb = (len + block - 1) / block;
  for (int64_t b = threadIdx.x >> 5; b < nb; b += blockDim.x >> 5) {
    const int64_t b0 = b * block;
    quant_block_warp(x + b0, min(block, len - b0), kind);
  }
  __syncthreads();
}

// numeric::hadamard_transform on x[0, n) in shared memory by the whole block: butterflies
// (a + b, a - b) stage by stage, then * (1 / sqrt(n)). Each butterfly is the same two IEEE
// operations whichever thread computes it.
__device__ inline void hadamard_block(float* x, int64_t n) {
  __syncthreads();
  for (int64_t h = 1; h < n; h <<= 1) {
    for (int64_t k = threadIdx.x; k < n / 2; k += blockDim.x) {
      const int64_t j = (k / h) * 2 * h + (k % h);
      const float a = x[j];
      const float b = x[j + h];
      x[j] = a + b;
      x[j + h] = a - b;
    }
    __syncthreads();
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(n));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) x[i] = x[i] * scale;
  __syncthreads();
}

}  // namespace dsinfer::cuda
