// Scalar conversions for every number format the engine stores: bf16, fp16, FP8 E4M3 (fn),
// E8M0 (UE8M0 scale bytes) and FP4 E2M1. All encoders round to nearest, ties to even (RNE).
// Header-only and usable from CUDA device code (DSI_HD), so CPU and GPU agree bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DSI_HD __host__ __device__ __forceinline__
#else
#define DSI_HD inline
#endif

namespace dsinfer::numeric {

DSI_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DSI_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- bf16 ------------------------------------------------------------------------------------
DSI_HD float bf16_to_f32(uint16_t h) {
  return f32_from_bits(static_cast<uint32_t>(h) << 16);
}

// RNE; NaN stays a (quiet) NaN with its sign; overflow rounds to inf as IEEE requires.
DSI_HD uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

DSI_HD float round_to_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

// ---- fp16 ------------------------------------------------------------------------------------
DSI_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f)
    return f32_from_bits(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0)
      return f32_from_bits(sign);
    // subnormal: value = mant * 2^-24, exact in fp32
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return (h & 0x8000u) ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

DSI_HD uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u)
    return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 -> inf
  const int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp < -14) {
    // subnormal or zero in fp16: value / 2^-24 rounded RNE
    if (exp < -25)
      return sign;  // below half of the smallest subnormal
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = -exp - 14 + 13;  // bits to drop
    const uint32_t kept = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = abs - (112u << 23);  // rebias exponent
  const uint32_t lsb = (r >> 13) & 1u;
  r = (r + 0xfffu + lsb) >> 13;
  return static_cast<uint16_t>(sign | r);
}

// ---- FP8 E4M3 (fn: no inf, max 448, NaN = 0x7f / 0xff) -----------------------------------------
DSI_HD float fp8_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t mant = b & 0x7u;
  if (exp == 0xf && mant == 0x7)
    return f32_from_bits(sign | 0x7fc00000u);
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 120u) << 23) | (mant << 20));
}

// RNE. |x| > 464 (past the midpoint between 448 and 480, where the NaN code sits), inf and NaN
// encode as NaN, as torch's cast does; 464 itself ties to the even code, 448. Callers that want
// saturation clamp to +-448 first (the quantisation paths all do).
DSI_HD uint8_t f32_to_fp8_e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x43e80000u)
    return static_cast<uint8_t>(sign | 0x7fu);  // > 464 or inf/nan
  if (abs < 0x3c800000u) {
    // below 2^-6: subnormal range, step 2^-9. value/2^-9 rounded RNE (0..8).
    const float v = f32_from_bits(abs) * 512.0f;  // exact scaling by a power of two
    const float magic = 8388608.0f;               // 2^23: (v + 2^23) - 2^23 rounds v RNE
    const float r = (v + magic) - magic;
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(r));
  }
  // normal: keep 3 mantissa bits
  uint32_t r = abs - (120u << 23);
  const uint32_t lsb = (r >> 20) & 1u;
  r = (r + 0x7ffffu + lsb) >> 20;
  return static_cast<uint8_t>(sign | r);
}

// ---- E8M0 (UE8M0): one unsigned exponent byte, value 2^(b-127), 0xff = NaN ---------------------
DSI_HD float e8m0_to_f32(uint8_t b) {
  if (b == 0xff)
    return f32_from_bits(0x7fc00000u);
  if (b == 0)
    return f32_from_bits(0x00400000u);  // 2^-127 is an fp32 subnormal
  return f32_from_bits(static_cast<uint32_t>(b) << 23);
}

// Exponent byte of a power of two p = 2^e (e in [-127, 127]); other inputs are a caller bug.
DSI_HD uint8_t e8m0_from_pow2(float p) {
  const uint32_t u = f32_bits(p);
  if (u == 0x00400000u)
    return 0;
  return static_cast<uint8_t>(u >> 23);
}

// Smallest power of two >= x for finite x > 0 (i.e. 2^ceil(log2 x)), exact for every fp32 input.
DSI_HD float pow2_ceil(float x) {
  const uint32_t u = f32_bits(x);
  uint32_t exp = (u >> 23) & 0xffu;
  const uint32_t mant = u & 0x7fffffu;
  if (exp == 0) {
    // subnormal: find the highest set bit of the mantissa
    int e = -149;
    uint32_t m = mant;
    int hb = 0;
    while (m >> (hb + 1)) ++hb;
    e += hb;
    const bool exact = (mant & ((1u << hb) - 1u)) == 0;
    const int ce = exact ? e : e + 1;
    if (ce >= -126)
      return f32_from_bits(static_cast<uint32_t>(ce + 127) << 23);
    return f32_from_bits(1u << (ce + 149));
  }
  if (mant != 0)
    ++exp;
  return f32_from_bits(exp << 23);
}

// ---- FP4 E2M1 (bit 3 = sign; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6) -----------------------------
// Without a table: codes 0 and 1 are 0 and 0.5, codes 2-7 are (1 + m / 2) * 2^(e - 1) with
// e = code >> 1, m = code & 1 (an indexed table went to the GPU's local memory: every warp of
// the quantisation kernels wrote it there, which bound them on L2 traffic).
DSI_HD float fp4_e2m1_to_f32(uint8_t nibble) {
  const uint32_t c = nibble & 7u;
  const float v = c < 2u ? 0.5f * static_cast<float>(c)
                         : f32_from_bits((((c >> 1) + 126u) << 23) | ((c & 1u) << 22));
  return (nibble & 8u) ? -v : v;
}

// RNE onto the E2M1 grid; |x| > 6 saturates to 6 (callers clamp anyway), NaN maps to +0.
DSI_HD uint8_t f32_to_fp4_e2m1(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = (u >> 31) ? 8u : 0u;
  const float a = f32_from_bits(u & 0x7fffffffu);
  if (!(a == a))
    return 0;
  // Decision thresholds between neighbours; at an exact midpoint pick the even code.
  uint8_t code;
  if (a <= 0.25f)
    code = 0;  // midpoint 0.25 -> 0 (even)
  else if (a < 0.75f)
    code = 1;  // 0.75 -> 1.0 (code 2, even)
  else if (a <= 1.25f)
    code = 2;  // 1.25 -> 1.0 (even)
  else if (a < 1.75f)
    code = 3;  // 1.75 -> 2.0 (code 4, even)
  else if (a <= 2.5f)
    code = 4;  // 2.5 -> 2.0 (even)
  else if (a < 3.5f)
    code = 5;  // 3.5 -> 4.0 (code 6, even)
  else if (a <= 5.0f)
    code = 6;  // 5 -> 4.0 (even)
  else
    code = 7;
  return static_cast<uint8_t>(sign | code);
}

// Eight E2M1 codes (code i at bits 4i..4i+3 of w) as E4M3 bytes of their values times 2^-6,
// exactly and without a table: code s|eem becomes s << 7 | eem << 2 (E4M3's exponent field starts
// two bits above E2M1's and its bias is 6 larger, so normals and the subnormal 0.5 alike map onto
// the value times 2^-6). *even holds codes 0, 2, 4, 6 (bytes 0..3), *odd codes 1, 3, 5, 7. The
// MXFP4 expert GEMVs (kernels/cuda/moe_gemv_mxfp4.cu) feed FP8 tensor cores with these.
DSI_HD void fp4x8_to_e4m3_scaled(uint32_t w, uint32_t* even, uint32_t* odd) {
  *even = ((w << 4) & 0x80808080u) | ((w << 2) & 0x1C1C1C1Cu);
  *odd = (w & 0x80808080u) | ((w >> 2) & 0x1C1C1C1Cu);
}

// Packed FP4: byte k holds element 2k in the low nibble and element 2k+1 in the high nibble.
DSI_HD float fp4_packed_get(const uint8_t* packed, int64_t i) {
  const uint8_t b = packed[i >> 1];
  return fp4_e2m1_to_f32((i & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xfu));
}

}  // namespace dsinfer::numeric
