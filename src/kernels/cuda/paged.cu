// Paged-state addressing kernels (paged.h).
#include <algorithm>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/paged.h"
#include "kernels/cuda/pdl.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int64_t kMaxGrid = 65535;

// Row copies: block (x, y) copies the y-th slab of kCopySlab values of rows x, x + gridDim.x, ...;
// each thread loads its kCopyPer values of the slab before storing any (the compiler cannot hoist
// a load above a store to a pointer that may alias it: one load round trip per value made a 64 KiB
// row, the mHC streams of a decode token, cost 51 us in one block).
constexpr int kCopyThreads = 256;
constexpr int kCopyPer = 8;
constexpr int64_t kCopySlab = kCopyThreads * kCopyPer;

__device__ __forceinline__ void copy_slab(float* dst, const float* src, int64_t width) {
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kCopySlab + threadIdx.x;
  float v[kCopyPer];
#pragma unroll
  for (int k = 0; k < kCopyPer; ++k) {
    const int64_t c = c0 + k * kCopyThreads;
    v[k] = src != nullptr && c < width ? src[c] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kCopyPer; ++k) {
    const int64_t c = c0 + k * kCopyThreads;
    if (c < width)
      dst[c] = v[k];
  }
}

__global__ void __launch_bounds__(kCopyThreads) scatter_rows_kernel(ScatterRowsParams p) {
  pdl_begin();
  const int64_t ld = p.ld_src > 0 ? p.ld_src : p.width;
  for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x) {
    float* dst = kv_ref_mut(p.pool, p.local, p.dest_refs[t]);
    if (dst != nullptr)  // block-uniform
      copy_slab(dst, p.src + t * ld, p.width);
  }
}

__global__ void __launch_bounds__(kCopyThreads) gather_rows_kernel(GatherRowsParams p) {
  pdl_begin();
  for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x)
    copy_slab(p.dst + t * p.width, kv_ref_ptr(p.pool, p.local, p.src_refs[t]), p.width);
}

dim3 copy_grid(int64_t n, int64_t width) {
  return dim3(static_cast<unsigned>(std::min(n, kMaxGrid)),
              static_cast<unsigned>(ceil_div(width, kCopySlab)));
}

__global__ void refs_from_indices_kernel(RefsFromIndicesParams p) {
  pdl_begin();
  for (int64_t q = blockIdx.x; q < p.nq; q += gridDim.x) {
    const int32_t* pages = p.pages + p.page_begin[q];
    int64_t* out = p.out + p.out_begin[q];
    for (int64_t j = threadIdx.x; j < p.k; j += blockDim.x) {
      const int64_t idx = p.indices[q * p.k + j];
      out[j] = idx < 0 ? kKvRefNone
                       : static_cast<int64_t>(pages[idx / p.rows_per_page]) * p.page_floats +
                             (idx % p.rows_per_page) * p.width;
    }
  }
}

__device__ __forceinline__ int64_t paged_ref(
    const int32_t* pages, int64_t row, int64_t rows_per_page, int64_t page_floats, int64_t width) {
  return static_cast<int64_t>(pages[row / rows_per_page]) * page_floats +
         (row % rows_per_page) * width;
}

__global__ void expand_keys_kernel(ExpandKeysParams p) {
  pdl_begin();
  const ExpandKeysLayer& L = p.layers[blockIdx.y];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const int32_t s = p.row_span[r];
    if (s < 0)
      continue;  // block-uniform
    const int64_t first = p.span_pos[kExpandKeysSpanWidth * s];
    const int64_t row0 = p.span_pos[kExpandKeysSpanWidth * s + 1];
    const int64_t floor = p.span_pos[kExpandKeysSpanWidth * s + 2];
    const int64_t p0 = first + (r - row0);
    const int64_t lo = p0 - p.window + 1 > 0 ? p0 - p.window + 1 : 0;
    const int64_t nw = p0 - lo + 1;
    const int64_t vis = L.hca_ratio > 0 ? (p0 + 1) / L.hca_ratio : 0;
    int64_t* out = L.out + L.key_begin[r];
    const int32_t* ring = L.ring_pages + L.ring_page_begin[s];
    for (int64_t j = threadIdx.x; j < nw + vis; j += blockDim.x) {
      int64_t ref;
      if (j < nw) {
        const int64_t pos = lo + j;
        if (pos >= first)
          ref = -2 - (row0 + pos - first) * p.width;
        else if (pos < floor)
          ref = kKvRefNone;  // a ring row never written
        else
          ref =
              paged_ref(ring, pos % L.ring_capacity, L.ring_rows_per_page, p.page_floats, p.width);
      } else {
        ref = paged_ref(L.hca_pages + L.hca_page_begin[s],
                        j - nw,
                        L.entry_rows_per_page,
                        p.page_floats,
                        p.width);
      }
      out[j] = ref;
    }
  }
}

}  // namespace

Status launch_expand_keys(const ExpandKeysParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("expand_keys", {p.rows, p.window, p.width, p.page_floats}));
  DSI_RETURN_IF_ERROR(require(p.n_layers >= 0 && p.n_layers <= kExpandKeysMaxLayers,
                              "expand_keys",
                              "too many layers for one launch"));
  if (p.rows == 0 || p.n_layers == 0)
    return Status();
  if (!p.row_span || !p.span_pos)
    return null_pointer("expand_keys");
  for (int l = 0; l < p.n_layers; ++l) {
    const ExpandKeysLayer& L = p.layers[l];
    if (!L.out || !L.key_begin || !L.ring_pages || !L.ring_page_begin ||
        (L.hca_ratio > 0 && (!L.hca_pages || !L.hca_page_begin)))
      return null_pointer("expand_keys");
    DSI_RETURN_IF_ERROR(require(L.ring_capacity > 0 && L.ring_rows_per_page > 0 &&
                                    L.entry_rows_per_page > 0 && L.hca_ratio >= 0,
                                "expand_keys",
                                "bad ring or entry geometry"));
  }
  const dim3 grid(static_cast<unsigned>(std::min(p.rows, kMaxGrid)),
                  static_cast<unsigned>(p.n_layers));
  launch_pdl(expand_keys_kernel, grid, 128, 0, stream, p);
  return launched("expand_keys launch");
}

Status launch_scatter_rows(const ScatterRowsParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("scatter_rows", {p.n, p.width, p.ld_src}));
  DSI_RETURN_IF_ERROR(
      require(p.ld_src == 0 || p.ld_src >= p.width, "scatter_rows", "ld_src < width"));
  if (p.n == 0 || p.width == 0)
    return Status();
  if (!p.src || !p.dest_refs)
    return null_pointer("scatter_rows");
  DSI_RETURN_IF_ERROR(
      require(ceil_div(p.width, kCopySlab) <= kMaxGrid, "scatter_rows", "rows too wide"));
  launch_pdl(scatter_rows_kernel, copy_grid(p.n, p.width), kCopyThreads, 0, stream, p);
  return launched("scatter_rows launch");
}

Status launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("gather_rows", {p.n, p.width}));
  if (p.n == 0 || p.width == 0)
    return Status();
  if (!p.src_refs || !p.dst)
    return null_pointer("gather_rows");
  DSI_RETURN_IF_ERROR(
      require(ceil_div(p.width, kCopySlab) <= kMaxGrid, "gather_rows", "rows too wide"));
  launch_pdl(gather_rows_kernel, copy_grid(p.n, p.width), kCopyThreads, 0, stream, p);
  return launched("gather_rows launch");
}

Status launch_refs_from_indices(const RefsFromIndicesParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("refs_from_indices", {p.nq, p.k, p.width}));
  if (p.nq == 0 || p.k == 0)
    return Status();
  DSI_RETURN_IF_ERROR(require(p.rows_per_page > 0 && p.page_floats >= p.rows_per_page * p.width,
                              "refs_from_indices",
                              "bad page geometry"));
  if (!p.indices || !p.pages || !p.page_begin || !p.out_begin || !p.out)
    return null_pointer("refs_from_indices");
  launch_pdl(
      refs_from_indices_kernel, static_cast<unsigned>(std::min(p.nq, kMaxGrid)), 128, 0, stream, p);
  return launched("refs_from_indices launch");
}

}  // namespace dsinfer::cuda
