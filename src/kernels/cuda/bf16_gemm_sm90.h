// Many-row BF16x2 linears on Hopper's wgmma (bf16_gemm_sm90.cu, CUTLASS): the path
// launch_bf16x2_linear takes for n >= kBf16Sm90MinRows rows of BF16 weights when the build has
// CUTLASS and the caller allows it. y = W hi + W lo as two GEMMs with fp32 accumulators (the
// mma.sync kernel interleaves the two per K step: same products, another summation order).
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
};

bool bf16_gemm_sm90_supports(const Bf16GemmSm90Args& a);
Status launch_bf16_gemm_sm90(const Bf16GemmSm90Args& a, cudaStream_t stream);

}  // namespace dsinfer::cuda
