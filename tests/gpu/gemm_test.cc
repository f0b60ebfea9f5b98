// Dense linear against cpu::linear_rows over every weight format, with and without the in-kernel
// 1x128 FP8 activation quantisation, row subsets, strided x / y, accumulation, and shapes that
// are not tile multiples (64 rows x 16 tokens x 128 K) including an empty batch.
//
// Tolerance: both sides multiply the same dequantised weights by the same (identically
// quantised) activations and accumulate in fp32, in different orders. The difference is bounded
// by the fp32 summation error, ~ K * 2^-24 * sum_k |w_k x_k| in the worst case and
// ~ sqrt(K) * 2^-24 * sum_k |w_k x_k| typically; the check uses 1e-5 * sum_k |w_k x_k| (a
// relative 1e-5 of the products' magnitude, > 10x the typical bound at K <= 4096).
#include "kernels/cuda/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "numeric/quant.h"
#include "test_util.h"

namespace dsinfer::cuda::test {
namespace {

struct LinearCase {
  Fmt fmt;
  int64_t rows;
  int64_t cols;
  int64_t n;
  bool quant;
  int64_t row_begin = 0;
  int64_t row_count = -1;
  int64_t ldx_pad = 0;
  int64_t ldy_pad = 0;
  bool accumulate = false;
};

void run_linear(const LinearCase& c, uint32_t seed) {
  const int64_t count = c.row_count < 0 ? c.rows - c.row_begin : c.row_count;
  SCOPED_TRACE(std::string("linear ") + fmt_name(c.fmt) + " " + std::to_string(c.rows) + "x" +
               std::to_string(c.cols) + " n " + std::to_string(c.n) + (c.quant ? " q8" : "") +
               " rows [" + std::to_string(c.row_begin) + ", +" + std::to_string(count) + ")" +
               (c.accumulate ? " acc" : ""));
  auto w = make_weight(c.fmt, c.rows, c.cols, seed);
  const int64_t ldx = c.cols + c.ldx_pad;
  const int64_t ldy = count + c.ldy_pad;
  std::vector<float> x = normal_floats(static_cast<size_t>(c.n * ldx), seed + 1);
  for (int64_t t = 0; t < c.n; ++t) {  // rows of very different magnitude
    for (int64_t k = 0; k < ldx; ++k) x[t * ldx + k] = std::ldexp(x[t * ldx + k], (t % 5) * 4 - 8);
  }
  std::vector<float> y0 = normal_floats(static_cast<size_t>(c.n * ldy), seed + 2);
  // CPU reference on contiguous copies.
  std::vector<float> xc(static_cast<size_t>(c.n * c.cols));
  for (int64_t t = 0; t < c.n; ++t) {
    std::copy(x.begin() + t * ldx, x.begin() + t * ldx + c.cols, xc.begin() + t * c.cols);
  }
  std::vector<float> yc(static_cast<size_t>(c.n * count));
  cpu::linear_rows(w->host, c.row_begin, count, xc.data(), c.n, yc.data(), c.quant);
  // The magnitude bound per output uses the same quantised activations the kernels use.
  std::vector<float> xq = xc;
  if (c.quant) {
    for (int64_t t = 0; t < c.n; ++t)
      numeric::fp8_block_simulate(xq.data() + t * c.cols, c.cols, 128);
  }
  std::vector<float> want = y0;
  std::vector<double> tol(want.size(), 0.0);
  std::vector<float> wrow(static_cast<size_t>(c.cols));
  for (int64_t r = 0; r < count; ++r) {
    w->host.dequant_row(c.row_begin + r, wrow.data());
    for (int64_t t = 0; t < c.n; ++t) {
      double mag = 0.0;
      for (int64_t k = 0; k < c.cols; ++k) mag += std::fabs(wrow[k] * xq[t * c.cols + k]);
      const size_t i = static_cast<size_t>(t * ldy + r);
      want[i] = c.accumulate ? y0[i] + yc[t * count + r] : yc[t * count + r];
      tol[i] = 1e-5 * mag + (c.accumulate ? 1.2e-7 * std::fabs(want[i]) : 0.0) + 1e-35;
    }
  }
  DevVec<float> d_x(x);
  DevVec<float> d_y(y0);
  DSI_EXPECT_OK(launch_linear(LinearParams{.w = w->dev,
                                           .row_begin = c.row_begin,
                                           .rows = c.row_count,
                                           .x = d_x.get(),
                                           .ldx = ldx,
                                           .n = c.n,
                                           .y = d_y.get(),
                                           .ldy = ldy,
                                           .quantize_activations = c.quant,
                                           .accumulate = c.accumulate},
                              nullptr));
  sync();
  expect_within(want, d_y.download(), tol, "linear");  // the padding columns must be untouched
}

TEST_F(GpuTest, LinearMatchesCpuAllFormats) {
  uint32_t seed = 1;
  const bool small = small_mode();
  for (Fmt f : {Fmt::kF32, Fmt::kBF16, Fmt::kF16, Fmt::kFp8E8M0, Fmt::kFp8F32, Fmt::kMxfp4}) {
    for (int64_t rows : {1, 3, 7, 65, 129, 257}) {
      for (int64_t cols : {32, 96, 128, 160, 736}) {
        for (int64_t n : {0, 1, 3, 7, 17, 33}) {
          if (small && rows * n > 1000)
            continue;
          for (bool q : {false, true}) run_linear({f, rows, cols, n, q}, seed += 3);
        }
      }
    }
  }
}

TEST_F(GpuTest, LinearOddColsFloatAndFp8) {
  uint32_t seed = 5000;
  for (Fmt f : {Fmt::kF32, Fmt::kBF16, Fmt::kFp8E8M0}) {
    for (int64_t cols : {1, 3, 7, 129, 257, 733}) {
      for (bool q : {false, true}) run_linear({f, 131, cols, 5, q}, seed += 3);
    }
  }
}

TEST_F(GpuTest, LinearRowRangesStridesAccumulate) {
  uint32_t seed = 9000;
  // wo_a-style groups: rows [g * 96, +96) of a 384-row weight, strided x and y.
  for (Fmt f : {Fmt::kBF16, Fmt::kFp8E8M0, Fmt::kMxfp4}) {
    for (int64_t g = 0; g < 4; ++g) {
      run_linear({f, 384, 256, 9, false, g * 96, 96, 256 * 3, 96 * 3}, seed += 3);
    }
    run_linear({f, 200, 160, 21, true, 0, -1, 7, 5, true}, seed += 3);
    run_linear({f, 200, 160, 1, false, 199, 1, 0, 0, true}, seed += 3);
  }
}

TEST_F(GpuTest, LinearLargerShapes) {
  if (small_mode())
    GTEST_SKIP() << "small mode";
  uint32_t seed = 12000;
  run_linear({Fmt::kFp8E8M0, 1024, 4096, 37, true}, seed += 3);  // wq_a-like, 37 tokens
  run_linear({Fmt::kMxfp4, 2048, 4096, 5, true}, seed += 3);     // expert w1-like, decode batch
  run_linear({Fmt::kBF16, 1000, 4096, 300, false}, seed += 3);   // router/head-like, prefill
}

TEST(GpuOpsArgs, LinearValidates) {
  static const float dummy[4] = {};
  MatrixRef w;
  w.rows = 10;
  w.cols = 20;
  w.data = dummy;  // never read: validation fails or nothing is launched
  w.scale = dummy;
  w.format = WeightFormat::kMxfp4;
  EXPECT_EQ(launch_linear(LinearParams{.w = w, .n = 1}, nullptr).code(),
            StatusCode::kInvalidArgument);  // mxfp4 cols % 32
  w.format = WeightFormat::kFloat;
  EXPECT_EQ(launch_linear(LinearParams{.w = w, .row_begin = 5, .rows = 6, .n = 1}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(launch_linear(LinearParams{.w = w, .n = 0}, nullptr).ok());  // empty batch
}

}  // namespace
}  // namespace dsinfer::cuda::test
