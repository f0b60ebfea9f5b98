// The many-row BF16x2 linears on Hopper's wgmma (bf16_gemm_sm90.h), from CUTLASS's SM90 TMA
// warp-specialised GEMM: y = W hi (+ y) then y += W lo, one launch pair per group. Only compiled
// with CUTLASS (DSINFER_HAVE_CUTLASS).
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"
#include "kernels/cuda/bf16_gemm_sm90.h"
#include "kernels/cuda/launch_util.h"

namespace dsinfer::cuda {
namespace {

using namespace cute;

using ElementAB = cutlass::bfloat16_t;
using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_1, _1, _1>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90,
    cutlass::arch::OpClassTensorOp,
    TileShape,
    ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto,
    float,
    float,
    float,
    cutlass::layout::RowMajor,
    4,
    float,
    cutlass::layout::RowMajor,
    4,
    cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90,
    cutlass::arch::OpClassTensorOp,
    ElementAB,
    cutlass::layout::RowMajor,
    8,
    ElementAB,
    cutlass::layout::ColumnMajor,
    8,
    float,
    TileShape,
    ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

// y[:, g * group_y + r] (+)= sum_c w[g * rows + r, c] x[:, g * group_x + c] for one group g.
Status run_pass(
    const Bf16GemmSm90Args& a, int64_t g, const uint16_t* x, bool accumulate, cudaStream_t s) {
  const int m = static_cast<int>(a.n);
  const int n = static_cast<int>(a.rows);
  const int k = static_cast<int>(a.k);
  const auto stride_a = make_stride(static_cast<int64_t>(a.x_ld), Int<1>{}, int64_t{0});
  const auto stride_b = make_stride(static_cast<int64_t>(a.w_ld), Int<1>{}, int64_t{0});
  const auto stride_d = make_stride(static_cast<int64_t>(a.ldy), Int<1>{}, int64_t{0});
  float* y = a.y + g * a.group_y;
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {m, n, k, 1},
                                {reinterpret_cast<const ElementAB*>(x + g * a.group_x),
                                 stride_a,
                                 reinterpret_cast<const ElementAB*>(a.w + g * a.rows * a.w_ld),
                                 stride_b},
                                {{}, y, stride_d, y, stride_d}};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = accumulate ? 1.0f : 0.0f;
  Gemm gemm;
  if (Gemm::get_workspace_size(args) > 0)
    return failed_precondition("bf16_gemm_sm90: the kernel asks for a workspace");
  if (gemm.can_implement(args) != cutlass::Status::kSuccess)
    return invalid_argument("bf16_gemm_sm90: shape not supported");
  if (gemm.initialize(args, nullptr, s) != cutlass::Status::kSuccess)
    return failed_precondition("bf16_gemm_sm90: initialize failed");
  const cutlass::Status st = gemm.run(s);
  DSI_RETURN_IF_ERROR(launched("bf16_gemm_sm90 launch"));
  if (st != cutlass::Status::kSuccess)
    return failed_precondition("bf16_gemm_sm90: launch failed");
  return Status();
}

}  // namespace

bool bf16_gemm_sm90_supports(const Bf16GemmSm90Args& a) {
  auto aligned16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return a.n > 0 && a.rows > 0 && a.k > 0 && a.groups >= 1 && a.k % 8 == 0 && a.x_ld % 8 == 0 &&
         a.w_ld % 8 == 0 && a.group_x % 8 == 0 && a.ldy % 4 == 0 && a.group_y % 4 == 0 &&
         aligned16(a.w) && aligned16(a.x_hi) && aligned16(a.x_lo) && aligned16(a.y) &&
         a.n <= 0x7fffffff && a.rows <= 0x7fffffff;
}

Status launch_bf16_gemm_sm90(const Bf16GemmSm90Args& a, cudaStream_t stream) {
  if (!bf16_gemm_sm90_supports(a))
    return invalid_argument("bf16_gemm_sm90: unsupported shape or alignment");
  for (int64_t g = 0; g < a.groups; ++g) {
    DSI_RETURN_IF_ERROR(run_pass(a, g, a.x_hi, a.accumulate, stream));
    if (a.x_lo != nullptr)  // null: BF16-exact activations, one pass
      DSI_RETURN_IF_ERROR(run_pass(a, g, a.x_lo, true, stream));
  }
  return Status();
}

}  // namespace dsinfer::cuda
