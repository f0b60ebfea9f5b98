// Grouped wgmma experts (moe_sm90.h). Per launch: a setup kernel writes each expert's problem
// shape, operand pointers, strides and scale layouts (the grouped GEMM reads them on the device,
// so the host never waits for the routing), a gather kernel copies the pairs' FP8 activation rows
// into expert order with their scales in the GEMM's M-major layout, then GEMM 1 (W1 and W3 in one
// [2 x inter] weight), SwiGLU + quantisation, GEMM 2. Only compiled with CUTLASS.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
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
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/moe_sm90.h"
#include "kernels/cuda/swiglu.cuh"
#include "numeric/float_formats.h"

namespace dsinfer::cuda {
namespace {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using ElementA = cutlass::float_e4m3_t;
using ElementB = cutlass::float_e4m3_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;
using ClusterShape = Shape<_1, _1, _1>;
// Activations: one scale per row and 128-K block; weights: one per row and 128-K block.
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 1, 128>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

// One grouped GEMM configuration: the tile and the kernel / epilogue schedules.
template <class TileShape, class KernelSchedule, class EpilogueSchedule>
struct GroupedGemm {
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
using Coop128 = GroupedGemm<Shape<_128, _128, _128>,
                            cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                            cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
// 64-row tiles, the two consumer warpgroups on alternate tiles (ping-pong: one's epilogue
// overlaps the other's main loop). An expert's ~190 rows at 8k tokens fill three 64-row tiles
// where they leave the second of two 128-row tiles half empty.
using Ping64 = GroupedGemm<Shape<_64, _128, _128>,
                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                           cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;

using StrideA = typename Coop128::Kernel::InternalStrideA;
using StrideB = typename Coop128::Kernel::InternalStrideB;
using StrideD = typename Coop128::Kernel::InternalStrideD;
static_assert(std::is_same_v<StrideA, typename Ping64::Kernel::InternalStrideA> &&
              std::is_same_v<StrideB, typename Ping64::Kernel::InternalStrideB> &&
              std::is_same_v<StrideD, typename Ping64::Kernel::InternalStrideD>);
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

// The per-expert argument arrays of one grouped GEMM.
struct GroupArrays {
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
};

size_t group_arrays_bytes(int64_t ne) {
  const size_t n = static_cast<size_t>(ne);
  return n * (sizeof(Shape3) + 5 * sizeof(void*) + sizeof(StrideA) + sizeof(StrideB) +
              sizeof(StrideD) + sizeof(LayoutSFA) + sizeof(LayoutSFB)) +
         11 * 16;
}

GroupArrays carve_group_arrays(uint8_t* base, int64_t ne) {
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

// The scratch of one launch, in order.
struct Scratch {
  uint8_t* a1;  // [pairs][hidden] gathered FP8 rows
  float* sfa1;  // per expert e at begin[e] * (hidden / 128): [hidden / 128][m_e]
  float* d1;    // [pairs][2 * inter]
  uint8_t* hq;  // [pairs][inter]
  float* sfa2;  // per expert e at begin[e] * (inter / 128): [inter / 128][m_e]
  uint8_t* g1;  // GroupArrays of GEMM 1
  uint8_t* g2;  // GroupArrays of GEMM 2
  uint8_t* ws;  // CUTLASS workspace
  int64_t bytes;
};

int sm_count() {
  static const int n = [] {
    int dev = 0;
    cudaGetDevice(&dev);
    return cutlass::KernelHardwareInfo::query_device_multiprocessor_count(dev);
  }();
  return n;
}

template <class Cfg>
typename Cfg::Gemm::Arguments make_args(int64_t ne, const GroupArrays& g) {
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

template <class Cfg>
size_t workspace_bytes(int64_t ne) {
  return Cfg::Gemm::get_workspace_size(make_args<Cfg>(ne, carve_group_arrays(nullptr, ne)));
}

// One grouped GEMM over the arrays g, with the CUTLASS workspace ws.
template <class Cfg>
Status run_grouped(int64_t ne, const GroupArrays& g, void* ws, cudaStream_t stream) {
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

Scratch carve_scratch(void* base, int64_t ne, int64_t pairs, int64_t hidden, int64_t inter) {
  auto* p = static_cast<uint8_t*>(base);
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    uint8_t* q = p ? p + off : nullptr;
    off += (std::max<int64_t>(bytes, 1) + 255) / 256 * 256;
    return q;
  };
  Scratch s;
  s.a1 = take(pairs * hidden);
  s.sfa1 = reinterpret_cast<float*>(take(pairs * (hidden / 128) * 4));
  s.d1 = reinterpret_cast<float*>(take(pairs * 2 * inter * 4));
  s.hq = take(pairs * inter);
  s.sfa2 = reinterpret_cast<float*>(take(pairs * (inter / 128) * 4));
  s.g1 = take(static_cast<int64_t>(group_arrays_bytes(ne)));
  s.g2 = take(static_cast<int64_t>(group_arrays_bytes(ne)));
  // The workspace size depends on the group count and the SMs only, not on the pointers.
  const size_t wsb = std::max(workspace_bytes<Coop128>(ne), workspace_bytes<Ping64>(ne));
  s.ws = take(static_cast<int64_t>(wsb));
  s.bytes = off;
  return s;
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
__device__ __forceinline__ int64_t pair_of(const MoeSm90Params& p, int64_t g) {
  return p.pair_src ? p.pair_src[g] : g;
}

__device__ __forceinline__ int64_t expert_of(const int64_t* begin, int64_t ne, int64_t g) {
  if (begin == nullptr)
    return 0;
  int64_t lo = 0;
  int64_t hi = ne - 1;  // the last e with begin[e] <= g
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (begin[mid] <= g)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__global__ void setup_kernel(MoeSm90Params p, Scratch s, GroupArrays g1, GroupArrays g2) {
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
  g1.sfb[e] = w.s13 + e * (H / 128) * static_cast<int64_t>(2 * I);
  g1.d[e] = any ? s.d1 + b * 2 * I : nullptr;
  g2.a[e] = any ? reinterpret_cast<const ElementA*>(s.hq + b * I) : nullptr;
  g2.b[e] = reinterpret_cast<const ElementB*>(w.w2 + e * static_cast<int64_t>(H) * I);
  g2.sfa[e] = any ? s.sfa2 + b * (I / 128) : nullptr;
  g2.sfb[e] = w.s2 + e * (I / 128) * static_cast<int64_t>(H);
  g2.d[e] = any ? y + b * H : nullptr;
  g1.sa[e] = row_stride<StrideA>(H);
  g1.sb[e] = row_stride<StrideB>(H);
  g1.sd[e] = row_stride<StrideD>(2 * I);
  g2.sa[e] = row_stride<StrideA>(I);
  g2.sb[e] = row_stride<StrideB>(I);
  g2.sd[e] = row_stride<StrideD>(H);
  g1.lsfa[e] = ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, 2 * I, H, 1));
  g1.lsfb[e] = ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, 2 * I, H, 1));
  g2.lsfa[e] = ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, H, I, 1));
  g2.lsfb[e] = ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, H, I, 1));
}

// One block per grouped row: the token's FP8 row (16-byte copies) and its scales, transposed
// into the expert's [hidden / 128][m_e] block.
__global__ void gather_kernel(MoeSm90Params p, Scratch s) {
  const int64_t H = p.w.hidden;
  const int64_t kb = H / 128;
  for (int64_t g = blockIdx.x; g < p.num_pairs; g += gridDim.x) {
    const int64_t e = expert_of(p.expert_begin, p.w.n_experts, g);
    const int64_t b = begin_of(p, e);
    const int64_t m = begin_of(p, e + 1) - b;
    const int64_t tok = pair_of(p, g) / p.k;
    const uint4* src = reinterpret_cast<const uint4*>(p.x.codes + tok * p.x.ld);
    uint4* dst = reinterpret_cast<uint4*>(s.a1 + g * H);
    for (int64_t i = threadIdx.x; i < H / 16; i += blockDim.x) dst[i] = src[i];
    const float* xs = p.x.scales + tok * (p.x.ld / 128);
    for (int64_t i = threadIdx.x; i < kb; i += blockDim.x) {
      s.sfa1[b * kb + i * m + (g - b)] = xs[i];
    }
  }
}

// h = silu(min(g, limit)) * clamp(u, +-limit) * gate (the fused kernel's operations, in its
// order), quantised per 128 values exactly as launch_quantize_fp8 does; one warp per block.
__global__ void swiglu_quant_kernel(MoeSm90Params p, Scratch s) {
  const int64_t I = p.w.inter;
  const int64_t kb = I / 128;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const float lim = p.swiglu_limit;
  for (int64_t g = blockIdx.x; g < p.num_pairs; g += gridDim.x) {
    const int64_t e = expert_of(p.expert_begin, p.w.n_experts, g);
    const int64_t b = begin_of(p, e);
    const int64_t m = begin_of(p, e + 1) - b;
    const float gate = p.gates ? p.gates[pair_of(p, g)] : 1.0f;
    const float* row = s.d1 + g * 2 * I;
    for (int64_t blk = warp; blk < kb; blk += nwarps) {
      const int64_t c0 = blk * 128 + lane * 4;
      const float4 gv4 = *reinterpret_cast<const float4*>(row + c0);
      const float4 uv4 = *reinterpret_cast<const float4*>(row + I + c0);
      float h[4] = {gv4.x, gv4.y, gv4.z, gv4.w};
      const float u[4] = {uv4.x, uv4.y, uv4.z, uv4.w};
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        h[i] = swiglu_gated(h[i], u[i], lim, gate);
        amax = fmaxf(amax, fabsf(h[i]));
      }
      amax = warp_max(amax);
      const float sc = act_block_scale(amax);
      const float inv_sc = 1.0f / sc;  // exact: sc is a power of two
      uint32_t packed = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) packed |= act_quant_code_pow2(h[i], inv_sc) << (8 * i);
      *reinterpret_cast<uint32_t*>(s.hq + g * I + c0) = packed;
      if (lane == 0)
        s.sfa2[b * kb + blk * m + (g - b)] = sc;
    }
  }
}

// ---- re-encoding ----------------------------------------------------------------------------

// One thread per (expert, weight row, 128-wide K block) of one matrix: codes and the row-block
// scale S. MXFP4: S = 2^(max nonzero 32-block exponent - 6), each value e2m1 x 2^(s - S) in E4M3.
__global__ void reencode_kernel(const MatrixRef* mats,
                                WeightFormat format,
                                int64_t n_experts,
                                int64_t rows,
                                int64_t cols,
                                int64_t row_offset,  // rows of this matrix within the output
                                int64_t out_rows,    // rows per expert in the output
                                uint8_t* codes,
                                float* scales,
                                int* inexact) {
  const int64_t kb = cols / 128;
  const int64_t total = n_experts * rows * kb;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t blk = i % kb;
    const int64_t r = (i / kb) % rows;
    const int64_t e = i / (kb * rows);
    const MatrixRef w = mats[e];
    uint8_t* out = codes + (e * out_rows + row_offset + r) * cols + blk * 128;
    float* sc = scales + (e * kb + blk) * out_rows + row_offset + r;
    if (format == WeightFormat::kFp8Block128) {
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * cols + blk * 128;
      for (int j = 0; j < 128; j += 16)
        *reinterpret_cast<uint4*>(out + j) = *reinterpret_cast<const uint4*>(src + j);
      const int64_t si = (r / 128) * ((cols + 127) / 128) + blk;
      *sc = w.scale_dtype == DType::kF32
                ? static_cast<const float*>(w.scale)[si]
                : numeric::e8m0_to_f32(static_cast<const uint8_t*>(w.scale)[si]);
      continue;
    }
    const uint8_t* packed = static_cast<const uint8_t*>(w.data) + r * (cols / 2) + blk * 64;
    const uint8_t* sub = static_cast<const uint8_t*>(w.scale) + r * (cols / 32) + blk * 4;
    int smax = -1000;
    int smin = 1000;
    for (int j = 0; j < 4; ++j) {
      bool nz = false;
      for (int q = 0; q < 16; ++q) nz |= (packed[j * 16 + q] & 0x77) != 0;
      if (nz) {
        smax = max(smax, static_cast<int>(sub[j]));
        smin = min(smin, static_cast<int>(sub[j]));
      }
    }
    if (smax < smin) {  // all zero
      for (int j = 0; j < 128; j += 16) *reinterpret_cast<uint4*>(out + j) = make_uint4(0, 0, 0, 0);
      *sc = 1.0f;
      continue;
    }
    if (smax - smin > 14 || smax < 6)
      atomicAdd(inexact, 1);
    const int big = smax - 6;  // biased E8M0 exponent of S
    *sc = numeric::e8m0_to_f32(static_cast<uint8_t>(max(big, 0)));
    for (int j = 0; j < 4; ++j) {
      const int shift = static_cast<int>(sub[j]) - max(big, 0);
      for (int q = 0; q < 16; ++q) {
        const uint8_t two = packed[j * 16 + q];
        uint8_t c[2];
        for (int h = 0; h < 2; ++h) {
          const float v = ldexpf(numeric::fp4_e2m1_to_f32((two >> (4 * h)) & 0xf), shift);
          c[h] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
        }
        out[j * 32 + 2 * q] = c[0];
        out[j * 32 + 2 * q + 1] = c[1];
      }
    }
  }
}

// The tile configuration of one launch: 64-row ping-pong tiles while the experts average at
// most 384 rows (the routed experts of a prefill: a 128-row tile would run half empty on the
// remainder of ~190 rows, and the epilogue's fp32 rows stall a cooperative tile), 128-row
// cooperative tiles above (the shared expert). DSINFER_MOE_SM90_TILE=64 or 128 forces one (for
// measuring one against the other).
bool use_ping64(const MoeSm90Params& p) {
  static const int forced = [] {
    const char* v = std::getenv("DSINFER_MOE_SM90_TILE");
    return v == nullptr ? 0 : std::atoi(v);
  }();
  if (forced == 64 || forced == 128)
    return forced == 64;
  return p.num_pairs <= 384 * std::max<int64_t>(p.w.n_experts, 1);
}

}  // namespace

bool moe_sm90_supports(int64_t hidden, int64_t inter) {
  return hidden > 0 && inter > 0 && hidden % 128 == 0 && inter % 128 == 0;
}

int64_t moe_fp8_weights_bytes(int64_t n_experts, int64_t hidden, int64_t inter) {
  const int64_t w13 = n_experts * 2 * inter * hidden;
  const int64_t s13 = n_experts * (hidden / 128) * 2 * inter * 4;
  const int64_t w2 = n_experts * hidden * inter;
  const int64_t s2 = n_experts * (inter / 128) * hidden * 4;
  return w13 + s13 + w2 + s2 + 4 * 256;
}

MoeFp8Weights moe_fp8_weights_carve(void* base, int64_t n_experts, int64_t hidden, int64_t inter) {
  auto* p = static_cast<uint8_t*>(base);
  auto take = [&](int64_t bytes) {
    uint8_t* q = p;
    p += (bytes + 255) / 256 * 256;
    return q;
  };
  MoeFp8Weights w;
  w.n_experts = n_experts;
  w.hidden = hidden;
  w.inter = inter;
  w.w13 = take(n_experts * 2 * inter * hidden);
  w.s13 = reinterpret_cast<float*>(take(n_experts * (hidden / 128) * 2 * inter * 4));
  w.w2 = take(n_experts * hidden * inter);
  w.s2 = reinterpret_cast<float*>(take(n_experts * (inter / 128) * hidden * 4));
  return w;
}

Status launch_moe_fp8_reencode(const MatrixRef* w1,
                               const MatrixRef* w3,
                               const MatrixRef* w2,
                               WeightFormat format,
                               const MoeFp8Weights& out,
                               int* inexact,
                               cudaStream_t stream) {
  if (!moe_sm90_supports(out.hidden, out.inter))
    return invalid_argument("moe_fp8_reencode: hidden and inter must be multiples of 128");
  if (format != WeightFormat::kMxfp4 && format != WeightFormat::kFp8Block128)
    return invalid_argument("moe_fp8_reencode: experts must be MXFP4 or FP8 block-128");
  const int64_t ne = out.n_experts;
  const int64_t H = out.hidden;
  const int64_t I = out.inter;
  struct Part {
    const MatrixRef* m;
    int64_t rows, cols, offset, out_rows;
    uint8_t* codes;
    float* scales;
  };
  const Part parts[] = {{w1, I, H, 0, 2 * I, out.w13, out.s13},
                        {w3, I, H, I, 2 * I, out.w13, out.s13},
                        {w2, H, I, 0, H, out.w2, out.s2}};
  for (const Part& pt : parts) {
    const int64_t total = ne * pt.rows * (pt.cols / 128);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 1 << 16));
    reencode_kernel<<<grid, 256, 0, stream>>>(
        pt.m, format, ne, pt.rows, pt.cols, pt.offset, pt.out_rows, pt.codes, pt.scales, inexact);
    DSI_RETURN_IF_ERROR(launched("moe_fp8_reencode launch"));
  }
  return Status();
}

int64_t moe_sm90_scratch_bytes(int64_t n_experts,
                               int64_t num_pairs,
                               int64_t hidden,
                               int64_t inter) {
  return carve_scratch(nullptr, n_experts, num_pairs, hidden, inter).bytes;
}

Status launch_moe_sm90(const MoeSm90Params& p, cudaStream_t stream) {
  const int64_t ne = p.w.n_experts;
  const int64_t H = p.w.hidden;
  const int64_t I = p.w.inter;
  if (!moe_sm90_supports(H, I))
    return invalid_argument("moe_sm90: hidden and inter must be multiples of 128");
  if (p.num_pairs == 0)
    return Status();
  if ((ne > 1 && !p.expert_begin) || !p.x.codes || !p.x.scales || !p.y || !p.scratch)
    return null_pointer("moe_sm90");
  if (p.num_pairs > 0x7fffffff || 2 * I * H > 0x7fffffff)
    return invalid_argument("moe_sm90: sizes exceed 32-bit extents");
  const Scratch s = carve_scratch(p.scratch, ne, p.num_pairs, H, I);
  if (p.scratch_bytes < s.bytes)
    return invalid_argument("moe_sm90: scratch too small");
  const GroupArrays g1 = carve_group_arrays(s.g1, ne);
  const GroupArrays g2 = carve_group_arrays(s.g2, ne);
  setup_kernel<<<static_cast<unsigned>((ne + 127) / 128), 128, 0, stream>>>(p, s, g1, g2);
  DSI_RETURN_IF_ERROR(launched("moe_sm90 setup"));
  const unsigned rows = static_cast<unsigned>(std::min<int64_t>(p.num_pairs, 1 << 20));
  gather_kernel<<<rows, 128, 0, stream>>>(p, s);
  DSI_RETURN_IF_ERROR(launched("moe_sm90 gather"));
  const bool ping = use_ping64(p);
  for (int pass = 0; pass < 2; ++pass) {
    const GroupArrays& g = pass == 0 ? g1 : g2;
    DSI_RETURN_IF_ERROR(ping ? run_grouped<Ping64>(ne, g, s.ws, stream)
                             : run_grouped<Coop128>(ne, g, s.ws, stream));
    if (pass == 0) {
      swiglu_quant_kernel<<<rows, 128, 0, stream>>>(p, s);
      DSI_RETURN_IF_ERROR(launched("moe_sm90 swiglu"));
    }
  }
  return Status();
}

}  // namespace dsinfer::cuda
