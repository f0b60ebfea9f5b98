// Grouped expert GEMVs for decode (moe_gemv.h): weights from global memory into registers,
// converted to FP16 there, FP16 m16n8k16 MMAs with weights as A (16 rows) and tokens as B (8).
#include <algorithm>

#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/fp8_mma_tile.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kWarps = 4;      // per block, each a quarter of K of the block's rows
constexpr int kWarpRows = 16;  // rows per block (the MMA's M)
constexpr int kTok = static_cast<int>(kExpertGemvTokens);
constexpr int64_t kMaxGridY = 65535;
// How far (in binades) the E8M0 exponents of a 128-block's 32-blocks may lie from its first one:
// the FP16 weights absorb the difference (|o| <= 13 keeps every E2M1 value a normal FP16).
constexpr int kMaxOffset = 13;

enum class Fmt { kFp4, kFp8 };

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

// prmt in its generic mode: a selector nibble with bit 3 set replicates the selected byte's sign.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Four E2M1 codes (bits 0..15, first lowest) -> FP16 pairs (codes 0, 1) and (2, 3), each value
// times 2^o where o is folded into the magnitude table (lut0, lut1: FP16 high bytes of |E2M1|;
// every FP16 of an E2M1 value has a zero low byte).
__device__ __forceinline__ void fp4x4_to_f16(
    uint32_t v, uint32_t lut0, uint32_t lut1, uint32_t* r01, uint32_t* r23) {
  const uint32_t mag = prmt(lut0, lut1, v & 0x7777u);
  const uint32_t pos = prmt(0x7F7F7F7Fu, 0x7F7F7F7Fu, v);  // 0x7F where the sign is 0, else 0
  const uint32_t hi = mag | (~(pos << 7) & 0x80808080u);   // bit 0 of each byte -> sign
  *r01 = prmt(hi, 0u, 0x1404u);
  *r23 = prmt(hi, 0u, 0x3424u);
}

// The magnitude table scaled by 2^o (|o| <= 13 keeps every entry a normal FP16).
__device__ __forceinline__ void fp4_lut(int o, uint32_t* lut0, uint32_t* lut1) {
  const uint32_t d = static_cast<uint32_t>(o * 4);  // the exponent field starts at bit 2
  *lut0 = 0x3E3C3800u + d * 0x01010100u;            // |E2M1| 0, 0.5, 1, 1.5 (0 stays 0)
  *lut1 = 0x46444240u + d * 0x01010101u;            // 2, 3, 4, 6
}

// One lane's share of rows g and g + 8 of a warp's 16 rows for one 128-wide K block: the 32
// weights at K offset 32 t of the block.
template <Fmt F>
struct WFrag {
  uint4 v[2][F == Fmt::kFp4 ? 1 : 2];
  uint32_t s[2];  // MXFP4: the four E8M0 scales of each row's block
  float fs;       // FP8: the 128x128 block's scale
};

template <Fmt F>
__device__ __forceinline__ void load_w(
    const MatrixRef& w, int64_t r0, int g, int t, int64_t kb, WFrag<F>* f) {
  const auto* d = static_cast<const uint8_t*>(w.data);
  if constexpr (F == Fmt::kFp4) {
    const auto* s = static_cast<const uint8_t*>(w.scale);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t row = r0 + g + 8 * i;
      f->v[i][0] = ld_stream(d + row * (w.cols / 2) + kb * 64 + 16 * t);
      f->s[i] = __ldg(reinterpret_cast<const uint32_t*>(s + row * (w.cols / 32) + kb * 4));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* p = d + (r0 + g + 8 * i) * w.cols + kb * 128 + 32 * t;
      f->v[i][0] = ld_stream(p);
      f->v[i][1] = ld_stream(p + 16);
    }
    f->fs = fp8_block_scale(
        w.scale, w.scale_dtype == DType::kF32, (r0 / 128) * ((w.cols + 127) / 128) + kb);
  }
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// c = the block's products for rows g, g + 8 x tokens 2t, 2t + 1 (the MMA's C fragment), and the
// rows' factors fa, fb that turn them into values (before the activation scale). The 8 MMAs on
// two accumulator chains (halving the dependent chain) measured no faster (fourteenth session:
// the kernel issues every 6-7 cycles per warp with no dominant stall, at 11-14 warps per SM).
template <Fmt F>
__device__ __forceinline__ void block_mma(
    const WFrag<F>& f, const uint32_t (&xb)[16], int t, float (&c)[4], float* fa, float* fb) {
  c[0] = c[1] = c[2] = c[3] = 0.0f;
  if constexpr (F == Fmt::kFp4) {
    // Relative to the block's first 32-block (e0): |e - e0| <= 13, counted at load time by
    // expert_gemv_check. Scale 2^(e0 - 127) as a float: E8M0 0 is 2^-127 (subnormal).
    uint32_t lut[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t s = f.s[i];
      const int e0 = static_cast<int>(s & 0xFFu);
      const int e = static_cast<int>((s >> (8 * t)) & 0xFFu);
      fp4_lut(e - e0, &lut[i][0], &lut[i][1]);
      const float scale = __int_as_float(e0 != 0 ? e0 << 23 : 0x00400000);
      (i == 0 ? *fa : *fb) = scale;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a[4];
        fp4x4_to_f16(word(f.v[0][0], q) >> (16 * h), lut[0][0], lut[0][1], &a[0], &a[2]);
        fp4x4_to_f16(word(f.v[1][0], q) >> (16 * h), lut[1][0], lut[1][1], &a[1], &a[3]);
        const int st = 2 * q + h;
        const uint32_t b[2] = {xb[2 * st], xb[2 * st + 1]};
        mma::mma_f16(c, a, b);
      }
    }
  } else {
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
template <Fmt F, int M, bool Whole>
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
  WFrag<F> fa[M], fb[M];
  XFrag xa, xb;
  auto load = [&](int64_t j, WFrag<F>(&f)[M], XFrag& x) {
    const int64_t kb = kb0 + j * kstep;
#pragma unroll
    for (int m = 0; m < M; ++m) load_w(w[m], r0, g, t, kb, &f[m]);
    load_x(x_acts, xrow, g, t, kb, &x);
  };
  auto compute = [&](const WFrag<F>(&f)[M], const XFrag& x) {
    uint32_t xh[16];
    x_f16(x, xh);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float c[4], sa, sb;
      block_mma(f[m], xh, t, c, &sa, &sb);
      accumulate(c, sa, sb, x, acc[m]);
    }
  };
  load(0, fa, xa);
  if constexpr (F == Fmt::kFp8) {
    // FP8 rows hold twice the registers: one set plus the next block's loads (copied over).
    for (int64_t j = 0; j < n; ++j) {
      if (j + 1 < n)
        load(j + 1, fb, xb);
      compute(fa, xa);
#pragma unroll
      for (int m = 0; m < M; ++m) fa[m] = fb[m];
      xa = xb;
    }
    return;
  }
  // Both sets' loads are issued together (a row's 128 contiguous bytes requested at once), after
  // both sets computed: 1-2% faster at batch 16 and 64 than refilling each set right after its
  // own compute (fifteenth session). What bounds these kernels is the instruction issue of the
  // FP4 -> FP16 conversion, not the bytes in flight: the MXFP4 weights streamed through a cp.async
  // ring in shared memory (80 registers, 20 warps per SM, 3x the bytes in flight) measured
  // 10-15% slower at batch 4-64 and no faster at batch 1.
  if (n > 1)
    load(1, fb, xb);
  for (int64_t j = 0; j < n; j += 2) {
    compute(fa, xa);
    if (j + 1 < n)
      compute(fb, xb);
    if (j + 2 < n)
      load(j + 2, fa, xa);
    if (j + 3 < n)
      load(j + 3, fb, xb);
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

template <Fmt F, bool Whole>
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
        stream_rows<F, 2, true>(w, p.x, xrow, r0, p.hidden / 128, acc);
        store(acc, r0);
      }
    } else {
      stream_rows<F, 2, false>(w, p.x, xrow, base, p.hidden / 128, acc);
      if (reduce_warps<2>(acc))
        store(acc, base);
      __syncthreads();  // reduce_warps' shared partials are rewritten by the next group
    }
  }
}

template <Fmt F, bool Whole>
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
        stream_rows<F, 1, true>(w, hq, xrow, r0, p.inter / 128, acc);
        store(acc, r0);
      }
    } else {
      stream_rows<F, 1, false>(w, hq, xrow, base, p.inter / 128, acc);
      if (reduce_warps<1>(acc))
        store(acc, base);
      __syncthreads();
    }
  }
}

// Counts the (row, 128-block)s of MXFP4 matrix blockIdx.y (w1, w3, w2 of every expert) whose
// scales the FP16 weights cannot absorb; a scale array that is not 4-byte aligned counts once.
__global__ void gemv_check_kernel(
    const MatrixRef* w1, const MatrixRef* w3, const MatrixRef* w2, int64_t n_experts, int* bad) {
  const int64_t m = blockIdx.y;
  const int64_t which = m / n_experts;
  const MatrixRef w = (which == 0 ? w1 : which == 1 ? w3 : w2)[m % n_experts];
  if (w.format != WeightFormat::kMxfp4)
    return;
  const auto* s = static_cast<const uint8_t*>(w.scale);
  if (blockIdx.x == 0 && threadIdx.x == 0 && (reinterpret_cast<uintptr_t>(s) & 3u) != 0)
    atomicAdd(bad, 1);
  const int64_t kbs = w.cols / 128;
  const int64_t total = w.rows * kbs;
  int count = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t* b = s + (i / kbs) * (w.cols / 32) + (i % kbs) * 4;
    bool out = false;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      out |= b[j] == 255 || abs(static_cast<int>(b[j]) - b[0]) > kMaxOffset;
    count += out;
  }
  if (count > 0)
    atomicAdd(bad, count);
}

// From this many tiles (pairs in 8-token tiles, per expert) each warp takes whole rows: the
// GPU has enough blocks without splitting K, and the warps skip the reduction's barriers (which
// held a quarter of the warps' cycles at batch 64). Below, four warps share each row's K.
constexpr int64_t kWholeRowsFromTiles = 32;

template <Fmt F, bool Whole>
Status launch_mode(const Fp8ExpertFfnParams& p, int64_t tiles, int gu, int gd, cudaStream_t s) {
  const dim3 g1(static_cast<unsigned>(ceil_div(p.inter, group_rows<Whole>() * gu)),
                static_cast<unsigned>(tiles));
  launch_pdl(gemv_gate_up_kernel<F, Whole>, g1, kWarps * 32, 0, s, p, gu);
  DSI_RETURN_IF_ERROR(launched("expert_gemv gate/up launch"));
  DSI_RETURN_IF_ERROR(launch_quantize_expert_h(p, s));
  const dim3 g2(static_cast<unsigned>(ceil_div(p.hidden, group_rows<Whole>() * gd)),
                static_cast<unsigned>(tiles));
  launch_pdl(gemv_down_kernel<F, Whole>, g2, kWarps * 32, 0, s, p, gd);
  return launched("expert_gemv down launch");
}

// Row groups per block for few tiles: as many as keep the grid within one wave of `per_sm`
// blocks per SM, each block paying the tile prologue once (batch 1 under ncu, twelfth session:
// down 1,536 -> 516 blocks, 28.8 -> 26 us; gate/up 768 -> 384 blocks, 41 us either way).
int64_t groups_for_one_wave(int64_t rows, int64_t tiles, int per_sm) {
  const int64_t blocks = ceil_div(rows, kWarpRows) * tiles;
  return std::max<int64_t>(1, ceil_div(blocks, static_cast<int64_t>(sm_count()) * per_sm));
}

template <Fmt F>
Status launch_fmt(const Fp8ExpertFfnParams& p, int64_t tiles, cudaStream_t s) {
  if (tiles >= kWholeRowsFromTiles)
    return launch_mode<F, true>(p, tiles, 1, 1, s);
  const auto gu = static_cast<int>(groups_for_one_wave(p.inter, tiles, kGateUpMinBlocks));
  const auto gd = static_cast<int>(groups_for_one_wave(p.hidden, tiles, kDownMinBlocks));
  return launch_mode<F, false>(p, tiles, gu, gd, s);
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
    return launch_fmt<Fmt::kFp4>(p, tiles, stream);
  return launch_fmt<Fmt::kFp8>(p, tiles, stream);
}

}  // namespace dsinfer::cuda
