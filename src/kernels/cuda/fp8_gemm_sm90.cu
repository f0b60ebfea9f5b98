// The prefill-sized dense FP8 linears on Hopper's warpgroup MMA (fp8_gemm_sm90.h), built from
// CUTLASS's block-scaled FP8 GEMM for SM90: TMA loads into a multi-stage shared-memory pipeline,
// a producer warp and two consumer warpgroups (the "cooperative" schedule), persistent tiles (or
// split-K where a decode-sized token count leaves most SMs without a tile, fp8_gemm_sm90_gemm.h),
// and per-128-K promotion: each K block's wgmma partial is scaled by (activation scale x weight
// scale) and added to fp32 accumulators. Only compiled with CUTLASS (DSINFER_HAVE_CUTLASS).
#include <algorithm>
#include <string>

#include "kernels/cuda/fp8_gemm_sm90.h"
#include "kernels/cuda/fp8_gemm_sm90_gemm.cuh"
#include "kernels/cuda/launch_util.h"
#include "numeric/float_formats.h"

namespace dsinfer::cuda {
namespace fp8_sm90_detail {

Status run_persistent(const Problem& p, cudaStream_t stream) {
  return dense::run<dense::Dense<cutlass::gemm::PersistentScheduler>>(p, stream);
}

}  // namespace fp8_sm90_detail

namespace {

// Activation scales [n, ld/128] (K-major) -> [kb][sfa_ld] (M-major), and the weight's block
// scales (E8M0 or F32, [ceil(rows/128), ceil(cols/128)], from block row rb0) -> fp32
// [kb][nb] (N-major).
__global__ void prepare_scales_kernel(const float* xs,
                                      int64_t x_blocks_per_row,
                                      int64_t m,
                                      int64_t sfa_ld,
                                      const uint8_t* ws,
                                      bool ws_f32,
                                      int64_t w_blocks_per_row,
                                      int64_t rb0,
                                      int64_t nb,
                                      int64_t kb,
                                      float* sfa,
                                      float* sfb) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < kb * sfa_ld; i += stride) {
    const int64_t k = i / sfa_ld;
    const int64_t r = i % sfa_ld;
    sfa[i] = r < m ? xs[r * x_blocks_per_row + k] : 0.0f;
  }
  for (int64_t i = first; i < kb * nb; i += stride) {
    const int64_t k = i / nb;
    const int64_t j = (rb0 + i % nb) * w_blocks_per_row + k;
    sfb[i] = ws_f32 ? reinterpret_cast<const float*>(ws)[j] : numeric::e8m0_to_f32(ws[j]);
  }
}

int64_t sfa_ld_for(int64_t m) {
  return (m + 3) / 4 * 4;  // TMA: 16-byte aligned columns
}

// K ranges per output tile: 1 (persistent tiles) unless the tiles fill at most half of the SMs
// and K has at least 8 blocks; then as many ranges as the SMs hold (<= 16), each >= 4 K blocks.
int split_count(int64_t n, int64_t rows, int64_t k) {
  const int64_t tiles = ((n + 127) / 128) * ((rows + 127) / 128);
  const int64_t kb = k / 128;
  const int64_t sms = sm_count();
  if (2 * tiles > sms || kb < 8)
    return 1;
  const int64_t s = std::min<int64_t>({sms / tiles, kb / 4, 16});
  return s >= 2 ? static_cast<int>(s) : 1;
}

// Floats of scratch before the split-K workspace (256-byte aligned from the scratch's start).
int64_t scale_floats(int64_t n, int64_t k, int64_t rows) {
  const int64_t kb = (k + 127) / 128;
  return (kb * sfa_ld_for(n) + kb * ((rows + 127) / 128) + 63) / 64 * 64;
}

}  // namespace

bool fp8_gemm_sm90_supports(const MatrixRef& w, int64_t row_begin, int64_t rows, int64_t ldy) {
  return w.format == WeightFormat::kFp8Block128 && w.dtype == DType::kF8E4M3 &&
         (w.scale_dtype == DType::kF8E8M0 || w.scale_dtype == DType::kF32) && w.cols % 128 == 0 &&
         row_begin % 128 == 0 && rows % 16 == 0 && ldy % 4 == 0 &&
         (reinterpret_cast<uintptr_t>(w.data) & 15u) == 0;
}

int64_t fp8_gemm_sm90_min_scratch_floats(int64_t n, int64_t k, int64_t rows) {
  return scale_floats(n, k, rows) + 64;
}

namespace {

// The scratch floats of the launch's plan: the scales, and where K splits (*splits > 1) the
// split-K workspace after them.
int64_t plan_floats(int64_t n, int64_t k, int64_t rows, int* splits) {
  int64_t f = fp8_gemm_sm90_min_scratch_floats(n, k, rows);
  *splits = split_count(n, rows, k);
  if (*splits > 1 && n <= 0x7fffffff && rows <= 0x7fffffff && k <= 0x7fffffff) {
    const size_t ws = fp8_sm90_detail::split_workspace_bytes(
        static_cast<int>(n), static_cast<int>(rows), static_cast<int>(k), *splits);
    f += static_cast<int64_t>((ws + 255) / 256 * 64);
  }
  return f;
}

}  // namespace

int64_t fp8_gemm_sm90_scratch_floats(int64_t n, int64_t k, int64_t rows) {
  int splits = 1;
  return plan_floats(n, k, rows, &splits);
}

Status launch_fp8_gemm_sm90(const Fp8GemmSm90Args& a, cudaStream_t stream) {
  const int64_t k = a.w.cols;
  const int64_t kb = k / 128;
  const int64_t nb = (a.rows + 127) / 128;
  const int64_t sfa_ld = sfa_ld_for(a.n);
  if (a.scratch_floats < fp8_gemm_sm90_min_scratch_floats(a.n, k, a.rows))
    return invalid_argument("fp8_gemm_sm90: scratch too small");
  if (a.n > 0x7fffffff || a.rows > 0x7fffffff || k > 0x7fffffff || kb * sfa_ld > 0x7fffffff)
    return invalid_argument("fp8_gemm_sm90: problem exceeds 32-bit extents");
  float* sfa = a.scratch;
  float* sfb = sfa + kb * sfa_ld;
  const int64_t work = std::max(kb * sfa_ld, kb * nb);
  prepare_scales_kernel<<<static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, 1024)),
                          256,
                          0,
                          stream>>>(a.x.scales,
                                    a.x.ld / 128,
                                    a.n,
                                    sfa_ld,
                                    static_cast<const uint8_t*>(a.w.scale),
                                    a.w.scale_dtype == DType::kF32,
                                    (k + 127) / 128,
                                    a.row_begin / 128,
                                    nb,
                                    kb,
                                    sfa,
                                    sfb);
  DSI_RETURN_IF_ERROR(launched("fp8_gemm_sm90 scales"));

  fp8_sm90_detail::Problem p;
  p.a = a.x.codes;
  p.lda = a.x.ld;
  p.b = static_cast<const uint8_t*>(a.w.data) + a.row_begin * k;
  p.sfa = sfa;
  p.sfa_ld = sfa_ld;
  p.sfb = sfb;
  p.m = static_cast<int>(a.n);
  p.n = static_cast<int>(a.rows);
  p.k = static_cast<int>(k);
  p.d = a.y;
  p.ldd = a.ldy;
  p.accumulate = a.accumulate;
  // Split-K where the scratch also holds its workspace (sized for this row count), else whole K.
  int splits = 1;
  p.splits = a.scratch_floats >= plan_floats(a.n, k, a.rows, &splits) ? splits : 1;
  if (p.splits == 1)
    return fp8_sm90_detail::run_persistent(p, stream);
  // The workspace after the scales, 256-byte aligned.
  const auto base = reinterpret_cast<uintptr_t>(a.scratch + scale_floats(a.n, k, a.rows));
  p.workspace = reinterpret_cast<void*>((base + 255) / 256 * 256);
  return fp8_sm90_detail::run_split(p, stream);
}

}  // namespace dsinfer::cuda
