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

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/fp8_gemm_decode.h"
#if DSINFER_HAVE_CUTLASS
#include "kernels/cuda/fp8_gemm_sm90.h"
#endif
#include "kernels/cuda/gemv.h"
#include "numeric/float_formats.h"
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
  bool tensor_core = false;  // fp8_gemm.h: quantise x on the device, then launch_fp8_linear
  bool bf16x2 = false;       // fp8_gemm.h: split x into BF16 halves, then launch_bf16x2_linear
  bool wgmma = false;        // the wgmma path must run (fp8: scratch given; bf16x2: allowed)
  bool split_k = false;      // bf16x2: scratch given, the tile kernel must split K
  bool hi_only = false;      // bf16x2: x rounded to BF16, split without low halves (one pass)
  bool gemv = false;         // fp8: launch_fp8_gemv itself, whichever path launch_fp8_linear takes
};

void run_linear(const LinearCase& c, uint32_t seed) {
  const int64_t count = c.row_count < 0 ? c.rows - c.row_begin : c.row_count;
  SCOPED_TRACE(std::string("linear ") + fmt_name(c.fmt) + " " + std::to_string(c.rows) + "x" +
               std::to_string(c.cols) + " n " + std::to_string(c.n) + (c.quant ? " q8" : "") +
               " rows [" + std::to_string(c.row_begin) + ", +" + std::to_string(count) + ")" +
               (c.accumulate ? " acc" : "") + (c.tensor_core ? " tensor-core" : "") +
               (c.bf16x2 ? " bf16x2" : "") + (c.wgmma ? " wgmma" : "") +
               (c.split_k ? " split-k" : "") + (c.hi_only ? " hi-only" : "") +
               (c.gemv ? " gemv" : ""));
  auto w = make_weight(c.fmt, c.rows, c.cols, seed);
  const int64_t ldx = c.cols + c.ldx_pad;
  const int64_t ldy = count + c.ldy_pad;
  std::vector<float> x = normal_floats(static_cast<size_t>(c.n * ldx), seed + 1);
  for (int64_t t = 0; t < c.n; ++t) {  // rows of very different magnitude
    for (int64_t k = 0; k < ldx; ++k) x[t * ldx + k] = std::ldexp(x[t * ldx + k], (t % 5) * 4 - 8);
  }
  if (c.hi_only) {
    for (float& v : x) v = numeric::round_to_bf16(v);
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
  // The wgmma paths (the decode-sized kernel, CUTLASS) against the GEMV's and the tiles' exact
  // per-32 MMA sums.
  const bool fast_accumulation = c.wgmma && c.tensor_core && !c.gemv &&
                                 (c.n > kGemvMaxTokens || fp8_gemm_decode_takes(w->dev, c.n));
  std::vector<float> wrow(static_cast<size_t>(c.cols));
  for (int64_t r = 0; r < count; ++r) {
    w->host.dequant_row(c.row_begin + r, wrow.data());
    for (int64_t t = 0; t < c.n; ++t) {
      double mag = 0.0;
      for (int64_t k = 0; k < c.cols; ++k) mag += std::fabs(wrow[k] * xq[t * c.cols + k]);
      const size_t i = static_cast<size_t>(t * ldy + r);
      want[i] = c.accumulate ? y0[i] + yc[t * count + r] : yc[t * count + r];
      // FP8 wgmma keeps ~14 bits while it accumulates inside one 128-wide K block (Hopper's FP8
      // tensor cores, as DeepSeek's own kernels; promoted to fp32 per block): measured up to
      // 6.4e-4 of mag on one-block dot products (~12 bits), bounded here by 2^-10.
      const double rel = fast_accumulation ? 1e-3 : 1e-5;
      tol[i] = rel * mag + (c.accumulate ? 1.2e-7 * std::fabs(want[i]) : 0.0) + 1e-35;
    }
  }
  DevVec<float> d_x(x);
  DevVec<float> d_y(y0);
  if (c.bf16x2) {
    const int64_t ld = bf16_split_ld(c.cols);
    DevVec<uint16_t> d_hi(static_cast<size_t>(std::max<int64_t>(c.n, 1) * ld));
    DevVec<uint16_t> d_lo(static_cast<size_t>(std::max<int64_t>(c.n, 1) * ld));
    uint16_t* lo = c.hi_only ? nullptr : d_lo.get();
    DSI_EXPECT_OK(launch_split_bf16(
        SplitBf16Params{
            .x = d_x.get(), .ldx = ldx, .n = c.n, .k = c.cols, .hi = d_hi.get(), .lo = lo},
        nullptr));
    const int64_t split_floats =
        c.split_k ? bf16x2_linear_scratch_floats(w->dev, count, c.n, 1) : 0;
    if (c.split_k) {
      EXPECT_GT(split_floats, 0) << "the shape does not split";
    }
    DevVec<float> d_part(static_cast<size_t>(std::max<int64_t>(split_floats, 1)));
    const Bf16x2LinearParams p{.w = w->dev,
                               .row_begin = c.row_begin,
                               .rows = c.row_count,
                               .x = Bf16SplitActs{d_hi.get(), lo, ld},
                               .n = c.n,
                               .y = d_y.get(),
                               .ldy = ldy,
                               .accumulate = c.accumulate,
                               .wgmma = c.wgmma || c.split_k,
                               .scratch = c.split_k ? d_part.get() : nullptr,
                               .scratch_floats = split_floats};
    EXPECT_EQ(bf16x2_linear_uses_wgmma(p), c.wgmma) << "the path under test did not run";
    DSI_EXPECT_OK(launch_bf16x2_linear(p, nullptr));
  } else if (c.tensor_core) {
    const int64_t ld = fp8_acts_ld(c.cols);
    DevVec<uint8_t> d_q(static_cast<size_t>(std::max<int64_t>(c.n, 1) * ld));
    DevVec<float> d_s(static_cast<size_t>(std::max<int64_t>(c.n, 1) * ld / 128));
    DSI_EXPECT_OK(launch_quantize_fp8(QuantizeFp8Params{.x = d_x.get(),
                                                        .ldx = ldx,
                                                        .n = c.n,
                                                        .k = c.cols,
                                                        .codes = d_q.get(),
                                                        .scales = d_s.get()},
                                      nullptr));
    const int64_t scratch_floats = c.gemv    ? fp8_gemv_scratch_floats(count, c.cols, c.n)
                                   : c.wgmma ? fp8_linear_scratch_floats(w->dev, -1, c.n)
                                             : 0;
    DevVec<float> d_scratch(static_cast<size_t>(std::max<int64_t>(scratch_floats, 1)));
    const Fp8LinearParams p{.w = w->dev,
                            .row_begin = c.row_begin,
                            .rows = c.row_count,
                            .x = Fp8Acts{d_q.get(), d_s.get(), ld},
                            .n = c.n,
                            .y = d_y.get(),
                            .ldy = ldy,
                            .accumulate = c.accumulate,
                            .wgmma = c.wgmma,
                            .scratch = c.wgmma ? d_scratch.get() : nullptr,
                            .scratch_floats = scratch_floats};
    const Fp8LinearPath want_path = !c.wgmma                             ? Fp8LinearPath::kTile
                                    : fp8_gemm_decode_takes(w->dev, c.n) ? Fp8LinearPath::kDecode
                                    : c.n <= kGemvMaxTokens              ? Fp8LinearPath::kGemv
                                                                         : Fp8LinearPath::kWgmma;
    if (c.gemv) {
      DSI_EXPECT_OK(launch_fp8_gemv(Fp8GemvParams{.w = p.w,
                                                  .row_begin = p.row_begin,
                                                  .rows = p.rows,
                                                  .x_codes = p.x.codes,
                                                  .x_scales = p.x.scales,
                                                  .x_ld = p.x.ld,
                                                  .n = p.n,
                                                  .y = p.y,
                                                  .ldy = p.ldy,
                                                  .accumulate = p.accumulate,
                                                  .scratch = p.scratch,
                                                  .scratch_floats = p.scratch_floats},
                                    nullptr));
    } else {
      EXPECT_EQ(fp8_linear_path(p), want_path) << "the path under test did not run";
      DSI_EXPECT_OK(launch_fp8_linear(p, nullptr));
    }
  } else {
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
  }
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

// launch_quantize_fp8 is numeric::fp8_block_quantize bit for bit (codes and scales, zeros past k),
// over rows of very different magnitude, tails, strides, zeros, and values that clamp.
TEST_F(GpuTest, QuantizeFp8MatchesCpu) {
  uint32_t seed = 41000;
  for (int64_t k : {1, 16, 100, 128, 129, 4096}) {
    for (int64_t n : {1, 3, 70}) {
      const int64_t ldx = k + 5;
      std::vector<float> x = normal_floats(static_cast<size_t>(n * ldx), seed += 7);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t c = 0; c < ldx; ++c) {
          float& v = x[t * ldx + c];
          v = t % 7 == 3 ? 0.0f : std::ldexp(v, static_cast<int>(t % 11) * 6 - 30);
        }
      }
      const int64_t ld = fp8_acts_ld(k);
      std::vector<uint8_t> want_codes(static_cast<size_t>(n * ld), 0);
      std::vector<float> want_scales(static_cast<size_t>(n * ld / 128), 0.0f);
      for (int64_t t = 0; t < n; ++t) {
        std::vector<uint8_t> sb(static_cast<size_t>(ld / 128));
        numeric::fp8_block_quantize(
            x.data() + t * ldx, k, 128, want_codes.data() + t * ld, sb.data());
        for (int64_t b = 0; b < ld / 128; ++b)
          want_scales[t * (ld / 128) + b] = numeric::e8m0_to_f32(sb[b]);
      }
      DevVec<float> d_x(x);
      DevVec<uint8_t> d_q(want_codes.size());
      DevVec<float> d_s(want_scales.size());
      DSI_EXPECT_OK(launch_quantize_fp8(
          QuantizeFp8Params{
              .x = d_x.get(), .ldx = ldx, .n = n, .k = k, .codes = d_q.get(), .scales = d_s.get()},
          nullptr));
      sync();
      EXPECT_EQ(d_q.download(), want_codes) << "k " << k << " n " << n;
      EXPECT_EQ(d_s.download(), want_scales) << "k " << k << " n " << n;
    }
  }
}

// The FP8 tensor-core linear (fp8_gemm.h) against the CPU: decode (<= 8 tokens), medium (<= 32)
// and prefill tiles, row/K tails, row ranges, strides, accumulation, and V4-Flash shapes.
TEST_F(GpuTest, Fp8TensorCoreLinearMatchesCpu) {
  uint32_t seed = 31000;
  const bool small = small_mode();
  for (Fmt f : {Fmt::kFp8E8M0, Fmt::kFp8F32}) {
    for (int64_t rows : {1, 17, 129, 300}) {
      for (int64_t cols : {16, 64, 128, 160, 736}) {
        for (int64_t n : {0, 1, 5, 8, 9, 32, 33, 129, 300}) {
          if (small && rows * n > 5000)
            continue;
          LinearCase c{f, rows, cols, n, true};
          c.tensor_core = true;
          run_linear(c, seed += 3);
        }
      }
    }
    LinearCase strided{f, 384, 256, 40, true, 96, 192, 256 * 3, 200, true};
    strided.tensor_core = true;
    run_linear(strided, seed += 3);
  }
  if (!small) {
    for (auto [rows, cols, n] : {std::tuple<int64_t, int64_t, int64_t>{1024, 4096, 1},
                                 {32768, 1024, 7},
                                 {4096, 8192, 64},
                                 {1536, 4096, 1000}}) {
      LinearCase c{Fmt::kFp8E8M0, rows, cols, n, true};
      c.tensor_core = true;
      run_linear(c, seed += 3);
    }
  }
}

// A 128 x 128 FP8 block-128 weight's shape (no data), to ask which paths a build and device have.
MatrixRef fp8_probe() {
  MatrixRef probe;
  probe.format = WeightFormat::kFp8Block128;
  probe.dtype = DType::kF8E4M3;
  probe.rows = 128;
  probe.cols = 128;
  return probe;
}

// One sweep of a wgmma linear path (the path run_linear expects for the token count): both scale
// types over rows x cols x n (small mode: up to 2e7 multiply-adds each), K of 256 and 4096 over
// rows [ranged[1], +ranged[2]) of a 512-row weight at ranged[0] tokens, output rows 4 floats
// apart, accumulated; outside small mode the given (rows, cols, n) shapes.
struct WgmmaSweep {
  std::vector<int64_t> rows, cols, n;
  std::array<int64_t, 3> ranged;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> real;
};

void run_wgmma_sweep(const WgmmaSweep& w, uint32_t seed) {
  auto run = [&](LinearCase c) {
    c.tensor_core = true;
    c.wgmma = true;
    run_linear(c, seed += 3);
  };
  const bool small = small_mode();
  for (Fmt f : {Fmt::kFp8E8M0, Fmt::kFp8F32}) {
    for (int64_t rows : w.rows) {
      for (int64_t cols : w.cols) {
        for (int64_t n : w.n) {
          if (!small || rows * n * cols <= 20'000'000)
            run(LinearCase{f, rows, cols, n, true});
        }
      }
    }
    for (int64_t cols : {256, 4096})
      run(LinearCase{f, 512, cols, w.ranged[0], true, w.ranged[1], w.ranged[2], 0, 4, true});
  }
  if (!small) {
    for (auto [rows, cols, n] : w.real) run(LinearCase{Fmt::kFp8E8M0, rows, cols, n, true});
  }
}

// The many-row wgmma path (fp8_gemm_sm90.h, builds with CUTLASS): E8M0 and F32 block scales,
// row counts that are not multiples of the 128-row tile, K from one block to V4's 8192, row
// ranges, padded output rows and accumulation, and the V4-Flash prefill shapes.
TEST_F(GpuTest, Fp8WgmmaLinearMatchesCpu) {
  if (fp8_linear_scratch_floats(fp8_probe(), -1, kFp8Sm90MinRows) == 0)
    GTEST_SKIP() << "built without CUTLASS: no wgmma path";
  run_wgmma_sweep({.rows = {128, 272, 1024},
                   .cols = {128, 384, 4096},
                   .n = {64, 65, 127, 300},
                   // Rows [128, +256) of 512 at 97 tokens: over 2 K blocks (whole K per tile) and
                   // over 32 (two tiles: split-K, the fixup adding C once).
                   .ranged = {97, 128, 256},
                   .real = {{1024, 4096, 300}, {4096, 8192, 65}, {32768, 1024, 67}}},
                  52000);
}

// Split-K (decode-sized token counts over few output tiles, fp8_gemm_sm90_gemm.h) sums its K
// ranges in a fixed order: two launches give the same bits, and the sums stay within fp32
// rounding of the whole-K tiles (the scratch without the split's workspace).
#if DSINFER_HAVE_CUTLASS
TEST_F(GpuTest, Fp8WgmmaSplitKIsDeterministic) {
  const int64_t rows = 512, cols = 4096, n = 96;
  auto w = make_weight(Fmt::kFp8E8M0, rows, cols, 53001);
  if (fp8_linear_scratch_floats(w->dev, -1, n) == 0)
    GTEST_SKIP() << "built without CUTLASS: no wgmma path";
  const int64_t ld = fp8_acts_ld(cols);
  DevVec<float> d_x(normal_floats(static_cast<size_t>(n * cols), 53002));
  DevVec<uint8_t> d_q(static_cast<size_t>(n * ld));
  DevVec<float> d_s(static_cast<size_t>(n * ld / 128));
  DSI_EXPECT_OK(launch_quantize_fp8(
      QuantizeFp8Params{.x = d_x.get(), .n = n, .k = cols, .codes = d_q.get(), .scales = d_s.get()},
      nullptr));
  const int64_t full = fp8_linear_scratch_floats(w->dev, -1, n);
  const int64_t least = fp8_gemm_sm90_min_scratch_floats(n, cols, rows);
  ASSERT_GT(full, least) << "this shape does not split K";
  DevVec<float> d_scratch(static_cast<size_t>(full));
  std::vector<std::vector<float>> ys;
  for (const int64_t floats : {full, full, least}) {
    DevVec<float> d_y(static_cast<size_t>(n * rows), 0.0f);
    const Fp8LinearParams p{.w = w->dev,
                            .x = Fp8Acts{d_q.get(), d_s.get(), ld},
                            .n = n,
                            .y = d_y.get(),
                            .wgmma = true,
                            .scratch = d_scratch.get(),
                            .scratch_floats = floats};
    ASSERT_EQ(fp8_linear_path(p), Fp8LinearPath::kWgmma);
    DSI_EXPECT_OK(launch_fp8_linear(p, nullptr));
    sync();
    ys.push_back(d_y.download());
  }
  EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * sizeof(float)));
  double peak = 0.0;
  for (float v : ys[2]) peak = std::max(peak, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < ys[0].size(); ++i) {
    ASSERT_LE(std::fabs(static_cast<double>(ys[0][i]) - ys[2][i]), 1e-5 * peak) << "y[" << i << "]";
  }
}
#endif  // DSINFER_HAVE_CUTLASS

// The decode-sized wgmma path (fp8_gemm_decode.h, 1 <= n <= 64; n <= 8 for K <= 4096): both
// scale types, tiles of 64 and 128 rows with tails, one K block to V4's 8192 (K split over
// clusters of up to 8 blocks), row ranges that start inside a scale block, padded output rows and
// accumulation, one token, and the V4-Flash decode shapes (wq_b, wo_b, wq_a, wkv, the indexer's
// wq_b).
TEST_F(GpuTest, Fp8DecodeLinearMatchesCpu) {
  if (!fp8_gemm_decode_supports(fp8_probe()))
    GTEST_SKIP() << "not an sm_90 device";
  run_wgmma_sweep({.rows = {1, 17, 64, 129, 300},
                   .cols = {128, 384, 4096},
                   .n = {1, 3, 8, 9, 16, 32, 33, 64},
                   .ranged = {40, 64, 200},  // a range starting inside a scale block
                   .real = {{32768, 1024, 1},
                            {32768, 1024, 16},
                            {32768, 1024, 64},
                            {4096, 8192, 64},
                            {1024, 4096, 1},
                            {1024, 4096, 33},
                            {512, 4096, 8},
                            {512, 4096, 64},
                            {8192, 1024, 5},
                            {8192, 1024, 64}}},
                  54000);
}

// A (row, token) sum of the decode path does not depend on the launch or on how many tokens run
// with it: token rows 0..8 of 64-, 33-, 9-, 8- and 1-token launches agree bit for bit (K <= 4096:
// one path from 1 to 64 tokens), and a second 64-token launch repeats the first (K split over a
// cluster, and whole-K tiles).
TEST_F(GpuTest, Fp8DecodeLinearIsBatchInvariant) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1024, 4096}, {2048, 512}}) {
    auto w = make_weight(Fmt::kFp8E8M0, rows, cols, 54501);
    if (!fp8_gemm_decode_supports(w->dev))
      GTEST_SKIP() << "not an sm_90 device";
    const int64_t ld = fp8_acts_ld(cols);
    const int64_t n_max = 64;
    DevVec<float> d_x(normal_floats(static_cast<size_t>(n_max * cols), 54502));
    DevVec<uint8_t> d_q(static_cast<size_t>(n_max * ld));
    DevVec<float> d_s(static_cast<size_t>(n_max * ld / 128));
    DSI_EXPECT_OK(launch_quantize_fp8(
        QuantizeFp8Params{
            .x = d_x.get(), .n = n_max, .k = cols, .codes = d_q.get(), .scales = d_s.get()},
        nullptr));
    std::vector<std::vector<float>> ys;
    for (const int64_t n : {n_max, n_max, int64_t{33}, int64_t{9}, int64_t{8}, int64_t{1}}) {
      DevVec<float> d_y(static_cast<size_t>(n * rows), 0.0f);
      const Fp8LinearParams p{
          .w = w->dev, .x = Fp8Acts{d_q.get(), d_s.get(), ld}, .n = n, .y = d_y.get()};
      ASSERT_EQ(fp8_linear_path(p), Fp8LinearPath::kDecode);
      DSI_EXPECT_OK(launch_fp8_linear(p, nullptr));
      sync();
      ys.push_back(d_y.download());
    }
    EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * sizeof(float)));
    for (size_t v = 2; v < ys.size(); ++v) {
      const int64_t n = static_cast<int64_t>(ys[v].size()) / rows;
      EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[v].data(), std::min<int64_t>(n, 9) * rows * 4))
          << rows << "x" << cols << ", launch " << v;
    }
  }
}

// fp32 activations on the BF16 tensor cores (hi + lo halves, fp8_gemm.h) against the CPU, with
// the reference tolerance: FP8 and BF16 weights, every tile shape, tails, ranges, strides, and the
// V4-Flash wo_a / router / LM-head shapes.
TEST_F(GpuTest, Bf16x2TensorCoreLinearMatchesCpu) {
  uint32_t seed = 51000;
  const bool small = small_mode();
  for (Fmt f : {Fmt::kFp8E8M0, Fmt::kFp8F32, Fmt::kBF16}) {
    for (int64_t rows : {1, 17, 129, 300}) {
      for (int64_t cols : {16, 64, 96, 160, 736}) {
        for (int64_t n : {0, 1, 5, 8, 9, 32, 33, 129, 300}) {
          if (small && rows * n > 5000)
            continue;
          LinearCase c{f, rows, cols, n, false};
          c.bf16x2 = true;
          run_linear(c, seed += 3);
        }
      }
    }
    LinearCase strided{f, 384, 256, 40, false, 96, 192, 256 * 3, 200, true};
    strided.bf16x2 = true;
    run_linear(strided, seed += 3);
  }
  if (!small) {
    for (auto [f, rows, cols, n] :
         {std::tuple<Fmt, int64_t, int64_t, int64_t>{Fmt::kFp8E8M0, 1024, 4096, 1},
          {Fmt::kFp8E8M0, 1024, 4096, 700},
          {Fmt::kBF16, 256, 4096, 64},
          {Fmt::kBF16, 20000, 4096, 3}}) {
      LinearCase c{f, rows, cols, n, false};
      c.bf16x2 = true;
      run_linear(c, seed += 3);
    }
  }
}

// Split-K on the BF16x2 tile kernel (decode batches over small weights: the router, the
// compressors, wo_a): K slices with partial chunks, row ranges, padded outputs, accumulation,
// both weight formats, one group; the splits' sums against the CPU with the reference tolerance.
TEST_F(GpuTest, Bf16x2SplitKLinearMatchesCpu) {
  uint32_t seed = 57000;
  for (Fmt f : {Fmt::kBF16, Fmt::kFp8E8M0, Fmt::kFp8F32}) {
    for (auto [rows, cols, n] : {std::tuple<int64_t, int64_t, int64_t>{17, 736, 9},
                                 {256, 4096, 64},
                                 {300, 1024, 33},
                                 {129, 1000, 1}}) {
      if (f != Fmt::kBF16 && cols % 16 != 0)
        continue;
      for (bool acc : {false, true}) {
        LinearCase c{f, rows, cols, n, false};
        c.accumulate = acc;
        c.bf16x2 = true;
        c.split_k = true;
        run_linear(c, seed += 3);
      }
    }
    LinearCase ranged{f, 384, 2048, 40, false, 96, 192, 256, 200, true};
    ranged.bf16x2 = true;
    ranged.split_k = true;
    run_linear(ranged, seed += 3);
  }
}

// BF16-valued activations (deepseek numerics' attention output into wo_a, numerics point 5):
// the high halves alone, one MMA per product, on the tile kernel (with and without split-K) and
// the wgmma path, against the CPU on the same rounded activations.
TEST_F(GpuTest, Bf16HiOnlyLinearMatchesCpu) {
  uint32_t seed = 58000;
  const bool wgmma_built = fp8_linear_scratch_floats(MatrixRef{.format = WeightFormat::kFp8Block128,
                                                               .dtype = DType::kF8E4M3,
                                                               .rows = 128,
                                                               .cols = 128},
                                                     -1,
                                                     kFp8Sm90MinRows) > 0;
  for (Fmt f : {Fmt::kBF16, Fmt::kFp8E8M0}) {
    for (auto [rows, cols, n] : {std::tuple<int64_t, int64_t, int64_t>{17, 736, 9},
                                 {256, 4096, 64},
                                 {129, 1024, 1},
                                 {300, 256, 130}}) {
      for (int mode = 0; mode < 3; ++mode) {  // tile, tile split-K, wgmma (BF16 weights)
        if (mode == 2 && (f != Fmt::kBF16 || n < kBf16Sm90MinRows || !wgmma_built))
          continue;
        LinearCase c{f, rows, cols, n, false};
        c.bf16x2 = true;
        c.hi_only = true;
        c.split_k = mode == 1 && n < 128;
        c.wgmma = mode == 2;
        c.accumulate = (seed & 4) != 0;
        run_linear(c, seed += 3);
      }
    }
  }
}

// The many-row BF16 wgmma path (bf16_gemm_sm90.h, builds with CUTLASS): tails of the 128-row
// tiles, row ranges, padded outputs, accumulation, and the V4-Flash router / compressor / wo_a
// (BF16 copy) shapes at prefill sizes.
TEST_F(GpuTest, Bf16x2WgmmaLinearMatchesCpu) {
  {
    if (fp8_linear_scratch_floats(MatrixRef{.format = WeightFormat::kFp8Block128,
                                            .dtype = DType::kF8E4M3,
                                            .rows = 128,
                                            .cols = 128},
                                  -1,
                                  kFp8Sm90MinRows) == 0)
      GTEST_SKIP() << "built without CUTLASS: no wgmma path";
  }
  uint32_t seed = 53000;
  const bool small = small_mode();
  for (int64_t rows : {8, 132, 256}) {
    for (int64_t cols : {64, 136, 1024}) {
      for (int64_t n : {128, 129, 300}) {
        if (small && rows * n * cols > 20'000'000)
          continue;
        LinearCase c{Fmt::kBF16, rows, cols, n, false};
        c.bf16x2 = true;
        c.wgmma = true;
        run_linear(c, seed += 3);
      }
    }
  }
  LinearCase ranged{Fmt::kBF16, 512, 256, 200, false, 96, 192, 64, 4, true};
  ranged.bf16x2 = true;
  ranged.wgmma = true;
  run_linear(ranged, seed += 3);
  // An LM-head-sized weight takes the path from kBf16Sm90WideMinRows rows.
  LinearCase wide{Fmt::kBF16, kBf16Sm90WideMinWeightRows + 40, 128, kBf16Sm90WideMinRows, false};
  wide.bf16x2 = true;
  wide.wgmma = true;
  run_linear(wide, seed += 3);
  if (!small) {
    for (auto [rows, cols, n] :
         {std::tuple<int64_t, int64_t, int64_t>{256, 4096, 1000}, {1024, 4096, 300}}) {
      LinearCase c{Fmt::kBF16, rows, cols, n, false};
      c.bf16x2 = true;
      c.wgmma = true;
      run_linear(c, seed += 3);
    }
  }
}

// Grouped BF16x2 linear (wo_a's layout: group g = weight rows [g * rows, +rows), x columns
// [g * k, +k), y columns [g * rows, +rows)) in one launch equals one launch per group, bit for bit.
TEST_F(GpuTest, Bf16x2GroupedLinearEqualsPerGroupLaunches) {
  for (int64_t n : {1, 9, 40, 130, 260}) {
    // FP8 weights: the fixed-order kernel; BF16 at n >= 128: the wgmma path (per-group GEMMs).
    const Fmt fmt = n >= 130 ? Fmt::kBF16 : Fmt::kFp8E8M0;
    const int64_t groups = 3, rows = 96, k = 128;
    auto w = make_weight(fmt, groups * rows, k, 777 + static_cast<uint32_t>(n));
    std::vector<float> x = normal_floats(static_cast<size_t>(n * groups * k), 99);
    DevVec<float> d_x(x);
    const int64_t ld = groups * k;
    DevVec<uint16_t> d_hi(static_cast<size_t>(n * ld)), d_lo(static_cast<size_t>(n * ld));
    DSI_EXPECT_OK(launch_split_bf16(
        SplitBf16Params{.x = d_x.get(), .n = n, .k = ld, .hi = d_hi.get(), .lo = d_lo.get()},
        nullptr));
    DevVec<float> d_all(static_cast<size_t>(n * groups * rows), 0.0f);
    DevVec<float> d_one(static_cast<size_t>(n * groups * rows), 0.0f);
    DSI_EXPECT_OK(launch_bf16x2_linear(Bf16x2LinearParams{.w = w->dev,
                                                          .rows = rows,
                                                          .x = {d_hi.get(), d_lo.get(), ld},
                                                          .n = n,
                                                          .y = d_all.get(),
                                                          .ldy = groups * rows,
                                                          .groups = groups,
                                                          .group_x = k,
                                                          .group_y = rows},
                                       nullptr));
    for (int64_t g = 0; g < groups; ++g) {
      DSI_EXPECT_OK(
          launch_bf16x2_linear(Bf16x2LinearParams{.w = w->dev,
                                                  .row_begin = g * rows,
                                                  .rows = rows,
                                                  .x = {d_hi.get() + g * k, d_lo.get() + g * k, ld},
                                                  .n = n,
                                                  .y = d_one.get() + g * rows,
                                                  .ldy = groups * rows},
                               nullptr));
    }
    sync();
    EXPECT_EQ(d_all.download(), d_one.download()) << "n " << n;
  }
}

// The wgmma path's paired halves (bf16_gemm_sm90.h: hi and lo's rows as one GEMM, then an add)
// equal its two passes bit for bit, with and without accumulation, one group and several (one
// batched launch), at the decode batch sizes that take it (16..64 rows: 2n fits one tile).
TEST_F(GpuTest, Bf16x2WgmmaPairedHalvesEqualTwoPasses) {
  for (int64_t groups : {1, 4}) {
    for (int64_t n : {kBf16Sm90WideMinRows, int64_t{40}, int64_t{64}}) {
      for (bool acc : {false, true}) {
        SCOPED_TRACE("groups " + std::to_string(groups) + " n " + std::to_string(n) +
                     (acc ? " acc" : ""));
        const int64_t rows = kBf16Sm90WideMinWeightRows / groups + 4 * groups, k = 192;
        auto w = make_weight(Fmt::kBF16, groups * rows, k, 4242 + static_cast<uint32_t>(n));
        const int64_t ldx = groups * k;
        const std::vector<float> x = normal_floats(static_cast<size_t>(n * ldx), 17);
        DevVec<float> d_x(x);
        const int64_t ld = bf16_split_ld(ldx);
        DevVec<uint16_t> d_halves(static_cast<size_t>(2 * n * ld));
        uint16_t* hi = d_halves.get();
        uint16_t* lo = hi + n * ld;  // adjacent, as split_bf16 allocates them
        DSI_EXPECT_OK(launch_split_bf16(
            SplitBf16Params{.x = d_x.get(), .n = n, .k = ldx, .hi = hi, .lo = lo}, nullptr));
        const std::vector<float> y0 = normal_floats(static_cast<size_t>(n * groups * rows), 18);
        DevVec<float> d_two(y0), d_paired(y0);
        Bf16x2LinearParams p{.w = w->dev,
                             .rows = rows,
                             .x = {hi, lo, ld},
                             .n = n,
                             .y = d_two.get(),
                             .ldy = groups * rows,
                             .accumulate = acc,
                             .groups = groups,
                             .group_x = k,
                             .group_y = rows};
        ASSERT_TRUE(bf16x2_linear_uses_wgmma(p)) << "the wgmma path does not run";
        DSI_EXPECT_OK(launch_bf16x2_linear(p, nullptr));  // no scratch: two passes
        const int64_t floats = bf16x2_linear_scratch_floats(w->dev, rows, n, groups);
        ASSERT_GE(floats, 2 * n * rows * groups) << "no room for the paired halves";
        DevVec<float> d_scratch(static_cast<size_t>(floats));
        p.y = d_paired.get();
        p.scratch = d_scratch.get();
        p.scratch_floats = floats;
        DSI_EXPECT_OK(launch_bf16x2_linear(p, nullptr));
        sync();
        const std::vector<float> two = d_two.download(), paired = d_paired.download();
        ASSERT_EQ(two.size(), paired.size());
        EXPECT_EQ(0, std::memcmp(two.data(), paired.data(), two.size() * sizeof(float)));
        EXPECT_NE(two, y0);
      }
    }
  }
}

// The few-token BF16 GEMV (gemv.h) against the CPU with the reference tolerance, and batch
// invariance: token t's outputs are the same bits in a batch of 1 and in a batch of 8.
TEST_F(GpuTest, GemvBf16MatchesCpuAndIsBatchInvariant) {
  uint32_t seed = 61000;
  for (int64_t rows : {1, 5, 33, 1000}) {
    for (int64_t cols : {8, 64, 4096}) {
      for (int64_t n : {1, 2, 3, 5, 8}) {
        for (bool acc : {false, true}) {
          SCOPED_TRACE("gemv " + std::to_string(rows) + "x" + std::to_string(cols) + " n " +
                       std::to_string(n) + (acc ? " acc" : ""));
          auto w = make_weight(Fmt::kBF16, rows, cols, seed += 3);
          const std::vector<float> x = normal_floats(static_cast<size_t>(n * cols), seed + 1);
          const std::vector<float> y0 = normal_floats(static_cast<size_t>(n * rows), seed + 2);
          std::vector<float> yc(static_cast<size_t>(n * rows));
          cpu::linear_rows(w->host, 0, rows, x.data(), n, yc.data(), false);
          std::vector<float> want(yc.size());
          std::vector<double> tol(yc.size());
          std::vector<float> wrow(static_cast<size_t>(cols));
          for (int64_t r = 0; r < rows; ++r) {
            w->host.dequant_row(r, wrow.data());
            for (int64_t t = 0; t < n; ++t) {
              double mag = 0.0;
              for (int64_t k = 0; k < cols; ++k) mag += std::fabs(wrow[k] * x[t * cols + k]);
              const size_t i = static_cast<size_t>(t * rows + r);
              want[i] = acc ? y0[i] + yc[i] : yc[i];
              tol[i] = 1e-5 * mag + (acc ? 1.2e-7 * std::fabs(want[i]) : 0.0) + 1e-35;
            }
          }
          DevVec<float> d_x(x), d_y(y0);
          DSI_EXPECT_OK(launch_gemv_bf16(
              GemvParams{.w = w->dev, .x = d_x.get(), .n = n, .y = d_y.get(), .accumulate = acc},
              nullptr));
          sync();
          const std::vector<float> got = d_y.download();
          expect_within(want, got, tol, "gemv");
          if (!acc && n > 1) {  // the last token alone gives the same bits
            DevVec<float> d_x1(std::vector<float>(x.end() - cols, x.end()));
            DevVec<float> d_y1(static_cast<size_t>(rows), 0.0f);
            DSI_EXPECT_OK(launch_gemv_bf16(
                GemvParams{.w = w->dev, .x = d_x1.get(), .n = 1, .y = d_y1.get()}, nullptr));
            sync();
            EXPECT_EQ(d_y1.download(), std::vector<float>(got.end() - rows, got.end()));
          }
        }
      }
    }
  }
}

// The W8A8 GEMV (gemv.h: launch_fp8_gemv, called directly: launch_fp8_linear's path for n <= 8
// where the decode-sized kernel does not take them, fp8_gemm_decode_takes) against the CPU:
// both scale formats, one to eight tokens, row groups that straddle nothing, K split over
// blocks (small weights) or not (tall ones), row ranges, padded outputs, accumulation, and the
// V4-Flash decode shapes; then batch invariance: each token alone gives the same bits.
TEST_F(GpuTest, Fp8GemvLinearMatchesCpuAndIsBatchInvariant) {
  uint32_t seed = 54000;
  for (Fmt f : {Fmt::kFp8E8M0, Fmt::kFp8F32}) {
    for (int64_t rows : {8, 136, 1024}) {
      for (int64_t cols : {128, 384, 4096}) {
        for (int64_t n : {1, 2, 3, 5, 8}) {
          LinearCase c{f, rows, cols, n, true};
          c.tensor_core = true;
          c.wgmma = true;
          c.gemv = true;
          run_linear(c, seed += 3);
        }
      }
    }
    LinearCase ranged{f, 512, 256, 6, true, 128, 256, 0, 3, true};
    ranged.tensor_core = true;
    ranged.wgmma = true;
    ranged.gemv = true;
    run_linear(ranged, seed += 3);
    // Tall weights with one K block per warp: blocks of 4 row groups, the last block partly past
    // the rows.
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{16904, 128}, {16920, 384}}) {
      for (int64_t n : {1, 3, 8}) {
        LinearCase c{f, rows, cols, n, true};
        c.tensor_core = true;
        c.wgmma = true;
        c.gemv = true;
        run_linear(c, seed += 3);
      }
    }
  }
  if (!small_mode()) {
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{1024, 4096}, {512, 4096}, {32768, 1024}, {4096, 8192}}) {
      LinearCase c{Fmt::kFp8E8M0, rows, cols, 1, true};
      c.tensor_core = true;
      c.wgmma = true;
      c.gemv = true;
      run_linear(c, seed += 3);
    }
  }
  // Batch invariance: 8 tokens at once, then each alone.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{512, 4096}, {136, 384}, {16920, 384}}) {
    auto w = make_weight(Fmt::kFp8E8M0, rows, cols, seed += 3);
    const int64_t n = 8, ld = fp8_acts_ld(cols);
    const std::vector<float> x = normal_floats(static_cast<size_t>(n * cols), seed + 1);
    DevVec<float> d_x(x);
    DevVec<uint8_t> d_q(static_cast<size_t>(n * ld));
    DevVec<float> d_s(static_cast<size_t>(n * ld / 128));
    DSI_EXPECT_OK(launch_quantize_fp8(
        QuantizeFp8Params{
            .x = d_x.get(), .n = n, .k = cols, .codes = d_q.get(), .scales = d_s.get()},
        nullptr));
    const int64_t sf = fp8_gemv_scratch_floats(rows, cols, n);
    DevVec<float> d_scratch(static_cast<size_t>(std::max<int64_t>(sf, 1)));
    DevVec<float> d_all(static_cast<size_t>(n * rows), 0.0f);
    DSI_EXPECT_OK(launch_fp8_gemv(Fp8GemvParams{.w = w->dev,
                                                .x_codes = d_q.get(),
                                                .x_scales = d_s.get(),
                                                .x_ld = ld,
                                                .n = n,
                                                .y = d_all.get(),
                                                .scratch = d_scratch.get(),
                                                .scratch_floats = sf},
                                  nullptr));
    sync();
    const std::vector<float> all = d_all.download();
    for (int64_t t = 0; t < n; ++t) {
      DevVec<float> d_one(static_cast<size_t>(rows), 0.0f);
      DSI_EXPECT_OK(launch_fp8_gemv(Fp8GemvParams{.w = w->dev,
                                                  .x_codes = d_q.get() + t * ld,
                                                  .x_scales = d_s.get() + t * ld / 128,
                                                  .x_ld = ld,
                                                  .n = 1,
                                                  .y = d_one.get(),
                                                  .scratch = d_scratch.get(),
                                                  .scratch_floats = sf},
                                    nullptr));
      sync();
      EXPECT_EQ(d_one.download(),
                std::vector<float>(all.begin() + t * rows, all.begin() + (t + 1) * rows))
          << "token " << t << " of " << rows << "x" << cols;
    }
  }
}

// The FP8-weight fp32 GEMV (gemv.h: launch_gemv_fp8, wo_a at decode) against the CPU, one group
// and wo_a's grouped layout, with the reference tolerance.
TEST_F(GpuTest, GemvFp8MatchesCpu) {
  uint32_t seed = 55000;
  for (Fmt f : {Fmt::kFp8E8M0, Fmt::kFp8F32}) {
    for (auto [groups, rows, cols] : {std::tuple<int64_t, int64_t, int64_t>{1, 5, 128},
                                      {1, 300, 1024},
                                      {3, 96, 256},
                                      {8, 128, 512}}) {
      for (int64_t n : {1, 2, 3, 6, 8}) {  // rows % 4 == 0: x shared by the warp's rows
        for (bool acc : {false, true}) {
          SCOPED_TRACE("gemv_fp8 groups " + std::to_string(groups) + " " + std::to_string(rows) +
                       "x" + std::to_string(cols) + " n " + std::to_string(n) +
                       (acc ? " acc" : ""));
          auto w = make_weight(f, groups * rows, cols, seed += 3);
          const int64_t ldx = groups * cols + 4;
          const int64_t ldy = groups * rows + 2;
          const std::vector<float> x = normal_floats(static_cast<size_t>(n * ldx), seed + 1);
          const std::vector<float> y0 = normal_floats(static_cast<size_t>(n * ldy), seed + 2);
          std::vector<float> want = y0;
          std::vector<double> tol(want.size(), 0.0);
          std::vector<float> wrow(static_cast<size_t>(cols));
          for (int64_t g = 0; g < groups; ++g) {
            for (int64_t r = 0; r < rows; ++r) {
              w->host.dequant_row(g * rows + r, wrow.data());
              for (int64_t t = 0; t < n; ++t) {
                double sum = 0.0, mag = 0.0;
                for (int64_t k = 0; k < cols; ++k) {
                  const double pr = static_cast<double>(wrow[k]) * x[t * ldx + g * cols + k];
                  sum += pr;
                  mag += std::fabs(pr);
                }
                const size_t i = static_cast<size_t>(t * ldy + g * rows + r);
                want[i] = static_cast<float>(acc ? y0[i] + sum : sum);
                tol[i] = 1e-5 * mag + (acc ? 1.2e-7 * std::fabs(want[i]) : 0.0) + 1e-35;
              }
            }
          }
          DevVec<float> d_x(x), d_y(y0);
          DSI_EXPECT_OK(launch_gemv_fp8(GemvFp8Params{.w = w->dev,
                                                      .rows = rows,
                                                      .x = d_x.get(),
                                                      .ldx = ldx,
                                                      .n = n,
                                                      .y = d_y.get(),
                                                      .ldy = ldy,
                                                      .accumulate = acc,
                                                      .groups = groups,
                                                      .group_x = cols,
                                                      .group_y = rows},
                                        nullptr));
          sync();
          expect_within(want, d_y.download(), tol, "gemv_fp8");
        }
      }
    }
  }
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
  // The decode-sized FP8 path called directly: row counts outside [1, 64], a row range past the
  // weight, activation rows shorter than K, a weight that is not FP8 block-128 with K % 128 == 0.
  static const uint8_t codes[256] = {};
  static const float scales[2] = {};
  MatrixRef f;
  f.format = WeightFormat::kFp8Block128;
  f.dtype = DType::kF8E4M3;
  f.rows = 64;
  f.cols = 256;
  f.data = codes;
  f.scale = scales;
  const Fp8Acts x{codes, scales, 256};
  for (int64_t n : {0, 65}) {
    EXPECT_EQ(
        launch_fp8_gemm_decode(Fp8LinearParams{.w = f, .rows = 64, .x = x, .n = n}, nullptr).code(),
        StatusCode::kInvalidArgument)
        << n;
  }
  EXPECT_EQ(launch_fp8_gemm_decode(
                Fp8LinearParams{.w = f, .row_begin = 32, .rows = 64, .x = x, .n = 16}, nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      launch_fp8_gemm_decode(
          Fp8LinearParams{.w = f, .rows = 64, .x = Fp8Acts{codes, scales, 128}, .n = 16}, nullptr)
          .code(),
      StatusCode::kInvalidArgument);
  f.cols = 200;
  EXPECT_EQ(
      launch_fp8_gemm_decode(Fp8LinearParams{.w = f, .rows = 64, .x = x, .n = 16}, nullptr).code(),
      StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsinfer::cuda::test
