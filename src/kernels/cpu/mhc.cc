// mHC on the CPU (spec §3.2).
#include "kernels/cpu/mhc.h"

#include <cmath>
#include <vector>

#include "base/check.h"

namespace dsinfer::cpu {

namespace {
float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// mix[i] = rsqrt(mean(x^2) + eps) * (fn[i] . x) for i < rows; x has width hc*hidden.
void rms_scaled_mix(
    const float* fn, int64_t rows, const float* x, int64_t width, float eps, float* mix) {
  double ss = 0.0;
  for (int64_t i = 0; i < width; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(width)) + eps);
  for (int64_t i = 0; i < rows; ++i) {
    const float* w = fn + i * width;
    double acc = 0.0;
    for (int64_t c = 0; c < width; ++c) acc += static_cast<double>(w[c]) * (x[c] * r);
    mix[i] = static_cast<float>(acc);
  }
}
}  // namespace

void hc_pre(const HyperConnParams& p, const float* x, float* post, float* comb, float* collapsed) {
  const int64_t hc = p.hc;
  const int64_t mix_rows = (2 + hc) * hc;
  DSI_CHECK(hc > 0 && hc <= 16, "hc_mult %lld", static_cast<long long>(hc));
  float mix[(2 + 16) * 16];
  rms_scaled_mix(p.fn, mix_rows, x, hc * p.hidden, p.norm_eps, mix);
  hc_pre_mixed(p, mix, x, post, comb, collapsed);
}

void hc_pre_mixed(const HyperConnParams& p,
                  const float* mix,
                  const float* x,
                  float* post,
                  float* comb,
                  float* collapsed) {
  const int64_t hc = p.hc;
  DSI_CHECK(hc > 0 && hc <= 16, "hc_mult %lld", static_cast<long long>(hc));
  float pre[16];
  for (int64_t j = 0; j < hc; ++j) {
    pre[j] = sigmoid(mix[j] * p.scale[0] + p.base[j]) + p.hc_eps;
    post[j] = 2.0f * sigmoid(mix[hc + j] * p.scale[1] + p.base[hc + j]);
  }
  // comb logits, row j = input stream, column k = output stream; softmax over k.
  for (int64_t j = 0; j < hc; ++j) {
    float* row = comb + j * hc;
    float m = -INFINITY;
    for (int64_t k = 0; k < hc; ++k) {
      row[k] = mix[2 * hc + j * hc + k] * p.scale[2] + p.base[2 * hc + j * hc + k];
      m = std::fmax(m, row[k]);
    }
    float s = 0.0f;
    for (int64_t k = 0; k < hc; ++k) {
      row[k] = std::exp(row[k] - m);
      s += row[k];
    }
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / s + p.hc_eps;
  }
  auto normalise_columns = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float s = 0.0f;
      for (int64_t j = 0; j < hc; ++j) s += comb[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) comb[j * hc + k] /= (s + p.hc_eps);
    }
  };
  auto normalise_rows = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      float s = 0.0f;
      for (int64_t k = 0; k < hc; ++k) s += comb[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) comb[j * hc + k] /= (s + p.hc_eps);
    }
  };
  normalise_columns();
  for (int64_t it = 0; it + 1 < p.sinkhorn_iters; ++it) {
    normalise_rows();
    normalise_columns();
  }
  for (int64_t c = 0; c < p.hidden; ++c) {
    float acc = 0.0f;
    for (int64_t j = 0; j < hc; ++j) acc += pre[j] * x[j * p.hidden + c];
    collapsed[c] = acc;
  }
}

void hc_post(int64_t hc,
             int64_t hidden,
             const float* f,
             const float* x,
             const float* post,
             const float* comb,
             float* x_out) {
  for (int64_t k = 0; k < hc; ++k) {
    float* o = x_out + k * hidden;
    for (int64_t c = 0; c < hidden; ++c) {
      float acc = post[k] * f[c];
      for (int64_t j = 0; j < hc; ++j) acc += comb[j * hc + k] * x[j * hidden + c];
      o[c] = acc;
    }
  }
}

void hc_head(const HyperHeadParams& p, const float* x, float* collapsed) {
  const int64_t hc = p.hc;
  DSI_CHECK(hc > 0 && hc <= 16, "hc_mult %lld", static_cast<long long>(hc));
  float mix[16];
  rms_scaled_mix(p.fn, hc, x, hc * p.hidden, p.norm_eps, mix);
  hc_head_mixed(p, mix, x, collapsed);
}

void hc_head_mixed(const HyperHeadParams& p, const float* mix, const float* x, float* collapsed) {
  const int64_t hc = p.hc;
  DSI_CHECK(hc > 0 && hc <= 16, "hc_mult %lld", static_cast<long long>(hc));
  float pre[16];
  for (int64_t j = 0; j < hc; ++j) {
    pre[j] = 1.0f / (1.0f + std::exp(-(mix[j] * p.scale[0] + p.base[j]))) + p.hc_eps;
  }
  for (int64_t c = 0; c < p.hidden; ++c) {
    float acc = 0.0f;
    for (int64_t j = 0; j < hc; ++j) acc += pre[j] * x[j * p.hidden + c];
    collapsed[c] = acc;
  }
}

}  // namespace dsinfer::cpu
