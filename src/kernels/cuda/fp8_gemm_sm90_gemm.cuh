// fp8_gemm_sm90_gemm.h's kernel types and their launch, included by the two .cu files only.
#pragma once

#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/numeric_types.h"
#include "kernels/cuda/fp8_gemm_sm90_gemm.h"
#include "kernels/cuda/launch_util.h"

namespace dsinfer::cuda::fp8_sm90_detail {
namespace dense {

using namespace cute;

// A = FP8 activations (tokens, K-major), B = FP8 weights (K-major), D fp32 row-major.
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

template <class Scheduler>
struct Dense {
  using Kernel = cutlass::gemm::kernel::
      GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static constexpr bool kSplit = std::is_same_v<Scheduler, cutlass::gemm::StreamKScheduler>;
};

template <class D>
typename D::Gemm::Arguments make_args(const Problem& p) {
  const int kb = p.k / 128;
  const int nb = (p.n + 127) / 128;
  const auto stride_a = make_stride(p.lda, Int<1>{}, int64_t{0});
  const auto stride_b = make_stride(static_cast<int64_t>(p.k), Int<1>{}, int64_t{0});
  const auto stride_d = make_stride(p.ldd, Int<1>{}, int64_t{0});
  const int sfa_ld = static_cast<int>(p.sfa_ld);
  // The scale columns are sfa_ld long (a multiple of 4, zeros past m): TMA needs 16-byte extents.
  const LayoutSFA layout_sfa = make_layout(
      make_shape(make_shape(Int<1>{}, sfa_ld), make_shape(Int<128>{}, kb), 1),
      make_stride(make_stride(Int<0>{}, Int<1>{}), make_stride(Int<0>{}, sfa_ld), kb * sfa_ld));
  const LayoutSFB layout_sfb =
      make_layout(make_shape(make_shape(Int<128>{}, nb), make_shape(Int<128>{}, kb), 1),
                  make_stride(make_stride(Int<0>{}, Int<1>{}), make_stride(Int<0>{}, nb), kb * nb));
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count();
  typename D::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                   {p.m, p.n, p.k, 1},
                                   {reinterpret_cast<const ElementA*>(p.a),
                                    stride_a,
                                    reinterpret_cast<const ElementB*>(p.b),
                                    stride_b,
                                    p.sfa,
                                    layout_sfa,
                                    p.sfb,
                                    layout_sfb},
                                   {{}, p.d, stride_d, p.d, stride_d},
                                   hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = p.accumulate ? 1.0f : 0.0f;
  if constexpr (D::kSplit) {
    using Sched = typename D::Kernel::TileScheduler;
    args.scheduler.splits = p.splits;
    args.scheduler.decomposition_mode = Sched::DecompositionMode::SplitK;
    args.scheduler.reduction_mode = Sched::ReductionMode::Deterministic;
  }
  return args;
}

template <class D>
Status run(const Problem& p, cudaStream_t stream) {
  const auto args = make_args<D>(p);
  typename D::Gemm gemm;
  const size_t ws = D::Gemm::get_workspace_size(args);
  if (ws > 0 && p.workspace == nullptr)
    return failed_precondition("fp8_gemm_sm90: the kernel asks for a workspace");
  if (gemm.can_implement(args) != cutlass::Status::kSuccess)
    return invalid_argument("fp8_gemm_sm90: shape not supported (m " + std::to_string(p.m) +
                            ", n " + std::to_string(p.n) + ", k " + std::to_string(p.k) + ")");
  if (gemm.initialize(args, ws > 0 ? p.workspace : nullptr, stream) != cutlass::Status::kSuccess)
    return failed_precondition("fp8_gemm_sm90: initialize failed");
  const cutlass::Status st = gemm.run(stream);
  DSI_RETURN_IF_ERROR(launched("fp8_gemm_sm90 launch"));
  if (st != cutlass::Status::kSuccess)
    return failed_precondition("fp8_gemm_sm90: launch failed");
  return Status();
}

}  // namespace dense
}  // namespace dsinfer::cuda::fp8_sm90_detail
