// Manifold-constrained hyper-connections (spec §3.2) on the GPU, per token, as kernels/cpu/mhc.h:
// the pre step (RMS-scaled mixing projection, sigmoid gates and the Sinkhorn-normalised comb
// matrix, the collapse and optionally the sub-layer's RMSNorm), the post step (expand + residual
// mix; fused into the next pre step's mixing kernel when given as `pending`) and the head
// collapse. fp32 throughout; the mixing dot products accumulate in double like the CPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"

namespace dsinfer::cuda {

inline constexpr int64_t kMaxHc = 16;

// The mixing projections run as a first kernel over many blocks (kHcMixSplits slices of every
// token's streams; a decode token would otherwise run on one block): per token and slice, the
// dot products of the raw streams with every mixing row and their sum of squares, in double,
// into a scratch buffer of hc_mix_scratch_doubles(n, rows) doubles (rows = (2+hc)*hc for hc_pre,
// hc for hc_head). The per-token kernel then sums the slices in order and scales by the RMS
// factor: mix_i = r * (fn_i . x) where the CPU computes fn_i . (x * r) (the two differ by one fp32
// rounding of each x * r, ~1e-7 relative).
inline constexpr int64_t kHcMixSplits = 16;
inline int64_t hc_mix_scratch_doubles(int64_t n, int64_t rows) {
  return n * kHcMixSplits * (rows + 1);
}

// The previous sub-layer's post step, applied by the next mixing kernel on its way (all set or
// all null): x_out = post * f + comb^T x is written and the mix reads it instead of x.
struct HcPending {
  const float* f = nullptr;     // [n, hidden]
  const float* post = nullptr;  // [n, hc]
  const float* comb = nullptr;  // [n, hc, hc]
  float* x_out = nullptr;       // [n, hc, hidden], must not alias x
  bool set() const { return f != nullptr; }
};

struct HcPreParams {
  const float* fn = nullptr;     // [(2+hc)*hc, hc*hidden]
  const float* base = nullptr;   // [(2+hc)*hc]
  const float* scale = nullptr;  // [3]
  int64_t hc = 4;                // <= kMaxHc
  int64_t hidden = 0;
  int64_t sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;    // the mHC RMS and the collapse norm
  const float* x = nullptr;  // [n, hc, hidden]
  int64_t n = 0;
  HcPending pending{};                 // optional: the previous post step, applied first
  const float* norm_weight = nullptr;  // optional: collapsed = rms_norm(collapsed) * weight
  float* post = nullptr;               // [n, hc]
  float* comb = nullptr;               // [n, hc, hc] (row j = input stream)
  float* collapsed = nullptr;          // [n, hidden]
  double* scratch = nullptr;           // hc_mix_scratch_doubles(n, (2+hc)*hc)
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

// collapsed[t] = sum_j (sigmoid(scale * mix_j + base_j) + eps) x[t, j], optionally RMS-normed.
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
  const float* norm_weight = nullptr;  // optional: collapsed = rms_norm(collapsed) * weight
  float* collapsed = nullptr;          // [n, hidden]
  double* scratch = nullptr;           // hc_mix_scratch_doubles(n, hc)
};
Status launch_hc_head(const HcHeadParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
