// GPU sampling (sampling.h): one block per request, two ways to find the pick in the host's
// candidate order (logit descending, id ascending):
//   select (default): no sort. Every cut the host makes (top-k, top-p, min-p, the zero-probability
//     tail, the inverse-CDF pick) is a prefix of that order. top-k, top-p and the pick are found
//     by descents over each token's 64-bit rank (order-preserving key of the logit, then the id):
//     a 2048-bucket histogram of counts or of probability mass over a monotone map of the logit
//     finds the bucket holding the cut, its tokens are listed, and the list alone is resolved
//     exactly (directly when short, else by 8-bit radix levels); the min-p and zero-probability
//     tail ends at the last token that passes (a maximum). Masses are fixed point (p * 2^62,
//     integer sums), so the descents are deterministic and exact on their own terms; they differ
//     from the host's serial double cumsums only where those are within ~1e-14 of a boundary.
//   sort (SampleParams::full_sort): a stable LSD radix sort of the whole vocabulary (4-bit
//     digits, 8 passes) and the host's serial walk; the first implementation, kept as a second
//     reference for the tests.
#include <cooperative_groups.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/sampling.h"
#include "numeric/counter_rng.h"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBins = 16;
constexpr int64_t kMaxGrid = 65535;

// Per-request workspace, per token: select: masses (uint64), weights (double), work logits
// (float), a token list (int32), bucket ids (uint16); full sort: probabilities (double), work
// logits, keys x2 (uint32), ids x2 (int32).
__host__ __device__ size_t request_bytes(int64_t vocab, bool full_sort) {
  const size_t per_token = full_sort ? 8 + 4 + 8 + 8 : 8 + 8 + 4 + 4 + 2;
  return (static_cast<size_t>(vocab) * per_token + 255) / 256 * 256;
}

// Where the work logits start in a request's workspace.
__host__ __device__ size_t work_offset(int64_t vocab, bool full_sort) {
  return static_cast<size_t>(vocab) * (full_sort ? 8 : 16);
}

// Sort key: ascending key = descending logit; -0 and +0 equal.
__device__ __forceinline__ uint32_t desc_key(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) == 0)
    u = 0;
  const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ord;
}

// Visits tokens [0, n) block-wide, each thread its tokens in the order of a plain stride loop
// (t, t + blockDim, ...), loading kUnroll of them (load(t)) before using any: with one block per
// request the passes over the vocabulary are bound by load latency, so more loads in flight.
// body(t, value, valid) runs for every slot with valid = t < n (value unset otherwise); the trip
// count is block-uniform, so bodies may use warp-wide intrinsics.
constexpr int kUnroll = 4;

template <typename Load, typename Body>
__device__ __forceinline__ void for_tokens(int64_t n, Load&& load, Body&& body) {
  using Value = decltype(load(int64_t{0}));
  const int64_t step = blockDim.x;
  for (int64_t base = 0; base < n; base += kUnroll * step) {
    Value v[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t t = base + u * step + threadIdx.x;
      if (t < n)
        v[u] = load(t);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t t = base + u * step + threadIdx.x;
      body(t, v[u], t < n);
    }
  }
}

// Raw log-sum-exp of a logits row (logprobs report the model's own distribution). Block-wide.
__device__ double raw_log_sum_exp(const float* raw,
                                  int64_t vocab,
                                  float* fscratch,
                                  double* dscratch) {
  auto load = [&](int64_t i) { return raw[i]; };
  float mx = -INFINITY;
  for_tokens(vocab, load, [&](int64_t, float v, bool ok) {
    if (ok)
      mx = fmaxf(mx, v);
  });
  mx = block_max(mx, fscratch);
  double s = 0.0;
  for_tokens(vocab, load, [&](int64_t, float v, bool ok) {
    if (ok)
      s += exp(static_cast<double>(v) - mx);
  });
  s = block_sum(s, dscratch);
  return log(s) + mx;
}

// work = the row under request r's token mask, then its penalties (penalty tokens are distinct,
// so threads never touch the same logit). Block-wide; ends with a barrier.
__device__ void prepare_work(
    const SampleParams& p, int64_t r, const SamplingRequest& c, const float* raw, float* work) {
  const int64_t vocab = p.vocab;
  const uint32_t* mask = c.mask_row >= 0 ? p.allowed + c.mask_row * p.allowed_words : nullptr;
  for_tokens(
      vocab,
      [&](int64_t i) { return raw[i]; },
      [&](int64_t i, float v, bool ok) {
        if (ok)
          work[i] = (mask && !((mask[i >> 5] >> (i & 31)) & 1u)) ? -INFINITY : v;
      });
  __syncthreads();
  if (p.penalty_begin) {
    for (int64_t j = p.penalty_begin[r] + threadIdx.x; j < p.penalty_begin[r + 1];
         j += blockDim.x) {
      const int32_t tok = p.penalty_token[j];
      if (tok < 0 || tok >= vocab)
        continue;
      float l = work[tok];
      if (c.repetition_penalty != 1.0f) {
        l = l > 0.0f ? __fdiv_rn(l, c.repetition_penalty) : __fmul_rn(l, c.repetition_penalty);
      }
      const int32_t cnt = p.penalty_count[j];
      if ((c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f) && cnt > 0) {
        l = __fsub_rn(
            l,
            __fadd_rn(c.presence_penalty, __fmul_rn(c.frequency_penalty, static_cast<float>(cnt))));
      }
      work[tok] = l;
    }
  }
  __syncthreads();
}

// float4s per thread in flight in first_max's vectorised scan.
constexpr int kMaxUnroll = 8;

// The first maximum of work (std::max_element). Block-wide. Each thread sees its values in
// increasing index order (a later equal value never replaces an earlier one), so the smallest
// index holding the block's maximum is the first maximum. A 16-byte aligned row of a multiple of
// 4 values is read as float4s, kMaxUnroll of them per thread in flight: one block scans V4's
// 129k-token row at greedy decode, and 4 scalar loads per round trip made it latency-bound
// (35 us per step at batch 1 on the H200).
__device__ int32_t first_max(const float* work, int64_t vocab, float* fscratch, int* best_idx) {
  float best = -INFINITY;
  int64_t best_i = -1;
  auto consider = [&](int64_t i, float v) {
    if (best_i < 0 || v > best) {
      best = v;
      best_i = i;
    }
  };
  if ((reinterpret_cast<uintptr_t>(work) & 15u) == 0 && vocab % 4 == 0) {
    const auto* w4 = reinterpret_cast<const float4*>(work);
    const int64_t n4 = vocab / 4;
    const int64_t step = blockDim.x;
    for (int64_t base = 0; base < n4; base += kMaxUnroll * step) {
      float4 v[kMaxUnroll];
#pragma unroll
      for (int u = 0; u < kMaxUnroll; ++u) {
        const int64_t c = base + u * step + threadIdx.x;
        if (c < n4)
          v[u] = w4[c];
      }
#pragma unroll
      for (int u = 0; u < kMaxUnroll; ++u) {
        const int64_t c = base + u * step + threadIdx.x;
        if (c < n4) {
          consider(4 * c, v[u].x);
          consider(4 * c + 1, v[u].y);
          consider(4 * c + 2, v[u].z);
          consider(4 * c + 3, v[u].w);
        }
      }
    }
  } else {
    for_tokens(
        vocab,
        [&](int64_t i) { return work[i]; },
        [&](int64_t i, float v, bool ok) {
          if (ok)
            consider(i, v);
        });
  }
  const float mx = block_max(best, fscratch);
  if (threadIdx.x == 0)
    *best_idx = 0x7fffffff;
  __syncthreads();
  if (best_i >= 0 && best == mx)
    atomicMin(best_idx, static_cast<int>(best_i));
  __syncthreads();
  const int32_t chosen = *best_idx == 0x7fffffff ? 0 : *best_idx;
  __syncthreads();
  return chosen;
}

// The per-request frame both kernels share (one block per request): the request's logits row
// and workspace, the raw log-sum-exp for the logprob (only for requests that want it: a double
// exp over the whole row), the mask and penalties into work (at work_offset; requests with
// neither read their row in place), greedy; `pick(c, work, ws)` chooses the token otherwise.
template <typename Smem, typename Pick>
__device__ void for_each_request(const SampleParams& p, Smem& sm, Pick&& pick) {
  const int64_t vocab = p.vocab;
  const int64_t ld = p.ld > 0 ? p.ld : vocab;
  for (int64_t r = blockIdx.x; r < p.n; r += gridDim.x) {
    const SamplingRequest c = p.requests[r];
    const float* raw = p.logits + (c.row >= 0 ? c.row : r) * ld;
    char* ws = static_cast<char*>(p.workspace) + r * request_bytes(vocab, p.full_sort);
    float* work = reinterpret_cast<float*>(ws + work_offset(vocab, p.full_sort));
    const bool want_logprob = p.out_logprobs != nullptr && c.logprobs;
    const double lse = want_logprob ? raw_log_sum_exp(raw, vocab, sm.fscratch, sm.dscratch) : 0.0;
    // Without a mask or penalties the row itself is the work row (no copy).
    const bool rewrite = c.mask_row >= 0 || (p.penalty_begin != nullptr &&
                                             p.penalty_begin[r + 1] > p.penalty_begin[r]);
    if (rewrite)
      prepare_work(p, r, c, raw, work);
    const float* src = rewrite ? work : raw;
    const int32_t chosen = (c.temperature == 0.0f || c.top_k == 1)
                               ? first_max(src, vocab, sm.fscratch, &sm.best_idx)
                               : pick(c, src, ws);
    if (threadIdx.x == 0) {
      p.out_tokens[r] = chosen;
      if (p.out_logprobs)
        p.out_logprobs[r] = want_logprob ? static_cast<float>(raw[chosen] - lse) : 0.0f;
    }
    __syncthreads();
  }
}

struct SampleSmem {
  int counts[kBins][kThreads];
  double dscratch[32];
  float fscratch[32];
  double part[kThreads];
  int first_hit;
  int best_idx;
};

// Exclusive scan of counts in bin-major order (bin, thread): stable scatter offsets.
__device__ void scan_counts(SampleSmem& sm) {
  constexpr int kPer = kBins * kThreads / kThreads;  // 16 entries per thread
  int* flat = &sm.counts[0][0];
  const int base = threadIdx.x * kPer;
  int local = 0;
  for (int i = 0; i < kPer; ++i) local += flat[base + i];
  __shared__ int tsum[kThreads];
  tsum[threadIdx.x] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int t = 0; t < kThreads; ++t) {
      const int v = tsum[t];
      tsum[t] = acc;
      acc += v;
    }
  }
  __syncthreads();
  int acc = tsum[threadIdx.x];
  for (int i = 0; i < kPer; ++i) {
    const int v = flat[base + i];
    flat[base + i] = acc;
    acc += v;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) sample_sort_kernel(SampleParams p) {
  pdl_begin();
  __shared__ SampleSmem sm;
  const int tid = threadIdx.x;
  const int64_t vocab = p.vocab;
  for_each_request(p, sm, [&](const SamplingRequest& c, const float* work, char* ws) -> int32_t {
    double* prob = reinterpret_cast<double*>(ws);
    uint32_t* keys[2] = {reinterpret_cast<uint32_t*>(ws + vocab * 12),
                         reinterpret_cast<uint32_t*>(ws + vocab * 16)};
    int32_t* ids[2] = {reinterpret_cast<int32_t*>(ws + vocab * 20),
                       reinterpret_cast<int32_t*>(ws + vocab * 24)};
    {
      // Stable LSD radix sort of (key, id), ids initially ascending.
      const int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
      const int64_t lo = min(vocab, tid * chunk);
      const int64_t hi = min(vocab, lo + chunk);
      for (int64_t i = tid; i < vocab; i += blockDim.x) {
        keys[0][i] = desc_key(work[i]);
        ids[0][i] = static_cast<int32_t>(i);
      }
      __syncthreads();
      int cur = 0;
      for (int shift = 0; shift < 32; shift += 4) {
        for (int b = 0; b < kBins; ++b) sm.counts[b][tid] = 0;
        for (int64_t i = lo; i < hi; ++i) ++sm.counts[(keys[cur][i] >> shift) & 15u][tid];
        __syncthreads();
        scan_counts(sm);
        for (int64_t i = lo; i < hi; ++i) {
          const uint32_t k = keys[cur][i];
          const int dst = sm.counts[(k >> shift) & 15u][tid]++;
          keys[cur ^ 1][dst] = k;
          ids[cur ^ 1][dst] = ids[cur][i];
        }
        __syncthreads();
        cur ^= 1;
      }
      const int32_t* idx = ids[cur];
      const int64_t n = (c.top_k > 0 && c.top_k < vocab) ? c.top_k : vocab;
      const double inv_t = 1.0 / c.temperature;
      const double m = work[idx[0]] * inv_t;
      double s = 0.0;
      for (int64_t i = tid; i < n; i += blockDim.x) {
        prob[i] = exp(work[idx[i]] * inv_t - m);
        s += prob[i];
      }
      s = block_sum(s, sm.dscratch);
      __syncthreads();
      for (int64_t i = tid; i < n; i += blockDim.x) prob[i] /= s;
      __syncthreads();

      // Chunked inclusive prefix sums over prob[0, n): thread t owns [t*ch, (t+1)*ch).
      const int64_t ch = (n + blockDim.x - 1) / blockDim.x;
      const int64_t a0 = min(n, tid * ch);
      const int64_t a1 = min(n, a0 + ch);
      auto chunk_offsets = [&](int64_t end) {  // exclusive offset of this thread's chunk
        double local = 0.0;
        for (int64_t i = a0; i < min(a1, end); ++i) local += prob[i];
        sm.part[tid] = local;
        __syncthreads();
        if (tid == 0) {
          double acc = 0.0;
          for (int t = 0; t < static_cast<int>(blockDim.x); ++t) {
            const double v = sm.part[t];
            sm.part[t] = acc;
            acc += v;
          }
        }
        __syncthreads();
        const double off = sm.part[tid];
        __syncthreads();
        return off;
      };
      auto first_index = [&](auto&& pred, double off, int64_t end) {  // smallest i < end
        if (tid == 0)
          sm.first_hit = 0x7fffffff;
        __syncthreads();
        double acc = off;
        for (int64_t i = a0; i < min(a1, end); ++i) {
          acc += prob[i];
          if (pred(i, acc)) {
            atomicMin(&sm.first_hit, static_cast<int>(i));
            break;
          }
        }
        __syncthreads();
        const int hit = sm.first_hit;
        __syncthreads();
        return hit;
      };
      int64_t keep = n;
      if (c.top_p < 1.0f) {
        const double off = chunk_offsets(n);
        const double top_p = c.top_p;
        const int hit = first_index([&](int64_t, double acc) { return acc >= top_p; }, off, n);
        if (hit != 0x7fffffff)
          keep = hit + 1;
      }
      if (c.min_p > 0.0f) {
        const double floor_p = c.min_p * prob[0];
        const int hit =
            first_index([&](int64_t i, double) { return i >= 1 && prob[i] < floor_p; }, 0.0, keep);
        if (hit != 0x7fffffff)
          keep = hit;
      }
      // Tokens of probability 0 (masked out, or underflowed) are never chosen: probabilities
      // are non-increasing along the sorted order, so they form a suffix.
      {
        const int hit =
            first_index([&](int64_t i, double) { return i >= 1 && prob[i] == 0.0; }, 0.0, keep);
        if (hit != 0x7fffffff)
          keep = hit;
      }
      // total = sum of the kept mass; pick the first i with u * total < cumsum_i.
      const double off = chunk_offsets(keep);
      if (a0 < keep && min(a1, keep) == keep) {
        double acc = off;
        for (int64_t i = a0; i < keep; ++i) acc += prob[i];
        sm.part[0] = acc;  // only the thread holding the last kept element writes
      }
      __syncthreads();
      const double total = sm.part[0];
      __syncthreads();
      const double u = rng::uniform_from(c.seed, c.step) * total;
      const int hit = first_index([&](int64_t, double acc) { return u < acc; }, off, keep);
      return idx[hit != 0x7fffffff ? hit : keep - 1];
    }
  });
}

// ---- select: descents over the candidate order, no sort ----

constexpr int kSelThreads = 512;
constexpr int kBuckets = 2048;  // coarse level: buckets of the logit's distance below the max
constexpr uint16_t kNoBucket = 0xffff;
constexpr uint64_t kNoRank = ~uint64_t{0};
constexpr double kFixedOne = 4611686018427387904.0;  // 2^62: probability 1 in fixed point
constexpr unsigned kFull = 0xffffffffu;

// A token's place in the host's candidate order (ascending = logit descending, then id).
__device__ __forceinline__ uint64_t rank_of(float logit, int64_t id) {
  return (static_cast<uint64_t>(desc_key(logit)) << 32) | static_cast<uint64_t>(id);
}

// A token's logit and its count (1) or mass, as the descents read them.
struct Token {
  float logit;
  unsigned long long mass;
};

struct SelectSmem {
  // The coarse histogram; once its crossing is found, the short list's ranks and values.
  unsigned long long buckets[kBuckets];
  unsigned long long bins[256];
  unsigned long long uscratch[32];
  double dscratch[32];
  float fscratch[32];
  unsigned long long below;
  unsigned long long target;
  int found;
  int best_idx;
  int list_len;
};
static_assert(2 * kSelThreads <= kBuckets, "the short list is staged in the bucket array");

enum class Sel {
  kCount,   // the token at 0-based position `target` (count of tokens up to it > target)
  kMassGe,  // the first token at which the cumulative mass reaches target (>=)
  kMassGt,  // the first token at which the cumulative mass exceeds target (>)
};

__device__ __forceinline__ bool meets(Sel mode, unsigned long long cum, unsigned long long target) {
  return mode == Sel::kMassGe ? cum >= target : cum > target;
}

// Buckets: a monotone map of the logit (non-decreasing along the candidate order, equal logits
// share one), so each bucket holds a contiguous run of the order. Bucket widths follow the row's
// range of finite logits, so that the tokens spread over many buckets; any scale would be exact.
struct Bucketing {
  float mx;     // the row's maximum
  float scale;  // (kBuckets - 1) / (max - smallest finite logit); 0 puts every token in one
};

__device__ __forceinline__ int bucket_of(float l, const Bucketing& b) {
  const float f = __fmul_rn(__fsub_rn(b.mx, l), b.scale);  // NaN (-inf rows) -> the last
  return f < static_cast<float>(kBuckets - 1) ? static_cast<int>(f) : kBuckets - 1;
}

__device__ unsigned long long block_min(unsigned long long v, unsigned long long* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(kFull, v, off));
  __syncthreads();
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : ~0ull;
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

// Warp 0 only: the first of `nbins` bins (a multiple of 32) at which `below` plus the running
// sum meets the target; sm.found = -1 when none does, sm.below = the sum before the bin. With
// draw >= 0 the target is first set to floor(draw * the bins' total) (the inverse-CDF pick);
// sm.target holds the target used.
__device__ void find_bin(const unsigned long long* bins,
                         int nbins,
                         unsigned long long below,
                         Sel mode,
                         unsigned long long target,
                         double draw,
                         SelectSmem& sm) {
  const int lane = threadIdx.x & 31;
  const int per = nbins / 32;
  unsigned long long local = 0;
  for (int i = 0; i < per; ++i) local += bins[lane * per + i];
  unsigned long long incl = local;  // inclusive scan over the lanes
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned long long v = __shfl_up_sync(kFull, incl, off);
    if (lane >= off)
      incl += v;
  }
  if (draw >= 0.0) {
    const unsigned long long total = __shfl_sync(kFull, incl, 31);
    target = static_cast<unsigned long long>(draw * static_cast<double>(total));
  }
  const unsigned hit = __ballot_sync(kFull, meets(mode, below + incl, target));
  int found = -1;
  unsigned long long before = below;
  if (hit != 0) {
    const int src = __ffs(hit) - 1;  // the first lane whose bins reach the target
    if (lane == src) {
      unsigned long long acc = below + (incl - local);
      for (int i = 0; i < per; ++i) {
        const unsigned long long next = acc + bins[lane * per + i];
        if (meets(mode, next, target)) {
          found = lane * per + i;
          break;
        }
        acc = next;
      }
      before = acc;
    }
    found = __shfl_sync(kFull, found, src);
    before = __shfl_sync(kFull, before, src);
  }
  if (lane == 0) {
    sm.found = found;
    sm.below = before;
    sm.target = target;
  }
}

// Adds each active token's count or mass to hist[bin] (bin < 0: none). Counts are aggregated
// over the warp's lanes of one bin (at the coarse levels many tokens share one); masses of 0 are
// skipped. Called by every lane of the warp.
__device__ __forceinline__ void hist_add(unsigned long long* hist,
                                         int bin,
                                         Sel mode,
                                         unsigned long long m) {
  if (mode == Sel::kCount) {
    const unsigned peers = __match_any_sync(kFull, bin);
    if (bin >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1)
      atomicAdd(&hist[bin], static_cast<unsigned long long>(__popc(peers)));
  } else if (bin >= 0 && m != 0) {
    atomicAdd(&hist[bin], m);
  }
}

// The rank of the first token (in the candidate order, among tokens of rank < limit) at which the
// running count or mass meets `target` (Sel; with draw >= 0, floor(draw * the total mass below
// limit)); kNoRank when those tokens never meet it. Three steps: a histogram over the buckets
// (one pass over the vocabulary) finds the bucket holding the token; the bucket's tokens are
// listed (a second pass); then, over the list only, either every entry's cumulative value
// directly (a short list) or radix levels over the 64-bit rank. Integer sums throughout, so the
// result does not depend on the list's order. Block-wide; every thread gets the result. Not
// inlined: three inlined copies made the kernel spill registers.
__device__ __noinline__ uint64_t select_rank(const float* work,
                                             const unsigned long long* mass,
                                             int32_t* list,
                                             uint16_t* bucket_ids,
                                             int64_t vocab,
                                             const Bucketing& bk,
                                             uint64_t limit,
                                             Sel mode,
                                             unsigned long long target,
                                             double draw,
                                             SelectSmem& sm) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const bool count = mode == Sel::kCount;
  for (int i = tid; i < kBuckets; i += blockDim.x) sm.buckets[i] = 0;
  __syncthreads();
  auto load = [&](int64_t t) { return Token{work[t], count ? 1ull : mass[t]}; };
  // Each token's bucket is kept (kNoBucket: not counted) for the listing pass.
  for_tokens(vocab, load, [&](int64_t t, const Token& v, bool ok) {
    const bool in = ok && v.mass != 0 && rank_of(v.logit, t) < limit;
    const int b = in ? bucket_of(v.logit, bk) : -1;
    hist_add(sm.buckets, b, mode, v.mass);
    if (ok)
      bucket_ids[t] = in ? static_cast<uint16_t>(b) : kNoBucket;
  });
  __syncthreads();
  if (tid < 32)
    find_bin(sm.buckets, kBuckets, 0, mode, target, draw, sm);
  __syncthreads();
  const int found = sm.found;
  unsigned long long below = sm.below;
  target = sm.target;
  if (tid == 0)
    sm.list_len = 0;
  __syncthreads();
  if (found < 0)
    return kNoRank;
  // The bucket's tokens (those that add to the sums), appended warp by warp.
  for_tokens(
      vocab,
      [&](int64_t t) { return bucket_ids[t]; },
      [&](int64_t t, uint16_t b, bool ok) {
        const bool in = ok && b == found;
        const unsigned ballot = __ballot_sync(kFull, in);
        if (ballot != 0) {
          int at = 0;
          if (lane == 0)
            at = atomicAdd(&sm.list_len, __popc(ballot));
          at = __shfl_sync(kFull, at, 0);
          if (in)
            list[at + __popc(ballot & ((1u << lane) - 1u))] = static_cast<int32_t>(t);
        }
      });
  __syncthreads();
  const int len = sm.list_len;
  if (len <= static_cast<int>(blockDim.x)) {
    // Short list: entry i's cumulative value is below + the values of the entries ranked <= it.
    unsigned long long* st_rank = sm.buckets;
    unsigned long long* st_val = sm.buckets + kSelThreads;
    if (tid < len) {
      const int32_t id = list[tid];
      st_rank[tid] = rank_of(work[id], id);
      st_val[tid] = count ? 1ull : mass[id];
    }
    __syncthreads();
    unsigned long long best = kNoRank;
    if (tid < len) {
      const unsigned long long rk = st_rank[tid];
      unsigned long long cum = below;
      for (int j = 0; j < len; ++j) cum += st_rank[j] <= rk ? st_val[j] : 0ull;
      if (meets(mode, cum, target))
        best = rk;
    }
    return block_min(best, sm.uscratch);
  }
  // Long list (many tokens in one bucket, e.g. ties): 8-bit digits of the rank, the logit key's
  // four bytes then the id's.
  int shifts[8];
  int levels = 0;
  for (int sh = 56; sh >= 32; sh -= 8) shifts[levels++] = sh;
  for (int sh = vocab > (int64_t{1} << 24) ? 24 : 16; sh >= 0; sh -= 8) shifts[levels++] = sh;
  uint64_t prefix = 0;
  for (int lv = 0; lv < levels; ++lv) {
    const int shift = shifts[lv];
    const uint64_t fixed_mask = lv == 0 ? 0 : ~((uint64_t{1} << (shift + 8)) - 1);
    for (int i = tid; i < 256; i += blockDim.x) sm.bins[i] = 0;
    __syncthreads();
    for (int base = 0; base < len; base += blockDim.x) {
      const int j = base + tid;
      int bin = -1;
      unsigned long long m = 0;
      if (j < len) {
        const int32_t id = list[j];
        const uint64_t rk = rank_of(work[id], id);
        if ((rk & fixed_mask) == prefix) {
          bin = static_cast<int>((rk >> shift) & 255);
          m = count ? 1ull : mass[id];
        }
      }
      hist_add(sm.bins, bin, mode, m);
    }
    __syncthreads();
    if (tid < 32)
      find_bin(sm.bins, 256, below, mode, target, -1.0, sm);
    __syncthreads();
    const int digit = sm.found;
    below = sm.below;
    __syncthreads();  // sm is rewritten by the next level
    if (digit < 0)
      return kNoRank;
    prefix |= static_cast<uint64_t>(digit) << shift;
  }
  return prefix;
}

// A token's logit and its weight (the kept-tail pass).
struct Weighted {
  float logit;
  double weight;
};

// exp(l / T - m) as the host computes it (double).
__device__ __forceinline__ double weight(float l, double inv_t, double m) {
  return exp(static_cast<double>(l) * inv_t - m);
}

// Workspace per request (request_bytes): masses (uint64), weights (double), work logits (float),
// the descents' list (int32) and bucket ids (uint16), each [vocab].
__global__ void __launch_bounds__(kSelThreads) sample_select_kernel(SampleParams p) {
  pdl_begin();
  __shared__ SelectSmem sm;
  const int64_t vocab = p.vocab;
  for_each_request(p, sm, [&](const SamplingRequest& c, const float* work, char* ws) -> int32_t {
    auto* mass = reinterpret_cast<unsigned long long*>(ws);
    auto* w = reinterpret_cast<double*>(ws + vocab * 8);
    auto* list = reinterpret_cast<int32_t*>(ws + vocab * 20);
    auto* bucket_ids = reinterpret_cast<uint16_t*>(ws + vocab * 24);
    // The row's maximum (the first candidate's logit) and smallest finite logit: the buckets.
    auto load_logit = [&](int64_t t) { return work[t]; };
    float mx = -INFINITY, mn = INFINITY;
    for_tokens(vocab, load_logit, [&](int64_t, float v, bool ok) {
      if (!ok)
        return;
      mx = fmaxf(mx, v);
      if (isfinite(v))
        mn = fminf(mn, v);
    });
    mx = block_max(mx, sm.fscratch);
    mn = -block_max(-mn, sm.fscratch);
    const float range = __fsub_rn(mx, mn);
    const Bucketing bk{mx,
                       isfinite(range) && range > 0.0f
                           ? __fdiv_rn(static_cast<float>(kBuckets - 1), range)
                           : 0.0f};
    // Candidates: the first top_k tokens of the order (all without top-k).
    uint64_t limit = kNoRank;
    if (c.top_k > 0 && c.top_k < vocab) {
      const uint64_t kth = select_rank(work,
                                       mass,
                                       list,
                                       bucket_ids,
                                       vocab,
                                       bk,
                                       kNoRank,
                                       Sel::kCount,
                                       static_cast<unsigned long long>(c.top_k - 1),
                                       -1.0,
                                       sm);
      limit = kth + 1;  // top_k <= vocab: the k-th token exists
    }
    // Softmax at the temperature over the candidates, relative to the first one (the maximum).
    // Each weight is computed once and kept (0 outside the candidates).
    const double inv_t = 1.0 / c.temperature;
    const double m = static_cast<double>(mx) * inv_t;
    double sum = 0.0;
    for_tokens(vocab, load_logit, [&](int64_t t, float l, bool ok) {
      if (!ok)
        return;
      double wt = 0.0;
      if (rank_of(l, t) < limit) {
        wt = weight(l, inv_t, m);
        sum += wt;
      }
      w[t] = wt;
    });
    sum = block_sum(sum, sm.dscratch);
    // Fixed-point masses of the candidates (others 0; their stored weight is 0, so the rank is
    // only looked at when the weight is not positive). Each thread reads the weights it wrote.
    for_tokens(
        vocab,
        [&](int64_t t) { return w[t]; },
        [&](int64_t t, double wt, bool ok) {
          if (ok)
            mass[t] = wt > 0.0 || rank_of(work[t], t) < limit
                          ? __double2ull_rn(wt / sum * kFixedOne)
                          : 0ull;
        });
    __syncthreads();
    // top-p: the shortest prefix whose mass reaches top_p.
    uint64_t keep = limit;
    if (c.top_p < 1.0f) {
      const unsigned long long target =
          max(1ull, __double2ull_rn(static_cast<double>(c.top_p) * kFixedOne));
      const uint64_t cut = select_rank(
          work, mass, list, bucket_ids, vocab, bk, keep, Sel::kMassGe, target, -1.0, sm);
      if (cut != kNoRank)
        keep = cut + 1;
    }
    // min-p (relative to the first probability, 1 / sum) and the tail of probability 0: both
    // hold on a prefix of the order (probabilities do not increase along it), so the kept
    // tokens end at the last token that passes; the first token stays when none does.
    const double floor_p = c.min_p > 0.0f ? static_cast<double>(c.min_p) * (1.0 / sum) : 0.0;
    unsigned long long last_pass = 0, first = kNoRank, passing = 0;
    for_tokens(
        vocab,
        [&](int64_t t) {
          return Weighted{work[t], w[t]};
        },
        [&](int64_t t, const Weighted& v, bool ok) {
          const uint64_t rk = rank_of(v.logit, t);
          if (!ok || rk >= keep)
            return;
          first = min(first, static_cast<unsigned long long>(rk));
          const double pt = v.weight / sum;
          if (pt > 0.0 && (c.min_p <= 0.0f || pt >= floor_p)) {
            last_pass = max(last_pass, static_cast<unsigned long long>(rk));
            ++passing;
          }
        });
    passing = block_sum(passing, sm.uscratch);
    last_pass = ~block_min(passing > 0 ? ~last_pass : ~0ull, sm.uscratch);  // the maximum
    first = block_min(first, sm.uscratch);
    const uint64_t last = passing > 0 ? last_pass : first;
    keep = last + 1;
    // The draw: the first token whose cumulative mass exceeds u * (the kept mass).
    const uint64_t pick = select_rank(work,
                                      mass,
                                      list,
                                      bucket_ids,
                                      vocab,
                                      bk,
                                      keep,
                                      Sel::kMassGt,
                                      0,
                                      rng::uniform_from(c.seed, c.step),
                                      sm);
    return static_cast<int32_t>((pick != kNoRank ? pick : last) & 0xffffffffu);
  });
}
}  // namespace

size_t sample_workspace_bytes(int64_t n, int64_t vocab, bool full_sort) {
  return n <= 0 || vocab <= 0 ? 0 : static_cast<size_t>(n) * request_bytes(vocab, full_sort);
}

// Greedy picks: each row over a thread-block cluster of up to kPickBlocks blocks, block k of it a
// contiguous slice of the vocabulary (one block per row spent ~10 us on 8k logits, most of it in
// the serial double-precision exps of its 16 logits per thread, and would take ~40 us at V4's
// 129k). Pass 1: every block's (maximum, first index holding it), combined in rank order by
// every block from the others' shared memory; pass 2: the exps' sums under that maximum, added
// in rank order by rank 0. The token is the first maximum, as the sampler's greedy pick; the
// log-softmax sums in another order than the sampler's single block (a few ulps of the double
// sum, below float's resolution nearly always).
constexpr int kPickThreads = 512;
constexpr int kPickBlocks = 8;
constexpr int64_t kPickMinPerBlock = 1024;  // logits per block before another block pays

struct PickBest {
  float v;
  int32_t i;  // -1: none yet
};

// b beats a: larger, or as large at a smaller index; NaNs never win (a NaN row picks token 0).
__device__ __forceinline__ bool pick_better(const PickBest& b, const PickBest& a) {
  return b.i >= 0 && (a.i < 0 || b.v > a.v || (b.v == a.v && b.i < a.i));
}

__device__ __forceinline__ PickBest warp_best(PickBest x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const PickBest o{__shfl_xor_sync(0xffffffffu, x.v, off),
                     __shfl_xor_sync(0xffffffffu, x.i, off)};
    if (pick_better(o, x))
      x = o;
  }
  return x;
}

__global__ void __launch_bounds__(kPickThreads) greedy_pick_kernel(GreedyPickParams p) {
  pdl_begin();
  namespace cg = cooperative_groups;
  __shared__ PickBest warp_s[kPickThreads / 32];
  __shared__ double dscratch[32];
  __shared__ PickBest block_best;  // read by the cluster's other blocks
  __shared__ double block_sum_s;   // read by rank 0
  cg::cluster_group cluster = cg::this_cluster();
  const int nb = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t ld = p.ld > 0 ? p.ld : p.vocab;
  const int64_t per = (p.vocab + nb - 1) / nb;
  const int64_t begin = min(p.vocab, rank * per);
  const int64_t end = min(p.vocab, begin + per);
  for (int64_t r = blockIdx.y; r < p.n; r += gridDim.y) {
    const float* raw = p.logits + r * ld;
    PickBest best{-INFINITY, -1};
    for_tokens(
        end - begin,
        [&](int64_t i) { return raw[begin + i]; },
        [&](int64_t i, float v, bool ok) {
          const PickBest c{v, static_cast<int32_t>(begin + i)};
          if (ok && !isnan(v) && pick_better(c, best))
            best = c;
        });
    best = warp_best(best);
    if (lane == 0)
      warp_s[warp] = best;
    __syncthreads();
    if (warp == 0) {
      best = lane < static_cast<int>(blockDim.x >> 5) ? warp_s[lane] : PickBest{-INFINITY, -1};
      best = warp_best(best);
      if (lane == 0)
        block_best = best;
    }
    cluster.sync();  // every block's best is written
    PickBest all{-INFINITY, -1};
    for (int k = 0; k < nb; ++k) {
      const PickBest o = *cluster.map_shared_rank(&block_best, k);
      if (pick_better(o, all))
        all = o;
    }
    const float mx = all.i >= 0 ? all.v : -INFINITY;
    double s = 0.0;
    for_tokens(
        end - begin,
        [&](int64_t i) { return raw[begin + i]; },
        [&](int64_t, float v, bool ok) {
          if (ok)
            s += exp(static_cast<double>(v) - mx);
        });
    s = block_sum(s, dscratch);
    if (threadIdx.x == 0)
      block_sum_s = s;
    cluster.sync();  // every block's sum is written
    if (rank == 0 && threadIdx.x == 0) {
      double total = 0.0;
      for (int k = 0; k < nb; ++k) total += *cluster.map_shared_rank(&block_sum_s, k);
      const int32_t chosen = all.i >= 0 ? all.i : 0;
      p.tokens[r] = chosen;
      p.logprobs[r] = static_cast<float>(raw[chosen] - (log(total) + mx));
      if (p.next)
        p.next[r] = chosen;
    }
    cluster.sync();  // rank 0 has read the sums before any block writes the next row's
  }
}

// The checks of every launcher over rows of logits: shape, row stride, vocabulary size (a
// vocabulary is needed only when there are rows).
Status check_logit_rows(const char* what, int64_t n, int64_t vocab, int64_t ld) {
  DSI_RETURN_IF_ERROR(check_nonneg(what, {n, vocab, ld}));
  DSI_RETURN_IF_ERROR(require(ld == 0 || ld >= vocab, what, "ld < vocab"));
  DSI_RETURN_IF_ERROR(require(vocab < (int64_t{1} << 31), what, "vocab too large"));
  return require(n == 0 || vocab > 0, what, "empty vocabulary");
}

Status launch_greedy_pick(const GreedyPickParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_logit_rows("greedy_pick", p.n, p.vocab, p.ld));
  if (p.n == 0)
    return Status();
  if (!p.logits || !p.tokens || !p.logprobs)
    return null_pointer("greedy_pick");
  const auto nb = static_cast<unsigned>(
      std::clamp<int64_t>((p.vocab + kPickMinPerBlock - 1) / kPickMinPerBlock, 1, kPickBlocks));
  launch_pdl_cluster(greedy_pick_kernel,
                     dim3(nb, static_cast<unsigned>(std::min(p.n, kMaxGrid))),
                     kPickThreads,
                     0,
                     stream,
                     dim3(nb, 1, 1),
                     p);
  return launched("greedy_pick launch");
}

__global__ void scatter_tokens_kernel(const int32_t* src,
                                      const int32_t* src_index,
                                      int32_t* dst,
                                      const int32_t* dst_index,
                                      int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[dst_index[i]] = src[src_index[i]];
}

Status launch_scatter_tokens(const int32_t* src,
                             const int32_t* src_index,
                             int32_t* dst,
                             const int32_t* dst_index,
                             int64_t n,
                             cudaStream_t stream) {
  if (n == 0)
    return Status();
  if (!src || !src_index || !dst || !dst_index)
    return null_pointer("scatter_tokens");
  constexpr int kThreads = 128;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 64));
  launch_pdl(scatter_tokens_kernel,
             dim3(blocks),
             dim3(kThreads),
             0,
             stream,
             src,
             src_index,
             dst,
             dst_index,
             n);
  return launched("scatter_tokens launch");
}

Status launch_sample(const SampleParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_logit_rows("sample", p.n, p.vocab, p.ld));
  if (p.n == 0)
    return Status();
  if (!p.logits || !p.requests || !p.workspace || !p.out_tokens)
    return null_pointer("sample");
  if (p.penalty_begin && (!p.penalty_token || !p.penalty_count))
    return null_pointer("sample penalties");
  DSI_RETURN_IF_ERROR(require(!p.allowed || p.allowed_words >= (p.vocab + 31) / 32,
                              "sample",
                              "token mask narrower than the vocabulary"));
  DSI_RETURN_IF_ERROR(
      require(p.workspace_bytes >= sample_workspace_bytes(p.n, p.vocab, p.full_sort),
              "sample",
              "workspace too small"));
  DSI_RETURN_IF_ERROR(require(reinterpret_cast<uintptr_t>(p.workspace) % 8 == 0,
                              "sample",
                              "workspace must be 8-byte aligned"));
  const auto grid = static_cast<unsigned>(std::min(p.n, kMaxGrid));
  if (p.full_sort) {
    launch_pdl(sample_sort_kernel, grid, kThreads, 0, stream, p);
  } else {
    launch_pdl(sample_select_kernel, grid, kSelThreads, 0, stream, p);
  }
  return launched("sample launch");
}

}  // namespace dsinfer::cuda
