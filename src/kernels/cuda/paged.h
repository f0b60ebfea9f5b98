// Paged-state addressing on the GPU (attention.h explains key references): scattering rows into
// pool pages (ring slots, final residual streams) and turning per-query row indices (the
// indexer's top-k) into key references through a page table, so the CUDA forward never needs a
// host round trip between the indexer and attention.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"

namespace dsinfer::cuda {

// Row t of src ([n, ld_src], the first `width` values) is copied to the row at key reference
// dest_refs[t] (pool or local; kKvRefNone rows are skipped). Destinations must not overlap.
struct ScatterRowsParams {
  const float* src = nullptr;
  int64_t n = 0;
  int64_t width = 0;
  int64_t ld_src = 0;  // 0: width
  float* pool = nullptr;
  float* local = nullptr;
  const int64_t* dest_refs = nullptr;  // [n]
};
Status launch_scatter_rows(const ScatterRowsParams& p, cudaStream_t stream);

// dst row t ([n, width], dense) = the row at key reference src_refs[t] (pool or local);
// kKvRefNone gives a zero row.
struct GatherRowsParams {
  const float* pool = nullptr;
  const float* local = nullptr;
  const int64_t* src_refs = nullptr;  // [n]
  int64_t n = 0;
  int64_t width = 0;
  float* dst = nullptr;
};
Status launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream);

// For query q and j < k: idx = indices[q * k + j];
//   out[out_begin[q] + j] = idx < 0 ? kKvRefNone
//                           : pages[page_begin[q] + idx / rows_per_page] * page_floats +
//                             (idx % rows_per_page) * width.
struct RefsFromIndicesParams {
  const int32_t* indices = nullptr;  // [nq, k]
  int64_t nq = 0;
  int64_t k = 0;
  const int32_t* pages = nullptr;
  const int64_t* page_begin = nullptr;  // [nq]
  int64_t rows_per_page = 0;
  int64_t page_floats = 0;
  int64_t width = 0;
  const int64_t* out_begin = nullptr;  // [nq]
  int64_t* out = nullptr;
};
Status launch_refs_from_indices(const RefsFromIndicesParams& p, cudaStream_t stream);

// The attention key lists of a pass, expanded on the device from page tables instead of copied
// from the host (an 8k-token prefill has millions of keys). Row r of span s (first position
// span_pos[3s], first row span_pos[3s + 1], window floor span_pos[3s + 2]) at position p0 gets,
// from key_begin[r] of each layer, its window keys p = max(0, p0 - window + 1) .. p0 — the ring
// row p % ring_capacity through the span's ring page table for p before the span (kKvRefNone for
// p below the floor: ring rows never written), the local row (first row + p - first) * width
// (key reference -2 - offset) otherwise — and then, in HCA layers, entries 0 .. (p0 + 1) /
// hca_ratio - 1 through the span's entry page table. CSA selection slots are left to
// refs_from_indices; padding rows (row_span -1) are skipped.
struct ExpandKeysLayer {
  int64_t* out = nullptr;  // key_refs
  const int64_t* key_begin = nullptr;
  const int32_t* ring_pages = nullptr;
  const int32_t* ring_page_begin = nullptr;  // [spans]
  const int32_t* hca_pages = nullptr;        // null: no entries
  const int32_t* hca_page_begin = nullptr;   // [spans]
  int32_t hca_ratio = 0;
  int32_t ring_capacity = 0;
  int32_t ring_rows_per_page = 0;
  int32_t entry_rows_per_page = 0;
};
inline constexpr int kExpandKeysMaxLayers = 24;  // per launch (kernel parameter space)
inline constexpr int kExpandKeysSpanWidth = 3;   // span_pos columns
struct ExpandKeysParams {
  int64_t rows = 0;
  const int32_t* row_span = nullptr;  // [rows]
  const int64_t* span_pos = nullptr;  // [spans, kExpandKeysSpanWidth]
  int64_t window = 0;
  int64_t width = 0;  // floats per key row
  int64_t page_floats = 0;
  int n_layers = 0;
  ExpandKeysLayer layers[kExpandKeysMaxLayers];
};
Status launch_expand_keys(const ExpandKeysParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
