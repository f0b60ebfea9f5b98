// MoE kernels (moe.h): routing, grouping, the grouped expert GEMMs (the gemm.cuh tile over each
// expert's own weights) and the deterministic combine.
#include <algorithm>
#include <string>

#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int64_t kMaxGrid = 65535;

// ---- routing: one warp per token --------------------------------------------------------------

constexpr int kRouteWarps = 4;

__device__ __forceinline__ float router_score(float x, RouterScoring f) {
  if (f == RouterScoring::kSqrtSoftplus)
    return sqrtf(x > 20.0f ? x : log1pf(expf(x)));
  return 1.0f / __fadd_rn(1.0f, expf(-x));  // sigmoid; softmax is handled by the caller
}

__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(MoeRouteParams p) {
  pdl_begin();
  __shared__ float sc[kRouteWarps][kMaxExperts];
  __shared__ float biased[kRouteWarps][kMaxExperts];
  __shared__ int32_t sel[kRouteWarps][kMaxExpertsPerToken];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t ne = p.n_experts;
  float* s = sc[warp];
  float* b = biased[warp];
  int32_t* chosen = sel[warp];
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp; t < p.n;
       t += static_cast<int64_t>(gridDim.x) * kRouteWarps) {
    const float* lg = p.logits + t * ne;
    if (p.scoring == RouterScoring::kSoftmax) {  // cpu::softmax: float exp, double sum
      float mx = -INFINITY;
      for (int64_t e = lane; e < ne; e += 32) mx = fmaxf(mx, lg[e]);
      mx = warp_max(mx);
      double sum = 0.0;
      for (int64_t e = lane; e < ne; e += 32) {
        s[e] = expf(__fsub_rn(lg[e], mx));
        sum += s[e];
      }
      const float inv = static_cast<float>(1.0 / warp_sum(sum));
      for (int64_t e = lane; e < ne; e += 32) s[e] = __fmul_rn(s[e], inv);
    } else {
      for (int64_t e = lane; e < ne; e += 32) s[e] = router_score(lg[e], p.scoring);
    }
    __syncwarp();
    if (p.tid2eid != nullptr) {
      const int32_t tok = p.tokens[t];
      for (int64_t i = lane; i < p.k; i += 32) chosen[i] = p.tid2eid[tok * p.k + i];
    } else {
      for (int64_t e = lane; e < ne; e += 32) b[e] = p.bias ? __fadd_rn(s[e], p.bias[e]) : s[e];
      __syncwarp();
      // k rounds of a warp argmax (larger value, then lower id), excluding earlier picks. Each lane
      // keeps its own picked experts in a register mask (bit j = expert lane + 32 j; ne <= 1024),
      // so `chosen` is written and read by lane 0 alone (no shared-memory scan, no race).
      uint32_t taken = 0;
      for (int64_t i = 0; i < p.k; ++i) {
        float best = 0.0f;
        int32_t best_e = -1;
        int j = 0;
        for (int64_t e = lane; e < ne; e += 32, ++j) {
          const float v = b[e];
          if (((taken >> j) & 1u) != 0 || v != v)
            continue;
          if (best_e < 0 || v > best) {
            best = v;
            best_e = static_cast<int32_t>(e);
          }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          const float ov = __shfl_xor_sync(0xffffffffu, best, off);
          const int32_t oe = __shfl_xor_sync(0xffffffffu, best_e, off);
          if (oe >= 0 && (best_e < 0 || ov > best || (ov == best && oe < best_e))) {
            best = ov;
            best_e = oe;
          }
        }
        best_e = __shfl_sync(0xffffffffu, best_e, 0);  // lane 0's pick, as before
        if (best_e >= 0 && (best_e & 31) == lane)
          taken |= 1u << (best_e >> 5);
        if (lane == 0)
          chosen[i] = best_e;
      }
    }
    __syncwarp();
    if (lane == 0) {
      const auto valid = [&](int32_t e) { return e >= 0 && e < ne; };
      float sum = 0.0f;
      for (int64_t i = 0; i < p.k; ++i)
        sum = __fadd_rn(sum, valid(chosen[i]) ? s[chosen[i]] : 0.0f);
      for (int64_t i = 0; i < p.k; ++i) {
        float g = valid(chosen[i]) ? s[chosen[i]] : 0.0f;
        if (p.norm_topk_prob)
          g = __fdiv_rn(g, __fadd_rn(sum, 1e-20f));
        p.expert_ids[t * p.k + i] = chosen[i];
        p.weights[t * p.k + i] = __fmul_rn(g, p.routed_scaling_factor);
      }
    }
    __syncwarp();
  }
}

// ---- grouping: one block, a stable counting sort ----------------------------------------------
// Histogram of the experts, exclusive scan, then the pairs in chunks of the block size in index
// order: a pair's slot is its expert's begin + the pairs of that expert in earlier chunks + those
// in earlier warps of this chunk + its rank among its warp's lanes with the same expert (so the
// pairs of an expert stay in ascending index order, as the CPU groups them).

constexpr int kGroupThreads = 1024;
constexpr int kGroupWarps = kGroupThreads / 32;
constexpr int64_t kGroupChunk = kMoeGroupChunk;

size_t group_smem_bytes(int64_t ne) {
  return static_cast<size_t>(ne + 1) * 8 + static_cast<size_t>(ne) * 4 * (1 + kGroupWarps);
}

// Pairs [i0, i1) in chunks of the block size, in index order (group_smem: begin, cursor and the
// per-warp counts set up by the caller; cursor[e] = the pairs of expert e before i0).
__device__ void group_scatter(const MoeGroupParams& p,
                              const int64_t* begin,
                              int32_t* cursor,
                              int32_t* counts,
                              int64_t i0,
                              int64_t i1) {
  const int64_t ne = p.n_experts;
  auto warp_count = [&](int w, int64_t e) -> int32_t& { return counts[w * ne + e]; };
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int64_t base = i0; base < i1; base += blockDim.x) {
    for (int64_t i = threadIdx.x; i < kGroupWarps * ne; i += blockDim.x) counts[i] = 0;
    __syncthreads();
    const int64_t i = base + threadIdx.x;
    const int32_t e = i < i1 ? p.expert_ids[i] : -1;
    const bool ok = e >= 0 && e < ne;
    const unsigned same = __match_any_sync(0xffffffffu, ok ? e : -1);
    const int rank = __popc(same & ((1u << lane) - 1u));
    if (ok && rank == 0)
      warp_count(warp, e) = __popc(same);
    __syncthreads();
    // Thread e turns its column into exclusive offsets (earlier chunks + earlier warps).
    for (int64_t x = threadIdx.x; x < ne; x += blockDim.x) {
      int32_t run = cursor[x];
      for (int w = 0; w < kGroupWarps; ++w) {
        const int32_t c = warp_count(w, x);
        warp_count(w, x) = run;
        run += c;
      }
      cursor[x] = run;
    }
    __syncthreads();
    if (ok) {
      const int64_t pos = begin[e] + warp_count(warp, e) + rank;
      p.pair_src[pos] = static_cast<int32_t>(i);
      p.pair_pos[i] = static_cast<int32_t>(pos);
    } else if (i < i1) {
      p.pair_pos[i] = -1;
    }
    __syncthreads();
  }
}

// v[0..n) = its inclusive prefix sums, by the whole block (blockDim.x a multiple of 32; each value
// and sum < 2^31: pair counts). Integer sums: the same values as a serial scan. Thread 0's serial
// loop over 256 experts took ~8 us of a decode step's moe_group (one block).
__device__ void inclusive_scan_block(int64_t* v, int64_t n) {
  __shared__ int32_t warp_sums[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  int64_t carry = 0;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    int32_t x = i < n ? static_cast<int32_t>(v[i]) : 0;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int32_t o = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off)
        x += o;
    }
    if (lane == 31)
      warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int32_t w = lane < warps ? warp_sums[lane] : 0;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int32_t o = __shfl_up_sync(0xffffffffu, w, off);
        if (lane >= off)
          w += o;
      }
      if (lane < warps)
        warp_sums[lane] = w;
    }
    __syncthreads();
    if (i < n)
      v[i] = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + x;
    carry += warp_sums[warps - 1];
    __syncthreads();  // warp_sums is rewritten by the next chunk
  }
}

__global__ void __launch_bounds__(kGroupThreads) moe_group_kernel(MoeGroupParams p) {
  pdl_begin();
  extern __shared__ __align__(8) uint8_t group_smem[];
  const int64_t pairs = p.n * p.k;
  const int64_t ne = p.n_experts;
  auto* begin = reinterpret_cast<int64_t*>(group_smem);       // [ne + 1]
  auto* cursor = reinterpret_cast<int32_t*>(begin + ne + 1);  // [ne]
  int32_t* counts = cursor + ne;                              // [warps][ne]
  for (int64_t e = threadIdx.x; e <= ne; e += blockDim.x) begin[e] = 0;
  for (int64_t e = threadIdx.x; e < ne; e += blockDim.x) cursor[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int32_t e = p.expert_ids[i];
    if (e >= 0 && e < ne)
      atomicAdd(reinterpret_cast<unsigned long long*>(&begin[e + 1]), 1ull);
  }
  __syncthreads();
  inclusive_scan_block(begin + 1, ne);
  for (int64_t e = threadIdx.x; e <= ne; e += blockDim.x) p.expert_begin[e] = begin[e];
  group_scatter(p, begin, cursor, counts, 0, pairs);
}

// Several blocks (prefill-sized pair counts; the one block took 0.19 ms for 49,152 pairs):
// chunk c = pairs [c * kGroupChunk, +kGroupChunk). Count: each chunk's pairs per expert into
// chunk_counts[c][e]. Scan: expert_begin, and chunk_counts[c][e] turned into the pairs of
// expert e in the chunks before c. Scatter: each chunk as the one block does, its cursors
// starting there. The same slots as moe_group_kernel.
__global__ void __launch_bounds__(kGroupThreads) moe_group_count_kernel(MoeGroupParams p) {
  pdl_begin();
  extern __shared__ __align__(8) uint8_t group_smem[];
  auto* hist = reinterpret_cast<int32_t*>(group_smem);  // [ne]
  const int64_t ne = p.n_experts;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kGroupChunk;
  const int64_t i1 = min(p.n * p.k, i0 + kGroupChunk);
  for (int64_t e = threadIdx.x; e < ne; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const int32_t e = p.expert_ids[i];
    if (e >= 0 && e < ne)
      atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < ne; e += blockDim.x)
    p.chunk_counts[blockIdx.x * ne + e] = hist[e];
}

__global__ void __launch_bounds__(kGroupThreads)
    moe_group_scan_kernel(MoeGroupParams p, int64_t chunks) {
  pdl_begin();
  __shared__ int64_t totals[kMaxExperts + 1];
  const int64_t ne = p.n_experts;
  for (int64_t e = threadIdx.x; e < ne; e += blockDim.x) {
    int32_t run = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      int32_t& v = p.chunk_counts[c * ne + e];
      const int32_t n = v;
      v = run;
      run += n;
    }
    totals[e + 1] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    totals[0] = 0;
    for (int64_t e = 0; e < ne; ++e) totals[e + 1] += totals[e];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e <= ne; e += blockDim.x) p.expert_begin[e] = totals[e];
}

__global__ void __launch_bounds__(kGroupThreads) moe_group_scatter_kernel(MoeGroupParams p) {
  pdl_begin();
  extern __shared__ __align__(8) uint8_t group_smem[];
  const int64_t ne = p.n_experts;
  auto* begin = reinterpret_cast<int64_t*>(group_smem);       // [ne + 1]
  auto* cursor = reinterpret_cast<int32_t*>(begin + ne + 1);  // [ne]
  int32_t* counts = cursor + ne;                              // [warps][ne]
  for (int64_t e = threadIdx.x; e <= ne; e += blockDim.x) begin[e] = p.expert_begin[e];
  for (int64_t e = threadIdx.x; e < ne; e += blockDim.x)
    cursor[e] = p.chunk_counts[blockIdx.x * ne + e];
  __syncthreads();
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kGroupChunk;
  group_scatter(p, begin, cursor, counts, i0, min(p.n * p.k, i0 + kGroupChunk));
}

// ---- grouped expert GEMMs ----------------------------------------------------------------------

// Tile ty of the flattened schedule -> (expert, first grouped pair, end); false past the last.
__device__ bool expert_tile(
    const ExpertFfnParams& p, int64_t ty, int64_t* e_out, int64_t* g0, int64_t* g_end) {
  if (p.expert_begin == nullptr) {
    *e_out = 0;
    *g0 = ty * kGemmTileT;
    *g_end = p.num_pairs;
    return *g0 < p.num_pairs;
  }
  for (int64_t e = 0; e < p.n_experts; ++e) {
    const int64_t b = p.expert_begin[e];
    const int64_t end = p.expert_begin[e + 1];
    const int64_t tiles = (end - b + kGemmTileT - 1) / kGemmTileT;
    if (ty < tiles) {
      *e_out = e;
      *g0 = b + ty * kGemmTileT;
      *g_end = end;
      return true;
    }
    ty -= tiles;
  }
  return false;
}

__device__ __forceinline__ int64_t pair_index(const ExpertFfnParams& p, int64_t g) {
  return p.pair_src ? p.pair_src[g] : g;
}

__global__ void __launch_bounds__(kGemmThreads) expert_gate_up_kernel(ExpertFfnParams p) {
  __shared__ GemmSmem sm;
  int64_t e, g0, g_end;
  if (!expert_tile(p, blockIdx.y, &e, &g0, &g_end))
    return;  // block-uniform
  if (threadIdx.x < kGemmTileT) {
    const int64_t g = g0 + threadIdx.x;
    sm.src[threadIdx.x] = g < g_end ? pair_index(p, g) / p.k : -1;
  }
  __syncthreads();
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kGemmTileR;
  const MatrixRef w1 = p.w1[e];
  const MatrixRef w3 = p.w3[e];
  float a[kGemmRowsPerThread];
  float u[kGemmRowsPerThread];
  gemm_tile(w1, r0, p.inter, p.x, p.hidden, p.quantize_activations, sm, a);
  gemm_tile(w3, r0, p.inter, p.x, p.hidden, p.quantize_activations, sm, u);
  const int64_t g = g0 + gemm_tile_token();
  if (g >= g_end)
    return;
  const float gate = p.gates ? p.gates[pair_index(p, g)] : 1.0f;
  const float lim = p.swiglu_limit;
#pragma unroll
  for (int j = 0; j < kGemmRowsPerThread; ++j) {
    const int64_t r = r0 + gemm_tile_row(j);
    if (r >= p.inter)
      continue;
    p.h[g * p.inter + r] = swiglu_gated(a[j], u[j], lim, gate);
  }
}

__global__ void __launch_bounds__(kGemmThreads) expert_down_kernel(ExpertFfnParams p) {
  __shared__ GemmSmem sm;
  int64_t e, g0, g_end;
  if (!expert_tile(p, blockIdx.y, &e, &g0, &g_end))
    return;
  if (threadIdx.x < kGemmTileT) {
    const int64_t g = g0 + threadIdx.x;
    sm.src[threadIdx.x] = g < g_end ? g : -1;
  }
  __syncthreads();
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kGemmTileR;
  const MatrixRef w2 = p.w2[e];
  float acc[kGemmRowsPerThread];
  gemm_tile(w2, r0, p.hidden, p.h, p.inter, p.quantize_activations, sm, acc);
  const int64_t g = g0 + gemm_tile_token();
  if (g >= g_end)
    return;
#pragma unroll
  for (int j = 0; j < kGemmRowsPerThread; ++j) {
    const int64_t r = r0 + gemm_tile_row(j);
    if (r < p.hidden)
      p.y[g * p.hidden + r] = acc[j];
  }
}

// ---- combine: blocks per token x column slice
// --------------------------------------------------------------

// Slots the vectorised combine keeps in registers (V4: 6 per token); more take the scalar loop.
constexpr int kCombineVecSlots = 8;

__global__ void moe_combine_kernel(MoeCombineParams p) {
  pdl_begin();
  __shared__ int32_t order[kMaxExpertsPerToken];
  __shared__ int count;
  for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x) {
    if (threadIdx.x == 0) {
      // The token's slots by (expert id, slot), as the CPU's loop over experts visits them.
      int c = 0;
      for (int64_t i = 0; i < p.k; ++i) {
        if (p.pair_pos[t * p.k + i] < 0)
          continue;
        const int32_t e = p.expert_ids[t * p.k + i];
        int j = c++;
        while (j > 0 && p.expert_ids[t * p.k + order[j - 1]] > e) {
          order[j] = order[j - 1];
          --j;
        }
        order[j] = static_cast<int32_t>(i);
      }
      count = c;
    }
    __syncthreads();
    // blockIdx.y slices the columns: a lone decode token still spreads over many blocks.
    const bool aligned = ((reinterpret_cast<uintptr_t>(p.y) | reinterpret_cast<uintptr_t>(p.out) |
                           reinterpret_cast<uintptr_t>(p.shared)) &
                          15u) == 0;
    if (aligned && p.hidden % 4 == 0 && count <= kCombineVecSlots) {
      // Four columns per thread, every slot's row loaded before the sums (the scalar loop
      // waited for each load in turn); the same sums in the same order.
      const int64_t quads = p.hidden / 4;
      int64_t rows[kCombineVecSlots];
#pragma unroll
      for (int j = 0; j < kCombineVecSlots; ++j)
        rows[j] = j < count ? p.pair_pos[t * p.k + order[j]] : 0;
      for (int64_t q = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; q < quads;
           q += static_cast<int64_t>(gridDim.y) * blockDim.x) {
        float4 yv[kCombineVecSlots];
#pragma unroll
        for (int j = 0; j < kCombineVecSlots; ++j) {
          if (j < count)
            yv[j] = __ldg(reinterpret_cast<const float4*>(p.y + rows[j] * p.hidden) + q);
        }
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (p.shared) {
          const float4 sv = __ldg(reinterpret_cast<const float4*>(p.shared + t * p.hidden) + q);
          acc = make_float4(__fadd_rn(0.0f, sv.x),
                            __fadd_rn(0.0f, sv.y),
                            __fadd_rn(0.0f, sv.z),
                            __fadd_rn(0.0f, sv.w));
        }
#pragma unroll
        for (int j = 0; j < kCombineVecSlots; ++j) {
          if (j < count) {
            acc.x = __fadd_rn(acc.x, yv[j].x);
            acc.y = __fadd_rn(acc.y, yv[j].y);
            acc.z = __fadd_rn(acc.z, yv[j].z);
            acc.w = __fadd_rn(acc.w, yv[j].w);
          }
        }
        reinterpret_cast<float4*>(p.out + t * p.hidden)[q] = acc;
      }
      __syncthreads();
      continue;
    }
    for (int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; c < p.hidden;
         c += static_cast<int64_t>(gridDim.y) * blockDim.x) {
      float acc = 0.0f;
      if (p.shared)
        acc = __fadd_rn(acc, p.shared[t * p.hidden + c]);
      for (int j = 0; j < count; ++j) {
        const int64_t g = p.pair_pos[t * p.k + order[j]];
        acc = __fadd_rn(acc, p.y[g * p.hidden + c]);
      }
      p.out[t * p.hidden + c] = acc;
    }
    __syncthreads();
  }
}

}  // namespace

Status launch_moe_route(const MoeRouteParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("moe_route", {p.n, p.n_experts, p.k}));
  DSI_RETURN_IF_ERROR(require(p.n_experts <= kMaxExperts, "moe_route", "more than 1024 experts"));
  DSI_RETURN_IF_ERROR(require(p.k <= kMaxExpertsPerToken, "moe_route", "k > 32"));
  DSI_RETURN_IF_ERROR(require(
      p.tid2eid != nullptr || p.k <= p.n_experts, "moe_route", "k exceeds the number of experts"));
  if (p.n == 0 || p.k == 0)
    return Status();
  if (!p.logits || !p.expert_ids || !p.weights || (p.tid2eid && !p.tokens))
    return null_pointer("moe_route");
  const int64_t blocks = std::min(ceil_div(p.n, kRouteWarps), kMaxGrid);
  launch_pdl(moe_route_kernel, static_cast<unsigned>(blocks), kRouteWarps * 32, 0, stream, p);
  return launched("moe_route launch");
}

Status launch_moe_group(const MoeGroupParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("moe_group", {p.n, p.k, p.n_experts}));
  DSI_RETURN_IF_ERROR(require(p.n_experts <= kMaxExperts, "moe_group", "more than 1024 experts"));
  DSI_RETURN_IF_ERROR(require(p.n * p.k < (int64_t{1} << 31), "moe_group", "too many pairs"));
  if (!p.expert_begin)
    return null_pointer("moe_group");
  if (p.n * p.k > 0 && (!p.expert_ids || !p.pair_src || !p.pair_pos))
    return null_pointer("moe_group");
  const size_t smem = group_smem_bytes(p.n_experts);
  if (smem > 48 * 1024) {
    for (auto* k : {moe_group_kernel, moe_group_scatter_kernel}) {
      DSI_RETURN_IF_ERROR(device::check_cuda(
          cudaFuncSetAttribute(
              k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "moe_group smem attribute"));
    }
  }
  const int64_t chunks = ceil_div(p.n * p.k, kGroupChunk);
  if (p.chunk_counts != nullptr && chunks >= 2) {
    const size_t hist = static_cast<size_t>(p.n_experts) * 4;
    launch_pdl(
        moe_group_count_kernel, static_cast<unsigned>(chunks), kGroupThreads, hist, stream, p);
    DSI_RETURN_IF_ERROR(launched("moe_group count launch"));
    launch_pdl(moe_group_scan_kernel, 1, kGroupThreads, 0, stream, p, chunks);
    DSI_RETURN_IF_ERROR(launched("moe_group scan launch"));
    launch_pdl(
        moe_group_scatter_kernel, static_cast<unsigned>(chunks), kGroupThreads, smem, stream, p);
    return launched("moe_group scatter launch");
  }
  launch_pdl(moe_group_kernel, 1, kGroupThreads, smem, stream, p);
  return launched("moe_group launch");
}

Status launch_expert_ffn(const ExpertFfnParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("expert_ffn", {p.hidden, p.inter, p.num_pairs}));
  DSI_RETURN_IF_ERROR(require(p.n_experts > 0, "expert_ffn", "no experts"));
  DSI_RETURN_IF_ERROR(require(p.k > 0, "expert_ffn", "k must be positive"));
  DSI_RETURN_IF_ERROR(require(p.expert_begin != nullptr || p.n_experts == 1,
                              "expert_ffn",
                              "several experts need expert_begin"));
  if (p.num_pairs == 0 || p.hidden == 0 || p.inter == 0)
    return Status();
  if (!p.w1 || !p.w3 || !p.w2 || !p.x || !p.h || !p.y)
    return null_pointer("expert_ffn");
  // Upper bound of the flattened tile count: sum_e ceil(c_e / T) <= pairs / T + experts.
  const int64_t tiles = ceil_div(p.num_pairs, kGemmTileT) + (p.expert_begin ? p.n_experts : 0);
  DSI_RETURN_IF_ERROR(require(tiles <= kMaxGrid, "expert_ffn", "too many pairs for one launch"));
  const dim3 g1(static_cast<unsigned>(ceil_div(p.inter, kGemmTileR)), static_cast<unsigned>(tiles));
  expert_gate_up_kernel<<<g1, kGemmThreads, 0, stream>>>(p);
  DSI_RETURN_IF_ERROR(launched("expert gate/up launch"));
  const dim3 g2(static_cast<unsigned>(ceil_div(p.hidden, kGemmTileR)),
                static_cast<unsigned>(tiles));
  expert_down_kernel<<<g2, kGemmThreads, 0, stream>>>(p);
  return launched("expert down launch");
}

Status launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("moe_combine", {p.n, p.k, p.hidden}));
  DSI_RETURN_IF_ERROR(require(p.k <= kMaxExpertsPerToken, "moe_combine", "k > 32"));
  if (p.n == 0 || p.hidden == 0)
    return Status();
  if (!p.out || (p.k > 0 && (!p.y || !p.pair_pos || !p.expert_ids)))
    return null_pointer("moe_combine");
  // Column slices (blockIdx.y) only while the tokens alone give too few blocks: every slice
  // re-sorts its token's slots, which dominated prefill-sized combines.
  const int64_t slices =
      std::clamp<int64_t>(2048 / p.n, 1, std::min<int64_t>(ceil_div(p.hidden, 256), 32));
  const dim3 grid(static_cast<unsigned>(std::min(p.n, kMaxGrid)), static_cast<unsigned>(slices));
  launch_pdl(moe_combine_kernel, grid, 256, 0, stream, p);
  return launched("moe_combine launch");
}

}  // namespace dsinfer::cuda
