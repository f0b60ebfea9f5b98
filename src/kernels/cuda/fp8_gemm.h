// Tensor-core linear layers for the `deepseek` numerics (W8A8 and W4A8): activations quantised
// once per producer into FP8 E4M3 codes with UE8M0 1x128 scales (exactly the values
// numeric::fp8_block_simulate gives), weights read in their checkpoint formats (FP8 E4M3 with
// 128x128 block scales, or MXFP4 E2M1 with 1x32 E8M0 scales, converted to E4M3 in shared memory,
// which is exact) and multiplied with mma.sync FP8 tensor-core instructions. Each 32-wide K step
// is an MMA from zero whose fp32 result is scaled by (weight scale x activation scale) and added
// to fp32 accumulators, so the scales never round and the partial sums stay short.
//
// The same contract as gemm.h (y[t, r] = sum_c w[row_begin + r, c] * xq[t, c]); the two differ
// only in fp32 summation order and the tensor cores' internal accumulation of 32 exact products.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

// FP8 activations: row t holds codes[t * ld, +k_padded) (zeros past k) and scales[t * ld / 128,
// +k_padded / 128) (fp32 powers of two). k_padded = round_up(k, 128).
struct Fp8Acts {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t ld = 0;  // bytes per row, a multiple of 128 and >= k_padded
};

inline int64_t fp8_acts_ld(int64_t k) {
  return (k + 127) / 128 * 128;
}

struct QuantizeFp8Params {
  const float* x = nullptr;  // [n, ldx]
  int64_t ldx = 0;           // 0: k
  int64_t n = 0;
  int64_t k = 0;
  uint8_t* codes = nullptr;  // [n, fp8_acts_ld(k)]
  float* scales = nullptr;   // [n, fp8_acts_ld(k) / 128]
};
Status launch_quantize_fp8(const QuantizeFp8Params& p, cudaStream_t stream);

// True when w can be read by the tensor-core kernels: FP8 block-128 (E8M0 or F32 scales) or MXFP4,
// K a multiple of 16 (FP8) or 32 (MXFP4), data 16-byte aligned.
bool fp8_gemm_supports(const MatrixRef& w);

struct Fp8LinearParams {
  MatrixRef w;            // device pointers
  int64_t row_begin = 0;  // first weight row used
  int64_t rows = -1;      // -1: w.rows - row_begin
  Fp8Acts x;              // [n] rows, k = w.cols
  int64_t n = 0;
  float* y = nullptr;  // [n, ldy]
  int64_t ldy = 0;     // 0: rows
  bool accumulate = false;
  // wgmma (the fast shapes): n <= 64 rows run the decode-sized wgmma kernel (fp8_gemm_decode.h;
  // n <= 8 only for K <= 4096, fp8_gemm_decode_takes), other n <= 8 the GEMV (gemv.h:
  // launch_fp8_gemv), and larger n the CUTLASS wgmma kernel
  // (fp8_gemm_sm90.h) when the shape fits and scratch_floats >= fp8_linear_scratch_floats(w,
  // rows, n). Otherwise, and always with wgmma false, the mma.sync tile kernels run: their sums
  // are in one fixed order whatever n is (batch invariant); the other paths sum in other orders.
  bool wgmma = true;
  float* scratch = nullptr;
  int64_t scratch_floats = 0;
};
Status launch_fp8_linear(const Fp8LinearParams& p, cudaStream_t stream);
// Which kernel launch_fp8_linear(p) runs.
enum class Fp8LinearPath { kTile, kGemv, kDecode, kWgmma };
Fp8LinearPath fp8_linear_path(const Fp8LinearParams& p);

inline constexpr int64_t kFp8Sm90MinRows = 64;
// Scratch floats launch_fp8_linear's wgmma path needs for n rows of w (rows < 0: all); 0 when it
// would not take that path.
int64_t fp8_linear_scratch_floats(const MatrixRef& w, int64_t rows, int64_t n);

// The grouped SwiGLU experts of moe.h (ExpertFfnParams) over FP8 activations: pairs grouped by
// expert (expert_begin, pair_src as launch_moe_group makes them; null = one expert over all
// rows), x quantised per token. Writes h (fp32, grouped order) = silu(min(W1 x, limit)) *
// clamp(W3 x, +-limit) * gate, quantises it into hq, then y (grouped order) = W2 hq.
struct Fp8ExpertFfnParams {
  const MatrixRef* w1 = nullptr;  // device arrays [n_experts]
  const MatrixRef* w3 = nullptr;
  const MatrixRef* w2 = nullptr;
  // Every expert's format (uniform; each expert must pass fp8_gemm_supports, which the caller
  // checks when it uploads the weights): kMxfp4 or kFp8Block128.
  WeightFormat format = WeightFormat::kMxfp4;
  int64_t n_experts = 1;
  int64_t hidden = 0;
  int64_t inter = 0;
  const int64_t* expert_begin = nullptr;  // device [n_experts + 1] or null
  const int32_t* pair_src = nullptr;      // device [num_pairs] or null (identity)
  int64_t k = 1;
  const float* gates = nullptr;  // by pair index, or null (1)
  Fp8Acts x;                     // [tokens] rows, k = hidden
  int64_t num_pairs = 0;         // upper bound of the grouped pairs (n * k)
  float swiglu_limit = 0.0f;
  float* h = nullptr;          // scratch [num_pairs, inter]
  uint8_t* h_codes = nullptr;  // scratch [num_pairs, fp8_acts_ld(inter)]
  float* h_scales = nullptr;   // scratch [num_pairs, fp8_acts_ld(inter) / 128]
  float* y = nullptr;          // [num_pairs, hidden]
  // Few pairs per expert (<= 8 on average) may take the grouped GEMVs (moe_gemv.h), which sum in
  // another order than the tiles: set only where the experts passed launch_expert_gemv_check
  // (MXFP4) and batch invariance is not asked for.
  bool gemv = false;
};
Status launch_fp8_expert_ffn(const Fp8ExpertFfnParams& p, cudaStream_t stream);
// The middle step of every expert path: h ([num_pairs, inter] fp32) quantised into h_codes and
// h_scales (1x128 E4M3 / UE8M0), as the second GEMM reads it.
Status launch_quantize_expert_h(const Fp8ExpertFfnParams& p, cudaStream_t stream);

// ---- fp32 activations on BF16 tensor cores -----------------------------------------------------
// For the linears that stay in fp32 (the `reference` numerics everywhere; wo_a, the compressors,
// the router, indexer weights and the LM head in both): x is split into BF16 high and low halves
// (hi = bf16(x), lo = bf16(x - hi), |x - hi - lo| <= 2^-17 |x|), and y = W hi + W lo with two BF16
// MMAs per step over weights that BF16 holds exactly (BF16, or FP8 E4M3 converted in shared
// memory with the 128x128 block scale applied to each chunk's fp32 partial).

// x rows as BF16 halves: hi[t * ld, +ld) and lo[t * ld, +ld), zeros past k; ld = round_up(k, 64)
// (or wider: a row may be read at a column offset, e.g. one wo_a group, when ld stays >= that).
struct Bf16SplitActs {
  const uint16_t* hi = nullptr;
  const uint16_t* lo = nullptr;  // null: the activations are BF16 values (hi alone, one pass)
  int64_t ld = 0;                // elements per row, a multiple of 64
};

inline int64_t bf16_split_ld(int64_t k) {
  return (k + 63) / 64 * 64;
}

struct SplitBf16Params {
  const float* x = nullptr;  // [n, ldx]
  int64_t ldx = 0;           // 0: k
  int64_t n = 0;
  int64_t k = 0;
  uint16_t* hi = nullptr;  // [n, bf16_split_ld(k)]
  uint16_t* lo = nullptr;  // null: round to BF16 only (hi = bf16(x))
};
Status launch_split_bf16(const SplitBf16Params& p, cudaStream_t stream);

// FP8 block-128 (E8M0 or F32 scales, K % 16 == 0) or BF16 (K % 8 == 0), data 16-byte aligned.
bool bf16x2_gemm_supports(const MatrixRef& w);

struct Bf16x2LinearParams {
  MatrixRef w;
  int64_t row_begin = 0;
  int64_t rows = -1;
  Bf16SplitActs x;  // k = w.cols
  int64_t n = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;
  // `groups` independent products in one launch (wo_a's 8 groups): group g uses weight rows
  // row_begin + g * rows, x columns from g * group_x, y columns from g * group_y.
  int64_t groups = 1;
  int64_t group_x = 0;  // elements, a multiple of 8
  int64_t group_y = 0;
  // BF16 weights, n >= kBf16Sm90MinRows, a build with CUTLASS: the wgmma path (bf16_gemm_sm90.h;
  // another summation order than the fixed-order kernel, so off = batch invariant). Also allows
  // split-K on the tile kernel.
  bool wgmma = true;
  // Split-K partials (bf16x2_linear_scratch_floats): with wgmma on, a launch whose tiles cannot
  // fill the GPU splits K and sums the splits in order in a second kernel; null: no split.
  float* scratch = nullptr;
  int64_t scratch_floats = 0;
};
Status launch_bf16x2_linear(const Bf16x2LinearParams& p, cudaStream_t stream);
// Scratch floats launch_bf16x2_linear may use for `rows` output rows per group over w (0: none).
int64_t bf16x2_linear_scratch_floats(const MatrixRef& w, int64_t rows, int64_t n, int64_t groups);
inline constexpr int64_t kBf16Sm90MinRows = 128;
// Weights of at least kBf16Sm90WideMinWeightRows output rows over all groups (the LM head; wo_a's
// 8 x 1024) take the wgmma path from kBf16Sm90WideMinRows rows: their 128-row tiles alone give
// at least 64 blocks, each streaming its rows once (the token rows fit one tile).
inline constexpr int64_t kBf16Sm90WideMinRows = 16;
inline constexpr int64_t kBf16Sm90WideMinWeightRows = 8192;
// Whether launch_bf16x2_linear(p) takes the wgmma path.
bool bf16x2_linear_uses_wgmma(const Bf16x2LinearParams& p);

}  // namespace dsinfer::cuda
