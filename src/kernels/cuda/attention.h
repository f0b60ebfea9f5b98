// Attention-side kernels of the forward pass (spec §3.4-3.8) on the GPU: sink attention over
// per-query key lists (sliding window, CSA, HCA; prefill and decode are the same op), the
// compressors (token rows -> pooled entries), the Lightning indexer's scores and the per-query
// top-k. Keys are fp32 rows, or (deepseek numerics) the storage records of numeric/records.h.
//
// Addressing the engine's paged state. The state manager's PageArena is mirrored on the device
// as one pool of pages (`pool`, page_floats floats per page); a PagedRows row i of a sequence
// lives at element offset pages[i / rows_per_page] * page_floats + (i % rows_per_page) * width.
// Ops that read rows of several kinds (attention keys: window ring + compressed entries + the
// chunk's own new rows) take *key references*: int64 element offsets, either into the pool
// (ref >= 0) or into a chunk-local buffer (ref = kv_ref_local(offset) <= -2); kKvRefNone (-1)
// marks an empty slot that contributes nothing. The engine builds these lists from its page
// tables; the kernels never see engine types.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"

namespace dsinfer::cuda {

inline constexpr int64_t kKvRefNone = -1;
constexpr int64_t kv_ref_pool(int64_t elem_offset) {
  return elem_offset;
}
constexpr int64_t kv_ref_local(int64_t elem_offset) {
  return -2 - elem_offset;
}
// Element offset of row i of a PagedRows in the pool.
constexpr int64_t paged_row_offset(
    const int32_t* pages, int64_t rows_per_page, int64_t page_floats, int64_t width, int64_t i) {
  return static_cast<int64_t>(pages[i / rows_per_page]) * page_floats + (i % rows_per_page) * width;
}

inline constexpr int64_t kMaxAttnDim = 512;

// Per query q and head h (cpu::attention_with_sink):
//   l_j = (q_h . k_j) * scale over the query's keys j (K = V rows of `dim` floats),
//   out_h = sum_j exp(l_j - m) k_j / (sum_j exp(l_j - m) + exp(sink_h - m)), m = max(sink_h, l).
// Query q's keys are key_refs[key_begin[q] .. key_begin[q+1]) (CSR). No keys: out = 0.
// With bf16_operands (`deepseek` numerics), cpu::attention_with_sink_bf16 instead: q rounded to
// BF16, probabilities 2^(u_j - M) rounded to BF16 for P.V against an integer (power-of-two)
// reference M, the denominator from the unrounded ones. The keys must be BF16 values already
// (the deepseek KV rows are); the tensor-core path rounds them to BF16 on the way in.
struct SinkAttentionParams {
  const float* q = nullptr;  // [nq, heads, dim]
  int64_t nq = 0;
  int64_t heads = 0;
  int64_t dim = 0;  // <= kMaxAttnDim
  const float* pool = nullptr;
  const float* local = nullptr;
  const int64_t* key_begin = nullptr;  // [nq + 1]
  const int64_t* key_refs = nullptr;
  const float* sinks = nullptr;  // [heads]
  float scale = 1.0f;
  float* out = nullptr;  // [nq, heads, dim]
  // Tensor-core path (attention_mma.cu: heads <= 64, dim in {64, 128, 256, 512}): BF16 MMAs over
  // the high and low BF16 halves of q, k and the probabilities (hi*hi + hi*lo + lo*hi, fp32
  // accumulation: ~2^-17 relative per product). Off: the one-warp-per-key kernel above.
  bool tensor_cores = true;
  // Split-KV scratch for few queries (decode): each query's keys are split over up to
  // sink_attention_splits(nq) blocks whose partial states are merged by a second kernel. Null or
  // too small (sink_attention_scratch_floats): one block per query.
  float* split_scratch = nullptr;
  int64_t split_scratch_floats = 0;
  // Dims [0, exact_dims) of every key are exactly BF16 values (the FP8-simulated no-RoPE dims of
  // `deepseek` numerics): their low halves are zero, and the tensor-core path skips those MMAs.
  int64_t exact_dims = 0;
  // BF16 q, keys and probabilities as DeepSeek's kernel has them (see above). The tensor-core
  // path then keeps q and the key tile in BF16 only and does one MMA per product; exact_dims is
  // not used.
  bool bf16_operands = false;
  // q already rounded to BF16 (RNE bits, [nq, heads, dim]), read instead of `q` (which may then
  // be null): half the bytes, copied into shared memory without conversion, the next query's
  // while this one's keys are processed. Only where sink_attention_reads_q_bf16.
  const uint16_t* q_bf16 = nullptr;
  // BF16 output (only where sink_attention_writes_bf16): each head's last 2 * rope_half dims turned
  // back by RoPE at the query's position (launch_rope's inverse: the same fp32 operations), then
  // every value rounded to BF16 (RNE) into out_bf16 = [nq, out_bf16_ld] (head h at h * dim), `out`
  // unused (may be null). What the deepseek path feeds wo_a, written by the attention itself
  // instead of fp32 out + the inverse RoPE + the BF16 split (8k prefill: a 1 GiB fp32 round trip
  // per layer).
  uint16_t* out_bf16 = nullptr;
  int64_t out_bf16_ld = 0;             // >= heads * dim
  const int64_t* positions = nullptr;  // [nq]
  const float* inv_freq = nullptr;     // [rope_half]
  int64_t rope_half = 0;
  // fp32 `out` finished the same way (only where sink_attention_finishes_out): the inverse RoPE
  // of each head's last 2 * rope_half dims (positions, inv_freq) and every value rounded to BF16
  // (kept as fp32), by the kernel that merges the key splits: what launch_rope's inverse and a
  // BF16 launch_quant_sim over `out` would give, without their two launches (decode).
  bool finish_out = false;
  // Keys stored as KV records (numeric/records.h), in the pool and the local buffer alike: a key
  // reference is the float offset of a record of kv_record_floats(dim, record_rope_dim) floats.
  // Only with bf16_operands (a record's values are BF16 values); the outputs equal those over the
  // fp32 rows the records decode to, bit for bit.
  bool kv_records = false;
  int64_t record_rope_dim = 0;
};
Status launch_sink_attention(const SinkAttentionParams& p, cudaStream_t stream);
// Whether launch_sink_attention takes out_bf16 for these parameters: the wgmma path
// (sink_attention_reads_q_bf16's conditions, builds with CUTLASS) when each query is one block
// (no key splits: prefill-sized nq, or no split scratch).
bool sink_attention_writes_bf16(const SinkAttentionParams& p);
// Whether launch_sink_attention takes finish_out for these parameters: the tensor-core path with
// key splits (few queries, split scratch given), 2 * rope_half <= dim and the RoPE tables.
bool sink_attention_finishes_out(const SinkAttentionParams& p);
// Whether launch_sink_attention takes q_bf16 for these parameters (the wgmma path: bf16_operands,
// dim 512, heads <= 64, in builds with CUTLASS).
bool sink_attention_reads_q_bf16(const SinkAttentionParams& p);

// Splits of the key list per query that launch_sink_attention uses for nq queries, and the floats
// of split_scratch that takes (0 when it does not split).
int64_t sink_attention_splits(int64_t nq);
int64_t sink_attention_scratch_floats(int64_t nq, int64_t heads, int64_t dim);

// Compressor token rows (state::CompressorRows layout): row of position pos = [kv | score] with
// score = gate logits + ape[pos % ratio]; written to dest_refs[t] (a key reference of the
// 2*width-float row).
struct CompressorAppendParams {
  const float* kv = nullptr;           // [n, width] (wkv x)
  const float* score = nullptr;        // [n, width] (wgate x)
  const float* ape = nullptr;          // [ratio, width]
  const int64_t* positions = nullptr;  // [n]
  int64_t n = 0;
  int64_t width = 0;
  int64_t ratio = 0;
  float* pool = nullptr;
  float* local = nullptr;
  const int64_t* dest_refs = nullptr;  // [n]
};
Status launch_compressor_append(const CompressorAppendParams& p, cudaStream_t stream);

enum class CompressorPost { kNone, kKvFp8, kIndexFp4 };

// Pools closed blocks into entries (spec §3.6, the CPU's compress_chunk): per channel c < d, a
// softmax over the candidates' scores weights their kv values. Candidates of entry e are the
// rows token_refs[e, :]: with overlap (CSA), the previous block's m rows (channel c; kKvRefNone
// for block 0) then the own block's m rows (channel d + c); without (HCA) the own block's m rows
// (channel c). Then RMSNorm (norm_weight, eps), RoPE at position block[e] * ratio on the last
// 2*rope_half dims, and the storage simulation: kKvFp8 = FP8 1x64 on [0, d - 2*rope_half) and
// BF16 on the RoPE dims,
// kIndexFp4 = Hadamard over d, FP4 1x32. Entry e is written to out + out_offsets[e] (or e * d):
// d floats, or with `records` its record (numeric/records.h: a KV record for kKvFp8, an index-key
// record for kIndexFp4, padded to whole floats) of the same values.
// An entry with block[e] < 0 is skipped (nothing read or written): fixed-size launches captured
// in CUDA graphs pass every potential entry and mark the ones that do not close.
struct CompressorPoolParams {
  int64_t n_entries = 0;
  int64_t ratio = 0;  // m <= 128
  int64_t d = 0;      // entry width, <= 512 (a power of two with kIndexFp4)
  bool overlap = false;
  const float* pool = nullptr;
  const float* local = nullptr;
  const int64_t* token_refs = nullptr;  // [n_entries, (overlap ? 2 : 1) * ratio]
  const int64_t* block = nullptr;       // [n_entries] block index w
  const float* norm_weight = nullptr;   // [d]
  float eps = 1e-6f;
  const float* inv_freq = nullptr;  // [rope_half]
  int64_t rope_half = 0;
  CompressorPost post = CompressorPost::kNone;
  float* out = nullptr;
  const int64_t* out_offsets = nullptr;  // [n_entries] or null
  bool records = false;                  // kKvFp8 / kIndexFp4 only
};
Status launch_compressor_pool(const CompressorPoolParams& p, cudaStream_t stream);

// Lightning-indexer scores (spec §3.8 step 4, as the CPU forward computes them):
//   score[q, w] = sum_h (head_w[q, h] * w_scale) * max(0, q_h . key_w)   for w < visible[q],
// summed serially in fp32 in the CPU's order (bit-identical to it). The keys of query q are the
// rows of its sequence's index-key PagedRows: page table pages[page_begin[q] ...].
struct IndexerScoreParams {
  const float* q = nullptr;       // [nq, heads, dim] (after RoPE, Hadamard, FP4 simulation)
  const float* head_w = nullptr;  // [nq, heads] (weights_proj x)
  float w_scale = 1.0f;           // 1/sqrt(dim)/sqrt(heads)
  int64_t nq = 0;
  int64_t heads = 0;
  int64_t dim = 0;  // heads * dim <= 16384
  const float* pool = nullptr;
  int64_t page_floats = 0;
  int64_t rows_per_page = 0;
  const int32_t* pages = nullptr;
  const int64_t* page_begin = nullptr;  // [nq]
  const int64_t* visible = nullptr;     // [nq]
  int64_t max_visible = 0;              // >= every visible[q] (grid size)
  float* scores = nullptr;              // [nq, ld]
  int64_t ld = 0;
  // Tensor-core path (heads <= 64, dim in {64, 128}): q . key on BF16 MMAs, then the serial
  // head sum above. With bf16_exact (every q and key value exactly a BF16 value, as the FP4
  // simulation of `deepseek` numerics makes them) one MMA per product, and the dots are exact
  // whenever every partial sum is an fp32 value (FP4 products on 1x32 UE8M0 grids: unless the
  // 32-blocks' scales are 2^10 apart); otherwise the high and low BF16 halves (~2^-17 relative
  // per product).
  bool tensor_cores = true;
  bool bf16_exact = false;
  // bf16_exact, dim 128, at least kIndexerGroupMinQueries queries (prefill): several queries per
  // block share each key tile (the same scores, bit for bit; false: one query per block).
  bool group_queries = true;
  // Keys stored as index-key records (numeric/records.h) in rows of row_floats floats
  // (index_key_record_floats(dim)); only with bf16_exact. The scores equal those over the fp32
  // rows the records decode to, bit for bit.
  bool key_records = false;
  int64_t row_floats = 0;  // 0: dim (fp32 rows)
};
inline constexpr int64_t kIndexerGroupMinQueries = 64;
Status launch_indexer_scores(const IndexerScoreParams& p, cudaStream_t stream);

inline constexpr int64_t kMaxTopK = 2048;

// Per query: the indices of the min(k, n[q]) largest scores[q, 0 .. n[q]), ordered by descending
// score, ties towards the lower index (cpu::top_k_indices); slots past n[q] are -1. k <= 2048.
struct TopKParams {
  const float* scores = nullptr;  // [nq, ld]
  int64_t ld = 0;
  const int64_t* n = nullptr;  // [nq]
  int64_t nq = 0;
  int64_t k = 0;
  int32_t* out = nullptr;  // [nq, k]
};
Status launch_top_k(const TopKParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
