// DeepSeek V4 quantisation points (spec §3.12), as in-place simulations on fp32 data:
// the values are replaced by exactly what the quantised format would hold, dequantised.
// These define the `deepseek` numerics mode of the CPU reference and are what GPU kernels
// that store real FP8/FP4 must reproduce bit for bit.
#pragma once

#include <cstdint>

namespace dsinfer::numeric {

inline constexpr float kFp8Max = 448.0f;
inline constexpr float kFp4Max = 6.0f;
inline constexpr float kActAmaxFloor = 1e-4f;                     // FP8 activations and KV
inline constexpr float kFp4AmaxFloor = 6.0f * 1.1754943508e-38f;  // 6 * 2^-126

// UE8M0 scale for one block: 2^ceil(log2(max(amax, floor) / qmax)).
float ue8m0_block_scale(float amax, float amax_floor, float qmax);

// 1 x block FP8 E4M3 with UE8M0 scales over n consecutive values (the last block may be short):
// x <- e4m3(clamp(x / s, +-448)) * s.  Activations use block 128, KV nope dims block 64.
void fp8_block_simulate(float* x, int64_t n, int64_t block);

// Same, but writes the codes and the scale exponent bytes (one per block) instead.
void fp8_block_quantize(
    const float* x, int64_t n, int64_t block, uint8_t* codes, uint8_t* scale_bytes);

// 1 x 32 FP4 E2M1 with UE8M0 scales: x <- e2m1(clamp(x / s, +-6)) * s.
void fp4_block_simulate(float* x, int64_t n, int64_t block);

// x <- bf16(x) (round to nearest even) over n consecutive values: the RoPE dims of the KV rows
// and the attention queries of `deepseek` numerics (docs/numerics.md, point 4).
void bf16_simulate(float* x, int64_t n);

// Unnormalised Sylvester Walsh-Hadamard transform of x (n a power of two), scaled by 1/sqrt(n).
void hadamard_transform(float* x, int64_t n);

}  // namespace dsinfer::numeric
