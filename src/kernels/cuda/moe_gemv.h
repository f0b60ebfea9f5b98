// Decode-sized experts (few pairs per expert): the W4A8 / W8A8 SwiGLU experts of fp8_gemm.h
// (Fp8ExpertFfnParams) as grouped GEMVs that stream each selected expert's weights once, in their
// checkpoint format.
//
// MXFP4 experts (moe_gemv_mxfp4.cu): a block is one warpgroup, one tile of <= 8 pairs and
// 64 MMA rows (gate/up: 32 rows of w1 and the same 32 of w3; down: 64 rows of w2); from 32 tiles a
// block takes 4 such row groups. The weights stream through a cp.async ring in shared memory; each
// 32-block's codes are re-encoded in registers as E4M3 (value x 2^-6, exact) and one m64n8k32 FP8
// wgmma per 32-block (tokens as N, staged in shared memory) sums its exact products in a fresh
// fp32 accumulator (the tensor core's own summation, as in the prefill GEMMs, over 32 products
// only); the row's E8M0 scale and then the token's activation scale apply in K order, in fp32.
// Any scale code but NaN (expert_gemv_check).
//
// FP8 experts: a block owns 16 weight rows of one expert and up to 8 of its pairs; its 4 warps
// take a quarter of K each and their sums are added in warp order (from 32 tiles a block owns 64
// rows, each warp 16 of them over all of K). Per 128-wide K block, lane (g, t) holds 32 weights of
// rows g and g + 8 and the same 32 activations of token g, converted to FP16 in registers, and
// eight m16n8k16 FP16 MMAs accumulate the block in fp32; the block's sum is then scaled by the
// activation and weight block scales and added in K order.
//
// Products are exact; only the fp32 summation order differs from the CPU and from the tile
// kernels, and a token's result does not depend on the other pairs of its tile.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/fp8_gemm.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

// Pairs per expert the GEMV path is meant for (an expert with more runs one tile per 8 pairs).
inline constexpr int64_t kExpertGemvTokens = 8;
// A single expert (the shared one, no expert_begin) takes the GEMVs up to this many pairs: its
// 8-pair tiles re-read its weights, from L2 (V4-Flash's shared expert is 25 MB), which still beats
// the tile kernels at decode batches.
inline constexpr int64_t kExpertGemvSingleMaxPairs = 64;

// Shapes the GEMV kernels take: hidden and inter multiples of 128.
bool expert_gemv_supports(int64_t hidden, int64_t inter);

// Counts into *bad (device int, added to) the (row, 128-block) pairs of MXFP4 experts with the NaN
// scale code, and once per matrix whose codes are not 16-byte or scales not 4-byte aligned: where
// the count is 0 the GEMV path takes these experts. FP8 experts need no check. w1/w3/w2: device
// arrays.
Status launch_expert_gemv_check(const MatrixRef* w1,
                                const MatrixRef* w3,
                                const MatrixRef* w2,
                                int64_t n_experts,
                                int64_t hidden,
                                int64_t inter,
                                int* bad,
                                cudaStream_t stream);

// Whether launch_expert_gemv takes these experts: their shape passes expert_gemv_supports and
// they are FP8 block-128, or MXFP4 whose launch_expert_gemv_check counts nothing (bad: one device
// int of scratch). Synchronises with the device (the model asks at load, bench --ops once).
Result<bool> expert_gemv_takes(const MatrixRef* w1,
                               const MatrixRef* w3,
                               const MatrixRef* w2,
                               WeightFormat format,
                               int64_t n_experts,
                               int64_t hidden,
                               int64_t inter,
                               int* bad);

// The experts of p (MXFP4 or FP8 block-128, passing expert_gemv_supports and, for MXFP4, the
// check) as GEMVs: gate/up + SwiGLU into h, h quantised into h_codes/h_scales, then down into y.
Status launch_expert_gemv(const Fp8ExpertFfnParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
