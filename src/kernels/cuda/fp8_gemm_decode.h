// Dense FP8 linears at decode batch sizes (1 <= n <= kFp8DecodeMaxRows activation rows; the
// GEMV keeps n <= kGemvMaxTokens of weights with K > kFp8DecodeSmallBatchMaxK) on Hopper's wgmma,
// shaped for the weight bytes rather than the FLOPs: the weights are the MMAs' 64-row A operand and
// the tokens their N (32 or 64), so no tile pads the tokens to 128; K is split over the blocks of a
// thread-block cluster when the weight has few 128-row tiles (wq_a, wkv, wo_b), the splits' sums
// added in split order in distributed shared memory (no scratch, no second kernel); the scales are
// read in the checkpoint's and the activations' own layouts (no preparation pass).
//
// The contract of launch_fp8_linear (fp8_gemm.h), which takes this path for those row counts when
// the weight fits; each 128-wide K block is one wgmma chain from zero times both scales, added in
// K order (as the CUTLASS path above it), so results differ from the mma.sync tiles in fp32
// rounding only. A (row, token) sum does not depend on n within the path's range.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemv.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

inline constexpr int64_t kFp8DecodeMaxRows = 64;
// Up to kGemvMaxTokens rows too, for weights whose K is at most this: measured (H200, bench --ops,
// graph-timed over HBM-cold copies, 1 / 4 / 8 rows) against the FP8 GEMV (gemv.h), the share of
// copy bandwidth went wq_a (1024 x 4096) 13-14% -> 20%, wkv (512 x 4096) 8-9% -> 12%, wq_b
// (32768 x 1024) 55-56% -> 71-73%, shared.w1 (2048 x 4096) 21-22% -> 30-31%, the indexer's wq_b
// (8192 x 1024) 37-38% -> 35-38%; wo_b (4096 x 8192) lost, 50-52% -> 46%, and keeps the GEMV.
inline constexpr int64_t kFp8DecodeSmallBatchMaxK = 4096;

// FP8 block-128 weight with K % 128 == 0, 16-byte aligned rows, on an sm_90 device (and not
// DSINFER_FP8_DECODE=0 in the environment, which leaves these row counts to the other paths).
bool fp8_gemm_decode_supports(const MatrixRef& w);

// Whether launch_fp8_linear gives n rows of w to this kernel: kGemvMaxTokens < n <=
// kFp8DecodeMaxRows, or 1 <= n <= kGemvMaxTokens with w.cols <= kFp8DecodeSmallBatchMaxK; and
// fp8_gemm_decode_supports(w).
bool fp8_gemm_decode_takes(const MatrixRef& w, int64_t n);

// p.rows resolved (>= 0), 1 <= p.n <= kFp8DecodeMaxRows; p.scratch unused.
Status launch_fp8_gemm_decode(const Fp8LinearParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
