// The V4.1 kernels (kernels/cuda/v41.h) against CPU references: the record simulations bit for
// bit against cpu_v41's, the mHC mixes / collapse / post step, the compressor pooling, the
// two-level selection and the Engram gate against the loops of V41CpuModel they mirror.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu_v41/model.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/v41.h"
#include "test_util.h"

namespace dsinfer::cuda::test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows whose 16/32-blocks span many magnitudes (scale choices near the format limits).
std::vector<float> spread_values(int64_t rows, int64_t len, uint32_t seed) {
  std::vector<float> v = normal_floats(static_cast<size_t>(rows * len), seed);
  std::mt19937 g(seed + 1);
  for (int64_t b = 0; b < rows * len / 16; ++b) {
    const float m = std::ldexp(1.0f, static_cast<int>(g() % 40) - 20);
    for (int i = 0; i < 16; ++i) v[static_cast<size_t>(b * 16 + i)] *= m;
  }
  return v;
}

// launch_top_k over nq rows of scores (ld apart), row q's first count[q] candidates.
Status top_k(
    const float* scores, int64_t ld, const int64_t* count, int64_t nq, int64_t k, int32_t* out) {
  TopKParams p;
  p.scores = scores;
  p.ld = ld;
  p.n = count;
  p.nq = nq;
  p.k = k;
  p.out = out;
  return launch_top_k(p, nullptr);
}

class V41OpsTest : public GpuTest {};

TEST_F(V41OpsTest, QuantSimulationsMatchCpuBitForBit) {
  const int64_t rows = 37, len = 512;
  for (V41Quant kind : {V41Quant::kFp8Window, V41Quant::kFp4Index, V41Quant::kFp4Compressed}) {
    for (bool clamp : {false, true}) {
      std::vector<float> x = spread_values(rows, len, 11);
      DevVec<float> d(x);
      V41QuantParams p;
      p.x = d.get();
      p.rows = rows;
      p.len = len;
      p.kind = kind;
      p.clamp_scale = clamp;
      DSI_EXPECT_OK(launch_v41_quant(p, nullptr));
      sync();
      for (int64_t r = 0; r < rows; ++r) {
        float* row = x.data() + r * len;
        if (kind == V41Quant::kFp8Window)
          cpu_v41::fp8_window_quant(row, len);
        else if (kind == V41Quant::kFp4Index)
          cpu_v41::fp4_index_quant(row, len);
        else
          cpu_v41::fp4_compressed_quant(row, len, clamp);
      }
      const std::vector<float> got = d.download();
      EXPECT_EQ(std::memcmp(got.data(), x.data(), x.size() * sizeof(float)), 0)
          << "kind " << static_cast<int>(kind) << " clamp " << clamp;
    }
  }
}

// The CPU's mixes (V41CpuModel::mixes), written out for the test.
void cpu_mixes(const std::vector<float>& fn,
               const std::vector<float>& base,
               const std::vector<float>& scale,
               int64_t hc,
               int64_t D,
               int64_t iters,
               float hc_eps,
               float norm_eps,
               const float* X,
               float* pre,
               float* post,
               float* comb) {
  const int64_t flat = hc * D, mix = (2 + hc) * hc;
  double ss = 0.0;
  for (int64_t i = 0; i < flat; ++i) ss += static_cast<double>(X[i]) * X[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(flat)) + norm_eps);
  std::vector<float> mu(static_cast<size_t>(mix));
  for (int64_t k = 0; k < mix; ++k) {
    double acc = 0.0;
    for (int64_t i = 0; i < flat; ++i) acc += static_cast<double>(fn[k * flat + i]) * X[i];
    mu[static_cast<size_t>(k)] = static_cast<float>(acc) * r;
  }
  auto sig = [](float v) { return 1.0f / (1.0f + std::exp(-v)); };
  for (int64_t j = 0; j < hc; ++j) {
    pre[j] = sig(mu[j] * scale[0] + base[j]) + hc_eps;
    post[j] = 2.0f * sig(mu[hc + j] * scale[1] + base[hc + j]);
  }
  for (int64_t j = 0; j < hc; ++j) {
    float* row = comb + j * hc;
    for (int64_t k = 0; k < hc; ++k)
      row[k] = mu[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
    cpu::softmax(row, hc);
    for (int64_t k = 0; k < hc; ++k) row[k] += hc_eps;
  }
  auto col = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float s = 0.0f;
      for (int64_t j = 0; j < hc; ++j) s += comb[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) comb[j * hc + k] /= s + hc_eps;
    }
  };
  auto row_n = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      float s = 0.0f;
      for (int64_t k = 0; k < hc; ++k) s += comb[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) comb[j * hc + k] /= s + hc_eps;
    }
  };
  col();
  for (int64_t it = 0; it < iters - 1; ++it) {
    row_n();
    col();
  }
}

TEST_F(V41OpsTest, HcMixCollapseAndPostMatchCpu) {
  const int64_t hc = 4, D = 320, n = 5, mix = (2 + hc) * hc, flat = hc * D;
  const std::vector<float> fn = normal_floats(static_cast<size_t>(mix * flat), 3, 0.05f);
  const std::vector<float> base = normal_floats(static_cast<size_t>(mix), 4, 0.5f);
  const std::vector<float> scale = {0.7f, 1.3f, 0.9f};
  const std::vector<float> X = normal_floats(static_cast<size_t>(n * flat), 5);
  const std::vector<float> pi = normal_floats(static_cast<size_t>(n * hc), 6);
  const std::vector<float> F = normal_floats(static_cast<size_t>(n * D), 7);
  DevVec<float> dfn(fn), dbase(base), dscale(scale), dX(X), dpi(pi), dF(F);
  DevVec<float> pre(static_cast<size_t>(n * hc)), post(static_cast<size_t>(n * hc));
  DevVec<float> comb(static_cast<size_t>(n * hc * hc)), u(static_cast<size_t>(n * D));
  DevVec<float> mean(static_cast<size_t>(n * D)), Xo(static_cast<size_t>(n * flat));
  V41HcMixParams mp;
  mp.fn = dfn.get();
  mp.base = dbase.get();
  mp.scale = dscale.get();
  mp.hc = hc;
  mp.hidden = D;
  mp.x = dX.get();
  mp.n = n;
  mp.pre = pre.get();
  mp.post = post.get();
  mp.comb = comb.get();
  DSI_EXPECT_OK(launch_v41_hc_mix(mp, nullptr));
  V41CollapseParams cp;
  cp.x = dX.get();
  cp.pi = dpi.get();
  cp.n = n;
  cp.hc = hc;
  cp.hidden = D;
  cp.out = u.get();
  DSI_EXPECT_OK(launch_v41_collapse(cp, nullptr));
  cp.mean = true;
  cp.out = mean.get();
  DSI_EXPECT_OK(launch_v41_collapse(cp, nullptr));
  V41HcPostParams pp;
  pp.hc = hc;
  pp.hidden = D;
  pp.n = n;
  pp.f = dF.get();
  pp.x = dX.get();
  pp.post = post.get();
  pp.comb = comb.get();
  pp.x_out = Xo.get();
  DSI_EXPECT_OK(launch_v41_hc_post(pp, nullptr));
  sync();
  std::vector<float> wpre(static_cast<size_t>(n * hc)), wpost(wpre.size());
  std::vector<float> wcomb(static_cast<size_t>(n * hc * hc)), wu(static_cast<size_t>(n * D));
  std::vector<float> wmean(wu.size()), wXo(X.size());
  for (int64_t t = 0; t < n; ++t) {
    cpu_mixes(fn,
              base,
              scale,
              hc,
              D,
              20,
              1e-6f,
              1e-20f,
              X.data() + t * flat,
              wpre.data() + t * hc,
              wpost.data() + t * hc,
              wcomb.data() + t * hc * hc);
  }
  const std::vector<float> gcomb = comb.download(), gpost = post.download();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < D; ++i) {
      float a = 0.0f, m = 0.0f;
      for (int64_t j = 0; j < hc; ++j) {
        a += pi[static_cast<size_t>(t * hc + j)] * X[static_cast<size_t>((t * hc + j) * D + i)];
        m += X[static_cast<size_t>((t * hc + j) * D + i)];
      }
      wu[static_cast<size_t>(t * D + i)] = a;
      wmean[static_cast<size_t>(t * D + i)] = m / static_cast<float>(hc);
      for (int64_t k = 0; k < hc; ++k) {
        float acc = 0.0f;
        for (int64_t j = 0; j < hc; ++j) {
          acc += gcomb[static_cast<size_t>(t * hc * hc + j * hc + k)] *
                 X[static_cast<size_t>((t * hc + j) * D + i)];
        }
        wXo[static_cast<size_t>((t * hc + k) * D + i)] =
            gpost[static_cast<size_t>(t * hc + k)] * F[static_cast<size_t>(t * D + i)] + acc;
      }
    }
  }
  expect_rel(wpre, pre.download(), 1e-5, 1e-3, "pre");
  expect_rel(wpost, gpost, 1e-5, 1e-3, "post");
  expect_rel(wcomb, gcomb, 1e-4, 1e-3, "comb");
  expect_rel(wu, u.download(), 1e-6, 1e-3, "collapse");
  expect_rel(wmean, mean.download(), 1e-6, 1e-3, "stream mean");
  expect_rel(wXo, Xo.download(), 1e-6, 1e-3, "post step");
}

TEST_F(V41OpsTest, CompressorPoolMatchesCpu) {
  const int64_t d = 64, ratio = 2, n_local = 6, n_pool = 3;
  // Rows [kv | score]: 3 in the pool (a ring), 6 in the chunk-local buffer.
  const std::vector<float> pool = normal_floats(static_cast<size_t>(n_pool * 2 * d), 21, 3.0f);
  const std::vector<float> local = normal_floats(static_cast<size_t>(n_local * 2 * d), 22, 3.0f);
  // Entries: (pool 2, local 0), (local 1, local 2), (local 3, pool 0).
  const std::vector<int64_t> refs = {2 * 2 * d,
                                     kv_ref_local(0),
                                     kv_ref_local(2 * d),
                                     kv_ref_local(2 * 2 * d),
                                     kv_ref_local(3 * 2 * d),
                                     0};
  const int64_t G = 3;
  DevVec<float> dpool(pool), dlocal(local), out(static_cast<size_t>(G * d));
  DevVec<int64_t> drefs(refs);
  V41PoolParams p;
  p.entries = G;
  p.ratio = ratio;
  p.d = d;
  p.pool = dpool.get();
  p.local = dlocal.get();
  p.member_refs = drefs.get();
  p.out = out.get();
  DSI_EXPECT_OK(launch_v41_pool(p, nullptr));
  sync();
  std::vector<float> want(static_cast<size_t>(G * d));
  auto row = [&](int64_t ref) { return ref >= 0 ? pool.data() + ref : local.data() + (-2 - ref); };
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t c = 0; c < d; ++c) {
      float m = kNegInf;
      for (int64_t r = 0; r < ratio; ++r) m = std::max(m, row(refs[g * ratio + r])[d + c]);
      float den = 0.0f, num = 0.0f;
      for (int64_t r = 0; r < ratio; ++r) den += std::exp(row(refs[g * ratio + r])[d + c] - m);
      for (int64_t r = 0; r < ratio; ++r) {
        const float* x = row(refs[g * ratio + r]);
        num += (std::exp(x[d + c] - m) / den) * x[c];
      }
      want[static_cast<size_t>(g * d + c)] = num;
    }
  }
  expect_rel(want, out.download(), 1e-6, 1e-4, "pool");
}

TEST_F(V41OpsTest, TwoLevelSelectionMatchesCpu) {
  const int64_t nq = 9, G = 203, bs = 8, nb = (G + bs - 1) / bs, kb = 6, k = 16;
  std::vector<float> scores = normal_floats(static_cast<size_t>(nq * G), 31);
  std::vector<int64_t> visible(static_cast<size_t>(nq));
  for (int64_t q = 0; q < nq; ++q)
    visible[static_cast<size_t>(q)] = q == 0 ? 0 : (G * q) / (nq - 1);
  for (bool cap : {false, true}) {
    DevVec<float> dscores(scores), blk(static_cast<size_t>(nq * nb));
    DevVec<int64_t> dvis(visible), dnb(static_cast<size_t>(nq), nb);
    DevVec<int32_t> bidx(static_cast<size_t>(nq * kb)), idx(static_cast<size_t>(nq * k));
    DevVec<uint8_t> keep(static_cast<size_t>(nq * G));
    V41BlockScoreParams bp;
    bp.scores = dscores.get();
    bp.ld = G;
    bp.visible = dvis.get();
    bp.nq = nq;
    bp.n_keys = G;
    bp.block_size = bs;
    bp.cap_bf16 = cap;
    bp.out = blk.get();
    DSI_EXPECT_OK(launch_v41_block_scores(bp, nullptr));
    DSI_EXPECT_OK(top_k(blk.get(), nb, dnb.get(), nq, kb, bidx.get()));
    V41PoolMaskParams mp;
    mp.blocks = bidx.get();
    mp.block_scores = blk.get();
    mp.nq = nq;
    mp.k = kb;
    mp.n_blocks = nb;
    mp.n_keys = G;
    mp.block_size = bs;
    mp.keep = keep.get();
    DSI_EXPECT_OK(launch_v41_pool_mask(mp, nullptr));
    V41ApplyMaskParams am;
    am.scores = dscores.get();
    am.ld = G;
    am.keep = keep.get();
    am.nq = nq;
    am.n_keys = G;
    DSI_EXPECT_OK(launch_v41_apply_mask(am, nullptr));
    DSI_EXPECT_OK(top_k(dscores.get(), G, dvis.get(), nq, k, idx.get()));
    V41DropEmptyParams dp;
    dp.idx = idx.get();
    dp.nq = nq;
    dp.k = k;
    dp.scores = dscores.get();
    dp.ld = G;
    DSI_EXPECT_OK(launch_v41_drop_empty(dp, nullptr));
    sync();
    const std::vector<int32_t> got = idx.download();
    // The CPU's candidate pool and top-k (V41CpuModel::indexer), as sets per query.
    for (int64_t q = 0; q < nq; ++q) {
      const int64_t vis = visible[static_cast<size_t>(q)];
      std::vector<float> s(scores.begin() + q * G, scores.begin() + (q + 1) * G);
      for (int64_t g = vis; g < G; ++g) s[static_cast<size_t>(g)] = kNegInf;
      std::vector<float> b(static_cast<size_t>(nb), kNegInf);
      for (int64_t g = 0; g < G; ++g)
        b[static_cast<size_t>(g / bs)] =
            std::max(b[static_cast<size_t>(g / bs)], s[static_cast<size_t>(g)]);
      if (cap) {
        for (float& v : b) v = std::min(v, 3.38953139e38f);
      }
      std::vector<uint8_t> kp(static_cast<size_t>(G), 0);
      if (vis > 0) {
        b[static_cast<size_t>((vis - 1) / bs)] = std::numeric_limits<float>::infinity();
        for (int32_t bb : cpu::top_k_indices(b.data(), nb, std::min(kb, nb))) {
          if (b[static_cast<size_t>(bb)] == kNegInf)
            continue;
          for (int64_t g = bb * bs; g < std::min(G, (bb + 1) * bs); ++g)
            kp[static_cast<size_t>(g)] = 1;
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        if (!kp[static_cast<size_t>(g)])
          s[static_cast<size_t>(g)] = kNegInf;
      }
      std::vector<int32_t> want;
      for (int32_t g : cpu::top_k_indices(s.data(), G, std::min(k, G))) {
        if (s[static_cast<size_t>(g)] > kNegInf)
          want.push_back(g);
      }
      std::vector<int32_t> have;
      for (int64_t j = 0; j < k; ++j) {
        if (got[static_cast<size_t>(q * k + j)] >= 0)
          have.push_back(got[static_cast<size_t>(q * k + j)]);
      }
      std::sort(want.begin(), want.end());
      std::sort(have.begin(), have.end());
      EXPECT_EQ(have, want) << "query " << q << " cap " << cap;
    }
  }
}

TEST_F(V41OpsTest, EngramGateMatchesCpu) {
  const int64_t hc = 4, D = 256, n = 3;
  const std::vector<float> X = normal_floats(static_cast<size_t>(n * hc * D), 41);
  const std::vector<float> kv = normal_floats(static_cast<size_t>(n * (hc + 1) * D), 42);
  const std::vector<float> qk = normal_floats(static_cast<size_t>(hc * D), 43, 0.5f);
  DevVec<float> dX(X), dkv(kv), dqk(qk);
  V41EngramGateParams p;
  p.x = dX.get();
  p.kv = dkv.get();
  p.qk = dqk.get();
  p.n = n;
  p.hc = hc;
  p.hidden = D;
  DSI_EXPECT_OK(launch_v41_engram_gate(p, nullptr));
  sync();
  std::vector<float> want = X;
  for (int64_t t = 0; t < n; ++t) {
    const float* value = kv.data() + (t * (hc + 1) + hc) * D;
    for (int64_t k = 0; k < hc; ++k) {
      float* xs = want.data() + (t * hc + k) * D;
      const float* key = kv.data() + (t * (hc + 1) + k) * D;
      double sx = 0.0, sk = 0.0, dd = 0.0;
      for (int64_t i = 0; i < D; ++i) {
        sx += static_cast<double>(xs[i]) * xs[i];
        sk += static_cast<double>(key[i]) * key[i];
        dd += static_cast<double>(xs[i]) * qk[static_cast<size_t>(k * D + i)] * key[i];
      }
      const float rstd = (1.0f / std::sqrt(static_cast<float>(sx / D) + 1e-20f)) *
                         (1.0f / std::sqrt(static_cast<float>(sk / D) + 1e-20f));
      const float d = static_cast<float>(dd) * rstd * (1.0f / std::sqrt(static_cast<float>(D)));
      const float s = std::copysign(std::sqrt(std::max(std::fabs(d), 1e-6f)), d);
      const float g = 1.0f / (1.0f + std::exp(-s));
      for (int64_t i = 0; i < D; ++i) xs[i] += g * value[i];
    }
  }
  expect_rel(want, dX.download(), 1e-5, 1e-2, "engram gate");
}

}  // namespace
}  // namespace dsinfer::cuda::test
