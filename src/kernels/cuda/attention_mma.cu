// Tensor-core paths of sink attention and the indexer scores (attention.h), on mma.sync BF16
// m16n8k16 with fp32 accumulators. fp32 operands are split into BF16 high and low halves
// (mma_sync.cuh: split_bf16) and multiplied as hi*hi + hi*lo + lo*hi, which keeps the products
// to ~2^-17 relative, so both numerics modes keep their CPU-level accuracy.
//
// Sink attention: one block per (query, key split). All heads of a query share its key list (the
// MQA shape of V4), so heads are the MMA's M: warp (g, half) owns 16 heads and one half of the
// head dim. Per tile of 32 keys: each warp's partial q.k over its half, the two halves summed in
// shared memory in a fixed order, an online softmax seeded with the sink (m = sink, l = 1 on the
// first split), then P.V into the warp's 16 x dim/2 accumulators. Keys are read once per tile
// and converted on the way into shared memory; q stays in shared memory for the whole list.
// With splits, the partial (m, l, acc) of each split go to scratch and a second kernel merges
// them in split order.
//
// BF16 operands (`deepseek` numerics, sink_attention_bf16_kernel): q and the key tile live in
// shared memory as BF16 only (RNE), so q.k and P.V are one MMA per product; the running max is
// an integer in base 2 (u = logit * log2 e, M = ceil(max u)), so the rescalings 2^(M - M') are
// exact, and the probabilities 2^(u - M) are rounded to BF16 as they become the A fragments of
// P.V: the same rounded values as the CPU's one-pass attention_with_sink_bf16 whatever the
// tiling or the splits. The key tiles are double buffered: while the warps run the MMAs of
// tile t, cp.async copies the fp32 rows (or KV records) of tile t + 1 into a staging buffer,
// converted (decoded) to BF16 once they are all in.
//
// Indexer scores: one block per (query, run of 64-key tiles), heads as M again; the q fragments
// stay in registers, the dots of a tile land in shared memory, and one thread per key sums
// w_h * relu(dot_h) over the heads in the CPU's serial order.
#include <algorithm>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_record.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/pdl.cuh"
#include "numeric/float_formats.h"

namespace dsinfer::cuda {
namespace {

using mma::ldmatrix_x4;
using mma::ldmatrix_x4_trans;
using mma::mma_bf16;
using mma::split_bf16;

constexpr int64_t kMaxGridY = 65535;

// ---- sink attention ----------------------------------------------------------------------------

constexpr int kTk = 32;       // keys per tile
constexpr int kStage = 8;     // independent loads in flight per thread while staging q and keys
constexpr int kSx = kTk + 8;  // row stride (floats) of the partial-score exchange buffer

__host__ __device__ constexpr int attn_sd(int dim) {
  return dim + 8;  // BF16 row stride: 16-byte aligned, ldmatrix rows on distinct banks
}

__host__ __device__ constexpr size_t attn_smem_bytes(int dim, int rows) {
  return static_cast<size_t>(2 * rows + 2 * kTk) * attn_sd(dim) * 2 +
         static_cast<size_t>(2 * rows * kSx) * 4 + kTk * 4;
}

__device__ __forceinline__ void store_pair(__nv_bfloat16* hi, __nv_bfloat16* lo, float a, float b) {
  uint32_t h, l;
  split_bf16(a, b, &h, &l);
  *reinterpret_cast<uint32_t*>(hi) = h;
  *reinterpret_cast<uint32_t*>(lo) = l;
}

template <int D>
__global__ void __launch_bounds__(256, 1)
    sink_attention_mma_kernel(SinkAttentionParams p, int hw, int nsplit, float* part) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int SD = attn_sd(D);
  constexpr int HALF = D / 2;
  constexpr int KS = HALF / 16;  // q.k k-steps per warp
  constexpr int NT = HALF / 8;   // P.V n-tiles per warp
  const int rows = 16 * hw;
  __nv_bfloat16* qh = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* ql = qh + rows * SD;
  __nv_bfloat16* kh = ql + rows * SD;
  __nv_bfloat16* kl = kh + kTk * SD;
  float* sx = reinterpret_cast<float*>(kl + kTk * SD);  // [2][rows][kSx]
  int* valid = reinterpret_cast<int*>(sx + 2 * rows * kSx);
  __shared__ const float* krow[kTk];
  const int nthreads = blockDim.x;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int wh = warp % hw;
  const int half = warp / hw;
  const int r0 = 16 * wh + g;
  const int r1 = r0 + 8;
  const int split = static_cast<int>(blockIdx.x);
  const int64_t heads = p.heads;
  for (int64_t qi = blockIdx.y; qi < p.nq; qi += gridDim.y) {
    const float* q = p.q + qi * heads * D;
    // Staged kStage loads at a time per thread: a loop of one load then one shared store would
    // wait a full memory round trip per element.
    for (int i0 = threadIdx.x; i0 < rows * HALF; i0 += nthreads * kStage) {
      float2 v[kStage];
#pragma unroll
      for (int u = 0; u < kStage; ++u) {
        const int i = i0 + u * nthreads;
        const int r = i / HALF;
        const int c = (i % HALF) * 2;
        v[u] = i < rows * HALF && r < heads ? *reinterpret_cast<const float2*>(q + r * D + c)
                                            : make_float2(0.0f, 0.0f);  // rows 8-byte aligned
      }
#pragma unroll
      for (int u = 0; u < kStage; ++u) {
        const int i = i0 + u * nthreads;
        if (i < rows * HALF) {
          const int r = i / HALF;
          const int c = (i % HALF) * 2;
          store_pair(qh + r * SD + c, ql + r * SD + c, v[u].x, v[u].y);
        }
      }
    }
    const auto [kb, ke, t0, t1] = attn::split_range(p, qi, split, nsplit, kTk);
    // Row state of rows r0 / r1: the sink seeds the running max (finite, so masked keys give
    // exp(-inf) = 0), and its mass 1 = exp(sink - sink) is counted once, on split 0 (lane t = 0
    // of the quad holds it; l is summed over the quad at the end).
    float m0 = r0 < heads ? p.sinks[r0] : 0.0f;
    float m1 = r1 < heads ? p.sinks[r1] : 0.0f;
    float l0 = (split == 0 && t == 0) ? 1.0f : 0.0f;
    float l1 = l0;
    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    for (int64_t tile = t0; tile < t1; ++tile) {
      __syncthreads();  // q stored / the previous tile's readers are done
      const int64_t base = kb + tile * kTk;
      // The tile's key rows resolved once (one thread per key), then their values staged with
      // kStage independent loads in flight per thread.
      if (threadIdx.x < kTk) {
        const int64_t idx = base + threadIdx.x;
        const float* kp = idx < ke ? kv_ref_ptr(p.pool, p.local, p.key_refs[idx]) : nullptr;
        krow[threadIdx.x] = kp;
        valid[threadIdx.x] = kp != nullptr;
      }
      __syncthreads();
      for (int i0 = threadIdx.x; i0 < kTk * HALF; i0 += nthreads * kStage) {
        float2 v[kStage];
#pragma unroll
        for (int u = 0; u < kStage; ++u) {
          const int i = i0 + u * nthreads;
          const float* kp = i < kTk * HALF ? krow[i / HALF] : nullptr;
          const int c = (i % HALF) * 2;
          v[u] = make_float2(0.0f, 0.0f);
          if (kp != nullptr) {
            v[u] = (reinterpret_cast<uintptr_t>(kp) & 7u) == 0
                       ? *reinterpret_cast<const float2*>(kp + c)
                       : make_float2(kp[c], kp[c + 1]);  // rows need not be 8-byte aligned
          }
        }
#pragma unroll
        for (int u = 0; u < kStage; ++u) {
          const int i = i0 + u * nthreads;
          if (i < kTk * HALF) {
            const int j = i / HALF;
            const int c = (i % HALF) * 2;
            store_pair(kh + j * SD + c, kl + j * SD + c, v[u].x, v[u].y);
          }
        }
      }
      __syncthreads();
      // Partial q.k over this warp's half of the dims.
      float s[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll 4
      for (int ks = 0; ks < KS; ++ks) {
        const int col = half * HALF + ks * 16;
        uint32_t ah[4], al[4];
        const int arow = 16 * wh + (lane & 15);
        ldmatrix_x4(ah, qh + arow * SD + col + 8 * (lane >> 4));
        ldmatrix_x4(al, ql + arow * SD + col + 8 * (lane >> 4));
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const int key = 16 * np + (lane & 7) + 8 * (lane >> 4);
          const int kc = col + 8 * ((lane >> 3) & 1);
          uint32_t bh[4], bl[4];
          ldmatrix_x4(bh, kh + key * SD + kc);
          ldmatrix_x4(bl, kl + key * SD + kc);
          const uint32_t bh0[2] = {bh[0], bh[1]}, bh1[2] = {bh[2], bh[3]};
          const uint32_t bl0[2] = {bl[0], bl[1]}, bl1[2] = {bl[2], bl[3]};
          mma_bf16(s[2 * np], ah, bh0);
          mma_bf16(s[2 * np], al, bh0);
          mma_bf16(s[2 * np + 1], ah, bh1);
          mma_bf16(s[2 * np + 1], al, bh1);
          if (col + 16 > p.exact_dims) {  // warp-uniform: keys' low halves are nonzero here
            mma_bf16(s[2 * np], ah, bl0);
            mma_bf16(s[2 * np + 1], ah, bl1);
          }
        }
      }
      float* mine = sx + half * rows * kSx;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(mine + r0 * kSx + c) = make_float2(s[nt][0], s[nt][1]);
        *reinterpret_cast<float2*>(mine + r1 * kSx + c) = make_float2(s[nt][2], s[nt][3]);
      }
      __syncthreads();
      // Full logits (half 0 + half 1, fixed order), masked, scaled.
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * nt + 2 * t + e;
          const bool ok = valid[c] != 0;
          const float a = sx[r0 * kSx + c] + sx[(rows + r0) * kSx + c];
          const float b = sx[r1 * kSx + c] + sx[(rows + r1) * kSx + c];
          s[nt][e] = ok ? a * p.scale : -INFINITY;
          s[nt][2 + e] = ok ? b * p.scale : -INFINITY;
        }
      }
      const float2 cf = attn::softmax_step<false>(s, m0, m1, l0, l1);
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        o[i][0] *= cf.x;
        o[i][1] *= cf.x;
        o[i][2] *= cf.y;
        o[i][3] *= cf.y;
      }
      // P.V: the score fragments of key groups 2kk, 2kk+1 are the A fragment of k-step kk.
#pragma unroll
      for (int kk = 0; kk < kTk / 16; ++kk) {
        uint32_t ph[4], pl[4];
        split_bf16(s[2 * kk][0], s[2 * kk][1], &ph[0], &pl[0]);
        split_bf16(s[2 * kk][2], s[2 * kk][3], &ph[1], &pl[1]);
        split_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1], &ph[2], &pl[2]);
        split_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3], &ph[3], &pl[3]);
        const int key = 16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          const int dcol = half * HALF + 16 * np + 8 * (lane >> 4);
          uint32_t vh[4], vl[4];
          ldmatrix_x4_trans(vh, kh + key * SD + dcol);
          ldmatrix_x4_trans(vl, kl + key * SD + dcol);
          const uint32_t vh0[2] = {vh[0], vh[1]}, vh1[2] = {vh[2], vh[3]};
          const uint32_t vl0[2] = {vl[0], vl[1]}, vl1[2] = {vl[2], vl[3]};
          mma_bf16(o[2 * np], ph, vh0);
          mma_bf16(o[2 * np], pl, vh0);
          mma_bf16(o[2 * np + 1], ph, vh1);
          mma_bf16(o[2 * np + 1], pl, vh1);
          if (half * HALF + 16 * np + 16 > p.exact_dims) {
            mma_bf16(o[2 * np], ph, vl0);
            mma_bf16(o[2 * np + 1], ph, vl1);
          }
        }
      }
    }
    attn::finish_query<D, NT>(p, qi, split, nsplit, part, half, t, r0, r1, m0, m1, l0, l1, o);
    __syncthreads();  // q smem is rewritten by the next query
  }
}

constexpr float kLog2e = 1.4426950408889634f;

__host__ __device__ constexpr size_t attn_bf16_smem_bytes(int dim, int rows) {
  return static_cast<size_t>(rows + kTk) * attn_sd(dim) * 2 +    // q, key tile (BF16)
         static_cast<size_t>(kTk) * dim * 4 +                    // staged fp32 key rows
         static_cast<size_t>(2 * rows * kSx) * 4 + 2 * kTk * 4;  // score exchange, valid flags
}

template <int D>
__global__ void __launch_bounds__(256, 1)
    sink_attention_bf16_kernel(SinkAttentionParams p, int hw, int nsplit, float* part) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int SD = attn_sd(D);
  constexpr int HALF = D / 2;
  constexpr int KS = HALF / 16;  // q.k k-steps per warp
  constexpr int NT = HALF / 8;   // P.V n-tiles per warp
  constexpr int C4 = D / 4;      // 16-byte chunks per key row
  const int rows = 16 * hw;
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* ks = qs + rows * SD;
  float* stage = reinterpret_cast<float*>(ks + kTk * SD);  // [kTk][D]
  float* sx = stage + kTk * D;                             // [2][rows][kSx]
  int* valid = reinterpret_cast<int*>(sx + 2 * rows * kSx);
  int* svalid = valid + kTk;  // flags of the staged tile
  const int nthreads = blockDim.x;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int wh = warp % hw;
  const int half = warp / hw;
  const int r0 = 16 * wh + g;
  const int r1 = r0 + 8;
  const int split = static_cast<int>(blockIdx.x);
  const int64_t heads = p.heads;
  const float c2 = p.scale * kLog2e;
  // Staging: thread -> (key lj of the tile, every tpk-th 16-byte chunk of its row from lc).
  const int tpk = nthreads / kTk;
  const int lj = threadIdx.x / tpk;
  const int lc = threadIdx.x % tpk;
  // KV records: their geometry (8-byte units of a record; nope dims).
  const int rope_dim = static_cast<int>(p.record_rope_dim);
  const int nope = D - rope_dim;
  const int rec_units = static_cast<int>(numeric::kv_record_bytes(D, rope_dim) / 8);
  for (int64_t qi = blockIdx.y; qi < p.nq; qi += gridDim.y) {
    const float* q = p.q + qi * heads * D;
    // q through the key staging buffer, kTk head rows at a time, every thread's copies in flight
    // together: one memory round trip per kTk rows (a load-then-store loop waited one per
    // element, which was most of the kernel's time at prefill and at decode).
    const bool q_aligned = (reinterpret_cast<uintptr_t>(q) & 15u) == 0;  // D % 4 == 0
    for (int h0 = 0; h0 < rows; h0 += kTk) {
      for (int i = threadIdx.x; i < kTk * C4; i += nthreads) {
        const int r = h0 + i / C4;
        const int c = (i % C4) * 4;
        float* dst = stage + (i / C4) * D + c;
        if (r >= heads) {
          *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        } else if (q_aligned) {
          mma::cp_async16(dst, q + r * D + c, 16);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) mma::cp_async4(dst + e, q + r * D + c + e);
        }
      }
      mma::cp_async_commit();
      mma::cp_async_wait<0>();
      __syncthreads();
      for (int i = threadIdx.x; i < kTk * C4; i += nthreads) {
        const int r = h0 + i / C4;
        const int c = (i % C4) * 4;
        if (r < rows) {
          const float4 v = *reinterpret_cast<const float4*>(stage + (i / C4) * D + c);
          *reinterpret_cast<uint2*>(qs + r * SD + c) =
              make_uint2(mma::pack_bf16(v.x, v.y), mma::pack_bf16(v.z, v.w));
        }
      }
      __syncthreads();  // the staging buffer is reused by the next rows or the first key tile
    }
    const auto [kb, ke, t0, t1] = attn::split_range(p, qi, split, nsplit, kTk);
    // This thread's key reference of a tile (loaded one tile ahead of its use).
    auto ref_of = [&](int64_t tile) -> int64_t {
      const int64_t idx = kb + tile * kTk + lj;
      return tile < t1 && idx < ke ? p.key_refs[idx] : kKvRefNone;
    };
    // Starts the copies of one tile's rows into the staging buffer (one commit group). KV
    // records: the record's bytes (8-byte units; 4-byte where a row is not 8-byte aligned).
    auto stage_tile = [&](int64_t ref) {
      const float* kp = kv_ref_ptr(p.pool, p.local, ref);
      float* dst = stage + lj * D;
      if (p.kv_records) {
        if (kp == nullptr) {
          for (int c = lc; c < rec_units; c += tpk) reinterpret_cast<uint2*>(dst)[c] = uint2{};
        } else if ((reinterpret_cast<uintptr_t>(kp) & 7u) == 0) {
          for (int c = lc; c < rec_units; c += tpk) mma::cp_async8(dst + 2 * c, kp + 2 * c);
        } else {
          for (int c = lc; c < rec_units; c += tpk) {
            mma::cp_async4(dst + 2 * c, kp + 2 * c);
            mma::cp_async4(dst + 2 * c + 1, kp + 2 * c + 1);
          }
        }
      } else if (kp == nullptr) {
        for (int c = lc; c < C4; c += tpk)
          *reinterpret_cast<float4*>(dst + 4 * c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      } else if ((reinterpret_cast<uintptr_t>(kp) & 15u) == 0) {
        for (int c = lc; c < C4; c += tpk) mma::cp_async16(dst + 4 * c, kp + 4 * c, 16);
      } else {  // rows need not be 16-byte aligned
        for (int c = lc; c < C4; c += tpk) {
#pragma unroll
          for (int e = 0; e < 4; ++e) mma::cp_async4(dst + 4 * c + e, kp + 4 * c + e);
        }
      }
      if (lc == 0)
        svalid[lj] = kp != nullptr;
      mma::cp_async_commit();
    };
    // Waits for the staged tile and converts it to the BF16 key tile (RNE).
    auto convert_staged = [&]() {
      mma::cp_async_wait<0>();
      __syncthreads();  // every thread's copies landed; the key tile's readers are done
      for (int i = threadIdx.x; i < kTk * C4; i += nthreads) {
        const int j = i / C4;
        const int c = (i % C4) * 4;
        if (p.kv_records) {
          const uint8_t* r = reinterpret_cast<const uint8_t*>(stage + j * D);
          *reinterpret_cast<uint2*>(ks + j * SD + c) =
              rec::kv4_to_bf16(rec::load_kv4(r, nope, rope_dim, c), c >= nope);
          continue;
        }
        const float4 v = *reinterpret_cast<const float4*>(stage + j * D + c);
        *reinterpret_cast<uint2*>(ks + j * SD + c) =
            make_uint2(mma::pack_bf16(v.x, v.y), mma::pack_bf16(v.z, v.w));
      }
      if (threadIdx.x < kTk)
        valid[threadIdx.x] = svalid[threadIdx.x];
      __syncthreads();
    };
    // Row state of rows r0 / r1 in base 2: the sink seeds the reference M = ceil(sink * log2 e)
    // (finite, so masked keys give 2^-inf = 0), and its mass 2^(u_sink - M) is counted once, on
    // split 0 (lane t = 0 of the quad holds it; l is summed over the quad at the end).
    const float us0 = (r0 < heads ? p.sinks[r0] : 0.0f) * kLog2e;
    const float us1 = (r1 < heads ? p.sinks[r1] : 0.0f) * kLog2e;
    float m0 = ceilf(us0);
    float m1 = ceilf(us1);
    float l0 = (split == 0 && t == 0) ? exp2f(us0 - m0) : 0.0f;
    float l1 = (split == 0 && t == 0) ? exp2f(us1 - m1) : 0.0f;
    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    int64_t next_ref = ref_of(t0);
    if (t0 < t1) {
      stage_tile(next_ref);
      next_ref = ref_of(t0 + 1);
      convert_staged();
    }
    for (int64_t tile = t0; tile < t1; ++tile) {
      const bool more = tile + 1 < t1;
      if (more) {  // the next tile's rows travel while this one is multiplied
        stage_tile(next_ref);
        next_ref = ref_of(tile + 2);
      }
      // Partial q.k over this warp's half of the dims.
      float s[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll 4
      for (int kstep = 0; kstep < KS; ++kstep) {
        const int col = half * HALF + kstep * 16;
        uint32_t a[4];
        ldmatrix_x4(a, qs + (16 * wh + (lane & 15)) * SD + col + 8 * (lane >> 4));
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const int key = 16 * np + (lane & 7) + 8 * (lane >> 4);
          uint32_t b[4];
          ldmatrix_x4(b, ks + key * SD + col + 8 * ((lane >> 3) & 1));
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
          mma_bf16(s[2 * np], a, b0);
          mma_bf16(s[2 * np + 1], a, b1);
        }
      }
      float* mine = sx + half * rows * kSx;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(mine + r0 * kSx + c) = make_float2(s[nt][0], s[nt][1]);
        *reinterpret_cast<float2*>(mine + r1 * kSx + c) = make_float2(s[nt][2], s[nt][3]);
      }
      __syncthreads();
      // u = (half 0 + half 1) * scale * log2 e, masked.
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * nt + 2 * t + e;
          const bool ok = valid[c] != 0;
          const float a = sx[r0 * kSx + c] + sx[(rows + r0) * kSx + c];
          const float b = sx[r1 * kSx + c] + sx[(rows + r1) * kSx + c];
          s[nt][e] = ok ? a * c2 : -INFINITY;
          s[nt][2 + e] = ok ? b * c2 : -INFINITY;
        }
      }
      const float2 cf = attn::softmax_step<true>(s, m0, m1, l0, l1);
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        o[i][0] *= cf.x;
        o[i][1] *= cf.x;
        o[i][2] *= cf.y;
        o[i][3] *= cf.y;
      }
      // P.V: the probabilities rounded to BF16 are the A fragments (key groups 2kk, 2kk + 1).
#pragma unroll
      for (int kk = 0; kk < kTk / 16; ++kk) {
        uint32_t pa[4];
        pa[0] = mma::pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = mma::pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = mma::pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = mma::pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        const int key = 16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t v[4];
          ldmatrix_x4_trans(v, ks + key * SD + half * HALF + 16 * np + 8 * (lane >> 4));
          const uint32_t v0[2] = {v[0], v[1]}, v1[2] = {v[2], v[3]};
          mma_bf16(o[2 * np], pa, v0);
          mma_bf16(o[2 * np + 1], pa, v1);
        }
      }
      if (more)
        convert_staged();
    }
    attn::finish_query<D, NT>(p, qi, split, nsplit, part, half, t, r0, r1, m0, m1, l0, l1, o);
    __syncthreads();  // q and the staging buffer are rewritten by the next query
  }
}

constexpr int kMaxSplits = 32;

// Merges the splits of one (query, head) per block, in split order: the split weights
// exp(m_s - max) / denominator once per row, then the weighted accumulators per dim. Each thread
// owns kMergeDims dims of a kMergeThreads * kMergeDims slab and keeps a chunk of splits' values in
// flight: the first chunk is loaded before the weights are formed, the next while the current one
// is summed (a decode step merges 64 heads x 32 splits: one load round trip per value cost 18 us).
// pow2 (BF16 operands): m is an integer base-2 reference, and the split weights are exact
// powers of two.
constexpr int kMergeThreads = 128;
constexpr int kMergeDims = 4;
constexpr int kMergeChunk = 8;
// The finish's inverse RoPE: a per-row table of cosines and negated sines, rope_half <= this.
constexpr int64_t kMergeMaxRopeHalf = 256;

// Finish (finish_out): each head's last 2 * rope_half dims turned back by RoPE at the query's
// position, as rope_kernel's inverse (pair (d, d + 1) on threads x, x ^ 1 of one warp), then every
// value rounded to BF16: what the wo_a GEMV reads in deepseek numerics.
struct MergeFinish {
  bool on = false;
  const int64_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int64_t rope_half = 0;
};

__global__ void __launch_bounds__(kMergeThreads) sink_attention_merge_kernel(const float* part,
                                                                             int64_t nq,
                                                                             int64_t heads,
                                                                             int64_t dim,
                                                                             int nsplit,
                                                                             bool pow2,
                                                                             MergeFinish fin,
                                                                             float* out) {
  pdl_begin();
  __shared__ float wraw[kMaxSplits];
  __shared__ float lw[kMaxSplits];
  __shared__ float2 rope_cs[kMergeMaxRopeHalf];
  const int64_t stride = dim + 2;
  const int64_t plane = nq * heads * stride;  // one split's rows
  constexpr int64_t kSlab = kMergeThreads * kMergeDims;
  for (int64_t row = blockIdx.x; row < nq * heads; row += gridDim.x) {
    const float* prow = part + row * stride;
    float v[kMergeChunk][kMergeDims];
    auto load_chunk = [&](int64_t d0, int s0) {
#pragma unroll
      for (int c = 0; c < kMergeChunk; ++c)
#pragma unroll
        for (int k = 0; k < kMergeDims; ++k) {
          const int64_t d = d0 + threadIdx.x + k * kMergeThreads;
          v[c][k] = s0 + c < nsplit && d < dim ? prow[(s0 + c) * plane + d] : 0.0f;
        }
    };
    load_chunk(0, 0);
    // The row's inverse-RoPE table (rope_cos_sin once per pair instead of an inlined sinf / cosf
    // in both threads of every pair: the same operations, the same bits), published by the
    // barrier below.
    if (fin.on && fin.rope_half > 0) {
      const float pos = static_cast<float>(fin.positions[row / heads]);
      for (int64_t i = threadIdx.x; i < fin.rope_half; i += blockDim.x)
        rope_cs[i] = rope_cos_sin(pos, fin.inv_freq[i], /*inverse=*/true);
    }
    if (threadIdx.x < 32) {
      // Lane s loads split s's (m, l) (all in flight together).
      const int s = threadIdx.x;
      const float m = s < nsplit ? prow[s * plane + dim] : -INFINITY;
      const float l = s < nsplit ? prow[s * plane + dim + 1] : 0.0f;
      const float mx = warp_max(m);
      const float w =
          s < nsplit ? (pow2 ? ldexpf(1.0f, static_cast<int>(m - mx)) : expf(m - mx)) : 0.0f;
      if (s < nsplit) {
        wraw[s] = w;
        lw[s] = l * w;
      }
    }
    __syncthreads();
    float denom = 0.0f;  // in split order, every thread alike
    for (int q = 0; q < nsplit; ++q) denom += lw[q];
    const float inv = 1.0f / denom;
    for (int64_t d0 = 0; d0 < dim; d0 += kSlab) {
      if (d0 > 0)
        load_chunk(d0, 0);
      float acc[kMergeDims] = {};
      for (int s0 = 0; s0 < nsplit; s0 += kMergeChunk) {
        float cur[kMergeChunk][kMergeDims];
#pragma unroll
        for (int c = 0; c < kMergeChunk; ++c)
#pragma unroll
          for (int k = 0; k < kMergeDims; ++k) cur[c][k] = v[c][k];
        if (s0 + kMergeChunk < nsplit)
          load_chunk(d0, s0 + kMergeChunk);
#pragma unroll
        for (int c = 0; c < kMergeChunk; ++c) {
          if (s0 + c < nsplit) {
            const float ws = wraw[s0 + c] * inv;
#pragma unroll
            for (int k = 0; k < kMergeDims; ++k) acc[k] += cur[c][k] * ws;
          }
        }
      }
      if (fin.on) {
        const int64_t c_rope = dim - 2 * fin.rope_half;
#pragma unroll
        for (int k = 0; k < kMergeDims; ++k) {
          const int64_t d = d0 + threadIdx.x + k * kMergeThreads;  // parity of threadIdx.x
          const float other = __shfl_xor_sync(0xffffffffu, acc[k], 1);
          if (fin.rope_half > 0 && d >= c_rope && d < dim) {
            const bool even = (d & 1) == 0;
            float a = even ? acc[k] : other;
            float b = even ? other : acc[k];
            rope_apply(a, b, rope_cs[(d - c_rope) / 2]);
            acc[k] = even ? a : b;
          }
          acc[k] = numeric::round_to_bf16(acc[k]);
        }
      }
#pragma unroll
      for (int k = 0; k < kMergeDims; ++k) {
        const int64_t d = d0 + threadIdx.x + k * kMergeThreads;
        if (d < dim)
          out[row * dim + d] = acc[k];
      }
    }
    __syncthreads();  // wraw / lw are rewritten by the next row
  }
}

template <int D>
Status launch_attention_d(const SinkAttentionParams& p, cudaStream_t stream) {
  static_assert(D / 2 <= kMergeMaxRopeHalf,
                "the merge's RoPE table (finish_out: 2 rope_half <= D)");
  const int hw = static_cast<int>(ceil_div(p.heads, 16));
  const bool bf16 = p.bf16_operands;
  const size_t smem = bf16 ? attn_bf16_smem_bytes(D, 16 * hw) : attn_smem_bytes(D, 16 * hw);
  auto* kernel = bf16 ? sink_attention_bf16_kernel<D> : sink_attention_mma_kernel<D>;
  DSI_RETURN_IF_ERROR(device::check_cuda(
      cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
      "sink_attention_mma smem attribute"));
  int nsplit = static_cast<int>(sink_attention_splits(p.nq));
  if (nsplit > 1 && (p.split_scratch == nullptr ||
                     p.split_scratch_floats < sink_attention_scratch_floats(p.nq, p.heads, D))) {
    nsplit = 1;
  }
  // finish_query stores the partials' column pairs as 8-byte words.
  if (nsplit > 1 && (reinterpret_cast<uintptr_t>(p.split_scratch) & 7u) != 0)
    return invalid_argument("sink_attention: split scratch must be 8-byte aligned");
  bool launched_sm90 = false;
  if constexpr (sink_attention_sm90_available()) {  // discarded (not linked) without CUTLASS
    if (sink_attention_sm90_supports(p)) {
      DSI_RETURN_IF_ERROR(launch_sink_attention_sm90(p, nsplit, p.split_scratch, stream));
      launched_sm90 = true;
    }
  }
  if (!launched_sm90) {
    const dim3 grid(static_cast<unsigned>(nsplit),
                    static_cast<unsigned>(std::min(p.nq, kMaxGridY)));
    launch_pdl(kernel, grid, 64 * hw, smem, stream, p, hw, nsplit, p.split_scratch);
    DSI_RETURN_IF_ERROR(launched("sink_attention_mma launch"));
  }
  if (nsplit > 1) {
    const int64_t rows = p.nq * p.heads;
    launch_pdl(sink_attention_merge_kernel,
               static_cast<unsigned>(std::min<int64_t>(rows, 1 << 20)),
               kMergeThreads,
               0,
               stream,
               p.split_scratch,
               p.nq,
               p.heads,
               D,
               nsplit,
               bf16,
               MergeFinish{p.finish_out, p.positions, p.inv_freq, p.rope_half},
               p.out);
    DSI_RETURN_IF_ERROR(launched("sink_attention_merge launch"));
  }
  return Status();
}

// ---- indexer scores ----------------------------------------------------------------------------

constexpr int kIk = 64;         // keys per tile
constexpr int kIs = kIk + 4;    // row stride (floats) of the dot buffer
constexpr int kIThreads = 128;  // 4 warps: up to 64 heads

__host__ __device__ constexpr size_t indexer_smem_bytes(int dim) {
  return static_cast<size_t>(2 * kIk) * attn_sd(dim) * 2 + static_cast<size_t>(64 * kIs) * 4 +
         64 * 4;
}

// One key tile (kIk keys from `tile`, rows < limit, zeros past it) from the fp32 pool into
// shared memory as BF16 (high halves into kh; with kLo the low halves into kl), kStage loads in
// flight per thread before their stores (one at a time, each tile waited for ~30 round trips).
// Index-key records (key_records, BF16-exact): each unit of 8 dims is one word of codes and its
// 32-block's scale byte, loaded kStage units at a time and decoded into the BF16 tile (exact).
template <int DI, int kThreadsT, int kStageT>
__device__ __forceinline__ void stage_key_records(const IndexerScoreParams& p,
                                                  const int32_t* pages,
                                                  int64_t tile,
                                                  int64_t limit,
                                                  __nv_bfloat16* kh) {
  constexpr int SD = attn_sd(DI);
  constexpr int kUnits = kIk * DI / 8;
  for (int i0 = threadIdx.x; i0 < kUnits; i0 += kStageT * kThreadsT) {
    uint2 raw[kStageT];  // x: 8 codes, y: the scale byte
#pragma unroll
    for (int u = 0; u < kStageT; ++u) {
      const int i = i0 + u * kThreadsT;
      const int j = i / (DI / 8);
      const int64_t w = tile * kIk + j;
      raw[u] = make_uint2(0u, 0u);  // codes 0: zeros
      if (i < kUnits && w < limit) {
        const uint8_t* key = reinterpret_cast<const uint8_t*>(
            p.pool + static_cast<int64_t>(pages[w / p.rows_per_page]) * p.page_floats +
            (w % p.rows_per_page) * p.row_floats);
        raw[u] = rec::load_index_unit(key, DI, (i % (DI / 8)) * 8);
      }
    }
#pragma unroll
    for (int u = 0; u < kStageT; ++u) {
      const int i = i0 + u * kThreadsT;
      if (i < kUnits) {
        const int j = i / (DI / 8);
        const int c = (i % (DI / 8)) * 8;
        *reinterpret_cast<uint4*>(kh + j * SD + c) = rec::index_unit_to_bf16(raw[u]);
      }
    }
  }
}

template <int DI, int kThreadsT, int kStageT, bool kLo>
__device__ __forceinline__ void stage_key_tile(const IndexerScoreParams& p,
                                               const int32_t* pages,
                                               int64_t tile,
                                               int64_t limit,
                                               __nv_bfloat16* kh,
                                               __nv_bfloat16* kl) {
  constexpr int SD = attn_sd(DI);
  constexpr int kPairs = kIk * DI / 2;
  if constexpr (!kLo) {
    if (p.key_records) {  // block-uniform
      stage_key_records<DI, kThreadsT, kStageT>(p, pages, tile, limit, kh);
      return;
    }
  }
  for (int i0 = threadIdx.x; i0 < kPairs; i0 += kStageT * kThreadsT) {
    float2 v[kStageT];
#pragma unroll
    for (int u = 0; u < kStageT; ++u) {
      const int i = i0 + u * kThreadsT;
      const int j = i / (DI / 2);
      const int64_t w = tile * kIk + j;
      v[u] = make_float2(0.0f, 0.0f);
      if (i < kPairs && w < limit) {
        const float* key = p.pool +
                           static_cast<int64_t>(pages[w / p.rows_per_page]) * p.page_floats +
                           (w % p.rows_per_page) * DI;
        v[u] = *reinterpret_cast<const float2*>(key + (i % (DI / 2)) * 2);
      }
    }
#pragma unroll
    for (int u = 0; u < kStageT; ++u) {
      const int i = i0 + u * kThreadsT;
      if (i < kPairs) {
        const int j = i / (DI / 2);
        const int c = (i % (DI / 2)) * 2;
        uint32_t h, l;
        split_bf16(v[u].x, v[u].y, &h, &l);
        *reinterpret_cast<uint32_t*>(kh + j * SD + c) = h;
        if constexpr (kLo)
          *reinterpret_cast<uint32_t*>(kl + j * SD + c) = l;
      }
    }
  }
}

// A warp's 16 heads (fragments ah, al) . the staged tile's 64 keys: s[nt] = keys 8 nt .. + 7 of
// the m16n8 C fragment; kSplit adds the low halves' products (three MMAs per product).
template <int DI, bool kSplit>
__device__ __forceinline__ void tile_dots(const uint32_t (&ah)[DI / 16][4],
                                          const uint32_t (&al)[DI / 16][4],
                                          const __nv_bfloat16* kh,
                                          const __nv_bfloat16* kl,
                                          int lane,
                                          float (&s)[8][4]) {
  constexpr int SD = attn_sd(DI);
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < DI / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      const int key = 16 * np + (lane & 7) + 8 * (lane >> 4);
      const int kc = 16 * ks + 8 * ((lane >> 3) & 1);
      uint32_t bh[4];
      ldmatrix_x4(bh, kh + key * SD + kc);
      const uint32_t bh0[2] = {bh[0], bh[1]}, bh1[2] = {bh[2], bh[3]};
      mma_bf16(s[2 * np], ah[ks], bh0);
      mma_bf16(s[2 * np + 1], ah[ks], bh1);
      if constexpr (kSplit) {
        uint32_t bl[4];
        ldmatrix_x4(bl, kl + key * SD + kc);
        const uint32_t bl0[2] = {bl[0], bl[1]}, bl1[2] = {bl[2], bl[3]};
        mma_bf16(s[2 * np], ah[ks], bl0);
        mma_bf16(s[2 * np], al[ks], bh0);
        mma_bf16(s[2 * np + 1], ah[ks], bl1);
        mma_bf16(s[2 * np + 1], al[ks], bh1);
      }
    }
  }
}

// A warp's tile_dots into the dot buffer (rows = heads, kIs floats apart).
__device__ __forceinline__ void store_dots(
    float* dots, int r0, int r1, int t, const float (&s)[8][4]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int c = 8 * nt + 2 * t;
    *reinterpret_cast<float2*>(dots + r0 * kIs + c) = make_float2(s[nt][0], s[nt][1]);
    *reinterpret_cast<float2*>(dots + r1 * kIs + c) = make_float2(s[nt][2], s[nt][3]);
  }
}

// One key's score: sum over heads, in head order, of hw[h] * relu(dot[h][key]).
__device__ __forceinline__ float head_sum(const float* hw,
                                          const float* dots,
                                          int64_t heads,
                                          int key) {
  float sc = 0.0f;
#pragma unroll 16  // the shared-memory reads ahead of the (ordered) sum
  for (int64_t h = 0; h < heads; ++h)
    sc = __fadd_rn(sc, __fmul_rn(hw[h], fmaxf(0.0f, dots[h * kIs + key])));
  return sc;
}

// q fragments (rows r0, r1 of a warp's 16 heads) of query row q straight from global memory.
template <int DI>
__device__ __forceinline__ void load_q_frags(const float* q,
                                             int64_t heads,
                                             int r0,
                                             int r1,
                                             int t,
                                             uint32_t (&ah)[DI / 16][4],
                                             uint32_t (&al)[DI / 16][4]) {
#pragma unroll
  for (int ks = 0; ks < DI / 16; ++ks) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = (i & 1) ? r1 : r0;
      const int k = 16 * ks + 2 * t + ((i & 2) ? 8 : 0);
      const float2 v =
          r < heads ? *reinterpret_cast<const float2*>(q + r * DI + k) : make_float2(0.0f, 0.0f);
      split_bf16(v.x, v.y, &ah[ks][i], &al[ks][i]);
    }
  }
}

template <int DI, bool kSplit>
__global__ void __launch_bounds__(kIThreads)
    indexer_scores_mma_kernel(IndexerScoreParams p, int tiles_per_block) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int SD = attn_sd(DI);
  constexpr int KS = DI / 16;
  __nv_bfloat16* kh = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* kl = kh + kIk * SD;
  float* dots = reinterpret_cast<float*>(kl + kIk * SD);  // [64 heads][kIs]
  float* hwv = dots + 64 * kIs;                           // [64]
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t heads = p.heads;
  const int r0 = 16 * warp + g;
  const int r1 = r0 + 8;
  for (int64_t qi = blockIdx.y; qi < p.nq; qi += gridDim.y) {
    const int64_t visible = p.visible[qi];
    const int64_t tiles = (visible + kIk - 1) / kIk;
    const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tiles_per_block;
    if (t0 >= tiles)
      continue;  // block-uniform
    const int64_t t1 = min(tiles, t0 + tiles_per_block);
    uint32_t ah[KS][4], al[KS][4];
    load_q_frags<DI>(p.q + qi * heads * DI, heads, r0, r1, t, ah, al);
    for (int64_t h = threadIdx.x; h < heads; h += blockDim.x) {
      hwv[h] = __fmul_rn(p.head_w[qi * heads + h], p.w_scale);
    }
    const int32_t* pages = p.pages + p.page_begin[qi];
    for (int64_t tile = t0; tile < t1; ++tile) {
      __syncthreads();  // the previous tile's dots and keys are consumed
      stage_key_tile<DI, kIThreads, 8, kSplit>(p, pages, tile, visible, kh, kl);
      __syncthreads();
      float s[8][4];
      tile_dots<DI, kSplit>(ah, al, kh, kl, lane, s);
      store_dots(dots, r0, r1, t, s);
      __syncthreads();
      if (threadIdx.x < kIk) {
        const int64_t w = tile * kIk + threadIdx.x;
        if (w < visible)
          p.scores[qi * p.ld + w] = head_sum(hwv, dots, heads, threadIdx.x);
      }
    }
    __syncthreads();  // hwv is rewritten by the next query
  }
}

// Prefill (many queries, BF16-exact operands): kIq consecutive queries per block, each key tile
// loaded and converted once for all of them (the one-query kernel re-read every query's visible
// keys: 8k queries x up to 2,048 keys of 512 bytes each). Warp w: query w / 4 of the group, heads
// 16 (w % 4) .. +15, the same MMAs as the one-query kernel; the head sums in the same order, so
// the scores are the same bits. Queries of the group whose key pages differ (a sequence boundary)
// are taken one at a time.
constexpr int kIq = 4;
constexpr int kIgThreads = kIThreads * kIq;

__host__ __device__ constexpr size_t indexer_group_smem_bytes(int dim) {
  return static_cast<size_t>(kIk) * attn_sd(dim) * 2 + static_cast<size_t>(kIq * 64 * kIs) * 4 +
         kIq * 64 * 4;
}

template <int DI>
__global__ void __launch_bounds__(kIgThreads)
    indexer_scores_group_kernel(IndexerScoreParams p, int tiles_per_block) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int SD = attn_sd(DI);
  constexpr int KS = DI / 16;
  __nv_bfloat16* kh = reinterpret_cast<__nv_bfloat16*>(smem);
  float* dots = reinterpret_cast<float*>(kh + kIk * SD);  // [kIq][64 heads][kIs]
  float* hwv = dots + kIq * 64 * kIs;                     // [kIq][64]
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int qw = warp / 4;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t heads = p.heads;
  const int r0 = 16 * (warp % 4) + g;
  const int r1 = r0 + 8;
  // Queries [q0, q0 + count) sharing their key pages.
  auto group = [&](int64_t q0, int count) {
    int64_t vis_max = 0;
    for (int j = 0; j < count; ++j) vis_max = max(vis_max, p.visible[q0 + j]);
    const int64_t tiles = (vis_max + kIk - 1) / kIk;
    const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tiles_per_block;
    if (t0 >= tiles)
      return;  // block-uniform
    const int64_t t1 = min(tiles, t0 + tiles_per_block);
    // A warp past the group's queries computes its last query again and stores nothing.
    const int64_t qi = q0 + min(qw, count - 1);
    uint32_t ah[KS][4], al[KS][4];
    load_q_frags<DI>(p.q + qi * heads * DI, heads, r0, r1, t, ah, al);
    __syncthreads();  // hwv and dots of the previous group are consumed
    for (int i = threadIdx.x; i < kIq * 64; i += blockDim.x) {
      const int j = i / 64;
      const int64_t h = i % 64;
      if (j < count && h < heads)
        hwv[i] = __fmul_rn(p.head_w[(q0 + j) * heads + h], p.w_scale);
    }
    const int32_t* pages = p.pages + p.page_begin[q0];
    for (int64_t tile = t0; tile < t1; ++tile) {
      __syncthreads();  // the previous tile's dots and keys are consumed
      stage_key_tile<DI, kIgThreads, 4, false>(p, pages, tile, vis_max, kh, nullptr);
      __syncthreads();
      float sc[8][4];
      tile_dots<DI, false>(ah, al, kh, nullptr, lane, sc);
      store_dots(dots + qw * 64 * kIs, r0, r1, t, sc);
      __syncthreads();
      if (threadIdx.x < kIq * kIk) {
        const int j = threadIdx.x / kIk;
        const int key = threadIdx.x % kIk;
        const int64_t w = tile * kIk + key;
        if (j < count && w < p.visible[q0 + j])
          p.scores[(q0 + j) * p.ld + w] = head_sum(hwv + j * 64, dots + j * 64 * kIs, heads, key);
      }
    }
  };
  for (int64_t q0 = static_cast<int64_t>(blockIdx.y) * kIq; q0 < p.nq;
       q0 += static_cast<int64_t>(gridDim.y) * kIq) {
    const int count = static_cast<int>(p.nq - q0 < kIq ? p.nq - q0 : kIq);
    bool same = true;
    for (int j = 1; j < count; ++j) same = same && p.page_begin[q0 + j] == p.page_begin[q0];
    if (same) {
      group(q0, count);
    } else {
      for (int j = 0; j < count; ++j) group(q0 + j, 1);
    }
  }
}

template <int DI>
Status launch_indexer_group(const IndexerScoreParams& p, cudaStream_t stream) {
  const size_t smem = indexer_group_smem_bytes(DI);
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaFuncSetAttribute(indexer_scores_group_kernel<DI>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)),
                         "indexer_scores_group smem attribute"));
  const int tpb = 4;
  const int64_t gx = ceil_div(ceil_div(p.max_visible, kIk), tpb);
  if (gx > 0x7fffffff)
    return invalid_argument("indexer_scores: too many blocks");
  const dim3 grid(static_cast<unsigned>(gx),
                  static_cast<unsigned>(std::min(ceil_div(p.nq, int64_t{kIq}), kMaxGridY)));
  launch_pdl(indexer_scores_group_kernel<DI>, grid, kIgThreads, smem, stream, p, tpb);
  return launched("indexer_scores_group launch");
}

template <int DI, bool kSplit>
Status launch_indexer_di(const IndexerScoreParams& p, cudaStream_t stream) {
  const size_t smem = indexer_smem_bytes(DI);
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaFuncSetAttribute(indexer_scores_mma_kernel<DI, kSplit>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)),
                         "indexer_scores_mma smem attribute"));
  // Few queries (decode): one tile per block for parallelism; many: four, so q is loaded once
  // per four tiles.
  const int tpb = p.nq >= 64 ? 4 : 1;
  const int64_t gx = ceil_div(ceil_div(p.max_visible, kIk), tpb);
  if (gx > 0x7fffffff)
    return invalid_argument("indexer_scores: too many blocks");
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(std::min(p.nq, kMaxGridY)));
  launch_pdl(indexer_scores_mma_kernel<DI, kSplit>, grid, kIThreads, smem, stream, p, tpb);
  return launched("indexer_scores_mma launch");
}

}  // namespace

int64_t sink_attention_splits(int64_t nq) {
  if (nq <= 0)
    return 1;
  // About 128 blocks at small batches, at most 16 splits (each split stages all of q and writes
  // 64 x 512 fp32 partials for the merge); one block per query from 128 queries on. Swept in one
  // device call (twelfth session, decode at 8k context): 264 blocks / 32 splits, 128 / 16 and
  // 64 / 16 gave 1.419 / 1.401 / 1.428 ms at batch 1, 2.462 / 2.416 / 2.412 at 4, 4.277 / 4.141 /
  // 4.148 at 16 and 7.340 / 7.221 / 7.318 at 64.
  return std::clamp<int64_t>(128 / nq, 1, 16);
}

int64_t sink_attention_scratch_floats(int64_t nq, int64_t heads, int64_t dim) {
  const int64_t s = sink_attention_splits(nq);
  return s > 1 ? s * nq * heads * (dim + 2) : 0;
}

bool sink_attention_mma_supports(const SinkAttentionParams& p) {
  return p.tensor_cores && p.heads >= 1 && p.heads <= 64 &&
         (p.dim == 64 || p.dim == 128 || p.dim == 256 || p.dim == 512);
}

Status launch_sink_attention_mma(const SinkAttentionParams& p, cudaStream_t stream) {
  switch (p.dim) {
    case 64:
      return launch_attention_d<64>(p, stream);
    case 128:
      return launch_attention_d<128>(p, stream);
    case 256:
      return launch_attention_d<256>(p, stream);
    case 512:
      return launch_attention_d<512>(p, stream);
    default:
      return invalid_argument("sink_attention_mma: unsupported dim");
  }
}

bool indexer_scores_mma_supports(const IndexerScoreParams& p) {
  return p.tensor_cores && p.heads >= 1 && p.heads <= 64 && (p.dim == 64 || p.dim == 128) &&
         p.page_floats % 2 == 0;
}

Status launch_indexer_scores_mma(const IndexerScoreParams& p, cudaStream_t stream) {
  if (p.dim == 64)
    return p.bf16_exact ? launch_indexer_di<64, false>(p, stream)
                        : launch_indexer_di<64, true>(p, stream);
  if (p.dim == 128) {
    if (p.bf16_exact && p.group_queries && p.nq >= kIndexerGroupMinQueries)
      return launch_indexer_group<128>(p, stream);
    return p.bf16_exact ? launch_indexer_di<128, false>(p, stream)
                        : launch_indexer_di<128, true>(p, stream);
  }
  return invalid_argument("indexer_scores_mma: unsupported dim");
}

}  // namespace dsinfer::cuda
