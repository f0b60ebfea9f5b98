// Quantisation simulations (spec §3.12).
#include "numeric/quant.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "numeric/float_formats.h"

namespace dsinfer::numeric {

float ue8m0_block_scale(float amax, float amax_floor, float qmax) {
  const float a = std::max(amax, amax_floor);
  return pow2_ceil(a / qmax);
}

static float block_amax(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

void fp8_block_simulate(float* x, int64_t n, int64_t block) {
  DSI_CHECK(block > 0, "block %lld", static_cast<long long>(block));
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = std::min(block, n - b0);
    const float s = ue8m0_block_scale(block_amax(x + b0, len), kActAmaxFloor, kFp8Max);
    for (int64_t i = 0; i < len; ++i) {
      const float q = std::clamp(x[b0 + i] / s, -kFp8Max, kFp8Max);
      x[b0 + i] = fp8_e4m3_to_f32(f32_to_fp8_e4m3(q)) * s;
    }
  }
}

void fp8_block_quantize(
    const float* x, int64_t n, int64_t block, uint8_t* codes, uint8_t* scale_bytes) {
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
    const int64_t len = std::min(block, n - b0);
    const float s = ue8m0_block_scale(block_amax(x + b0, len), kActAmaxFloor, kFp8Max);
    scale_bytes[bi] = e8m0_from_pow2(s);
    for (int64_t i = 0; i < len; ++i) {
      codes[b0 + i] = f32_to_fp8_e4m3(std::clamp(x[b0 + i] / s, -kFp8Max, kFp8Max));
    }
  }
}

void fp4_block_simulate(float* x, int64_t n, int64_t block) {
  DSI_CHECK(block > 0, "block %lld", static_cast<long long>(block));
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = std::min(block, n - b0);
    const float s = ue8m0_block_scale(block_amax(x + b0, len), kFp4AmaxFloor, kFp4Max);
    for (int64_t i = 0; i < len; ++i) {
      const float q = std::clamp(x[b0 + i] / s, -kFp4Max, kFp4Max);
      x[b0 + i] = fp4_e2m1_to_f32(f32_to_fp4_e2m1(q)) * s;
    }
  }
}

void bf16_simulate(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

void hadamard_transform(float* x, int64_t n) {
  DSI_CHECK(n > 0 && (n & (n - 1)) == 0,
            "Hadamard size %lld is not a power of two",
            static_cast<long long>(n));
  for (int64_t h = 1; h < n; h <<= 1) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

}  // namespace dsinfer::numeric
