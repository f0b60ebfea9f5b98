// Few-token linears (gemv.h). BF16 and FP8-weight fp32 GEMVs: one warp per group of kRows weight
// rows, lanes striding K by one 16-byte load per row per step, x read through the L1 cache. The
// W8A8 GEMV: mma.sync over 8 weight rows x 8 tokens per warp, K split over warps and blocks.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/fp8_mma_tile.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/pdl.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kRows = 4;  // weight rows per warp
constexpr int kWarps = 8;

__device__ __forceinline__ float bf16_lo(uint32_t v) {
  return __uint_as_float(v << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}

// S > 1: the block's warps are 8 / S row slots x S contiguous parts of K (a short weight's rows
// over S times the warps: the router's 256 rows ran on 32 blocks); the parts' sums are added in
// part order through shared memory. S = 1: each warp its R rows over all of K.
template <int N, int R, int S>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_bf16_kernel(GemvParams p, int64_t ldx, int64_t ldy) {
  static_assert(kWarps % S == 0 && (S == 1 || R * N <= 32), "gemv_bf16 split");
  __shared__ float part[S > 1 ? kWarps : 1][S > 1 ? R * N : 1];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int slot = warp / S;  // row slot of the block
  const int q = warp % S;     // part of K
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / S) + slot) * R;
  const bool idle = S == 1 && r0 >= p.w.rows;  // warp-uniform
  const int64_t K = p.w.cols;
  const int64_t kq = S == 1 ? K : (K / 8 + S - 1) / S * 8;  // K % 8 == 0 (gemv_supports)
  const int64_t k_end = S == 1 ? K : min(K, (q + 1) * kq);
  const uint16_t* w = static_cast<const uint16_t*>(p.w.data);
  auto load = [&](int64_t k, uint4(&wv)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = min(r0 + i, p.w.rows - 1);  // clamped rows are computed, not stored
      wv[i] = __ldg(reinterpret_cast<const uint4*>(w + r * K + k));
    }
  };
  // The first K step's weights before the wait (they overlap the previous kernel's tail).
  const int64_t k_first = q * kq + static_cast<int64_t>(lane) * 8;
  uint4 first[R];
  pdl_begin_after([&] {
    if (!idle && k_first < k_end)
      load(k_first, first);
  });
  if (idle)
    return;  // (S > 1: never idle; every warp reaches the barrier below)
  float acc[R][N];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int t = 0; t < N; ++t) acc[i][t] = 0.0f;
  // acc += the products of K step k (weights wv), lane-local, in K order.
  auto step = [&](int64_t k, const uint4(&wv)[R]) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      if (t >= p.n)
        break;  // bucket padding: no such token
      const float4 x0 = __ldg(reinterpret_cast<const float4*>(p.x + t * ldx + k));
      const float4 x1 = __ldg(reinterpret_cast<const float4*>(p.x + t * ldx + k + 4));
#pragma unroll
      for (int i = 0; i < R; ++i) {
        float a = acc[i][t];
        a = fmaf(bf16_lo(wv[i].x), x0.x, a);
        a = fmaf(bf16_hi(wv[i].x), x0.y, a);
        a = fmaf(bf16_lo(wv[i].y), x0.z, a);
        a = fmaf(bf16_hi(wv[i].y), x0.w, a);
        a = fmaf(bf16_lo(wv[i].z), x1.x, a);
        a = fmaf(bf16_hi(wv[i].z), x1.y, a);
        a = fmaf(bf16_lo(wv[i].w), x1.z, a);
        a = fmaf(bf16_hi(wv[i].w), x1.w, a);
        acc[i][t] = a;
      }
    }
  };
  if (k_first < k_end)
    step(k_first, first);
#pragma unroll 4  // several 16-byte loads in flight per lane; the sums keep their order
  for (int64_t k = k_first + 256; k < k_end; k += 256) {
    uint4 wv[R];
    load(k, wv);
    step(k, wv);
  }
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float v = acc[i][t];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      acc[i][t] = v;
    }
  if constexpr (S > 1) {
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int t = 0; t < N; ++t) part[warp][i * N + t] = acc[i][t];
    }
    __syncthreads();
    if (q != 0 || r0 >= p.w.rows)
      return;
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int t = 0; t < N; ++t) {
        float v = part[warp][i * N + t];
#pragma unroll
        for (int j = 1; j < S; ++j) v = __fadd_rn(v, part[warp + j][i * N + t]);
        acc[i][t] = v;
      }
  }
  if (lane < R * N) {  // lane (i, t) stores one output
    const int i = lane / N;
    const int t = lane % N;
    float v = 0.0f;
#pragma unroll
    for (int ii = 0; ii < R; ++ii)
#pragma unroll
      for (int tt = 0; tt < N; ++tt)
        if (ii == i && tt == t)
          v = acc[ii][tt];
    const int64_t r = r0 + i;
    if (r < p.w.rows && t < p.n) {
      float* y = p.y + t * ldy + r;
      *y = p.accumulate ? *y + v : v;
    }
  }
}

// Rows per warp: 4 for long weights (the LM head); for short ones (router, compressors, indexer:
// 256 to 1024 rows would otherwise run on a few blocks) one row per warp and, from K = 1024 on,
// K in 4 parts over 4 warps. A (row, token) sum does not depend on the token count.
constexpr int kBf16Parts = 4;

template <int N>
Status launch_n(const GemvParams& p, int64_t ldx, int64_t ldy, cudaStream_t s) {
  if (p.w.rows < 4096 && p.w.cols >= 1024) {
    const int64_t blocks = ceil_div(p.w.rows, kWarps / kBf16Parts);
    launch_pdl(gemv_bf16_kernel<N, 1, kBf16Parts>,
               static_cast<unsigned>(blocks),
               kWarps * 32,
               0,
               s,
               p,
               ldx,
               ldy);
  } else if (p.w.rows < 4096) {
    const int64_t blocks = ceil_div(p.w.rows, kWarps);
    launch_pdl(
        gemv_bf16_kernel<N, 1, 1>, static_cast<unsigned>(blocks), kWarps * 32, 0, s, p, ldx, ldy);
  } else {
    const int64_t blocks = ceil_div(p.w.rows, kRows * kWarps);
    launch_pdl(gemv_bf16_kernel<N, kRows, 1>,
               static_cast<unsigned>(blocks),
               kWarps * 32,
               0,
               s,
               p,
               ldx,
               ldy);
  }
  return launched("gemv_bf16 launch");
}

// Four E4M3 codes (byte i = value i) -> floats, exactly.
__device__ __forceinline__ void e4m3x4_to_f32(uint32_t v, float* out) {
  const uint32_t lo = mma::e4m3x2_to_f16x2(v);
  const uint32_t hi = mma::e4m3x2_to_f16x2(v >> 16);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

// Sixteen E4M3 codes -> floats, exactly.
__device__ __forceinline__ void e4m3x16_to_f32(const uint4& v, float (&out)[16]) {
  e4m3x4_to_f32(v.x, out);
  e4m3x4_to_f32(v.y, out + 4);
  e4m3x4_to_f32(v.z, out + 8);
  e4m3x4_to_f32(v.w, out + 12);
}

// sum_j w[j] x[j] over 16 values, one fused multiply-add after another (lane-local order).
__device__ __forceinline__ float dot16(const float (&w)[16], const float4 (&x)[4]) {
  float part = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    part = fmaf(w[4 * q], x[q].x, part);
    part = fmaf(w[4 * q + 1], x[q].y, part);
    part = fmaf(w[4 * q + 2], x[q].z, part);
    part = fmaf(w[4 * q + 3], x[q].w, part);
  }
  return part;
}

// Rows r of [0, groups * rows): weight row r, x columns from (r / rows) * group_x, y column
// (r / rows) * group_y + r % rows. Lane l takes the 16 values at k = 16 l + 512 j. SharedX (rows a
// multiple of kRows, so a warp's rows lie in one group): each K step loads each token's x values
// once for the warp's rows, not once per row (wo_a at decode waited on 16 x loads per 4 weight
// loads; a 6-token verification on the bundled model took 10.4 us against 4.5 for one token).
// The same products in the same order either way.
template <int N, bool SharedX>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_fp8_kernel(GemvFp8Params p, int64_t rows, int64_t ldx, int64_t ldy) {
  const int lane = threadIdx.x & 31;
  const int64_t total = p.groups * rows;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * kRows;
  const int64_t K = p.w.cols;
  const int64_t scols = K / 128;
  const auto* w = static_cast<const uint8_t*>(p.w.data);
  const bool sf32 = p.w.scale_dtype == DType::kF32;
  float acc[kRows][N];
  int64_t xoff[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t r = min(r0 + i, total - 1);  // clamped rows are computed, not stored
    xoff[i] = (r / rows) * p.group_x;
#pragma unroll
    for (int t = 0; t < N; ++t) acc[i][t] = 0.0f;
  }
  // The weights and scales of the next K step are loaded before this one's products (one step
  // of latency in flight instead of a round trip per step: wo_a's 8 steps at decode).
  uint4 next[kRows];
  float next_sc[kRows];
  auto load = [&](int64_t k) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t r = min(r0 + i, total - 1);
      next[i] = __ldg(reinterpret_cast<const uint4*>(w + r * K + k));
      next_sc[i] = fp8_block_scale(p.w.scale, sf32, (r / 128) * scols + k / 128);
    }
  };
  // The first K step's weights before the wait (they overlap the previous kernel's tail).
  pdl_begin_after([&] {
    if (r0 < total && static_cast<int64_t>(lane) * 16 < K)
      load(static_cast<int64_t>(lane) * 16);
  });
  if (r0 >= total)
    return;  // warp-uniform
  for (int64_t k = static_cast<int64_t>(lane) * 16; k < K; k += 512) {
    uint4 wv[kRows];
    float sc[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      wv[i] = next[i];
      sc[i] = next_sc[i];
    }
    if (k + 512 < K)
      load(k + 512);
    if constexpr (SharedX && N <= 2) {
      float4 xv[N][4];
#pragma unroll
      for (int t = 0; t < N; ++t) {
        const float4* xp = reinterpret_cast<const float4*>(p.x + t * ldx + xoff[0] + k);
#pragma unroll
        for (int q = 0; q < 4; ++q)
          xv[t][q] = t < p.n ? __ldg(xp + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        float wf[16];
        e4m3x16_to_f32(wv[i], wf);
#pragma unroll
        for (int t = 0; t < N; ++t)
          acc[i][t] = __fadd_rn(acc[i][t], __fmul_rn(dot16(wf, xv[t]), sc[i]));
      }
    } else if constexpr (SharedX) {
      // More tokens: the rows' weights converted once, then token by token its x for every row.
      float wf[kRows][16];
#pragma unroll
      for (int i = 0; i < kRows; ++i) e4m3x16_to_f32(wv[i], wf[i]);
#pragma unroll
      for (int t = 0; t < N; ++t) {
        if (t >= p.n)
          break;  // bucket padding: no such token
        const float4* xp = reinterpret_cast<const float4*>(p.x + t * ldx + xoff[0] + k);
        float4 xv[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) xv[q] = __ldg(xp + q);
#pragma unroll
        for (int i = 0; i < kRows; ++i)
          acc[i][t] = __fadd_rn(acc[i][t], __fmul_rn(dot16(wf[i], xv), sc[i]));
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        float wf[16];
        e4m3x16_to_f32(wv[i], wf);
#pragma unroll
        for (int t = 0; t < N; ++t) {
          if (t >= p.n)
            break;  // bucket padding: no such token
          const float4* xp = reinterpret_cast<const float4*>(p.x + t * ldx + xoff[i] + k);
          float4 xv[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) xv[q] = __ldg(xp + q);
          acc[i][t] = __fadd_rn(acc[i][t], __fmul_rn(dot16(wf, xv), sc[i]));
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float v = acc[i][t];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      acc[i][t] = v;
    }
  if (lane < kRows * N) {  // lane (i, t) stores one output
    const int i = lane / N;
    const int t = lane % N;
    float v = 0.0f;
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
      for (int tt = 0; tt < N; ++tt)
        if (ii == i && tt == t)
          v = acc[ii][tt];
    const int64_t r = r0 + i;
    if (r < total && t < p.n) {
      float* y = p.y + t * ldy + (r / rows) * p.group_y + r % rows;
      *y = p.accumulate ? *y + v : v;
    }
  }
}

template <int N>
Status launch_fp8_n(
    const GemvFp8Params& p, int64_t rows, int64_t ldx, int64_t ldy, cudaStream_t s) {
  const int64_t blocks = ceil_div(p.groups * rows, kRows * kWarps);
  auto* kernel = rows % kRows == 0 ? gemv_fp8_kernel<N, true> : gemv_fp8_kernel<N, false>;
  launch_pdl(kernel, static_cast<unsigned>(blocks), kWarps * 32, 0, s, p, rows, ldx, ldy);
  return launched("gemv_fp8 launch");
}

// ---- W8A8 on the MMA ------------------------------------------------------------------------
// Warp = 8 weight rows (the MMA's N) x up to 8 tokens (M rows 0..7; 8..15 are zero). Lane (g, t)
// loads 16 bytes of weight row g and of token g at K offset 16 t of each 64-byte chunk; A and B
// use the same K permutation, so each MMA is a 32-value dot product (mma_e4m3).
//
// A block takes G consecutive 8-row groups (G = 4 for tall weights whose K fits one K block per
// warp, e.g. wq_b: a quarter of the blocks, each warp's loads of the G groups in flight together)
// and its warps split K. Every row's sums run in the same order whatever G is: per warp over its
// K blocks, then over the warps in order, then over the splits.

constexpr int kMmaWarps = 8;
constexpr int kMaxGemvGroups = 4;  // 8-row groups per block

struct Fp8GemvArgs {
  Fp8GemvParams p;
  int64_t rows;
  int64_t ldy;
  int64_t kb_per_block;  // 128-wide K blocks per block (split over its warps)
  int splits;            // blocks along K
  int groups;            // 8-row groups per block
};

// Up to this many splits the blocks of one row group form a thread-block cluster and block 0 of
// it adds the others' sums from their shared memory (no scratch, no second kernel); more splits
// (small weights only) go through scratch and fp8_gemv_reduce_kernel. Same order either way.
constexpr int kMaxClusterSplits = 8;

// One warp's operands of one K block: G groups' weights and scales, and the token's x.
template <int G>
struct Fp8GemvFrag {
  uint4 w[G][2];
  uint4 x[2];
  float ws[G];
  float xs;
};

template <int G, bool kCluster>
__global__ void __launch_bounds__(kMmaWarps * 32) fp8_gemv_kernel(Fp8GemvArgs a) {
  __shared__ float red[kMmaWarps][G][8][8];  // [warp][group][token][row]
  __shared__ float part[kCluster ? 64 : 1];  // kCluster: this block's sums, read by rank 0
  const Fp8GemvParams& p = a.p;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 8 * G;  // first row of the first group
  const int64_t K = p.w.cols;
  const int64_t KB = K / 128;
  const int64_t kb0 = static_cast<int64_t>(blockIdx.y) * a.kb_per_block;
  const int64_t kb1 = min(KB, kb0 + a.kb_per_block);
  const bool tok = g < p.n;
  const uint8_t* xp = p.x_codes + (tok ? g : 0) * p.x_ld;
  const float* xs = p.x_scales + (tok ? g : 0) * (p.x_ld / 128);
  const bool sf32 = p.w.scale_dtype == DType::kF32;
  const uint8_t* wp[G];
  int64_t srow[G];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int64_t rj = min(r0 + 8 * j, a.rows - 8);  // past the last group: computed, not stored
    wp[j] = static_cast<const uint8_t*>(p.w.data) + (p.row_begin + rj + g) * K;
    srow[j] = ((p.row_begin + rj) / 128) * KB;
  }
  auto load_w = [&](int64_t kb, Fp8GemvFrag<G>& f) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t off = kb * 128 + c * 64 + 16 * t;
#pragma unroll
      for (int j = 0; j < G; ++j) f.w[j][c] = __ldg(reinterpret_cast<const uint4*>(wp[j] + off));
    }
#pragma unroll
    for (int j = 0; j < G; ++j) f.ws[j] = fp8_block_scale(p.w.scale, sf32, srow[j] + kb);
  };
  auto load_x = [&](int64_t kb, Fp8GemvFrag<G>& f) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t off = kb * 128 + c * 64 + 16 * t;
      f.x[c] = tok ? __ldg(reinterpret_cast<const uint4*>(xp + off)) : make_uint4(0, 0, 0, 0);
    }
    f.xs = tok ? xs[kb] : 0.0f;
  };
  float acc[G][2];
#pragma unroll
  for (int j = 0; j < G; ++j) acc[j][0] = acc[j][1] = 0.0f;
  auto compute = [&](const Fp8GemvFrag<G>& f) {
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const float s = __fmul_rn(f.ws[j], f.xs);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          const uint32_t af[4] = {
              step == 0 ? f.x[c].x : f.x[c].z, 0u, step == 0 ? f.x[c].y : f.x[c].w, 0u};
          const uint32_t bf[2] = {step == 0 ? f.w[j][c].x : f.w[j][c].z,
                                  step == 0 ? f.w[j][c].y : f.w[j][c].w};
          float cf[4];
          mma::mma_e4m3(cf, af, bf);
          acc[j][0] = __fadd_rn(acc[j][0], __fmul_rn(cf[0], s));
          acc[j][1] = __fadd_rn(acc[j][1], __fmul_rn(cf[1], s));
        }
      }
    }
  };
  int64_t kb = kb0 + warp;
  Fp8GemvFrag<G> cur;
  // The first K block's weights are requested before the wait: they stream in while the kernel
  // before this one finishes.
  pdl_begin_after([&] {
    if (kb < kb1)
      load_w(kb, cur);
  });
  if (kb < kb1) {
    load_x(kb, cur);
    compute(cur);
    // More K blocks (G == 1 only): one at a time. Loading the next one during these MMAs took
    // 68 instead of 56 registers and made wo_b, wq_a and wkv slower (fewer blocks per SM); all
    // of a warp's (<= 4) K blocks in flight at once (95 registers) measured no faster at batch
    // 1-64 (fourteenth session). What holds the small ones is the cluster's barriers (ncu: 8-12
    // stall cycles per issued instruction), wo_b memory round trips per block.
    if constexpr (G == 1) {
      for (kb += kMmaWarps; kb < kb1; kb += kMmaWarps) {
        load_w(kb, cur);
        load_x(kb, cur);
        compute(cur);
      }
    }
  }
  // acc[j][0] / acc[j][1]: token g, rows 2t / 2t + 1 of group j.
#pragma unroll
  for (int j = 0; j < G; ++j) {
    red[warp][j][g][2 * t] = acc[j][0];
    red[warp][j][g][2 * t + 1] = acc[j][1];
  }
  __syncthreads();
  if constexpr (kCluster) {  // G == 1; cluster rank = blockIdx.y (the cluster spans the splits)
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    const int tt = threadIdx.x / 8;
    const int rr = threadIdx.x % 8;
    if (threadIdx.x < 64) {
      float v = 0.0f;
      for (int w = 0; w < kMmaWarps; ++w) v = __fadd_rn(v, red[w][0][tt][rr]);
      part[threadIdx.x] = v;
    }
    cluster.sync();  // every block's part written
    if (blockIdx.y == 0 && threadIdx.x < 64 && tt < p.n) {
      float v = 0.0f;  // in split order, as fp8_gemv_reduce_kernel
      for (int q = 0; q < a.splits; ++q)
        v = __fadd_rn(v, cluster.map_shared_rank(part, q)[threadIdx.x]);
      float* y = p.y + tt * a.ldy + r0 + rr;
      *y = p.accumulate ? __fadd_rn(*y, v) : v;
    }
    cluster.sync();  // the other blocks' shared memory stays until rank 0 has read it
    return;
  }
  if (threadIdx.x < 64 * G) {
    const int j = threadIdx.x / 64;
    const int tt = (threadIdx.x / 8) % 8;
    const int rr = threadIdx.x % 8;
    const int64_t row = r0 + 8 * j + rr;
    float v = 0.0f;
    for (int w = 0; w < kMmaWarps; ++w) v = __fadd_rn(v, red[w][j][tt][rr]);
    if (tt < p.n && row < a.rows) {
      if (a.splits == 1) {
        float* y = p.y + tt * a.ldy + row;
        *y = p.accumulate ? __fadd_rn(*y, v) : v;
      } else {
        p.scratch[(static_cast<int64_t>(blockIdx.y) * p.n + tt) * a.rows + row] = v;
      }
    }
  }
}

// y (+)= sum over splits of the partials, in split order.
__global__ void fp8_gemv_reduce_kernel(Fp8GemvArgs a) {
  pdl_begin();
  const Fp8GemvParams& p = a.p;
  const int64_t total = p.n * a.rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < a.splits; ++s) v = __fadd_rn(v, p.scratch[s * total + i]);
    const int64_t tt = i / a.rows;
    float* y = p.y + tt * a.ldy + i % a.rows;
    *y = p.accumulate ? __fadd_rn(*y, v) : v;
  }
}

// Blocks along K so that about 528 blocks (4 per SM) run, whole 128-blocks per warp; tall
// weights whose K blocks fit one per warp take 4 8-row groups per block from 4 x 528 groups on
// (wq_b at decode: 1,024 blocks instead of 4,096, 19.7 -> 17.8 us under ncu; the indexer's wq_b,
// 1,024 groups, was slower in blocks of 2). Those blocks take 108 registers (2 per SM); bounded to
// 80 (3 per SM) they measured no faster at batch 1-4 (fifteenth session).
void fp8_gemv_split(int64_t rows, int64_t cols, int64_t* kb_per_block, int* splits, int* groups) {
  const int64_t g8 = std::max<int64_t>(rows / 8, 1);
  const int64_t kb = cols / 128;
  const int64_t want = std::clamp<int64_t>(ceil_div(528, g8), 1, kb);
  *kb_per_block = ceil_div(kb, want);
  *splits = static_cast<int>(ceil_div(kb, *kb_per_block));
  *groups = 1;
  if (*kb_per_block <= kMmaWarps && g8 >= kMaxGemvGroups * 528)
    *groups = kMaxGemvGroups;
}

}  // namespace

bool gemv_fp8_supports(const MatrixRef& w) {
  return w.format == WeightFormat::kFp8Block128 && w.dtype == DType::kF8E4M3 &&
         (w.scale_dtype == DType::kF8E8M0 || w.scale_dtype == DType::kF32) && w.cols % 128 == 0 &&
         (reinterpret_cast<uintptr_t>(w.data) & 15u) == 0;
}

Status launch_gemv_fp8(const GemvFp8Params& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("gemv_fp8", {p.n, p.ldx, p.ldy, p.group_x, p.group_y}));
  DSI_RETURN_IF_ERROR(require(gemv_fp8_supports(p.w),
                              "gemv_fp8",
                              "weights must be FP8 block-128 with cols % 128 == 0, aligned"));
  DSI_RETURN_IF_ERROR(require(p.n <= kGemvMaxTokens, "gemv_fp8", "more than 8 tokens"));
  DSI_RETURN_IF_ERROR(require(p.groups >= 1, "gemv_fp8", "groups < 1"));
  const int64_t rows = p.rows >= 0 ? p.rows : p.w.rows / p.groups;
  DSI_RETURN_IF_ERROR(
      require(p.groups * rows <= p.w.rows, "gemv_fp8", "row range exceeds the weight"));
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.w.cols;
  const int64_t ldy = p.ldy > 0 ? p.ldy : p.groups * rows;
  DSI_RETURN_IF_ERROR(require(ldx % 4 == 0 && p.group_x % 4 == 0 &&
                                  (reinterpret_cast<uintptr_t>(p.x) & 15u) == 0 &&
                                  (p.groups - 1) * p.group_x + p.w.cols <= ldx,
                              "gemv_fp8",
                              "x rows must be 16-byte aligned and hold every group"));
  DSI_RETURN_IF_ERROR(require(p.groups == 1 || (p.group_y >= rows), "gemv_fp8", "group_y < rows"));
  if (p.n == 0 || rows == 0)
    return Status();
  if (!p.y || !p.x)
    return null_pointer("gemv_fp8");
  if (p.n <= 1)
    return launch_fp8_n<1>(p, rows, ldx, ldy, stream);
  if (p.n <= 2)
    return launch_fp8_n<2>(p, rows, ldx, ldy, stream);
  if (p.n <= 4)
    return launch_fp8_n<4>(p, rows, ldx, ldy, stream);
  return launch_fp8_n<8>(p, rows, ldx, ldy, stream);
}

bool fp8_gemv_supports(const MatrixRef& w, int64_t row_begin, int64_t rows) {
  return gemv_fp8_supports(w) && row_begin % 8 == 0 && rows % 8 == 0 && rows > 0;
}

int64_t fp8_gemv_scratch_floats(int64_t rows, int64_t cols, int64_t n) {
  int64_t kbpb = 0;
  int splits = 1;
  int groups = 1;
  fp8_gemv_split(rows, cols, &kbpb, &splits, &groups);
  return splits > kMaxClusterSplits ? static_cast<int64_t>(splits) * n * rows : 0;
}

Status launch_fp8_gemv(const Fp8GemvParams& p, cudaStream_t stream) {
  const int64_t rows = p.rows >= 0 ? p.rows : p.w.rows - p.row_begin;
  DSI_RETURN_IF_ERROR(check_nonneg("fp8_gemv", {p.n, p.ldy, p.row_begin, p.x_ld}));
  DSI_RETURN_IF_ERROR(
      require(fp8_gemv_supports(p.w, p.row_begin, rows),
              "fp8_gemv",
              "weights must be FP8 block-128 (cols % 128 == 0), rows on 8-row groups"));
  DSI_RETURN_IF_ERROR(
      require(p.row_begin + rows <= p.w.rows, "fp8_gemv", "rows exceed the weight"));
  DSI_RETURN_IF_ERROR(require(p.n <= kGemvMaxTokens, "fp8_gemv", "more than 8 tokens"));
  DSI_RETURN_IF_ERROR(require(
      p.x_ld >= p.w.cols && p.x_ld % 128 == 0, "fp8_gemv", "activation rows are too short"));
  Fp8GemvArgs a;
  a.p = p;
  a.rows = rows;
  a.ldy = p.ldy > 0 ? p.ldy : rows;
  DSI_RETURN_IF_ERROR(require(a.ldy >= rows, "fp8_gemv", "ldy < rows"));
  if (p.n == 0 || rows == 0)
    return Status();
  if (!p.y || !p.x_codes || !p.x_scales)
    return null_pointer("fp8_gemv");
  fp8_gemv_split(rows, p.w.cols, &a.kb_per_block, &a.splits, &a.groups);
  if (a.splits > kMaxClusterSplits &&
      (p.scratch == nullptr || p.scratch_floats < fp8_gemv_scratch_floats(rows, p.w.cols, p.n))) {
    return invalid_argument("fp8_gemv: scratch too small for the K split");
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(rows / 8, a.groups)),
                  static_cast<unsigned>(a.splits));
  if (a.groups == kMaxGemvGroups) {
    launch_pdl(fp8_gemv_kernel<kMaxGemvGroups, false>, grid, kMmaWarps * 32, 0, stream, a);
  } else if (a.splits > 1 && a.splits <= kMaxClusterSplits) {
    launch_pdl_cluster(fp8_gemv_kernel<1, true>,
                       grid,
                       kMmaWarps * 32,
                       0,
                       stream,
                       dim3(1, static_cast<unsigned>(a.splits), 1),
                       a);
    return launched("fp8_gemv launch");
  } else {
    launch_pdl(fp8_gemv_kernel<1, false>, grid, kMmaWarps * 32, 0, stream, a);
  }
  DSI_RETURN_IF_ERROR(launched("fp8_gemv launch"));
  if (a.splits > 1) {
    const int64_t total = p.n * rows;
    launch_pdl(fp8_gemv_reduce_kernel,
               static_cast<unsigned>(std::min<int64_t>(ceil_div(total, 256), 1024)),
               256,
               0,
               stream,
               a);
    DSI_RETURN_IF_ERROR(launched("fp8_gemv reduce launch"));
  }
  return Status();
}

bool gemv_supports(const MatrixRef& w) {
  return w.format == WeightFormat::kFloat && w.dtype == DType::kBF16 && w.cols % 8 == 0 &&
         (reinterpret_cast<uintptr_t>(w.data) & 15u) == 0;
}

Status launch_gemv_bf16(const GemvParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("gemv_bf16", {p.n, p.ldx, p.ldy}));
  DSI_RETURN_IF_ERROR(require(
      gemv_supports(p.w), "gemv_bf16", "weights must be BF16 with cols % 8 == 0, 16-byte aligned"));
  DSI_RETURN_IF_ERROR(require(p.n <= kGemvMaxTokens, "gemv_bf16", "more than 8 tokens"));
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.w.cols;
  const int64_t ldy = p.ldy > 0 ? p.ldy : p.w.rows;
  DSI_RETURN_IF_ERROR(
      require(ldx >= p.w.cols && ldx % 4 == 0 && (reinterpret_cast<uintptr_t>(p.x) & 15u) == 0,
              "gemv_bf16",
              "x rows must be 16-byte aligned and >= cols"));
  DSI_RETURN_IF_ERROR(require(ldy >= p.w.rows, "gemv_bf16", "ldy < rows"));
  if (p.n == 0 || p.w.rows == 0)
    return Status();
  if (!p.y || (!p.x && p.w.cols > 0))
    return null_pointer("gemv_bf16");
  // Token-count buckets; the per-token arithmetic is the same in every bucket.
  if (p.n <= 1)
    return launch_n<1>(p, ldx, ldy, stream);
  if (p.n <= 2)
    return launch_n<2>(p, ldx, ldy, stream);
  if (p.n <= 4)
    return launch_n<4>(p, ldx, ldy, stream);
  return launch_n<8>(p, ldx, ldy, stream);
}

}  // namespace dsinfer::cuda
