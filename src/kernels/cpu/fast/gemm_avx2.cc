// AVX2+FMA GEMM kernels (compiled with -mavx2 -mfma; called only when the CPU has them). The
// same dot-product form as gemm_avx512.cc with 8 lanes: a tile of 4 weight rows x 3 tokens
// (12 accumulators, 3 activation vectors and one weight vector: the 16 ymm registers). The k
// tail (k % 8) is a scalar sum added after the lane reduction, the same for any tile.
#include <immintrin.h>

#include "kernels/cpu/fast/gemm.h"

namespace dsinfer::cpu::fast {
namespace {

inline __m256 load_w(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load_w(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float scalar_w(const float* p) {
  return *p;
}
inline float scalar_w(const uint16_t* p) {
  const uint32_t bits = static_cast<uint32_t>(*p) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

inline float reduce(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R, int T, typename W>
inline void tile(
    const W* w, int64_t ldw, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy) {
  __m256 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= k; c += 8) {
    __m256 xv[T];
    for (int j = 0; j < T; ++j) xv[j] = _mm256_loadu_ps(x + j * ldx + c);
    for (int i = 0; i < R; ++i) {
      const __m256 wv = load_w(w + i * ldw + c);
      for (int j = 0; j < T; ++j) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < T; ++j) {
      float s = reduce(acc[i][j]);
      for (int64_t e = c; e < k; ++e) s += scalar_w(w + i * ldw + e) * x[j * ldx + e];
      y[j * ldy + i] = s;
    }
  }
}

template <int R, typename W>
inline void row_block(const W* w,
                      int64_t ldw,
                      int64_t k,
                      const float* x,
                      int64_t ldx,
                      int64_t n,
                      float* y,
                      int64_t ldy) {
  int64_t t = 0;
  for (; t + 3 <= n; t += 3) tile<R, 3>(w, ldw, k, x + t * ldx, ldx, y + t * ldy, ldy);
  switch (n - t) {
    case 2:
      tile<R, 2>(w, ldw, k, x + t * ldx, ldx, y + t * ldy, ldy);
      break;
    case 1:
      tile<R, 1>(w, ldw, k, x + t * ldx, ldx, y + t * ldy, ldy);
      break;
    default:
      break;
  }
}

template <typename W>
void kernel(const W* w,
            int64_t ldw,
            int64_t rows,
            int64_t k,
            const float* x,
            int64_t ldx,
            int64_t n,
            float* y,
            int64_t ldy) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) row_block<4>(w + r * ldw, ldw, k, x, ldx, n, y + r, ldy);
  for (; r < rows; ++r) row_block<1>(w + r * ldw, ldw, k, x, ldx, n, y + r, ldy);
}

float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = reduce(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

GemmKernels gemm_kernels_avx2() {
  return GemmKernels{
      &kernel<float>, &kernel<uint16_t>, &dot, &axpy, nullptr, nullptr, nullptr, nullptr};
}

}  // namespace dsinfer::cpu::fast
