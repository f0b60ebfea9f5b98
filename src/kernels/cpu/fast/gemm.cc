// Fast CPU GEMM: the run-time choice of kernels, the portable kernels and the split over rows.
#include "kernels/cpu/fast/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/fast/thread_pool.h"

namespace dsinfer::cpu::fast {
namespace {

float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
float as_f32(float v) {
  return v;
}
float as_f32(uint16_t v) {
  return bf16_to_f32(v);
}

// Portable: eight partial sums per output (vectorisable without -ffast-math).
template <typename W>
void portable_kernel(const W* w,
                     int64_t ldw,
                     int64_t rows,
                     int64_t k,
                     const float* x,
                     int64_t ldx,
                     int64_t n,
                     float* y,
                     int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    const W* wr = w + r * ldw;
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * ldx;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t c = 0;
      for (; c + 8 <= k; c += 8) {
        for (int i = 0; i < 8; ++i) acc[i] += as_f32(wr[c + i]) * xt[c + i];
      }
      float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
      for (; c < k; ++c) s += as_f32(wr[c]) * xt[c];
      y[t * ldy + r] = s;
    }
  }
}

float portable_dot(const float* a, const float* b, int64_t n) {
  return dot8(a, b, n);
}

void portable_axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// qk / pv from a table's dot and axpy (AVX2 and portable tables).
template <const GemmKernels& (*K)()>
void generic_qk(const float* q,
                int64_t heads,
                const float* const* keys,
                int64_t nk,
                int64_t dim,
                float* s,
                int64_t lds) {
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < nk; ++j) s[h * lds + j] = K().dot(q + h * dim, keys[j], dim);
  }
}
template <const GemmKernels& (*K)()>
void generic_pv(const float* p,
                int64_t ldp,
                int64_t heads,
                const float* const* keys,
                int64_t nk,
                int64_t dim,
                float* out) {
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < nk; ++j) K().axpy(p[h * ldp + j], keys[j], out + h * dim, dim);
  }
}

// hc_post with the loops turned so that the inner one runs along the hidden dimension.
void portable_hc_post(int64_t hc,
                      int64_t hidden,
                      const float* f,
                      const float* x,
                      const float* post,
                      const float* comb,
                      float* out) {
  for (int64_t k = 0; k < hc; ++k) {
    float* o = out + k * hidden;
    const float pk = post[k];
    for (int64_t c = 0; c < hidden; ++c) o[c] = pk * f[c];
    for (int64_t j = 0; j < hc; ++j) {
      const float cjk = comb[j * hc + k];
      const float* xj = x + j * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] += cjk * xj[c];
    }
  }
}

void portable_swiglu(float* a, const float* u, int64_t n, float gate, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    float g = a[i];
    float v = u[i];
    if (limit > 0.0f) {
      g = std::min(g, limit);
      v = std::clamp(v, -limit, limit);
    }
    a[i] = g / (1.0f + std::exp(-g)) * v * gate;
  }
}

GemmKernels with_generic_ops(GemmKernels k) {
  if (!k.swiglu)
    k.swiglu = &portable_swiglu;
  if (!k.hc_post)
    k.hc_post = &portable_hc_post;
  if (!k.qk)
    k.qk = &generic_qk<&active_kernels>;
  if (!k.pv)
    k.pv = &generic_pv<&active_kernels>;
  return k;
}

GemmKernels pick() {
#if defined(__x86_64__)
  if (const char* env = std::getenv("DSINFER_CPU_ISA"); env && *env) {
    if (std::strcmp(env, "portable") == 0)
      return gemm_kernels_portable();
    if (std::strcmp(env, "avx2") == 0 && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
      return gemm_kernels_avx2();
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return gemm_kernels_avx512();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return gemm_kernels_avx2();
#endif
  return gemm_kernels_portable();
}

}  // namespace

const GemmKernels& active_kernels() {
  static const GemmKernels k = with_generic_ops(pick());
  return k;
}

GemmKernels gemm_kernels_portable() {
  return GemmKernels{&portable_kernel<float>,
                     &portable_kernel<uint16_t>,
                     &portable_dot,
                     &portable_axpy,
                     nullptr,
                     nullptr,
                     nullptr,
                     nullptr};
}

const char* gemm_isa() {
  const GemmKernels& k = active_kernels();
  if (k.f32 == gemm_kernels_portable().f32)
    return "portable";
#if defined(__x86_64__)
  if (k.f32 == gemm_kernels_avx512().f32)
    return "avx512";
#endif
  return "avx2";
}

WeightView WeightView::slice_rows(int64_t begin, int64_t count) const {
  DSI_CHECK(begin >= 0 && count >= 0 && begin + count <= rows,
            "rows [%lld, +%lld) of %lld",
            static_cast<long long>(begin),
            static_cast<long long>(count),
            static_cast<long long>(rows));
  WeightView v = *this;
  const size_t esize = elem == WeightElem::kF32 ? 4 : 2;
  v.data = static_cast<const char*>(data) + static_cast<size_t>(begin * ld) * esize;
  v.rows = count;
  return v;
}

void gemm(const WeightView& w,
          const float* x,
          int64_t ldx,
          int64_t n,
          float* y,
          int64_t ldy,
          ThreadPool* pool) {
  DSI_CHECK(w.data != nullptr, "gemm on an unbound weight");
  if (n <= 0 || w.rows <= 0)
    return;
  const GemmKernels& kk = active_kernels();
  auto run_rows = [&](int64_t r0, int64_t r1) {
    if (w.elem == WeightElem::kF32) {
      kk.f32(static_cast<const float*>(w.data) + r0 * w.ld,
             w.ld,
             r1 - r0,
             w.cols,
             x,
             ldx,
             n,
             y + r0,
             ldy);
    } else {
      kk.bf16(static_cast<const uint16_t*>(w.data) + r0 * w.ld,
              w.ld,
              r1 - r0,
              w.cols,
              x,
              ldx,
              n,
              y + r0,
              ldy);
    }
  };
  // Below ~1M multiply-adds (some 20 us on one core) waking a worker costs more than it saves,
  // more so on a loaded machine where the worker may not be scheduled at once.
  const int64_t work = w.rows * w.cols * n;
  const int threads = pool ? pool->threads() : 1;
  if (threads <= 1 || work < kMinParallelWork || w.rows < 32) {
    run_rows(0, w.rows);
    return;
  }
  // Chunks of whole 16-row groups, a few per thread (dynamic balance on shared cores).
  const int64_t groups = (w.rows + 15) / 16;
  const int64_t tasks = std::min<int64_t>(groups, 4 * threads);
  pool->run(tasks, [&](int64_t t) {
    const int64_t g0 = groups * t / tasks;
    const int64_t g1 = groups * (t + 1) / tasks;
    run_rows(std::min(g0 * 16, w.rows), std::min(g1 * 16, w.rows));
  });
}

}  // namespace dsinfer::cpu::fast
