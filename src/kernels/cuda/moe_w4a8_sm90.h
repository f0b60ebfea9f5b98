// The routed experts' grouped GEMMs on Hopper's FP8 wgmma straight from their MXFP4 weights
// (W4A8): the prefill path of moe_sm90.h without the FP8 copy of the experts (twice the MXFP4
// bytes in memory and in every GEMM's weight reads).
//
// Per 128-wide K block of a weight row the kernel uses the FP8 copy's per-row encoding
// (moe_sm90.h, scale_rows 1): scale S = 2^(max nonzero 32-block exponent - 6) and each value
// e2m1 x 2^(s - S) in E4M3, exact while the row block's 32-block exponents lie within 14 binades
// of each other. The block exponents are computed once at load (launch_moe_mxfp4_scales, which
// counts the row blocks outside that range: such an expert set must not use this path); the
// E4M3 codes are made in registers as the MMAs' A operand, so the GEMM's products and their
// scales are the FP8 copy's. The activations come in moe_w4a8_k_order.cuh's K order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

struct MoeMxfp4Weights {
  // Device arrays of MatrixRef [n_experts] (MXFP4: data [rows][cols / 2], scale [rows][cols / 32]).
  const MatrixRef* w1 = nullptr;  // [inter][hidden]
  const MatrixRef* w3 = nullptr;  // [inter][hidden]
  const MatrixRef* w2 = nullptr;  // [hidden][inter]
  // Biased exponents of the 128-block scales, K block major: exp13 [n_experts][hidden / 128]
  // [2 * inter] (W1's rows, then W3's), exp2 [n_experts][inter / 128][hidden].
  uint8_t* exp13 = nullptr;
  uint8_t* exp2 = nullptr;
  int64_t n_experts = 0;
  int64_t hidden = 0;
  int64_t inter = 0;
};

// Whether this build and device can run the kernels (sm_90a code compiled in).
bool moe_w4a8_available();
// hidden and inter multiples of 128.
bool moe_w4a8_supports(int64_t hidden, int64_t inter);
int64_t moe_mxfp4_exponent_bytes(int64_t n_experts, int64_t hidden, int64_t inter);
// exp13 and exp2 laid out in base (moe_mxfp4_exponent_bytes bytes); the other fields set.
MoeMxfp4Weights moe_mxfp4_weights_carve(void* base,
                                        const MatrixRef* w1,
                                        const MatrixRef* w3,
                                        const MatrixRef* w2,
                                        int64_t n_experts,
                                        int64_t hidden,
                                        int64_t inter);
// Fills w's exponent arrays from the experts' 32-block scales and adds to *inexact (device) the
// row blocks whose values E4M3 cannot hold exactly under their block scale.
Status launch_moe_mxfp4_scales(const MoeMxfp4Weights& w, int* inexact, cudaStream_t stream);

// One grouped GEMM: d[g, :] = sum over K blocks of (a_g . W_e[rows]) * sa * S for the grouped
// rows g of each expert e (rows expert_begin[e] .. expert_begin[e + 1]). pass 0: W = [W1; W3]
// (n = 2 * inter, k = hidden); pass 1: W = W2 (n = hidden, k = inter).
struct MoeW4a8GemmParams {
  MoeMxfp4Weights w;
  int pass = 0;
  const int64_t* expert_begin = nullptr;  // device [n_experts + 1]
  const uint8_t* a = nullptr;  // [num_pairs][k] E4M3 (moe_w4a8_k_order.cuh), 16-byte aligned rows
  const float* sa = nullptr;   // per expert e at expert_begin[e] * (k / 128): [k / 128][m_e]
  int64_t num_pairs = 0;
  float* d = nullptr;  // [num_pairs][n]
};
Status launch_moe_w4a8_gemm(const MoeW4a8GemmParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
