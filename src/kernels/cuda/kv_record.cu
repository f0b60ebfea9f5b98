// Pack/unpack of the state records (kv_record.h): one warp per 64-dim (KV) or 32-dim (index
// key) quantisation block (kv_record.cuh), the same arithmetic as numeric/quant.cc.
#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_record.cuh"
#include "kernels/cuda/kv_record.h"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/quant.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65535;

__global__ void kv_record_pack_kernel(KvRecordPackParams p) {
  const int64_t rec = kv_record_bytes(p.dim, p.rope_dim);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    rec::pack_kv_row(
        p.x + r * p.dim, p.dim, p.rope_dim, p.out + (p.out_offsets ? p.out_offsets[r] : r * rec));
  }
}

__global__ void kv_record_unpack_kernel(KvRecordUnpackParams p) {
  const int64_t nope = p.dim - p.rope_dim;
  const int64_t rec = kv_record_bytes(p.dim, p.rope_dim);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const uint8_t* o = p.records + (p.offsets ? p.offsets[r] : r * rec);
    const uint8_t* scales = o + nope + 2 * p.rope_dim;
    const uint16_t* rope = reinterpret_cast<const uint16_t*>(o + nope);
    float* out = p.out + r * p.dim;
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
      out[i] = i < nope ? numeric::fp8_e4m3_to_f32(o[i]) * numeric::e8m0_to_f32(scales[i / 64])
                        : numeric::bf16_to_f32(rope[i - nope]);
    }
  }
}

__global__ void index_key_pack_kernel(IndexKeyPackParams p) {
  const int64_t rec = index_key_record_bytes(p.dim);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    rec::pack_index_key_row(
        p.x + r * p.dim, p.dim, p.out + (p.out_offsets ? p.out_offsets[r] : r * rec), rec);
  }
}

__global__ void index_key_unpack_kernel(IndexKeyUnpackParams p) {
  const int64_t rec = index_key_record_bytes(p.dim);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const uint8_t* o = p.records + (p.offsets ? p.offsets[r] : r * rec);
    float* out = p.out + r * p.dim;
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
      out[i] = numeric::fp4_packed_get(o, i) * numeric::e8m0_to_f32(o[p.dim / 2 + i / 32]);
    }
  }
}

Status check_kv(int64_t rows, int64_t dim, int64_t rope_dim, const char* what) {
  DSI_RETURN_IF_ERROR(check_nonneg(what, {rows, dim, rope_dim}));
  return require(rope_dim <= dim && (dim - rope_dim) % 64 == 0,
                 what,
                 "nope dims (dim - rope_dim) must be a non-negative multiple of 64");
}

unsigned blocks_for(int64_t rows) {
  return static_cast<unsigned>(std::min(rows, kMaxGrid));
}

}  // namespace

Status launch_kv_record_pack(const KvRecordPackParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_kv(p.rows, p.dim, p.rope_dim, "kv_record_pack"));
  if (p.rows == 0 || p.dim == 0)
    return Status();
  if (!p.x || !p.out)
    return null_pointer("kv_record_pack");
  kv_record_pack_kernel<<<blocks_for(p.rows), kThreads, 0, stream>>>(p);
  return launched("kv_record_pack launch");
}

Status launch_kv_record_unpack(const KvRecordUnpackParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_kv(p.rows, p.dim, p.rope_dim, "kv_record_unpack"));
  if (p.rows == 0 || p.dim == 0)
    return Status();
  if (!p.records || !p.out)
    return null_pointer("kv_record_unpack");
  kv_record_unpack_kernel<<<blocks_for(p.rows), kThreads, 0, stream>>>(p);
  return launched("kv_record_unpack launch");
}

Status launch_index_key_pack(const IndexKeyPackParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("index_key_pack", {p.rows, p.dim}));
  DSI_RETURN_IF_ERROR(require(p.dim % 32 == 0, "index_key_pack", "dim must be a multiple of 32"));
  if (p.rows == 0 || p.dim == 0)
    return Status();
  if (!p.x || !p.out)
    return null_pointer("index_key_pack");
  index_key_pack_kernel<<<blocks_for(p.rows), kThreads, 0, stream>>>(p);
  return launched("index_key_pack launch");
}

Status launch_index_key_unpack(const IndexKeyUnpackParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("index_key_unpack", {p.rows, p.dim}));
  DSI_RETURN_IF_ERROR(require(p.dim % 32 == 0, "index_key_unpack", "dim must be a multiple of 32"));
  if (p.rows == 0 || p.dim == 0)
    return Status();
  if (!p.records || !p.out)
    return null_pointer("index_key_unpack");
  index_key_unpack_kernel<<<blocks_for(p.rows), kThreads, 0, stream>>>(p);
  return launched("index_key_unpack launch");
}

}  // namespace dsinfer::cuda
