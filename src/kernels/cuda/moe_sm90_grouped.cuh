// Definitions of moe_sm90_grouped.h's templates; included by the one .cu per granularity only.
#pragma once

#include <algorithm>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/moe_sm90_grouped.h"

namespace dsinfer::cuda::moe_sm90_detail {
namespace grouped {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;
using ElementA = cutlass::float_e4m3_t;
using ElementB = cutlass::float_e4m3_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;
using ClusterShape = Shape<_1, _1, _1>;

// Activations: one scale per row and 128-K block; weights: one per kScaleRows rows and 128-K block.
template <int kScaleRows>
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleRows, 128>;

// One grouped GEMM configuration: the tile and the kernel / epilogue schedules.
template <int kScaleRows, class TileShape, class KernelSchedule, class EpilogueSchedule>
struct GroupedGemm {
  using LayoutSFA = decltype(ScaleConfig<kScaleRows>::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig<kScaleRows>::deduce_layoutSFB());
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90,
      cutlass::arch::OpClassTensorOp,
      TileShape,
      ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto,
      float,
      float,
      float,
      LayoutD*,
      4,
      float,
      LayoutD*,
      4,
      EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<float, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90,
      cutlass::arch::OpClassTensorOp,
      ElementA,
      cute::tuple<LayoutA*, LayoutSFA*>,
      16,
      ElementB,
      cute::tuple<LayoutB*, LayoutSFB*>,
      16,
      float,
      TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// 128-row tiles, both consumer warpgroups on one tile (cooperative).
template <int kScaleRows>
using Coop128 = GroupedGemm<kScaleRows,
                            Shape<_128, _128, _128>,
                            cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                            cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
// 64-row tiles, the two consumer warpgroups on alternate tiles (ping-pong: one's epilogue
// overlaps the other's main loop). An expert's ~190 rows at 8k tokens fill three 64-row tiles
// where they leave the second of two 128-row tiles half empty.
template <int kScaleRows>
using Ping64 = GroupedGemm<kScaleRows,
                           Shape<_64, _128, _128>,
                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                           cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;

// The per-expert argument arrays of one grouped GEMM.
template <int kScaleRows>
struct GroupArrays {
  using Cfg = Coop128<kScaleRows>;
  using StrideA = typename Cfg::Kernel::InternalStrideA;
  using StrideB = typename Cfg::Kernel::InternalStrideB;
  using StrideD = typename Cfg::Kernel::InternalStrideD;
  using LayoutSFA = typename Cfg::LayoutSFA;
  using LayoutSFB = typename Cfg::LayoutSFB;
  static_assert(std::is_same_v<StrideA, typename Ping64<kScaleRows>::Kernel::InternalStrideA> &&
                std::is_same_v<StrideB, typename Ping64<kScaleRows>::Kernel::InternalStrideB> &&
                std::is_same_v<StrideD, typename Ping64<kScaleRows>::Kernel::InternalStrideD>);

  Shape3* shapes;
  const ElementA** a;
  const ElementB** b;
  const float** sfa;
  const float** sfb;
  float** d;
  StrideA* sa;
  StrideB* sb;
  StrideD* sd;
  LayoutSFA* lsfa;
  LayoutSFB* lsfb;

  static size_t bytes(int64_t ne) {
    const size_t n = static_cast<size_t>(ne);
    return n * (sizeof(Shape3) + 5 * sizeof(void*) + sizeof(StrideA) + sizeof(StrideB) +
                sizeof(StrideD) + sizeof(LayoutSFA) + sizeof(LayoutSFB)) +
           11 * 16;
  }

  static GroupArrays carve(uint8_t* base, int64_t ne) {
    const size_t n = static_cast<size_t>(ne);
    auto take = [&](size_t bytes) {
      uint8_t* p = base;
      base += (bytes + 15) / 16 * 16;
      return p;
    };
    GroupArrays g;
    g.shapes = reinterpret_cast<Shape3*>(take(n * sizeof(Shape3)));
    g.a = reinterpret_cast<const ElementA**>(take(n * sizeof(void*)));
    g.b = reinterpret_cast<const ElementB**>(take(n * sizeof(void*)));
    g.sfa = reinterpret_cast<const float**>(take(n * sizeof(void*)));
    g.sfb = reinterpret_cast<const float**>(take(n * sizeof(void*)));
    g.d = reinterpret_cast<float**>(take(n * sizeof(void*)));
    g.sa = reinterpret_cast<StrideA*>(take(n * sizeof(StrideA)));
    g.sb = reinterpret_cast<StrideB*>(take(n * sizeof(StrideB)));
    g.sd = reinterpret_cast<StrideD*>(take(n * sizeof(StrideD)));
    g.lsfa = reinterpret_cast<LayoutSFA*>(take(n * sizeof(LayoutSFA)));
    g.lsfb = reinterpret_cast<LayoutSFB*>(take(n * sizeof(LayoutSFB)));
    return g;
  }
};

template <class Cfg, class Arrays>
typename Cfg::Gemm::Arguments make_args(int64_t ne, const Arrays& g) {
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count();
  typename Cfg::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                     {static_cast<int>(ne), g.shapes, nullptr},
                                     {g.a, g.sa, g.b, g.sb, g.sfa, g.lsfa, g.sfb, g.lsfb},
                                     {{}, nullptr, g.sd, g.d, g.sd},
                                     hw};
  auto& f = args.epilogue.thread;
  f.alpha = 1.0f;
  f.beta = 0.0f;
  f.alpha_ptr = nullptr;
  f.beta_ptr = nullptr;
  f.alpha_ptr_array = nullptr;
  f.beta_ptr_array = nullptr;
  f.dAlpha = {cute::_0{}, cute::_0{}, 0};
  f.dBeta = {cute::_0{}, cute::_0{}, 0};
  return args;
}

// One grouped GEMM over the arrays g, with the CUTLASS workspace ws.
template <class Cfg, class Arrays>
Status run_grouped(int64_t ne, const Arrays& g, void* ws, cudaStream_t stream) {
  auto args = make_args<Cfg>(ne, g);
  typename Cfg::Gemm gemm;
  if (gemm.initialize(args, ws, stream) != cutlass::Status::kSuccess)
    return failed_precondition("moe_sm90: grouped GEMM initialize failed");
  const cutlass::Status st = gemm.run(stream);
  DSI_RETURN_IF_ERROR(launched("moe_sm90 grouped GEMM"));
  if (st != cutlass::Status::kSuccess)
    return failed_precondition("moe_sm90: grouped GEMM launch failed");
  return Status();
}

// A K-major (or row-major D) stride with leading dimension ld; the batch mode is unused (L = 1).
template <class Stride>
__device__ __forceinline__ Stride row_stride(int64_t ld) {
  Stride s{};
  cute::get<0>(s) = ld;
  return s;
}

// expert_begin[e], or with a null table one expert over all pairs.
__device__ __forceinline__ int64_t begin_of(const MoeSm90Params& p, int64_t e) {
  return p.expert_begin ? p.expert_begin[e] : (e == 0 ? 0 : p.num_pairs);
}

template <int kScaleRows>
__global__ void setup_kernel(MoeSm90Params p,
                             Buffers s,
                             GroupArrays<kScaleRows> g1,
                             GroupArrays<kScaleRows> g2) {
  using G = GroupArrays<kScaleRows>;
  using SC = ScaleConfig<kScaleRows>;
  const MoeFp8Weights& w = p.w;
  float* y = p.y;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= w.n_experts)
    return;
  const int64_t b = begin_of(p, e);
  const int m = static_cast<int>(begin_of(p, e + 1) - b);
  const int H = static_cast<int>(w.hidden);
  const int I = static_cast<int>(w.inter);
  g1.shapes[e] = Shape3(m, 2 * I, H);
  g2.shapes[e] = Shape3(m, H, I);
  const bool any = m > 0;
  g1.a[e] = any ? reinterpret_cast<const ElementA*>(s.a1 + b * H) : nullptr;
  g1.b[e] = reinterpret_cast<const ElementB*>(w.w13 + e * 2 * I * static_cast<int64_t>(H));
  g1.sfa[e] = any ? s.sfa1 + b * (H / 128) : nullptr;
  g1.sfb[e] = w.s13 + e * (H / 128) * static_cast<int64_t>(2 * I / kScaleRows);
  g1.d[e] = any ? s.d1 + b * 2 * I : nullptr;
  g2.a[e] = any ? reinterpret_cast<const ElementA*>(s.hq + b * I) : nullptr;
  g2.b[e] = reinterpret_cast<const ElementB*>(w.w2 + e * static_cast<int64_t>(H) * I);
  g2.sfa[e] = any ? s.sfa2 + b * (I / 128) : nullptr;
  g2.sfb[e] = w.s2 + e * (I / 128) * static_cast<int64_t>(H / kScaleRows);
  g2.d[e] = any ? y + b * H : nullptr;
  g1.sa[e] = row_stride<typename G::StrideA>(H);
  g1.sb[e] = row_stride<typename G::StrideB>(H);
  g1.sd[e] = row_stride<typename G::StrideD>(2 * I);
  g2.sa[e] = row_stride<typename G::StrideA>(I);
  g2.sb[e] = row_stride<typename G::StrideB>(I);
  g2.sd[e] = row_stride<typename G::StrideD>(H);
  g1.lsfa[e] = SC::tile_atom_to_shape_SFA(make_shape(m, 2 * I, H, 1));
  g1.lsfb[e] = SC::tile_atom_to_shape_SFB(make_shape(m, 2 * I, H, 1));
  g2.lsfa[e] = SC::tile_atom_to_shape_SFA(make_shape(m, H, I, 1));
  g2.lsfb[e] = SC::tile_atom_to_shape_SFB(make_shape(m, H, I, 1));
}

}  // namespace grouped

template <int kScaleRows>
size_t Grouped<kScaleRows>::arrays_bytes(int64_t n_experts) {
  return grouped::GroupArrays<kScaleRows>::bytes(n_experts);
}

template <int kScaleRows>
size_t Grouped<kScaleRows>::workspace_bytes(int64_t n_experts) {
  using namespace grouped;
  // The workspace size depends on the group count and the SMs only, not on the pointers.
  const auto g = GroupArrays<kScaleRows>::carve(nullptr, n_experts);
  return std::max(
      Coop128<kScaleRows>::Gemm::get_workspace_size(make_args<Coop128<kScaleRows>>(n_experts, g)),
      Ping64<kScaleRows>::Gemm::get_workspace_size(make_args<Ping64<kScaleRows>>(n_experts, g)));
}

template <int kScaleRows>
void Grouped<kScaleRows>::setup(const MoeSm90Params& p, const Buffers& b, cudaStream_t stream) {
  using G = grouped::GroupArrays<kScaleRows>;
  const int64_t ne = p.w.n_experts;
  grouped::setup_kernel<kScaleRows><<<static_cast<unsigned>((ne + 127) / 128), 128, 0, stream>>>(
      p, b, G::carve(b.g1, ne), G::carve(b.g2, ne));
}

template <int kScaleRows>
Status Grouped<kScaleRows>::run(
    int pass, bool ping64, int64_t n_experts, const Buffers& b, cudaStream_t stream) {
  using namespace grouped;
  const auto g = GroupArrays<kScaleRows>::carve(pass == 0 ? b.g1 : b.g2, n_experts);
  return ping64 ? run_grouped<Ping64<kScaleRows>>(n_experts, g, b.ws, stream)
                : run_grouped<Coop128<kScaleRows>>(n_experts, g, b.ws, stream);
}

}  // namespace dsinfer::cuda::moe_sm90_detail
