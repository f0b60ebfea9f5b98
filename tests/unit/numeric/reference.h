// Independent first-principles references for the numeric tests. Everything here is computed
// in double from the format definitions (sign / exponent / mantissa fields, ldexp, nearbyint);
// nothing calls into src/numeric, so a bug there cannot hide behind the same bug here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dsinfer::numeric::ref {

// A binary floating-point format: 1 sign bit, `ebits` exponent bits, `mbits` mantissa bits.
struct Format {
  int ebits;
  int mbits;
  int bias;
  enum Specials { kIeee, kFn, kNone } specials;  // all-ones exponent = inf/NaN | only S.1..1 NaN
  int total_bits() const { return 1 + ebits + mbits; }
  uint32_t sign_bit() const { return 1u << (ebits + mbits); }
  int emin() const { return 1 - bias; }  // exponent of the smallest normal
};

inline constexpr Format kBf16{8, 7, 127, Format::kIeee};
inline constexpr Format kF16{5, 10, 15, Format::kIeee};
inline constexpr Format kE4m3{4, 3, 7, Format::kFn};
inline constexpr Format kE2m1{2, 1, 1, Format::kNone};

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Value of `code` in format `f`, from the field definitions.
inline double decode(const Format& f, uint32_t code) {
  const bool neg = (code >> (f.ebits + f.mbits)) & 1u;
  const uint32_t e = (code >> f.mbits) & ((1u << f.ebits) - 1u);
  const uint32_t m = code & ((1u << f.mbits) - 1u);
  const uint32_t emax_field = (1u << f.ebits) - 1u;
  double mag;
  if (f.specials == Format::kIeee && e == emax_field) {
    mag = m == 0 ? kInf : kNaN;
  } else if (f.specials == Format::kFn && e == emax_field && m == (1u << f.mbits) - 1u) {
    mag = kNaN;
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), f.emin() - f.mbits);
  } else {
    mag = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mbits),
                     static_cast<int>(e) - f.bias);
  }
  return neg ? -mag : mag;
}

// E8M0: 2^(b - 127), 0xff = NaN.
inline double decode_e8m0(uint32_t b) {
  return b == 0xff ? kNaN : std::ldexp(1.0, int(b) - 127);
}

// Largest finite magnitude of `f`.
inline double max_finite(const Format& f) {
  const uint32_t emax_field = (1u << f.ebits) - 1u;
  const uint32_t mmax = (1u << f.mbits) - 1u;
  switch (f.specials) {
    case Format::kIeee:
      return decode(f, ((emax_field - 1) << f.mbits) | mmax);
    case Format::kFn:
      return decode(f, (emax_field << f.mbits) | (mmax - 1));
    case Format::kNone:
      return decode(f, (emax_field << f.mbits) | mmax);
  }
  return 0;
}

// Round x to the grid of `f` with round-to-nearest-even, as if the exponent range were unbounded
// above (the overflow policy is applied by the callers below). Exact for any double x whose
// quotient by the grid step is exact (every fp32 x, for the formats here).
inline double round_unbounded(const Format& f, double x) {
  if (x == 0 || std::isnan(x) || std::isinf(x))
    return x;
  const double a = std::fabs(x);
  int e2;
  std::frexp(a, &e2);                        // a in [2^(e2-1), 2^e2)
  const int e = std::max(e2 - 1, f.emin());  // subnormals share the smallest normal's step
  const double step = std::ldexp(1.0, e - f.mbits);
  const double q = a / step;           // exact: division by a power of two
  const double r = std::nearbyint(q);  // default rounding mode: ties to even
  return std::copysign(r * step, x);
}

inline const double kBf16Max = max_finite(kBf16);  // 0x7f7f
inline const double kF16Max = max_finite(kF16);    // 65504
inline const double kE4m3Max = max_finite(kE4m3);  // 448
inline const double kE2m1Max = max_finite(kE2m1);  // 6

// Expected decoded value of encode(x) under each format's documented overflow policy.
// bf16 / fp16 (IEEE): overflow -> +-inf, NaN -> NaN.
inline double round_ieee(const Format& f, double max, double x) {
  if (std::isnan(x))
    return kNaN;
  const double r = round_unbounded(f, x);
  if (std::fabs(r) > max)
    return std::copysign(kInf, x);
  return r;
}
inline double round_bf16(double x) {
  return round_ieee(kBf16, kBf16Max, x);
}
inline double round_f16(double x) {
  return round_ieee(kF16, kF16Max, x);
}
// E4M3fn: no inf; anything that rounds past 448 (and inf, NaN) becomes the NaN code.
inline double round_e4m3(double x) {
  if (std::isnan(x) || std::isinf(x))
    return kNaN;
  const double r = round_unbounded(kE4m3, x);
  if (std::fabs(r) > kE4m3Max)
    return kNaN;
  return r;
}
// E2M1: saturates at +-6; NaN -> +0.
inline double round_e2m1(double x) {
  if (std::isnan(x))
    return 0.0;
  const double r = round_unbounded(kE2m1, x);
  if (std::fabs(r) > kE2m1Max)
    return std::copysign(kE2m1Max, x);
  return r;
}

// Smallest power of two >= a (a > 0 finite), via frexp.
inline double pow2_ceil(double a) {
  int e;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  return m == 0.5 ? a : std::ldexp(1.0, e);
}

}  // namespace dsinfer::numeric::ref
