// mHC kernels (mhc.h). The per-token scalar work (gates, Sinkhorn, collapse, post) mirrors
// kernels/cpu/mhc.cc operation by operation with explicit round-to-nearest intrinsics, so the
// differences from the CPU are the exp() ulps, the order of the double-precision mixing sums and
// where the RMS factor is applied (after the dot products here, see mhc.h).
//
// Two mixing kernels write the same per-(token, slice) partials:
// - hc_mix_dmma_kernel (hc = 4, hidden a multiple of 16 * kHcMixSplits, 16-byte aligned rows:
//   every real V4 shape): slice s = columns [s * hidden / S, (s + 1) * hidden / S) of all four
//   streams; FP64 tensor-core MMAs (m8n8k4: 8 tokens x 8 mixing rows x 4 columns) on the streams
//   converted to double once per block, so the double products are exact and summed in double as
//   the CPU does, in a fixed order per token. It applies a pending post step on the way (the
//   streams it reads are the post's output, which it writes).
// - hc_mix_partial_kernel (any shape): contiguous slices of the flattened streams, one warp per
//   mixing row, staged in shared memory; a pending post runs first as hc_post_kernel.
#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/pdl.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;
constexpr int64_t kSplits = kHcMixSplits;

__device__ __forceinline__ float sigmoidf(float x) {
  return 1.0f / __fadd_rn(1.0f, expf(-x));
}

// The post step of one element: post_k * f + sum_j comb[j][k] * x_j, in the CPU's order.
template <int HC>
__device__ __forceinline__ float post_elem(
    int hc, float post_k, float f, const float* comb, int k, const float* xj) {
  float acc = __fmul_rn(post_k, f);
  const int n = HC > 0 ? HC : hc;
#pragma unroll
  for (int j = 0; j < n; ++j) acc = __fadd_rn(acc, __fmul_rn(comb[j * n + k], xj[j]));
  return acc;
}

// ---------------------------------------------------------------------------------------------
// Post: block (column chunk, token); each thread one column of every stream (no index division).
template <int HC>
__global__ void hc_post_kernel(HcPostParams p) {
  pdl_begin();
  const int hc = HC > 0 ? HC : static_cast<int>(p.hc);
  const int64_t width = hc * p.hidden;
  for (int64_t t = blockIdx.y; t < p.n; t += gridDim.y) {
    const float* x = p.x + t * width;
    const float* comb = p.comb + t * hc * hc;
    const float* post = p.post + t * hc;
    float* out = p.x_out + t * width;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < p.hidden;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float xj[HC > 0 ? HC : kMaxHc];
#pragma unroll
      for (int j = 0; j < (HC > 0 ? HC : kMaxHc); ++j) {
        if (j < hc)
          xj[j] = x[j * p.hidden + c];
      }
      const float f = p.f[t * p.hidden + c];
#pragma unroll
      for (int k = 0; k < (HC > 0 ? HC : kMaxHc); ++k) {
        if (k < hc)
          out[k * p.hidden + c] = post_elem<HC>(hc, post[k], f, comb, k, xj);
      }
    }
  }
}

Status post_launch(const HcPostParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(p.hidden, kThreads), 64)),
                  static_cast<unsigned>(std::min(p.n, kMaxBlocks)));
  if (p.hc == 4) {
    launch_pdl(hc_post_kernel<4>, grid, kThreads, 0, stream, p);
  } else {
    launch_pdl(hc_post_kernel<0>, grid, kThreads, 0, stream, p);
  }
  return launched("hc_post launch");
}

// ---------------------------------------------------------------------------------------------
// Mixing partials, any shape. Block (s, g): contiguous slice s of the flattened streams for the
// kMixTokens tokens of group g; the slice is staged once in shared memory and each fn value read
// once per group. scratch[t][s][0..rows) = fn_i . x over the slice, [t][s][rows] = sum x^2.
constexpr int kMixTokens = 8;

__global__ void hc_mix_partial_kernel(
    const float* fn, int rows, const float* xs, int64_t width, int64_t n, double* scratch) {
  pdl_begin();
  extern __shared__ float xr[];  // [kMixTokens][slice]
  __shared__ double red[32];
  const int lane = threadIdx.x & 31;
  const int64_t slice = (width + kSplits - 1) / kSplits;
  const int64_t c0 = blockIdx.x * slice;
  const int64_t c1 = min(width, c0 + slice);
  const int64_t stride = kSplits * (rows + 1);
  double* part = scratch + blockIdx.x * (rows + 1);
  for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kMixTokens; t0 < n;
       t0 += static_cast<int64_t>(gridDim.y) * kMixTokens) {
    const int count = n - t0 < kMixTokens ? static_cast<int>(n - t0) : kMixTokens;
    for (int j = 0; j < count; ++j) {
      const float* x = xs + (t0 + j) * width;
      double ss = 0.0;
      for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        const float v = x[c];
        xr[j * slice + (c - c0)] = v;
        ss += static_cast<double>(v) * v;
      }
      ss = block_sum(ss, red);
      if (threadIdx.x == 0)
        part[(t0 + j) * stride + rows] = ss;
    }
    __syncthreads();
    for (int i = threadIdx.x >> 5; i < rows; i += blockDim.x >> 5) {
      const float* w = fn + i * width;
      double acc[kMixTokens];
#pragma unroll
      for (int j = 0; j < kMixTokens; ++j) acc[j] = 0.0;
#pragma unroll 8  // fn loads in flight together
      for (int64_t c = c0 + lane; c < c1; c += 32) {
        const double wv = static_cast<double>(w[c]);
#pragma unroll
        for (int j = 0; j < kMixTokens; ++j) {
          if (j < count)
            acc[j] += wv * static_cast<double>(xr[j * slice + (c - c0)]);
        }
      }
#pragma unroll
      for (int j = 0; j < kMixTokens; ++j) {
        if (j < count) {
          const double v = warp_sum(acc[j]);
          if (lane == 0)
            part[(t0 + j) * stride + i] = v;
        }
      }
    }
    __syncthreads();  // xr is restaged for the next group
  }
}

// ---------------------------------------------------------------------------------------------
// Mixing partials on FP64 tensor cores, hc = 4. Block (s, g): column slice s (hidden / S columns
// of each stream) for the kDmmaTokens tokens of group g. Warp w takes 16-column steps w, w + 8,
// ...; per step lane (g8, q) holds token g8 of each of its two m-tiles and columns c + 4q .. + 3
// of the four streams, and MMA step (j, i) multiplies column c + 4q + i of stream j (the k index
// of the m8n8k4 MMA is q) with the same column of fn rows nt * 8 + g8. Each token's sums run in a
// fixed order (steps, MMA k, warps ascending) whatever the other tokens of its group are.
constexpr int kDmmaWarps = 8;
constexpr int kDmmaTokens = 16;  // two m8 tiles per warp
constexpr int64_t kDmmaMaxGroups = 64;

struct DmmaArgs {
  const float* fn;
  int rows;
  int64_t hidden;
  int64_t n;
  const float* x;
  HcPending pending;
  double* scratch;
};

__device__ __forceinline__ void dmma(double (&d)[2], double a, double b) {
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
               : "+d"(d[0]), "+d"(d[1])
               : "d"(a), "d"(b));
}

__device__ __forceinline__ float4 ld4(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}

__device__ __forceinline__ float elem(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int NT>
__global__ void __launch_bounds__(kDmmaWarps * 32) hc_mix_dmma_kernel(DmmaArgs a) {
  pdl_begin();
  constexpr int kR = NT * 8;
  __shared__ double red[kDmmaWarps][kDmmaTokens][kR + 1];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g8 = lane >> 2;
  const int q = lane & 3;
  const int64_t hidden = a.hidden;
  const int64_t width = 4 * hidden;
  const int64_t cps = hidden / kSplits;
  const int64_t c_base = blockIdx.x * cps;
  const int steps = static_cast<int>(cps / 16);
  const bool pend = a.pending.f != nullptr;
  const int64_t stride = kSplits * (a.rows + 1);
  // Blocks z > 0 (few tokens: the mixing rows split over blocks) take rows zr .. zr + kR - 1; the
  // pending post's output and the sum of squares are written by blocks z = 0 only.
  const int zr = static_cast<int>(blockIdx.z) * kR;
  const bool z0 = blockIdx.z == 0;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kDmmaTokens; t0 < a.n;
       t0 += static_cast<int64_t>(gridDim.y) * kDmmaTokens) {
    double acc[2][NT][2];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[m][nt][0] = acc[m][nt][1] = 0.0;
    }
    double ss[2] = {0.0, 0.0};
    for (int st = warp; st < steps; st += kDmmaWarps) {
      const int64_t c = c_base + 16 * st + 4 * q;
      float v[2][4][4];  // [m-tile][stream][column]
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int64_t t = t0 + 8 * m + g8;
        if (t < a.n) {
          float4 xv[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) xv[j] = ld4(a.x + t * width + j * hidden + c);
          if (pend) {
            const float4 fv = ld4(a.pending.f + t * hidden + c);
            float comb[16];
#pragma unroll
            for (int e = 0; e < 16; ++e) comb[e] = __ldg(a.pending.comb + t * 16 + e);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const float pk = __ldg(a.pending.post + t * 4 + k);
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const float xj[4] = {
                    elem(xv[0], i), elem(xv[1], i), elem(xv[2], i), elem(xv[3], i)};
                v[m][k][i] = post_elem<4>(4, pk, elem(fv, i), comb, k, xj);
              }
              if (z0)  // (st.global.cg.v4: a plain float4 store was split into four here)
                __stcg(reinterpret_cast<float4*>(a.pending.x_out + t * width + k * hidden + c),
                       make_float4(v[m][k][0], v[m][k][1], v[m][k][2], v[m][k][3]));
            }
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
              for (int i = 0; i < 4; ++i) v[m][j][i] = elem(xv[j], i);
            }
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) ss[m] += static_cast<double>(v[m][j][i]) * v[m][j][i];
          }
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) v[m][j][i] = 0.0f;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float4 w[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int r = zr + nt * 8 + g8;
          w[nt] = r < a.rows ? ld4(a.fn + r * width + j * hidden + c) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const double a0 = v[0][j][i];
          const double a1 = v[1][j][i];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const double b = elem(w[nt], i);
            dmma(acc[0][nt], a0, b);
            dmma(acc[1][nt], a1, b);
          }
        }
      }
    }
    // C fragment: lane holds (token g8 of m-tile m, rows nt * 8 + 2q, + 1).
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        red[warp][8 * m + g8][nt * 8 + 2 * q] = acc[m][nt][0];
        red[warp][8 * m + g8][nt * 8 + 2 * q + 1] = acc[m][nt][1];
      }
      double s = ss[m];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (q == 0)
        red[warp][8 * m + g8][kR] = s;
    }
    __syncthreads();
    const int per = a.rows + 1;
    const int lrows = min(kR, a.rows - zr);  // this block's rows
    const int lper = lrows + (z0 ? 1 : 0);   // and the sum of squares on blocks z = 0
    for (int e = threadIdx.x; e < kDmmaTokens * lper; e += blockDim.x) {
      const int tok = e / lper;
      const int lr = e % lper;
      const int64_t t = t0 + tok;
      if (t >= a.n)
        continue;
      const bool sq = lr == lrows;
      const int col = sq ? kR : lr;
      double sum = 0.0;
#pragma unroll
      for (int w = 0; w < kDmmaWarps; ++w) sum += red[w][tok][col];
      a.scratch[t * stride + blockIdx.x * per + (sq ? a.rows : zr + lr)] = sum;
    }
    __syncthreads();
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Pass 1: the partials of every token into scratch, after the pending post step if any.
Status launch_mix(const float* fn,
                  int rows,
                  int64_t hc,
                  int64_t hidden,
                  const float* x,
                  int64_t n,
                  const HcPending& pending,
                  double* scratch,
                  cudaStream_t stream) {
  const bool dmma_ok = hc == 4 && rows <= 24 && hidden % (16 * kSplits) == 0 && aligned16(fn) &&
                       aligned16(x) &&
                       (!pending.set() || (aligned16(pending.f) && aligned16(pending.x_out)));
  if (dmma_ok) {
    const DmmaArgs a{fn, rows, hidden, n, x, pending, scratch};
    // At most kDmmaMaxGroups token groups per slice: a block then walks several groups and reads
    // its 96 KB fn slice from L1 after the first (one group per block read it from L2 each time:
    // as many bytes as the streams themselves).
    const int64_t groups = std::min(ceil_div(n, kDmmaTokens), kDmmaMaxGroups);
    const int nt = (rows + 7) / 8;
    // Few tokens (decode): each 8-row tile of the mixing rows on blocks of its own (3x the blocks
    // of hc_pre's 24 rows, a third of the FP64 MMAs each); every row's sums are unchanged.
    if (nt > 1 && groups * kSplits < sm_count()) {
      const dim3 grid(
          static_cast<unsigned>(kSplits), static_cast<unsigned>(groups), static_cast<unsigned>(nt));
      launch_pdl(hc_mix_dmma_kernel<1>, grid, kDmmaWarps * 32, 0, stream, a);
      return launched("hc_mix launch");
    }
    const dim3 grid(static_cast<unsigned>(kSplits), static_cast<unsigned>(groups));
    if (nt == 1) {
      launch_pdl(hc_mix_dmma_kernel<1>, grid, kDmmaWarps * 32, 0, stream, a);
    } else if (nt == 2) {
      launch_pdl(hc_mix_dmma_kernel<2>, grid, kDmmaWarps * 32, 0, stream, a);
    } else {
      launch_pdl(hc_mix_dmma_kernel<3>, grid, kDmmaWarps * 32, 0, stream, a);
    }
    return launched("hc_mix launch");
  }
  const float* xs = x;
  if (pending.set()) {
    DSI_RETURN_IF_ERROR(post_launch(HcPostParams{.hc = hc,
                                                 .hidden = hidden,
                                                 .n = n,
                                                 .f = pending.f,
                                                 .x = x,
                                                 .post = pending.post,
                                                 .comb = pending.comb,
                                                 .x_out = pending.x_out},
                                    stream));
    xs = pending.x_out;
  }
  const int64_t width = hc * hidden;
  const int64_t slice = (width + kSplits - 1) / kSplits;
  const int smem = static_cast<int>(kMixTokens * slice * sizeof(float));
  static const cudaError_t attr = cudaFuncSetAttribute(
      hc_mix_partial_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  if (attr != cudaSuccess)
    return failed_precondition(std::string("hc_mix_partial: shared memory: ") +
                               cudaGetErrorString(attr));
  if (smem > 200 * 1024)
    return invalid_argument("hc_mix_partial: hc * hidden too large");
  const auto groups = static_cast<unsigned>(std::min(ceil_div(n, kMixTokens), kMaxBlocks));
  launch_pdl(hc_mix_partial_kernel,
             dim3(static_cast<unsigned>(kSplits), groups),
             kThreads,
             smem,
             stream,
             fn,
             rows,
             xs,
             width,
             n,
             scratch);
  return launched("hc_mix_partial launch");
}

// ---------------------------------------------------------------------------------------------
// Per-token kernels (one block per token).

// mix[i] = r * sum over slices of the token's partials, r = 1 / sqrt(mean(x^2) + eps) as the CPU
// computes it; one warp (every lane forms r itself from the same loads in the same order).
__device__ void gather_mix_warp(
    const double* scratch, int64_t t, int rows, int64_t width, float eps, float* mix) {
  const int lane = threadIdx.x & 31;
  const int per = rows + 1;
  const double* part = scratch + t * kSplits * per;
  // The first row's partials are requested with the sums of squares (one round trip, not two).
  double acc0 = 0.0;
  if (lane < rows) {
#pragma unroll
    for (int64_t s = 0; s < kSplits; ++s) acc0 += part[s * per + lane];
  }
  double ss = 0.0;
#pragma unroll
  for (int64_t s = 0; s < kSplits; ++s) ss += part[s * per + rows];
  const float r = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(width)) + eps);
  if (lane < rows)
    mix[lane] = static_cast<float>(static_cast<double>(r) * acc0);
  for (int i = lane + 32; i < rows; i += 32) {
    double acc = 0.0;
#pragma unroll
    for (int64_t s = 0; s < kSplits; ++s) acc += part[s * per + i];
    mix[i] = static_cast<float>(static_cast<double>(r) * acc);
  }
  __syncwarp();
}

// out[c] = sum_j pre[j] * x[j, c], serial over j in fp32 as the CPU; then, with a weight, the
// RMSNorm of the row as rms_norm_kernel computes it (double sum of squares, one block). Up to
// kCollapsePer values per thread stay in registers, so every load of the row is issued before the
// first one is waited for (a decode token is one block: its latency is the step's). Writing the
// row's FP8 activations here too (the next linears' quantisation pass folded in) measured no
// faster at batch 1 (fourteenth session): the amax reduction lengthens this single block.
constexpr int kPreThreads = 512;
constexpr int kCollapsePer = 8;

// 1 / sqrt(mean of the block's squares + eps) from each thread's part of the sum of squares (the
// RMSNorm factor as rms_norm_kernel forms it: double sums, one block).
__device__ __forceinline__ float block_rms_inv(double ss, int64_t hidden, float eps, double* red) {
  ss = block_sum(ss, red);
  return 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(hidden)) + eps);
}

// This thread's sum of squares of its kCollapsePer values, in order.
__device__ __forceinline__ double sum_squares(const float (&u)[kCollapsePer]) {
  double ss = 0.0;
#pragma unroll
  for (int i = 0; i < kCollapsePer; ++i) ss += static_cast<double>(u[i]) * u[i];
  return ss;
}

// One token's collapse operands in registers for hc 4 at hidden <= kCollapsePer * blockDim.x
// (every released model): the four streams at this thread's columns and the norm weight there.
// Loaded ahead (the weight before the PDL wait, the streams before the gates are known), so that
// the collapse itself waits on no memory; collapse_norm_regs does collapse_norm<4>'s arithmetic.
struct CollapseRegs {
  float x[4][kCollapsePer];
  float w[kCollapsePer];
};

__device__ __forceinline__ void load_collapse_weight(const float* weight,
                                                     int64_t hidden,
                                                     CollapseRegs& r) {
#pragma unroll
  for (int i = 0; i < kCollapsePer; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    r.w[i] = c < hidden ? __ldg(weight + c) : 0.0f;
  }
}

__device__ __forceinline__ void load_collapse_x(const float* x, int64_t hidden, CollapseRegs& r) {
#pragma unroll
  for (int i = 0; i < kCollapsePer; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) r.x[j][i] = c < hidden ? x[j * hidden + c] : 0.0f;
  }
}

// then_load() runs once the values are formed (r.x is free then): the collapse kernel loads its
// next token's streams there, so that they arrive during this token's reduction and stores.
template <typename ThenLoad>
__device__ __forceinline__ void collapse_norm_regs(const float* pre,
                                                   CollapseRegs& r,
                                                   int64_t hidden,
                                                   bool norm,
                                                   float eps,
                                                   float* out,
                                                   ThenLoad&& then_load) {
  __shared__ double red[32];
  float u[kCollapsePer];
#pragma unroll
  for (int i = 0; i < kCollapsePer; ++i) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) acc = __fadd_rn(acc, __fmul_rn(pre[j], r.x[j][i]));
    u[i] = threadIdx.x + static_cast<int64_t>(i) * blockDim.x < hidden ? acc : 0.0f;
  }
  then_load();
  const float rinv = norm ? block_rms_inv(sum_squares(u), hidden, eps, red) : 1.0f;
#pragma unroll
  for (int i = 0; i < kCollapsePer; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c < hidden)
      out[c] = norm ? __fmul_rn(r.w[i], __fmul_rn(u[i], rinv)) : u[i];
  }
}

template <int HC>
__device__ void collapse_norm(const float* pre,
                              int hc_rt,
                              const float* x,
                              int64_t hidden,
                              const float* weight,
                              float eps,
                              float* out) {
  __shared__ double red[32];
  const int hc = HC > 0 ? HC : hc_rt;
  auto value = [&](int64_t c) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < (HC > 0 ? HC : kMaxHc); ++j) {
      if (j < hc)
        acc = __fadd_rn(acc, __fmul_rn(pre[j], x[j * hidden + c]));
    }
    return acc;
  };
  if (hidden <= kCollapsePer * static_cast<int64_t>(blockDim.x)) {
    float u[kCollapsePer];
#pragma unroll
    for (int i = 0; i < kCollapsePer; ++i) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      u[i] = c < hidden ? value(c) : 0.0f;
    }
    const float rinv = weight != nullptr ? block_rms_inv(sum_squares(u), hidden, eps, red) : 1.0f;
#pragma unroll
    for (int i = 0; i < kCollapsePer; ++i) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (c < hidden)
        out[c] = weight != nullptr ? __fmul_rn(weight[c], __fmul_rn(u[i], rinv)) : u[i];
    }
    return;
  }
  double ss = 0.0;
#pragma unroll 4
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    const float acc = value(c);
    out[c] = acc;
    ss += static_cast<double>(acc) * acc;
  }
  if (weight == nullptr)
    return;
  const float rinv = block_rms_inv(ss, hidden, eps, red);
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x)
    out[c] = __fmul_rn(weight[c], __fmul_rn(out[c], rinv));  // this thread's own stores
}

__device__ __noinline__ void collapse_any(const float* pre,
                                          int hc,
                                          const float* x,
                                          int64_t hidden,
                                          const float* weight,
                                          float eps,
                                          float* out) {
  collapse_norm<0>(pre, hc, x, hidden, weight, eps, out);
}

// hc 4 inline (every released model), any other hc out of line (its registers stay off the hot
// path).
__device__ __forceinline__ void collapse_dispatch(const float* pre,
                                                  int hc,
                                                  const float* x,
                                                  int64_t hidden,
                                                  const float* weight,
                                                  float eps,
                                                  float* out) {
  if (hc == 4) {
    collapse_norm<4>(pre, hc, x, hidden, weight, eps, out);
  } else {
    collapse_any(pre, hc, x, hidden, weight, eps, out);
  }
}

// The Sinkhorn-normalised comb matrix (CPU order) by warp 0 alone: lane e (and e + 32, ...) owns
// element (j, k) = (e / hc, e % hc) and forms its row / column sums itself in the CPU's order.
template <int kOwn>  // elements per lane: hc * hc <= 32 * kOwn
__device__ void sinkhorn_warp(const float* mix, const HcPreParams& p, float* comb_s, float* out) {
  const int hc = static_cast<int>(p.hc);
  const int hc2 = hc * hc;
  const int lane = threadIdx.x & 31;
  const float eps = p.hc_eps;
  float v[kOwn] = {};
  // f(u, e) for each element e = lane + 32 u this lane owns.
  auto for_own = [&](auto&& f) {
#pragma unroll
    for (int u = 0; u < kOwn; ++u) {
      const int e = lane + 32 * u;
      if (e < hc2)
        f(u, e);
    }
  };
  auto publish = [&]() {  // every owner's value into comb_s, between barriers
    __syncwarp();
    for_own([&](int u, int e) { comb_s[e] = v[u]; });
    __syncwarp();
  };
  for_own([&](int u, int e) {
    v[u] = __fadd_rn(__fmul_rn(mix[2 * hc + e], p.scale[2]), p.base[2 * hc + e]);
  });
  publish();
  for_own([&](int u, int e) {
    float m = -INFINITY;
    for (int k = 0; k < hc; ++k) m = fmaxf(m, comb_s[(e / hc) * hc + k]);
    v[u] = expf(__fsub_rn(v[u], m));
  });
  publish();
  for_own([&](int u, int e) {
    float s = 0.0f;
    for (int k = 0; k < hc; ++k) s = __fadd_rn(s, comb_s[(e / hc) * hc + k]);
    v[u] = __fadd_rn(__fdiv_rn(v[u], s), eps);
  });
  // One normalisation: every owner sums its row (rows) or column, then divides its element.
  auto normalise = [&](bool rows) {
    publish();
    for_own([&](int u, int e) {
      const int j = e / hc;
      const int k = e % hc;
      float s = 0.0f;
      for (int i = 0; i < hc; ++i) s = __fadd_rn(s, rows ? comb_s[j * hc + i] : comb_s[i * hc + k]);
      v[u] = __fdiv_rn(v[u], s + eps);
    });
  };
  normalise(false);
  for (int64_t it = 0; it + 1 < p.sinkhorn_iters; ++it) {
    normalise(true);
    normalise(false);
  }
  for_own([&](int u, int e) { out[e] = v[u]; });
}

// hc * hc <= 32 (every released model: hc 4): lane e owns element (j, k) = (e / hc, e % hc) in a
// register and gathers its row or column with shuffles, summing in the CPU's order (k, resp. j,
// ascending) exactly as sinkhorn_warp does: the same bits without shared-memory round trips.
// HC > 0: hc known at compile time (4 in every released model), the loops unrolled so that each
// row or column gather issues its shuffles together (the chain of 2 * sinkhorn_iters
// normalisations is the decode step's latency for this kernel).
template <int HC>
__device__ void sinkhorn_shfl(const float* mix, const HcPreParams& p, float* out) {
  constexpr unsigned kAll = 0xffffffffu;
  const int hc = HC > 0 ? HC : static_cast<int>(p.hc);
  const int e = threadIdx.x & 31;
  const bool own = e < hc * hc;
  const int j = e / hc;
  const int k = e % hc;
  const float eps = p.hc_eps;
  float v = own ? __fadd_rn(__fmul_rn(mix[2 * hc + e], p.scale[2]), p.base[2 * hc + e]) : 0.0f;
  float m = -INFINITY;
#pragma unroll
  for (int q = 0; q < (HC > 0 ? HC : kMaxHc); ++q)
    if (q < hc)
      m = fmaxf(m, __shfl_sync(kAll, v, (j * hc + q) & 31));
  v = own ? expf(__fsub_rn(v, m)) : 0.0f;
  float s = 0.0f;
#pragma unroll
  for (int q = 0; q < (HC > 0 ? HC : kMaxHc); ++q)
    if (q < hc)
      s = __fadd_rn(s, __shfl_sync(kAll, v, (j * hc + q) & 31));
  v = own ? __fadd_rn(__fdiv_rn(v, s), eps) : 0.0f;
  auto normalise = [&](bool rows) {
    float t = 0.0f;
#pragma unroll
    for (int q = 0; q < (HC > 0 ? HC : kMaxHc); ++q)
      if (q < hc)
        t = __fadd_rn(t, __shfl_sync(kAll, v, (rows ? j * hc + q : q * hc + k) & 31));
    v = own ? __fdiv_rn(v, t + eps) : 0.0f;
  };
  normalise(false);
  for (int64_t it = 0; it + 1 < p.sinkhorn_iters; ++it) {
    normalise(true);
    normalise(false);
  }
  if (own)
    out[e] = v;
}

// hc > 5 (tests; no released model): out of line, so that its registers do not weigh on the
// kernel's hot path.
__device__ __noinline__ void sinkhorn_warp_wide(const float* mix,
                                                const HcPreParams& p,
                                                float* comb_s,
                                                float* out) {
  sinkhorn_warp<(kMaxHc * kMaxHc + 31) / 32>(mix, p, comb_s, out);
}

// Pre step (kHead: the head's collapse, gates only). Block of kPreTokens tokens: warp w forms
// token w's mix, gates and Sinkhorn (so a prefill runs 16 of those chains per block), then the
// whole block collapses (and normalises) each token in turn.
constexpr int kPreTokens = kPreThreads / 32;

// kSplit (many tokens): the gates and Sinkhorn only, each token's pre written over the start of
// its (consumed) scratch slot for hc_collapse_kernel, which then collapses one token per block at
// a time.
__device__ __forceinline__ float* pre_slot(double* scratch, int64_t t, int rows) {
  return reinterpret_cast<float*>(scratch + t * kSplits * (rows + 1));
}

template <bool kHead, bool kSplit>
__global__ void __launch_bounds__(kPreThreads, kHead && !kSplit ? 2 : 1)
    hc_pre_kernel(HcPreParams p, const float* xs) {
  // The decode-sized pre step of every released model (hc 4, hidden <= 4,096) collapses from
  // registers (CollapseRegs): the head's variant keeps two blocks per SM's registers instead.
  const bool regs = !kHead && !kSplit && p.hc == 4 && p.hidden <= kCollapsePer * kPreThreads &&
                    !(gridDim.y > 1 && blockIdx.y == 1);
  CollapseRegs cr;
  pdl_begin_after([&] {
    if (regs && p.norm_weight != nullptr)
      load_collapse_weight(p.norm_weight, p.hidden, cr);
  });
  __shared__ float mix_s[kPreTokens][kMaxMix];
  __shared__ float comb_s[kPreTokens][kMaxHc * kMaxHc];
  __shared__ float pre_s[kPreTokens][kMaxHc];
  const int hc = static_cast<int>(p.hc);
  const int rows = kHead ? hc : (2 + hc) * hc;
  const int64_t width = p.hc * p.hidden;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  // Two roles when gridDim.y is 2 (few tokens, !kHead): blocks y = 1 run the Sinkhorn alone while
  // blocks y = 0 form the gates and collapse, so that the step waits for the longer of the two
  // chains instead of their sum (the comb matrix is read only by the next post step). The
  // Sinkhorn as a kernel of its own on a side stream, joined after the sub-layer, measured no
  // faster (fifteenth session).
  const bool sinkhorn_role = !kHead && !kSplit && gridDim.y > 1 && blockIdx.y == 1;
  const bool sinkhorn_here = !kHead && (gridDim.y == 1 || sinkhorn_role);
  for (int64_t t0 = static_cast<int64_t>(blockIdx.x) * kPreTokens; t0 < p.n;
       t0 += static_cast<int64_t>(gridDim.x) * kPreTokens) {
    const int count = p.n - t0 < kPreTokens ? static_cast<int>(p.n - t0) : kPreTokens;
    if (regs)  // the group's first token's streams, while its gates are formed
      load_collapse_x(xs + t0 * width, p.hidden, cr);
    if (warp < count) {
      const int64_t t = t0 + warp;
      float* mix = mix_s[warp];
      gather_mix_warp(p.scratch, t, rows, width, p.norm_eps, mix);
      if (lane < hc && !sinkhorn_role) {
        pre_s[warp][lane] = __fadd_rn(
            sigmoidf(__fadd_rn(__fmul_rn(mix[lane], p.scale[0]), p.base[lane])), p.hc_eps);
        if (kSplit)  // gather_mix_warp has read the whole slot (it ends with __syncwarp)
          pre_slot(p.scratch, t, rows)[lane] = pre_s[warp][lane];
        if (!kHead)
          p.post[t * hc + lane] =
              2.0f * sigmoidf(__fadd_rn(__fmul_rn(mix[hc + lane], p.scale[1]), p.base[hc + lane]));
      }
      if (sinkhorn_here && hc == 4) {
        sinkhorn_shfl<4>(mix, p, p.comb + t * hc * hc);
      } else if (sinkhorn_here && hc * hc <= 32) {
        sinkhorn_shfl<0>(mix, p, p.comb + t * hc * hc);
      } else if (sinkhorn_here) {
        sinkhorn_warp_wide(mix, p, comb_s[warp], p.comb + t * hc * hc);
      }
    }
    if (kSplit || sinkhorn_role)
      continue;  // no barrier needed: each warp's shared rows are its own
    __syncthreads();
    for (int j = 0; j < count; ++j) {
      if (regs) {
        if (j > 0)
          load_collapse_x(xs + (t0 + j) * width, p.hidden, cr);
        collapse_norm_regs(pre_s[j],
                           cr,
                           p.hidden,
                           p.norm_weight != nullptr,
                           p.norm_eps,
                           p.collapsed + (t0 + j) * p.hidden,
                           [] {});
        continue;
      }
      collapse_dispatch(pre_s[j],
                        hc,
                        xs + (t0 + j) * width,
                        p.hidden,
                        p.norm_weight,
                        p.norm_eps,
                        p.collapsed + (t0 + j) * p.hidden);
    }
    __syncthreads();
  }
}

// One block per token at a time. hc 4 at hidden <= kCollapsePer * kPreThreads (every released
// model) collapses from registers and loads the block's next token while it reduces and stores
// this one (grid: kCollapseBlocksPerSm per SM); one token per block waited for each token's loads
// (61% of copy bandwidth at an 8k prefill).
constexpr int kCollapseBlocksPerSm = 1;

template <bool kHead>
__global__ void __launch_bounds__(kPreThreads, kCollapseBlocksPerSm)
    hc_collapse_kernel(HcPreParams p, const float* xs) {
  const bool regs = p.hc == 4 && p.hidden <= kCollapsePer * kPreThreads;
  CollapseRegs cr;
  pdl_begin_after([&] {
    if (regs && p.norm_weight != nullptr)
      load_collapse_weight(p.norm_weight, p.hidden, cr);
  });
  __shared__ float pre_s[kMaxHc];
  const int hc = static_cast<int>(p.hc);
  const int rows = kHead ? hc : (2 + hc) * hc;
  const int64_t width = p.hc * p.hidden;
  if (regs) {
    if (blockIdx.x < p.n)
      load_collapse_x(xs + blockIdx.x * width, p.hidden, cr);
    for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x) {
      if (threadIdx.x < hc)
        pre_s[threadIdx.x] = pre_slot(p.scratch, t, rows)[threadIdx.x];
      __syncthreads();
      const int64_t next = t + gridDim.x;
      collapse_norm_regs(pre_s,
                         cr,
                         p.hidden,
                         p.norm_weight != nullptr,
                         p.norm_eps,
                         p.collapsed + t * p.hidden,
                         [&] {
                           if (next < p.n)
                             load_collapse_x(xs + next * width, p.hidden, cr);
                         });
      __syncthreads();
    }
    return;
  }
  for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x) {
    if (threadIdx.x < hc)
      pre_s[threadIdx.x] = pre_slot(p.scratch, t, rows)[threadIdx.x];
    __syncthreads();
    collapse_dispatch(
        pre_s, hc, xs + t * width, p.hidden, p.norm_weight, p.norm_eps, p.collapsed + t * p.hidden);
    __syncthreads();
  }
}

// From this many tokens the pre step runs as two kernels (gates, then a block per token at a time
// for the collapse; one kernel would collapse its tokens one after another): the same arithmetic in
// the same order, so both paths give the same bits.
constexpr int64_t kPreSplitMinTokens = 4;

template <bool kHead>
Status launch_pre(const HcPreParams& p, const float* xs, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::min(ceil_div(p.n, kPreTokens), kMaxBlocks));
  if (p.n < kPreSplitMinTokens) {
    const dim3 grid(blocks, kHead ? 1 : 2);  // !kHead: the Sinkhorn on blocks of its own
    launch_pdl(hc_pre_kernel<kHead, false>, grid, kPreThreads, 0, stream, p, xs);
    return launched(kHead ? "hc_head launch" : "hc_pre launch");
  }
  launch_pdl(hc_pre_kernel<kHead, true>, blocks, kPreThreads, 0, stream, p, xs);
  DSI_RETURN_IF_ERROR(launched(kHead ? "hc_head gates launch" : "hc_pre gates launch"));
  launch_pdl(
      hc_collapse_kernel<kHead>,
      static_cast<unsigned>(std::min<int64_t>(p.n, int64_t{kCollapseBlocksPerSm} * sm_count())),
      kPreThreads,
      0,
      stream,
      p,
      xs);
  return launched(kHead ? "hc_head collapse launch" : "hc_pre collapse launch");
}

Status check_hc(int64_t hc, int64_t hidden, int64_t n, const char* what) {
  DSI_RETURN_IF_ERROR(check_nonneg(what, {hidden, n}));
  return require(hc > 0 && hc <= kMaxHc, what, "hc_mult must be in [1, 16]");
}

Status check_pending(const HcPending& q, const float* x, const char* what) {
  if (!q.set())
    return (q.post || q.comb || q.x_out)
               ? invalid_argument(std::string(what) + ": pending post step half set")
               : Status();
  if (!q.post || !q.comb || !q.x_out)
    return invalid_argument(std::string(what) + ": pending post step half set");
  return require(q.x_out != x, what, "the pending post's output must not alias x");
}

}  // namespace

Status launch_hc_pre(const HcPreParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_hc(p.hc, p.hidden, p.n, "hc_pre"));
  DSI_RETURN_IF_ERROR(check_pending(p.pending, p.x, "hc_pre"));
  if (p.n == 0)
    return Status();
  if (!p.fn || !p.base || !p.scale || !p.x || !p.post || !p.comb || !p.collapsed || !p.scratch)
    return null_pointer("hc_pre");
  DSI_RETURN_IF_ERROR(launch_mix(p.fn,
                                 static_cast<int>((2 + p.hc) * p.hc),
                                 p.hc,
                                 p.hidden,
                                 p.x,
                                 p.n,
                                 p.pending,
                                 p.scratch,
                                 stream));
  return launch_pre<false>(p, p.pending.set() ? p.pending.x_out : p.x, stream);
}

Status launch_hc_head(const HcHeadParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_hc(p.hc, p.hidden, p.n, "hc_head"));
  if (p.n == 0)
    return Status();
  if (!p.fn || !p.base || !p.scale || !p.x || !p.collapsed || !p.scratch)
    return null_pointer("hc_head");
  DSI_RETURN_IF_ERROR(launch_mix(
      p.fn, static_cast<int>(p.hc), p.hc, p.hidden, p.x, p.n, HcPending{}, p.scratch, stream));
  HcPreParams pp;
  pp.base = p.base;
  pp.scale = p.scale;
  pp.hc = p.hc;
  pp.hidden = p.hidden;
  pp.hc_eps = p.hc_eps;
  pp.norm_eps = p.norm_eps;
  pp.n = p.n;
  pp.norm_weight = p.norm_weight;
  pp.collapsed = p.collapsed;
  pp.scratch = p.scratch;
  return launch_pre<true>(pp, p.x, stream);
}

Status launch_hc_post(const HcPostParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_hc(p.hc, p.hidden, p.n, "hc_post"));
  if (p.n == 0 || p.hidden == 0)
    return Status();
  if (!p.f || !p.x || !p.post || !p.comb || !p.x_out)
    return null_pointer("hc_post");
  if (p.x_out == p.x)
    return invalid_argument("hc_post: x_out must not alias x");
  return post_launch(p, stream);
}

}  // namespace dsinfer::cuda
