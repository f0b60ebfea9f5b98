// Many-row BF16x2 linears on Hopper's wgmma (bf16_gemm_sm90.cu, CUTLASS): the path
// launch_bf16x2_linear takes for n >= kBf16Sm90MinRows rows of BF16 weights when the build has
// CUTLASS and the caller allows it. y = W hi + W lo as two GEMMs with fp32 accumulators (the
// mma.sync kernel interleaves the two per K step: same products, another summation order); all
// groups in one batched launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"

namespace dsinfer::cuda {

struct Bf16GemmSm90Args {
  const uint16_t* w = nullptr;  // BF16 weight rows, w_ld elements apart; group g from row g * rows
  int64_t w_ld = 0;
  int64_t rows = 0;                // output features per group
  int64_t k = 0;                   // inputs per group
  const uint16_t* x_hi = nullptr;  // [n, x_ld]; group g reads columns [g * group_x, +k)
  const uint16_t* x_lo = nullptr;
  int64_t x_ld = 0;
  int64_t n = 0;
  float* y = nullptr;  // [n, ldy]; group g writes columns [g * group_y, +rows)
  int64_t ldy = 0;
  bool accumulate = false;
  int64_t groups = 1;
  int64_t group_x = 0;
  int64_t group_y = 0;
  // Paired halves: with x_lo == x_hi + n * x_ld (one buffer of 2n rows), 2n <= kBf16Sm90TileRows,
  // rows % 4 == 0 and pair_scratch (bf16_gemm_sm90_pair_floats), one GEMM over the 2n rows into
  // pair_scratch and an add in the two passes' order: the weights are read once instead of twice
  // (the LM head at decode batches), the same bits as the two passes.
  float* pair_scratch = nullptr;
};

// Token rows of one tile (the GEMM's M).
inline constexpr int64_t kBf16Sm90TileRows = 128;
// Floats pair_scratch needs for n rows of `rows` outputs in `groups` groups; 0 when 2n exceeds
// one tile (pairing would add tiles, not save weight reads).
inline int64_t bf16_gemm_sm90_pair_floats(int64_t n, int64_t rows, int64_t groups) {
  return 2 * n <= kBf16Sm90TileRows && rows % 4 == 0 ? 2 * n * rows * groups : 0;
}

bool bf16_gemm_sm90_supports(const Bf16GemmSm90Args& a);
Status launch_bf16_gemm_sm90(const Bf16GemmSm90Args& a, cudaStream_t stream);

}  // namespace dsinfer::cuda
