// CPU reference ops.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/check.h"
#include "kernels/cpu/dot.h"
#include "numeric/float_formats.h"
#include "numeric/quant.h"

namespace dsinfer::cpu {

void linear(const MatrixRef& w, const float* x, int64_t n, float* y, bool quantize_activations) {
  linear_rows(w, 0, w.rows, x, n, y, quantize_activations);
}

void linear_rows(const MatrixRef& w,
                 int64_t row_begin,
                 int64_t row_count,
                 const float* x,
                 int64_t n,
                 float* y,
                 bool quantize_activations) {
  DSI_CHECK(!w.empty(), "linear on an unbound weight");
  DSI_CHECK(row_begin >= 0 && row_count >= 0 && row_begin + row_count <= w.rows,
            "rows [%lld, +%lld) of %lld",
            static_cast<long long>(row_begin),
            static_cast<long long>(row_count),
            static_cast<long long>(w.rows));
  const int64_t rows = row_count;
  const int64_t cols = w.cols;
  std::vector<float> xq;
  if (quantize_activations) {
    xq.assign(x, x + n * cols);
    for (int64_t t = 0; t < n; ++t) numeric::fp8_block_simulate(xq.data() + t * cols, cols, 128);
    x = xq.data();
  }
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    w.dequant_row(row_begin + r, row.data());
    for (int64_t t = 0; t < n; ++t) y[t * rows + r] = dot8(row.data(), x + t * cols, cols);
  }
}

void rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * dim;
    float* o = out + t * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = weight ? weight[i] * (xr[i] * r) : xr[i] * r;
  }
}

void rope_apply(
    float* x, int64_t dim, const std::vector<float>& inv_freq, int64_t position, bool inverse) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  float* r = x + (dim - 2 * half);
  const float pos = static_cast<float>(position);
  for (int64_t i = 0; i < half; ++i) {
    const float angle = pos * inv_freq[static_cast<size_t>(i)];  // fp32 product, as torch
    const float c = std::cos(angle);
    const float s = inverse ? -std::sin(angle) : std::sin(angle);
    const float a = r[2 * i];
    const float b = r[2 * i + 1];
    r[2 * i] = a * c - b * s;
    r[2 * i + 1] = a * s + b * c;
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0)
    return;
  const float m = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

void attention_with_sink(const float* q,
                         int64_t heads,
                         int64_t dim,
                         const std::vector<const float*>& keys,
                         const float* sinks,
                         float scale,
                         float* out) {
  const int64_t nk = static_cast<int64_t>(keys.size());
  std::vector<float> logits(static_cast<size_t>(nk));
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * dim;
    float* oh = out + h * dim;
    std::fill(oh, oh + dim, 0.0f);
    float m = sinks[h];
    for (int64_t j = 0; j < nk; ++j) {
      logits[j] = dot8(qh, keys[j], dim) * scale;
      m = std::max(m, logits[j]);
    }
    double denom = std::exp(static_cast<double>(sinks[h]) - m);
    for (int64_t j = 0; j < nk; ++j) {
      logits[j] = std::exp(logits[j] - m);
      denom += logits[j];
    }
    const float inv = static_cast<float>(1.0 / denom);
    for (int64_t j = 0; j < nk; ++j) {
      const float p = logits[j] * inv;
      const float* k = keys[j];
      for (int64_t d = 0; d < dim; ++d) oh[d] += p * k[d];
    }
  }
}

void attention_with_sink_bf16(const float* q,
                              int64_t heads,
                              int64_t dim,
                              const std::vector<const float*>& keys,
                              const float* sinks,
                              float scale,
                              float* out) {
  const int64_t nk = static_cast<int64_t>(keys.size());
  const float log2e = 1.4426950408889634f;
  const float c = scale * log2e;
  std::vector<float> u(static_cast<size_t>(nk));
  std::vector<float> qb(static_cast<size_t>(dim));
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * dim;
    float* oh = out + h * dim;
    std::fill(oh, oh + dim, 0.0f);
    for (int64_t d = 0; d < dim; ++d) qb[d] = numeric::round_to_bf16(qh[d]);
    const float us = sinks[h] * log2e;
    float umax = us;
    for (int64_t j = 0; j < nk; ++j) {
      u[j] = dot8(qb.data(), keys[j], dim) * c;
      umax = std::max(umax, u[j]);
    }
    const float m = std::ceil(umax);
    double denom = std::exp2(us - m);
    for (int64_t j = 0; j < nk; ++j) {
      const float e = std::exp2(u[j] - m);
      denom += e;
      const float p = numeric::round_to_bf16(e);
      const float* k = keys[j];
      for (int64_t d = 0; d < dim; ++d) oh[d] += p * k[d];
    }
    const float inv = static_cast<float>(1.0 / denom);
    for (int64_t d = 0; d < dim; ++d) oh[d] *= inv;
  }
}

std::vector<int32_t> top_k_indices(const float* scores, int64_t n, int64_t k) {
  DSI_CHECK(
      k >= 0 && k <= n, "top-k %lld of %lld", static_cast<long long>(k), static_cast<long long>(n));
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

}  // namespace dsinfer::cpu
