// The prefill-sized dense FP8 linears on Hopper's warpgroup MMA (fp8_gemm_sm90.h), built from
// CUTLASS's block-scaled FP8 GEMM for SM90: TMA loads into a multi-stage shared-memory pipeline,
// a producer warp and two consumer warpgroups (the "cooperative" schedule), persistent tiles,
// and per-128-K promotion: each K block's wgmma partial is scaled by (activation scale x weight
// scale) and added to fp32 accumulators. Only compiled with CUTLASS (DSINFER_HAVE_CUTLASS).
#include <algorithm>
#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"
#include "kernels/cuda/fp8_gemm_sm90.h"
#include "kernels/cuda/launch_util.h"
#include "numeric/float_formats.h"

namespace dsinfer::cuda {
namespace {

using namespace cute;

// Problem: D[m, n] = sum_k A[m, k] B[n, k] sa[m, k/128] sb[n/128, k/128]; A = FP8 activations
// (tokens, K-major), B = FP8 weights (K-major), D fp32 row-major (tokens x outputs).
using ElementA = cutlass::float_e4m3_t;
using ElementB = cutlass::float_e4m3_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using ElementC = float;
using LayoutC = cutlass::layout::RowMajor;
using ElementAcc = float;
constexpr int kAlignAB = 16;
constexpr int kAlignC = 4;

using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_1, _1, _1>;
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128>;  // M-major scales
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90,
    cutlass::arch::OpClassTensorOp,
    TileShape,
    ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto,
    ElementAcc,
    float,
    ElementC,
    LayoutC,
    kAlignC,
    ElementC,
    LayoutC,
    kAlignC,
    cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90,
    cutlass::arch::OpClassTensorOp,
    ElementA,
    cute::tuple<LayoutA, LayoutSFA>,
    kAlignAB,
    ElementB,
    cute::tuple<LayoutB, LayoutSFB>,
    kAlignAB,
    ElementAcc,
    TileShape,
    ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

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

}  // namespace

bool fp8_gemm_sm90_supports(const MatrixRef& w, int64_t row_begin, int64_t rows, int64_t ldy) {
  return w.format == WeightFormat::kFp8Block128 && w.dtype == DType::kF8E4M3 &&
         (w.scale_dtype == DType::kF8E8M0 || w.scale_dtype == DType::kF32) && w.cols % 128 == 0 &&
         row_begin % 128 == 0 && rows % 16 == 0 && ldy % 4 == 0 &&
         (reinterpret_cast<uintptr_t>(w.data) & 15u) == 0;
}

int64_t fp8_gemm_sm90_scratch_floats(int64_t n, int64_t k, int64_t rows) {
  const int64_t kb = (k + 127) / 128;
  return kb * sfa_ld_for(n) + kb * ((rows + 127) / 128) + 64;
}

Status launch_fp8_gemm_sm90(const Fp8GemmSm90Args& a, cudaStream_t stream) {
  const int64_t k = a.w.cols;
  const int64_t kb = k / 128;
  const int64_t nb = (a.rows + 127) / 128;
  const int64_t sfa_ld = sfa_ld_for(a.n);
  if (a.scratch_floats < fp8_gemm_sm90_scratch_floats(a.n, k, a.rows))
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

  const int m = static_cast<int>(a.n);
  const int n = static_cast<int>(a.rows);
  const int kk = static_cast<int>(k);
  const auto stride_a = make_stride(static_cast<int64_t>(a.x.ld), Int<1>{}, int64_t{0});
  const auto stride_b = make_stride(static_cast<int64_t>(k), Int<1>{}, int64_t{0});
  const auto stride_d = make_stride(static_cast<int64_t>(a.ldy), Int<1>{}, int64_t{0});
  // The scale columns are sfa_ld long (a multiple of 4, zeros past m): TMA needs 16-byte extents.
  const LayoutSFA layout_sfa =
      make_layout(make_shape(make_shape(Int<1>{}, static_cast<int>(sfa_ld)),
                             make_shape(Int<128>{}, static_cast<int>(kb)),
                             1),
                  make_stride(make_stride(Int<0>{}, Int<1>{}),
                              make_stride(Int<0>{}, static_cast<int>(sfa_ld)),
                              static_cast<int>(kb * sfa_ld)));
  const LayoutSFB layout_sfb = make_layout(make_shape(make_shape(Int<128>{}, static_cast<int>(nb)),
                                                      make_shape(Int<128>{}, static_cast<int>(kb)),
                                                      1),
                                           make_stride(make_stride(Int<0>{}, Int<1>{}),
                                                       make_stride(Int<0>{}, static_cast<int>(nb)),
                                                       static_cast<int>(kb * nb)));
  const auto* w_data = static_cast<const uint8_t*>(a.w.data) + a.row_begin * k;
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {m, n, kk, 1},
                                {reinterpret_cast<const ElementA*>(a.x.codes),
                                 stride_a,
                                 reinterpret_cast<const ElementB*>(w_data),
                                 stride_b,
                                 sfa,
                                 layout_sfa,
                                 sfb,
                                 layout_sfb},
                                {{}, a.y, stride_d, a.y, stride_d}};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = a.accumulate ? 1.0f : 0.0f;
  Gemm gemm;
  if (Gemm::get_workspace_size(args) > 0)
    return failed_precondition("fp8_gemm_sm90: the kernel asks for a workspace");
  if (gemm.can_implement(args) != cutlass::Status::kSuccess)
    return invalid_argument("fp8_gemm_sm90: shape not supported (m " + std::to_string(m) + ", n " +
                            std::to_string(n) + ", k " + std::to_string(kk) + ")");
  if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess)
    return failed_precondition("fp8_gemm_sm90: initialize failed");
  const cutlass::Status st = gemm.run(stream);
  DSI_RETURN_IF_ERROR(launched("fp8_gemm_sm90 launch"));
  if (st != cutlass::Status::kSuccess)
    return failed_precondition("fp8_gemm_sm90: launch failed");
  return Status();
}

}  // namespace dsinfer::cuda
