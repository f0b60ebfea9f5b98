// mHC pre (mixing partials, optionally after a pending post step, + gates + Sinkhorn + collapse,
// optionally + RMSNorm), post and head against kernels/cpu/mhc.h (and cpu::rms_norm), for hc in
// {1, 3, 4, 16}, awkward hidden sizes and batches incl. empty.
//
// Tolerance. The scalar per-token work uses the CPU's operations in the same order; what differs
// is CUDA's expf (<= 2 ulp vs glibc) and the order of the double mixing sums (invisible after the
// cast to fp32 except at rounding boundaries). Sinkhorn is a contraction, so those ulps stay
// ulps; the RMS factor multiplies the dot products after the sum on the GPU and each x before it
// on the CPU (one fp32 rounding per term, ~1e-7 relative): post / comb / collapsed are checked at
// 2e-6 relative (collapsed: relative to sum_j |pre_j x_j|, 3e-6; comb at hc 16: 4e-6). hc_post
// (alone or applied by the mixing kernel) uses no transcendental function and the CPU's order:
// bit-exact.
#include "kernels/cpu/mhc.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/mhc.h"
#include "test_util.h"

namespace dsinfer::cuda::test {
namespace {

struct HcData {
  std::vector<float> fn, base, scale, x;
};

HcData make_hc(int64_t hc, int64_t hidden, int64_t rows, int64_t n, uint32_t seed) {
  HcData d;
  d.fn = normal_floats(static_cast<size_t>(rows * hc * hidden), seed, 0.02f);
  d.base = normal_floats(static_cast<size_t>(rows), seed + 1, 0.5f);
  d.scale = normal_floats(3, seed + 2, 1.0f);
  d.x = normal_floats(static_cast<size_t>(n * hc * hidden), seed + 3, 2.0f);
  return d;
}

// collapsed = sum_j pre_j x_j is checked relative to sum_j |pre_j x_j| (pre_j in (eps, 1 + eps)),
// and after the fused RMSNorm relative to that times |weight| / rms.
std::vector<double> collapse_tol(const std::vector<float>& x,
                                 int64_t hc,
                                 int64_t hidden,
                                 int64_t n,
                                 const std::vector<float>* unnormed,
                                 const std::vector<float>* weight) {
  std::vector<double> tol(static_cast<size_t>(n * hidden));
  for (int64_t t = 0; t < n; ++t) {
    double rinv = 1.0;
    if (unnormed) {
      double ss = 0.0;
      for (int64_t c = 0; c < hidden; ++c) ss += std::pow((*unnormed)[t * hidden + c], 2);
      rinv = 1.0 / std::sqrt(ss / static_cast<double>(hidden) + 1e-6);
    }
    for (int64_t c = 0; c < hidden; ++c) {
      double m = 0.0;
      for (int64_t j = 0; j < hc; ++j) m += std::fabs(x[(t * hc + j) * hidden + c]);
      const double w = weight ? std::fabs((*weight)[c]) : 1.0;
      tol[t * hidden + c] = 3e-6 * m * rinv * w + 1e-30;
    }
  }
  return tol;
}

// hc_pre on the GPU against the CPU's hc_post (when a post step is pending) then hc_pre then
// rms_norm (when a norm weight is given): hidden sizes that take the FP64 tensor-core mixing
// kernel (hc 4, hidden a multiple of 256) and the generic one, token counts with partial groups.
TEST_F(GpuTest, HcPreMatchesCpu) {
  uint32_t seed = 1;
  for (int64_t hc : {4, 1, 3, 16}) {
    for (int64_t hidden : {1, 7, 129, 256, 733, 4096}) {
      for (int64_t n : {0, 1, 3, 19, 40, 70}) {  // partial token groups; 70: two-kernel pre
        if (hc == 16 && hidden > 733)
          continue;
        if (n == 70 && hidden > 256 && hc != 4)
          continue;
        for (int variant = 0; variant < 3; ++variant) {  // plain, + pending post, + post + norm
          const bool pending = variant >= 1;
          const bool norm = variant == 2;
          SCOPED_TRACE("hc_pre hc " + std::to_string(hc) + " hidden " + std::to_string(hidden) +
                       " n " + std::to_string(n) + (pending ? " pending post" : "") +
                       (norm ? " norm" : ""));
          const int64_t mix = (2 + hc) * hc;
          const HcData d = make_hc(hc, hidden, mix, n, seed += 5);
          const std::vector<float> f = normal_floats(static_cast<size_t>(n * hidden), seed + 7);
          const std::vector<float> ppost = normal_floats(static_cast<size_t>(n * hc), seed + 8);
          const std::vector<float> pcomb =
              normal_floats(static_cast<size_t>(n * hc * hc), seed + 9, 0.5f);
          const std::vector<float> nw = normal_floats(static_cast<size_t>(hidden), seed + 10);
          // The streams the pre step sees: the pending post's output, or x itself.
          std::vector<float> xs = d.x;
          if (pending) {
            for (int64_t t = 0; t < n; ++t) {
              cpu::hc_post(hc,
                           hidden,
                           f.data() + t * hidden,
                           d.x.data() + t * hc * hidden,
                           ppost.data() + t * hc,
                           pcomb.data() + t * hc * hc,
                           xs.data() + t * hc * hidden);
            }
          }
          cpu::HyperConnParams cp;
          cp.fn = d.fn.data();
          cp.base = d.base.data();
          cp.scale = d.scale.data();
          cp.hc = hc;
          cp.hidden = hidden;
          std::vector<float> post(static_cast<size_t>(n * hc)),
              comb(static_cast<size_t>(n * hc * hc)), col(static_cast<size_t>(n * hidden));
          for (int64_t t = 0; t < n; ++t) {
            cpu::hc_pre(cp,
                        xs.data() + t * hc * hidden,
                        post.data() + t * hc,
                        comb.data() + t * hc * hc,
                        col.data() + t * hidden);
          }
          const std::vector<float> unnormed = col;
          if (norm)
            cpu::rms_norm(unnormed.data(), n, hidden, nw.data(), 1e-6f, col.data());
          DevVec<float> d_fn(d.fn), d_base(d.base), d_scale(d.scale), d_x(d.x);
          DevVec<float> d_f(f), d_ppost(ppost), d_pcomb(pcomb), d_nw(nw), d_xout(d.x.size());
          DevVec<float> d_post(post.size()), d_comb(comb.size()), d_col(col.size());
          DevVec<double> d_scratch(static_cast<size_t>(hc_mix_scratch_doubles(n, mix) + 1));
          HcPreParams p{.fn = d_fn.get(),
                        .base = d_base.get(),
                        .scale = d_scale.get(),
                        .hc = hc,
                        .hidden = hidden,
                        .x = d_x.get(),
                        .n = n,
                        .post = d_post.get(),
                        .comb = d_comb.get(),
                        .collapsed = d_col.get(),
                        .scratch = d_scratch.get()};
          if (pending) {
            p.pending = HcPending{.f = d_f.get(),
                                  .post = d_ppost.get(),
                                  .comb = d_pcomb.get(),
                                  .x_out = d_xout.get()};
          }
          if (norm)
            p.norm_weight = d_nw.get();
          DSI_EXPECT_OK(launch_hc_pre(p, nullptr));
          sync();
          if (pending)
            expect_rel(xs, d_xout.download(), 0.0, 0.0, "pending post output");
          expect_rel(post, d_post.download(), 2e-6, 1e-6, "post");
          // hc 16: 20 Sinkhorn rounds over 16 x 16 carry the mix's rounding difference further.
          expect_rel(comb, d_comb.download(), hc == 16 ? 4e-6 : 2e-6, 1e-6, "comb");
          expect_within(
              col,
              d_col.download(),
              collapse_tol(xs, hc, hidden, n, norm ? &unnormed : nullptr, norm ? &nw : nullptr),
              "collapsed");
        }
      }
    }
  }
}

// Batch invariance of the pre step: a token's post, comb, collapsed and pending post output (with
// a pending post step and the norm) are the same bits whatever the token count, across the
// one-kernel (few tokens) and two-kernel (many tokens) paths and the mixing kernel's token groups
// (from 1,024 tokens on, each block walks several of them).
TEST_F(GpuTest, HcPreIsTheSameForAnyTokenCount) {
  const int64_t hc = 4, hidden = 4096, mix = (2 + hc) * hc, big = 1037;
  const HcData d = make_hc(hc, hidden, mix, big, 4242);
  const std::vector<float> f = normal_floats(static_cast<size_t>(big * hidden), 4300);
  const std::vector<float> pp = normal_floats(static_cast<size_t>(big * hc), 4301);
  const std::vector<float> pc = normal_floats(static_cast<size_t>(big * hc * hc), 4302, 0.5f);
  const std::vector<float> nw = normal_floats(static_cast<size_t>(hidden), 4303);
  DevVec<float> d_fn(d.fn), d_base(d.base), d_scale(d.scale), d_x(d.x), d_f(f), d_pp(pp), d_pc(pc),
      d_nw(nw);
  auto run = [&](int64_t n) {
    DevVec<float> xo(static_cast<size_t>(n * hc * hidden)), post(static_cast<size_t>(n * hc)),
        comb(static_cast<size_t>(n * hc * hc)), col(static_cast<size_t>(n * hidden));
    DevVec<double> scratch(static_cast<size_t>(hc_mix_scratch_doubles(n, mix)));
    HcPreParams p{.fn = d_fn.get(),
                  .base = d_base.get(),
                  .scale = d_scale.get(),
                  .hc = hc,
                  .hidden = hidden,
                  .x = d_x.get(),
                  .n = n,
                  .post = post.get(),
                  .comb = comb.get(),
                  .collapsed = col.get(),
                  .scratch = scratch.get()};
    p.pending =
        HcPending{.f = d_f.get(), .post = d_pp.get(), .comb = d_pc.get(), .x_out = xo.get()};
    p.norm_weight = d_nw.get();
    const Status st = launch_hc_pre(p, nullptr);
    EXPECT_TRUE(st.ok()) << st.to_string();
    sync();
    std::vector<float> xout = xo.download();
    xout.resize(static_cast<size_t>(std::min<int64_t>(n, 17) * hc * hidden));
    return std::vector<std::vector<float>>{post.download(), comb.download(), col.download(), xout};
  };
  const auto all = run(big);
  for (int64_t n : {1, 5, 17, 70}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const auto few = run(n);
    for (size_t k = 0; k < few.size(); ++k) {
      ASSERT_EQ(0, std::memcmp(few[k].data(), all[k].data(), few[k].size() * sizeof(float)))
          << "output " << k;
    }
  }
}

TEST_F(GpuTest, HcPostIsBitExact) {
  uint32_t seed = 500;
  for (int64_t hc : {4, 1, 3}) {
    for (int64_t hidden : {1, 7, 129, 4096}) {
      for (int64_t n : {0, 1, 3, 7}) {
        SCOPED_TRACE("hc_post hc " + std::to_string(hc) + " hidden " + std::to_string(hidden));
        const std::vector<float> f = normal_floats(static_cast<size_t>(n * hidden), seed++);
        const std::vector<float> x = normal_floats(static_cast<size_t>(n * hc * hidden), seed++);
        const std::vector<float> post = normal_floats(static_cast<size_t>(n * hc), seed++);
        const std::vector<float> comb = normal_floats(static_cast<size_t>(n * hc * hc), seed++);
        std::vector<float> want(x.size());
        for (int64_t t = 0; t < n; ++t) {
          cpu::hc_post(hc,
                       hidden,
                       f.data() + t * hidden,
                       x.data() + t * hc * hidden,
                       post.data() + t * hc,
                       comb.data() + t * hc * hc,
                       want.data() + t * hc * hidden);
        }
        DevVec<float> d_f(f), d_x(x), d_post(post), d_comb(comb), d_out(x.size());
        DSI_EXPECT_OK(launch_hc_post(HcPostParams{.hc = hc,
                                                  .hidden = hidden,
                                                  .n = n,
                                                  .f = d_f.get(),
                                                  .x = d_x.get(),
                                                  .post = d_post.get(),
                                                  .comb = d_comb.get(),
                                                  .x_out = d_out.get()},
                                     nullptr));
        sync();
        expect_rel(want, d_out.download(), 0.0, 0.0, "hc_post");
      }
    }
  }
}

TEST_F(GpuTest, HcHeadMatchesCpu) {
  uint32_t seed = 900;
  for (int64_t hc : {4, 1, 3}) {
    for (int64_t hidden : {1, 7, 129, 256, 4096}) {
      for (int64_t n : {0, 1, 3, 7, 19, 70}) {
        SCOPED_TRACE("hc_head hc " + std::to_string(hc) + " hidden " + std::to_string(hidden));
        const HcData d = make_hc(hc, hidden, hc, n, seed += 5);
        cpu::HyperHeadParams hp;
        hp.fn = d.fn.data();
        hp.base = d.base.data();
        hp.scale = d.scale.data();
        hp.hc = hc;
        hp.hidden = hidden;
        std::vector<float> col(static_cast<size_t>(n * hidden));
        for (int64_t t = 0; t < n; ++t) {
          cpu::hc_head(hp, d.x.data() + t * hc * hidden, col.data() + t * hidden);
        }
        DevVec<float> d_fn(d.fn), d_base(d.base), d_scale(d.scale), d_x(d.x), d_col(col.size());
        DevVec<double> d_scratch(static_cast<size_t>(hc_mix_scratch_doubles(n, hc) + 1));
        const std::vector<float> nw = normal_floats(static_cast<size_t>(hidden), seed + 11);
        DevVec<float> d_nw(nw);
        for (bool norm : {false, true}) {
          SCOPED_TRACE(norm ? "with the final norm" : "collapse only");
          std::vector<float> want = col;
          if (norm)
            cpu::rms_norm(col.data(), n, hidden, nw.data(), 1e-6f, want.data());
          DSI_EXPECT_OK(launch_hc_head(HcHeadParams{.fn = d_fn.get(),
                                                    .base = d_base.get(),
                                                    .scale = d_scale.get(),
                                                    .hc = hc,
                                                    .hidden = hidden,
                                                    .x = d_x.get(),
                                                    .n = n,
                                                    .norm_weight = norm ? d_nw.get() : nullptr,
                                                    .collapsed = d_col.get(),
                                                    .scratch = d_scratch.get()},
                                       nullptr));
          sync();
          expect_within(
              want,
              d_col.download(),
              collapse_tol(d.x, hc, hidden, n, norm ? &col : nullptr, norm ? &nw : nullptr),
              "hc_head");
        }
      }
    }
  }
}

TEST(GpuOpsArgs, HcValidates) {
  EXPECT_EQ(launch_hc_pre(HcPreParams{.hc = 17, .hidden = 4, .n = 1}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(launch_hc_post(HcPostParams{.hc = 4, .hidden = 4, .n = 0}, nullptr).ok());
  float* some = reinterpret_cast<float*>(16);
  HcPreParams half{.hc = 4, .hidden = 4, .n = 1};
  half.pending.f = some;  // a pending post step without its other operands
  EXPECT_EQ(launch_hc_pre(half, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsinfer::cuda::test
