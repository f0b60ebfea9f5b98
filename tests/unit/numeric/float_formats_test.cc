// Exhaustive checks of the scalar format conversions in numeric/float_formats.h against the
// first-principles references in reference.h (spec §3.12, §5.3, §5.4; gotchas 13-14).
#include "numeric/float_formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
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

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// True when `got` is exactly `want` (bit for bit, so the sign of zero counts), or both are NaN.
bool same_value(float got, double want) {
  if (std::isnan(want))
    return std::isnan(got);
  return bits_of(got) == bits_of(static_cast<float>(want));
}

// One storage format under test: the engine's encoder/decoder plus the reference.
struct Codec {
  const char* name;
  ref::Format fmt;
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);
  double (*round)(double);  // expected decoded value of encode(x)
};

const Codec kBf16{
    "bf16",
    ref::kBf16,
    [](uint32_t c) { return bf16_to_f32(static_cast<uint16_t>(c)); },
    [](float x) -> uint32_t { return f32_to_bf16(x); },
    ref::round_bf16,
};
const Codec kF16{
    "fp16",
    ref::kF16,
    [](uint32_t c) { return f16_to_f32(static_cast<uint16_t>(c)); },
    [](float x) -> uint32_t { return f32_to_f16(x); },
    ref::round_f16,
};
const Codec kE4m3{
    "e4m3",
    ref::kE4m3,
    [](uint32_t c) { return fp8_e4m3_to_f32(static_cast<uint8_t>(c)); },
    [](float x) -> uint32_t { return f32_to_fp8_e4m3(x); },
    ref::round_e4m3,
};
const Codec kE2m1{
    "e2m1",
    ref::kE2m1,
    [](uint32_t c) { return fp4_e2m1_to_f32(static_cast<uint8_t>(c)); },
    [](float x) -> uint32_t { return f32_to_fp4_e2m1(x); },
    ref::round_e2m1,
};
const Codec* const kCodecs[] = {&kBf16, &kF16, &kE4m3, &kE2m1};

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%x", v);
  return buf;
}

// ---- decode: every code point -------------------------------------------------------------------

TEST(FloatFormatsDecode, EveryCodePointMatchesFieldDefinition) {
  for (const Codec* c : kCodecs) {
    const uint32_t n = 1u << c->fmt.total_bits();
    int bad = 0;
    for (uint32_t code = 0; code < n; ++code) {
      const double want = ref::decode(c->fmt, code);
      if (!std::isnan(want)) {
        ASSERT_EQ(static_cast<double>(static_cast<float>(want)), want) << "not an fp32 value";
      }
      const float got = c->decode(code);
      if (!same_value(got, want) && bad++ < 5) {
        ADD_FAILURE() << c->name << " code " << hex(code) << ": got " << got << " want " << want;
      }
      // The sign bit is carried through NaN too.
      if (std::isnan(want) && std::signbit(got) != ((code & c->fmt.sign_bit()) != 0) && bad++ < 5) {
        ADD_FAILURE() << c->name << " code " << hex(code) << ": NaN lost its sign";
      }
    }
    EXPECT_EQ(bad, 0) << c->name;
  }
}

TEST(FloatFormatsDecode, KnownValues) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));
  EXPECT_TRUE(std::isinf(bf16_to_f32(0x7f80)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7fc0)));
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(fp8_e4m3_to_f32(0x78), 256.0f);  // exponent field 15 is a normal binade in fn
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(0x80)));
  int nans = 0;
  for (int b = 0; b < 256; ++b) nans += std::isnan(fp8_e4m3_to_f32(static_cast<uint8_t>(b)));
  EXPECT_EQ(nans, 2);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
  const float e2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(bits_of(fp4_e2m1_to_f32(static_cast<uint8_t>(i))), bits_of(e2m1[i])) << i;
  }
}

TEST(FloatFormatsDecode, E8m0EveryByte) {
  for (uint32_t b = 0; b < 256; ++b) {
    const float got = e8m0_to_f32(static_cast<uint8_t>(b));
    EXPECT_TRUE(same_value(got, ref::decode_e8m0(b))) << "byte " << b << " got " << got;
  }
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));  // an fp32 subnormal
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
}

TEST(FloatFormatsDecode, E8m0FromPow2RoundTrips) {
  for (uint32_t b = 0; b < 255; ++b) {
    const float p = std::ldexp(1.0f, static_cast<int>(b) - 127);
    EXPECT_EQ(e8m0_from_pow2(p), b);
    EXPECT_EQ(e8m0_to_f32(e8m0_from_pow2(p)), p);
  }
}

// ---- encode
// --------------------------------------------------------------------------------------

TEST(FloatFormatsEncode, EveryCodePointRoundTrips) {
  for (const Codec* c : kCodecs) {
    const uint32_t n = 1u << c->fmt.total_bits();
    int bad = 0;
    for (uint32_t code = 0; code < n; ++code) {
      const double v = ref::decode(c->fmt, code);
      const float x = static_cast<float>(v);
      if (std::isnan(v)) {
        if (!std::isnan(c->decode(c->encode(x))) && bad++ < 5) {
          ADD_FAILURE() << c->name << " NaN code " << hex(code) << " did not stay NaN";
        }
        continue;
      }
      const uint32_t got = c->encode(x);
      if (got != code && bad++ < 5) {
        ADD_FAILURE() << c->name << " encode(" << v << ") = " << hex(got) << ", want " << hex(code);
      }
    }
    EXPECT_EQ(bad, 0) << c->name;
  }
}

// Non-negative magnitudes in code order, ending with the "next" value past the largest finite one
// where rounding can reach it: 2^(emax+1) for IEEE formats (the inf code), 480 for E4M3fn (the
// NaN code 0x7f). E2M1 saturates, so it ends at 6.
struct Step {
  double value;
  uint32_t code;
};
std::vector<Step> magnitude_ladder(const ref::Format& f) {
  std::vector<Step> out;
  const uint32_t n = f.sign_bit();
  for (uint32_t code = 0; code < n; ++code) {
    const double v = ref::decode(f, code);
    if (std::isinf(v)) {
      const double top = out.back().value;
      out.push_back({top + std::ldexp(1.0, std::ilogb(top) - f.mbits), code});
      break;
    }
    if (std::isnan(v)) {
      out.push_back({480.0, code});  // E4M3fn: where the NaN code would sit
      break;
    }
    out.push_back({v, code});
  }
  return out;
}

TEST(FloatFormatsEncode, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  for (const Codec* c : kCodecs) {
    const std::vector<Step> ladder = magnitude_ladder(c->fmt);
    int bad = 0;
    auto expect = [&](float x, uint32_t want) {
      const uint32_t got = c->encode(x);
      if (got != want && bad++ < 5) {
        ADD_FAILURE() << c->name << " encode(" << std::hexfloat << x << std::defaultfloat
                      << ") = " << hex(got) << ", want " << hex(want);
      }
    };
    for (size_t i = 0; i + 1 < ladder.size(); ++i) {
      const Step lo = ladder[i];
      const Step hi = ladder[i + 1];
      ASSERT_EQ(hi.code, lo.code + 1);
      const double mid = 0.5 * (lo.value + hi.value);
      const float m = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(m), mid) << c->name << ": midpoint not an fp32 value";
      const uint32_t even = (lo.code & 1u) ? hi.code : lo.code;
      const float below = std::nextafter(m, 0.0f);
      const float above = std::nextafter(m, std::numeric_limits<float>::infinity());
      const uint32_t s = c->fmt.sign_bit();
      expect(m, even);
      expect(below, lo.code);
      expect(above, hi.code);
      expect(-m, s | even);
      expect(-below, s | lo.code);
      expect(-above, s | hi.code);
    }
    EXPECT_EQ(bad, 0) << c->name;
  }
}

// Checks encode(x) for x = float_of(u) over a sparse but structured slice of all 2^32 patterns,
// against the double-arithmetic reference.
struct SweepResult {
  uint64_t checked = 0;
  int bad = 0;
  std::string first;
};

void check_one(const Codec& c, float x, SweepResult& r) {
  ++r.checked;
  const double want = c.round(static_cast<double>(x));
  const float got = c.decode(c.encode(x));
  if (!same_value(got, want)) {
    if (r.bad++ < 5) {
      char buf[128];
      std::snprintf(buf,
                    sizeof(buf),
                    " [%s x=0x%08x got %a want %a]",
                    c.name,
                    bits_of(x),
                    static_cast<double>(got),
                    want);
      r.first += buf;
    }
    return;
  }
  // NaNs keep their sign in bf16/fp16 (E4M3fn keeps it too; E2M1 maps NaN to +0).
  if (std::isnan(want) && (&c == &kBf16 || &c == &kF16) && std::signbit(got) != std::signbit(x)) {
    if (r.bad++ < 5)
      r.first += " [" + std::string(c.name) + " NaN sign " + hex(bits_of(x)) + "]";
  }
}

TEST(FloatFormatsEncode, Fp32ToBf16AndF16SweepVsReference) {
  SweepResult bf16, f16;
  // Every 97th pattern (97 is odd, so all residues of the low bits are hit along the way).
  for (uint64_t u = 0; u < (1ull << 32); u += 97) {
    const float x = float_of(static_cast<uint32_t>(u));
    check_one(kBf16, x, bf16);
    check_one(kF16, x, f16);
  }
  // Every pattern sitting on or next to a bf16 rounding boundary.
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : {0x7fffu, 0x8000u, 0x8001u}) check_one(kBf16, float_of(hi << 16 | lo), bf16);
  }
  // Same for fp16's normal range: the dropped 13 bits at/next to the half-way point, for every
  // fp32 exponent that lands in or around fp16's range (incl. the overflow threshold 65520).
  for (uint32_t e = 90; e <= 160; ++e) {
    for (uint32_t m = 0; m < (1u << 10); ++m) {
      for (uint32_t lo : {0xfffu, 0x1000u, 0x1001u, 0u, 1u, 0x1fffu}) {
        for (uint32_t s : {0u, 0x80000000u})
          check_one(kF16, float_of(s | e << 23 | m << 13 | lo), f16);
      }
    }
  }
  EXPECT_EQ(bf16.bad, 0) << bf16.first;
  EXPECT_EQ(f16.bad, 0) << f16.first;
  EXPECT_GT(bf16.checked, 44000000u);
}

TEST(FloatFormatsEncode, Fp32ToE4m3AndE2m1SweepVsReference) {
  SweepResult e4m3, e2m1;
  for (uint64_t u = 0; u < (1ull << 32); u += 997) {
    const float x = float_of(static_cast<uint32_t>(u));
    check_one(kE4m3, x, e4m3);
    check_one(kE2m1, x, e2m1);
  }
  // Dense over the interesting magnitudes: every fp32 with 12 leading mantissa bits free,
  // exponents 2^-12 .. 2^9 (E4M3 subnormals through past the NaN threshold), both signs.
  for (uint32_t e = 127 - 12; e <= 127 + 9; ++e) {
    for (uint32_t m = 0; m < (1u << 12); ++m) {
      for (uint32_t lo : {0u, 1u, 0x7ffu}) {
        const uint32_t u = e << 23 | m << 11 | lo;
        check_one(kE4m3, float_of(u), e4m3);
        check_one(kE4m3, float_of(u | 0x80000000u), e4m3);
        check_one(kE2m1, float_of(u), e2m1);
        check_one(kE2m1, float_of(u | 0x80000000u), e2m1);
      }
    }
  }
  EXPECT_EQ(e4m3.bad, 0) << e4m3.first;
  EXPECT_EQ(e2m1.bad, 0) << e2m1.first;
}

TEST(FloatFormatsEncode, Bf16Specials) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_bf16(inf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-inf), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past 0x7f7f
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(float_of(0x80000001u)), 0x8000);  // tiny negative -> -0
  // A NaN whose payload sits only in the low 16 bits must not become inf.
  const uint16_t q = f32_to_bf16(float_of(0x7f800001u));
  EXPECT_TRUE(std::isnan(bf16_to_f32(q))) << hex(q);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(float_of(0xff800001u)))));
  EXPECT_EQ(f32_to_bf16(float_of(0xff800001u)) & 0x8000, 0x8000);
}

TEST(FloatFormatsEncode, F16SubnormalsAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie between 65504 (odd) and 65536 (inf, even)
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1e30f), 0x7c00);
  EXPECT_EQ(f32_to_f16(inf), 0x7c00);
  EXPECT_EQ(f32_to_f16(-inf), 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  const float t = std::ldexp(1.0f, -24);    // smallest fp16 subnormal
  EXPECT_EQ(f32_to_f16(0.5f * t), 0x0000);  // tie -> even (0)
  EXPECT_EQ(f32_to_f16(std::nextafter(0.5f * t, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(1.5f * t), 0x0002);     // tie 1|2 -> 2
  EXPECT_EQ(f32_to_f16(2.5f * t), 0x0002);     // tie 2|3 -> 2
  EXPECT_EQ(f32_to_f16(1023.5f * t), 0x0400);  // tie into the smallest normal
  EXPECT_EQ(f32_to_f16(-0.25f * t), 0x8000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(FloatFormatsEncode, E4m3SaturationAndSubnormals) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_fp8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(450.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(464.0f, 0.0f)), 0x7e);
  // 464 is the midpoint of 448 (code 0x7e, even) and 480 (0x7f, the NaN code): RNE keeps 448,
  // exactly as torch's float -> float8_e4m3fn cast does. Anything above is NaN.
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-464.0f), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(464.0f, 1e9f)), 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(480.0f), 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(-1e6f), 0xff);
  EXPECT_EQ(f32_to_fp8_e4m3(inf), 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(-inf), 0xff);
  EXPECT_EQ(f32_to_fp8_e4m3(std::nanf("")) & 0x7f, 0x7f);
  // Subnormals: k * 2^-9 for k = 0..7, then 8 * 2^-9 is the smallest normal (code 0x08).
  for (int k = 0; k <= 8; ++k) {
    EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(static_cast<float>(k), -9)), k);
    EXPECT_EQ(f32_to_fp8_e4m3(-std::ldexp(static_cast<float>(k), -9)), 0x80 | k);
  }
  for (int k = 0; k < 8; ++k) {  // ties k + 1/2 go to the even neighbour
    const float mid = std::ldexp(k + 0.5f, -9);
    EXPECT_EQ(f32_to_fp8_e4m3(mid), (k & 1) ? k + 1 : k) << k;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(-std::numeric_limits<float>::denorm_min()), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(std::ldexp(1.0f, -6), 0.0f)), 0x08);
}

TEST(FloatFormatsEncode, E2m1SaturationAndZeroSign) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_fp4_e2m1(6.0f), 7);
  EXPECT_EQ(f32_to_fp4_e2m1(std::nextafter(6.0f, 7.0f)), 7);
  EXPECT_EQ(f32_to_fp4_e2m1(7.0f), 7);
  EXPECT_EQ(f32_to_fp4_e2m1(1e30f), 7);
  EXPECT_EQ(f32_to_fp4_e2m1(inf), 7);
  EXPECT_EQ(f32_to_fp4_e2m1(-inf), 15);
  EXPECT_EQ(f32_to_fp4_e2m1(-100.0f), 15);
  EXPECT_EQ(f32_to_fp4_e2m1(std::nanf("")), 0);
  EXPECT_EQ(f32_to_fp4_e2m1(0.0f), 0);
  EXPECT_EQ(f32_to_fp4_e2m1(-0.0f), 8);
  EXPECT_EQ(f32_to_fp4_e2m1(-0.25f), 8);  // tie 0 | 0.5 -> 0, keeping the sign
  EXPECT_EQ(f32_to_fp4_e2m1(-1e-30f), 8);
  EXPECT_EQ(f32_to_fp4_e2m1(std::nextafter(0.25f, 1.0f)), 1);
  const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const int even[7] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(f32_to_fp4_e2m1(ties[i]), even[i]) << ties[i];
}

// ---- packed FP4
// ----------------------------------------------------------------------------------

TEST(FloatFormatsFp4Packed, LowNibbleIsEvenElement) {
  for (uint32_t b = 0; b < 256; ++b) {
    const uint8_t byte = static_cast<uint8_t>(b);
    EXPECT_TRUE(same_value(fp4_packed_get(&byte, 0), ref::decode(ref::kE2m1, b & 0xfu))) << b;
    EXPECT_TRUE(same_value(fp4_packed_get(&byte, 1), ref::decode(ref::kE2m1, b >> 4))) << b;
  }
  // A row 1, -2, 0.5, 6, -0, 3 packs as (lo | hi << 4): 0xc2, 0x71, 0x58.
  const uint8_t row[3] = {0xc2, 0x71, 0x58};
  const float want[6] = {1.0f, -2.0f, 0.5f, 6.0f, -0.0f, 3.0f};
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(bits_of(fp4_packed_get(row, i)), bits_of(want[i])) << i;
  }
  // Packing with the encoder and reading back preserves element order over a long row.
  std::vector<uint8_t> packed(512);
  for (int64_t i = 0; i < 1024; ++i) {
    const uint8_t nib = static_cast<uint8_t>((i * 7 + 3) & 0xf);
    packed[i / 2] |= static_cast<uint8_t>((i & 1) ? nib << 4 : nib);
  }
  for (int64_t i = 0; i < 1024; ++i) {
    EXPECT_TRUE(same_value(fp4_packed_get(packed.data(), i),
                           ref::decode(ref::kE2m1, static_cast<uint32_t>((i * 7 + 3) & 0xf))))
        << i;
  }
}

// Every E2M1 code in every position of the word becomes the E4M3 byte of its value times 2^-6
// (decoded by the independent reference), evens in bytes 0..3, odds in 4..7 of the pair.
TEST(FloatFormatsFp4Packed, Fp4x8ToE4m3ScaledIsExact) {
  std::mt19937 g(2025);
  for (int round = 0; round < 4096; ++round) {
    // The first 16 rounds put code `round` in every position; then random words.
    uint32_t w = 0;
    if (round < 16) {
      for (int i = 0; i < 8; ++i) w |= static_cast<uint32_t>(round) << (4 * i);
    } else {
      w = static_cast<uint32_t>(g());
    }
    uint32_t even = 0, odd = 0;
    fp4x8_to_e4m3_scaled(w, &even, &odd);
    for (int i = 0; i < 8; ++i) {
      const uint32_t code = (w >> (4 * i)) & 0xfu;
      const uint32_t byte = ((i % 2 == 0 ? even : odd) >> (8 * (i / 2))) & 0xffu;
      const double want = ref::decode(ref::kE2m1, code) / 64.0;
      EXPECT_TRUE(same_value(static_cast<float>(ref::decode(ref::kE4m3, byte)), want))
          << "word " << std::hex << w << " code " << code << " byte " << byte;
      EXPECT_TRUE(same_value(fp8_e4m3_to_f32(static_cast<uint8_t>(byte)), want));
    }
  }
}

// ---- pow2_ceil
// -----------------------------------------------------------------------------------

TEST(FloatFormatsPow2Ceil, SweepIncludingSubnormalsAndPowersOfTwo) {
  int bad = 0;
  std::string first;
  auto check = [&](float x) {
    const double want = ref::pow2_ceil(static_cast<double>(x));
    const float got = pow2_ceil(x);
    if (static_cast<double>(got) != want && bad++ < 5) {
      char buf[96];
      std::snprintf(buf,
                    sizeof(buf),
                    " [x=%a got %a want %a]",
                    static_cast<double>(x),
                    static_cast<double>(got),
                    want);
      first += buf;
    }
  };
  const uint32_t top = 0x7f000000u;  // 2^127: beyond it the answer (2^128) is not an fp32
  for (uint32_t u = 1; u <= top; u += 251) check(float_of(u));
  for (uint32_t u = 1; u < 0x00800000u; u += 7) check(float_of(u));  // subnormals
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    EXPECT_EQ(pow2_ceil(p), p) << e;  // exact powers of two map to themselves
    check(p);
    if (e < 127)
      check(std::nextafter(p, 1e38f));
    if (e > -149)
      check(std::nextafter(p, 0.0f));
  }
  check(float_of(top - 1));
  check(float_of(0x007fffffu));  // largest subnormal -> 2^-126
  EXPECT_EQ(bad, 0) << first;
}

}  // namespace
}  // namespace dsinfer::numeric
