// Bandwidth-bound linears for a few tokens (decode). BF16 weights (the LM head, router and
// compressor projections): y[t, r] = sum_c w[r, c] * x[t, c] with fp32 FMAs on the exact BF16
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

// The same over FP8 block-128 weights (E8M0 or F32 scales) and fp32 x: per 128-wide K block an
// fp32 partial of the exact E4M3 values times x, then times the block's scale, summed in K order;
// `groups` independent products as in Bf16x2LinearParams (wo_a: group g = weight rows
// [g * rows, +rows), x columns [g * group_x, +cols), y columns [g * group_y, +rows)).
struct GemvFp8Params {
  MatrixRef w;
  int64_t rows = -1;  // rows per group; -1: w.rows / groups
  const float* x = nullptr;
  int64_t ldx = 0;  // 0: w.cols (one group)
  int64_t n = 0;    // <= kGemvMaxTokens
  float* y = nullptr;
  int64_t ldy = 0;  // 0: groups * rows
  bool accumulate = false;
  int64_t groups = 1;
  int64_t group_x = 0;
  int64_t group_y = 0;
};
// FP8 block-128 weights with cols % 128 == 0, 16-byte aligned data.
bool gemv_fp8_supports(const MatrixRef& w);
Status launch_gemv_fp8(const GemvFp8Params& p, cudaStream_t stream);

// FP8 weights times FP8 activations (the `deepseek` numerics' W8A8 linears) for n <= 8 tokens, on
// the FP8 tensor-core MMA (8 weight rows x 8 tokens per warp, K split over warps and blocks so
// that small weights still fill the GPU): per 32-wide K step an MMA from zero, times weight scale
// x activation scale, added in K order; then the warps' and blocks' partials in a fixed order.
// A token's result does not depend on n. K split over up to 8 blocks: one thread-block cluster
// per row group, summed through distributed shared memory; over more blocks (small weights) it
// needs scratch (fp8_gemv_scratch_floats).
struct Fp8GemvParams {
  MatrixRef w;
  int64_t row_begin = 0;
  int64_t rows = -1;
  const uint8_t* x_codes = nullptr;  // [n, x_ld] E4M3
  const float* x_scales = nullptr;   // [n, x_ld / 128]
  int64_t x_ld = 0;
  int64_t n = 0;  // <= kGemvMaxTokens
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;
  float* scratch = nullptr;
  int64_t scratch_floats = 0;
};
// FP8 block-128 weights, cols % 128 == 0, row_begin and rows multiples of 8, aligned data.
bool fp8_gemv_supports(const MatrixRef& w, int64_t row_begin, int64_t rows);
int64_t fp8_gemv_scratch_floats(int64_t rows, int64_t cols, int64_t n);
Status launch_fp8_gemv(const Fp8GemvParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
