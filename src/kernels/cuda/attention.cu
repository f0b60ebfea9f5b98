// Attention-side kernels (attention.h): sink attention, compressor append/pool, indexer scores,
// top-k. Correct-first implementations; the fast paths (FlashMLA-style tiles over FP8 records,
// a fused indexer) are a later issue and keep these contracts.
#include <algorithm>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_record.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int64_t kMaxGrid = 65535;

// ---- sink attention ----------------------------------------------------------------------------
// One block per (head, query); each warp runs an online softmax over a strided share of the keys
// (lane l holds dims l, l+32, ...), then the warps' partial states are merged with the sink.
// kBf16 (bf16_operands): q rounded to BF16, the running reference is an integer in base 2 (so
// every rescaling is an exact power of two) and each probability is rounded to BF16 before it
// weighs its key, as cpu::attention_with_sink_bf16.

constexpr int kAttnWarps = 4;
constexpr int kAttnPer = kMaxAttnDim / 32;
constexpr float kLog2e = 1.4426950408889634f;

template <bool kBf16>
__global__ void __launch_bounds__(kAttnWarps * 32) sink_attention_kernel(SinkAttentionParams p) {
  __shared__ float sm_acc[kAttnWarps][kMaxAttnDim];
  __shared__ float sm_m[kAttnWarps];
  __shared__ float sm_l[kAttnWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t h = blockIdx.x;
  const int64_t dim = p.dim;
  const float c2 = p.scale * kLog2e;
  for (int64_t qi = blockIdx.y; qi < p.nq; qi += gridDim.y) {
    const float* q = p.q + (qi * p.heads + h) * dim;
    float qv[kAttnPer];
    float acc[kAttnPer];
#pragma unroll
    for (int i = 0; i < kAttnPer; ++i) {
      const int64_t d = lane + 32 * i;
      qv[i] = d < dim ? q[d] : 0.0f;
      if constexpr (kBf16)
        qv[i] = numeric::round_to_bf16(qv[i]);
      acc[i] = 0.0f;
    }
    float m = -INFINITY;
    float l = 0.0f;
    const int64_t kb = p.key_begin[qi];
    const int64_t ke = p.key_begin[qi + 1];
    for (int64_t j = kb + warp; j < ke; j += kAttnWarps) {
      const float* k = kv_ref_ptr(p.pool, p.local, p.key_refs[j]);
      if (k == nullptr)
        continue;  // warp-uniform
      float kv[kAttnPer];
      float part = 0.0f;
      const uint8_t* kr = reinterpret_cast<const uint8_t*>(k);
#pragma unroll
      for (int i = 0; i < kAttnPer; ++i) {
        const int64_t d = lane + 32 * i;
        kv[i] = d >= dim       ? 0.0f
                : p.kv_records ? numeric::kv_record_get(kr, dim, p.record_rope_dim, d)
                               : k[d];
        part += qv[i] * kv[i];
      }
      if constexpr (kBf16) {
        const float u = warp_sum(part) * c2;
        const float m_new = fmaxf(m, ceilf(u));
        if (m_new == -INFINITY)
          continue;
        const float corr = m == -INFINITY ? 0.0f : ldexpf(1.0f, static_cast<int>(m - m_new));
        const float e = exp2f(u - m_new);
        l = l * corr + e;
        const float pb = numeric::round_to_bf16(e);
#pragma unroll
        for (int i = 0; i < kAttnPer; ++i) acc[i] = acc[i] * corr + pb * kv[i];
        m = m_new;
      } else {
        const float logit = warp_sum(part) * p.scale;
        const float m_new = fmaxf(m, logit);
        if (m_new == -INFINITY)
          continue;  // a -inf logit contributes nothing
        const float corr = expf(m - m_new);
        const float e = expf(logit - m_new);
        l = l * corr + e;
#pragma unroll
        for (int i = 0; i < kAttnPer; ++i) acc[i] = acc[i] * corr + e * kv[i];
        m = m_new;
      }
    }
#pragma unroll
    for (int i = 0; i < kAttnPer; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < dim)
        sm_acc[warp][d] = acc[i];
    }
    if (lane == 0) {
      sm_m[warp] = m;
      sm_l[warp] = l;
    }
    __syncthreads();
    const float sink = p.sinks[h];
    float f[kAttnWarps];
    float denom;
    if constexpr (kBf16) {
      const float us = sink * kLog2e;
      float mx = ceilf(us);
      for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, sm_m[w]);
      denom = exp2f(us - mx);
      for (int w = 0; w < kAttnWarps; ++w) {
        f[w] = sm_m[w] == -INFINITY ? 0.0f : ldexpf(1.0f, static_cast<int>(sm_m[w] - mx));
        denom += sm_l[w] * f[w];
      }
    } else {
      float mx = sink;
      for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, sm_m[w]);
      denom = expf(sink - mx);
      for (int w = 0; w < kAttnWarps; ++w) {
        f[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - mx);
        denom += sm_l[w] * f[w];
      }
    }
    const float inv = 1.0f / denom;
    float* o = p.out + (qi * p.heads + h) * dim;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      float v = 0.0f;
      for (int w = 0; w < kAttnWarps; ++w) v += sm_acc[w][d] * f[w];
      o[d] = v * inv;
    }
    __syncthreads();
  }
}

// ---- compressor ---------------------------------------------------------------------------------

__global__ void compressor_append_kernel(CompressorAppendParams p) {
  pdl_begin();
  const int64_t row = 2 * p.width;
  const int64_t total = p.n * row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / row;
    const int64_t c = i % row;
    float* dst = kv_ref_mut(p.pool, p.local, p.dest_refs[t]);
    if (dst == nullptr)
      continue;
    if (c < p.width) {
      dst[c] = p.kv[t * p.width + c];
    } else {
      const int64_t cc = c - p.width;
      const float* ape = p.ape + (p.positions[t] % p.ratio) * p.width;
      dst[c] = __fadd_rn(p.score[t * p.width + cc], ape[cc]);
    }
  }
}

// Threads of a pooling block: one per channel (up to kMaxAttnDim), so that each thread's serial
// softmax over the candidates covers one channel (a decode step pools one entry per layer on one
// block: with 256 threads for 512 channels, 25 us at HCA's 128 candidates).
constexpr int kPoolThreads = kMaxAttnDim;
constexpr int kMaxPoolCandidates = 256;  // (overlap ? 2 : 1) * ratio, ratio <= 128
// Candidates whose loads a thread issues together: each pass over the candidates waits for
// memory once per chunk, not once per candidate (a decode step's entry is a single block, so
// its latency is the step's: 15-22 us with one load in flight at the bundled model's 8 and 16
// candidates).
constexpr int kPoolChunk = 8;

// One block per entry; one thread per channel runs the CPU's softmax (float exp, double sum,
// float reciprocal) and weighted sum (serial fp32) over the candidates, in their order.
__global__ void __launch_bounds__(kPoolThreads) compressor_pool_kernel(CompressorPoolParams p) {
  pdl_begin();
  __shared__ float e[kMaxAttnDim];
  __shared__ double scratch[32];
  __shared__ const float* cand_rows[kMaxPoolCandidates];  // null: no such candidate
  const int64_t m = p.ratio;
  const int64_t d = p.d;
  const int64_t width = (p.overlap ? 2 : 1) * d;  // row = [kv (width) | score (width)]
  const int nc = static_cast<int>((p.overlap ? 2 : 1) * m);
  for (int64_t en = blockIdx.x; en < p.n_entries; en += gridDim.x) {
    if (p.block[en] < 0)
      continue;  // an unused slot of a fixed-size (graph-captured) launch (block-uniform)
    const int64_t* refs = p.token_refs + en * nc;
    for (int i = threadIdx.x; i < nc; i += blockDim.x)
      cand_rows[i] = kv_ref_ptr(p.pool, p.local, refs[i]);
    __syncthreads();
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      // Candidate i reads channel c (previous block, overlap) or d + c (own block); each pass
      // loads a chunk of candidates' values before it uses the first.
      auto chunk = [&](int i0, bool value, float(&out)[kPoolChunk], bool(&ok)[kPoolChunk]) {
#pragma unroll
        for (int u = 0; u < kPoolChunk; ++u) {
          const int i = i0 + u;
          const float* r = i < nc ? cand_rows[i] : nullptr;
          ok[u] = r != nullptr;
          const int64_t ch = (p.overlap && i >= m) ? d + c : c;
          out[u] = ok[u] ? r[(value ? 0 : width) + ch] : 0.0f;
        }
      };
      float sv[kPoolChunk];
      float vv[kPoolChunk];
      bool ok[kPoolChunk];
      float mx = -INFINITY;
      bool any = false;
      for (int i0 = 0; i0 < nc; i0 += kPoolChunk) {
        chunk(i0, false, sv, ok);
#pragma unroll
        for (int u = 0; u < kPoolChunk; ++u) {
          if (ok[u]) {
            mx = any ? fmaxf(mx, sv[u]) : sv[u];
            any = true;
          }
        }
      }
      double sum = 0.0;
      for (int i0 = 0; i0 < nc; i0 += kPoolChunk) {
        chunk(i0, false, sv, ok);
#pragma unroll
        for (int u = 0; u < kPoolChunk; ++u) {
          if (ok[u])
            sum += expf(__fsub_rn(sv[u], mx));
        }
      }
      const float inv = static_cast<float>(1.0 / sum);
      float acc = 0.0f;
      for (int i0 = 0; i0 < nc; i0 += kPoolChunk) {
        chunk(i0, false, sv, ok);
        chunk(i0, true, vv, ok);
#pragma unroll
        for (int u = 0; u < kPoolChunk; ++u) {
          if (ok[u]) {
            const float w = __fmul_rn(expf(__fsub_rn(sv[u], mx)), inv);
            acc = __fadd_rn(acc, __fmul_rn(w, vv[u]));
          }
        }
      }
      e[c] = any ? acc : 0.0f;
    }
    __syncthreads();
    // RMSNorm (cpu::rms_norm).
    double ss = 0.0;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) ss += static_cast<double>(e[c]) * e[c];
    ss = block_sum(ss, scratch);
    const float rinv = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(d)) + p.eps);
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      e[c] = __fmul_rn(p.norm_weight[c], __fmul_rn(e[c], rinv));
    }
    __syncthreads();
    // RoPE at the block's first position (cpu::rope_apply).
    const float pos = static_cast<float>(p.block[en] * m);
    float* r = e + (d - 2 * p.rope_half);
    for (int64_t i = threadIdx.x; i < p.rope_half; i += blockDim.x)
      rope_rotate(r[2 * i], r[2 * i + 1], pos, p.inv_freq[i]);
    __syncthreads();
    if (p.post == CompressorPost::kKvFp8) {
      quant_row_block(e, d - 2 * p.rope_half, 64, QuantSim::kFp8);
      quant_row_block(e + d - 2 * p.rope_half, 2 * p.rope_half, 64, QuantSim::kBf16);
    } else if (p.post == CompressorPost::kIndexFp4) {
      hadamard_block(e, d);
      quant_row_block(e, d, 32, QuantSim::kFp4);
    }
    float* out = p.out + (p.out_offsets ? p.out_offsets[en] : en * d);
    if (p.records && p.post == CompressorPost::kKvFp8) {
      __syncthreads();  // e complete
      rec::pack_kv_row(e, d, 2 * p.rope_half, reinterpret_cast<uint8_t*>(out));
    } else if (p.records) {
      __syncthreads();
      rec::pack_index_key_row(
          e, d, reinterpret_cast<uint8_t*>(out), 4 * numeric::index_key_record_floats(d));
    } else {
      for (int64_t c = threadIdx.x; c < d; c += blockDim.x) out[c] = e[c];
    }
    __syncthreads();  // e and cand_rows are rewritten for the next entry
  }
}

// ---- indexer scores ----------------------------------------------------------------------------

constexpr int kScoreThreads = 128;

// One thread per (query, block): the CPU's serial loops with explicit round-to-nearest ops, so
// the scores are bit-identical and the top-k selection can be compared exactly.
__global__ void __launch_bounds__(kScoreThreads) indexer_scores_kernel(IndexerScoreParams p) {
  pdl_begin();
  extern __shared__ float sh[];
  float* qs = sh;                    // [heads * dim]
  float* hw = sh + p.heads * p.dim;  // [heads]
  const int64_t hd = p.heads * p.dim;
  for (int64_t qi = blockIdx.y; qi < p.nq; qi += gridDim.y) {
    const int64_t visible = p.visible[qi];
    if (static_cast<int64_t>(blockIdx.x) * kScoreThreads >= visible)
      continue;  // block-uniform
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = p.q[qi * hd + i];
    for (int64_t h = threadIdx.x; h < p.heads; h += blockDim.x) {
      hw[h] = __fmul_rn(p.head_w[qi * p.heads + h], p.w_scale);
    }
    __syncthreads();
    const int64_t w = static_cast<int64_t>(blockIdx.x) * kScoreThreads + threadIdx.x;
    if (w < visible) {
      const int32_t* pages = p.pages + p.page_begin[qi];
      const int64_t row = p.row_floats > 0 ? p.row_floats : p.dim;
      const float* key = p.pool + static_cast<int64_t>(pages[w / p.rows_per_page]) * p.page_floats +
                         (w % p.rows_per_page) * row;
      const uint8_t* kr = reinterpret_cast<const uint8_t*>(key);
      float s = 0.0f;
      for (int64_t h = 0; h < p.heads; ++h) {
        const float* v = qs + h * p.dim;
        float dot = 0.0f;
        for (int64_t i = 0; i < p.dim; ++i) {
          const float kv = p.key_records ? numeric::index_key_record_get(kr, p.dim, i) : key[i];
          dot = __fadd_rn(dot, __fmul_rn(v[i], kv));
        }
        s = __fadd_rn(s, __fmul_rn(hw[h], fmaxf(0.0f, dot)));
      }
      p.scores[qi * p.ld + w] = s;
    }
    __syncthreads();
  }
}

// ---- top-k -------------------------------------------------------------------------------------
// One block per query: a 4-pass MSB-first radix select finds the k-th largest score (as an
// order-preserving uint32) and how many of its ties to keep; the selected (score, index) pairs
// are then sorted in shared memory by a bitonic sort on 64-bit keys (score desc, index asc).

// Threads per query: 1024 for few queries (decode: each query's passes are the step's latency),
// 256 from kTopKManyPerSm queries per SM on (prefill: a 512-of-2048 select keeps 256 threads busy
// in every bitonic stage, where 1024 left three quarters idle at each of its ~55 barriers, and
// more blocks per SM overlap one query's barriers with another's loads). The result does not
// depend on the block size (the tie rule is by index).
constexpr int kTopKThreads = 1024;
constexpr int kTopKThreadsMany = 256;
constexpr int64_t kTopKManyPerSm = 4;

// Order-preserving map float -> uint32 (larger float, larger key); -0 and +0 map together.
__device__ __forceinline__ uint32_t ordered_key(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) == 0)
    u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopKThreads) top_k_kernel(TopKParams p) {
  pdl_begin();
  __shared__ unsigned hist[256];
  __shared__ uint64_t keys[kMaxTopK];
  __shared__ unsigned sel_count;
  __shared__ uint32_t prefix_s;
  __shared__ unsigned remaining_s;
  __shared__ unsigned warp_tot[32];
  const int tid = threadIdx.x;
  for (int64_t qi = blockIdx.x; qi < p.nq; qi += gridDim.x) {
    const float* s = p.scores + qi * p.ld;
    const int64_t n = p.n[qi] > 0 ? p.n[qi] : 0;
    const int64_t kk = min(p.k, n);
    int32_t* out = p.out + qi * p.k;
    for (int64_t i = kk + tid; i < p.k; i += blockDim.x) out[i] = -1;
    if (kk == 0)
      continue;  // block-uniform
    // Radix select.
    uint32_t prefix = 0;
    uint32_t mask = 0;
    unsigned remaining = static_cast<unsigned>(kk);
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      // Keys of one warp share their top digits (a row of scores of similar magnitude): lanes
      // with the same digit add once per group (its lowest lane), not one atomic each on one
      // counter.
      for (int64_t base = 0; base < n; base += blockDim.x) {
        const int64_t i = base + tid;
        const uint32_t u = i < n ? ordered_key(s[i]) : 0u;
        const bool in = i < n && (u & mask) == prefix;
        const unsigned d = in ? (u >> shift) & 255u : 256u;  // 256: not counted
        const unsigned peers = __match_any_sync(0xffffffffu, d);
        if (in && (tid & 31) == __ffs(peers) - 1)
          atomicAdd(&hist[d], static_cast<unsigned>(__popc(peers)));
      }
      __syncthreads();
      if (tid < 32) {
        // The largest digit whose count, with every larger digit's, reaches `remaining` (the
        // digit of the remaining-th largest key), by warp 0: lane l owns digits 255 - 8 l down to
        // 248 - 8 l; an inclusive scan over the lanes counts the keys down to each lane's range.
        const int lane = tid;
        unsigned cnt[8];
        unsigned own = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          cnt[j] = hist[255 - 8 * lane - j];
          own += cnt[j];
        }
        unsigned incl = own;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const unsigned v = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off)
            incl += v;
        }
        unsigned above = incl - own;                   // keys in the digits above this lane's
        if (above < remaining && remaining <= incl) {  // exactly one lane
          int dgt = 248 - 8 * lane;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (above + cnt[j] >= remaining) {
              dgt = 255 - 8 * lane - j;
              break;
            }
            above += cnt[j];
          }
          prefix_s = prefix | (static_cast<uint32_t>(dgt) << shift);
          remaining_s = remaining - above;
        }
      }
      __syncthreads();
      prefix = prefix_s;
      remaining = remaining_s;
      mask |= 255u << shift;
    }
    // prefix is the k-th largest key; take every larger key and the first `remaining` equal ones
    // in index order.
    if (tid == 0)
      sel_count = 0;
    __syncthreads();
    unsigned eq_base = 0;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    for (int64_t base = 0; base < n; base += blockDim.x) {
      const int64_t i = base + tid;
      const uint32_t u = i < n ? ordered_key(s[i]) : 0;
      const bool gt = i < n && u > prefix;
      const bool eq = i < n && u == prefix;
      // Exclusive rank of this thread among the tile's equal keys.
      const unsigned ballot = __ballot_sync(0xffffffffu, eq);
      if (lane == 0)
        warp_tot[warp] = __popc(ballot);
      __syncthreads();
      unsigned before = __popc(ballot & ((1u << lane) - 1u));
      unsigned tile_eq = 0;
      for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
        if (w < warp)
          before += warp_tot[w];
        tile_eq += warp_tot[w];
      }
      const bool take = gt || (eq && eq_base + before < remaining);
      if (take) {
        const unsigned slot = atomicAdd(&sel_count, 1u);
        keys[slot] = (static_cast<uint64_t>(u) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
      }
      eq_base += tile_eq;
      __syncthreads();
    }
    // Bitonic sort, descending, over the next power of two (padding keys are 0: smallest).
    int size = 1;
    while (size < kk) size <<= 1;
    for (int i = static_cast<int>(kk) + tid; i < size; i += blockDim.x) keys[i] = 0;
    __syncthreads();
    for (int k2 = 2; k2 <= size; k2 <<= 1) {
      for (int j = k2 >> 1; j > 0; j >>= 1) {
        for (int i = tid; i < size; i += blockDim.x) {
          const int ixj = i ^ j;
          if (ixj > i) {
            const bool desc = (i & k2) == 0;
            const uint64_t a = keys[i];
            const uint64_t b = keys[ixj];
            if (desc ? a < b : a > b) {
              keys[i] = b;
              keys[ixj] = a;
            }
          }
        }
        __syncthreads();
      }
    }
    for (int64_t i = tid; i < kk; i += blockDim.x) {
      out[i] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(keys[i] & 0xffffffffu));
    }
    __syncthreads();
  }
}

}  // namespace

Status launch_sink_attention(const SinkAttentionParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("sink_attention", {p.nq, p.heads, p.dim}));
  DSI_RETURN_IF_ERROR(require(p.dim <= kMaxAttnDim, "sink_attention", "dim > 512"));
  DSI_RETURN_IF_ERROR(require(p.heads <= kMaxGrid, "sink_attention", "too many heads"));
  if (p.nq == 0 || p.heads == 0 || p.dim == 0)
    return Status();
  if ((!p.q && !p.q_bf16) || !p.key_begin || !p.sinks || (!p.out && !p.out_bf16))
    return null_pointer("sink_attention");
  if (p.q_bf16 != nullptr && !sink_attention_reads_q_bf16(p))
    return invalid_argument(
        "sink_attention: q_bf16 needs the wgmma path (sink_attention_reads_q_bf16)");
  if (p.out_bf16 != nullptr && !sink_attention_writes_bf16(p))
    return invalid_argument(
        "sink_attention: out_bf16 needs a tensor-core path without key splits, out_bf16_ld >= "
        "heads * dim, 2 * rope_half <= dim and the RoPE tables (sink_attention_writes_bf16)");
  if (p.finish_out && !sink_attention_finishes_out(p))
    return invalid_argument(
        "sink_attention: finish_out needs the tensor-core path with key splits, fp32 out, "
        "2 * rope_half <= dim and the RoPE tables (sink_attention_finishes_out)");
  if (p.kv_records && (!p.bf16_operands || !numeric::kv_record_fits(p.dim, p.record_rope_dim)))
    return invalid_argument(
        "sink_attention: KV records need bf16_operands and dim - record_rope_dim a multiple of 64");
  if (sink_attention_mma_supports(p))
    return launch_sink_attention_mma(p, stream);
  const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(std::min(p.nq, kMaxGrid)));
  if (p.bf16_operands) {
    sink_attention_kernel<true><<<grid, kAttnWarps * 32, 0, stream>>>(p);
  } else {
    sink_attention_kernel<false><<<grid, kAttnWarps * 32, 0, stream>>>(p);
  }
  return launched("sink_attention launch");
}

bool sink_attention_writes_bf16(const SinkAttentionParams& p) {
  const bool one_block_per_query =
      sink_attention_splits(p.nq) == 1 || p.split_scratch == nullptr ||
      p.split_scratch_floats < sink_attention_scratch_floats(p.nq, p.heads, p.dim);
  bool sm90 = false;
  if constexpr (sink_attention_sm90_available())
    sm90 = sink_attention_mma_supports(p) && sink_attention_sm90_supports(p);
  return sm90 && one_block_per_query && p.out_bf16_ld >= p.heads * p.dim && p.rope_half >= 0 &&
         2 * p.rope_half <= p.dim &&
         (p.rope_half == 0 || (p.positions != nullptr && p.inv_freq != nullptr));
}

bool sink_attention_finishes_out(const SinkAttentionParams& p) {
  const bool splits = sink_attention_splits(p.nq) > 1 && p.split_scratch != nullptr &&
                      p.split_scratch_floats >= sink_attention_scratch_floats(p.nq, p.heads, p.dim);
  return sink_attention_mma_supports(p) && splits && p.out != nullptr && p.out_bf16 == nullptr &&
         p.rope_half >= 0 && 2 * p.rope_half <= p.dim &&
         (p.rope_half == 0 || (p.positions != nullptr && p.inv_freq != nullptr));
}

bool sink_attention_reads_q_bf16(const SinkAttentionParams& p) {
  if constexpr (sink_attention_sm90_available())
    return sink_attention_sm90_supports(p);
  return false;
}

Status launch_compressor_append(const CompressorAppendParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("compressor_append", {p.n, p.width}));
  DSI_RETURN_IF_ERROR(require(p.ratio > 0, "compressor_append", "ratio must be positive"));
  if (p.n == 0 || p.width == 0)
    return Status();
  if (!p.kv || !p.score || !p.ape || !p.positions || !p.dest_refs)
    return null_pointer("compressor_append");
  const int64_t blocks = std::min(ceil_div(p.n * 2 * p.width, 256), kMaxGrid);
  launch_pdl(compressor_append_kernel, static_cast<unsigned>(blocks), 256, 0, stream, p);
  return launched("compressor_append launch");
}

Status launch_compressor_pool(const CompressorPoolParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("compressor_pool", {p.n_entries, p.d, p.rope_half}));
  DSI_RETURN_IF_ERROR(
      require(p.ratio > 0 && p.ratio <= 128, "compressor_pool", "ratio must be in [1, 128]"));
  DSI_RETURN_IF_ERROR(require(p.d <= kMaxAttnDim, "compressor_pool", "d > 512"));
  DSI_RETURN_IF_ERROR(require(2 * p.rope_half <= p.d, "compressor_pool", "rope dims exceed d"));
  if (p.post == CompressorPost::kIndexFp4) {
    DSI_RETURN_IF_ERROR(require(p.d > 0 && (p.d & (p.d - 1)) == 0,
                                "compressor_pool",
                                "index keys need a power-of-two width (Hadamard)"));
  }
  if (p.records) {
    const bool fits =
        p.post == CompressorPost::kKvFp8
            ? numeric::kv_record_fits(p.d, 2 * p.rope_half)
            : p.post == CompressorPost::kIndexFp4 && numeric::index_key_record_fits(p.d);
    DSI_RETURN_IF_ERROR(
        require(fits,
                "compressor_pool",
                "records need kKvFp8 (d - rope dims a multiple of 64) or kIndexFp4"));
  }
  if (p.n_entries == 0 || p.d == 0)
    return Status();
  if (!p.token_refs || !p.block || !p.norm_weight || !p.out || (p.rope_half > 0 && !p.inv_freq))
    return null_pointer("compressor_pool");
  const int threads =
      static_cast<int>(std::clamp<int64_t>(ceil_div(p.d, 32) * 32, 64, kPoolThreads));
  launch_pdl(compressor_pool_kernel,
             static_cast<unsigned>(std::min(p.n_entries, kMaxGrid)),
             threads,
             0,
             stream,
             p);
  return launched("compressor_pool launch");
}

Status launch_indexer_scores(const IndexerScoreParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("indexer_scores", {p.nq, p.heads, p.dim, p.max_visible, p.ld}));
  DSI_RETURN_IF_ERROR(require(p.heads * p.dim <= 16384, "indexer_scores", "heads * dim > 16384"));
  DSI_RETURN_IF_ERROR(require(p.ld >= p.max_visible, "indexer_scores", "ld < max_visible"));
  if (p.nq == 0 || p.max_visible == 0)
    return Status();
  const int64_t row = p.row_floats > 0 ? p.row_floats : p.dim;
  DSI_RETURN_IF_ERROR(require(p.rows_per_page > 0 && p.page_floats >= p.rows_per_page * row,
                              "indexer_scores",
                              "bad page geometry"));
  if (p.key_records) {
    DSI_RETURN_IF_ERROR(require(p.bf16_exact && numeric::index_key_record_fits(p.dim) &&
                                    row >= numeric::index_key_record_floats(p.dim),
                                "indexer_scores",
                                "index-key records need bf16_exact, dim a multiple of 32 and "
                                "rows of index_key_record_floats(dim)"));
  } else {
    DSI_RETURN_IF_ERROR(require(row == p.dim, "indexer_scores", "fp32 key rows are dim floats"));
  }
  if (!p.q || !p.head_w || !p.pool || !p.pages || !p.page_begin || !p.visible || !p.scores)
    return null_pointer("indexer_scores");
  if (indexer_scores_mma_supports(p))
    return launch_indexer_scores_mma(p, stream);
  const size_t smem = static_cast<size_t>(p.heads * p.dim + p.heads) * sizeof(float);
  if (smem > 48 * 1024) {
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaFuncSetAttribute(indexer_scores_kernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(smem)),
                           "indexer_scores smem attribute"));
  }
  const int64_t gx = ceil_div(p.max_visible, kScoreThreads);
  if (gx > 0x7fffffff)
    return invalid_argument("indexer_scores: too many blocks");
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(std::min(p.nq, kMaxGrid)));
  launch_pdl(indexer_scores_kernel, grid, kScoreThreads, smem, stream, p);
  return launched("indexer_scores launch");
}

Status launch_top_k(const TopKParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("top_k", {p.nq, p.k, p.ld}));
  DSI_RETURN_IF_ERROR(require(p.k <= kMaxTopK, "top_k", "k > 2048"));
  if (p.nq == 0 || p.k == 0)
    return Status();
  if (!p.scores || !p.n || !p.out)
    return null_pointer("top_k");
  const int threads = p.nq >= kTopKManyPerSm * sm_count() ? kTopKThreadsMany : kTopKThreads;
  launch_pdl(top_k_kernel, static_cast<unsigned>(std::min(p.nq, kMaxGrid)), threads, 0, stream, p);
  return launched("top_k launch");
}

}  // namespace dsinfer::cuda
