// Device code shared by the tensor-core sink-attention kernels (attention_mma.cu on mma.sync,
// attention_sm90.cu on wgmma): both give each thread the rows r0 = 16 w + g and r1 = r0 + 8 of
// the heads (w the warp within its head group, g = lane / 4) and the dims half * D / 2 + 8 nt +
// 2 t + {0, 1} of the output, the m16n8 accumulator layout of mma.sync and wgmma alike.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention.h"

namespace dsinfer::cuda::attn {

// The end of one query for the rows r0 / r1 of a warp (both sink-attention kernels): l summed
// over the quad, then either the normalised output (one split) or the split's unnormalised
// accumulators with its m (the running maximum, or the power-of-two reference M of the BF16
// kernel) and l into part = [nsplit][nq][heads][D + 2].
template <int D, int NT>
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
                                             const float (&o)[NT][4]) {
  constexpr int HALF = D / 2;
  const int64_t heads = p.heads;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (nsplit == 1) {
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
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int d = half * HALF + 8 * nt + 2 * t;
      if (r0 < heads) {
        base[r0 * stride + d] = o[nt][0];
        base[r0 * stride + d + 1] = o[nt][1];
      }
      if (r1 < heads) {
        base[r1 * stride + d] = o[nt][2];
        base[r1 * stride + d + 1] = o[nt][3];
      }
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

}  // namespace dsinfer::cuda::attn
