// Prefill-sized routed experts on Hopper's wgmma (moe_sm90.cu, CUTLASS's grouped block-scaled FP8
// GEMM): the experts re-encoded once into E4M3 with one power-of-two scale per 128 x 128 block
// (or, where E4M3 cannot hold a block's values under one scale, per row and 128-wide K block),
// the (token, slot) pairs gathered into expert order, one grouped GEMM for W1 and W3 together,
// SwiGLU with the clamp and the routing weight, the 1x128 FP8 quantisation of h, and a
// grouped GEMM for W2. Same contract as launch_fp8_expert_ffn (fp8_gemm.h): y in grouped order.
//
// The re-encoding is exact: an MXFP4 value e2m1 x 2^s (1x32 UE8M0 scales) equals the E4M3 value
// e2m1 x 2^(s - S) times 2^S for a per-block S when the nonzero 32-blocks' exponents s in the
// block lie within 14 binades of each other (6 x 2^6 <= 448 and 0.5 x 2^-8 >= 2^-9, E4M3's
// range); the re-encoder counts the row blocks where that fails, and such a set must not use that
// granularity. Both granularities give the same GEMM bits: every scale is a power of two, so a
// block scale moves each product's exponent, not its rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/moe_w4a8_sm90.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

struct MoeFp8Weights {
  uint8_t* w13 = nullptr;  // [n_experts][2 * inter][hidden]: W1's rows, then W3's
  float* s13 = nullptr;    // [n_experts][hidden / 128][2 * inter / scale_rows]
  uint8_t* w2 = nullptr;   // [n_experts][hidden][inter]
  float* s2 = nullptr;     // [n_experts][inter / 128][hidden / scale_rows]
  int64_t n_experts = 0;
  int64_t hidden = 0;
  int64_t inter = 0;
  int scale_rows = 1;  // weight rows per scale: 1 or 128
};

// Whether this build has the path (CUTLASS found at configure time).
constexpr bool moe_sm90_available() {
#if DSINFER_HAVE_CUTLASS
  return true;
#else
  return false;
#endif
}
// hidden and inter multiples of 128.
bool moe_sm90_supports(int64_t hidden, int64_t inter);
// scale_rows: 1 or 128 (checked).
int64_t moe_fp8_weights_bytes(int64_t n_experts, int64_t hidden, int64_t inter, int scale_rows);
// Lays the four arrays out in `base` (moe_fp8_weights_bytes bytes, 16-byte aligned).
MoeFp8Weights moe_fp8_weights_carve(
    void* base, int64_t n_experts, int64_t hidden, int64_t inter, int scale_rows);

// Re-encodes the experts (device MatrixRef arrays [n_experts], MXFP4 or FP8 block-128, uniform)
// into out at its scale_rows; adds to *inexact (device) the (row, K block)s that E4M3 cannot hold
// exactly under their scale (out is then unusable).
Status launch_moe_fp8_reencode(const MatrixRef* w1,
                               const MatrixRef* w3,
                               const MatrixRef* w2,
                               WeightFormat format,
                               const MoeFp8Weights& out,
                               int* inexact,
                               cudaStream_t stream);

struct MoeSm90Params {
  MoeFp8Weights w;
  // Or (n_experts > 0) the MXFP4 experts as they are, for the grouped W4A8 GEMMs instead of the
  // FP8 copy's (moe_w4a8_sm90.h; w is then unused).
  MoeMxfp4Weights w4;
  const int64_t* expert_begin = nullptr;  // device [n_experts + 1] (launch_moe_group); null: one
                                          // expert over every pair (the shared expert)
  const int32_t* pair_src = nullptr;      // device [num_pairs]: grouped row -> pair p; null: g
  int64_t k = 1;                          // slots per token: token = p / k
  const float* gates = nullptr;           // [pairs] by pair index
  Fp8Acts x;                              // token rows, k = hidden
  int64_t num_pairs = 0;
  float swiglu_limit = 0.0f;
  void* scratch = nullptr;  // moe_sm90_scratch_bytes, 256-byte aligned
  int64_t scratch_bytes = 0;
  float* y = nullptr;  // [num_pairs, hidden], grouped order
};
int64_t moe_sm90_scratch_bytes(int64_t n_experts, int64_t num_pairs, int64_t hidden, int64_t inter);
Status launch_moe_sm90(const MoeSm90Params& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
