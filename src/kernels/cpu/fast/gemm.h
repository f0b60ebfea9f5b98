// Fast CPU GEMMs for the linears: y[t, r] = sum_k W[r, k] * x[t, k] with W in a fast layout
// (fp32 or bf16, row-major; see packed_weights.h) and fp32 activations and accumulation.
//
// One call covers every row of a step, so each weight row is read once per step and reused
// from cache across the tokens. The work is split over output rows (never over k), and every
// output element is the same chain of vector FMAs whatever n, the tile or the thread: results
// are bit-identical for a token whether it runs alone or in a batch (batch invariance).
// Kernels: AVX-512 (16 lanes), AVX2+FMA (8 lanes) or portable loops, chosen once at run time.
#pragma once

#include <cstdint>

namespace dsinfer {
class ThreadPool;
}  // namespace dsinfer

namespace dsinfer::cpu::fast {

using ThreadPool = dsinfer::ThreadPool;

enum class WeightElem { kF32, kBF16 };

// A row-major weight in a fast layout: rows x cols, row stride ld (elements).
struct WeightView {
  WeightElem elem = WeightElem::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  // Rows [begin, begin + count) as a view of their own.
  WeightView slice_rows(int64_t begin, int64_t count) const;
};

// GEMMs with fewer multiply-adds than this run on the calling thread.
constexpr int64_t kMinParallelWork = int64_t{1} << 20;

// y[t * ldy + r] = sum_k w[r, k] * x[t * ldx + k] for t < n, r < w.rows. pool may be null
// (single-threaded); small problems run on the calling thread.
void gemm(const WeightView& w,
          const float* x,
          int64_t ldx,
          int64_t n,
          float* y,
          int64_t ldy,
          ThreadPool* pool);

// The instruction set in use: "avx512", "avx2" or "portable".
const char* gemm_isa();

// Kernel entry points of one instruction set (one translation unit each). Rows [0, rows) of w
// (row stride ldw) into y[t * ldy + r].
struct GemmKernels {
  void (*f32)(const float* w,
              int64_t ldw,
              int64_t rows,
              int64_t k,
              const float* x,
              int64_t ldx,
              int64_t n,
              float* y,
              int64_t ldy);
  void (*bf16)(const uint16_t* w,
               int64_t ldw,
               int64_t rows,
               int64_t k,
               const float* x,
               int64_t ldx,
               int64_t n,
               float* y,
               int64_t ldy);
  // The attention's vector ops: sum_i a[i] * b[i] (a fixed order per n), y[i] += a * x[i].
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  // One query row's attention over nk keys given by pointers (each dim wide):
  // qk: s[h * lds + j] = q[h * dim : +dim] . keys[j]  for h < heads, j < nk;
  // pv: out[h * dim + d] += sum_j p[h * ldp + j] * keys[j][d], j ascending for every element.
  void (*qk)(const float* q,
             int64_t heads,
             const float* const* keys,
             int64_t nk,
             int64_t dim,
             float* s,
             int64_t lds);
  void (*pv)(const float* p,
             int64_t ldp,
             int64_t heads,
             const float* const* keys,
             int64_t nk,
             int64_t dim,
             float* out);
  // mHC post step for one token (kernels/cpu/mhc.h hc_post):
  // out[k] = post[k] * f + sum_j comb[j, k] * x[j], j ascending.
  void (*hc_post)(int64_t hc,
                  int64_t hidden,
                  const float* f,
                  const float* x,
                  const float* post,
                  const float* comb,
                  float* out);
  // The expert's activation (backend/cpu CpuModel::expert): with limit > 0, g = min(a, limit)
  // and v = clamp(u, -limit, limit); a[i] = silu(g) * v * gate.
  void (*swiglu)(float* a, const float* u, int64_t n, float gate, float limit);
};
// The kernels in use (the same choice as gemm()).
const GemmKernels& active_kernels();
GemmKernels gemm_kernels_avx512();
GemmKernels gemm_kernels_avx2();
GemmKernels gemm_kernels_portable();

}  // namespace dsinfer::cpu::fast
