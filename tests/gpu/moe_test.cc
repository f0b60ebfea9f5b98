// MoE against a transcription of the CPU forward (CpuModel::moe / expert): routing (sqrtsoftplus
// with bias, sigmoid, softmax, hash via tid2eid), grouping, the grouped SwiGLU expert GEMMs over
// MXFP4 routed and FP8 shared weights with 1x128 FP8 activation quantisation, and the combine.
//
// Tolerances. Router scores: CUDA expf/log1pf are within 2 ulp of glibc, so weights are checked
// at 1e-5 relative and the selection exactly, except for tokens whose top-(k+1) biased scores
// contain a pair closer than 1e-5 relative (a legitimate near-tie; counted, must be rare).
// Expert output: the GEMMs' fp32 order differences (1e-5 of sum |w x|, see gemm_test.cc)
// propagated through SwiGLU and W2 give a per-output bound 2e-5 * M, with
// M = sum_pairs sum_i |w2_ci| (|h_i| + |g| (|u_i| A_i + |silu(a_i)| U_i)), A_i / U_i the
// magnitudes sum |w1 x| / sum |w3 x|. With activation quantisation an ulp of h can also flip one
// FP8 code of the down projection's input: at most 1% of outputs may use an extra allowance of
// one FP8 step, 0.13 * max_i |w2_ci h_i|.
#include "kernels/cuda/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/moe_sm90.h"
#include "numeric/quant.h"
#include "test_util.h"

// GCC 12 reports a spurious -Wfree-nonheap-object on run_moe's vectors once it is inlined deeply
// enough (a known false positive of that release); the allocations are plain std::vector.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wfree-nonheap-object"
#endif

namespace dsinfer::cuda::test {
namespace {

struct RouteCase {
  int64_t n;
  int64_t n_experts;
  int64_t k;
  RouterScoring scoring;
  bool bias;
  bool hash;
};

struct RouteResult {
  std::vector<int32_t> ids;
  std::vector<float> gates;
  std::vector<bool> near_tie;
};

// CpuModel::moe's routing.
RouteResult cpu_route(const std::vector<float>& logits,
                      const RouteCase& c,
                      const std::vector<float>& bias,
                      const std::vector<int32_t>& tid2eid,
                      const std::vector<int32_t>& tokens,
                      float scaling) {
  RouteResult r;
  r.ids.resize(static_cast<size_t>(c.n * c.k));
  r.gates.resize(r.ids.size());
  r.near_tie.assign(static_cast<size_t>(c.n), false);
  std::vector<float> scores = logits;
  std::vector<float> biased(static_cast<size_t>(c.n_experts));
  for (int64_t t = 0; t < c.n; ++t) {
    float* s = scores.data() + t * c.n_experts;
    switch (c.scoring) {
      case RouterScoring::kSqrtSoftplus:
        for (int64_t e = 0; e < c.n_experts; ++e) s[e] = std::sqrt(cpu::softplus(s[e]));
        break;
      case RouterScoring::kSigmoid:
        for (int64_t e = 0; e < c.n_experts; ++e) s[e] = 1.0f / (1.0f + std::exp(-s[e]));
        break;
      case RouterScoring::kSoftmax:
        cpu::softmax(s, c.n_experts);
        break;
    }
    int32_t* sel = r.ids.data() + t * c.k;
    if (c.hash) {
      for (int64_t i = 0; i < c.k; ++i) sel[i] = tid2eid[static_cast<size_t>(tokens[t] * c.k + i)];
    } else {
      for (int64_t e = 0; e < c.n_experts; ++e) biased[e] = s[e] + (bias.empty() ? 0.0f : bias[e]);
      const std::vector<int32_t> top = cpu::top_k_indices(biased.data(), c.n_experts, c.k);
      std::copy(top.begin(), top.end(), sel);
      const std::vector<int32_t> top1 =
          cpu::top_k_indices(biased.data(), c.n_experts, std::min(c.k + 1, c.n_experts));
      for (size_t i = 0; i + 1 < top1.size(); ++i) {
        const float a = biased[top1[i]];
        const float b = biased[top1[i + 1]];
        if (std::fabs(a - b) <= 1e-5f * std::max(std::fabs(a), std::fabs(b)))
          r.near_tie[t] = true;
      }
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < c.k; ++i) sum += s[sel[i]];
    for (int64_t i = 0; i < c.k; ++i) {
      r.gates[t * c.k + i] = s[sel[i]] / (sum + 1e-20f) * scaling;
    }
  }
  return r;
}

RouteResult gpu_route(const std::vector<float>& logits,
                      const RouteCase& c,
                      const std::vector<float>& bias,
                      const std::vector<int32_t>& tid2eid,
                      const std::vector<int32_t>& tokens,
                      float scaling) {
  DevVec<float> d_logits(logits), d_bias(bias);
  DevVec<int32_t> d_tid(tid2eid), d_tok(tokens);
  DevVec<int32_t> d_ids(static_cast<size_t>(c.n * c.k));
  DevVec<float> d_w(static_cast<size_t>(c.n * c.k));
  const Status st = launch_moe_route(MoeRouteParams{.logits = d_logits.get(),
                                                    .n = c.n,
                                                    .n_experts = c.n_experts,
                                                    .k = c.k,
                                                    .scoring = c.scoring,
                                                    .bias = c.bias ? d_bias.get() : nullptr,
                                                    .tid2eid = c.hash ? d_tid.get() : nullptr,
                                                    .tokens = d_tok.get(),
                                                    .norm_topk_prob = true,
                                                    .routed_scaling_factor = scaling,
                                                    .expert_ids = d_ids.get(),
                                                    .weights = d_w.get()},
                                     nullptr);
  EXPECT_TRUE(st.ok()) << st.to_string();
  sync();
  return RouteResult{d_ids.download(), d_w.download(), {}};
}

struct MoeInputs {
  std::vector<float> logits, bias;
  std::vector<int32_t> tid2eid, tokens;
};

MoeInputs make_inputs(const RouteCase& c, uint32_t seed) {
  MoeInputs in;
  std::mt19937 rng(seed);
  in.logits = normal_floats(static_cast<size_t>(c.n * c.n_experts), seed + 1, 2.0f);
  in.bias = normal_floats(static_cast<size_t>(c.n_experts), seed + 2, 0.1f);
  const int64_t vocab = 50;
  in.tid2eid.resize(static_cast<size_t>(vocab * c.k));
  for (int64_t v = 0; v < vocab; ++v) {
    std::vector<int32_t> ids(static_cast<size_t>(c.n_experts));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::copy(ids.begin(), ids.begin() + c.k, in.tid2eid.begin() + v * c.k);
  }
  in.tokens.resize(static_cast<size_t>(c.n));
  for (auto& t : in.tokens) t = static_cast<int32_t>(rng() % vocab);
  return in;
}

// Grouping over several blocks (MoeGroupParams::chunk_counts: prefill-sized pair counts) gives
// the one block's slots exactly: expert begins, pair order within each expert (ascending index),
// every pair's slot, invalid ids (-1, out of range) left ungrouped; pair counts around the chunk
// size, skewed and uniform experts.
TEST_F(GpuTest, MoeGroupOverSeveralBlocksEqualsOneBlock) {
  for (int64_t ne : {8, 256}) {
    for (int64_t n : {int64_t{1}, kMoeGroupChunk / 6, kMoeGroupChunk / 6 + 1, int64_t{8192}}) {
      const int64_t k = 6, pairs = n * k;
      std::mt19937 g(static_cast<uint32_t>(n * 31 + ne));
      std::vector<int32_t> ids(static_cast<size_t>(pairs));
      for (int64_t i = 0; i < pairs; ++i) {
        const uint32_t r = g() % 100;
        ids[static_cast<size_t>(i)] = r == 0   ? -1
                                      : r == 1 ? static_cast<int32_t>(ne)
                                      : r < 40 ? static_cast<int32_t>(g() % 3)  // skewed
                                               : static_cast<int32_t>(g() % ne);
      }
      DevVec<int32_t> d_ids(ids);
      using Groups = std::tuple<std::vector<int64_t>, std::vector<int32_t>, std::vector<int32_t>>;
      auto run = [&](bool several, Groups* out) {
        DevVec<int64_t> begin(static_cast<size_t>(ne + 1), -7);
        DevVec<int32_t> src(static_cast<size_t>(pairs), -7), pos(static_cast<size_t>(pairs), -7);
        DevVec<int32_t> scratch(static_cast<size_t>(moe_group_scratch_ints(pairs, ne)));
        DSI_EXPECT_OK(
            launch_moe_group(MoeGroupParams{.expert_ids = d_ids.get(),
                                            .n = n,
                                            .k = k,
                                            .n_experts = ne,
                                            .expert_begin = begin.get(),
                                            .pair_src = src.get(),
                                            .pair_pos = pos.get(),
                                            .chunk_counts = several ? scratch.get() : nullptr},
                             nullptr));
        sync();
        *out = Groups(begin.download(), src.download(), pos.download());
      };
      SCOPED_TRACE("experts " + std::to_string(ne) + " tokens " + std::to_string(n));
      Groups one, several;
      run(false, &one);
      run(true, &several);
      EXPECT_EQ(several, one);
    }
  }
}

TEST_F(GpuTest, MoeRouteMatchesCpu) {
  uint32_t seed = 1;
  int64_t near_ties = 0;
  int64_t tokens_total = 0;
  for (int64_t n : {0, 1, 3, 7, 129, 733}) {
    for (RouteCase c : {RouteCase{n, 256, 6, RouterScoring::kSqrtSoftplus, true, false},
                        RouteCase{n, 256, 6, RouterScoring::kSqrtSoftplus, false, true},
                        RouteCase{n, 7, 2, RouterScoring::kSigmoid, true, false},
                        RouteCase{n, 33, 7, RouterScoring::kSoftmax, false, false},
                        RouteCase{n, 384, 1, RouterScoring::kSqrtSoftplus, true, false}}) {
      SCOPED_TRACE("route n " + std::to_string(c.n) + " experts " + std::to_string(c.n_experts) +
                   " k " + std::to_string(c.k) + (c.hash ? " hash" : ""));
      const MoeInputs in = make_inputs(c, seed += 7);
      const std::vector<float> bias = c.bias ? in.bias : std::vector<float>{};
      const RouteResult want = cpu_route(in.logits, c, bias, in.tid2eid, in.tokens, 1.5f);
      const RouteResult got = gpu_route(in.logits, c, in.bias, in.tid2eid, in.tokens, 1.5f);
      for (int64_t t = 0; t < c.n; ++t) {
        ++tokens_total;
        if (want.near_tie[t]) {
          ++near_ties;
          continue;
        }
        for (int64_t i = 0; i < c.k; ++i) {
          const size_t j = static_cast<size_t>(t * c.k + i);
          ASSERT_EQ(got.ids[j], want.ids[j]) << "token " << t << " slot " << i;
          EXPECT_NEAR(got.gates[j], want.gates[j], 1e-5 * std::fabs(want.gates[j]) + 1e-12);
        }
      }
    }
  }
  EXPECT_LE(near_ties * 50, tokens_total + 50) << "too many near-ties to be a fair test";
}

// Logits from a 9-value grid, so most experts tie exactly with others (ties -> lower id on both
// sides) and distinct scores are far apart; up to 1024 experts and k = 32 use every bit of the
// kernel's per-lane "already picked" mask (bit j = expert lane + 32 j).
TEST_F(GpuTest, MoeRouteExactTiesWideMask) {
  uint32_t seed = 5;
  for (int64_t n : {1, 5, 67}) {
    for (RouteCase c : {RouteCase{n, 1024, 32, RouterScoring::kSigmoid, false, false},
                        RouteCase{n, 1000, 32, RouterScoring::kSqrtSoftplus, false, false},
                        RouteCase{n, 65, 17, RouterScoring::kSoftmax, false, false},
                        RouteCase{n, 32, 32, RouterScoring::kSigmoid, false, false}}) {
      SCOPED_TRACE("route n " + std::to_string(c.n) + " experts " + std::to_string(c.n_experts) +
                   " k " + std::to_string(c.k));
      MoeInputs in = make_inputs(c, seed += 7);
      std::mt19937 rng(seed);
      for (float& x : in.logits) x = 0.5f * static_cast<float>(static_cast<int>(rng() % 9) - 4);
      const RouteResult want = cpu_route(in.logits, c, {}, in.tid2eid, in.tokens, 1.5f);
      const RouteResult got = gpu_route(in.logits, c, in.bias, in.tid2eid, in.tokens, 1.5f);
      ASSERT_EQ(got.ids, want.ids);
      for (size_t j = 0; j < want.gates.size(); ++j)
        EXPECT_NEAR(got.gates[j], want.gates[j], 1e-5 * std::fabs(want.gates[j]) + 1e-12) << j;
    }
  }
}

// ---- grouped experts -------------------------------------------------------------------------

struct ExpertSet {
  std::vector<std::unique_ptr<TestWeight>> store;  // distinct weights (reused by index)
  std::vector<const TestWeight*> w1, w3, w2;       // per expert
};

ExpertSet make_experts(
    Fmt f, int64_t n_experts, int64_t distinct, int64_t hidden, int64_t inter, uint32_t seed) {
  ExpertSet s;
  for (int64_t i = 0; i < distinct; ++i) {
    s.store.push_back(make_weight(f, inter, hidden, seed + 3 * i));
    s.store.push_back(make_weight(f, inter, hidden, seed + 3 * i + 1));
    s.store.push_back(make_weight(f, hidden, inter, seed + 3 * i + 2));
  }
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t i = (e * 5) % distinct;
    s.w1.push_back(s.store[3 * i].get());
    s.w3.push_back(s.store[3 * i + 1].get());
    s.w2.push_back(s.store[3 * i + 2].get());
  }
  return s;
}

// CpuModel::expert for m rows, plus the magnitude bounds of the tolerance.
void cpu_expert(const TestWeight& w1,
                const TestWeight& w3,
                const TestWeight& w2,
                const float* x,
                int64_t m,
                const float* gates,
                float limit,
                bool quant,
                float* out_accum,
                double* mag,
                double* flip) {
  const int64_t inter = w1.host.rows;
  const int64_t hidden = w2.host.rows;
  std::vector<float> a(static_cast<size_t>(m * inter)), u(a.size());
  cpu::linear(w1.host, x, m, a.data(), quant);
  cpu::linear(w3.host, x, m, u.data(), quant);
  std::vector<float> xq(x, x + m * hidden);
  if (quant) {
    for (int64_t t = 0; t < m; ++t)
      numeric::fp8_block_simulate(xq.data() + t * hidden, hidden, 128);
  }
  std::vector<double> amag(a.size()), umag(a.size());
  std::vector<float> row(static_cast<size_t>(hidden));
  for (int64_t i = 0; i < inter; ++i) {
    w1.host.dequant_row(i, row.data());
    for (int64_t t = 0; t < m; ++t) {
      double s = 0.0;
      for (int64_t c = 0; c < hidden; ++c) s += std::fabs(row[c] * xq[t * hidden + c]);
      amag[t * inter + i] = s;
    }
    w3.host.dequant_row(i, row.data());
    for (int64_t t = 0; t < m; ++t) {
      double s = 0.0;
      for (int64_t c = 0; c < hidden; ++c) s += std::fabs(row[c] * xq[t * hidden + c]);
      umag[t * inter + i] = s;
    }
  }
  std::vector<double> hmag(a.size());
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t i = 0; i < inter; ++i) {
      float g = a[t * inter + i];
      float v = u[t * inter + i];
      if (limit > 0.0f) {
        g = std::min(g, limit);
        v = std::clamp(v, -limit, limit);
      }
      const float h = cpu::silu(g) * v * gates[t];
      a[t * inter + i] = h;
      hmag[t * inter + i] =
          std::fabs(h) + std::fabs(gates[t]) * (std::fabs(v) * amag[t * inter + i] * 1.1 +
                                                std::fabs(cpu::silu(g)) * umag[t * inter + i]);
    }
  }
  std::vector<float> y(static_cast<size_t>(m * hidden));
  cpu::linear(w2.host, a.data(), m, y.data(), quant);
  std::vector<float> w2row(static_cast<size_t>(inter));
  for (int64_t c = 0; c < hidden; ++c) {
    w2.host.dequant_row(c, w2row.data());
    for (int64_t t = 0; t < m; ++t) {
      double s = 0.0, f = 0.0;
      for (int64_t i = 0; i < inter; ++i) {
        s += std::fabs(w2row[i]) * hmag[t * inter + i];
        f = std::max<double>(f, std::fabs(w2row[i] * a[t * inter + i]));
      }
      mag[t * hidden + c] += s;
      flip[t * hidden + c] = std::max(flip[t * hidden + c], f);
    }
  }
  for (int64_t i = 0; i < m * hidden; ++i) out_accum[i] += y[i];
}

// MatrixRef arrays on the device (the expert tables the kernels take).
DevVec<uint8_t> upload_refs(const std::vector<MatrixRef>& refs) {
  std::vector<uint8_t> bytes(refs.size() * sizeof(MatrixRef));
  std::memcpy(bytes.data(), refs.data(), bytes.size());
  return DevVec<uint8_t>(bytes);
}
DevVec<uint8_t> upload_refs(const std::vector<const TestWeight*>& ws) {
  std::vector<MatrixRef> refs;
  for (const TestWeight* w : ws) refs.push_back(w->dev);
  return upload_refs(refs);
}
const MatrixRef* as_refs(const DevVec<uint8_t>& v) {
  return reinterpret_cast<const MatrixRef*>(v.get());
}

#if DSINFER_HAVE_CUTLASS
// The MXFP4 experts (device tables w1, w3, w2) re-encoded into wf; the count of (row, K block)s
// outside E4M3's range after the launch (synchronised; -1 if the launch failed).
int reencode_mxfp4(const DevVec<uint8_t>& w1,
                   const DevVec<uint8_t>& w3,
                   const DevVec<uint8_t>& w2,
                   const MoeFp8Weights& wf) {
  DevVec<int> bad(1, 0);
  const Status st = launch_moe_fp8_reencode(
      as_refs(w1), as_refs(w3), as_refs(w2), WeightFormat::kMxfp4, wf, bad.get(), nullptr);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok())
    return -1;
  sync();
  return bad.download()[0];
}

// The MXFP4 experts (device tables w1, w3, w2) for the grouped W4A8 GEMMs, their block exponents
// in exp (moe_mxfp4_exponent_bytes); expects none outside E4M3's range.
MoeMxfp4Weights mxfp4_direct(const DevVec<uint8_t>& w1,
                             const DevVec<uint8_t>& w3,
                             const DevVec<uint8_t>& w2,
                             const DevVec<uint8_t>& exp,
                             int64_t n_experts,
                             int64_t hidden,
                             int64_t inter) {
  const MoeMxfp4Weights w = moe_mxfp4_weights_carve(
      exp.get(), as_refs(w1), as_refs(w3), as_refs(w2), n_experts, hidden, inter);
  DevVec<int> bad(1, 0);
  const Status st = launch_moe_mxfp4_scales(w, bad.get(), nullptr);
  EXPECT_TRUE(st.ok()) << st.to_string();
  sync();
  EXPECT_EQ(bad.download()[0], 0) << "test experts are within E4M3's range";
  return w;
}
#endif

void run_moe(int64_t n,
             int64_t n_experts,
             int64_t k,
             int64_t hidden,
             int64_t inter,
             bool hash,
             bool quant,
             int64_t distinct,
             uint32_t seed,
             bool fast = false,
             bool sm90 = false,
             bool gemv = false,
             int sm90_scale_rows = 128) {
  SCOPED_TRACE("moe n " + std::to_string(n) + " experts " + std::to_string(n_experts) + " k " +
               std::to_string(k) + " hidden " + std::to_string(hidden) + " inter " +
               std::to_string(inter) + (hash ? " hash" : "") + (quant ? " q8" : "") +
               (fast ? " fp8-tensor-core" : "") +
               (sm90 ? " sm90-grouped scale_rows " + std::to_string(sm90_scale_rows) : "") +
               (gemv ? " gemv" : ""));
  const RouteCase rc{n, n_experts, k, RouterScoring::kSqrtSoftplus, !hash, hash};
  const MoeInputs in = make_inputs(rc, seed);
  const float limit = 10.0f;
  // Activations large enough that the SwiGLU clamps engage for some rows.
  const std::vector<float> x = normal_floats(static_cast<size_t>(n * hidden), seed + 5, 8.0f);
  ExpertSet routed = make_experts(Fmt::kMxfp4, n_experts, distinct, hidden, inter, seed + 100);
  ExpertSet shared = make_experts(Fmt::kFp8E8M0, 1, 1, hidden, inter, seed + 200);

  // GPU routing (selection compared in MoeRouteMatchesCpu); the CPU reference uses the GPU's
  // selection and weights so that near-ties cannot make the outputs incomparable.
  const RouteResult r = gpu_route(in.logits, rc, in.bias, in.tid2eid, in.tokens, 1.5f);

  // CPU reference: shared expert, then routed experts in ascending id.
  std::vector<float> want(static_cast<size_t>(n * hidden), 0.0f);
  std::vector<double> mag(want.size(), 0.0), flip(want.size(), 0.0);
  {
    std::vector<float> ones(static_cast<size_t>(n), 1.0f);
    cpu_expert(*shared.w1[0],
               *shared.w3[0],
               *shared.w2[0],
               x.data(),
               n,
               ones.data(),
               limit,
               quant,
               want.data(),
               mag.data(),
               flip.data());
  }
  for (int64_t e = 0; e < n_experts; ++e) {
    std::vector<int64_t> rows;
    std::vector<float> gs;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < k; ++i) {
        if (r.ids[t * k + i] == e) {
          rows.push_back(t);
          gs.push_back(r.gates[t * k + i]);
        }
      }
    }
    if (rows.empty())
      continue;
    const auto m = static_cast<int64_t>(rows.size());
    std::vector<float> xs(static_cast<size_t>(m * hidden));
    for (int64_t i = 0; i < m; ++i) {
      std::copy(x.begin() + rows[i] * hidden,
                x.begin() + (rows[i] + 1) * hidden,
                xs.begin() + i * hidden);
    }
    std::vector<float> ys(xs.size(), 0.0f);
    std::vector<double> ymag(xs.size(), 0.0), yflip(xs.size(), 0.0);
    cpu_expert(*routed.w1[e],
               *routed.w3[e],
               *routed.w2[e],
               xs.data(),
               m,
               gs.data(),
               limit,
               quant,
               ys.data(),
               ymag.data(),
               yflip.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < hidden; ++c) {
        want[rows[i] * hidden + c] += ys[i * hidden + c];
        mag[rows[i] * hidden + c] += ymag[i * hidden + c];
        flip[rows[i] * hidden + c] = std::max(flip[rows[i] * hidden + c], yflip[i * hidden + c]);
      }
    }
  }

  // GPU: group, routed experts, shared expert, combine.
  DevVec<uint8_t> d_w1 = upload_refs(routed.w1), d_w3 = upload_refs(routed.w3),
                  d_w2 = upload_refs(routed.w2);
  DevVec<uint8_t> d_s1 = upload_refs(shared.w1), d_s3 = upload_refs(shared.w3),
                  d_s2 = upload_refs(shared.w2);
  const int64_t pairs = n * k;
  DevVec<int32_t> d_ids(r.ids);
  DevVec<float> d_gates(r.gates), d_x(x);
  DevVec<int64_t> d_begin(static_cast<size_t>(n_experts + 1));
  DevVec<int32_t> d_src(static_cast<size_t>(std::max<int64_t>(pairs, 1)));
  DevVec<int32_t> d_pos(static_cast<size_t>(std::max<int64_t>(pairs, 1)));
  DevVec<float> d_h(static_cast<size_t>(std::max<int64_t>(pairs, n) * inter + 1));
  DevVec<float> d_y(static_cast<size_t>(pairs * hidden + 1));
  DevVec<float> d_shared(static_cast<size_t>(n * hidden + 1));
  DevVec<float> d_out(static_cast<size_t>(n * hidden + 1), 4.0f);
  DSI_EXPECT_OK(launch_moe_group(MoeGroupParams{.expert_ids = d_ids.get(),
                                                .n = n,
                                                .k = k,
                                                .n_experts = n_experts,
                                                .expert_begin = d_begin.get(),
                                                .pair_src = d_src.get(),
                                                .pair_pos = d_pos.get()},
                                 nullptr));
  if (fast) {
    // FP8 activations quantised once, the experts on the tensor-core kernels (fp8_gemm.h).
    const int64_t ld = fp8_acts_ld(hidden), hld = fp8_acts_ld(inter);
    DevVec<uint8_t> d_xq(static_cast<size_t>(std::max<int64_t>(n, 1) * ld));
    DevVec<float> d_xs(static_cast<size_t>(std::max<int64_t>(n, 1) * ld / 128));
    const int64_t hrows = std::max<int64_t>(std::max(pairs, n), 1);
    DevVec<uint8_t> d_hq(static_cast<size_t>(hrows * hld));
    DevVec<float> d_hs(static_cast<size_t>(hrows * hld / 128));
    DSI_EXPECT_OK(launch_quantize_fp8(
        QuantizeFp8Params{
            .x = d_x.get(), .n = n, .k = hidden, .codes = d_xq.get(), .scales = d_xs.get()},
        nullptr));
    const Fp8Acts xq{d_xq.get(), d_xs.get(), ld};
    if (sm90) {
#if DSINFER_HAVE_CUTLASS
      // The routed experts re-encoded once, then the grouped wgmma GEMMs (moe_sm90.h); or
      // (scale_rows 0) read as they are by the grouped W4A8 GEMMs (moe_w4a8_sm90.h).
      const int fp8_rows = sm90_scale_rows == 0 ? 1 : sm90_scale_rows;
      DevVec<uint8_t> d_wfp8(
          static_cast<size_t>(moe_fp8_weights_bytes(n_experts, hidden, inter, fp8_rows)));
      MoeFp8Weights wf = moe_fp8_weights_carve(d_wfp8.get(), n_experts, hidden, inter, fp8_rows);
      DevVec<uint8_t> d_exp(
          static_cast<size_t>(moe_mxfp4_exponent_bytes(n_experts, hidden, inter)));
      MoeMxfp4Weights w4;
      if (sm90_scale_rows == 0) {
        w4 = mxfp4_direct(d_w1, d_w3, d_w2, d_exp, n_experts, hidden, inter);
        wf = MoeFp8Weights{};
      } else {
        EXPECT_EQ(reencode_mxfp4(d_w1, d_w3, d_w2, wf), 0)
            << "test experts are within E4M3's range";
      }
      const int64_t sb = moe_sm90_scratch_bytes(n_experts, pairs, hidden, inter);
      DevVec<uint8_t> d_scratch(static_cast<size_t>(sb + 256));
      DSI_EXPECT_OK(launch_moe_sm90(MoeSm90Params{.w = wf,
                                                  .w4 = w4,
                                                  .expert_begin = d_begin.get(),
                                                  .pair_src = d_src.get(),
                                                  .k = k,
                                                  .gates = d_gates.get(),
                                                  .x = xq,
                                                  .num_pairs = pairs,
                                                  .swiglu_limit = limit,
                                                  .scratch = d_scratch.get(),
                                                  .scratch_bytes = sb,
                                                  .y = d_y.get()},
                                    nullptr));
      sync();
#else
      ADD_FAILURE() << "no grouped wgmma path in this build";
#endif
    } else {
      if (gemv) {
        DevVec<int> d_bad(1, 0);
        DSI_EXPECT_OK(launch_expert_gemv_check(as_refs(d_w1),
                                               as_refs(d_w3),
                                               as_refs(d_w2),
                                               n_experts,
                                               hidden,
                                               inter,
                                               d_bad.get(),
                                               nullptr));
        sync();
        EXPECT_EQ(d_bad.download()[0], 0) << "test experts are within the GEMV's scale spread";
      }
      DSI_EXPECT_OK(launch_fp8_expert_ffn(Fp8ExpertFfnParams{.w1 = as_refs(d_w1),
                                                             .w3 = as_refs(d_w3),
                                                             .w2 = as_refs(d_w2),
                                                             .format = WeightFormat::kMxfp4,
                                                             .n_experts = n_experts,
                                                             .hidden = hidden,
                                                             .inter = inter,
                                                             .expert_begin = d_begin.get(),
                                                             .pair_src = d_src.get(),
                                                             .k = k,
                                                             .gates = d_gates.get(),
                                                             .x = xq,
                                                             .num_pairs = pairs,
                                                             .swiglu_limit = limit,
                                                             .h = d_h.get(),
                                                             .h_codes = d_hq.get(),
                                                             .h_scales = d_hs.get(),
                                                             .y = d_y.get(),
                                                             .gemv = gemv},
                                          nullptr));
    }
    DSI_EXPECT_OK(launch_fp8_expert_ffn(Fp8ExpertFfnParams{.w1 = as_refs(d_s1),
                                                           .w3 = as_refs(d_s3),
                                                           .w2 = as_refs(d_s2),
                                                           .format = WeightFormat::kFp8Block128,
                                                           .hidden = hidden,
                                                           .inter = inter,
                                                           .x = xq,
                                                           .num_pairs = n,
                                                           .swiglu_limit = limit,
                                                           .h = d_h.get(),
                                                           .h_codes = d_hq.get(),
                                                           .h_scales = d_hs.get(),
                                                           .y = d_shared.get(),
                                                           .gemv = gemv},
                                        nullptr));
    sync();
  } else {
    DSI_EXPECT_OK(launch_expert_ffn(ExpertFfnParams{.w1 = as_refs(d_w1),
                                                    .w3 = as_refs(d_w3),
                                                    .w2 = as_refs(d_w2),
                                                    .n_experts = n_experts,
                                                    .hidden = hidden,
                                                    .inter = inter,
                                                    .expert_begin = d_begin.get(),
                                                    .pair_src = d_src.get(),
                                                    .k = k,
                                                    .gates = d_gates.get(),
                                                    .x = d_x.get(),
                                                    .num_pairs = pairs,
                                                    .swiglu_limit = limit,
                                                    .quantize_activations = quant,
                                                    .h = d_h.get(),
                                                    .y = d_y.get()},
                                    nullptr));
    DSI_EXPECT_OK(launch_expert_ffn(ExpertFfnParams{.w1 = as_refs(d_s1),
                                                    .w3 = as_refs(d_s3),
                                                    .w2 = as_refs(d_s2),
                                                    .hidden = hidden,
                                                    .inter = inter,
                                                    .x = d_x.get(),
                                                    .num_pairs = n,
                                                    .swiglu_limit = limit,
                                                    .quantize_activations = quant,
                                                    .h = d_h.get(),
                                                    .y = d_shared.get()},
                                    nullptr));
  }
  DSI_EXPECT_OK(launch_moe_combine(MoeCombineParams{.n = n,
                                                    .k = k,
                                                    .hidden = hidden,
                                                    .y = d_y.get(),
                                                    .pair_pos = d_pos.get(),
                                                    .expert_ids = d_ids.get(),
                                                    .shared = d_shared.get(),
                                                    .out = d_out.get()},
                                   nullptr));
  sync();
  // Grouping: expert_begin is the exclusive prefix count, pairs ascending within an expert.
  const std::vector<int64_t> begin = d_begin.download();
  const std::vector<int32_t> src = d_src.download();
  EXPECT_EQ(begin.front(), 0);
  EXPECT_EQ(begin.back(), pairs);
  for (int64_t e = 0; e < n_experts; ++e) {
    for (int64_t g = begin[e]; g < begin[e + 1]; ++g) {
      ASSERT_EQ(r.ids[src[g]], e);
      if (g > begin[e]) {
        ASSERT_LT(src[g - 1], src[g]);
      }
    }
  }
  const std::vector<float> got = d_out.download();
  int64_t flips = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (err <= 2e-5 * mag[i] + 1e-30)
      continue;
    if (quant && err <= 2e-5 * mag[i] + 0.13 * flip[i]) {
      ++flips;
      continue;
    }
    if (bad++ < 5)
      ADD_FAILURE() << "out[" << i << "]: cpu " << want[i] << " gpu " << got[i] << " bound "
                    << 2e-5 * mag[i];
  }
  EXPECT_EQ(bad, 0);
  EXPECT_LE(flips * 100, static_cast<int64_t>(want.size()) + 100);
  EXPECT_EQ(got.back(), 4.0f) << "write past the end";
}

TEST_F(GpuTest, MoeExpertsMatchCpu) {
  uint32_t seed = 1000;
  for (int64_t n : {0, 1, 3, 7, 33}) {
    for (bool quant : {true, false}) {
      run_moe(n, 16, 6, 256, 128, false, quant, 4, seed += 500);
      run_moe(n, 7, 2, 96, 160, true, quant, 3, seed += 500);
    }
  }
  if (!small_mode())
    run_moe(5, 256, 6, 4096, 2048, false, true, 8, seed += 500);  // Flash shapes, decode batch
}

// The tensor-core experts (fp8_gemm.h, W4A8 routed and W8A8 shared) against the same CPU
// reference: decode (<= 8 pairs per expert), medium and prefill tile shapes, one token, empty
// experts, every token on one expert, and the V4-Flash shapes.
TEST_F(GpuTest, MoeFp8TensorCoreExpertsMatchCpu) {
  uint32_t seed = 77000;
  for (int64_t n : {0, 1, 3, 7, 33, 130}) {
    run_moe(n, 16, 6, 256, 128, false, true, 4, seed += 500, true);
    run_moe(n, 7, 2, 96, 160, true, true, 3, seed += 500, true);
  }
  run_moe(300, 1, 1, 384, 256, false, true, 1, seed += 500, true);  // every token on one expert
  run_moe(257, 4, 2, 512, 384, false, true, 2, seed += 500, true);  // prefill tiles, row tails
  if (!small_mode()) {
    run_moe(1, 256, 6, 4096, 2048, false, true, 8, seed += 500, true);   // Flash, batch 1
    run_moe(64, 256, 6, 4096, 2048, false, true, 8, seed += 500, true);  // Flash, batch 64
    run_moe(600, 16, 6, 1024, 512, false, true, 8, seed += 500, true);   // prefill-sized experts
  }
}

// The decode GEMVs (moe_gemv.h: launch_fp8_expert_ffn with gemv set, <= 8 pairs per expert on
// average) against the same CPU reference: one token, tails of 8-pair tiles, experts with more
// than 8 pairs (several tiles), every pair on one expert, the shared expert (FP8) alone, and the
// V4-Flash shapes at batch 1 and 64. Shapes that are not multiples of 128 fall back to the tiles.
TEST_F(GpuTest, MoeExpertGemvMatchesCpu) {
  uint32_t seed = 83000;
  for (int64_t n : {0, 1, 3, 7, 12}) {
    run_moe(n, 16, 6, 256, 128, false, true, 4, seed += 500, true, false, true);
    run_moe(n, 7, 2, 384, 256, true, true, 3, seed += 500, true, false, true);
  }
  run_moe(8, 1, 1, 384, 256, false, true, 1, seed += 500, true, false, true);  // all on one
  // Enough tiles (>= 32) for 4 row groups per wgmma block (gate/up 8 groups of 32 rows; down 6
  // of 64: a short last block) and for the FP8 kernels' whole-row form.
  run_moe(40, 64, 6, 384, 256, false, true, 4, seed += 500, true, false, true);
  run_moe(5, 7, 2, 96, 160, true, true, 3, seed += 500, true, false, true);  // tile fallback
  // 19 tiles on grids of more than one wave (the FP8 kernels: several row groups per block).
  run_moe(5, 16, 6, 640, 512, false, true, 4, seed += 500, true, false, true);
  if (!small_mode()) {
    run_moe(1, 256, 6, 4096, 2048, false, true, 8, seed += 500, true, false, true);
    run_moe(64, 256, 6, 4096, 2048, false, true, 8, seed += 500, true, false, true);
  }
}

// The MXFP4 GEMVs scale each 32-block on its own (exact for every E8M0 code but NaN): the check
// counts only the row blocks holding the NaN code, however far a block's scales spread.
TEST_F(GpuTest, MoeExpertGemvCheckCountsNanScales) {
  const int64_t hidden = 256, inter = 128;
  // The check over two experts, after `edit` rewrote some of W1 / W2's scales on the host.
  auto count = [&](uint32_t seed, const std::function<void(ExpertSet&)>& edit) -> int {
    ExpertSet ex = make_experts(Fmt::kMxfp4, 2, 2, hidden, inter, seed);
    edit(ex);
    for (const TestWeight* c : {ex.w1[0], ex.w2[1]}) {
      auto* w = const_cast<TestWeight*>(c);
      w->d_scale = DevVec<uint8_t>(w->scale);
      w->dev.scale = w->d_scale.get();
    }
    DevVec<uint8_t> d1 = upload_refs(ex.w1), d3 = upload_refs(ex.w3), d2 = upload_refs(ex.w2);
    DevVec<int> bad(1, 0);
    const Status st = launch_expert_gemv_check(
        as_refs(d1), as_refs(d3), as_refs(d2), 2, hidden, inter, bad.get(), nullptr);
    EXPECT_TRUE(st.ok()) << st.to_string();
    sync();
    return bad.download()[0];
  };
  for (const int offset : {13, -14, 40, -100}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    // Row 5 of expert 1's W2, its K block 0: first scale 120, the third moved (a wide spread).
    EXPECT_EQ(count(5190 + offset,
                    [&](ExpertSet& ex) {
                      auto& sc = const_cast<TestWeight*>(ex.w2[1])->scale;
                      for (int j = 0; j < 4; ++j) sc[5 * (inter / 32) + j] = 120;
                      sc[5 * (inter / 32) + 2] = static_cast<uint8_t>(120 + offset);
                    }),
              0);
  }
  // The NaN code anywhere in a block counts it.
  EXPECT_EQ(count(5250,
                  [&](ExpertSet& ex) {
                    const_cast<TestWeight*>(ex.w1[0])->scale[2 * (hidden / 32) + 6] = 255;
                  }),
            1);
}

// The grouped wgmma experts (moe_sm90.h) against the same CPU reference: one token per expert,
// empty experts, every token on one expert, tails of the 128-row tiles, and the V4-Flash shapes
// at prefill sizes.
#if DSINFER_HAVE_CUTLASS
TEST_F(GpuTest, MoeSm90GroupedExpertsMatchCpu) {
  for (const int sr : {128, 1, 0}) {  // 0: the W4A8 GEMMs on the MXFP4 experts as they are
    uint32_t seed = 91000;
    run_moe(1, 16, 6, 256, 128, false, true, 4, seed += 500, true, true, false, sr);
    run_moe(33, 16, 6, 256, 128, false, true, 4, seed += 500, true, true, false, sr);
    run_moe(130, 7, 2, 384, 256, true, true, 3, seed += 500, true, true, false, sr);
    run_moe(300, 1, 1, 384, 256, false, true, 1, seed += 500, true, true, false, sr);  // one expert
    if (!small_mode()) {
      run_moe(8, 256, 6, 4096, 2048, false, true, 8, seed += 500, true, true, false, sr);  // Flash
      if (sr == 128)
        run_moe(200, 32, 4, 2048, 1024, false, true, 8, seed += 500, true, true, false, sr);
    }
  }
}

// One scale per 128 x 128 weight block gives the per-row scales' outputs bit for bit (every scale
// a power of two: the products and their sums move by exact powers of two), in both tile
// configurations (64-row ping-pong at ~24 rows per expert, 128-row cooperative on one expert);
// and the W4A8 GEMMs, which make the per-row copy's E4M3 values on the way and sum each 128-wide
// K block's products in the same MMAs, give them too (tails of their 128-row tiles, an expert
// with one 64-row half empty, every token on one expert, experts with no rows).
TEST_F(GpuTest, MoeSm90BlockScalesRowScalesAndW4a8AgreeBitForBit) {
  struct Case {
    int64_t n, n_experts, k, hidden, inter;
  };
  // The W4A8 kernel's variants by mean grouped rows per expert and weight-tile fit: 32 rows with
  // four MMA warpgroups (96 x 2 / 8; pass 1 of 45 x 3 / 40), with two (pass 0 of 45 x 3 / 40:
  // inter 128), 64 rows (160 x 2 / 8), 128 rows (300, 1000 x 4 / 12).
  std::vector<Case> cases = {{96, 8, 2, 256, 256},
                             {300, 1, 1, 384, 256},
                             {45, 40, 3, 256, 128},
                             {1000, 12, 4, 512, 384},
                             {160, 8, 2, 256, 384}};
  if (!small_mode()) {
    cases.push_back({512, 64, 6, 2048, 1024});
    cases.push_back({1024, 256, 6, 4096, 2048});  // V4-Flash's routed experts at a 1k prefill
  }
  uint32_t seed = 97000;
  for (const Case& c : cases) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " experts " + std::to_string(c.n_experts));
    seed += 100;
    ExpertSet ex = make_experts(
        Fmt::kMxfp4, c.n_experts, std::min<int64_t>(c.n_experts, 4), c.hidden, c.inter, seed);
    DevVec<uint8_t> d1 = upload_refs(ex.w1), d3 = upload_refs(ex.w3), d2 = upload_refs(ex.w2);
    // Routing: each token's k distinct experts at random, grouped on the device.
    std::mt19937 rng(seed);
    const int64_t pairs = c.n * c.k;
    std::vector<int32_t> ids(static_cast<size_t>(pairs));
    for (int64_t t = 0; t < c.n; ++t) {
      std::vector<int32_t> perm(static_cast<size_t>(c.n_experts));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::copy(perm.begin(), perm.begin() + c.k, ids.begin() + t * c.k);
    }
    DevVec<int32_t> d_ids(ids), d_src(static_cast<size_t>(pairs)),
        d_pos(static_cast<size_t>(pairs));
    DevVec<int64_t> d_begin(static_cast<size_t>(c.n_experts + 1));
    DSI_EXPECT_OK(launch_moe_group(MoeGroupParams{.expert_ids = d_ids.get(),
                                                  .n = c.n,
                                                  .k = c.k,
                                                  .n_experts = c.n_experts,
                                                  .expert_begin = d_begin.get(),
                                                  .pair_src = d_src.get(),
                                                  .pair_pos = d_pos.get()},
                                   nullptr));
    DevVec<float> d_gates(normal_floats(static_cast<size_t>(pairs), seed + 1, 0.3f));
    DevVec<float> d_x(normal_floats(static_cast<size_t>(c.n * c.hidden), seed + 2, 8.0f));
    const int64_t ld = fp8_acts_ld(c.hidden);
    DevVec<uint8_t> d_xq(static_cast<size_t>(c.n * ld));
    DevVec<float> d_xs(static_cast<size_t>(c.n * ld / 128));
    DSI_EXPECT_OK(launch_quantize_fp8(
        QuantizeFp8Params{
            .x = d_x.get(), .n = c.n, .k = c.hidden, .codes = d_xq.get(), .scales = d_xs.get()},
        nullptr));
    const int64_t sb = moe_sm90_scratch_bytes(c.n_experts, pairs, c.hidden, c.inter);
    DevVec<uint8_t> d_scratch(static_cast<size_t>(sb));
    std::vector<std::vector<float>> ys;
    for (const int sr : {128, 1, 0}) {  // 0: W4A8
      DevVec<uint8_t> mem(static_cast<size_t>(
          moe_fp8_weights_bytes(c.n_experts, c.hidden, c.inter, sr == 0 ? 1 : sr)));
      DevVec<uint8_t> exp(
          static_cast<size_t>(moe_mxfp4_exponent_bytes(c.n_experts, c.hidden, c.inter)));
      MoeFp8Weights wf;
      MoeMxfp4Weights w4;
      if (sr == 0) {
        w4 = mxfp4_direct(d1, d3, d2, exp, c.n_experts, c.hidden, c.inter);
      } else {
        wf = moe_fp8_weights_carve(mem.get(), c.n_experts, c.hidden, c.inter, sr);
        EXPECT_EQ(reencode_mxfp4(d1, d3, d2, wf), 0) << "scale_rows " << sr;
      }
      DevVec<float> d_y(static_cast<size_t>(pairs * c.hidden), -1.0f);
      DSI_EXPECT_OK(launch_moe_sm90(MoeSm90Params{.w = wf,
                                                  .w4 = w4,
                                                  .expert_begin = d_begin.get(),
                                                  .pair_src = d_src.get(),
                                                  .k = c.k,
                                                  .gates = d_gates.get(),
                                                  .x = Fp8Acts{d_xq.get(), d_xs.get(), ld},
                                                  .num_pairs = pairs,
                                                  .swiglu_limit = 10.0f,
                                                  .scratch = d_scratch.get(),
                                                  .scratch_bytes = sb,
                                                  .y = d_y.get()},
                                    nullptr));
      sync();
      ys.push_back(d_y.download());
    }
    for (size_t v = 1; v < ys.size(); ++v) {
      int64_t differ = 0;
      for (size_t i = 0; i < ys[0].size(); ++i) {
        if (std::memcmp(&ys[0][i], &ys[v][i], 4) != 0 && differ++ < 5)
          ADD_FAILURE() << "y[" << i << "]: block scales " << ys[0][i]
                        << (v == 1 ? " row scales " : " W4A8 ") << ys[v][i];
      }
      EXPECT_EQ(differ, 0) << (v == 1 ? "row scales" : "W4A8");
    }
  }
}

// The re-encoding is exact within E4M3's range (32-block exponents <= 14 binades apart under one
// scale) and counts the row blocks outside it, at both granularities: one row's four 32-blocks
// spread apart (outside the range for both), and two rows of one 128 x 128 block apart from each
// other (outside it for the block scale only).
TEST_F(GpuTest, MoeFp8ReencodeExactAndCountsOutOfRange) {
  const int64_t hidden = 256, inter = 128;
  for (const int scale_rows : {1, 128}) {
    for (const bool across_rows : {false, true}) {
      for (int spread : {14, 15}) {
        SCOPED_TRACE("scale_rows " + std::to_string(scale_rows) + " exponent spread " +
                     std::to_string(spread) + (across_rows ? " across rows" : " in one row"));
        ExpertSet ex = make_experts(Fmt::kMxfp4, 2, 2, hidden, inter, 4242 + spread);
        // Expert 0's W1, K block 1: row 3's four 32-blocks spread apart, or row 3 at the low
        // exponent and row 5 at the high one.
        TestWeight* w1 = const_cast<TestWeight*>(ex.w1[0]);
        for (int j = 0; j < 4; ++j) {
          if (across_rows) {
            w1->scale[3 * (hidden / 32) + 4 + j] = 110;
            w1->scale[5 * (hidden / 32) + 4 + j] = static_cast<uint8_t>(110 + spread);
          } else {
            w1->scale[3 * (hidden / 32) + 4 + j] =
                static_cast<uint8_t>(110 + (j == 3 ? spread : j));
          }
        }
        for (int64_t c = 0; c < hidden / 2; ++c) {
          w1->data[3 * (hidden / 2) + c] = 0x53;  // nonzero
          w1->data[5 * (hidden / 2) + c] = 0x53;
        }
        w1->d_scale = DevVec<uint8_t>(w1->scale);
        w1->d_data = DevVec<uint8_t>(w1->data);
        w1->dev.scale = w1->d_scale.get();
        w1->dev.data = w1->d_data.get();
        std::vector<MatrixRef> r1{ex.w1[0]->dev, ex.w1[1]->dev}, r3{ex.w3[0]->dev, ex.w3[1]->dev},
            r2{ex.w2[0]->dev, ex.w2[1]->dev};
        DevVec<uint8_t> d1 = upload_refs(r1), d3 = upload_refs(r3), d2 = upload_refs(r2);
        DevVec<uint8_t> mem(
            static_cast<size_t>(moe_fp8_weights_bytes(2, hidden, inter, scale_rows)));
        const MoeFp8Weights wf = moe_fp8_weights_carve(mem.get(), 2, hidden, inter, scale_rows);
        const bool out_of_range = spread > 14 && (!across_rows || scale_rows == 128);
        EXPECT_EQ(reencode_mxfp4(d1, d3, d2, wf), out_of_range ? 1 : 0);
        if (scale_rows == 1) {  // the W4A8 GEMMs' block exponents follow the per-row rule
          DevVec<uint8_t> exp(static_cast<size_t>(moe_mxfp4_exponent_bytes(2, hidden, inter)));
          const MoeMxfp4Weights w4 = moe_mxfp4_weights_carve(
              exp.get(), as_refs(d1), as_refs(d3), as_refs(d2), 2, hidden, inter);
          DevVec<int> bad(1, 0);
          DSI_EXPECT_OK(launch_moe_mxfp4_scales(w4, bad.get(), nullptr));
          sync();
          EXPECT_EQ(bad.download()[0], out_of_range ? 1 : 0) << "W4A8 block exponents";
        }
        if (out_of_range)
          continue;
        // Every value of W1 | W3 equals its MXFP4 value exactly.
        const std::vector<uint8_t> all = mem.download();
        const auto* base = all.data();
        auto at = [&](const void* dev) {
          return base + (static_cast<const uint8_t*>(dev) - mem.get());
        };
        const uint8_t* c13 = at(wf.w13);
        const auto* s13 = reinterpret_cast<const float*>(at(wf.s13));
        std::vector<float> row(static_cast<size_t>(hidden));
        for (int64_t e = 0; e < 2; ++e) {
          for (int64_t r = 0; r < 2 * inter; ++r) {
            const TestWeight* w = r < inter ? ex.w1[e] : ex.w3[e];
            w->host.dequant_row(r % inter, row.data());
            for (int64_t c = 0; c < hidden; ++c) {
              const float s =
                  s13[(e * (hidden / 128) + c / 128) * (2 * inter / scale_rows) + r / scale_rows];
              const float v = numeric::fp8_e4m3_to_f32(c13[(e * 2 * inter + r) * hidden + c]) * s;
              ASSERT_EQ(v, row[c]) << "expert " << e << " row " << r << " col " << c;
            }
          }
        }
      }
    }
  }
}

#endif  // DSINFER_HAVE_CUTLASS

TEST(GpuOpsArgs, MoeValidates) {
  EXPECT_EQ(launch_moe_route(MoeRouteParams{.n = 1, .n_experts = 4, .k = 5}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(launch_moe_route(MoeRouteParams{.n = 0, .n_experts = 4, .k = 2}, nullptr).ok());
  EXPECT_EQ(launch_expert_ffn(
                ExpertFfnParams{.n_experts = 3, .hidden = 8, .inter = 8, .num_pairs = 4}, nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  // The decode GEMVs: shapes off the 128 grid, short activation rows, null pointers.
  EXPECT_FALSE(expert_gemv_supports(4096, 2000));
  EXPECT_TRUE(expert_gemv_supports(4096, 2048));
  const Fp8Acts xq{nullptr, nullptr, 256};
  EXPECT_EQ(launch_expert_gemv(
                Fp8ExpertFfnParams{.hidden = 256, .inter = 96, .x = xq, .num_pairs = 2}, nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      launch_expert_gemv(
          Fp8ExpertFfnParams{
              .hidden = 256, .inter = 128, .x = Fp8Acts{nullptr, nullptr, 128}, .num_pairs = 2},
          nullptr)
          .code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(launch_expert_gemv(
                Fp8ExpertFfnParams{.hidden = 256, .inter = 128, .x = xq, .num_pairs = 2}, nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(launch_expert_gemv(
                  Fp8ExpertFfnParams{.hidden = 256, .inter = 128, .x = xq, .num_pairs = 0}, nullptr)
                  .ok());
  EXPECT_EQ(
      launch_expert_gemv_check(nullptr, nullptr, nullptr, 4, 256, 128, nullptr, nullptr).code(),
      StatusCode::kInvalidArgument);
#if DSINFER_HAVE_CUTLASS
  // Expert FP8 copies with a scale granularity other than 1 or 128 rows are refused before any
  // device work, by the re-encoder and by the grouped GEMMs.
  MoeFp8Weights odd;
  odd.n_experts = 2;
  odd.hidden = 256;
  odd.inter = 128;
  odd.scale_rows = 64;
  int bad = 0;
  EXPECT_EQ(
      launch_moe_fp8_reencode(nullptr, nullptr, nullptr, WeightFormat::kMxfp4, odd, &bad, nullptr)
          .code(),
      StatusCode::kInvalidArgument);
  MoeSm90Params mp;
  mp.w = odd;
  mp.num_pairs = 2;
  EXPECT_EQ(launch_moe_sm90(mp, nullptr).code(), StatusCode::kInvalidArgument);
  // The grouped W4A8 GEMMs and their load-time exponents refuse shapes, passes, expert counts,
  // missing pointers and unaligned activations before any device work; no pairs is a no-op.
  MoeMxfp4Weights w4;
  w4.n_experts = 2;
  w4.hidden = 256;
  w4.inter = 100;  // not a multiple of 128
  EXPECT_EQ(launch_moe_mxfp4_scales(w4, &bad, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(launch_moe_w4a8_gemm(MoeW4a8GemmParams{.w = w4, .num_pairs = 2}, nullptr).code(),
            StatusCode::kInvalidArgument);
  w4.inter = 128;
  EXPECT_EQ(launch_moe_mxfp4_scales(w4, &bad, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      launch_moe_w4a8_gemm(MoeW4a8GemmParams{.w = w4, .pass = 2, .num_pairs = 2}, nullptr).code(),
      StatusCode::kInvalidArgument);
  EXPECT_TRUE(launch_moe_w4a8_gemm(MoeW4a8GemmParams{.w = w4, .num_pairs = 0}, nullptr).ok());
  EXPECT_EQ(launch_moe_w4a8_gemm(MoeW4a8GemmParams{.w = w4, .num_pairs = 2}, nullptr).code(),
            StatusCode::kInvalidArgument);  // null pointers
  MoeMxfp4Weights many = w4;
  many.n_experts = 4096;
  EXPECT_EQ(launch_moe_w4a8_gemm(MoeW4a8GemmParams{.w = many, .num_pairs = 2}, nullptr).code(),
            StatusCode::kInvalidArgument);
  const auto* fake = reinterpret_cast<const MatrixRef*>(uintptr_t{256});
  auto* fake_bytes = reinterpret_cast<uint8_t*>(uintptr_t{256});
  MoeMxfp4Weights set = w4;
  set.w1 = set.w3 = set.w2 = fake;
  set.exp13 = set.exp2 = fake_bytes;
  const int64_t begin_stub = 0;
  const float scale_stub = 1.0f;
  float d_stub = 0.0f;
  EXPECT_EQ(launch_moe_w4a8_gemm(MoeW4a8GemmParams{.w = set,
                                                   .expert_begin = &begin_stub,
                                                   .a = fake_bytes + 8,  // not 16-byte aligned
                                                   .sa = &scale_stub,
                                                   .num_pairs = 2,
                                                   .d = &d_stub},
                                 nullptr)
                .code(),
            StatusCode::kInvalidArgument);
#endif
}

}  // namespace
}  // namespace dsinfer::cuda::test
