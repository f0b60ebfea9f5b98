// Grouped expert GEMVs for decode (moe_gemv.h). FP8 experts: weights from global memory into
// registers, converted to FP16 there, FP16 m16n8k16 MMAs with weights as A (16 rows) and tokens as
// B (8). MXFP4 experts: weights through a cp.async ring in shared memory, re-encoded as E4M3 in
// registers, m64n8k32 FP8 wgmmas (the second half of this file).
#include <algorithm>

#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/fp8_mma_tile.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/wgmma_fp8.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kWarps = 4;      // per block, each a quarter of K of the block's rows
constexpr int kWarpRows = 16;  // rows per block (the MMA's M)
constexpr int kTok = static_cast<int>(kExpertGemvTokens);
constexpr int64_t kMaxGridY = 65535;
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Streaming 16-byte load: read once, kept out of L1.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// prmt in its generic mode (byte permute of a:b by the selector's nibbles).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
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

constexpr int kScanPer = 16;
// Blocks per SM the gate/up kernel is compiled for: registers <= 65536 / (128 * 4) = 128, so 16
// warps per SM keep their next K block in flight (156 registers and 12 warps without the bound).
constexpr int kGateUpMinBlocks = 4;
constexpr int kDownMinBlocks = 5;  // one matrix: <= 102 registers

// Block-wide: tile ty of the grouped pairs (each expert's pairs cut into kTok-pair tiles, experts
// ascending) -> found[0..2] = expert, first grouped pair, the expert's end; false past the last.
__device__ bool find_tile(const Fp8ExpertFfnParams& p, int64_t ty, int64_t* found) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    if (lane == 0)
      found[0] = -1;
    __syncwarp();
    if (p.expert_begin == nullptr) {
      if (lane == 0 && ty * kTok < p.num_pairs) {
        found[0] = 0;
        found[1] = ty * kTok;
        found[2] = p.num_pairs;
      }
    } else {
      // Lane l sums the tiles of experts [lo, hi); a scan over the lanes finds ty's lane. The
      // lane's boundaries are loaded together (up to kScanPer experts per lane: 512 experts),
      // not one dependent load per expert: this prologue is latency every block pays first.
      const int64_t per = (p.n_experts + 31) / 32;
      const int64_t lo = imin(lane * per, p.n_experts);
      const int64_t hi = imin(lo + per, p.n_experts);
      int64_t b[kScanPer + 1];
      const bool held = per <= kScanPer;
      if (held) {
#pragma unroll
        for (int k = 0; k <= kScanPer; ++k) b[k] = lo + k <= hi ? p.expert_begin[lo + k] : 0;
      }
      int64_t tiles = 0;
      if (held) {
#pragma unroll
        for (int k = 0; k < kScanPer; ++k)
          tiles += lo + k < hi ? (b[k + 1] - b[k] + kTok - 1) / kTok : 0;
      } else {
        for (int64_t e = lo; e < hi; ++e)
          tiles += (p.expert_begin[e + 1] - p.expert_begin[e] + kTok - 1) / kTok;
      }
      int64_t incl = tiles;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int64_t o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off)
          incl += o;
      }
      if (ty >= incl - tiles && ty < incl) {
        int64_t local = ty - (incl - tiles);
        // Expert e's tiles: local < its count finds it (block-uniform over the lane's range).
        auto visit = [&](int64_t e, int64_t bb, int64_t end) {
          const int64_t te = (end - bb + kTok - 1) / kTok;
          if (local >= 0 && local < te) {
            found[0] = e;
            found[1] = bb + local * kTok;
            found[2] = end;
          }
          local -= te;
        };
        if (held) {
#pragma unroll
          for (int k = 0; k < kScanPer; ++k)
            if (lo + k < hi)
              visit(lo + k, b[k], b[k + 1]);
        } else {
          for (int64_t e = lo; e < hi; ++e) visit(e, p.expert_begin[e], p.expert_begin[e + 1]);
        }
      }
    }
  }
  __syncthreads();
  return found[0] >= 0;
}

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

struct Tile {
  int64_t e = 0;   // expert
  int64_t g0 = 0;  // first grouped pair
  int count = 0;   // pairs (<= kTok)
};

// Block-wide prologue: the block's tile and the activation row of each of its pairs (by_token: the
// token row, as gate/up reads x; else the grouped pair row, as down reads h). False for the whole
// block past the last tile or past the weight's rows.
__device__ bool tile_prologue(
    const Fp8ExpertFfnParams& p, int64_t r0, int64_t rows, bool by_token, Tile* tl, int32_t* xrow) {
  __shared__ int64_t found[3];
  if (r0 >= rows || !find_tile(p, blockIdx.y, found))
    return false;
  tl->e = found[0];
  tl->g0 = found[1];
  tl->count = static_cast<int>(imin(kTok, found[2] - tl->g0));
  if (threadIdx.x < kTok) {
    const int j = threadIdx.x;
    const int64_t g = tl->g0 + j;  // read only below count: pair_src ends at the last pair
    xrow[j] = j >= tl->count ? -1
              : by_token     ? static_cast<int32_t>((p.pair_src ? p.pair_src[g] : g) / p.k)
                             : static_cast<int32_t>(g);
  }
  __syncthreads();
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

// ---- MXFP4 experts on wgmma ------------------------------------------------------------------
// A block is one warpgroup and one tile of <= 8 pairs; its 64 MMA rows are two halves of 32 weight
// rows each: gate/up takes 32 rows of w1 (warps 0, 1) and the same 32 rows of w3 (warps 2, 3), so
// SwiGLU pairs warp w's sums with warp w + 2's through shared memory; down takes 64 rows of w2.
// Blocks of 32 output rows keep the batch-1 grid even: 384 blocks for 6 experts' gate/up, about
// three per SM, instead of 192 blocks of 64 rows (two on some SMs, one on the others).
//
// The block streams its rows' 128-wide K blocks (64 rows x 64 bytes and the rows' four E8M0
// scales) through a ring of kStages shared-memory stages by cp.async, 16 bytes per request, so
// that kStages - 1 blocks are in flight without registers. Per 32-wide K block (one scale per
// row): lane (g, t) of warp w reads word t (8 codes, K 8 t .. 8 t + 7) of rows 16 w + g and
// 16 w + g + 8 and re-encodes it as E4M3 without a table: an E2M1 code s|eem becomes the byte
// s << 7 | eem << 2, the code's value times 2^-6 exactly (normal and subnormal alike: E4M3's
// exponent field starts two bits higher and its bias is 6 larger). The even codes of the word
// (K 8 t, +2, +4, +6) are A's bytes 4 t .. 4 t + 3 and the odd ones bytes 16 + 4 t ..: the
// activations are staged in shared memory in that order. One m64n8k32 wgmma per 32-block sums its
// exact products in a fresh fp32 accumulator (the tensor core's summation, over 32 products
// only); the sums are scaled by the row's E8M0 scale into the 128-block's
// sum, which the activation scale (times 2^6) adds into the result in K order. The conversion
// costs 7 integer instructions per 8 weights against 15 for FP16, and the activations need none.
//
// Measured (H200, 4 V4-Flash layers, sixteenth session) against the FP16 mma.sync kernels these
// replace (registers-only loads, ~470 instructions per 16 rows x 128 K x 2 matrices): decode step
// -3% / -10% / -2% / -6% at batch 1 / 4 / 16 / 64; under ncu at batch 1 gate/up 41.5 -> 34.8 us,
// down 26.0 -> 20.7 us. The same wgmma kernels with 4-byte register loads instead of the ring
// were no faster at batch 1 and slower at batch 64 (faster at batch 4).

constexpr int kWgRows = 64;
constexpr int kWgThreads = 128;
constexpr int kStages = 5;
// A stage: 64 rows of 64 bytes at a pitch of 80 (lane (g, t)'s words of rows g = 0..7 fall in
// distinct banks), then the rows' scale words.
constexpr int kRowPitch = 80;
constexpr int kStageBytes = kWgRows * kRowPitch + kWgRows * 4;
// Shared memory: the activations (K bytes per token in core-matrix order), their scales
// [K / 128][kTok], the ring, and warps 2 and 3's sums for warps 0 and 1.
__host__ __device__ constexpr int64_t wg_x_bytes(int64_t k) {
  return k * kTok + (k / 128) * kTok * 4;
}
__host__ __device__ constexpr int64_t wg_smem_bytes(int64_t k) {
  return wg_x_bytes(k) + kStages * kStageBytes + 64 * 4 * 4;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Byte j of an E8M0 scale word as a float (E8M0 0 is 2^-127, subnormal; 255, NaN, never reaches
// these kernels: expert_gemv_check).
__device__ __forceinline__ float e8m0_at(uint32_t s, int j) {
  const uint32_t e = (s >> (8 * j)) & 0xFFu;
  return __uint_as_float(max(e << 23, 0x00400000u));
}

// The tile's `count` activation rows (xrow[0..count)) into shared memory: per 32-wide K block b,
// 256 bytes: the even-position bytes of each token (16 per token, token j at 16 j), then the
// odd-position ones; and the activation scales times 2^6 (undoing the codes' 2^-6) at
// [K / 128][kTok]. The columns of absent tokens keep whatever shared memory held: an MMA column
// depends on its own B column only, and absent columns are never stored.
__device__ void stage_x(
    const Fp8Acts& x, const int32_t* xrow, int count, int64_t k, uint8_t* smem) {
  const int64_t nb = k / 32;
  for (int64_t i = threadIdx.x; i < nb * count; i += blockDim.x) {
    const int64_t b = i / count;
    const int j = static_cast<int>(i % count);
    const uint8_t* p = x.codes + static_cast<int64_t>(xrow[j]) * x.ld + b * 32;
    const uint4 v0 = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 v1 = __ldg(reinterpret_cast<const uint4*>(p + 16));
    const uint4 e = make_uint4(prmt(v0.x, v0.y, 0x6420u),
                               prmt(v0.z, v0.w, 0x6420u),
                               prmt(v1.x, v1.y, 0x6420u),
                               prmt(v1.z, v1.w, 0x6420u));
    const uint4 o = make_uint4(prmt(v0.x, v0.y, 0x7531u),
                               prmt(v0.z, v0.w, 0x7531u),
                               prmt(v1.x, v1.y, 0x7531u),
                               prmt(v1.z, v1.w, 0x7531u));
    *reinterpret_cast<uint4*>(smem + b * 256 + 16 * j) = e;
    *reinterpret_cast<uint4*>(smem + b * 256 + 128 + 16 * j) = o;
  }
  auto* ss = reinterpret_cast<float*>(smem + k * kTok);
  const int64_t sld = x.ld / 128;
  for (int64_t i = threadIdx.x; i < (k / 128) * count; i += blockDim.x) {
    const int64_t kb = i / count;
    const int j = static_cast<int>(i % count);
    ss[kb * kTok + j] = __ldg(x.scales + xrow[j] * sld + kb) * 64.0f;
  }
  wgmma::fence_async_smem();
  __syncthreads();
}

// The block's 64 MMA rows: rows 0..31 start at d0 (scales s0), rows 32..63 at d1 (s1); ld / sld
// bytes per row of codes / scales (both halves of the same width).
struct WgRows {
  const uint8_t* d0;
  const uint8_t* d1;
  const uint8_t* s0;
  const uint8_t* s1;
  int64_t ld, sld;
};

// Rows r0.. of wa and r1.. of wb (32 each).
__device__ __forceinline__ WgRows wg_rows(const MatrixRef& wa,
                                          int64_t r0,
                                          const MatrixRef& wb,
                                          int64_t r1) {
  const int64_t ld = wa.cols / 2, sld = wa.cols / 32;
  return WgRows{static_cast<const uint8_t*>(wa.data) + r0 * ld,
                static_cast<const uint8_t*>(wb.data) + r1 * ld,
                static_cast<const uint8_t*>(wa.scale) + r0 * sld,
                static_cast<const uint8_t*>(wb.scale) + r1 * sld,
                ld,
                sld};
}

// K block kb of the block's rows into a stage: lane l copies 16-byte pieces l and l + 128 (row
// p / 4, piece p % 4: a row's 64 bytes by four neighbouring lanes; pieces 0..127 are rows 0..31)
// and, for l < 64, row l's scale word.
__device__ __forceinline__ void issue_block(const WgRows& rs, int64_t kb, uint8_t* st) {
  const int l = threadIdx.x;
  const int row = l >> 2;  // of each half
  const int part = l & 3;
  const int64_t off = row * rs.ld + kb * 64 + part * 16;
  cp_async16(st + row * kRowPitch + part * 16, rs.d0 + off);
  cp_async16(st + (row + 32) * kRowPitch + part * 16, rs.d1 + off);
  if (l < kWgRows)
    cp_async4(st + kWgRows * kRowPitch + l * 4,
              (l < 32 ? rs.s0 : rs.s1) + (l & 31) * rs.sld + kb * 4);
}

// One staged 128-wide K block: four 32-blocks, one wgmma each, on two accumulator sets in turn
// (block q + 1's MMA runs while block q's products are scaled); then the 128-block's sum times the
// activation scales of columns 2 t, 2 t + 1 into acc.
__device__ __forceinline__ void compute_block(
    const uint8_t* st, uint64_t desc0, int64_t kb, float2 xs, float (&acc)[4]) {
  const int lane = threadIdx.x & 31;
  const int row = 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);
  const int t = lane & 3;
  uint32_t wd[2][4], sc[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint8_t* r = st + (row + 8 * i) * kRowPitch + 4 * t;
#pragma unroll
    for (int q = 0; q < 4; ++q) wd[i][q] = *reinterpret_cast<const uint32_t*>(r + 16 * q);
    sc[i] = *reinterpret_cast<const uint32_t*>(st + kWgRows * kRowPitch + (row + 8 * i) * 4);
  }
  float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float cs[2][4];
  auto issue = [&](int q) {
    uint32_t a[4];
    numeric::fp4x8_to_e4m3_scaled(wd[0][q], &a[0], &a[2]);
    numeric::fp4x8_to_e4m3_scaled(wd[1][q], &a[1], &a[3]);
    wgmma::fence();
    // 32-block 4 kb + q: 256 bytes on (>> 4 in the descriptor's address field).
    wgmma::mma_m64n8k32_e4m3(a, desc0 + static_cast<uint64_t>((kb * 4 + q) * 16), cs[q & 1], false);
    wgmma::commit();
  };
  auto scale = [&](int q) {
    wgmma::fence_regs(cs[q & 1]);
    const float f0 = e8m0_at(sc[0], q);
    const float f1 = e8m0_at(sc[1], q);
    part[0] = fmaf(cs[q & 1][0], f0, part[0]);
    part[1] = fmaf(cs[q & 1][1], f0, part[1]);
    part[2] = fmaf(cs[q & 1][2], f1, part[2]);
    part[3] = fmaf(cs[q & 1][3], f1, part[3]);
  };
  issue(0);
  issue(1);
  wgmma::wait<1>();
  scale(0);
  issue(2);
  wgmma::wait<1>();
  scale(1);
  issue(3);
  wgmma::wait<1>();
  scale(2);
  wgmma::wait<0>();
  scale(3);
  acc[0] = fmaf(part[0], xs.x, acc[0]);
  acc[1] = fmaf(part[1], xs.y, acc[1]);
  acc[2] = fmaf(part[2], xs.x, acc[2]);
  acc[3] = fmaf(part[3], xs.y, acc[3]);
}

// The block's row groups 0 .. groups - 1 (rows_of(i): their WgRows), each over all of K, as one
// stream of 128-wide K blocks through the ring (so the next group's first blocks are in flight
// while this one finishes); done(i, acc) takes group i's sums (this lane's C fragment; every
// thread calls it). stage (every thread calls this once) runs after the first blocks' copies are
// issued and must leave the activations staged for stage_x's layout.
template <class RowsOf, class Stage, class Done>
__device__ __forceinline__ void stream_fp4(RowsOf&& rows_of,
                                           int groups,
                                           int64_t k,
                                           const uint8_t* smem,
                                           uint8_t* ring,
                                           Stage&& stage,
                                           Done&& done) {
  const int t = threadIdx.x & 3;
  const int64_t n = k / 128;
  const int64_t total = groups * n;
  // The next block to issue: group ig, K block ikb (position j = ig * n + ikb of the stream).
  int ig = 0;
  int64_t ikb = 0;
  WgRows rs = rows_of(0);
  auto issue_next = [&](uint8_t* st) {
    issue_block(rs, ikb, st);
    if (++ikb == n) {
      ikb = 0;
      if (++ig < groups)
        rs = rows_of(ig);
    }
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < total)
      issue_next(ring + j * kStageBytes);
    cp_async_commit();
  }
  stage();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // B of a 32-block: its two 16-byte K halves are core matrices 128 bytes apart; N = 8 is one
  // 8-row group, so the stride field is never used (set equal to the K step).
  const uint64_t desc0 = wgmma::desc_k_major(smem_addr(smem), 128, 128);
  const auto* ss = reinterpret_cast<const float*>(smem + k * kTok);
  int g = 0;
  int64_t kb = 0;
  for (int64_t j = 0; j < total; ++j) {
    cp_async_wait<kStages - 2>();  // this lane's copies of block j landed
    __syncthreads();               // everyone's; and stage (j - 1) % kStages is no longer read
    if (j + kStages - 1 < total)
      issue_next(ring + ((j + kStages - 1) % kStages) * kStageBytes);
    cp_async_commit();
    compute_block(ring + (j % kStages) * kStageBytes,
                  desc0,
                  kb,
                  *reinterpret_cast<const float2*>(ss + kb * kTok + 2 * t),
                  acc);
    if (++kb == n) {
      done(g++, acc);
      kb = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
    }
  }
}

// Row groups per block: `groups` consecutive ones (one prologue and one staging of the tile's
// activations for all of them), fewer at the end of the rows.
__global__ void __launch_bounds__(kWgThreads, 3)
    wg_gate_up_kernel(Fp8ExpertFfnParams p, int groups) {
  pdl_begin();
  extern __shared__ __align__(128) uint8_t wg_smem[];
  __shared__ int32_t xrow[kTok];
  constexpr int64_t kRows = kWgRows / 2;  // per group: 32 rows of w1 and the same of w3
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups * kRows;
  Tile tl;
  if (!tile_prologue(p, first, p.inter, true, &tl, xrow))
    return;
  const auto ng = static_cast<int>(imin(groups, (p.inter - first) / kRows));
  const int64_t xb = wg_x_bytes(p.hidden);
  auto* red = reinterpret_cast<float*>(wg_smem + xb + kStages * kStageBytes);
  const MatrixRef w1 = p.w1[tl.e];
  const MatrixRef w3 = p.w3[tl.e];
  const int warp = threadIdx.x >> 5;
  const int l = threadIdx.x & 63;
  const int lane = threadIdx.x & 31;
  const int t = lane & 3;
  stream_fp4([&](int i) { return wg_rows(w1, first + i * kRows, w3, first + i * kRows); },
             ng,
             p.hidden,
             wg_smem,
             wg_smem + xb,
             [&] { stage_x(p.x, xrow, tl.count, p.hidden, wg_smem); },
             [&](int i, const float(&acc)[4]) {
               // Warps 2 and 3 (w3's rows) hand their sums to warps 0 and 1 (the same rows of w1).
               if (warp >= 2) {
#pragma unroll
                 for (int c = 0; c < 4; ++c) red[c * 64 + l] = acc[c];
               }
               __syncthreads();
               if (warp >= 2)
                 return;
               const int64_t rw = first + i * kRows + 16 * warp + (lane >> 2);
#pragma unroll
               for (int c = 0; c < 4; ++c) {
                 const int j = 2 * t + (c & 1);
                 if (j >= tl.count)
                   continue;
                 const int64_t pair = tl.g0 + j;
                 const float gate = p.gates ? p.gates[p.pair_src ? p.pair_src[pair] : pair] : 1.0f;
                 p.h[pair * p.inter + rw + 8 * (c >> 1)] =
                     swiglu_gated(acc[c], red[c * 64 + l], p.swiglu_limit, gate);
               }
             });
}

__global__ void __launch_bounds__(kWgThreads, 3) wg_down_kernel(Fp8ExpertFfnParams p, int groups) {
  pdl_begin();
  extern __shared__ __align__(128) uint8_t wg_smem[];
  __shared__ int32_t xrow[kTok];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups * kWgRows;
  Tile tl;
  if (!tile_prologue(p, first, p.hidden, false, &tl, xrow))
    return;
  const auto ng = static_cast<int>(imin(groups, (p.hidden - first) / kWgRows));
  const Fp8Acts hq{p.h_codes, p.h_scales, (p.inter + 127) / 128 * 128};  // fp8_acts_ld
  const MatrixRef w2 = p.w2[tl.e];
  const int lane = threadIdx.x & 31;
  const int t = lane & 3;
  stream_fp4(
      [&](int i) {
        const int64_t r = first + i * kWgRows;
        return wg_rows(w2, r, w2, r + kWgRows / 2);
      },
      ng,
      p.inter,
      wg_smem,
      wg_smem + wg_x_bytes(p.inter),
      [&] { stage_x(hq, xrow, tl.count, p.inter, wg_smem); },
      [&](int i, const float(&acc)[4]) {
        const int64_t rw = first + i * kWgRows + 16 * (threadIdx.x >> 5) + (lane >> 2);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = 2 * t + (c & 1);
          if (j < tl.count)
            p.y[(tl.g0 + j) * p.hidden + rw + 8 * (c >> 1)] = acc[c];
        }
      });
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

// From this many tiles (pairs in 8-token tiles, per expert) each warp takes whole rows: the
// GPU has enough blocks without splitting K, and the warps skip the reduction's barriers (which
// held a quarter of the warps' cycles at batch 64). Below, four warps share each row's K.
constexpr int64_t kWholeRowsFromTiles = 32;

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

// Dynamic shared memory past the default 48 KiB needs the kernel's opt-in (hidden > 5120).
template <typename K>
Status allow_smem(K kernel, int64_t bytes) {
  if (bytes <= 48 * 1024)
    return Status();
  cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  return launched("expert_gemv shared memory opt-in");
}

// Row groups per block of the wgmma kernels: 1 while the grid is within a few waves (batch 1: 384
// blocks, about three per SM); with many tiles, 4 (each block pays its prologue and the staging of
// its tile's activations once for 4 groups).
int wg_groups(int64_t tiles) {
  return tiles >= kWholeRowsFromTiles ? 4 : 1;
}

Status launch_wg(const Fp8ExpertFfnParams& p, int64_t tiles, cudaStream_t s) {
  const int64_t s1 = wg_smem_bytes(p.hidden);
  const int64_t s2 = wg_smem_bytes(p.inter);
  DSI_RETURN_IF_ERROR(allow_smem(wg_gate_up_kernel, s1));
  DSI_RETURN_IF_ERROR(allow_smem(wg_down_kernel, s2));
  const int groups = wg_groups(tiles);
  const dim3 g1(static_cast<unsigned>(ceil_div(p.inter, kWgRows / 2 * groups)),
                static_cast<unsigned>(tiles));
  launch_pdl(wg_gate_up_kernel, g1, kWgThreads, static_cast<size_t>(s1), s, p, groups);
  DSI_RETURN_IF_ERROR(launched("expert_gemv gate/up launch"));
  DSI_RETURN_IF_ERROR(launch_quantize_expert_h(p, s));
  const dim3 g2(static_cast<unsigned>(ceil_div(p.hidden, kWgRows * groups)),
                static_cast<unsigned>(tiles));
  launch_pdl(wg_down_kernel, g2, kWgThreads, static_cast<size_t>(s2), s, p, groups);
  return launched("expert_gemv down launch");
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
    return launch_wg(p, tiles, stream);
  return launch_fp8(p, tiles, stream);
}

}  // namespace dsinfer::cuda
