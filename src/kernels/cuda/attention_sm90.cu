// Sink attention with BF16 operands on wgmma (attention_sm90.h). One block of two warpgroups per
// (query, key split); warpgroup h owns dims [256 h, 256 h + 256) of q.k and of the output, warp w
// of it the heads 16 w .. 16 w + 15 (the m64 rows), as in the mma.sync kernel.
//
// Shared memory holds BF16 only, in the 128-byte-swizzled layout wgmma reads: q as eight
// [64 heads x 64 dims] chunks, each key tile (32 keys) as eight [32 keys x 64 dims] chunks, double
// buffered. A key tile serves as the K-major B of q.k^T and, read transposed (MN-major), as the B
// of P.V. Per tile:
//   1. each warpgroup's partial q.k^T over its 256 dims (16 x m64n32k16, both operands in shared
//      memory), the two partials exchanged through shared memory and summed in a fixed order;
//   2. the online softmax of the mma.sync kernel (integer base-2 maximum, probabilities rounded to
//      BF16 as they become the A registers of P.V, the denominator from the unrounded ones);
//   3. P.V into the warpgroup's 64 x 256 fp32 accumulators (2 x m64n256k16, A from registers).
// The next tile's key rows (fp32, or KV records) are loaded into registers while the tensor cores
// run (its first 256 dims around q.k, the rest around P.V), converted and stored into the other
// buffer: no fp32 staging in shared memory. With BF16 q (q_bf16) one block per SM walks its queries
// and copies the next query's q into the second q buffer while the current one runs.
//
// Measured (H200, 8k-token prefill of 4 V4-Flash layers, ncu): 17.5 ms for the mma.sync kernel
// (of which most was a load-then-store q staging loop), 10.0 ms for this kernel's first version,
// 8.7 ms now (~135 TFLOP/s). Tried and not kept: staging the next tile's second halves by
// cp.async so that a whole tile is in flight (9.2 ms). What bounds it: one block of 8 warps per SM
// running q.k, the exchange, the softmax and P.V one after another. Keys as KV records (kRec,
// deepseek numerics' state) load 584 B per key instead of 2 KiB and are decoded while stored
// (E4M3 pairs through cvt.f16x2, scale, BF16 high halves): 8.95 against 8.46 ms for the 8k prefill
// over fp32 rows (ncu, 4 layers), the decoding's instructions in the warps' issue slots.
// The BF16 output's inverse RoPE from a per-query table of sines and cosines (finish_query)
// instead of inlined sinf/cosf per column pair: 18.5k -> 5.9k SASS instructions, the 8k
// prefill's four launches 10.5 -> 7.7 ms (H100, ncu; sliding layers 1.88 -> 1.18 ms each).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_record.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/pdl.cuh"

namespace dsinfer::cuda {
namespace {

namespace gmma = cute::SM90::GMMA;

constexpr int kD = 512;
constexpr int kHalf = kD / 2;
constexpr int kRows = 64;      // heads, padded
constexpr int kTk = 32;        // keys per tile
constexpr int kThreads = 256;  // two warpgroups
constexpr int kSx = kTk + 8;   // row stride (floats) of the partial-score exchange
constexpr uint32_t kQBytes = kRows * kD * 2;
constexpr uint32_t kKBytes = kTk * kD * 2;
constexpr uint32_t kQChunk = kRows * 128;  // bytes of one q chunk
constexpr uint32_t kKChunk = kTk * 128;    // bytes of one key-tile chunk
constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kMaxGridY = 65535;
static_assert(kThreads >= kHalf, "one pass fills the inverse-RoPE table");

// kQ16 (q given as BF16): two q buffers, the next query's copied in while this one runs.
// Then the inverse-RoPE table of the current query (kD / 2 float2: rope_half <= kD / 2).
constexpr size_t smem_bytes(bool q16) {
  return 1024 /* alignment slack */ + (q16 ? 2 : 1) * kQBytes + 2 * kKBytes +
         static_cast<size_t>(2 * kRows * kSx) * 4 + 2 * kTk * 4 + kHalf * sizeof(float2);
}

// Byte offset of (row, byte b of its 128-byte chunk row) under the 128-byte swizzle: the 16-byte
// unit index is XORed with row % 8 (atoms of 8 rows x 128 bytes, 1024-byte aligned).
__device__ __forceinline__ uint32_t sw128(int row, int b) {
  return static_cast<uint32_t>(row * 128 + ((((b >> 4) ^ (row & 7)) << 4) | (b & 15)));
}

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (K-major: LBO unused, SBO = 8 rows; MN-major: LBO = next 64 MN elements, SBO = next 8 K).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = (saddr & 0x3FFFFu) >> 4;
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
  d |= static_cast<uint64_t>(1) << 62;  // LayoutType::B128
  return d;
}

template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

template <size_t... I>
__device__ __forceinline__ void qk_mma(uint64_t da,
                                       uint64_t db,
                                       float (&d)[16],
                                       std::index_sequence<I...>) {
  gmma::MMA_64x32x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>::fma(
      da, db, d[I]..., gmma::ScaleOut::One);
}

template <size_t... I>
__device__ __forceinline__ void pv_mma(const uint32_t (&a)[4],
                                       uint64_t db,
                                       float (&d)[128],
                                       std::index_sequence<I...>) {
  gmma::MMA_64x256x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>::fma(
      a[0], a[1], a[2], a[3], db, d[I]..., gmma::ScaleOut::One);
}

// Four BF16 values (two packed pairs) at dims d .. d + 3 of row `row` of a swizzled [rows x 512]
// buffer made of chunks of chunk_bytes.
__device__ __forceinline__ void store_bf4(
    uint8_t* base, uint32_t chunk_bytes, int row, int d, uint2 v) {
  *reinterpret_cast<uint2*>(base + (d >> 6) * chunk_bytes + sw128(row, (d & 63) * 2)) = v;
}
// Four fp32 values -> BF16 (RNE), stored as store_bf4.
__device__ __forceinline__ void store4(
    uint8_t* base, uint32_t chunk_bytes, int row, int d, float4 v) {
  store_bf4(
      base, chunk_bytes, row, d, make_uint2(mma::pack_bf16(v.x, v.y), mma::pack_bf16(v.z, v.w)));
}

__device__ __forceinline__ float4 load4(const float* row, int d, bool aligned) {
  if (aligned)
    return *reinterpret_cast<const float4*>(row + d);
  return make_float4(row[d], row[d + 1], row[d + 2], row[d + 3]);
}

// Starts the copies of query qi's BF16 q (rows >= heads zero-filled) into a swizzled q buffer.
__device__ __forceinline__ void copy_q16(const SinkAttentionParams& p, int64_t qi, uint8_t* sq) {
  const uint16_t* q = p.q_bf16 + qi * p.heads * kD;
  for (int i = threadIdx.x; i < kRows * kD / 8; i += kThreads) {
    const int r = i / (kD / 8);
    const int d = (i % (kD / 8)) * 8;
    const bool in = r < p.heads;
    mma::cp_async16(
        sq + (d >> 6) * kQChunk + sw128(r, (d & 63) * 2), in ? q + r * kD + d : q, in ? 16 : 0);
  }
  mma::cp_async_commit();
}

// kRec: keys are KV records (numeric/records.h), loaded raw (kv_record.cuh: 4 + 1 or 8 bytes per
// four dims instead of 16) and decoded to BF16 when stored into the tile.
template <bool kQ16, bool kRec>
__global__ void __launch_bounds__(kThreads, 1)
    sink_attention_sm90_kernel(SinkAttentionParams p, int nsplit, float* part) {
  pdl_begin();
  using Raw = std::conditional_t<kRec, uint2, float4>;  // four dims of a key as loaded
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte alignment for the swizzle atoms.
  const uint32_t raw = mma::smem_u32(smem_raw);
  uint8_t* smem = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  // (Buffers are picked by arithmetic, never through an indexed array: that would live in local
  // memory.)
  constexpr uint32_t kQAll = (kQ16 ? 2 : 1) * kQBytes;  // q buffers b at smem + b * kQBytes
  uint8_t* sk0 = smem + kQAll;                          // key tile buffers b at sk0 + b * kKBytes
  float* sx = reinterpret_cast<float*>(smem + kQAll + 2 * kKBytes);  // [2][kRows][kSx]
  int* valid = reinterpret_cast<int*>(sx + 2 * kRows * kSx);         // [2][kTk]
  float2* rope_cs = reinterpret_cast<float2*>(valid + 2 * kTk);      // [kHalf]
  const uint32_t sk0_addr = mma::smem_u32(sk0);

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int half = warp >> 2;  // the warpgroup
  const int wh = warp & 3;     // its warp: heads 16 wh ..
  const int r0 = 16 * wh + g;
  const int r1 = r0 + 8;
  const int split = static_cast<int>(blockIdx.x);
  const int64_t heads = p.heads;
  const float c2 = p.scale * kLog2e;
  // Key loading: thread -> keys kr and kr + 16 of the tile, float4 l16 of each 64-dim chunk (a
  // half-warp stores one whole 128-byte swizzled chunk row: no bank conflicts).
  const int kr = threadIdx.x >> 4;
  const int l16 = threadIdx.x & 15;
  const int rope_dim = kRec ? static_cast<int>(p.record_rope_dim) : 0;
  const int nope = kD - rope_dim;

  if (kQ16 && blockIdx.y < p.nq)
    copy_q16(p, blockIdx.y, smem);  // the first query's q into buffer 0
  // The block's queries as one stream of key tiles: the last tile of a query loads the next
  // query's first tile (into the other key buffer, `first_buf` of that query), so that no query
  // starts by waiting for its keys.
  int first_buf = 0;
  bool first_stored = false;
  attn::SplitRange cur{};
  if (blockIdx.y < p.nq)
    cur = attn::split_range(p, blockIdx.y, split, nsplit, kTk);
  int it = 0;
  for (int64_t qi = blockIdx.y; qi < p.nq; qi += gridDim.y, ++it) {
    uint8_t* sq = smem + (kQ16 ? (it & 1) * kQBytes : 0);
    const uint32_t sq_addr = mma::smem_u32(sq);
    if constexpr (kQ16) {
      // This query's q landed (copied during the previous query); the next one's copy starts
      // into the other buffer, whose last readers finished before the previous query ended.
      mma::cp_async_wait<0>();
      if (qi + gridDim.y < p.nq)
        copy_q16(p, qi + gridDim.y, smem + ((it + 1) & 1) * kQBytes);
    }
    // This query's inverse-RoPE table for finish_query's BF16 output (its previous readers
    // passed the barrier after the previous query; the first barrier below publishes it).
    if (p.out_bf16 != nullptr && nsplit == 1 && threadIdx.x < p.rope_half) {
      rope_cs[threadIdx.x] = rope_cos_sin(static_cast<float>(p.positions[qi]),
                                          p.inv_freq[threadIdx.x],
                                          /*inverse=*/true);
    }
    // fp32 q: 64 rows x 128 float4, 8 loads in flight per thread per round, rows >= heads zero.
    const float* q = kQ16 ? nullptr : p.q + qi * heads * kD;
    const bool q_aligned = (reinterpret_cast<uintptr_t>(q) & 15u) == 0;
#pragma unroll 1
    for (int i0 = 0; i0 < (kQ16 ? 0 : kRows * kD / 4); i0 += 8 * kThreads) {
      float4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = i0 + u * kThreads + threadIdx.x;
        const int r = i >> 7;
        v[u] = r < heads ? load4(q + r * kD, (i & 127) * 4, q_aligned)
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = i0 + u * kThreads + threadIdx.x;
        store4(sq, kQChunk, i >> 7, (i & 127) * 4, v[u]);
      }
    }
    const int64_t t0 = cur.t0;
    const int64_t t1 = cur.t1;
    const int64_t qn = qi + gridDim.y;  // the block's next query
    attn::SplitRange nxt{};
    if (qn < p.nq)
      nxt = attn::split_range(p, qn, split, nsplit, kTk);
    const bool next_tiles = qn < p.nq && nxt.t0 < nxt.t1;
    auto ref_in = [&](const attn::SplitRange& r, int64_t tile, int slot) -> int64_t {
      const int64_t idx = r.kb + tile * kTk + kr + 16 * slot;
      return tile < r.t1 && idx < r.ke ? p.key_refs[idx] : kKvRefNone;
    };
    // Tile `tile` of this query, or past its last one the next query's first.
    auto ref_of = [&](int64_t tile, int slot) -> int64_t {
      if (tile < t1)
        return ref_in(cur, tile, slot);
      return tile == t1 && next_tiles ? ref_in(nxt, nxt.t0, slot) : kKvRefNone;
    };
    // One half (dims [256 part, 256 part + 256)) of this thread's two key rows: load, then store.
    auto load_half = [&](const float* kp0, const float* kp1, int part_, Raw(&v)[8]) {
#pragma unroll
      for (int slot = 0; slot < 2; ++slot) {
        const float* kp = slot == 0 ? kp0 : kp1;
        const bool aligned = (reinterpret_cast<uintptr_t>(kp) & 15u) == 0;
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          const int d = kHalf * part_ + 64 * cc + 4 * l16;
          if constexpr (kRec) {
            v[4 * slot + cc] =
                kp != nullptr
                    ? rec::load_kv4(reinterpret_cast<const uint8_t*>(kp), nope, rope_dim, d)
                    : make_uint2(0u, 0u);
          } else {
            v[4 * slot + cc] =
                kp != nullptr ? load4(kp, d, aligned) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
        }
      }
    };
    auto store_half = [&](int buf, int part_, const Raw(&v)[8]) {
      uint8_t* dst = sk0 + buf * kKBytes;
#pragma unroll
      for (int slot = 0; slot < 2; ++slot) {
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          const int d = kHalf * part_ + 64 * cc + 4 * l16;
          if constexpr (kRec) {
            // (A null key's zero codes decode to zeros; its logits are masked anyway.)
            store_bf4(dst,
                      kKChunk,
                      kr + 16 * slot,
                      d,
                      rec::kv4_to_bf16(v[4 * slot + cc], kHalf * part_ + 64 * cc >= nope));
          } else {
            store4(dst, kKChunk, kr + 16 * slot, d, v[4 * slot + cc]);
          }
        }
      }
    };
    // Row state in base 2, seeded by the sink (as the mma.sync BF16 kernel).
    const float us0 = (r0 < heads ? p.sinks[r0] : 0.0f) * kLog2e;
    const float us1 = (r1 < heads ? p.sinks[r1] : 0.0f) * kLog2e;
    float m0 = ceilf(us0);
    float m1 = ceilf(us1);
    float l0 = (split == 0 && t == 0) ? exp2f(us0 - m0) : 0.0f;
    float l1 = (split == 0 && t == 0) ? exp2f(us1 - m1) : 0.0f;
    int64_t next_ref0 = kKvRefNone;
    int64_t next_ref1 = kKvRefNone;
    if (t0 < t1) {
      if (!first_stored) {  // (the block's first query, or after a query without key tiles)
        first_buf = 0;
        const float* kp0 = kv_ref_ptr(p.pool, p.local, ref_of(t0, 0));
        const float* kp1 = kv_ref_ptr(p.pool, p.local, ref_of(t0, 1));
        Raw va[8], vb[8];  // both halves in flight together (o is not live yet)
        load_half(kp0, kp1, 0, va);
        load_half(kp0, kp1, 1, vb);
        store_half(0, 0, va);
        store_half(0, 1, vb);
        if (l16 == 0) {
          valid[kr] = kp0 != nullptr;
          valid[kr + 16] = kp1 != nullptr;
        }
      }
      next_ref0 = ref_of(t0 + 1, 0);
      next_ref1 = ref_of(t0 + 1, 1);
    }
    first_stored = false;
    fence_async_smem();
    __syncthreads();  // q and the first tile stored, visible to the tensor cores
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    for (int64_t tile = t0; tile < t1; ++tile) {
      const int buf = static_cast<int>((tile - t0 + first_buf) & 1);
      // The tile loaded during this one: this query's next, or the next query's first.
      const bool more = tile + 1 < t1 || next_tiles;
      const uint32_t sk_addr = sk0_addr + buf * kKBytes;
      const float* kn0 = more ? kv_ref_ptr(p.pool, p.local, next_ref0) : nullptr;
      const float* kn1 = more ? kv_ref_ptr(p.pool, p.local, next_ref1) : nullptr;
      if (tile + 1 < t1) {
        next_ref0 = ref_of(tile + 2, 0);
        next_ref1 = ref_of(tile + 2, 1);
      } else if (more) {  // this query's last tile: the next query's first goes to buf ^ 1
        first_stored = true;
        first_buf = buf ^ 1;
      }
      // The next tile's keys in flight through this whole tile: KV records (kRec, 8 bytes per
      // four dims) both halves at once, stored after P.V; fp32 rows (16 bytes per four dims) one
      // half around q.k and the other around P.V (registers: o is live).
      Raw v[8];
      Raw v2[kRec ? 8 : 1];
      if (more) {
        load_half(kn0, kn1, 0, v);
        if constexpr (kRec)
          load_half(kn0, kn1, 1, v2);
      }
      // 1. Partial q.k^T over this warpgroup's dims.
      float s[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = 0.0f;
      // Descriptors of this warpgroup's first k-step; k-step ks adds its byte offset / 16 to the
      // start-address field (shared addresses < 2^18: no carry out of the field).
      const uint64_t qd0 = sw128_desc(sq_addr + 4 * half * kQChunk, 16, 1024);
      const uint64_t kd0 = sw128_desc(sk_addr + 4 * half * kKChunk, 16, 1024);
      fence_regs(s);
      cute::warpgroup_arrive();
#pragma unroll
      for (int ks = 0; ks < kHalf / 16; ++ks) {
        const uint32_t col = (ks % 4) * 32;
        qk_mma(qd0 + (((ks / 4) * kQChunk + col) >> 4),
               kd0 + (((ks / 4) * kKChunk + col) >> 4),
               s,
               std::make_index_sequence<16>{});
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      fence_regs(s);
      if (more && !kRec) {
        store_half(buf ^ 1, 0, v);
        load_half(kn0, kn1, 1, v);
      }
      if (more && l16 == 0) {
        valid[(buf ^ 1) * kTk + kr] = kn0 != nullptr;
        valid[(buf ^ 1) * kTk + kr + 16] = kn1 != nullptr;
      }
      float* mine = sx + half * kRows * kSx;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(mine + r0 * kSx + c) = make_float2(s[4 * nt], s[4 * nt + 1]);
        *reinterpret_cast<float2*>(mine + r1 * kSx + c) = make_float2(s[4 * nt + 2], s[4 * nt + 3]);
      }
      __syncthreads();
      // 2. u = (half 0 + half 1) * scale * log2 e, masked; the online softmax.
      const float* other = sx + (half ^ 1) * kRows * kSx;
      const int* vt = valid + buf * kTk;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = 8 * nt + 2 * t;
        const float2 oa = *reinterpret_cast<const float2*>(other + r0 * kSx + c);
        const float2 ob = *reinterpret_cast<const float2*>(other + r1 * kSx + c);
        const int2 ok = *reinterpret_cast<const int2*>(vt + c);
        // fp32 addition commutes: the same sum as half 0 + half 1 in either warpgroup.
        s[4 * nt] = ok.x != 0 ? (s[4 * nt] + oa.x) * c2 : -INFINITY;
        s[4 * nt + 1] = ok.y != 0 ? (s[4 * nt + 1] + oa.y) * c2 : -INFINITY;
        s[4 * nt + 2] = ok.x != 0 ? (s[4 * nt + 2] + ob.x) * c2 : -INFINITY;
        s[4 * nt + 3] = ok.y != 0 ? (s[4 * nt + 3] + ob.y) * c2 : -INFINITY;
      }
      const float2 cf =
          attn::softmax_step<true>(reinterpret_cast<float(&)[4][4]>(s), m0, m1, l0, l1);
      // Rescaling by exact powers of two, skipped (warp-uniformly) where no row's maximum moved
      // (after the first tiles of a long list that is most tiles) and on the query's first tile
      // (o is zero: a window of 128 keys is four tiles).
      if (tile != t0 && __any_sync(0xffffffffu, cf.x != 1.0f || cf.y != 1.0f)) {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          o[4 * i] *= cf.x;
          o[4 * i + 1] *= cf.x;
          o[4 * i + 2] *= cf.y;
          o[4 * i + 3] *= cf.y;
        }
      }
      // 3. P.V: the probabilities rounded to BF16 are the A registers (keys 16 kk .. 16 kk + 15).
      uint32_t pa[2][4];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        pa[kk][0] = mma::pack_bf16(s[8 * kk], s[8 * kk + 1]);
        pa[kk][1] = mma::pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = mma::pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = mma::pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
      }
      // V = the key tile read MN-major: dims 256 half .. (chunks 4 half ..; LBO = one chunk),
      // keys 16 kk .. (SBO = 8 keys).
      const uint64_t vd0 = sw128_desc(sk_addr + 4 * half * kKChunk, kKChunk, 1024);
      fence_regs(o);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        pv_mma(pa[kk], vd0 + ((kk * 16 * 128) >> 4), o, std::make_index_sequence<128>{});
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      fence_regs(o);
      if (more) {
        if constexpr (kRec) {
          store_half(buf ^ 1, 0, v);
          store_half(buf ^ 1, 1, v2);
        } else {
          store_half(buf ^ 1, 1, v);
        }
      }
      fence_async_smem();
      __syncthreads();  // the next tile stored; this tile's and the exchange's readers done
    }
    attn::finish_query<kD, 32, true>(p,
                                     qi,
                                     split,
                                     nsplit,
                                     part,
                                     half,
                                     t,
                                     r0,
                                     r1,
                                     m0,
                                     m1,
                                     l0,
                                     l1,
                                     reinterpret_cast<const float(&)[32][4]>(o),
                                     rope_cs);
    __syncthreads();  // q is rewritten by the next query
    cur = nxt;
  }
}

}  // namespace

bool sink_attention_sm90_supports(const SinkAttentionParams& p) {
  return p.tensor_cores && p.bf16_operands && p.dim == kD && p.heads >= 1 && p.heads <= kRows;
}

namespace {

template <bool kQ16, bool kRec>
Status launch_kernel(const SinkAttentionParams& p, int nsplit, float* part, cudaStream_t stream) {
  const int smem = static_cast<int>(smem_bytes(kQ16));
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaFuncSetAttribute(sink_attention_sm90_kernel<kQ16, kRec>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              smem),
                         "sink_attention_sm90 smem attribute"));
  // With BF16 q one block per SM walks its queries in turn (each q copied in during the
  // previous one); otherwise one block per query.
  const int64_t gy = kQ16 ? std::max<int64_t>(1, sm_count() / nsplit) : kMaxGridY;
  const dim3 grid(static_cast<unsigned>(nsplit), static_cast<unsigned>(std::min(p.nq, gy)));
  launch_pdl(sink_attention_sm90_kernel<kQ16, kRec>, grid, kThreads, smem, stream, p, nsplit, part);
  return launched("sink_attention_sm90 launch");
}

}  // namespace

Status launch_sink_attention_sm90(const SinkAttentionParams& p,
                                  int nsplit,
                                  float* part,
                                  cudaStream_t stream) {
  if (!sink_attention_sm90_supports(p))
    return invalid_argument("sink_attention_sm90: unsupported shape or numerics");
  if (nsplit < 1 || nsplit > 32 || (nsplit > 1 && part == nullptr))
    return invalid_argument("sink_attention_sm90: bad split count or no scratch");
  if (p.nq == 0)
    return Status();
  if (p.q_bf16 != nullptr) {
    if ((reinterpret_cast<uintptr_t>(p.q_bf16) & 15u) != 0)
      return invalid_argument("sink_attention_sm90: q_bf16 must be 16-byte aligned");
    return p.kv_records ? launch_kernel<true, true>(p, nsplit, part, stream)
                        : launch_kernel<true, false>(p, nsplit, part, stream);
  }
  return p.kv_records ? launch_kernel<false, true>(p, nsplit, part, stream)
                      : launch_kernel<false, false>(p, nsplit, part, stream);
}

}  // namespace dsinfer::cuda
