// Device code shared by the tensor-core sink-attention kernels (attention_mma.cu on mma.sync,
// attention_sm90.cu on wgmma): both give each thread the rows r0 = 16 w + g and r1 = r0 + 8 of
// the heads (w the warp within its head group, g = lane / 4) and the dims half * D / 2 + 8 nt +
// 2 t + {0, 1} of the output, the m16n8 accumulator layout of mma.sync and wgmma alike.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"

namespace dsinfer::cuda::attn {

// The end of one query for the rows r0 / r1 of a warp (both sink-attention kernels): l summed
// over the quad, then either the normalised output (one split) or the split's unnormalised
// accumulators with its m (the running maximum, or the power-of-two reference M of the BF16
// kernel) and l into part = [nsplit][nq][heads][D + 2].
// kBf16Out: the kernel may be asked for out_bf16 (the wgmma kernel; the mma.sync kernels would
// spill at dim 512 with that epilogue compiled in), with rope_cs the query's inverse-rotation
// table (rope_cos_sin(pos, inv_freq[j], true) for j < rope_half, in shared memory): the sines and
// cosines once per query instead of inlined for every column pair, whose code (~14k
// instructions) overflowed the instruction cache once per query (8k prefill, ncu: 28% of the
// stall samples waiting for instructions).
template <int D, int NT, bool kBf16Out = false>
__device__ __forceinline__ void finish_query(const SinkAttentionParams& p,
                                             int64_t qi,
                                             int split,
                                             int nsplit,
                                             float* part,
                                             int half,
                                             int t,
                                             int r0,
                                             int r1,
                                             float m0,
                                             float m1,
                                             float l0,
                                             float l1,
                                             const float (&o)[NT][4],
                                             const float2* rope_cs = nullptr) {
  constexpr int HALF = D / 2;
  const int64_t heads = p.heads;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (kBf16Out && nsplit == 1 && p.out_bf16 != nullptr) {
    // Normalised, the RoPE dims turned back (rope_kernel's inverse, same operations), BF16
    // (RNE, two values per conversion).
    const float i0 = 1.0f / l0;
    const float i1 = 1.0f / l1;
    const int rope_from = D - 2 * static_cast<int>(p.rope_half);
    uint16_t* row = p.out_bf16 + qi * p.out_bf16_ld;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int d = half * HALF + 8 * nt + 2 * t;
      float a0 = o[nt][0] * i0;
      float b0 = o[nt][1] * i0;
      float a1 = o[nt][2] * i1;
      float b1 = o[nt][3] * i1;
      if (d >= rope_from) {
        const float2 cs = rope_cs[(d - rope_from) >> 1];
        rope_apply(a0, b0, cs);
        rope_apply(a1, b1, cs);
      }
      if (r0 < heads)
        *reinterpret_cast<__nv_bfloat162*>(row + r0 * D + d) = __floats2bfloat162_rn(a0, b0);
      if (r1 < heads)
        *reinterpret_cast<__nv_bfloat162*>(row + r1 * D + d) = __floats2bfloat162_rn(a1, b1);
    }
  } else if (nsplit == 1) {
    const float i0 = 1.0f / l0;
    const float i1 = 1.0f / l1;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int d = half * HALF + 8 * nt + 2 * t;
      if (r0 < heads) {
        float* out = p.out + (qi * heads + r0) * D + d;
        out[0] = o[nt][0] * i0;
        out[1] = o[nt][1] * i0;
      }
      if (r1 < heads) {
        float* out = p.out + (qi * heads + r1) * D + d;
        out[0] = o[nt][2] * i1;
        out[1] = o[nt][3] * i1;
      }
    }
  } else {
    // part = [nsplit][nq][heads][D + 2]: the unnormalised accumulators, then m and l.
    const int64_t stride = D + 2;
    float* base = part + (static_cast<int64_t>(split) * p.nq + qi) * heads * stride;
    // Column pairs as one 8-byte store each (rows are 8-byte aligned: D + 2 floats apart, the
    // scratch from the workspace): half the store instructions of scalar stores, each sector of
    // a row written by one instruction. Measured (H200, decode batch 1, ncu): two thirds of the
    // kernel's stall samples sat on the scalar stores.
    // (__stcg: st.global.cg.v2; through a plain float2 pointer nvcc split each pair into two
    // 4-byte stores in the wgmma kernel, whose decode splits then spent 65% of their stall
    // samples waiting on the store queue, H100 ncu.)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int d = half * HALF + 8 * nt + 2 * t;
      if (r0 < heads)
        __stcg(reinterpret_cast<float2*>(base + r0 * stride + d), make_float2(o[nt][0], o[nt][1]));
      if (r1 < heads)
        __stcg(reinterpret_cast<float2*>(base + r1 * stride + d), make_float2(o[nt][2], o[nt][3]));
    }
    if (half == 0 && t == 0) {
      if (r0 < heads) {
        base[r0 * stride + D] = m0;
        base[r0 * stride + D + 1] = l0;
      }
      if (r1 < heads) {
        base[r1 * stride + D] = m1;
        base[r1 * stride + D + 1] = l1;
      }
    }
  }
}

// Query qi's key tiles [t0, t1) that key split `split` of nsplit takes (tiles of `tile` keys),
// and its key list [kb, ke).
struct SplitRange {
  int64_t kb, ke, t0, t1;
};
__device__ __forceinline__ SplitRange
split_range(const SinkAttentionParams& p, int64_t qi, int split, int nsplit, int tile) {
  SplitRange r;
  r.kb = p.key_begin[qi];
  r.ke = p.key_begin[qi + 1];
  const int64_t tiles = (r.ke - r.kb + tile - 1) / tile;
  const int64_t per = (tiles + nsplit - 1) / nsplit;
  r.t0 = split * per;
  r.t1 = min(tiles, r.t0 + per);
  return r;
}

// The online-softmax step over one 32-key tile, for the rows r0 / r1 of a thread: s[nt][0..1]
// (row r0) and s[nt][2..3] (row r1) hold the scaled logits, -inf where masked. Takes the quad's
// row maxima, moves the running reference m, replaces s by the probabilities and rescales and
// adds them to l. kPow2 (the BF16-operand kernels): s holds u = logit * log2 e, the reference is
// the integer max(m, ceil(max u)) and the probabilities 2^(u - m), so the rescale factors are
// exact powers of two; otherwise m = max(m, max s) and the probabilities exp(s - m). Returns the
// factors (r0, r1) that rescale the accumulators.
template <bool kPow2>
__device__ __forceinline__ float2
softmax_step(float (&s)[4][4], float& m0, float& m1, float& l0, float& l1) {
  float mx0 = -INFINITY;
  float mx1 = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
    mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float n0 = fmaxf(m0, kPow2 ? ceilf(mx0) : mx0);
  const float n1 = fmaxf(m1, kPow2 ? ceilf(mx1) : mx1);
  const float c0 = kPow2 ? ldexpf(1.0f, static_cast<int>(m0 - n0)) : expf(m0 - n0);
  const float c1 = kPow2 ? ldexpf(1.0f, static_cast<int>(m1 - n1)) : expf(m1 - n1);
  m0 = n0;
  m1 = n1;
  l0 *= c0;
  l1 *= c1;
  auto prob = [](float v, float m) { return kPow2 ? exp2f(v - m) : expf(v - m); };
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    s[nt][0] = prob(s[nt][0], m0);
    s[nt][1] = prob(s[nt][1], m0);
    s[nt][2] = prob(s[nt][2], m1);
    s[nt][3] = prob(s[nt][3], m1);
    l0 += s[nt][0] + s[nt][1];  // the denominator takes the unrounded probabilities
    l1 += s[nt][2] + s[nt][3];
  }
  return make_float2(c0, c1);
}

}  // namespace dsinfer::cuda::attn
