// Decode-sized experts (few pairs per expert): the W4A8 / W8A8 SwiGLU experts of fp8_gemm.h
// (Fp8ExpertFfnParams) as grouped GEMVs that stream each selected expert's weights once, in their
// checkpoint format, straight from global memory into registers.
//
// A block owns 16 weight rows of one expert and up to 8 of its pairs (tokens); its 4 warps take a
// contiguous quarter of K each and their sums are added in warp order. From 32 tiles (batch 64:
// ~250) a block owns 64 rows instead, each warp 16 of them over all of K (no barrier between the
// warps; the summation order then differs from the split form's). Per 128-wide K block,
// lane (g, t) holds 32 consecutive weights of rows g and g + 8 (MXFP4: one 32-block, 16
// bytes; FP8: 32 bytes) and the same 32 activations of token g, converted to FP16 in registers,
// and eight m16n8k16 FP16 MMAs (weights as A, tokens as B) accumulate the block in fp32; the
// block's sum is then scaled by the activation scale (and the FP8 block scale) and added in K
// order. MXFP4's per-32 E8M0 scales are folded into the FP16 weights relative to the 128-block's
// first 32-block (exact while the other three lie within 13 binades of it, which
// expert_gemv_check counts at load time), that first scale into the block's factor. Products are
// exact; only the fp32 summation order differs from the CPU and from the tile kernels, and a
// token's result does not depend on the other pairs of its tile.
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

// Counts into *bad (device int, added to) the (row, 128-block) pairs of MXFP4 experts where an
// E8M0 scale lies more than 13 binades from the block's first (or is the NaN code): where the
// count is 0 the GEMV path is exact for these experts. FP8 experts need no check. w1/w3/w2:
// device arrays.
Status launch_expert_gemv_check(const MatrixRef* w1,
                                const MatrixRef* w3,
                                const MatrixRef* w2,
                                int64_t n_experts,
                                int64_t hidden,
                                int64_t inter,
                                int* bad,
                                cudaStream_t stream);

// The experts of p (MXFP4 or FP8 block-128, passing expert_gemv_supports and, for MXFP4, the
// check) as GEMVs: gate/up + SwiGLU into h, h quantised into h_codes/h_scales, then down into y.
Status launch_expert_gemv(const Fp8ExpertFfnParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
