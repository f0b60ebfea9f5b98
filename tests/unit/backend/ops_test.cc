// CPU reference ops against straightforward double-precision formulations and invariants.
#include "kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/mhc.h"
#include "numeric/float_formats.h"

namespace dsinfer::cpu {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(Ops, AttentionWithSinkMatchesDoubleReference) {
  const int64_t heads = 3, dim = 16, nk = 7;
  const auto q = randn(heads * dim, 1);
  const auto kv = randn(nk * dim, 2);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f};
  std::vector<const float*> keys;
  for (int64_t j = 0; j < nk; ++j) keys.push_back(kv.data() + j * dim);
  std::vector<float> out(heads * dim);
  const float scale = 0.25f;
  attention_with_sink(q.data(), heads, dim, keys, sinks.data(), scale, out.data());
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<double> e(nk);
    double denom = std::exp(static_cast<double>(sinks[h]));
    for (int64_t j = 0; j < nk; ++j) {
      double s = 0;
      for (int64_t d = 0; d < dim; ++d) s += static_cast<double>(q[h * dim + d]) * kv[j * dim + d];
      e[j] = std::exp(s * scale);
      denom += e[j];
    }
    for (int64_t d = 0; d < dim; ++d) {
      double o = 0;
      for (int64_t j = 0; j < nk; ++j) o += e[j] / denom * kv[j * dim + d];
      EXPECT_NEAR(out[h * dim + d], o, 1e-5);
    }
  }
}

TEST(Ops, AttentionWithNoKeysIsZero) {
  const std::vector<float> q(8, 1.0f), sinks(2, 0.0f);
  std::vector<float> out(8, 7.0f);
  attention_with_sink(q.data(), 2, 4, {}, sinks.data(), 1.0f, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

// The BF16 operands of `deepseek` numerics (docs/numerics.md point 4) against a double-precision
// formulation that applies the three roundings by hand: q to BF16, each probability
// 2^(u - M) to BF16 before it weighs its value, the denominator from the unrounded ones.
TEST(Ops, AttentionWithSinkBf16RoundsQueryAndProbabilities) {
  const int64_t heads = 3, dim = 16, nk = 9;
  const auto q = randn(heads * dim, 11, 2.0f);
  auto kv = randn(nk * dim, 12);
  for (float& v : kv) v = numeric::round_to_bf16(v);  // the keys are stored BF16-exact
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f};
  std::vector<const float*> keys;
  for (int64_t j = 0; j < nk; ++j) keys.push_back(kv.data() + j * dim);
  const float scale = 0.25f;
  std::vector<float> out(heads * dim), ref32(heads * dim);
  attention_with_sink_bf16(q.data(), heads, dim, keys, sinks.data(), scale, out.data());
  attention_with_sink(q.data(), heads, dim, keys, sinks.data(), scale, ref32.data());
  const double log2e = 1.4426950408889634;
  double max_vs_fp32 = 0.0;
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<double> u(nk);
    double umax = sinks[h] * log2e;
    for (int64_t j = 0; j < nk; ++j) {
      double s = 0;
      for (int64_t d = 0; d < dim; ++d)
        s += static_cast<double>(numeric::round_to_bf16(q[h * dim + d])) * kv[j * dim + d];
      u[j] = s * scale * log2e;
      umax = std::max(umax, u[j]);
    }
    // Any integer reference gives the same rounded probabilities; use floor instead of ceil.
    const double m = std::floor(umax);
    double denom = std::exp2(sinks[h] * log2e - m);
    std::vector<double> p(nk);
    for (int64_t j = 0; j < nk; ++j) {
      const double e = std::exp2(u[j] - m);
      denom += e;
      p[j] = numeric::round_to_bf16(static_cast<float>(e));
    }
    for (int64_t d = 0; d < dim; ++d) {
      double o = 0;
      for (int64_t j = 0; j < nk; ++j) o += p[j] * kv[j * dim + d];
      o /= denom;
      // fp32 logits and exp2 may move a probability by one BF16 step only at a tie: the random
      // data here has none, so the bound is fp32 rounding.
      EXPECT_NEAR(out[h * dim + d], o, 2e-6 * (1.0 + std::fabs(o))) << h << " " << d;
      max_vs_fp32 = std::max(max_vs_fp32, std::fabs(o - ref32[h * dim + d]));
    }
  }
  // The roundings are visible: BF16 q and P move the output by ~2^-9 relative, fp32 would not.
  EXPECT_GT(max_vs_fp32, 1e-4);
}

// BF16 rounding commutes with powers of two, so the rounded probability does not depend on which
// integer reference M a tiled or split evaluation uses (the CUDA kernel's online softmax).
TEST(Ops, Bf16ProbabilityIsIndependentOfThePowerOfTwoReference) {
  std::mt19937 g(5);
  std::uniform_real_distribution<float> du(-30.0f, 0.0f);
  for (int i = 0; i < 10000; ++i) {
    const float u = du(g);
    const float a = numeric::round_to_bf16(std::exp2(u));
    for (int k : {1, 3, 17}) {
      const float b = numeric::round_to_bf16(std::exp2(u - static_cast<float>(k)));
      EXPECT_EQ(a, std::ldexp(b, k)) << u << " " << k;
    }
  }
}

// The CUDA kernel's evaluation order on the CPU: key tiles of 32 with a running integer
// reference, a split of the key list merged by powers of two. Every rounded probability equals
// the one-pass function's, so the outputs agree to fp32 summation order; rounding relative to a
// plain running maximum instead (exp(s - m), as DeepSeek's kernel does per block) would not.
TEST(Ops, Bf16AttentionIsIndependentOfTilingAndSplits) {
  const int64_t dim = 64, nk = 300;
  const auto q = randn(dim, 21, 2.0f);
  auto kv = randn(nk * dim, 22);
  for (float& v : kv) v = numeric::round_to_bf16(v);
  std::vector<const float*> keys;
  for (int64_t j = 0; j < nk; ++j) keys.push_back(kv.data() + j * dim);
  const float sink = 0.3f, scale = 0.125f;
  std::vector<float> want(dim);
  attention_with_sink_bf16(q.data(), 1, dim, keys, &sink, scale, want.data());
  const float log2e = 1.4426950408889634f;
  const float c = scale * log2e;
  std::vector<float> qb(q.begin(), q.end());
  for (float& v : qb) v = numeric::round_to_bf16(v);
  auto logit = [&](int64_t j) {
    float s = 0.0f;
    for (int64_t d = 0; d < dim; ++d) s += qb[d] * kv[j * dim + d];
    return s * c;
  };
  // One split [k0, k1): running state (M, l, acc) over 32-key tiles, integer M in base 2.
  struct Part {
    float m;
    double l;
    std::vector<float> acc;
  };
  auto run_split = [&](int64_t k0, int64_t k1, bool with_sink) {
    Part pt{std::ceil(sink * log2e), 0.0, std::vector<float>(dim, 0.0f)};
    if (with_sink)
      pt.l = std::exp2(sink * log2e - pt.m);
    for (int64_t t0 = k0; t0 < k1; t0 += 32) {
      const int64_t t1 = std::min(k1, t0 + 32);
      float mx = -INFINITY;
      for (int64_t j = t0; j < t1; ++j) mx = std::max(mx, logit(j));
      const float mn = std::max(pt.m, std::ceil(mx));
      const float corr = std::ldexp(1.0f, static_cast<int>(pt.m - mn));
      pt.m = mn;
      pt.l *= corr;
      for (float& a : pt.acc) a *= corr;
      for (int64_t j = t0; j < t1; ++j) {
        const float e = std::exp2(logit(j) - pt.m);
        pt.l += e;
        const float pb = numeric::round_to_bf16(e);
        for (int64_t d = 0; d < dim; ++d) pt.acc[d] += pb * kv[j * dim + d];
      }
    }
    return pt;
  };
  const Part a = run_split(0, 96, true);
  const Part b = run_split(96, nk, false);
  const float m = std::max(a.m, b.m);
  const float wa = std::ldexp(1.0f, static_cast<int>(a.m - m));
  const float wb = std::ldexp(1.0f, static_cast<int>(b.m - m));
  const double l = a.l * wa + b.l * wb;
  double max_abs = 0.0;
  for (int64_t d = 0; d < dim; ++d) {
    const double got = (a.acc[d] * wa + b.acc[d] * wb) / l;
    max_abs = std::max(max_abs, std::fabs(got - want[d]));
  }
  EXPECT_LT(max_abs, 1e-6);
  // The same tiles rounding exp(s - m) against the plain running maximum move the output by
  // BF16-level amounts (2^-9 relative per probability).
  float mrun = sink;
  double lr = std::exp(static_cast<double>(sink) - mrun);
  std::vector<double> acc(dim, 0.0);
  for (int64_t t0 = 0; t0 < nk; t0 += 32) {
    const int64_t t1 = std::min(nk, t0 + 32);
    float mx = mrun;
    for (int64_t j = t0; j < t1; ++j) mx = std::max(mx, logit(j) / log2e);
    const double corr = std::exp(static_cast<double>(mrun) - mx);
    mrun = mx;
    lr *= corr;
    for (double& v : acc) v *= corr;
    for (int64_t j = t0; j < t1; ++j) {
      const float e = std::exp(logit(j) / log2e - mrun);
      lr += e;
      const float pb = numeric::round_to_bf16(e);
      for (int64_t d = 0; d < dim; ++d) acc[d] += pb * kv[j * dim + d];
    }
  }
  double max_ds = 0.0;
  for (int64_t d = 0; d < dim; ++d) max_ds = std::max(max_ds, std::fabs(acc[d] / lr - want[d]));
  EXPECT_GT(max_ds, 10 * max_abs);
}

TEST(Ops, Bf16AttentionWithNoKeysIsZero) {
  const std::vector<float> q(8, 1.0f), sinks(2, 0.0f);
  std::vector<float> out(8, 7.0f);
  attention_with_sink_bf16(q.data(), 2, 4, {}, sinks.data(), 1.0f, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(Ops, RopeInverseUndoesRopeAndKeepsNope) {
  auto x = randn(128, 3);
  const auto orig = x;
  std::vector<float> inv(32);
  for (int i = 0; i < 32; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / 64.0f);
  rope_apply(x.data(), 128, inv, 1234, false);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(x[i], orig[i]);
  // Pair (x[64], x[65]) rotates by angle 1234 * inv[0].
  const double a = 1234.0;
  EXPECT_NEAR(x[64], orig[64] * std::cos(a) - orig[65] * std::sin(a), 1e-4);
  rope_apply(x.data(), 128, inv, 1234, true);
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(x[i], orig[i], 1e-5);
}

TEST(Ops, TopKOrdersByScoreThenIndex) {
  const std::vector<float> s = {1.0f, 3.0f, 3.0f, -1.0f, 2.0f};
  EXPECT_EQ(top_k_indices(s.data(), 5, 3), (std::vector<int32_t>{1, 2, 4}));
  EXPECT_TRUE(top_k_indices(s.data(), 5, 0).empty());
}

TEST(Ops, LinearRowsDequantisesFp8Blocks) {
  // 130 x 5 FP8 weight with two row blocks of scales.
  const int64_t rows = 130, cols = 5;
  std::vector<uint8_t> q(rows * cols);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>((i * 37) % 0x7e);
  const std::vector<uint8_t> scale = {126, 129};  // 0.5 and 4
  MatrixRef w;
  w.format = WeightFormat::kFp8Block128;
  w.dtype = DType::kF8E4M3;
  w.scale_dtype = DType::kF8E8M0;
  w.data = q.data();
  w.scale = scale.data();
  w.rows = rows;
  w.cols = cols;
  const auto x = randn(2 * cols, 4);
  std::vector<float> y(2 * 3);
  linear_rows(w, 127, 3, x.data(), 2, y.data(), false);
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t r = 0; r < 3; ++r) {
      double ref = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double s = (127 + r) < 128 ? 0.5 : 4.0;
        ref += numeric::fp8_e4m3_to_f32(q[(127 + r) * cols + c]) * s * x[t * cols + c];
      }
      EXPECT_NEAR(y[t * 3 + r], ref, 1e-4 * (1 + std::fabs(ref)));
    }
  }
}

TEST(Mhc, SinkhornGivesDoublyStochasticMix) {
  const int64_t hc = 4, hidden = 8;
  const auto fn = randn((2 + hc) * hc * hc * hidden, 5, 0.3f);
  const auto base = randn((2 + hc) * hc, 6);
  const std::vector<float> scale = {0.7f, 1.1f, 1.3f};
  const auto x = randn(hc * hidden, 7);
  HyperConnParams p;
  p.fn = fn.data();
  p.base = base.data();
  p.scale = scale.data();
  p.hc = hc;
  p.hidden = hidden;
  std::vector<float> post(hc), comb(hc * hc), collapsed(hidden);
  hc_pre(p, x.data(), post.data(), comb.data(), collapsed.data());
  for (int64_t k = 0; k < hc; ++k) {
    double col = 0, row = 0;
    for (int64_t j = 0; j < hc; ++j) {
      col += comb[j * hc + k];
      row += comb[k * hc + j];
    }
    EXPECT_NEAR(col, 1.0, 1e-5);
    EXPECT_NEAR(row, 1.0, 1e-3);
    EXPECT_GT(post[k], 0.0f);
    EXPECT_LT(post[k], 2.0f);
  }
  // post step: with f = 0 the output is the comb-mixed input.
  std::vector<float> f(hidden, 0.0f), out(hc * hidden);
  hc_post(hc, hidden, f.data(), x.data(), post.data(), comb.data(), out.data());
  double ref = 0;
  for (int64_t j = 0; j < hc; ++j) ref += comb[j * hc + 2] * x[j * hidden + 3];
  EXPECT_NEAR(out[2 * hidden + 3], ref, 1e-5);
}

}  // namespace
}  // namespace dsinfer::cpu
