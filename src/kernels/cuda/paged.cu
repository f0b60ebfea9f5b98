// Paged-state addressing kernels (paged.h).
#include <algorithm>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/paged.h"

namespace dsinfer::cuda {
namespace {

constexpr int64_t kMaxGrid = 65535;

__global__ void scatter_rows_kernel(ScatterRowsParams p) {
  const int64_t ld = p.ld_src > 0 ? p.ld_src : p.width;
  for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x) {
    float* dst = kv_ref_mut(p.pool, p.local, p.dest_refs[t]);
    if (dst == nullptr)
      continue;  // block-uniform
    const float* src = p.src + t * ld;
    for (int64_t c = threadIdx.x; c < p.width; c += blockDim.x) dst[c] = src[c];
  }
}

__global__ void gather_rows_kernel(GatherRowsParams p) {
  for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x) {
    const float* src = kv_ref_ptr(p.pool, p.local, p.src_refs[t]);
    float* dst = p.dst + t * p.width;
    for (int64_t c = threadIdx.x; c < p.width; c += blockDim.x) dst[c] = src ? src[c] : 0.0f;
  }
}

__global__ void refs_from_indices_kernel(RefsFromIndicesParams p) {
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

}  // namespace

Status launch_scatter_rows(const ScatterRowsParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("scatter_rows", {p.n, p.width, p.ld_src}));
  DSI_RETURN_IF_ERROR(
      require(p.ld_src == 0 || p.ld_src >= p.width, "scatter_rows", "ld_src < width"));
  if (p.n == 0 || p.width == 0)
    return Status();
  if (!p.src || !p.dest_refs)
    return null_pointer("scatter_rows");
  scatter_rows_kernel<<<static_cast<unsigned>(std::min(p.n, kMaxGrid)), 128, 0, stream>>>(p);
  return launched("scatter_rows launch");
}

Status launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("gather_rows", {p.n, p.width}));
  if (p.n == 0 || p.width == 0)
    return Status();
  if (!p.src_refs || !p.dst)
    return null_pointer("gather_rows");
  gather_rows_kernel<<<static_cast<unsigned>(std::min(p.n, kMaxGrid)), 128, 0, stream>>>(p);
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
  refs_from_indices_kernel<<<static_cast<unsigned>(std::min(p.nq, kMaxGrid)), 128, 0, stream>>>(p);
  return launched("refs_from_indices launch");
}

}  // namespace dsinfer::cuda
