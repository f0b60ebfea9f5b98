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

}  // namespace dsinfer::cuda
