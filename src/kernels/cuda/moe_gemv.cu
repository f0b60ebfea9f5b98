// Grouped expert GEMVs for decode (moe_gemv.h): the public entry points, the load-time check, and
// the FP8 experts' kernels (weights from global memory into registers, converted to FP16 there,
// FP16 m16n8k16 MMAs with weights as A (16 rows) and tokens as B (8)). The MXFP4 experts' wgmma
// kernels: moe_gemv_mxfp4.cu; the tile search both use: moe_gemv_tiles.cuh.
#include <algorithm>

#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/fp8_mma_tile.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/moe_gemv_tiles.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace dsinfer::cuda {
namespace {

using moe_gemv_detail::find_tile;
using moe_gemv_detail::imin;
using moe_gemv_detail::kTok;
using moe_gemv_detail::kWholeRowsFromTiles;
using moe_gemv_detail::Tile;
using moe_gemv_detail::tile_prologue;

constexpr int kWarps = 4;      // per block, each a quarter of K of the block's rows
constexpr int kWarpRows = 16;  // rows per block (the MMA's M)
constexpr int64_t kMaxGridY = 65535;

// Streaming 16-byte load: read once, kept out of L1.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// One lane's share of rows g and g + 8 of a warp's 16 rows for one 128-wide K block: the 32
// weights at K offset 32 t of the block, and the 128x128 block's scale.
struct WFrag {
  uint4 v[2][2];
  float fs;
};

__device__ __forceinline__ void load_w(
    const MatrixRef& w, int64_t r0, int g, int t, int64_t kb, WFrag* f) {
  const auto* d = static_cast<const uint8_t*>(w.data);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint8_t* p = d + (r0 + g + 8 * i) * w.cols + kb * 128 + 32 * t;
    f->v[i][0] = ld_stream(p);
    f->v[i][1] = ld_stream(p + 16);
  }
  f->fs = fp8_block_scale(
      w.scale, w.scale_dtype == DType::kF32, (r0 / 128) * ((w.cols + 127) / 128) + kb);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// c = the block's products for rows g, g + 8 x tokens 2t, 2t + 1 (the MMA's C fragment), and the
// rows' factors fa, fb that turn them into values (before the activation scale). The 8 MMAs on
// two accumulator chains (halving the dependent chain) measured no faster (fourteenth session:
// the kernel issues every 6-7 cycles per warp with no dominant stall, at 11-14 warps per SM).
__device__ __forceinline__ void block_mma(
    const WFrag& f, const uint32_t (&xb)[16], float (&c)[4], float* fa, float* fb) {
  c[0] = c[1] = c[2] = c[3] = 0.0f;
#pragma unroll
  for (int st = 0; st < 8; ++st) {
    const uint32_t wa = word(f.v[0][st / 4], st % 4);
    const uint32_t wb = word(f.v[1][st / 4], st % 4);
    const uint32_t a[4] = {mma::e4m3x2_to_f16x2(wa),
                           mma::e4m3x2_to_f16x2(wb),
                           mma::e4m3x2_to_f16x2(wa >> 16),
                           mma::e4m3x2_to_f16x2(wb >> 16)};
    const uint32_t b[2] = {xb[2 * st], xb[2 * st + 1]};
    mma::mma_f16(c, a, b);
  }
  *fa = f.fs;
  *fb = f.fs;
}

// Token g's 32 activations at K offset 32 t of block kb as FP16 pairs, and the activation scales
// of tokens 2t, 2t + 1 (zero for absent tokens).
struct XFrag {
  uint4 v[2];
  float s0, s1;
};

__device__ __forceinline__ void load_x(
    const Fp8Acts& x, const int32_t* xrow, int g, int t, int64_t kb, XFrag* f) {
  const int r = xrow[g];
  if (r >= 0) {
    const uint8_t* p = x.codes + static_cast<int64_t>(r) * x.ld + kb * 128 + 32 * t;
    f->v[0] = __ldg(reinterpret_cast<const uint4*>(p));
    f->v[1] = __ldg(reinterpret_cast<const uint4*>(p + 16));
  } else {
    f->v[0] = f->v[1] = make_uint4(0, 0, 0, 0);
  }
  const int64_t sld = x.ld / 128;
  const int r0 = xrow[2 * t];
  const int r1 = xrow[2 * t + 1];
  f->s0 = r0 >= 0 ? __ldg(x.scales + r0 * sld + kb) : 0.0f;
  f->s1 = r1 >= 0 ? __ldg(x.scales + r1 * sld + kb) : 0.0f;
}

__device__ __forceinline__ void x_f16(const XFrag& f, uint32_t (&xb)[16]) {
#pragma unroll
  for (int st = 0; st < 8; ++st) {
    const uint32_t w = word(f.v[st / 4], st % 4);
    xb[2 * st] = mma::e4m3x2_to_f16x2(w);
    xb[2 * st + 1] = mma::e4m3x2_to_f16x2(w >> 16);
  }
}

__device__ __forceinline__ void accumulate(
    const float (&c)[4], float fa, float fb, const XFrag& x, float (&acc)[4]) {
  acc[0] = fmaf(c[0], fa * x.s0, acc[0]);
  acc[1] = fmaf(c[1], fa * x.s1, acc[1]);
  acc[2] = fmaf(c[2], fb * x.s0, acc[2]);
  acc[3] = fmaf(c[3], fb * x.s1, acc[3]);
}

// Blocks per SM the gate/up kernel is compiled for: registers <= 65536 / (128 * 4) = 128, so 16
// warps per SM keep their next K block in flight (156 registers and 12 warps without the bound).
constexpr int kGateUpMinBlocks = 4;
constexpr int kDownMinBlocks = 5;  // one matrix: <= 102 registers

// Warp w of the block: the K blocks of its 16 rows (Whole: all of them; else every fourth, from
// w, the block's other warps taking the others of the same rows); M matrices
// (gate/up: w1 and w3 on the same x; down: w2) into acc[m][4].
template <int M, bool Whole>
__device__ __forceinline__ void stream_rows(const MatrixRef (&w)[M],
                                            const Fp8Acts& x_acts,
                                            const int32_t* xrow,
                                            int64_t r0,
                                            int64_t kbs,
                                            float (&acc)[M][4]) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  int64_t kb0 = 0, n = kbs, kstep = 1;
  if constexpr (!Whole) {
    // Warp w takes K blocks w, w + 4, ...: at any time the block's warps read neighbouring 64-byte
    // pieces of each row (contiguous quarters measured 1-2% slower at batch 1 and 4).
    const int w = threadIdx.x >> 5;
    kb0 = w;
    kstep = kWarps;
    n = kbs > w ? (kbs - w + kWarps - 1) / kWarps : 0;
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[m][i] = 0.0f;
  if (n <= 0)
    return;
  // Two register sets used in turn (no copies between them): while one K block computes, the
  // other's loads are in flight.
  WFrag fa[M], fb[M];
  XFrag xa, xb;
  auto load = [&](int64_t j, WFrag(&f)[M], XFrag& x) {
    const int64_t kb = kb0 + j * kstep;
#pragma unroll
    for (int m = 0; m < M; ++m) load_w(w[m], r0, g, t, kb, &f[m]);
    load_x(x_acts, xrow, g, t, kb, &x);
  };
  auto compute = [&](const WFrag(&f)[M], const XFrag& x) {
    uint32_t xh[16];
    x_f16(x, xh);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float c[4], sa, sb;
      block_mma(f[m], xh, c, &sa, &sb);
      accumulate(c, sa, sb, x, acc[m]);
    }
  };
  // FP8 rows hold twice the registers of MXFP4's: one set plus the next block's loads (copied
  // over).
  load(0, fa, xa);
  for (int64_t j = 0; j < n; ++j) {
    if (j + 1 < n)
      load(j + 1, fb, xb);
    compute(fa, xa);
#pragma unroll
    for (int m = 0; m < M; ++m) fa[m] = fb[m];
    xa = xb;
  }
}

// The warps' partial sums added in warp order (fixed): true for warp 0, whose acc then holds the
// block's sums.
template <int M>
__device__ __forceinline__ bool reduce_warps(float (&acc)[M][4]) {
  __shared__ float red[kWarps][M * 4][32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][m * 4 + i][lane] = acc[m][i];
  __syncthreads();
  if (warp != 0)
    return false;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = red[0][m * 4 + i][lane];
      for (int w = 1; w < kWarps; ++w) v = __fadd_rn(v, red[w][m * 4 + i][lane]);
      acc[m][i] = v;
    }
  return true;
}

// Each block takes `groups` consecutive 16-row groups of its tile (one prologue, whose scan over
// the experts costs about as much as streaming one group of w2, for several groups); the rows'
// arithmetic does not depend on the grouping.
// Rows of one row group: 16 (the block's warps split K) or 64 (Whole: each warp its own 16 rows
// over all of K, no reduction between warps).
template <bool Whole>
__host__ __device__ constexpr int64_t group_rows() {
  return Whole ? kWarps * kWarpRows : kWarpRows;
}

template <bool Whole>
__global__ void __launch_bounds__(kWarps * 32, kGateUpMinBlocks)
    gemv_gate_up_kernel(Fp8ExpertFfnParams p, int groups) {
  pdl_begin();
  __shared__ int32_t xrow[kTok];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups * group_rows<Whole>();
  Tile tl;
  if (!tile_prologue(p, first, p.inter, true, &tl, xrow))
    return;  // block-uniform
  const int64_t e = tl.e;
  const int64_t g0 = tl.g0;
  const int count = tl.count;
  const MatrixRef w[2] = {p.w1[e], p.w3[e]};
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const float lim = p.swiglu_limit;
  auto store = [&](const float(&acc)[2][4], int64_t r0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 2 * t + (i & 1);
      if (j >= count)
        continue;
      const int64_t row = r0 + g + 8 * (i >> 1);
      const int64_t pair = g0 + j;
      const float gate = p.gates ? p.gates[p.pair_src ? p.pair_src[pair] : pair] : 1.0f;
      p.h[pair * p.inter + row] = swiglu_gated(acc[0][i], acc[1][i], lim, gate);
    }
  };
  for (int rg = 0; rg < groups; ++rg) {
    const int64_t base = first + rg * group_rows<Whole>();
    if (base >= p.inter)
      break;  // block-uniform
    float acc[2][4];
    if constexpr (Whole) {
      const int64_t r0 = base + (threadIdx.x >> 5) * kWarpRows;
      if (r0 < p.inter) {  // warp-uniform
        stream_rows<2, true>(w, p.x, xrow, r0, p.hidden / 128, acc);
        store(acc, r0);
      }
    } else {
      stream_rows<2, false>(w, p.x, xrow, base, p.hidden / 128, acc);
      if (reduce_warps<2>(acc))
        store(acc, base);
      __syncthreads();  // reduce_warps' shared partials are rewritten by the next group
    }
  }
}

template <bool Whole>
__global__ void __launch_bounds__(kWarps * 32, kDownMinBlocks)
    gemv_down_kernel(Fp8ExpertFfnParams p, int groups) {
  pdl_begin();
  __shared__ int32_t xrow[kTok];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups * group_rows<Whole>();
  Tile tl;
  if (!tile_prologue(p, first, p.hidden, false, &tl, xrow))
    return;
  const int64_t e = tl.e;
  const int64_t g0 = tl.g0;
  const int count = tl.count;
  const MatrixRef w[1] = {p.w2[e]};
  const Fp8Acts hq{p.h_codes, p.h_scales, (p.inter + 127) / 128 * 128};  // fp8_acts_ld
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  auto store = [&](const float(&acc)[1][4], int64_t r0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 2 * t + (i & 1);
      if (j < count)
        p.y[(g0 + j) * p.hidden + r0 + g + 8 * (i >> 1)] = acc[0][i];
    }
  };
  for (int rg = 0; rg < groups; ++rg) {
    const int64_t base = first + rg * group_rows<Whole>();
    if (base >= p.hidden)
      break;
    float acc[1][4];
    if constexpr (Whole) {
      const int64_t r0 = base + (threadIdx.x >> 5) * kWarpRows;
      if (r0 < p.hidden) {
        stream_rows<1, true>(w, hq, xrow, r0, p.inter / 128, acc);
        store(acc, r0);
      }
    } else {
      stream_rows<1, false>(w, hq, xrow, base, p.inter / 128, acc);
      if (reduce_warps<1>(acc))
        store(acc, base);
      __syncthreads();
    }
  }
}

// Counts the (row, 128-block)s of MXFP4 matrix blockIdx.y (w1, w3, w2 of every expert) with the
// NaN scale code; codes not 16-byte aligned or scales not 4-byte aligned (the kernels' cp.async
// sizes) count once.
__global__ void gemv_check_kernel(
    const MatrixRef* w1, const MatrixRef* w3, const MatrixRef* w2, int64_t n_experts, int* bad) {
  const int64_t m = blockIdx.y;
  const int64_t which = m / n_experts;
  const MatrixRef w = (which == 0 ? w1 : which == 1 ? w3 : w2)[m % n_experts];
  if (w.format != WeightFormat::kMxfp4)
    return;
  const auto* s = static_cast<const uint8_t*>(w.scale);
  if (blockIdx.x == 0 && threadIdx.x == 0 &&
      ((reinterpret_cast<uintptr_t>(s) & 3u) != 0 ||
       (reinterpret_cast<uintptr_t>(w.data) & 15u) != 0))
    atomicAdd(bad, 1);
  const int64_t kbs = w.cols / 128;
  const int64_t total = w.rows * kbs;
  int count = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t* b = s + (i / kbs) * (w.cols / 32) + (i % kbs) * 4;
    bool out = false;
#pragma unroll
    for (int j = 0; j < 4; ++j) out |= b[j] == 255;
    count += out;
  }
  if (count > 0)
    atomicAdd(bad, count);
}

template <bool Whole>
Status launch_mode(const Fp8ExpertFfnParams& p, int64_t tiles, int gu, int gd, cudaStream_t s) {
  const dim3 g1(static_cast<unsigned>(ceil_div(p.inter, group_rows<Whole>() * gu)),
                static_cast<unsigned>(tiles));
  launch_pdl(gemv_gate_up_kernel<Whole>, g1, kWarps * 32, 0, s, p, gu);
  DSI_RETURN_IF_ERROR(launched("expert_gemv gate/up launch"));
  DSI_RETURN_IF_ERROR(launch_quantize_expert_h(p, s));
  const dim3 g2(static_cast<unsigned>(ceil_div(p.hidden, group_rows<Whole>() * gd)),
                static_cast<unsigned>(tiles));
  launch_pdl(gemv_down_kernel<Whole>, g2, kWarps * 32, 0, s, p, gd);
  return launched("expert_gemv down launch");
}

// Row groups per block for few tiles: as many as keep the grid within one wave of `per_sm`
// blocks per SM, each block paying the tile prologue once (batch 1 under ncu, twelfth session:
// down 1,536 -> 516 blocks, 28.8 -> 26 us; gate/up 768 -> 384 blocks, 41 us either way).
int64_t groups_for_one_wave(int64_t rows, int64_t tiles, int per_sm) {
  const int64_t blocks = ceil_div(rows, kWarpRows) * tiles;
  return std::max<int64_t>(1, ceil_div(blocks, static_cast<int64_t>(sm_count()) * per_sm));
}

Status launch_fp8(const Fp8ExpertFfnParams& p, int64_t tiles, cudaStream_t s) {
  if (tiles >= kWholeRowsFromTiles)
    return launch_mode<true>(p, tiles, 1, 1, s);
  const auto gu = static_cast<int>(groups_for_one_wave(p.inter, tiles, kGateUpMinBlocks));
  const auto gd = static_cast<int>(groups_for_one_wave(p.hidden, tiles, kDownMinBlocks));
  return launch_mode<false>(p, tiles, gu, gd, s);
}

}  // namespace

bool expert_gemv_supports(int64_t hidden, int64_t inter) {
  return hidden > 0 && inter > 0 && hidden % 128 == 0 && inter % 128 == 0;
}

Status launch_expert_gemv_check(const MatrixRef* w1,
                                const MatrixRef* w3,
                                const MatrixRef* w2,
                                int64_t n_experts,
                                int64_t hidden,
                                int64_t inter,
                                int* bad,
                                cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("expert_gemv_check", {n_experts, hidden, inter}));
  DSI_RETURN_IF_ERROR(require(3 * n_experts <= kMaxGridY, "expert_gemv_check", "too many experts"));
  if (n_experts == 0)
    return Status();
  if (!w1 || !w3 || !w2 || !bad)
    return null_pointer("expert_gemv_check");
  const dim3 grid(64, static_cast<unsigned>(3 * n_experts));
  gemv_check_kernel<<<grid, 256, 0, stream>>>(w1, w3, w2, n_experts, bad);
  return launched("expert_gemv_check launch");
}

Result<bool> expert_gemv_takes(const MatrixRef* w1,
                               const MatrixRef* w3,
                               const MatrixRef* w2,
                               WeightFormat format,
                               int64_t n_experts,
                               int64_t hidden,
                               int64_t inter,
                               int* bad) {
  if (n_experts == 0 || inter == 0 || !expert_gemv_supports(hidden, inter))
    return false;
  if (format == WeightFormat::kFp8Block128)
    return true;
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaMemset(bad, 0, sizeof(int)), "expert GEMV check counter"));
  DSI_RETURN_IF_ERROR(launch_expert_gemv_check(w1, w3, w2, n_experts, hidden, inter, bad, nullptr));
  int count = 0;
  DSI_RETURN_IF_ERROR(device::check_cuda(
      cudaMemcpy(&count, bad, sizeof(int), cudaMemcpyDeviceToHost), "expert GEMV check counter"));
  return count == 0;
}

Status launch_expert_gemv(const Fp8ExpertFfnParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(
      check_nonneg("expert_gemv", {p.n_experts, p.hidden, p.inter, p.num_pairs, p.k - 1}));
  DSI_RETURN_IF_ERROR(require(expert_gemv_supports(p.hidden, p.inter),
                              "expert_gemv",
                              "hidden and inter must be multiples of 128"));
  DSI_RETURN_IF_ERROR(
      require(p.format == WeightFormat::kMxfp4 || p.format == WeightFormat::kFp8Block128,
              "expert_gemv",
              "experts are neither MXFP4 nor FP8 block-128"));
  DSI_RETURN_IF_ERROR(require(
      p.x.ld >= p.hidden && p.x.ld % 128 == 0, "expert_gemv", "activation rows are too short"));
  if (p.num_pairs == 0)
    return Status();
  if (!p.w1 || !p.w3 || !p.w2 || !p.x.codes || !p.x.scales || !p.h || !p.h_codes || !p.h_scales ||
      !p.y)
    return null_pointer("expert_gemv");
  const int64_t experts = p.expert_begin ? p.n_experts : 1;
  const int64_t tiles = p.num_pairs / kTok + std::min(experts, p.num_pairs);
  if (tiles > kMaxGridY)
    return invalid_argument("expert_gemv: too many pairs for one launch");
  if (p.format == WeightFormat::kMxfp4)
    return moe_gemv_detail::launch_mxfp4(p, tiles, stream);
  return launch_fp8(p, tiles, stream);
}

}  // namespace dsinfer::cuda
