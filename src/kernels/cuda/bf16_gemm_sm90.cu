// The many-row BF16x2 linears on Hopper's wgmma (bf16_gemm_sm90.h), from CUTLASS's SM90 TMA
// warp-specialised GEMM: y = W hi (+ y) then y += W lo, each pass one batched launch over the
// groups (or one GEMM over both halves' rows and an add, bf16_gemm_sm90.h). Only compiled
// with CUTLASS (DSINFER_HAVE_CUTLASS).
#include <algorithm>

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

// For every group g (the batch mode L): y[t * ldy + g * batch_y + r] (+)=
// sum_c w[g * rows + r, c] x[t * x_ld + g * group_x + c] over m rows t of x.
Status run_gemm(const Bf16GemmSm90Args& a,
                const uint16_t* x,
                int64_t m,
                float* y,
                int64_t ldy,
                int64_t batch_y,
                bool accumulate,
                cudaStream_t s) {
  const auto stride_a =
      make_stride(static_cast<int64_t>(a.x_ld), Int<1>{}, static_cast<int64_t>(a.group_x));
  const auto stride_b =
      make_stride(static_cast<int64_t>(a.w_ld), Int<1>{}, static_cast<int64_t>(a.rows * a.w_ld));
  const auto stride_d = make_stride(ldy, Int<1>{}, batch_y);
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {static_cast<int>(m),
                                 static_cast<int>(a.rows),
                                 static_cast<int>(a.k),
                                 static_cast<int>(a.groups)},
                                {reinterpret_cast<const ElementAB*>(x),
                                 stride_a,
                                 reinterpret_cast<const ElementAB*>(a.w),
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

// y (+)= hi + lo from the paired GEMM's rows: part[g][t] (W hi) and part[g][n + t] (W lo), added
// as the two passes would (hi onto y first, then lo onto that). Four outputs per thread.
__global__ void pair_add_kernel(const float* part,
                                float* y,
                                int64_t n,
                                int64_t rows,
                                int64_t ldy,
                                int64_t group_y,
                                int64_t groups,
                                bool accumulate) {
  const int64_t quads = rows / 4;
  const int64_t total = groups * n * quads;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t q = i % quads;
    const int64_t t = (i / quads) % n;
    const int64_t g = i / (quads * n);
    const float4 hi = *reinterpret_cast<const float4*>(part + ((g * 2 * n + t) * rows + 4 * q));
    const float4 lo = *reinterpret_cast<const float4*>(part + ((g * 2 * n + n + t) * rows + 4 * q));
    float4* out = reinterpret_cast<float4*>(y + t * ldy + g * group_y + 4 * q);
    float4 v = hi;
    if (accumulate) {
      const float4 y0 = *out;
      v = make_float4(hi.x + y0.x, hi.y + y0.y, hi.z + y0.z, hi.w + y0.w);
    }
    *out = make_float4(lo.x + v.x, lo.y + v.y, lo.z + v.z, lo.w + v.w);
  }
}

bool pairs(const Bf16GemmSm90Args& a) {
  return a.pair_scratch != nullptr && a.x_lo != nullptr && a.x_lo == a.x_hi + a.n * a.x_ld &&
         bf16_gemm_sm90_pair_floats(a.n, a.rows, a.groups) > 0 && a.ldy % 4 == 0 &&
         a.group_y % 4 == 0 && (reinterpret_cast<uintptr_t>(a.pair_scratch) & 15u) == 0;
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
  if (pairs(a)) {
    DSI_RETURN_IF_ERROR(
        run_gemm(a, a.x_hi, 2 * a.n, a.pair_scratch, a.rows, 2 * a.n * a.rows, false, stream));
    const int64_t total = a.groups * a.n * (a.rows / 4);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 8192));
    pair_add_kernel<<<blocks, 256, 0, stream>>>(
        a.pair_scratch, a.y, a.n, a.rows, a.ldy, a.group_y, a.groups, a.accumulate);
    return launched("bf16_gemm_sm90 pair add launch");
  }
  DSI_RETURN_IF_ERROR(run_gemm(a, a.x_hi, a.n, a.y, a.ldy, a.group_y, a.accumulate, stream));
  if (a.x_lo != nullptr)  // null: BF16-exact activations, one pass
    DSI_RETURN_IF_ERROR(run_gemm(a, a.x_lo, a.n, a.y, a.ldy, a.group_y, true, stream));
  return Status();
}

}  // namespace dsinfer::cuda
