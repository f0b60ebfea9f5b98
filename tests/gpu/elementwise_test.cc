// Row ops against the CPU reference: embedding gather (every weight format, hc copies, bad ids),
// RMSNorm (weighted / unweighted / in place), RoPE (both tables' shapes, heads, strides, inverse,
// positions up to 2^20), and the FP8/FP4 simulations with and without Hadamard (bit-exact).
//
// Tolerances. Embedding and the quantisation simulations are bit-exact (same DSI_HD conversions,
// same IEEE operations). RMSNorm differs only in the order of the double sum of squares: equal
// up to 1 ulp of the fp32 result (2^-23 relative). RoPE: CUDA's sinf/cosf are within 2 ulp of
// glibc's, so each rotated value is within ~4 ulp of |a| + |b| (bound 2e-6 relative to the pair's
// magnitude).
#include "kernels/cuda/elementwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/fp8_gemm.h"
#include "numeric/float_formats.h"
#include "numeric/quant.h"
#include "test_util.h"

namespace dsinfer::cuda::test {
namespace {

const int64_t kRows[] = {1, 3, 7, 129};
const int64_t kDims[] = {1, 3, 7, 129, 257, 733};

bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return (std::isnan(a) && std::isnan(b)) || x == y;
}

void expect_bits(const std::vector<float>& want,
                 const std::vector<float>& got,
                 const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!same_bits(want[i], got[i]) && bad++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: cpu " << want[i] << " gpu " << got[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

// ---- embedding ---------------------------------------------------------------------------------

TEST_F(GpuTest, EmbedMatchesDequantRow) {
  uint32_t seed = 1;
  for (Fmt f : {Fmt::kF32, Fmt::kBF16, Fmt::kF16, Fmt::kFp8E8M0, Fmt::kFp8F32, Fmt::kMxfp4}) {
    for (int64_t cols : {32, 96, 160, 736}) {
      const int64_t vocab = 300;
      auto w = make_weight(f, vocab, cols, seed++);
      for (int64_t n : {0, 1, 3, 7, 129}) {
        for (int64_t copies : {1, 4}) {
          SCOPED_TRACE(std::string(fmt_name(f)) + " cols " + std::to_string(cols) + " n " +
                       std::to_string(n) + " copies " + std::to_string(copies));
          std::vector<int32_t> tokens(static_cast<size_t>(n));
          for (int64_t t = 0; t < n; ++t) tokens[t] = static_cast<int32_t>((t * 131 + 7) % vocab);
          if (n >= 3) {
            tokens[1] = -1;  // invalid ids give NaN rows, no out-of-bounds read
            tokens[2] = static_cast<int32_t>(vocab);
          }
          DevVec<int32_t> d_tok(tokens);
          DevVec<float> d_out(static_cast<size_t>(n * copies * cols) + 1, 7.0f);
          DSI_EXPECT_OK(launch_embed(EmbedParams{.table = w->dev,
                                                 .tokens = d_tok.get(),
                                                 .n = n,
                                                 .copies = copies,
                                                 .out = d_out.get()},
                                     nullptr));
          sync();
          const std::vector<float> got = d_out.download();
          std::vector<float> want(static_cast<size_t>(n * copies * cols));
          std::vector<float> row(static_cast<size_t>(cols));
          for (int64_t t = 0; t < n; ++t) {
            const bool valid = tokens[t] >= 0 && tokens[t] < vocab;
            if (valid)
              w->host.dequant_row(tokens[t], row.data());
            for (int64_t j = 0; j < copies; ++j) {
              for (int64_t c = 0; c < cols; ++c) {
                want[(t * copies + j) * cols + c] = valid ? row[c] : NAN;
              }
            }
          }
          expect_bits(want, got, "embed");
          EXPECT_EQ(got.back(), 7.0f) << "write past the end";
        }
      }
    }
  }
}

// ---- RMSNorm -----------------------------------------------------------------------------------

TEST_F(GpuTest, RmsNormMatchesCpu) {
  uint32_t seed = 100;
  for (int64_t rows : {0, 1, 3, 7, 129}) {
    for (int64_t dim : {1, 3, 7, 129, 257, 733, 4096}) {
      for (int mode = 0; mode < 3; ++mode) {  // 0 weighted, 1 unweighted, 2 weighted in place
        SCOPED_TRACE("rms " + std::to_string(rows) + "x" + std::to_string(dim) + " mode " +
                     std::to_string(mode));
        std::vector<float> x = normal_floats(static_cast<size_t>(rows * dim), seed++, 3.0f);
        if (rows > 2)
          std::fill(x.begin() + dim, x.begin() + 2 * dim, 0.0f);  // an all-zero row: eps only
        const std::vector<float> w = normal_floats(static_cast<size_t>(dim), seed++);
        std::vector<float> want(x.size());
        cpu::rms_norm(x.data(), rows, dim, mode == 1 ? nullptr : w.data(), 1e-6f, want.data());
        DevVec<float> d_x(x);
        DevVec<float> d_w(w);
        DevVec<float> d_out(x.size());
        float* out = mode == 2 ? d_x.get() : d_out.get();
        DSI_EXPECT_OK(launch_rms_norm(RmsNormParams{.x = d_x.get(),
                                                    .rows = rows,
                                                    .dim = dim,
                                                    .weight = mode == 1 ? nullptr : d_w.get(),
                                                    .eps = 1e-6f,
                                                    .out = out},
                                      nullptr));
        sync();
        expect_rel(want, mode == 2 ? d_x.download() : d_out.download(), 2.4e-7, 1e-30, "rms");
      }
    }
  }
}

// RMSNorm that also writes the FP8 activations of its output (RmsNormParams::act_codes, a norm
// feeding an FP8 linear): the fp32 rows are the plain norm's bit for bit, and the codes and scales
// are numeric::fp8_block_quantize of those rows bit for bit (written by the one-warp-per-row
// kernel at 128 and 256 dims, by the quantisation pass after the norm elsewhere). Half-set
// outputs are refused.
TEST_F(GpuTest, RmsNormWritesTheFp8ActivationsOfItsOutput) {
  uint32_t seed = 13000;
  for (int64_t rows : {1, 3, 70}) {
    for (int64_t dim : {128, 256, 1024, 200, 4096}) {
      SCOPED_TRACE("rms fp8 " + std::to_string(rows) + "x" + std::to_string(dim));
      std::vector<float> x = normal_floats(static_cast<size_t>(rows * dim), seed++, 3.0f);
      for (int64_t r = 0; r < rows; ++r) {  // rows of very different magnitude, one all zero
        for (int64_t c = 0; c < dim; ++c) {
          float& v = x[r * dim + c];
          v = r % 7 == 2 ? 0.0f : std::ldexp(v, static_cast<int>(r % 5) * 9 - 20);
        }
      }
      const std::vector<float> w = normal_floats(static_cast<size_t>(dim), seed++);
      const int64_t ld = fp8_acts_ld(dim);
      DevVec<float> d_x(x), d_w(w), d_plain(x.size()), d_out(x.size());
      DevVec<uint8_t> d_codes(static_cast<size_t>(rows * ld));
      DevVec<float> d_scales(static_cast<size_t>(rows * ld / 128));
      const RmsNormParams base{
          .x = d_x.get(), .rows = rows, .dim = dim, .weight = d_w.get(), .eps = 1e-6f};
      RmsNormParams plain = base;
      plain.out = d_plain.get();
      DSI_EXPECT_OK(launch_rms_norm(plain, nullptr));
      RmsNormParams fused = base;
      fused.out = d_out.get();
      fused.act_codes = d_codes.get();
      fused.act_scales = d_scales.get();
      DSI_EXPECT_OK(launch_rms_norm(fused, nullptr));
      sync();
      const std::vector<float> out = d_out.download();
      const std::vector<float> want_out = d_plain.download();
      int64_t differ = 0;
      for (size_t i = 0; i < out.size(); ++i) differ += same_bits(out[i], want_out[i]) ? 0 : 1;
      EXPECT_EQ(differ, 0) << "fp32 rows differ from the plain norm's";
      std::vector<uint8_t> want_codes(static_cast<size_t>(rows * ld), 0);
      std::vector<float> want_scales(static_cast<size_t>(rows * ld / 128), 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<uint8_t> sb(static_cast<size_t>(ld / 128));
        numeric::fp8_block_quantize(
            out.data() + r * dim, dim, 128, want_codes.data() + r * ld, sb.data());
        for (int64_t b = 0; b < ld / 128; ++b)
          want_scales[r * (ld / 128) + b] = numeric::e8m0_to_f32(sb[b]);
      }
      EXPECT_EQ(d_codes.download(), want_codes);
      EXPECT_EQ(d_scales.download(), want_scales);
    }
  }
  float dummy[4] = {};
  uint8_t codes[4] = {};
  EXPECT_EQ(
      launch_rms_norm(
          RmsNormParams{.x = dummy, .rows = 1, .dim = 4, .out = dummy, .act_codes = codes}, nullptr)
          .code(),
      StatusCode::kInvalidArgument);
}

// Few rows (decode) take the split kernel, one block per row with a warp per 128 columns; many
// rows the one-warp-per-row kernel. The same rows through both give the same bits in every
// output the norm writes: fp32 rows (weighted or not, with RoPE), BF16 rows, record-rounded rows
// and FP8 activations (in the split kernel at every width; after the many-row norm by the
// quantisation pass at 512 and 1024 dims).
TEST_F(GpuTest, RmsNormSplitKernelEqualsOneWarpPerRow) {
  uint32_t seed = 900;
  const int64_t many = 600;  // > the split kernel's row limit
  for (int64_t dim : {256, 512, 1024}) {
    for (int mode = 0; mode < 5; ++mode) {  // 0 plain, 1 RoPE, 2 RoPE + BF16, 3 records, 4 FP8
      SCOPED_TRACE("dim " + std::to_string(dim) + " mode " + std::to_string(mode));
      const int64_t half = mode == 0 || mode == 4 ? 0 : 32;
      const int64_t heads = 4;
      const std::vector<float> x = normal_floats(static_cast<size_t>(many * dim), seed++, 3.0f);
      const std::vector<float> w = normal_floats(static_cast<size_t>(dim), seed++);
      std::vector<int64_t> pos(static_cast<size_t>(many / heads));
      for (size_t t = 0; t < pos.size(); ++t) pos[t] = static_cast<int64_t>(t * 7919 % 100000);
      std::vector<float> inv(static_cast<size_t>(std::max<int64_t>(half, 1)));
      for (int64_t i = 0; i < half; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / (2.0f * half));
      DevVec<float> d_w(w);
      DevVec<int64_t> d_pos(pos);
      DevVec<float> d_inv(inv);
      struct Out {
        std::vector<float> f;
        std::vector<uint16_t> b;
        std::vector<uint8_t> codes;
        std::vector<float> scales;
      };
      auto run = [&](int64_t rows) -> Out {
        DevVec<float> d_x(x);
        DevVec<float> d_out(static_cast<size_t>(rows * dim));
        DevVec<uint16_t> d_b(static_cast<size_t>(rows * dim));
        DevVec<uint8_t> d_codes(static_cast<size_t>(rows * dim));
        DevVec<float> d_scales(static_cast<size_t>(rows * dim / 128));
        RmsNormParams p{
            .x = d_x.get(), .rows = rows, .dim = dim, .weight = d_w.get(), .eps = 1e-6f};
        p.out = d_out.get();
        if (half > 0) {
          p.rope_positions = d_pos.get();
          p.rope_inv_freq = d_inv.get();
          p.rope_half = half;
          p.rope_rows_per_token = heads;
        }
        if (mode == 2) {
          p.out = nullptr;
          p.out_bf16 = d_b.get();
        }
        if (mode == 3)
          p.store_fp8_block = 64;
        if (mode == 4) {
          p.act_codes = d_codes.get();
          p.act_scales = d_scales.get();
        }
        DSI_EXPECT_OK_CONTINUE(launch_rms_norm(p, nullptr));
        sync();
        Out o;
        if (mode == 2) {
          o.b = d_b.download();
        } else {
          o.f = d_out.download();
        }
        if (mode == 4) {
          o.codes = d_codes.download();
          o.scales = d_scales.download();
        }
        return o;
      };
      const Out all = run(many);
      // (With RoPE, whole tokens of `heads` rows.)
      for (int64_t rows :
           half > 0 ? std::vector<int64_t>{4, 8, 64} : std::vector<int64_t>{1, 5, 64}) {
        SCOPED_TRACE("rows " + std::to_string(rows));
        const Out few = run(rows);
        const size_t n = static_cast<size_t>(rows * dim);
        if (mode == 2) {
          EXPECT_TRUE(std::equal(few.b.begin(), few.b.end(), all.b.begin()));
        } else {
          expect_bits(std::vector<float>(all.f.begin(), all.f.begin() + n), few.f, "rows");
        }
        if (mode == 4) {
          EXPECT_TRUE(std::equal(few.codes.begin(), few.codes.end(), all.codes.begin()));
          expect_bits(std::vector<float>(all.scales.begin(), all.scales.begin() + n / 128),
                      few.scales,
                      "scales");
        }
      }
    }
  }
}

// RMSNorm with the RoPE of the last 2 * half dims in the same launch (q: rows_per_token heads;
// the one-warp-per-row kernel at 128..1024 dims, the two-kernel fallback otherwise) against
// cpu::rms_norm then cpu::rope_apply.
TEST_F(GpuTest, RmsNormWithRopeMatchesCpu) {
  uint32_t seed = 150;
  for (int64_t tokens : {1, 3, 33}) {
    for (auto [dim, half, heads] : {std::tuple<int64_t, int64_t, int64_t>{512, 32, 8},
                                    {512, 32, 1},
                                    {128, 32, 3},
                                    {1024, 0, 2},
                                    {256, 64, 2},
                                    {129, 3, 2}}) {
      for (bool weighted : {false, true}) {
        SCOPED_TRACE("rms+rope t" + std::to_string(tokens) + " dim " + std::to_string(dim) +
                     " half " + std::to_string(half) + " heads " + std::to_string(heads) +
                     (weighted ? " weighted" : ""));
        const int64_t rows = tokens * heads;
        const std::vector<float> x = normal_floats(static_cast<size_t>(rows * dim), seed++, 3.0f);
        const std::vector<float> w = normal_floats(static_cast<size_t>(dim), seed++);
        std::vector<int64_t> pos(static_cast<size_t>(tokens));
        for (int64_t t = 0; t < tokens; ++t) pos[t] = (t * 7919 + seed) % 100000;
        std::vector<float> inv(static_cast<size_t>(std::max<int64_t>(half, 1)));
        for (int64_t i = 0; i < half; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / (2.0f * half));
        std::vector<float> want(x.size());
        cpu::rms_norm(x.data(), rows, dim, weighted ? w.data() : nullptr, 1e-6f, want.data());
        if (half > 0) {
          for (int64_t r = 0; r < rows; ++r)
            cpu::rope_apply(want.data() + r * dim, dim, inv, pos[r / heads], false);
        }
        DevVec<float> d_x(x), d_w(w), d_inv(inv);
        DevVec<int64_t> d_pos(pos);
        DSI_EXPECT_OK(launch_rms_norm(RmsNormParams{.x = d_x.get(),
                                                    .rows = rows,
                                                    .dim = dim,
                                                    .weight = weighted ? d_w.get() : nullptr,
                                                    .eps = 1e-6f,
                                                    .out = d_x.get(),
                                                    .rope_positions = d_pos.get(),
                                                    .rope_inv_freq = d_inv.get(),
                                                    .rope_half = half,
                                                    .rope_rows_per_token = heads},
                                      nullptr));
        sync();
        // The norm as RmsNormMatchesCpu; a rotated pair within 2e-6 of its two inputs' size.
        const std::vector<float> got = d_x.download();
        std::vector<double> tol(want.size());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < dim; ++c) {
            const size_t i = static_cast<size_t>(r * dim + c);
            const int64_t pc = c - (dim - 2 * half);
            if (half > 0 && pc >= 0) {
              const size_t p0 =
                  static_cast<size_t>(r * dim + (dim - 2 * half) + (pc & ~int64_t{1}));
              tol[i] = 2e-6 * (std::fabs(want[p0]) + std::fabs(want[p0 + 1])) + 1e-30;
            } else {
              tol[i] = 2.4e-7 * std::fabs(want[i]) + 1e-30;
            }
          }
        }
        expect_within(want, got, tol, "rms+rope");
        if (rms_norm_writes_bf16(dim, half)) {  // BF16 output: the RNE of those same rows
          DevVec<float> d_x2(x);
          DevVec<uint16_t> d_b(static_cast<size_t>(rows * dim) + 1, 0x7777);
          DSI_EXPECT_OK(launch_rms_norm(RmsNormParams{.x = d_x2.get(),
                                                      .rows = rows,
                                                      .dim = dim,
                                                      .weight = weighted ? d_w.get() : nullptr,
                                                      .eps = 1e-6f,
                                                      .rope_positions = d_pos.get(),
                                                      .rope_inv_freq = d_inv.get(),
                                                      .rope_half = half,
                                                      .rope_rows_per_token = heads,
                                                      .out_bf16 = d_b.get()},
                                        nullptr));
          sync();
          const std::vector<uint16_t> bits = d_b.download();
          int64_t bad = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            const float r = numeric::round_to_bf16(got[i]);
            uint32_t u;
            std::memcpy(&u, &r, 4);
            if (bits[i] != static_cast<uint16_t>(u >> 16) && bad++ < 5)
              ADD_FAILURE() << "bf16 row value " << i << ": " << bits[i] << " vs " << (u >> 16);
          }
          EXPECT_EQ(bad, 0);
          EXPECT_EQ(bits.back(), 0x7777) << "write past the end";
          EXPECT_EQ(d_x2.download(), x) << "the input was modified";
        }
        // The record rounding (store_fp8_block): exactly fp8_block_simulate over the no-RoPE
        // dims and bf16_simulate over the RoPE dims of the rows above, fused into the norm
        // kernel where rms_norm_stores_records and as passes of their own elsewhere (48: not a
        // power-of-two lane count; 129: the block-per-row kernel).
        for (int64_t block : {int64_t{64}, int64_t{32}, int64_t{48}}) {
          const int64_t nope = dim - 2 * half;
          if (nope % block != 0 && block != 48)
            continue;
          SCOPED_TRACE("record rounding, block " + std::to_string(block) +
                       (rms_norm_stores_records(dim, half, block) ? " fused" : " separate"));
          std::vector<float> rec = got;
          for (int64_t r = 0; r < rows; ++r) {
            numeric::fp8_block_simulate(rec.data() + r * dim, nope, block);
            numeric::bf16_simulate(rec.data() + r * dim + nope, dim - nope);
          }
          DevVec<float> d_x3(x);
          DSI_EXPECT_OK(launch_rms_norm(RmsNormParams{.x = d_x3.get(),
                                                      .rows = rows,
                                                      .dim = dim,
                                                      .weight = weighted ? d_w.get() : nullptr,
                                                      .eps = 1e-6f,
                                                      .out = d_x3.get(),
                                                      .rope_positions = d_pos.get(),
                                                      .rope_inv_freq = d_inv.get(),
                                                      .rope_half = half,
                                                      .rope_rows_per_token = heads,
                                                      .store_fp8_block = block},
                                        nullptr));
          sync();
          const std::vector<float> rgot = d_x3.download();
          int64_t bad = 0;
          for (size_t i = 0; i < rec.size(); ++i)
            if (!same_bits(rec[i], rgot[i]) && bad++ < 5)
              ADD_FAILURE() << "record value " << i << ": " << rgot[i] << " vs " << rec[i];
          EXPECT_EQ(bad, 0);
        }
      }
    }
  }
}

// ---- RoPE --------------------------------------------------------------------------------------

TEST_F(GpuTest, RopeMatchesCpu) {
  uint32_t seed = 200;
  for (int64_t tokens : {0, 1, 3, 7, 129}) {
    for (auto [dim, half, heads] : {std::tuple<int64_t, int64_t, int64_t>{512, 32, 3},
                                    {128, 32, 7},
                                    {64, 32, 1},
                                    {7, 3, 2},
                                    {129, 1, 4}}) {
      for (bool inverse : {false, true}) {
        SCOPED_TRACE("rope t" + std::to_string(tokens) + " dim " + std::to_string(dim) + " half " +
                     std::to_string(half) + (inverse ? " inverse" : ""));
        const int64_t ld = dim + 5;  // strided rows
        std::vector<float> x = normal_floats(static_cast<size_t>(tokens * heads * ld), seed++);
        std::vector<int64_t> pos(static_cast<size_t>(tokens));
        for (int64_t t = 0; t < tokens; ++t) pos[t] = (t * 7919 + seed) % (int64_t{1} << 20);
        if (tokens > 0)
          pos[0] = (int64_t{1} << 20) - 1;  // the longest context
        std::vector<float> inv(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / (2.0f * half));
        std::vector<float> want = x;
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t h = 0; h < heads; ++h) {
            cpu::rope_apply(want.data() + (t * heads + h) * ld, dim, inv, pos[t], inverse);
          }
        }
        DevVec<float> d_x(x);
        DevVec<int64_t> d_pos(pos);
        DevVec<float> d_inv(inv);
        DSI_EXPECT_OK(launch_rope(RopeParams{.x = d_x.get(),
                                             .tokens = tokens,
                                             .heads = heads,
                                             .dim = dim,
                                             .ld = ld,
                                             .positions = d_pos.get(),
                                             .inv_freq = d_inv.get(),
                                             .half = half,
                                             .inverse = inverse},
                                  nullptr));
        sync();
        const std::vector<float> got = d_x.download();
        std::vector<double> tol(x.size(), 0.0);
        for (size_t r = 0; r < x.size() / ld; ++r) {
          for (int64_t c = 0; c < ld; ++c) {
            const size_t i = r * ld + c;
            const int64_t pc = c - (dim - 2 * half);
            if (pc >= 0 && c < dim) {
              const size_t p0 = r * ld + (dim - 2 * half) + (pc & ~int64_t{1});
              tol[i] = 2e-6 * (std::fabs(x[p0]) + std::fabs(x[p0 + 1]));
            }
          }
        }
        expect_within(want, got, tol, "rope");
      }
    }
  }
}

// ---- quantisation simulations ----------------------------------------------------------------

TEST_F(GpuTest, QuantSimIsBitExact) {
  uint32_t seed = 300;
  struct Case {
    QuantSim kind;
    int64_t len;
    int64_t block;
    bool hadamard;
  };
  for (const Case& c : {Case{QuantSim::kFp8, 448, 64, false},
                        Case{QuantSim::kFp8, 733, 128, false},
                        Case{QuantSim::kFp8, 4096, 128, false},
                        Case{QuantSim::kFp8, 7, 64, false},
                        Case{QuantSim::kFp4, 128, 32, true},
                        Case{QuantSim::kFp4, 64, 32, true},
                        Case{QuantSim::kFp4, 129, 32, false},
                        Case{QuantSim::kNone, 256, 32, true},
                        Case{QuantSim::kFp4, 1, 32, true},
                        Case{QuantSim::kBf16, 64, 64, false},
                        Case{QuantSim::kBf16, 333, 64, false},
                        // The decode attention output: one long row over the whole grid.
                        Case{QuantSim::kBf16, 32768, 512, false},
                        // One warp per row (32 * {1, 2, 4, 8} values, blocks of whole lanes).
                        Case{QuantSim::kFp8, 256, 128, false},
                        Case{QuantSim::kFp8, 128, 64, true},
                        Case{QuantSim::kFp4, 32, 32, true},
                        Case{QuantSim::kFp4, 256, 32, true},
                        Case{QuantSim::kBf16, 256, 512, true}}) {
    for (int64_t rows : kRows) {
      SCOPED_TRACE("quant_sim len " + std::to_string(c.len) + " block " + std::to_string(c.block) +
                   (c.hadamard ? " hadamard" : "") + " rows " + std::to_string(rows));
      const int64_t ld = c.len + 3;
      std::vector<float> x(static_cast<size_t>(rows * ld));
      std::mt19937 rng(seed++);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (int64_t r = 0; r < rows; ++r) {
        const int k = static_cast<int>(rng() % 40) - 20;
        for (int64_t i = 0; i < ld; ++i) x[r * ld + i] = std::ldexp(nd(rng), r % 3 == 1 ? -30 : k);
      }
      std::vector<float> want = x;
      for (int64_t r = 0; r < rows; ++r) {
        float* v = want.data() + r * ld;
        if (c.hadamard)
          numeric::hadamard_transform(v, c.len);
        if (c.kind == QuantSim::kFp8)
          numeric::fp8_block_simulate(v, c.len, c.block);
        if (c.kind == QuantSim::kFp4)
          numeric::fp4_block_simulate(v, c.len, c.block);
        if (c.kind == QuantSim::kBf16)
          numeric::bf16_simulate(v, c.len);
      }
      DevVec<float> d_x(x);
      DSI_EXPECT_OK(launch_quant_sim(QuantSimParams{.x = d_x.get(),
                                                    .rows = rows,
                                                    .ld = ld,
                                                    .len = c.len,
                                                    .block = c.block,
                                                    .kind = c.kind,
                                                    .hadamard = c.hadamard},
                                     nullptr));
      sync();
      expect_bits(want, d_x.download(), "quant_sim");
    }
  }
}

// quant.cuh's FP8 simulation by the hardware conversions (cvt.rn.satfinite.e4m3 and the E4M3 ->
// FP16 decode, the scale's reciprocal instead of a division) equals numeric::'s software rounding
// for every fp32 input, at the smallest activation scale, 1, a large one and an infinite one.
TEST_F(GpuTest, Fp8HardwareRoundingEqualsSoftware) {
  for (const float s : {std::ldexp(1.0f, -22), 1.0f, std::ldexp(1.0f, 40), INFINITY}) {
    SCOPED_TRACE("scale " + std::to_string(s));
    DevVec<unsigned long long> bad(std::vector<unsigned long long>(3, 0));
    DevVec<uint32_t> first(std::vector<uint32_t>(3, 0xffffffffu));
    launch_fp8_rounding_check(s, bad.get(), first.get(), nullptr);
    sync();
    const std::vector<unsigned long long> n = bad.download();
    const std::vector<uint32_t> f = first.download();
    const char* what[3] = {"code", "decode", "scaled value"};
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(n[k], 0u) << what[k] << ": first differing input bits 0x" << std::hex << f[k];
    }
  }
}

TEST(GpuOpsArgs, RmsNormBf16OutputValidates) {
  float* some = reinterpret_cast<float*>(uintptr_t{256});
  uint16_t* bits = reinterpret_cast<uint16_t*>(uintptr_t{256});
  EXPECT_FALSE(rms_norm_writes_bf16(100, 0));
  EXPECT_FALSE(rms_norm_writes_bf16(512, 3));
  EXPECT_TRUE(rms_norm_writes_bf16(512, 32));
  EXPECT_EQ(
      launch_rms_norm(RmsNormParams{.x = some, .rows = 2, .dim = 100, .out_bf16 = bits}, nullptr)
          .code(),
      StatusCode::kInvalidArgument);
  // The record rounding (store_fp8_block): which shapes the norm kernel fuses it for, a negative
  // block refused, and BF16 output only where it is fused (the separate passes round fp32 rows).
  EXPECT_TRUE(rms_norm_stores_records(512, 32, 64));
  EXPECT_FALSE(rms_norm_stores_records(512, 32, 48));   // 12 lanes: not a power of two
  EXPECT_FALSE(rms_norm_stores_records(512, 16, 64));   // 480 no-RoPE dims: not whole blocks
  EXPECT_FALSE(rms_norm_stores_records(512, 32, 256));  // a block wider than one float4 row
  EXPECT_EQ(launch_rms_norm(
                RmsNormParams{.x = some, .rows = 2, .dim = 512, .out = some, .store_fp8_block = -1},
                nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      launch_rms_norm(
          RmsNormParams{.x = some, .rows = 2, .dim = 512, .out_bf16 = bits, .store_fp8_block = 48},
          nullptr)
          .code(),
      StatusCode::kInvalidArgument);
}

TEST(GpuOpsArgs, RowOpsValidate) {
  // Checked before any CUDA call: holds without a GPU.
  EXPECT_TRUE(launch_rms_norm(RmsNormParams{.rows = 0, .dim = 8}, nullptr).ok());
  EXPECT_EQ(launch_rms_norm(RmsNormParams{.rows = 2, .dim = 8}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(launch_rope(RopeParams{.tokens = 1, .dim = 4, .half = 3}, nullptr).code(),
            StatusCode::kInvalidArgument);
  // The fused RoPE: a slice wider than the row, rows that are not whole tokens, no positions.
  float* some = reinterpret_cast<float*>(16);
  const int64_t* pos = reinterpret_cast<const int64_t*>(16);
  EXPECT_EQ(launch_rms_norm(RmsNormParams{.x = some,
                                          .rows = 2,
                                          .dim = 8,
                                          .out = some,
                                          .rope_positions = pos,
                                          .rope_inv_freq = some,
                                          .rope_half = 5},
                            nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(launch_rms_norm(RmsNormParams{.x = some,
                                          .rows = 3,
                                          .dim = 8,
                                          .out = some,
                                          .rope_positions = pos,
                                          .rope_inv_freq = some,
                                          .rope_half = 2,
                                          .rope_rows_per_token = 2},
                            nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(launch_rms_norm(
                RmsNormParams{.x = some, .rows = 2, .dim = 8, .out = some, .rope_half = 2}, nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      launch_quant_sim(QuantSimParams{.rows = 1, .len = 48, .hadamard = true}, nullptr).code(),
      StatusCode::kInvalidArgument);
  MatrixRef bad;
  bad.format = WeightFormat::kFloat;
  bad.dtype = DType::kI32;
  EXPECT_EQ(launch_embed(EmbedParams{.table = bad, .n = 1}, nullptr).code(),
            StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace dsinfer::cuda::test
