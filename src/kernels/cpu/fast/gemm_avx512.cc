// AVX-512 GEMM kernels (compiled with -mavx512f -mavx512bw -mavx512vl -mfma; called only when
// the CPU has them). Dot-product form over row-major weights: a tile of R weight rows x T tokens
// keeps R*T 16-lane accumulators; the k tail is a masked load, so every output element is the
// same FMA chain for any tile (batch invariance). Nothing from the standard library here, so no
// AVX-512 code can leak into other translation units through shared inline functions.
// GCC 12 flags its own _mm512_reduce_add_ps (an intentionally undefined operand inside
// _mm512_extractf64x4_pd) as uninitialised once inlined here.
#if defined(__GNUC__) && !defined(__clang__)  // clang (the fuzz build) has no such warning group
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "kernels/cpu/fast/gemm.h"

namespace dsinfer::cpu::fast {
namespace {

inline __m512 load_w(const float* p) {
  return _mm512_loadu_ps(p);
}
inline __m512 load_w(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load_w_tail(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline __m512 load_w_tail(const uint16_t* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int R, int T, typename W>
inline void tile(
    const W* w, int64_t ldw, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy) {
  __m512 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= k; c += 16) {
    __m512 xv[T];
    for (int j = 0; j < T; ++j) xv[j] = _mm512_loadu_ps(x + j * ldx + c);
    for (int i = 0; i < R; ++i) {
      const __m512 wv = load_w(w + i * ldw + c);
      for (int j = 0; j < T; ++j) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  if (c < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - c)) - 1u);
    __m512 xv[T];
    for (int j = 0; j < T; ++j) xv[j] = _mm512_maskz_loadu_ps(m, x + j * ldx + c);
    for (int i = 0; i < R; ++i) {
      const __m512 wv = load_w_tail(w + i * ldw + c, m);
      for (int j = 0; j < T; ++j) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) y[j * ldy + i] = _mm512_reduce_add_ps(acc[i][j]);
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
  for (; t + 4 <= n; t += 4) tile<R, 4>(w, ldw, k, x + t * ldx, ldx, y + t * ldy, ldy);
  switch (n - t) {
    case 3:
      tile<R, 3>(w, ldw, k, x + t * ldx, ldx, y + t * ldy, ldy);
      break;
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

// BF16 weights with 4+ tokens and k <= 512: each block of 4 rows is widened once into an L1
// buffer and the tokens run the F32 tile on it (the weights become memory operands of the FMAs
// instead of being widened again for every group of tokens). The values and the order of the
// FMAs are those of the BF16 tile, so results are bit-identical to it (batch invariance).
void kernel_bf16(const uint16_t* w,
                 int64_t ldw,
                 int64_t rows,
                 int64_t k,
                 const float* x,
                 int64_t ldx,
                 int64_t n,
                 float* y,
                 int64_t ldy) {
  constexpr int64_t kMaxK = 512;
  if (n < 4 || k > kMaxK) {
    kernel<uint16_t>(w, ldw, rows, k, x, ldx, n, y, ldy);
    return;
  }
  alignas(64) float buf[4 * kMaxK];
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    for (int i = 0; i < 4; ++i) {
      const uint16_t* src = w + (r + i) * ldw;
      float* dst = buf + i * k;
      int64_t c = 0;
      for (; c + 16 <= k; c += 16) _mm512_storeu_ps(dst + c, load_w(src + c));
      if (c < k) {
        const __mmask16 m = static_cast<__mmask16>((1u << (k - c)) - 1u);
        _mm512_mask_storeu_ps(dst + c, m, load_w_tail(src + c, m));
      }
    }
    row_block<4>(static_cast<const float*>(buf), k, k, x, ldx, n, y + r, ldy);
  }
  for (; r < rows; ++r) row_block<1>(w + r * ldw, ldw, k, x, ldx, n, y + r, ldy);
}

float dot(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(
        y + i,
        m,
        _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// Up to 4 heads against one key at a time: the key's chunks are loaded once for the heads.
template <int H>
void qk_heads(
    const float* q, const float* const* keys, int64_t nk, int64_t dim, float* s, int64_t lds) {
  for (int64_t j = 0; j < nk; ++j) {
    const float* k = keys[j];
    __m512 acc[H];
    for (int h = 0; h < H; ++h) acc[h] = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 16 <= dim; d += 16) {
      const __m512 kv = _mm512_loadu_ps(k + d);
      for (int h = 0; h < H; ++h)
        acc[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * dim + d), kv, acc[h]);
    }
    if (d < dim) {
      const __mmask16 m = static_cast<__mmask16>((1u << (dim - d)) - 1u);
      const __m512 kv = _mm512_maskz_loadu_ps(m, k + d);
      for (int h = 0; h < H; ++h) {
        acc[h] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + h * dim + d), kv, acc[h]);
      }
    }
    for (int h = 0; h < H; ++h) s[h * lds + j] = _mm512_reduce_add_ps(acc[h]);
  }
}

void qk(const float* q,
        int64_t heads,
        const float* const* keys,
        int64_t nk,
        int64_t dim,
        float* s,
        int64_t lds) {
  int64_t h = 0;
  for (; h + 4 <= heads; h += 4) qk_heads<4>(q + h * dim, keys, nk, dim, s + h * lds, lds);
  for (; h < heads; ++h) qk_heads<1>(q + h * dim, keys, nk, dim, s + h * lds, lds);
}

// Outer-product form: 4 heads x 64 dims of the output in 16 accumulators, keys streamed once.
template <int H>
void pv_heads(
    const float* p, int64_t ldp, const float* const* keys, int64_t nk, int64_t dim, float* out) {
  int64_t d = 0;
  for (; d + 64 <= dim; d += 64) {
    __m512 acc[H][4];
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < 4; ++c) acc[h][c] = _mm512_loadu_ps(out + h * dim + d + 16 * c);
    for (int64_t j = 0; j < nk; ++j) {
      const float* k = keys[j] + d;
      __m512 kv[4];
      for (int c = 0; c < 4; ++c) kv[c] = _mm512_loadu_ps(k + 16 * c);
      for (int h = 0; h < H; ++h) {
        const __m512 pb = _mm512_set1_ps(p[h * ldp + j]);
        for (int c = 0; c < 4; ++c) acc[h][c] = _mm512_fmadd_ps(pb, kv[c], acc[h][c]);
      }
    }
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out + h * dim + d + 16 * c, acc[h][c]);
  }
  if (d < dim) {  // the tail, one key at a time (the same FMA per element)
    for (int h = 0; h < H; ++h) {
      for (int64_t j = 0; j < nk; ++j)
        axpy(p[h * ldp + j], keys[j] + d, out + h * dim + d, dim - d);
    }
  }
}

void pv(const float* p,
        int64_t ldp,
        int64_t heads,
        const float* const* keys,
        int64_t nk,
        int64_t dim,
        float* out) {
  int64_t h = 0;
  for (; h + 4 <= heads; h += 4) pv_heads<4>(p + h * ldp, ldp, keys, nk, dim, out + h * dim);
  for (; h < heads; ++h) pv_heads<1>(p + h * ldp, ldp, keys, nk, dim, out + h * dim);
}

void hc_post(int64_t hc,
             int64_t hidden,
             const float* f,
             const float* x,
             const float* post,
             const float* comb,
             float* out) {
  for (int64_t k = 0; k < hc; ++k) {
    const __m512 pk = _mm512_set1_ps(post[k]);
    int64_t c = 0;
    for (; c + 16 <= hidden; c += 16) {
      __m512 acc = _mm512_mul_ps(pk, _mm512_loadu_ps(f + c));
      for (int64_t j = 0; j < hc; ++j) {
        acc = _mm512_fmadd_ps(
            _mm512_set1_ps(comb[j * hc + k]), _mm512_loadu_ps(x + j * hidden + c), acc);
      }
      _mm512_storeu_ps(out + k * hidden + c, acc);
    }
    for (; c < hidden; ++c) {
      float acc = post[k] * f[c];
      for (int64_t j = 0; j < hc; ++j) acc += comb[j * hc + k] * x[j * hidden + c];
      out[k * hidden + c] = acc;
    }
  }
}

// e^x for |x| <= 88: x = n ln2 + r (two-part ln2), e^r by its degree-6 Taylor polynomial on
// |r| <= ln2/2 (truncation below 2e-7 relative), times 2^n. Within a few ulp of expf.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

void swiglu(float* a, const float* u, int64_t n, float gate, float limit) {
  const __m512 gv = _mm512_set1_ps(gate);
  const __m512 one = _mm512_set1_ps(1.0f);
  const bool clamp = limit > 0.0f;
  const __m512 hi = _mm512_set1_ps(limit);
  const __m512 lo = _mm512_set1_ps(-limit);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m =
        n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 g = _mm512_maskz_loadu_ps(m, a + i);
    __m512 v = _mm512_maskz_loadu_ps(m, u + i);
    if (clamp) {
      g = _mm512_min_ps(g, hi);
      v = _mm512_max_ps(_mm512_min_ps(v, hi), lo);
    }
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(a + i, m, _mm512_mul_ps(_mm512_mul_ps(s, v), gv));
  }
}

}  // namespace

GemmKernels gemm_kernels_avx512() {
  return GemmKernels{&kernel<float>, &kernel_bf16, &dot, &axpy, &qk, &pv, &hc_post, &swiglu};
}

}  // namespace dsinfer::cpu::fast
