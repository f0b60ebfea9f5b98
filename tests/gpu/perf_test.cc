// The device ceilings (src/perf): measure_ceilings with small sizes gives positive, finite,
// plausible figures; the cuBLASLt GEMM it times computes the right thing (FP8 and BF16, against a
// CPU computation, exactly on integer inputs); bad options fail before any CUDA call; without a
// device the measurement is a clear error. Tests that need a device skip themselves without one.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "perf/ceilings.h"
#include "perf/lt_gemm.h"

namespace dsinfer::perf {
namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool device_has_fp8() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    return false;
  }
  return major * 10 + minor >= 89;
}

#define DSI_ASSERT_OK(expr)                           \
  do {                                                \
    const ::dsinfer::Status dsi_st_ = (expr);         \
    ASSERT_TRUE(dsi_st_.ok()) << dsi_st_.to_string(); \
  } while (0)

class PerfGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0)
      GTEST_SKIP() << "no CUDA device";
  }
};

// Plain device buffer for the test (independent of the library's own helpers).
class Buf {
 public:
  explicit Buf(size_t bytes) : bytes_(bytes) { EXPECT_EQ(cudaMalloc(&p_, bytes), cudaSuccess); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() {
    if (p_ != nullptr)
      (void)cudaFree(p_);
  }
  void* get() const { return p_; }
  void upload(const void* host) const {
    EXPECT_EQ(cudaMemcpy(p_, host, bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void download(void* host) const {
    EXPECT_EQ(cudaMemcpy(host, p_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// E4M3 (bias 7, no infinities; 0x7F/0xFF are NaN) to float, exactly.
float e4m3_to_float(uint8_t code) {
  const int sign = code >> 7;
  const int exp = (code >> 3) & 15;
  const int man = code & 7;
  float v = 0.0f;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(man) / 8.0f, -6);
  else
    v = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return sign ? -v : v;
}

// An integer in [-15, 15] as E4M3 (all exactly representable).
uint8_t e4m3_from_int(int v) {
  const int a = v < 0 ? -v : v;
  uint8_t code = 0;
  if (a != 0) {
    int e = 0;
    while ((2 << e) <= a) ++e;            // 2^e <= a < 2^(e+1)
    const int man = ((a << 3) >> e) - 8;  // a = 2^e (1 + man/8)
    code = static_cast<uint8_t>(((e + 7) << 3) | man);
  }
  if (v < 0)
    code |= 0x80;
  return code;
}

uint16_t bf16_from_float(float f) {  // only used on exactly representable values
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even fp32 -> bf16 (finite inputs).
float round_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return bf16_to_float(static_cast<uint16_t>(u >> 16));
}

struct Case {
  int64_t m, n, k;
};

// Operands as the values they encode: a [m, k], b [n, k], row-major.
struct Operands {
  std::vector<float> a, b;
  std::vector<uint8_t> a_bytes, b_bytes;  // device representation
};

Operands make_operands(const Case& c, GemmInput input, bool integers, uint32_t seed) {
  std::mt19937 rng(seed);
  Operands o;
  const auto fill = [&](int64_t count, std::vector<float>& vals, std::vector<uint8_t>& bytes) {
    vals.resize(static_cast<size_t>(count));
    bytes.resize(static_cast<size_t>(count * gemm_input_bytes(input)));
    for (int64_t i = 0; i < count; ++i) {
      uint8_t code = 0;
      if (integers) {
        code = e4m3_from_int(static_cast<int>(rng() % 7) - 3);  // -3..3
      } else {
        // Any sign, exponent field 5..9 (0.25 .. 7.5), any mantissa: exact in E4M3 and BF16.
        code = static_cast<uint8_t>(((rng() & 1u) << 7) | ((5u + rng() % 5u) << 3) | (rng() & 7u));
      }
      const float v = e4m3_to_float(code);
      vals[static_cast<size_t>(i)] = v;
      if (input == GemmInput::kFp8E4M3) {
        bytes[static_cast<size_t>(i)] = code;
      } else {
        const uint16_t h = bf16_from_float(v);
        std::memcpy(&bytes[static_cast<size_t>(i) * 2], &h, 2);
      }
    }
  };
  fill(c.m * c.k, o.a, o.a_bytes);
  fill(c.n * c.k, o.b, o.b_bytes);
  return o;
}

// Runs d = a . b^T on the device and compares with a double-precision CPU computation:
// exactly for integer inputs (|values| <= 3: every partial sum is an integer below 2^13, exact
// even in the FP8 tensor cores' reduced-precision accumulation) with FP32 output, after
// round-to-nearest-even for BF16 output; for other inputs within 2^-8 (FP8: the tensor cores keep
// only about 14 bits between promotions to fp32) or 2^-10 (BF16) of sum |a b|. A wrong layout,
// operand order is off by about the size of the result itself.
void check_gemm(const Case& c, GemmInput input, GemmOutput output, bool integers) {
  const std::string what =
      describe(GemmSpec{.m = c.m, .n = c.n, .k = c.k, .input = input, .output = output}) +
      (integers ? " integers" : " reals");
  SCOPED_TRACE(what);
  auto gemm = LtGemm::create(GemmSpec{.m = c.m,
                                      .n = c.n,
                                      .k = c.k,
                                      .input = input,
                                      .output = output,
                                      .workspace_bytes = int64_t{4} << 20,
                                      .max_algos = 4});
  ASSERT_TRUE(gemm.ok()) << gemm.status().to_string();
  ASSERT_GE(gemm->num_algos(), 1);
  const Operands ops = make_operands(c, input, integers, static_cast<uint32_t>(c.m * 31 + c.k));
  Buf a(ops.a_bytes.size()), b(ops.b_bytes.size());
  a.upload(ops.a_bytes.data());
  b.upload(ops.b_bytes.data());
  const size_t out_elems = static_cast<size_t>(c.m * c.n);
  const size_t out_bytes = out_elems * static_cast<size_t>(gemm_output_bytes(output));
  Buf d(out_bytes);

  std::vector<double> want(out_elems), mag(out_elems);
  for (int64_t j = 0; j < c.n; ++j) {
    for (int64_t i = 0; i < c.m; ++i) {
      double s = 0.0, sa = 0.0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double x = static_cast<double>(ops.a[static_cast<size_t>(i * c.k + p)]) *
                         ops.b[static_cast<size_t>(j * c.k + p)];
        s += x;
        sa += std::fabs(x);
      }
      want[static_cast<size_t>(j * c.m + i)] = s;  // d is [n, m] row-major
      mag[static_cast<size_t>(j * c.m + i)] = sa;
    }
  }

  // Every algorithm the heuristic offered must be right (the ceiling times each of them).
  for (int algo = 0; algo < gemm->num_algos(); ++algo) {
    SCOPED_TRACE("algorithm " + std::to_string(algo));
    DSI_ASSERT_OK(gemm->select_algo(algo));
    ASSERT_EQ(cudaMemset(d.get(), 0xFF, out_bytes), cudaSuccess);  // NaN in both output types
    DSI_ASSERT_OK(gemm->run(a.get(), b.get(), d.get(), nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got(out_elems);
    if (output == GemmOutput::kF32) {
      d.download(got.data());
    } else {
      std::vector<uint16_t> h(out_elems);
      d.download(h.data());
      for (size_t i = 0; i < out_elems; ++i) got[i] = bf16_to_float(h[i]);
    }
    int bad = 0;
    for (size_t i = 0; i < out_elems; ++i) {
      double expect = want[i];
      double tol = integers ? 0.0 : std::ldexp(mag[i], input == GemmInput::kFp8E4M3 ? -8 : -10);
      if (output == GemmOutput::kBf16) {
        expect = round_bf16(static_cast<float>(want[i]));
        // bf16 rounding of a slightly different fp32 sum may land one bf16 step away.
        if (!integers)
          tol += std::ldexp(std::fabs(want[i]), -7);
      }
      if (!(std::fabs(static_cast<double>(got[i]) - expect) <= tol)) {
        if (bad < 5) {
          ADD_FAILURE() << "d[" << i / static_cast<size_t>(c.m) << ", "
                        << i % static_cast<size_t>(c.m) << "]: cpu " << expect << " gpu " << got[i]
                        << " tol " << tol;
        }
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << bad << " of " << out_elems << " outputs wrong";
  }
}

TEST(PerfTest, E4M3Helpers) {
  for (int v = -15; v <= 15; ++v) EXPECT_EQ(e4m3_to_float(e4m3_from_int(v)), static_cast<float>(v));
  EXPECT_EQ(e4m3_from_int(1), 0x38);
  EXPECT_EQ(e4m3_from_int(3), 0x44);
  EXPECT_EQ(e4m3_from_int(-2), 0xC0);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
}

TEST(PerfTest, BadSpecsFailBeforeAnyCudaCall) {
  const auto code = [](const GemmSpec& s) { return check_gemm_spec(s).code(); };
  const GemmSpec ok{.m = 256, .n = 128, .k = 512};
  EXPECT_TRUE(check_gemm_spec(ok).ok());
  GemmSpec s = ok;
  s.k = 100;  // FP8: not a multiple of 16
  EXPECT_EQ(code(s), StatusCode::kInvalidArgument);
  s.input = GemmInput::kBf16;  // BF16 takes it
  EXPECT_TRUE(check_gemm_spec(s).ok());
  s = ok;
  s.m = 0;
  EXPECT_EQ(code(s), StatusCode::kInvalidArgument);
  s = ok;
  s.max_algos = 0;
  EXPECT_EQ(code(s), StatusCode::kInvalidArgument);
  s = ok;
  s.workspace_bytes = -1;
  EXPECT_EQ(code(s), StatusCode::kInvalidArgument);
  EXPECT_EQ(LtGemm::create(GemmSpec{.m = 8, .n = 16, .k = 16}).status().code(),
            StatusCode::kInvalidArgument);

  CeilingOptions o;
  o.copy_iters = 0;
  EXPECT_EQ(measure_ceilings(o).status().code(), StatusCode::kInvalidArgument);
  o = CeilingOptions{};
  o.gemm_k = 8200;  // FP8 needs multiples of 16
  auto r = measure_ceilings(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("multiples of 16"), std::string::npos)
      << r.status().to_string();
  o.measure_fp8 = false;  // ... unless only BF16 is measured: then it is fine (not run here)
  o.measure_copy = o.measure_bf16 = false;
  o.copy_bytes = 0;  // ignored when the copy is not measured
  if (device_count() == 0) {
    EXPECT_EQ(measure_ceilings(o).status().code(), StatusCode::kFailedPrecondition);
  }
}

TEST(PerfTest, NoDeviceIsAClearError) {
  if (device_count() > 0)
    GTEST_SKIP() << "a CUDA device is present";
  const auto r = measure_ceilings();
  ASSERT_FALSE(r.ok());
  std::printf("without a device: %s\n", r.status().to_string().c_str());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("no CUDA device"), std::string::npos)
      << r.status().to_string();
}

TEST_F(PerfGpuTest, SmallCeilingsArePositiveAndFinite) {
  CeilingOptions o;
  o.copy_bytes = int64_t{64} << 20;
  o.copy_warmup = 2;
  o.copy_iters = 5;
  o.gemm_m = o.gemm_n = o.gemm_k = 2048;
  o.gemm_warmup = 1;
  o.gemm_iters = 3;
  o.gemm_algos = 2;
  o.measure_fp8 = device_has_fp8();
  for (const Statistic st : {Statistic::kMedian, Statistic::kBest}) {
    o.statistic = st;
    const auto r = measure_ceilings(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const Ceilings& c = *r;
    std::printf("ceilings (%s, small sizes): %s\n",
                st == Statistic::kMedian ? "median" : "best",
                describe(c).c_str());
    EXPECT_FALSE(c.device_name.empty());
    EXPECT_EQ(c.gemm_m, 2048);
    EXPECT_EQ(c.gemm_n, 2048);
    EXPECT_EQ(c.gemm_k, 2048);
    EXPECT_EQ(c.copy_buffer_bytes, o.copy_bytes);
    // Positive, finite, and below anything a 2020s GPU can do (catches ms/s or byte-count slips).
    EXPECT_TRUE(std::isfinite(c.copy_bytes_per_s) && c.copy_bytes_per_s > 0);
    EXPECT_LT(c.copy_bytes_per_s, 50e12);
    EXPECT_TRUE(std::isfinite(c.bf16_gemm_flops) && c.bf16_gemm_flops > 0);
    EXPECT_LT(c.bf16_gemm_flops, 20e15);
    EXPECT_TRUE(c.copy_ms > 0 && c.bf16_gemm_ms > 0);
    if (o.measure_fp8) {
      EXPECT_TRUE(std::isfinite(c.fp8_gemm_flops) && c.fp8_gemm_flops > 0);
      EXPECT_LT(c.fp8_gemm_flops, 40e15);
      EXPECT_GT(c.fp8_gemm_ms, 0);
    }
  }
  // Figures not requested stay 0; the device can be named explicitly.
  o.measure_copy = o.measure_fp8 = false;
  o.device = 0;
  const auto r = measure_ceilings(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->copy_bytes_per_s, 0);
  EXPECT_EQ(r->fp8_gemm_flops, 0);
  EXPECT_GT(r->bf16_gemm_flops, 0);
  EXPECT_EQ(measure_ceilings(CeilingOptions{.device = device_count()}).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(PerfGpuTest, Fp8GemmMatchesCpu) {
  if (!device_has_fp8())
    GTEST_SKIP() << "FP8 tensor cores need sm_89+";
  for (const Case c : {Case{256, 256, 256}, Case{128, 64, 512}, Case{16, 48, 32}}) {
    check_gemm(c, GemmInput::kFp8E4M3, GemmOutput::kF32, /*integers=*/true);
    check_gemm(c, GemmInput::kFp8E4M3, GemmOutput::kBf16, /*integers=*/true);
    check_gemm(c, GemmInput::kFp8E4M3, GemmOutput::kF32, /*integers=*/false);
    check_gemm(c, GemmInput::kFp8E4M3, GemmOutput::kBf16, /*integers=*/false);
  }
}

TEST_F(PerfGpuTest, Bf16GemmMatchesCpu) {
  for (const Case c : {Case{256, 256, 256}, Case{128, 64, 512}, Case{24, 40, 72}}) {
    check_gemm(c, GemmInput::kBf16, GemmOutput::kF32, /*integers=*/true);
    check_gemm(c, GemmInput::kBf16, GemmOutput::kBf16, /*integers=*/true);
    check_gemm(c, GemmInput::kBf16, GemmOutput::kF32, /*integers=*/false);
  }
}

TEST_F(PerfGpuTest, RunChecksItsArguments) {
  auto gemm = LtGemm::create(GemmSpec{.m = 64, .n = 64, .k = 64, .input = GemmInput::kBf16});
  ASSERT_TRUE(gemm.ok()) << gemm.status().to_string();
  Buf a(64 * 64 * 2), d(64 * 64 * 2);
  EXPECT_EQ(gemm->run(a.get(), nullptr, d.get(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm->select_algo(gemm->num_algos()).code(), StatusCode::kInvalidArgument);
  LtGemm empty;
  EXPECT_EQ(empty.run(a.get(), a.get(), d.get(), nullptr).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace dsinfer::perf
