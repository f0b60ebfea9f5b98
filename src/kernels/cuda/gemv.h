// Bandwidth-bound linear for a few tokens over BF16 weights (the LM head, router and compressor
// projections at decode): y[t, r] = sum_c w[r, c] * x[t, c] with fp32 FMAs on the exact BF16
// weights, each weight row streamed once for all tokens with 16-byte loads. Every (row, token)
// sum is formed in the same order whatever n is (per-lane partials over a fixed K stride, then a
// fixed butterfly), so a token's result does not depend on its batch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

inline constexpr int64_t kGemvMaxTokens = 8;

// BF16 weights, cols % 8 == 0, data 16-byte aligned.
bool gemv_supports(const MatrixRef& w);

struct GemvParams {
  MatrixRef w;
  const float* x = nullptr;  // [n, ldx], 16-byte aligned rows (ldx % 4 == 0)
  int64_t ldx = 0;           // 0: w.cols
  int64_t n = 0;             // <= kGemvMaxTokens
  float* y = nullptr;        // [n, ldy]
  int64_t ldy = 0;           // 0: w.rows
  bool accumulate = false;
};
Status launch_gemv_bf16(const GemvParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
