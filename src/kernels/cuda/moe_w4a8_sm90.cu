// Grouped W4A8 expert GEMMs on FP8 wgmma (moe_w4a8_sm90.h).
//
// A persistent block of three warpgroups walks its tiles (64 grouped rows x 256 weight rows,
// ordered expert by expert, then weight tile, then row tile, so that the blocks running at once
// share the weight tiles and the expert's activations in L2) as one stream of 128-wide K steps:
//   - warpgroup 0 copies each step's activation tile, raw MXFP4 weight tile, 32-block exponents,
//     block exponents and activation scales into a ring of kStages stages by cp.async, kStages - 1
//     steps ahead;
//   - warpgroups 1 and 2 take 128 weight rows each (every one of the tile's 64 grouped rows): per
//     step s, the four m64n128k32 MMAs of s into a fresh accumulator; while they run, the E4M3
//     weight tile of step s + 1 (a weight row per thread: an E2M1 code's magnitude through a byte
//     permute of the 32-block's 8-entry table of e2m1 x 2^(s - S) in E4M3, its sign from a second
//     permute) into the other of two buffers; then the partial sums of s times the activation and
//     weight scales into the tile's sums (the FP8 copy's promotion: every scale a power of two),
//     and a finished tile into d.
// Named barriers hand the stages over: full[s] (the loads of a stage landed: the loader arrives,
// the MMA warpgroups wait), empty[s] (the MMA warpgroups are done with a stage that will be
// refilled: they arrive, the loader waits) and one among the MMA warpgroups per step (the next
// E4M3 tile complete, this one's MMAs done on both sides).
//
// Speed (H200, twenty-first session): bit for bit the FP8 copy's results at 2.3x its time at
// 8,192 tokens of V4-Flash's routed experts and 1.7x at 128-1,024: every converted weight tile
// serves only 64 rows, and the conversion's ~230 instructions per thread and step keep the
// warps' issue slots busier than the tensor cores. Weights as the MMAs' A operand, converted in
// registers (no shared-memory round trip) against 128-256 grouped rows, is the next step.
// compute-sanitizer, run on this session's earlier versions of the kernel (not on this one):
// memcheck clean; racecheck reported shared-memory writes against earlier reads that bar.arrive /
// bar.sync pairs order (a pattern the tool does not model) on the first version, and two errors
// it did not print on the second: to be run on this one with a higher print limit.
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/moe_w4a8_sm90.h"
#include "kernels/cuda/wgmma_fp8.cuh"
#include "numeric/float_formats.h"

namespace dsinfer::cuda {
namespace {

constexpr int kBM = 64;     // grouped rows per tile
constexpr int kBN = 256;    // weight rows per tile (two MMA warpgroups of 128)
constexpr int kHalf = 128;  // weight rows per MMA warpgroup
constexpr int kBK = 128;    // K per step
constexpr int kStages = 4;
constexpr int kAhead = kStages - 1;  // steps loaded ahead
constexpr int kThreads = 384;
constexpr int kRawPitch = 80;  // bytes per raw weight row in a stage (64 used; conflict-free)
constexpr int kMaxExperts = 1024;

// Load stage layout (bytes from the stage's 1,024-aligned base).
constexpr int kOffA = 0;                            // [64][128] E4M3, 128-byte swizzle
constexpr int kOffRaw = kOffA + kBM * kBK;          // [256][kRawPitch] packed E2M1
constexpr int kOffSub = kOffRaw + kBN * kRawPitch;  // [256] u32: the row's four 32-block exponents
constexpr int kOffExp = kOffSub + kBN * 4;          // [256] u8: block exponents
constexpr int kOffSa = kOffExp + kBN;               // [64] f32: activation scales
constexpr int kStageBytes = (kOffSa + kBM * 4 + 1023) / 1024 * 1024;
// Then two E4M3 weight tiles (128-byte swizzle) and their rows' scales, the conversion tables and
// each expert's first tile.
constexpr int kOffB = kStages * kStageBytes;   // [2][256][128]
constexpr int kOffSb = kOffB + 2 * kBN * kBK;  // [2][256] f32
constexpr int kOffLut = kOffSb + 2 * kBN * 4;  // [15][8] E4M3 magnitudes
constexpr int kOffTiles = kOffLut + 128;       // int32 [n_experts + 1]

// Named barriers: 0 is __syncthreads.
// Each MMA warpgroup converts and multiplies its own 128 weight rows, so the two wait for the
// loads each on barriers of their own and run out of step: one's promotion beside the other's
// MMAs.
constexpr int kBarFull = 1;                        // + 2 * stage + warpgroup (loader + one MMA wg)
constexpr int kBarEmpty = kBarFull + 2 * kStages;  // + stage (loader + both MMA warpgroups)
constexpr int kBarMath = kBarEmpty + kStages;      // + warpgroup (its own 128 threads)
static_assert(kBarMath + 1 < 16);

int64_t smem_bytes(int64_t n_experts) {
  return kOffTiles + 4 * (n_experts + 1) + 1024;  // + alignment slack
}

using cp_async::smem_u32;

__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Eight E2M1 codes (nibble i = K i) -> eight E4M3 bytes in K order: the magnitudes through the
// table (lo, hi) of the block, the signs from the codes' top bits (a permute in its sign-replicate
// mode: byte j of w << 4 ends in code 2j's sign bit, byte j of w in code 2j + 1's).
__device__ __forceinline__ uint2 e2m1x8_to_e4m3(uint32_t w, uint32_t lo, uint32_t hi) {
  const uint32_t m0 = prmt(lo, hi, w & 0x7777u);
  const uint32_t m1 = prmt(lo, hi, (w >> 16) & 0x7777u);
  const uint32_t sh = w << 4;
  const uint32_t s0 = prmt(sh, w, 0xD9C8u);
  const uint32_t s1 = prmt(sh, w, 0xFBEAu);
  return make_uint2(m0 | (s0 & 0x80808080u), m1 | (s1 & 0x80808080u));
}

struct Tile {
  int e = 0;
  int64_t row0 = 0;  // first grouped row
  int64_t m_e = 0;   // the expert's grouped rows
  int m = 0;         // grouped rows in the tile (<= kBM)
  int nt = 0;        // weight tile
  int mt = 0;        // row tile within the expert
};

__device__ __forceinline__ Tile decode_tile(const int* tiles, int ne, const int64_t* begin, int t) {
  const int lo = last_at_most(tiles, ne, t);  // the expert
  Tile r;
  r.e = lo;
  const int64_t b = begin[lo];
  r.m_e = begin[lo + 1] - b;
  const int mtiles = static_cast<int>((r.m_e + kBM - 1) / kBM);
  const int local = t - tiles[lo];
  r.nt = local / mtiles;
  r.mt = local % mtiles;
  r.row0 = b + static_cast<int64_t>(r.mt) * kBM;
  const int64_t left = r.m_e - static_cast<int64_t>(r.mt) * kBM;
  r.m = static_cast<int>(left < kBM ? left : kBM);
  return r;
}

struct Args {
  MoeW4a8GemmParams p;
  int64_t n, k;
};

__global__ void __launch_bounds__(kThreads, 1) moe_w4a8_gemm_kernel(Args args) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  const MoeW4a8GemmParams& p = args.p;
  const int64_t N = args.n;
  const int64_t K = args.k;
  const int nk = static_cast<int>(K / kBK);
  const int n_tiles_n = static_cast<int>((N + kBN - 1) / kBN);
  const int ne = static_cast<int>(p.w.n_experts);
  int* tiles = reinterpret_cast<int*>(smem + kOffTiles);
  const uint8_t* lut = smem + kOffLut;

  // Prologue: each expert's first tile (warp 0, a running sum over chunks of 32 experts) and the
  // conversion tables: entry i holds the eight E2M1 magnitudes times 2^(i - 8) in E4M3.
  if (threadIdx.x < 32) {
    int carry = 0;
    for (int e0 = 0; e0 < ne; e0 += 32) {
      const int e = e0 + static_cast<int>(threadIdx.x);
      int v = 0;
      if (e < ne) {
        const int64_t m_e = p.expert_begin[e + 1] - p.expert_begin[e];
        v = static_cast<int>((m_e + kBM - 1) / kBM) * n_tiles_n;
      }
      int incl = v;
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, o);
        if (static_cast<int>(threadIdx.x) >= o)
          incl += u;
      }
      if (e < ne)
        tiles[e] = carry + incl - v;
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (threadIdx.x == 0)
      tiles[ne] = carry;
  } else if (threadIdx.x >= 32 && threadIdx.x < 32 + 120) {
    const int i = static_cast<int>(threadIdx.x) - 32;
    constexpr float kMags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float v = ldexpf(kMags[i % 8], i / 8 - 8);
    smem[kOffLut + i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
  }
  __syncthreads();
  const int total = tiles[ne];
  const int my_tiles =
      total > static_cast<int>(blockIdx.x)
          ? (total - 1 - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) + 1
          : 0;
  const int steps = my_tiles * nk;
  const int wg = static_cast<int>(threadIdx.x) / 128;
  const int tid = static_cast<int>(threadIdx.x) % 128;
  const int64_t inter = p.w.inter;
  const uint32_t smem0 = smem_u32(smem);

  if (wg == 0) {
    // ---- loads ----
    // Few registers here, more for the MMA warpgroups (accumulators, sums and the conversion).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 64;\n" ::: "memory");
    // Per tile, this thread's sources: activation chunk tid % 8 of rows tid / 8 + 16 j (its
    // swizzled position is the same in every row of the thread), raw chunk tid % 4 of weight rows
    // tid / 4 + 32 j (j < 4 in the first half of the tile, >= 4 in the second), the 32-block
    // exponents of weight rows tid and tid + 128, the activation scale of row tid.
    const int a_c = tid & 7;
    const int a_r = tid >> 3;
    const uint32_t a_dst = static_cast<uint32_t>(kOffA + a_r * 128 + ((a_c ^ (a_r & 7)) << 4));
    const int w_c = tid & 3;
    const int w_r = tid >> 2;
    const uint32_t w_dst = static_cast<uint32_t>(kOffRaw + w_r * kRawPitch + w_c * 16);
    int tile_index = -1;
    Tile t;
    const uint8_t* a_src = nullptr;
    const uint8_t* w_src[2] = {nullptr, nullptr};
    const uint8_t* sub_src[2] = {nullptr, nullptr};
    bool half_in[2] = {false, false};
    const uint8_t* exp_src = nullptr;
    const float* sa_src = nullptr;
    auto load = [&](int s) {
      const int ti = s / nk;
      const int kb = s % nk;
      if (ti != tile_index) {
        tile_index = ti;
        t = decode_tile(tiles,
                        ne,
                        p.expert_begin,
                        static_cast<int>(blockIdx.x) + ti * static_cast<int>(gridDim.x));
        for (int h = 0; h < 2; ++h) {  // each half's matrix: W1 or W3 (pass 0), W2 (pass 1)
          const int64_t r0 = static_cast<int64_t>(t.nt) * kBN + h * kHalf;
          half_in[h] = r0 < N;
          if (!half_in[h])
            continue;
          const MatrixRef* mats = p.pass == 1 ? p.w.w2 : (r0 < inter ? p.w.w1 : p.w.w3);
          const int64_t rbase = (p.pass == 0 && r0 >= inter) ? r0 - inter : r0;
          const MatrixRef w = mats[t.e];
          w_src[h] = static_cast<const uint8_t*>(w.data) + (rbase + w_r) * (K / 2) + w_c * 16;
          sub_src[h] = static_cast<const uint8_t*>(w.scale) + (rbase + tid) * (K / 32);
        }
        a_src = p.a + (t.row0 + a_r) * K + a_c * 16;
        exp_src = (p.pass == 0 ? p.w.exp13 : p.w.exp2) + static_cast<int64_t>(t.e) * nk * N +
                  static_cast<int64_t>(t.nt) * kBN + tid * 16;
        sa_src = p.sa + (t.row0 - static_cast<int64_t>(t.mt) * kBM) * nk +
                 static_cast<int64_t>(t.mt) * kBM + tid;
      }
      const uint32_t st = smem0 + static_cast<uint32_t>((s % kStages) * kStageBytes);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (a_r + 16 * j < t.m)
          cp_async::copy16(st + a_dst + j * 2048, a_src + (16 * j) * K + kb * kBK);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!half_in[h])
          continue;  // past the last weight row: the MMAs' columns there are not stored
#pragma unroll
        for (int j = 0; j < 4; ++j)
          cp_async::copy16(st + w_dst + (4 * h + j) * 32 * kRawPitch,
                           w_src[h] + (32 * j) * (K / 2) + kb * 64);
        cp_async::copy4(st + kOffSub + (h * kHalf + tid) * 4, sub_src[h] + kb * 4);
      }
      if (tid < 16 && static_cast<int64_t>(t.nt) * kBN + tid * 16 < N)
        cp_async::copy16(st + kOffExp + tid * 16, exp_src + static_cast<int64_t>(kb) * N);
      if (tid < t.m)
        cp_async::copy4(st + kOffSa + tid * 4, sa_src + static_cast<int64_t>(kb) * t.m_e);
    };
    for (int s = 0; s < kAhead; ++s) {
      if (s < steps)
        load(s);
      cp_async::commit();
    }
    // Each step's copies are handed over one iteration before the stage of the step kAhead later
    // is refilled (which waits for the MMA warpgroups to finish a step), so that the MMA
    // warpgroups' wait for step s + 1 does not include that wait and this warpgroup's refill.
    // The activation tile goes to the MMAs as CUTLASS's cp.async GMMA pipelines hand theirs over,
    // without a proxy fence (the fence compiles to a MEMBAR that would wait for the later steps'
    // copies in flight too).
    if (steps > 0) {
      cp_async::wait<kAhead - 1>();  // step 0
      bar_arrive(kBarFull, 256);
      bar_arrive(kBarFull + 1, 256);
    }
    for (int s = 0; s < steps; ++s) {
      if (s + 1 < steps) {
        cp_async::wait<kAhead - 2>();  // committed: steps 0 .. s + kAhead - 1; step s + 1 done
        bar_arrive(kBarFull + 2 * ((s + 1) % kStages), 256);
        bar_arrive(kBarFull + 2 * ((s + 1) % kStages) + 1, 256);
      }
      const int ns = s + kAhead;
      if (ns < steps) {
        if (ns >= kStages)
          bar_sync(kBarEmpty + (ns - kStages) % kStages, kThreads);
        load(ns);
      }
      cp_async::commit();
    }
    cp_async::wait<0>();
    return;
  }

  // ---- conversion and MMAs (warpgroups 1 and 2) ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n" ::: "memory");
  const int mw = wg - 1;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  // Weight row mw * 128 + tid of step s into E4M3 buffer s % 2, with its scale.
  auto convert = [&](int s) {
    const uint8_t* st = smem + (s % kStages) * kStageBytes;
    const int r = mw * kHalf + tid;
    const uint8_t* raw = st + kOffRaw + r * kRawPitch;
    const uint32_t sub = *reinterpret_cast<const uint32_t*>(st + kOffSub + r * 4);
    const int S = st[kOffExp + r];
    uint8_t* dst = smem + kOffB + (s & 1) * (kBN * kBK) + r * 128;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint4 q = *reinterpret_cast<const uint4*>(raw + j * 16);
      const int idx = min(max(static_cast<int>((sub >> (8 * j)) & 0xFFu) - S + 8, 0), 14);
      const uint2 tab = *reinterpret_cast<const uint2*>(lut + idx * 8);
      const uint2 a0 = e2m1x8_to_e4m3(q.x, tab.x, tab.y);
      const uint2 a1 = e2m1x8_to_e4m3(q.y, tab.x, tab.y);
      const uint2 a2 = e2m1x8_to_e4m3(q.z, tab.x, tab.y);
      const uint2 a3 = e2m1x8_to_e4m3(q.w, tab.x, tab.y);
      const int c0 = 2 * j;
      *reinterpret_cast<uint4*>(dst + ((c0 ^ (r & 7)) << 4)) = make_uint4(a0.x, a0.y, a1.x, a1.y);
      *reinterpret_cast<uint4*>(dst + (((c0 + 1) ^ (r & 7)) << 4)) =
          make_uint4(a2.x, a2.y, a3.x, a3.y);
    }
    reinterpret_cast<float*>(smem + kOffSb)[(s & 1) * kBN + r] =
        __uint_as_float(max(static_cast<uint32_t>(S) << 23, 0x00400000u));
    wgmma::fence_async_smem();
  };
  float acc[64];
  float tot[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) tot[i] = 0.0f;
  if (steps > 0) {
    bar_sync(kBarFull + mw, 256);
    convert(0);
    bar_sync(kBarMath + mw, 128);
  }
  Tile t;
  // Every MMA warpgroup runs every step's MMAs (rows past the tile's end and columns past the
  // last weight row are computed and dropped): a branch around them makes ptxas serialise the
  // wgmma pipeline.
  for (int s = 0; s < steps; ++s) {
    const int kb = s % nk;
    if (kb == 0)
      t = decode_tile(tiles,
                      ne,
                      p.expert_begin,
                      static_cast<int>(blockIdx.x) + (s / nk) * static_cast<int>(gridDim.x));
    const uint8_t* st = smem + (s % kStages) * kStageBytes;
    const uint64_t da = wgmma::desc_k_major_sw128(smem_u32(st + kOffA));
    const uint64_t db = wgmma::desc_k_major_sw128(
        smem_u32(smem + kOffB + (s & 1) * (kBN * kBK) + mw * kHalf * 128));
    wgmma::fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) wgmma::mma_m64n128k32_e4m3_ss(acc, da + 2 * j, db + 2 * j, j > 0);
    wgmma::commit();
    if (s + 1 < steps) {  // the next E4M3 tile while the MMAs run
      bar_sync(kBarFull + 2 * ((s + 1) % kStages) + mw, 256);
      convert(s + 1);
    }
    wgmma::wait<0>();
    wgmma::fence_regs(acc);
    {
      const float* sa = reinterpret_cast<const float*>(st + kOffSa) + warp * 16 + g;
      const float* sb =
          reinterpret_cast<const float*>(smem + kOffSb) + (s & 1) * kBN + mw * kHalf + 2 * tq;
      const float sa0 = sa[0];
      const float sa1 = sa[8];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float2 b2 = *reinterpret_cast<const float2*>(sb + 8 * j);
        tot[4 * j + 0] = fmaf(acc[4 * j + 0], sa0 * b2.x, tot[4 * j + 0]);
        tot[4 * j + 1] = fmaf(acc[4 * j + 1], sa0 * b2.y, tot[4 * j + 1]);
        tot[4 * j + 2] = fmaf(acc[4 * j + 2], sa1 * b2.x, tot[4 * j + 2]);
        tot[4 * j + 3] = fmaf(acc[4 * j + 3], sa1 * b2.y, tot[4 * j + 3]);
      }
    }
    if (s + kStages < steps)
      bar_arrive(kBarEmpty + s % kStages, kThreads);
    if (kb == nk - 1) {
      const int64_t c0 = static_cast<int64_t>(t.nt) * kBN + mw * kHalf;
      if (c0 < N) {
        float* dcol = p.d + c0 + 2 * tq;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp * 16 + g + 8 * h;
          if (r < t.m) {
            float* out = dcol + (t.row0 + r) * N;
#pragma unroll
            for (int j = 0; j < 16; ++j)
              *reinterpret_cast<float2*>(out + 8 * j) =
                  make_float2(tot[4 * j + 2 * h], tot[4 * j + 2 * h + 1]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 64; ++i) tot[i] = 0.0f;
    }
    bar_sync(kBarMath + mw, 128);  // this half of tile s + 1 converted; this wg's MMAs of s done
  }
}

// ---- load-time block exponents ----

// One thread per (expert, matrix row, K block): S = max(largest nonzero 32-block exponent - 6, 0)
// (127, a scale of 1, for an all-zero block), counting the blocks E4M3 cannot hold under it
// (moe_sm90.cu's re-encoding rule, scale_rows 1).
__global__ void moe_w4a8_exponents_kernel(const MatrixRef* mats,
                                          int64_t n_experts,
                                          int64_t rows,
                                          int64_t cols,
                                          uint8_t* out,
                                          int64_t out_rows,
                                          int64_t row_offset,
                                          int* inexact) {
  const int64_t kb = cols / 128;
  const int64_t total = n_experts * rows * kb;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i % rows;
    const int64_t blk = (i / rows) % kb;
    const int64_t e = i / (rows * kb);
    const MatrixRef w = mats[e];
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
    uint8_t S = 127;
    if (smax >= smin) {
      if (smax - smin > 14 || smax < 6)
        atomicAdd(inexact, 1);
      S = static_cast<uint8_t>(max(smax - 6, 0));
    }
    out[(e * kb + blk) * out_rows + row_offset + r] = S;
  }
}

}  // namespace

bool moe_w4a8_available() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
    return false;
  return prop.major == 9 && prop.minor == 0;
}

bool moe_w4a8_supports(int64_t hidden, int64_t inter) {
  return hidden > 0 && inter > 0 && hidden % 128 == 0 && inter % 128 == 0;
}

int64_t moe_mxfp4_exponent_bytes(int64_t n_experts, int64_t hidden, int64_t inter) {
  const int64_t e13 = n_experts * (hidden / 128) * 2 * inter;
  const int64_t e2 = n_experts * (inter / 128) * hidden;
  return (e13 + 255) / 256 * 256 + e2;
}

MoeMxfp4Weights moe_mxfp4_weights_carve(void* base,
                                        const MatrixRef* w1,
                                        const MatrixRef* w3,
                                        const MatrixRef* w2,
                                        int64_t n_experts,
                                        int64_t hidden,
                                        int64_t inter) {
  MoeMxfp4Weights w;
  w.w1 = w1;
  w.w3 = w3;
  w.w2 = w2;
  w.n_experts = n_experts;
  w.hidden = hidden;
  w.inter = inter;
  auto* b = static_cast<uint8_t*>(base);
  const int64_t e13 = n_experts * (hidden / 128) * 2 * inter;
  w.exp13 = b;
  w.exp2 = b + (e13 + 255) / 256 * 256;
  return w;
}

Status launch_moe_mxfp4_scales(const MoeMxfp4Weights& w, int* inexact, cudaStream_t stream) {
  if (!moe_w4a8_supports(w.hidden, w.inter))
    return invalid_argument("moe_mxfp4_scales: hidden and inter must be multiples of 128");
  if (!w.w1 || !w.w3 || !w.w2 || !w.exp13 || !w.exp2 || !inexact)
    return null_pointer("moe_mxfp4_scales");
  const int64_t H = w.hidden;
  const int64_t I = w.inter;
  auto grid_for = [](int64_t total) {
    return static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 1 << 16));
  };
  moe_w4a8_exponents_kernel<<<grid_for(w.n_experts * I * (H / 128)), 256, 0, stream>>>(
      w.w1, w.n_experts, I, H, w.exp13, 2 * I, 0, inexact);
  moe_w4a8_exponents_kernel<<<grid_for(w.n_experts * I * (H / 128)), 256, 0, stream>>>(
      w.w3, w.n_experts, I, H, w.exp13, 2 * I, I, inexact);
  moe_w4a8_exponents_kernel<<<grid_for(w.n_experts * H * (I / 128)), 256, 0, stream>>>(
      w.w2, w.n_experts, H, I, w.exp2, H, 0, inexact);
  return launched("moe_mxfp4_scales");
}

Status launch_moe_w4a8_gemm(const MoeW4a8GemmParams& p, cudaStream_t stream) {
  const int64_t H = p.w.hidden;
  const int64_t I = p.w.inter;
  if (!moe_w4a8_supports(H, I))
    return invalid_argument("moe_w4a8: hidden and inter must be multiples of 128");
  if (p.pass != 0 && p.pass != 1)
    return invalid_argument("moe_w4a8: pass must be 0 or 1");
  if (p.w.n_experts < 1 || p.w.n_experts > kMaxExperts)
    return invalid_argument("moe_w4a8: 1 to 1024 experts");
  if (p.num_pairs == 0)
    return Status();
  if (!p.w.w1 || !p.w.w3 || !p.w.w2 || !p.w.exp13 || !p.w.exp2 || !p.expert_begin || !p.a ||
      !p.sa || !p.d)
    return null_pointer("moe_w4a8");
  if ((reinterpret_cast<uintptr_t>(p.a) & 15u) != 0)
    return invalid_argument("moe_w4a8: activation rows must be 16-byte aligned");
  const Args args{p, p.pass == 0 ? 2 * I : H, p.pass == 0 ? H : I};
  const int64_t smem = smem_bytes(p.w.n_experts);
  static const cudaError_t attr = cudaFuncSetAttribute(
      moe_w4a8_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
  if (attr != cudaSuccess)
    return failed_precondition(std::string("moe_w4a8: shared memory: ") + cudaGetErrorString(attr));
  // Tiles: at most ceil(pairs / 128) + n_experts row tiles per weight tile; one block per SM
  // walks them (a block needs most of an SM's shared memory).
  const int64_t max_tiles =
      ((p.num_pairs + kBM - 1) / kBM + p.w.n_experts) * ((args.n + kBN - 1) / kBN);
  const int64_t grid = std::min<int64_t>(max_tiles, sm_count());
  moe_w4a8_gemm_kernel<<<static_cast<unsigned>(grid),
                         kThreads,
                         static_cast<size_t>(smem),
                         stream>>>(args);
  return launched("moe_w4a8 launch");
}

}  // namespace dsinfer::cuda
