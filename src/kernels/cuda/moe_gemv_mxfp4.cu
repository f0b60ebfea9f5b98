// The MXFP4 experts' grouped GEMVs for decode (moe_gemv.h) on FP8 wgmma.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/moe_gemv_tiles.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/wgmma_fp8.cuh"
#include "numeric/float_formats.h"

namespace dsinfer::cuda::moe_gemv_detail {
namespace {

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
// were no faster at batch 1 and slower at batch 64 (faster at batch 4). Seventeenth session: two
// or four K blocks per ring stage instead of one (longer runs of each row per request) took the
// decode step -2% / -1% / -7% / -8% at batch 1 / 4 / 16 / 64; ncu at batch 64 gate/up 963 -> 847
// us with 2 (867 with 4), down 440 -> 393 us with 4 (422 with 2). A grid of only the blocks that
// fit at once, each looping over the work items (no last partial wave, no blocks past the last
// tile), was slower: batch 16 / 64 +6% / +9%.

constexpr int kWgRows = 64;
constexpr int kWgThreads = 128;
// The ring for kRun 128-wide K blocks per stage (kRun x 64 contiguous bytes of each row per
// request run): a stage holds 64 rows at a pitch of 64 kRun + 16 bytes (lane (g, t)'s words of
// rows g = 0..7 fall in distinct banks), then the rows' scale words [row][kRun]. Stages: 4 of 2 K
// blocks (gate/up: 72 KiB of shared memory per block at V4-Flash's widths, three blocks per SM
// still) or 2 of 4 (down). Measured (H200, seventeenth session, ncu per layer at batch 64):
// gate/up 855 -> 788 us with 4 stages instead of 3; down 395 -> 428 us with 3 instead of 2, so
// down keeps 2; 7 stages of 1 and 5 of 2 were slower still (decode +2% / +9% / +11% at batch 1 /
// 16 / 64).
template <int kRun>
struct Ring {
  static_assert(kRun == 2 || kRun == 4, "expert GEMV ring: 2 or 4 K blocks per stage");
  static constexpr int kStages = kRun == 2 ? 4 : 2;
  static constexpr int kPitch = 64 * kRun + 16;
  static constexpr int kScales = kWgRows * kPitch;
  static constexpr int kBytes = kScales + kWgRows * 4 * kRun;
};
// Shared memory: the activations (K bytes per token in core-matrix order), their scales
// [K / 128][kTok], the ring, and warps 2 and 3's sums for warps 0 and 1.
__host__ __device__ constexpr int64_t wg_x_bytes(int64_t k) {
  return k * kTok + (k / 128) * kTok * 4;
}
template <int kRun>
constexpr int64_t wg_smem_bytes(int64_t k) {
  return wg_x_bytes(k) + Ring<kRun>::kStages * Ring<kRun>::kBytes + 64 * 4 * 4;
}
template <int kRun>
__device__ __forceinline__ float* wg_red(uint8_t* smem, int64_t k) {
  return reinterpret_cast<float*>(smem + wg_x_bytes(k) + Ring<kRun>::kStages * Ring<kRun>::kBytes);
}

using cp_async::smem_u32;

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

// K blocks kb0 .. kb0 + nkb - 1 (nkb <= kRun) of the block's rows into a stage: a row's
// 64 nkb bytes by 4 nkb neighbouring lanes in 16-byte pieces (rows 0..31 from d0, 32..63 from
// d1), and the rows' scale words.
template <int kRun>
__device__ __forceinline__ void issue_block(const WgRows& rs, int64_t kb0, int nkb, uint8_t* st) {
  using R = Ring<kRun>;
  const int l = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 2 * kRun; ++i) {
    const int pc = l + kWgThreads * i;
    const int row = pc / (4 * kRun);
    const int part = pc % (4 * kRun);
    if (part / 4 < nkb)
      cp_async::copy16(st + row * R::kPitch + part * 16,
                       (row < 32 ? rs.d0 : rs.d1) + (row & 31) * rs.ld + kb0 * 64 + part * 16);
  }
#pragma unroll
  for (int i = 0; i < (kRun + 1) / 2; ++i) {
    const int q = l + kWgThreads * i;  // (row q / kRun, block q % kRun)
    const int row = q / kRun;
    const int sub = q % kRun;
    if (q < kWgRows * kRun && sub < nkb)
      cp_async::copy4(st + R::kScales + q * 4,
                      (row < 32 ? rs.s0 : rs.s1) + (row & 31) * rs.sld + (kb0 + sub) * 4);
  }
}

// One staged 128-wide K block: four 32-blocks, one wgmma each, on two accumulator sets in turn
// (block q + 1's MMA runs while block q's products are scaled); then the 128-block's sum times the
// activation scales of columns 2 t, 2 t + 1 into acc.
// w: the block's first row in the stage (rows `pitch` bytes apart); sc: its first row's scale
// word (rows sstride bytes apart).
__device__ __forceinline__ void compute_block(const uint8_t* w,
                                              int pitch,
                                              const uint8_t* sc_base,
                                              int sstride,
                                              uint64_t desc0,
                                              int64_t kb,
                                              float2 xs,
                                              float (&acc)[4]) {
  const int lane = threadIdx.x & 31;
  const int row = 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);
  const int t = lane & 3;
  uint32_t wd[2][4], sc[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint8_t* r = w + (row + 8 * i) * pitch + 4 * t;
#pragma unroll
    for (int q = 0; q < 4; ++q) wd[i][q] = *reinterpret_cast<const uint32_t*>(r + 16 * q);
    sc[i] = *reinterpret_cast<const uint32_t*>(sc_base + (row + 8 * i) * sstride);
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
template <int kRun, class RowsOf, class Stage, class Done>
__device__ __forceinline__ void stream_fp4(RowsOf&& rows_of,
                                           int groups,
                                           int64_t k,
                                           const uint8_t* smem,
                                           uint8_t* ring,
                                           Stage&& stage,
                                           Done&& done) {
  using R = Ring<kRun>;
  constexpr int kStages = R::kStages;
  const int t = threadIdx.x & 3;
  const int64_t n = k / 128;
  const int64_t per = (n + kRun - 1) / kRun;  // stages per group
  const int64_t total = groups * per;
  // The next stage to issue: group ig, its stage is (position ig * per + is of the stream).
  int ig = 0;
  int64_t is = 0;
  WgRows rs = rows_of(0);
  auto issue_next = [&](uint8_t* st) {
    const int64_t kb0 = is * kRun;
    issue_block<kRun>(rs, kb0, static_cast<int>(imin(kRun, n - kb0)), st);
    if (++is == per) {
      is = 0;
      if (++ig < groups)
        rs = rows_of(ig);
    }
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < total)
      issue_next(ring + j * R::kBytes);
    cp_async::commit();
  }
  stage();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint64_t desc0 = wgmma::desc_k_major(smem_u32(smem), 128, 128);
  const auto* ss = reinterpret_cast<const float*>(smem + k * kTok);
  int g = 0;
  int64_t s = 0;  // stage of the current group
  for (int64_t j = 0; j < total; ++j) {
    cp_async::wait<kStages - 2>();  // this lane's copies of stage j landed
    __syncthreads();                // everyone's; and stage (j - 1) % kStages is no longer read
    if (j + kStages - 1 < total)
      issue_next(ring + ((j + kStages - 1) % kStages) * R::kBytes);
    cp_async::commit();
    const uint8_t* st = ring + (j % kStages) * R::kBytes;
    const int64_t kb0 = s * kRun;
#pragma unroll
    for (int sub = 0; sub < kRun; ++sub) {
      const int64_t kb = kb0 + sub;
      if (kb < n)
        compute_block(st + sub * 64,
                      R::kPitch,
                      st + R::kScales + sub * 4,
                      4 * kRun,
                      desc0,
                      kb,
                      *reinterpret_cast<const float2*>(ss + kb * kTok + 2 * t),
                      acc);
    }
    if (++s == per) {
      done(g++, acc);
      s = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
    }
  }
}

// Row groups per block: `groups` consecutive ones (one prologue and one staging of the tile's
// activations for all of them), fewer at the end of the rows.
template <int kRun>
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
  float* red = wg_red<kRun>(wg_smem, p.hidden);
  const MatrixRef w1 = p.w1[tl.e];
  const MatrixRef w3 = p.w3[tl.e];
  const int warp = threadIdx.x >> 5;
  const int l = threadIdx.x & 63;
  const int lane = threadIdx.x & 31;
  const int t = lane & 3;
  stream_fp4<kRun>([&](int i) { return wg_rows(w1, first + i * kRows, w3, first + i * kRows); },
                   ng,
                   p.hidden,
                   wg_smem,
                   wg_smem + xb,
                   [&] { stage_x(p.x, xrow, tl.count, p.hidden, wg_smem); },
                   [&](int i, const float(&acc)[4]) {
                     // Warps 2 and 3 (w3's rows) hand their sums to warps 0 and 1 (the same rows of
                     // w1).
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
                       const float gate =
                           p.gates ? p.gates[p.pair_src ? p.pair_src[pair] : pair] : 1.0f;
                       p.h[pair * p.inter + rw + 8 * (c >> 1)] =
                           swiglu_gated(acc[c], red[c * 64 + l], p.swiglu_limit, gate);
                     }
                   });
}

template <int kRun>
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
  stream_fp4<kRun>(
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

// K blocks per ring stage (16-byte requests covering 64 kRun contiguous bytes of a row), measured
// on the H200 against 1 per stage (docs/performance.md, seventeenth session): gate/up at 2 (4
// leaves too few stages in flight at K = 4096 for batch 1), down at 4.
constexpr int kGateUpRun = 2;
constexpr int kDownRun = 4;

}  // namespace

Status launch_mxfp4(const Fp8ExpertFfnParams& p, int64_t tiles, cudaStream_t s) {
  const int64_t s1 = wg_smem_bytes<kGateUpRun>(p.hidden);
  const int64_t s2 = wg_smem_bytes<kDownRun>(p.inter);
  DSI_RETURN_IF_ERROR(allow_smem(wg_gate_up_kernel<kGateUpRun>, s1));
  DSI_RETURN_IF_ERROR(allow_smem(wg_down_kernel<kDownRun>, s2));
  const int groups = wg_groups(tiles);
  const dim3 g1(static_cast<unsigned>(ceil_div(p.inter, kWgRows / 2 * groups)),
                static_cast<unsigned>(tiles));
  launch_pdl(wg_gate_up_kernel<kGateUpRun>, g1, kWgThreads, static_cast<size_t>(s1), s, p, groups);
  DSI_RETURN_IF_ERROR(launched("expert_gemv gate/up launch"));
  DSI_RETURN_IF_ERROR(launch_quantize_expert_h(p, s));
  const dim3 g2(static_cast<unsigned>(ceil_div(p.hidden, kWgRows * groups)),
                static_cast<unsigned>(tiles));
  launch_pdl(wg_down_kernel<kDownRun>, g2, kWgThreads, static_cast<size_t>(s2), s, p, groups);
  return launched("expert_gemv down launch");
}

}  // namespace dsinfer::cuda::moe_gemv_detail
