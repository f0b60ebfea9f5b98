// Quantisation simulations of numeric/quant.h (spec §3.12, gotcha 14) against block-by-block
// references computed in double from reference.h.
#include "numeric/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference.h"

namespace dsinfer::numeric {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

bool is_pow2(float s) {
  const uint32_t u = bits_of(s);
  if (u >> 31)
    return false;
  const uint32_t e = u >> 23;
  const uint32_t m = u & 0x7fffffu;
  if (e == 0)
    return m != 0 && (m & (m - 1)) == 0;  // subnormal power of two
  return e != 255 && m == 0;
}

// Independent definitions of the two block formats (spec §3.12): floors and maxima written out.
struct BlockFormat {
  const char* name;
  double floor;
  double qmax;
  double (*round)(double);  // RNE onto the element grid
  ref::Format fmt;
  uint32_t max_code;  // code of qmax
};
const BlockFormat kFp8{"fp8", static_cast<double>(1e-4f), 448.0, ref::round_e4m3, ref::kE4m3, 0x7e};
const BlockFormat kFp4{"fp4", std::ldexp(6.0, -126), 6.0, ref::round_e2m1, ref::kE2m1, 0x7};

// Non-negative finite values of the element format, ascending.
std::vector<double> grid(const BlockFormat& f) {
  std::vector<double> g;
  for (uint32_t c = 0; c <= f.max_code; ++c) g.push_back(ref::decode(f.fmt, c));
  return g;
}

// 2^ceil(log2(max(amax, floor) / qmax)). The double quotient cannot cross a power of two that the
// exact one does not (its error is far below the fp32 spacing of amax), so this is exact.
double ref_scale(const BlockFormat& f, double amax) {
  return ref::pow2_ceil(std::max(amax, f.floor) / f.qmax);
}

TEST(QuantConstants, MatchSpec) {
  EXPECT_EQ(kFp8Max, 448.0f);
  EXPECT_EQ(kFp4Max, 6.0f);
  EXPECT_EQ(kActAmaxFloor, 1e-4f);
  EXPECT_EQ(static_cast<double>(kFp4AmaxFloor), std::ldexp(6.0, -126));
}

// ---- ue8m0_block_scale
// ---------------------------------------------------------------------------

std::vector<float> amax_samples(double floor, double qmax) {
  std::vector<float> v = {0.0f,
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(),
                          static_cast<float>(floor),
                          std::nextafter(static_cast<float>(floor), 0.0f),
                          std::nextafter(static_cast<float>(floor), 1.0f),
                          static_cast<float>(qmax),
                          1.0f,
                          std::numeric_limits<float>::max()};
  // amax exactly qmax * 2^k and its fp32 neighbours: the ceil must flip exactly there.
  for (int k = -130; k <= 120; ++k) {
    const float a = static_cast<float>(std::ldexp(qmax, k));
    if (a == 0.0f || std::isinf(a))
      continue;
    v.push_back(a);
    v.push_back(std::nextafter(a, 0.0f));
    v.push_back(std::nextafter(a, std::numeric_limits<float>::infinity()));
  }
  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> ex(-149, 127);
  for (int i = 0; i < 20000; ++i) v.push_back(static_cast<float>(std::ldexp(mant(rng), ex(rng))));
  return v;
}

void check_scales(const BlockFormat& f, float floor_arg, float qmax_arg) {
  int bad = 0;
  for (float amax : amax_samples(f.floor, f.qmax)) {
    if (!std::isfinite(amax) || amax > 1e38f)
      continue;
    const float s = ue8m0_block_scale(amax, floor_arg, qmax_arg);
    const double a = std::max(static_cast<double>(amax), f.floor);
    const bool ok = is_pow2(s) && a <= f.qmax * s &&  // amax/s <= qmax: nothing clips
                    a > f.qmax * (0.5 * s) &&         // s/2 would clip: the ceil is tight
                    static_cast<double>(s) == ref_scale(f, amax);
    if (!ok && bad++ < 5) {
      ADD_FAILURE() << f.name << " amax " << std::hexfloat << amax << " -> s " << s << ", want "
                    << ref_scale(f, amax);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(QuantScale, Fp8IsTightPowerOfTwoCeil) {
  check_scales(kFp8, kActAmaxFloor, kFp8Max);
}
TEST(QuantScale, Fp4IsTightPowerOfTwoCeil) {
  check_scales(kFp4, kFp4AmaxFloor, kFp4Max);
}

TEST(QuantScale, FloorsAndRoundingUp) {
  // FP8 floor: 1e-4 / 448 = 2.23e-7 -> 2^-22; FP4 floor: 6 * 2^-126 / 6 -> 2^-126.
  EXPECT_EQ(ue8m0_block_scale(0.0f, kActAmaxFloor, kFp8Max), std::ldexp(1.0f, -22));
  EXPECT_EQ(ue8m0_block_scale(1e-30f, kActAmaxFloor, kFp8Max), std::ldexp(1.0f, -22));
  EXPECT_EQ(ue8m0_block_scale(0.0f, kFp4AmaxFloor, kFp4Max), std::ldexp(1.0f, -126));
  EXPECT_EQ(ue8m0_block_scale(1e-44f, kFp4AmaxFloor, kFp4Max), std::ldexp(1.0f, -126));
  // Exponent rounds up (gotcha 14): 449 / 448 is just above 1 -> 2, and 448 -> exactly 1.
  EXPECT_EQ(ue8m0_block_scale(448.0f, kActAmaxFloor, kFp8Max), 1.0f);
  EXPECT_EQ(ue8m0_block_scale(449.0f, kActAmaxFloor, kFp8Max), 2.0f);
  EXPECT_EQ(ue8m0_block_scale(224.0f, kActAmaxFloor, kFp8Max), 0.5f);
  EXPECT_EQ(ue8m0_block_scale(225.0f, kActAmaxFloor, kFp8Max), 1.0f);
  EXPECT_EQ(ue8m0_block_scale(6.0f, kFp4AmaxFloor, kFp4Max), 1.0f);
  EXPECT_EQ(ue8m0_block_scale(std::nextafter(6.0f, 7.0f), kFp4AmaxFloor, kFp4Max), 2.0f);
}

// ---- block simulations
// ---------------------------------------------------------------------------

// Test data with a different magnitude in every block, plus blocks built to hit exact ties,
// zeros of both signs, values below the floor, and an amax of exactly qmax * 2^k.
std::vector<float> make_blocks(const BlockFormat& f, int64_t n, int64_t block, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-30, 30);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
    const int64_t len = std::min(block, n - b0);
    const int kind = static_cast<int>(bi % 5);
    const int k = ex(rng);
    for (int64_t i = 0; i < len; ++i) {
      float v = std::ldexp(normal(rng), k);
      if (kind == 1)
        v = std::ldexp(normal(rng), -40);  // whole block under the floor
      if (kind == 2) {
        // Grid midpoints at scale 2^k (exact ties for RNE), with amax pinned to qmax * 2^k.
        const std::vector<double> g = grid(f);
        const size_t j = rng() % (g.size() - 1);
        const double mid = 0.5 * (g[j] + g[j + 1]);
        v = static_cast<float>(std::ldexp(i % 2 ? -mid : mid, k));
        if (i == 0)
          v = static_cast<float>(std::ldexp(f.qmax, k));
      }
      if (kind == 3 && i % 3 == 0)
        v = (i % 2) ? -0.0f : 0.0f;
      x[static_cast<size_t>(b0 + i)] = v;
    }
  }
  return x;
}

// Expected output of block simulation: per block s = ref_scale(amax), y = round(clamp(x/s)) * s.
std::vector<double> ref_simulate(const BlockFormat& f,
                                 const std::vector<float>& x,
                                 int64_t block,
                                 std::vector<double>* scales) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> y(x.size());
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = std::min(block, n - b0);
    double amax = 0;
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(double{x[b0 + i]}));
    const double s = ref_scale(f, amax);
    if (scales)
      scales->push_back(s);
    for (int64_t i = 0; i < len; ++i) {
      const double q = std::clamp(double{x[b0 + i]} / s, -f.qmax, f.qmax);
      y[b0 + i] = f.round(q) * s;
    }
  }
  return y;
}

struct Shape {
  int64_t n;
  int64_t block;
};

void check_simulation(const BlockFormat& f,
                      void (*simulate)(float*, int64_t, int64_t),
                      const std::vector<Shape>& shapes) {
  uint32_t seed = 7;
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(std::string(f.name) + " n=" + std::to_string(sh.n) +
                 " block=" + std::to_string(sh.block));
    const std::vector<float> x = make_blocks(f, sh.n, sh.block, seed++);
    std::vector<double> scales;
    const std::vector<double> want = ref_simulate(f, x, sh.block, &scales);
    std::vector<float> y = x;
    simulate(y.data(), sh.n, sh.block);
    int bad = 0;
    for (int64_t i = 0; i < sh.n; ++i) {
      const double s = scales[static_cast<size_t>(i / sh.block)];
      const double q = double{y[i]} / s;
      // Exactly representable: y/s is a grid point within +-qmax.
      const bool on_grid = f.round(q) == q && std::fabs(q) <= f.qmax;
      if ((bits_of(y[i]) != bits_of(static_cast<float>(want[i])) || !on_grid) && bad++ < 5) {
        ADD_FAILURE() << "i=" << i << " x=" << std::hexfloat << x[i] << " got " << y[i] << " want "
                      << want[i] << " s=" << s;
      }
    }
    EXPECT_EQ(bad, 0);
    std::vector<float> z = y;
    simulate(z.data(), sh.n, sh.block);
    // (memcmp takes no null pointer, even for zero bytes: the empty shape skips it.)
    EXPECT_TRUE(y.empty() || std::memcmp(z.data(), y.data(), y.size() * sizeof(float)) == 0)
        << "not idempotent";
  }
}

const std::vector<Shape> kFp8Shapes = {{0, 128},
                                       {1, 128},
                                       {3, 128},
                                       {127, 128},
                                       {128, 128},
                                       {129, 128},
                                       {257, 128},
                                       {1000, 128},
                                       {448, 64},
                                       {449, 64},
                                       {7, 3},
                                       {50, 1}};
const std::vector<Shape> kFp4Shapes = {
    {0, 32}, {1, 32}, {31, 32}, {32, 32}, {33, 32}, {64, 32}, {300, 32}, {1000, 32}, {10, 4}};

TEST(QuantFp8Block, SimulateMatchesReference) {
  check_simulation(kFp8, fp8_block_simulate, kFp8Shapes);
}

TEST(QuantFp4Block, SimulateMatchesReference) {
  check_simulation(kFp4, fp4_block_simulate, kFp4Shapes);
}

TEST(QuantFp8Block, BlocksAreIndependent) {
  // A huge value in block 0 must not change the scale of block 1 (nor of a 1-element tail).
  std::vector<float> x(129, 0.001f);
  x[0] = 1e6f;
  x[128] = 3.0f;
  fp8_block_simulate(x.data(), 129, 128);
  EXPECT_EQ(x[1], 0.0f);    // crushed by block 0's scale 2^12
  EXPECT_EQ(x[128], 3.0f);  // alone in its block: s = 2^-7, 3/s = 384 is on the grid
  std::vector<float> y(65, 0.001f);
  y[0] = 1e6f;
  y[64] = 0.01f;
  fp8_block_simulate(y.data(), 65, 64);
  const float s = std::ldexp(1.0f, -15);  // 0.01 / 448 = 2.2e-5 -> 2^-15
  EXPECT_EQ(double{y[64]}, ref::round_e4m3(double{0.01f} / s) * s);
}

TEST(QuantFp8Block, QuantizeIsConsistentWithSimulate) {
  uint32_t seed = 99;
  for (const Shape& sh : kFp8Shapes) {
    SCOPED_TRACE("n=" + std::to_string(sh.n) + " block=" + std::to_string(sh.block));
    const std::vector<float> x = make_blocks(kFp8, sh.n, sh.block, seed++);
    std::vector<double> scales;
    ref_simulate(kFp8, x, sh.block, &scales);
    const int64_t nb = (sh.n + sh.block - 1) / sh.block;
    std::vector<uint8_t> codes(static_cast<size_t>(sh.n) + 1, 0xaa);
    std::vector<uint8_t> sb(static_cast<size_t>(nb) + 1, 0xaa);
    fp8_block_quantize(x.data(), sh.n, sh.block, codes.data(), sb.data());
    EXPECT_EQ(codes[static_cast<size_t>(sh.n)], 0xaa) << "wrote past the codes";
    EXPECT_EQ(sb[static_cast<size_t>(nb)], 0xaa) << "wrote past the scales";
    std::vector<float> y = x;
    fp8_block_simulate(y.data(), sh.n, sh.block);
    int bad = 0;
    for (int64_t b = 0; b < nb; ++b) {
      EXPECT_EQ(int{sb[b]}, 127 + std::ilogb(scales[b])) << "block " << b;
    }
    for (int64_t i = 0; i < sh.n; ++i) {
      const double s = ref::decode_e8m0(sb[static_cast<size_t>(i / sh.block)]);
      const double v = ref::decode(ref::kE4m3, codes[i]) * s;
      if (bits_of(static_cast<float>(v)) != bits_of(y[i]) && bad++ < 5) {
        ADD_FAILURE() << "i=" << i << " code " << int{codes[i]} << " -> " << v << ", simulate "
                      << y[i];
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// ---- Hadamard
// ------------------------------------------------------------------------------------

TEST(QuantHadamard, MatchesExplicitSylvesterMatrix) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t n : {1, 2, 8, 64, 128}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = u(rng);
    std::vector<float> y = x;
    hadamard_transform(y.data(), n);
    double nx = 0, ny = 0;
    for (int64_t i = 0; i < n; ++i) {
      // Sylvester: H[i][j] = (-1)^popcount(i & j), normalised by 1/sqrt(n).
      double acc = 0;
      for (int64_t j = 0; j < n; ++j) {
        acc += (__builtin_popcountll(i & j) & 1 ? -1.0 : 1.0) * x[j];
      }
      EXPECT_NEAR(y[i], acc / std::sqrt(double(n)), 2e-6) << i;
      nx += double{x[i]} * x[i];
      ny += double{y[i]} * y[i];
    }
    EXPECT_NEAR(ny, nx, 1e-5 * nx);  // orthogonal: norm preserved
    std::vector<float> z = y;
    hadamard_transform(z.data(), n);  // H is symmetric and orthogonal: H(Hx) = x
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(z[i], x[i], 1e-6) << i;
  }
}

TEST(QuantHadamardDeathTest, RejectsNonPowerOfTwo) {
  std::vector<float> x(12, 1.0f);
  EXPECT_DEATH(hadamard_transform(x.data(), 12), "power of two");
  EXPECT_DEATH(hadamard_transform(x.data(), 0), "power of two");
}

}  // namespace
}  // namespace dsinfer::numeric
