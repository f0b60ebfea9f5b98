// Manifold-constrained hyper-connections (spec §3.2) on the GPU, per token, as kernels/cpu/mhc.h:
// the pre step (RMS-scaled mixing projection, sigmoid gates and the Sinkhorn-normalised comb
// matrix, fused in one block per token), the post step (expand + residual mix) and the head
// collapse. fp32 throughout; the mixing dot products accumulate in double like the CPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"

namespace dsinfer::cuda {

inline constexpr int64_t kMaxHc = 16;

// The mixing projections (rows x hc*hidden per token) split over kHcMixSplits column slices and
// many blocks when a scratch buffer is given (decode: one token would otherwise run on one block).
// Scratch: hc_mix_scratch_doubles(n, rows) doubles; rows = (2+hc)*hc for hc_pre, hc for hc_head.
inline constexpr int64_t kHcMixSplits = 16;
inline int64_t hc_mix_scratch_doubles(int64_t n, int64_t rows) {
  return n * (kHcMixSplits * rows + 1);
}

struct HcPreParams {
  const float* fn = nullptr;     // [(2+hc)*hc, hc*hidden]
  const float* base = nullptr;   // [(2+hc)*hc]
  const float* scale = nullptr;  // [3]
  int64_t hc = 4;                // <= kMaxHc
  int64_t hidden = 0;
  int64_t sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
  const float* x = nullptr;  // [n, hc, hidden]
  int64_t n = 0;
  float* post = nullptr;       // [n, hc]
  float* comb = nullptr;       // [n, hc, hc] (row j = input stream)
  float* collapsed = nullptr;  // [n, hidden]
  double* scratch = nullptr;   // optional, hc_mix_scratch_doubles(n, (2+hc)*hc): split mixing
};
Status launch_hc_pre(const HcPreParams& p, cudaStream_t stream);

// x_out[t, k] = post[t, k] * f[t] + sum_j comb[t, j, k] * x[t, j]; x_out must not alias x.
struct HcPostParams {
  int64_t hc = 4;
  int64_t hidden = 0;
  int64_t n = 0;
  const float* f = nullptr;     // [n, hidden]
  const float* x = nullptr;     // [n, hc, hidden]
  const float* post = nullptr;  // [n, hc]
  const float* comb = nullptr;  // [n, hc, hc]
  float* x_out = nullptr;       // [n, hc, hidden]
};
Status launch_hc_post(const HcPostParams& p, cudaStream_t stream);

// collapsed[t] = sum_j (sigmoid(scale * mix_j + base_j) + eps) x[t, j].
struct HcHeadParams {
  const float* fn = nullptr;     // [hc, hc*hidden]
  const float* base = nullptr;   // [hc]
  const float* scale = nullptr;  // [1]
  int64_t hc = 4;
  int64_t hidden = 0;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
  const float* x = nullptr;  // [n, hc, hidden]
  int64_t n = 0;
  float* collapsed = nullptr;  // [n, hidden]
  double* scratch = nullptr;   // optional, hc_mix_scratch_doubles(n, hc): split mixing
};
Status launch_hc_head(const HcHeadParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
