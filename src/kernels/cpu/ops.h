// CPU reference ops: plain loops with fp32 arithmetic. They are the oracle the CUDA kernels are
// tested against, so clarity beats speed here. Row-major everywhere; shapes in comments.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/matrix_ref.h"

namespace dsinfer::cpu {

// y[t, r] = sum_c w[r, c] * x[t, c].  x: [n, w.cols], y: [n, w.rows] (overwritten).
// With quantize_activations each row of x is first rounded through 1x128 UE8M0 FP8
// (the DeepSeek activation quantisation before FP8/FP4 GEMMs).
void linear(const MatrixRef& w, const float* x, int64_t n, float* y, bool quantize_activations);

// Same over the output rows [row_begin, row_begin + row_count) only: y is [n, row_count].
void linear_rows(const MatrixRef& w,
                 int64_t row_begin,
                 int64_t row_count,
                 const float* x,
                 int64_t n,
                 float* y,
                 bool quantize_activations);

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * (weight ? weight : 1), over rows of `dim`.
// In-place is allowed (out == x).
void rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* out);

// Interleaved (GPT-J) RoPE on the last 2*inv_freq.size() dims of a `dim`-wide vector at
// `position`; `inverse` rotates by -position (the conjugate rotation).
void rope_apply(
    float* x, int64_t dim, const std::vector<float>& inv_freq, int64_t position, bool inverse);

// Numerically stable softmax over n values, in place.
void softmax(float* x, int64_t n);

float silu(float x);
float softplus(float x);  // torch semantics: x for x > 20

// Attention of one query over a set of shared K=V vectors with a per-head sink in the
// denominator.  q: [heads, dim]; keys[j]: pointer to a dim-wide K=V vector; out: [heads, dim].
void attention_with_sink(const float* q,
                         int64_t heads,
                         int64_t dim,
                         const std::vector<const float*>& keys,
                         const float* sinks,
                         float scale,
                         float* out);

// attention_with_sink with the BF16 operands of DeepSeek's attention kernel (`deepseek` numerics,
// docs/numerics.md point 4). Per head h, with log2e = fp32(log2 e) and c = fp32(scale * log2e):
//   qb = bf16(q_h) (RNE); u_j = fp32(qb . k_j) * c; u_s = sinks[h] * log2e;
//   M = ceil(max(u_s, u_j)) (an integer: every rescaling by 2^(M' - M) is exact);
//   e_j = exp2f(u_j - M) (fp32, unrounded); l = exp2f(u_s - M) + sum_j e_j;
//   out_h = (sum_j bf16(e_j) k_j) / l, the sum in fp32 in key order.
// The keys are used as given (the caller stores them BF16-exact). Because bf16 rounding commutes
// with powers of two, bf16(e_j) does not depend on which integer M a tiled or split evaluation
// uses, so the CUDA kernel's online softmax rounds the same probabilities.
void attention_with_sink_bf16(const float* q,
                              int64_t heads,
                              int64_t dim,
                              const std::vector<const float*>& keys,
                              const float* sinks,
                              float scale,
                              float* out);

// Indices of the k largest values of scores[0, n) (k <= n), ordered by descending score, ties
// broken towards the lower index.
std::vector<int32_t> top_k_indices(const float* scores, int64_t n, int64_t k);

}  // namespace dsinfer::cpu
