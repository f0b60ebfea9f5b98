// mHC pre (fused RMS-scaled mix + gates + Sinkhorn + collapse), post and head against
// kernels/cpu/mhc.h, for hc in {1, 3, 4, 16}, awkward hidden sizes and batches incl. empty.
//
// Tolerance. The scalar per-token work uses the CPU's operations in the same order; what differs
// is CUDA's expf (<= 2 ulp vs glibc) and the order of the double mixing sums (invisible after the
// cast to fp32 except at rounding boundaries). Sinkhorn is a contraction, so those ulps stay
// ulps: post / comb / collapsed are checked at 2e-6 relative (collapsed: relative to
// sum_j |pre_j x_j|). hc_post uses no transcendental function and the CPU's order: bit-exact.
#include "kernels/cpu/mhc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

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

TEST_F(GpuTest, HcPreMatchesCpu) {
  uint32_t seed = 1;
  for (int64_t hc : {4, 1, 3, 16}) {
    for (int64_t hidden : {1, 7, 129, 733, 4096}) {
      for (int64_t n : {0, 1, 3, 7, 19}) {  // 19: split mixing in 8-token groups with a tail
        if (hc == 16 && hidden > 733)
          continue;
        SCOPED_TRACE("hc_pre hc " + std::to_string(hc) + " hidden " + std::to_string(hidden) +
                     " n " + std::to_string(n));
        const int64_t mix = (2 + hc) * hc;
        const HcData d = make_hc(hc, hidden, mix, n, seed += 5);
        cpu::HyperConnParams cp;
        cp.fn = d.fn.data();
        cp.base = d.base.data();
        cp.scale = d.scale.data();
        cp.hc = hc;
        cp.hidden = hidden;
        std::vector<float> post(static_cast<size_t>(n * hc)),
            comb(static_cast<size_t>(n * hc * hc)), col(static_cast<size_t>(n * hidden));
        std::vector<double> col_mag(col.size());
        for (int64_t t = 0; t < n; ++t) {
          cpu::hc_pre(cp,
                      d.x.data() + t * hc * hidden,
                      post.data() + t * hc,
                      comb.data() + t * hc * hc,
                      col.data() + t * hidden);
        }
        DevVec<float> d_fn(d.fn), d_base(d.base), d_scale(d.scale), d_x(d.x);
        DevVec<float> d_post(post.size()), d_comb(comb.size()), d_col(col.size());
        // Both mixing paths: one block per token, and split over many blocks (scratch).
        DevVec<double> d_scratch(static_cast<size_t>(hc_mix_scratch_doubles(n, mix) + 1));
        for (bool split : {false, true}) {
          SCOPED_TRACE(split ? "split mixing" : "one block per token");
          DSI_EXPECT_OK(launch_hc_pre(HcPreParams{.fn = d_fn.get(),
                                                  .base = d_base.get(),
                                                  .scale = d_scale.get(),
                                                  .hc = hc,
                                                  .hidden = hidden,
                                                  .x = d_x.get(),
                                                  .n = n,
                                                  .post = d_post.get(),
                                                  .comb = d_comb.get(),
                                                  .collapsed = d_col.get(),
                                                  .scratch = split ? d_scratch.get() : nullptr},
                                      nullptr));
          sync();
          expect_rel(post, d_post.download(), 2e-6, 1e-6, "post");
          expect_rel(comb, d_comb.download(), 2e-6, 1e-6, "comb");
          // collapsed = sum_j pre_j x_j: relative to sum_j |pre_j x_j| (pre_j in (eps, 1 + eps)).
          std::vector<double> tol(col.size());
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t c = 0; c < hidden; ++c) {
              double m = 0.0;
              for (int64_t j = 0; j < hc; ++j) m += std::fabs(d.x[(t * hc + j) * hidden + c]);
              tol[t * hidden + c] = 2e-6 * m + 1e-30;
            }
          }
          expect_within(col, d_col.download(), tol, "collapsed");
        }
      }
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
    for (int64_t hidden : {1, 7, 129, 4096}) {
      for (int64_t n : {0, 1, 3, 7}) {
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
        for (bool split : {false, true}) {
          SCOPED_TRACE(split ? "split mixing" : "one block per token");
          DSI_EXPECT_OK(launch_hc_head(HcHeadParams{.fn = d_fn.get(),
                                                    .base = d_base.get(),
                                                    .scale = d_scale.get(),
                                                    .hc = hc,
                                                    .hidden = hidden,
                                                    .x = d_x.get(),
                                                    .n = n,
                                                    .collapsed = d_col.get(),
                                                    .scratch = split ? d_scratch.get() : nullptr},
                                       nullptr));
          sync();
          std::vector<double> tol(col.size());
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t c = 0; c < hidden; ++c) {
              double m = 0.0;
              for (int64_t j = 0; j < hc; ++j) m += std::fabs(d.x[(t * hc + j) * hidden + c]);
              tol[t * hidden + c] = 2e-6 * m + 1e-30;
            }
          }
          expect_within(col, d_col.download(), tol, "hc_head");
        }
      }
    }
  }
}

TEST(GpuOpsArgs, HcValidates) {
  EXPECT_EQ(launch_hc_pre(HcPreParams{.hc = 17, .hidden = 4, .n = 1}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(launch_hc_post(HcPostParams{.hc = 4, .hidden = 4, .n = 0}, nullptr).ok());
}

}  // namespace
}  // namespace dsinfer::cuda::test
