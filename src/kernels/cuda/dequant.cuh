// Device-side building blocks of the (de)quantisation kernels, shared by dequant.cu and by the
// fused GEMM kernels that will read the same formats. Every conversion goes through the DSI_HD
// functions of numeric/float_formats.h, so the GPU reproduces the CPU reference bit for bit.
#pragma once

#include <cstdint>

#include "numeric/float_formats.h"
#include "numeric/quant.h"

namespace dsinfer::cuda {

// Scale i of a 128x128-block FP8 weight: an E8M0 byte or an fp32 value.
__device__ __forceinline__ float fp8_block_scale(const void* scales, bool scales_f32, int64_t i) {
  return scales_f32 ? static_cast<const float*>(scales)[i]
                    : numeric::e8m0_to_f32(static_cast<const uint8_t*>(scales)[i]);
}

// UE8M0 scale of one activation block: 2^ceil(log2(max(amax, 1e-4) / 448)), the same arithmetic
// as numeric::ue8m0_block_scale (fp32 max, fp32 IEEE division, exact pow2_ceil).
__device__ __forceinline__ float act_block_scale(float amax) {
  return numeric::pow2_ceil(fmaxf(amax, numeric::kActAmaxFloor) / numeric::kFp8Max);
}

// E4M3 code of x in a block with scale s: e4m3(clamp(x / s, +-448)), as fp8_block_quantize.
__device__ __forceinline__ uint8_t act_quant_code(float x, float s) {
  const float q = x / s;
  // std::clamp(q, lo, hi) semantics, NaN passing through: (q < lo) ? lo : (hi < q) ? hi : q.
  constexpr float kMax = numeric::kFp8Max;
  const float c = q < -kMax ? -kMax : (kMax < q ? kMax : q);
  return numeric::f32_to_fp8_e4m3(c);
}

}  // namespace dsinfer::cuda
