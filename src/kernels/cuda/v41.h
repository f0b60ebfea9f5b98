// The DeepSeek V4.1 kernels that have no V4 equivalent (spec deepseek-v41.md §3-§4), each the
// GPU twin of a step of the CPU V4.1 forward (backend/cpu_v41/model.cc):
//   v41_mhc.cu     single-pass ("shifted") mHC: the site mixes (pre / post / comb), the
//                  sub-layer input from the carried mix, the post step in V4.1's order, the
//                  DSpark target feature (mean of the streams);
//   v41_quant.cu   the storage simulations of V4.1's records (FP8 window KV, FP4 index keys and
//                  queries, FP4 compressed KV) and the ratio-r compressor pooling;
//   v41_select.cu  the two-level top-k (candidate blocks of the candidate source, the pool mask
//                  of the reindex layers, empty selections dropped) and small row utilities;
//   v41_engram.cu  the Engram gate (per-stream key match and value add) and the gather of
//                  Engram table rows held in device memory (the `device` placement).
// Device pointers in, Status out; every launcher validates its params and enqueues on `stream`.
// Empty shapes launch nothing. fp32 throughout.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"

namespace dsinfer::cuda {

inline constexpr int64_t kV41MaxMix = 32;  // (2 + hc) * hc: hc <= 4

// Per token t (one block each), as V41CpuModel::mixes: mu = (fn . x_t) / sqrt(mean(x_t^2) +
// norm_eps) (sum of squares in double), pre = sigmoid(scale0 mu + base) + hc_eps, post =
// 2 sigmoid(scale1 mu + base), comb = Sinkhorn(softmax rows + hc_eps; column, then iters - 1
// times row and column normalisation). The dot products are tree sums (the CPU: 8 running
// partials), so mu differs from the CPU in the last bits.
struct V41HcMixParams {
  const float* fn = nullptr;     // [(2+hc)*hc, hc*hidden]
  const float* base = nullptr;   // [(2+hc)*hc]
  const float* scale = nullptr;  // [3]
  int64_t hc = 4;
  int64_t hidden = 0;
  int64_t sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-20f;
  const float* x = nullptr;  // [n, hc, hidden]
  int64_t n = 0;
  float* pre = nullptr;   // [n, hc]
  float* post = nullptr;  // [n, hc]
  float* comb = nullptr;  // [n, hc, hc] (row j = input stream)
};
Status launch_v41_hc_mix(const V41HcMixParams& p, cudaStream_t stream);

// u[t, i] = sum_j pi[t, j] * x[t, j, i] (j ascending, from 0), or with `mean` the streams' mean
// (sum_j x[t, j, i]) / hc (pi unused).
struct V41CollapseParams {
  const float* x = nullptr;   // [n, hc, hidden]
  const float* pi = nullptr;  // [n, hc]
  int64_t n = 0;
  int64_t hc = 4;
  int64_t hidden = 0;
  bool mean = false;
  float* out = nullptr;  // [n, hidden]
};
Status launch_v41_collapse(const V41CollapseParams& p, cudaStream_t stream);

// x_out[t, k, i] = post[t, k] * f[t, i] + (sum_j comb[t, j, k] * x[t, j, i]), the comb sum first
// (V4.1's order; V4's hc_post adds post * f first). x_out must not alias x.
struct V41HcPostParams {
  int64_t hc = 4;
  int64_t hidden = 0;
  int64_t n = 0;
  const float* f = nullptr;     // [n, hidden]
  const float* x = nullptr;     // [n, hc, hidden]
  const float* post = nullptr;  // [n, hc]
  const float* comb = nullptr;  // [n, hc, hc]
  float* x_out = nullptr;       // [n, hc, hidden]
};
Status launch_v41_hc_post(const V41HcPostParams& p, cudaStream_t stream);

// In-place record simulations on the first `len` values of `rows` rows (stride ld), bit-identical
// to cpu_v41::fp8_window_quant / fp4_index_quant / fp4_compressed_quant:
//   kFp8Window:     blocks of 32, E4M3 with UE8M0 scale 2^ceil(log2(max(amax, 1e-4) / 448));
//   kFp4Index:      blocks of 32, E2M1 with UE8M0 scale 2^ceil(log2(max(amax, 6 2^-126) / 6));
//   kFp4Compressed: blocks of 16, E2M1 with E4M3 scale e4m3(max(amax, 6 2^-9) / 6), the scale
//                   clamped at 448 first with clamp_scale (DeepInfer).
enum class V41Quant { kFp8Window, kFp4Index, kFp4Compressed };
struct V41QuantParams {
  float* x = nullptr;
  int64_t rows = 0;
  int64_t ld = 0;  // 0: len
  int64_t len = 0;
  V41Quant kind = V41Quant::kFp8Window;
  bool clamp_scale = false;
};
Status launch_v41_quant(const V41QuantParams& p, cudaStream_t stream);

// Ratio-r compressor pooling (V41CpuModel::compress): entry g pools the rows member_refs[g * r +
// i] (key references of [kv (d) | score (d)] rows: pool or local), per channel c:
// out[g, c] = sum_i softmax_i(score_i[c]) * kv_i[c] (max, then exp sums in member order).
struct V41PoolParams {
  int64_t entries = 0;
  int64_t ratio = 0;  // <= 16
  int64_t d = 0;
  const float* pool = nullptr;
  const float* local = nullptr;
  const int64_t* member_refs = nullptr;  // [entries, ratio]
  float* out = nullptr;                  // [entries, d]
};
Status launch_v41_pool(const V41PoolParams& p, cudaStream_t stream);

// Candidate blocks of the candidate source (spec §3.6 step 5): per query q, block b of
// block_size keys scores max(scores[q, g]) over g < min(visible[q], n_keys) in the block (-inf
// when none), capped at the largest finite bf16 with cap_bf16; the block holding key visible-1
// gets +inf. out [nq, n_blocks].
struct V41BlockScoreParams {
  const float* scores = nullptr;  // [nq, ld]
  int64_t ld = 0;
  const int64_t* visible = nullptr;  // [nq]
  int64_t nq = 0;
  int64_t n_keys = 0;
  int64_t block_size = 8;
  bool cap_bf16 = false;
  float* out = nullptr;  // [nq, ceil(n_keys / block_size)]
};
Status launch_v41_block_scores(const V41BlockScoreParams& p, cudaStream_t stream);

// The candidate pool as a key mask: keep[q, g] = 1 for g < n_keys in a block listed in
// blocks[q, 0 .. k) whose block score is not -inf (the blocks top-k), else 0.
struct V41PoolMaskParams {
  const int32_t* blocks = nullptr;      // [nq, k] (-1 = none)
  const float* block_scores = nullptr;  // [nq, n_blocks]
  int64_t nq = 0;
  int64_t k = 0;
  int64_t n_blocks = 0;
  int64_t n_keys = 0;
  int64_t block_size = 8;
  uint8_t* keep = nullptr;  // [nq, n_keys]
};
Status launch_v41_pool_mask(const V41PoolMaskParams& p, cudaStream_t stream);

// scores[q, g] = -inf where keep[q, g] == 0 (g < n_keys): a reindex layer scores only inside the
// candidate pool.
struct V41ApplyMaskParams {
  float* scores = nullptr;  // [nq, ld]
  int64_t ld = 0;
  const uint8_t* keep = nullptr;  // [nq, n_keys]
  int64_t nq = 0;
  int64_t n_keys = 0;
};
Status launch_v41_apply_mask(const V41ApplyMaskParams& p, cudaStream_t stream);

// Drops the selections of no key: idx[q, j] = -1 where scores[q, idx] is -inf (the CPU keeps
// only selected scores above -inf).
struct V41DropEmptyParams {
  int32_t* idx = nullptr;  // [nq, k]
  int64_t nq = 0;
  int64_t k = 0;
  const float* scores = nullptr;  // [nq, ld]
  int64_t ld = 0;
};
Status launch_v41_drop_empty(const V41DropEmptyParams& p, cudaStream_t stream);

// y[i] = y[i] / div + (add ? add[i] : 0) over n values (router logits divided by gate_temp, the
// shared expert added after the routed sum; div 1 is exact).
struct V41AxpyParams {
  float* y = nullptr;
  const float* add = nullptr;
  float div = 1.0f;
  int64_t n = 0;
};
Status launch_v41_axpy(const V41AxpyParams& p, cudaStream_t stream);

// Engram gate (V41CpuModel::engram) per token t and stream k: with key K_k = kv[t, k] and value
// V = kv[t, hc], d = sum_i x_k[i] * qk[k, i] * K_k[i] * rstd(x_k) * rstd(K_k) / sqrt(hidden),
// g = sigmoid(sign(d) sqrt(max(|d|, 1e-6))), x_k += g V (in place). rstd from sums of squares
// in double; the d sum in double too (the CPU sums its float products serially in float).
struct V41EngramGateParams {
  float* x = nullptr;         // [n, hc, hidden]
  const float* kv = nullptr;  // [n, hc + 1, hidden]
  const float* qk = nullptr;  // [hc, hidden]: q_weight * k_weight
  int64_t n = 0;
  int64_t hc = 4;
  int64_t hidden = 0;
  float eps = 1e-20f;
};
Status launch_v41_engram_gate(const V41EngramGateParams& p, cudaStream_t stream);

// Rows of an Engram table in device memory, dequantised to fp32 as model_v41::EngramTable::row
// does on the host (bit-identical): out[i, c] = e4m3(data[rows[i], c]) * e8m0(scale[rows[i],
// c / 32]) for a scaled FP8 table (a NaN operand comes out with its own bits, the scale's when
// both are NaN, as the host build's multiply gives it), else the element of `data` (dtype F32,
// F16, BF16 or F8_E4M3) as fp32. Row ids must lie in [0, table_rows) (the caller checks them on the
// host).
struct V41EngramGatherParams {
  const void* data = nullptr;      // [table_rows, dim] elements of `dtype`
  const uint8_t* scale = nullptr;  // fp8: [table_rows, dim / 32] E8M0 bytes
  bool fp8 = false;
  int dtype = 0;  // DType of `data` when !fp8 (as model_v41::EngramTable::data_dtype)
  int64_t table_rows = 0;
  int64_t dim = 0;                // fp8: a multiple of 32
  const int64_t* rows = nullptr;  // [n]
  int64_t n = 0;
  float* out = nullptr;  // [n, dim]
};
Status launch_v41_engram_gather(const V41EngramGatherParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
