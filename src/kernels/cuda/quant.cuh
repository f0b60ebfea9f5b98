// Device versions of the quantisation simulations of numeric/quant.h (fp8_block_simulate,
// fp4_block_simulate, hadamard_transform), shared by the row kernels and the compressor. Same
// IEEE operations in the same order per value: bit-identical to the CPU.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

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

// The E4M3 code of q clamped to +-448: numeric::f32_to_fp8_e4m3(clamp_sym(q, 448)) by the
// hardware conversion (round to nearest even, saturating), which gives the same code for every
// clamped non-NaN value (GpuTest.Fp8HardwareRoundingEqualsSoftware checks all 2^32 inputs); NaN
// keeps the software path's code.
__device__ __forceinline__ uint8_t fp8_code_clamped(float q) {
  const float c = clamp_sym(q, numeric::kFp8Max);
  if (c != c)
    return numeric::f32_to_fp8_e4m3(c);
  return __nv_cvt_float_to_fp8(c, __NV_SATFINITE, __NV_E4M3);
}

// numeric::fp8_e4m3_to_f32 by the hardware conversion (through FP16, exact for every E4M3
// value); the NaN codes keep the software path's NaN.
__device__ __forceinline__ float fp8_decode(uint8_t code) {
  if ((code & 0x7fu) == 0x7fu)
    return numeric::fp8_e4m3_to_f32(code);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

// x / s for a UE8M0 scale s >= 2^-126 (quant_scale's kFp8 scales are >= 2^-22, or inf / -0 from
// non-finite maxima): 1 / s is exact, so x * (1 / s) is the same correctly rounded quotient, and
// the reciprocal is computed once per block instead of a division per value.
__device__ __forceinline__ float fp8_sim_value(float x, float s, float inv_s) {
  return fp8_decode(fp8_code_clamped(x * inv_s)) * s;
}

__device__ __forceinline__ float quant_value(float x, float s, QuantSim kind) {
  if (kind == QuantSim::kFp8)
    return fp8_sim_value(x, s, 1.0f / s);
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
