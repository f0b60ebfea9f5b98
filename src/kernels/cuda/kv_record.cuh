// Device code for the state records (numeric/records.h): block-cooperative packers (the pack
// kernels and the compressor's epilogue write records with them) and the decoders the attention
// and indexer kernels read records through. Decoded values are exact in BF16 (FP8 or FP4 codes
// times a power of two, BF16 RoPE dims), so a record decodes straight to the BF16 operands.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant.cuh"
#include "numeric/records.h"

namespace dsinfer::cuda::rec {

// Packs row x (dim values) as a KV record at o (kv_record_bytes(dim, rope_dim) bytes, padding
// zeroed), by the whole block (blockDim.x a multiple of 32): warp w quantises 64-dim blocks w,
// w + warps, ... as numeric::fp8_block_quantize. Reads x only: the caller syncs before and after.
__device__ __forceinline__ void pack_kv_row(const float* x,
                                            int64_t dim,
                                            int64_t rope_dim,
                                            uint8_t* o) {
  const int64_t nope = dim - rope_dim;
  const int64_t rec = numeric::kv_record_bytes(dim, rope_dim);
  const int64_t nblocks = nope / 64;
  const int lane = threadIdx.x & 31;
  uint8_t* scales = o + nope + 2 * rope_dim;
  for (int64_t b = threadIdx.x >> 5; b < nblocks; b += blockDim.x >> 5) {
    const float* v = x + b * 64;
    float amax = fmaxf(fabsf(v[lane]), fabsf(v[lane + 32]));
    amax = warp_max(amax);
    const float s = quant_scale(amax, QuantSim::kFp8);
    const float inv_s = 1.0f / s;  // x * inv_s == x / s (fp8_sim_value)
    o[b * 64 + lane] = fp8_code_clamped(v[lane] * inv_s);
    o[b * 64 + lane + 32] = fp8_code_clamped(v[lane + 32] * inv_s);
    if (lane == 0)
      scales[b] = numeric::e8m0_from_pow2(s);
  }
  uint16_t* rope = reinterpret_cast<uint16_t*>(o + nope);
  for (int64_t i = threadIdx.x; i < rope_dim; i += blockDim.x)
    rope[i] = numeric::f32_to_bf16(x[nope + i]);
  for (int64_t i = nope + 2 * rope_dim + nblocks + threadIdx.x; i < rec; i += blockDim.x) o[i] = 0;
}

// Packs row x (dim values, a multiple of 32) as an index-key record at o, zero-padded to
// `bytes` (>= index_key_record_bytes(dim)), as numeric::fp4_block_quantize; by the whole block.
__device__ __forceinline__ void pack_index_key_row(const float* x,
                                                   int64_t dim,
                                                   uint8_t* o,
                                                   int64_t bytes) {
  const int64_t nblocks = dim / 32;
  const int lane = threadIdx.x & 31;
  for (int64_t b = threadIdx.x >> 5; b < nblocks; b += blockDim.x >> 5) {
    const float v = x[b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float s = numeric::pow2_ceil(fmaxf(amax, numeric::kFp4AmaxFloor) / numeric::kFp4Max);
    const uint8_t code = numeric::f32_to_fp4_e2m1(clamp_sym(v / s, numeric::kFp4Max));
    const uint8_t hi = static_cast<uint8_t>(__shfl_down_sync(0xffffffffu, code, 1));
    if ((lane & 1) == 0)
      o[b * 16 + lane / 2] = static_cast<uint8_t>(code | (hi << 4));
    if (lane == 0)
      o[dim / 2 + b] = numeric::e8m0_from_pow2(s);
  }
  for (int64_t i = numeric::index_key_record_bytes(dim) + threadIdx.x; i < bytes; i += blockDim.x)
    o[i] = 0;
}

// Four consecutive dims d .. d + 3 (d % 4 == 0) of a KV record as loaded from memory, turned into
// values only when used (so the load's latency can hide behind other work): nope dims hold four
// E4M3 codes in x and their block's scale byte in y; RoPE dims two BF16 pairs.
__device__ __forceinline__ uint2 load_kv4(const uint8_t* rec, int nope, int rope_dim, int d) {
  if (d < nope)
    return make_uint2(*reinterpret_cast<const uint32_t*>(rec + d),
                      rec[nope + 2 * rope_dim + d / 64]);
  const uint32_t* r = reinterpret_cast<const uint32_t*>(rec + nope + 2 * (d - nope));
  return make_uint2(r[0], r[1]);  // two words: a record need only be 4-byte aligned
}

// Four E4M3 codes times 2^(scale - 127), as fp32 (exact). The scale byte is a pack_kv_row
// scale (>= 2^-22 by the amax floor, so 1..254: its fp32 bits are the byte shifted into the
// exponent), or 0 in a zeroed record, whose zero codes give zeros either way.
__device__ __forceinline__ float4 fp8x4_scaled(uint32_t codes, uint32_t scale) {
  const __half2_raw a =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes & 0xffffu), __NV_E4M3);
  const __half2_raw b =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes >> 16), __NV_E4M3);
  const float2 fa = __half22float2(*reinterpret_cast<const __half2*>(&a));
  const float2 fb = __half22float2(*reinterpret_cast<const __half2*>(&b));
  const float s = __uint_as_float((scale & 0xffu) << 23);
  return make_float4(fa.x * s, fa.y * s, fb.x * s, fb.y * s);
}

// Two fp32 values that are BF16 values -> a packed BF16 pair: their high halves (exact, one
// byte permute).
__device__ __forceinline__ uint32_t bf16_pair_of_exact(float lo, float hi) {
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

// load_kv4's raw dims as BF16 pairs (exact: every value is a BF16 value). `rope`: d >= nope.
__device__ __forceinline__ uint2 kv4_to_bf16(uint2 raw, bool rope) {
  if (rope)
    return raw;
  const float4 v = fp8x4_scaled(raw.x, raw.y);
  return make_uint2(bf16_pair_of_exact(v.x, v.y), bf16_pair_of_exact(v.z, v.w));
}

// Eight dims c .. c + 7 (c % 8 == 0) of an index-key record: the word of their codes and their
// 32-block's scale byte, loaded together and decoded when used. A record need only be 4-byte
// aligned.
__device__ __forceinline__ uint2 load_index_unit(const uint8_t* rec, int dim, int c) {
  return make_uint2(*reinterpret_cast<const uint32_t*>(rec + c / 2), rec[dim / 2 + c / 32]);
}

// load_index_unit's dims as four BF16 pairs (exact). Each E2M1 code becomes the E4M3 code of its
// value times 2^-6 (sign and the three magnitude bits moved into place: numeric::
// fp4x8_to_e4m3_scaled), converted two at a time, times 2^6 times the block's scale (a packed
// scale is >= 2^-126 by the FP4 amax floor: its fp32 bits are the byte shifted into the
// exponent; a zeroed record's 0 gives zeros).
__device__ __forceinline__ uint4 index_unit_to_bf16(uint2 raw) {
  uint32_t even, odd;
  numeric::fp4x8_to_e4m3_scaled(raw.x, &even, &odd);
  const float s = __uint_as_float((raw.y & 0xffu) << 23) * 64.0f;
  auto pair = [&](uint32_t two_codes) {  // dims 2k, 2k + 1 in the low, high byte
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    return bf16_pair_of_exact(f.x * s, f.y * s);
  };
  const uint32_t lo = __byte_perm(even, odd, 0x5140);  // dims 0..3 of the unit
  const uint32_t hi = __byte_perm(even, odd, 0x7362);  // dims 4..7
  return make_uint4(pair(lo & 0xffffu), pair(lo >> 16), pair(hi & 0xffffu), pair(hi >> 16));
}

}  // namespace dsinfer::cuda::rec
