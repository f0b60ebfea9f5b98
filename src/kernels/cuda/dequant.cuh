// Device-side building blocks of the (de)quantisation kernels, shared by dequant.cu and by the
// fused GEMM kernels that will read the same formats. Every conversion goes through the DSI_HD
// functions of numeric/float_formats.h, so the GPU reproduces the CPU reference bit for bit.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "numeric/float_formats.h"
#include "numeric/quant.h"
#include "tensor/matrix_ref.h"

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

// act_quant_code for a power-of-two scale (act_block_scale's), given 1 / s: x * (1 / s) is x / s
// exactly, and the hardware conversion (round to nearest even, saturating) gives
// f32_to_fp8_e4m3's code for every clamped non-NaN value (NaN keeps the software path's code).
// The division and the software rounding bounded the prefill quantisation kernels (1.8 TB/s).
__device__ __forceinline__ uint32_t act_quant_code_pow2(float x, float inv_s) {
  const float q = x * inv_s;
  constexpr float kMax = numeric::kFp8Max;
  const float c = q < -kMax ? -kMax : (kMax < q ? kMax : q);
  if (c != c)
    return numeric::f32_to_fp8_e4m3(c);
  return __nv_cvt_float_to_fp8(c, __NV_SATFINITE, __NV_E4M3);
}

// One 1x128 activation block held by a warp, four values per lane (block element lane * 4 + i):
// its scale (act_block_scale of the block's amax, returned to every lane) and this lane's four
// E4M3 codes packed little-endian into *packed. Warp-wide: every lane of the warp calls it.
__device__ __forceinline__ float act_quant_warp_block(const float (&v)[4], uint32_t* packed) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = warp_max(amax);
  const float s = act_block_scale(amax);
  const float inv_s = 1.0f / s;  // exact: s is a power of two
  uint32_t q = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) q |= act_quant_code_pow2(v[i], inv_s) << (8 * i);
  *packed = q;
  return s;
}

// Element (r, c) of a weight in its checkpoint format, dequantised to fp32 exactly as
// MatrixRef::dequant_row does. Float weights: F32, BF16, F16 (other dtypes read as NaN; the
// launchers reject them). Branches on the format are uniform across a launch.
__device__ __forceinline__ float load_weight(const MatrixRef& w, int64_t r, int64_t c) {
  switch (w.format) {
    case WeightFormat::kFloat:
      if (w.dtype == DType::kF32)
        return static_cast<const float*>(w.data)[r * w.cols + c];
      if (w.dtype == DType::kBF16)
        return numeric::bf16_to_f32(static_cast<const uint16_t*>(w.data)[r * w.cols + c]);
      if (w.dtype == DType::kF16)
        return numeric::f16_to_f32(static_cast<const uint16_t*>(w.data)[r * w.cols + c]);
      return __int_as_float(0x7fc00000);
    case WeightFormat::kFp8Block128: {
      const int64_t scale_cols = (w.cols + 127) / 128;
      const float s =
          fp8_block_scale(w.scale, w.scale_dtype == DType::kF32, (r / 128) * scale_cols + c / 128);
      return numeric::fp8_e4m3_to_f32(static_cast<const uint8_t*>(w.data)[r * w.cols + c]) * s;
    }
    case WeightFormat::kFp8Block32: {
      const int64_t scale_cols = (w.cols + 31) / 32;
      const float s =
          fp8_block_scale(w.scale, w.scale_dtype == DType::kF32, (r / 32) * scale_cols + c / 32);
      return numeric::fp8_e4m3_to_f32(static_cast<const uint8_t*>(w.data)[r * w.cols + c]) * s;
    }
    case WeightFormat::kMxfp4: {
      const auto* q = static_cast<const uint8_t*>(w.data) + r * (w.cols / 2);
      const auto* s = static_cast<const uint8_t*>(w.scale) + r * (w.cols / 32);
      return numeric::fp4_packed_get(q, c) * numeric::e8m0_to_f32(s[c / 32]);
    }
  }
  return __int_as_float(0x7fc00000);
}

}  // namespace dsinfer::cuda
