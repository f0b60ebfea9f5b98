// Manifold-constrained hyper-connections (mHC, spec §3.2) on the CPU: the pre step (stream
// collapse + mixing coefficients with Sinkhorn), the post step (expand + residual mix) and the
// final head collapse. All arithmetic in fp32.
#pragma once

#include <cstdint>

namespace dsinfer::cpu {

struct HyperConnParams {
  const float* fn = nullptr;     // [(2+hc)*hc, hc*hidden]
  const float* base = nullptr;   // [(2+hc)*hc]
  const float* scale = nullptr;  // [3]
  int64_t hc = 4;
  int64_t hidden = 0;
  int64_t sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;  // the RMS uses rms_norm_eps, not hc_eps
};

// For one token: x [hc, hidden] -> post [hc], comb [hc, hc] (row j = input stream),
// collapsed [hidden] = sum_j pre_j x_j.
void hc_pre(const HyperConnParams& p, const float* x, float* post, float* comb, float* collapsed);
// The same from mix[(2+hc)*hc] = rsqrt(mean(x^2) + norm_eps) * (fn . x) computed by the caller
// (the fast path computes it for all tokens of a step with one GEMM).
void hc_pre_mixed(const HyperConnParams& p,
                  const float* mix,
                  const float* x,
                  float* post,
                  float* comb,
                  float* collapsed);

// For one token: x_out[k] = post[k] * f + sum_j comb[j, k] * x[j]. x_out may not alias x.
void hc_post(int64_t hc,
             int64_t hidden,
             const float* f,
             const float* x,
             const float* post,
             const float* comb,
             float* x_out);

struct HyperHeadParams {
  const float* fn = nullptr;     // [hc, hc*hidden]
  const float* base = nullptr;   // [hc]
  const float* scale = nullptr;  // [1]
  int64_t hc = 4;
  int64_t hidden = 0;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
};

// For one token: collapsed [hidden] = sum_j (sigmoid(scale * mix_j + base_j) + eps) x_j.
void hc_head(const HyperHeadParams& p, const float* x, float* collapsed);
// The same from mix[hc] = rsqrt(mean(x^2) + norm_eps) * (fn . x) computed by the caller.
void hc_head_mixed(const HyperHeadParams& p, const float* mix, const float* x, float* collapsed);

}  // namespace dsinfer::cpu
