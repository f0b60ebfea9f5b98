// Pack / unpack kernels of the state records (numeric/records.h has the layouts). Pack kernels
// write record r at out + out_offsets[r] (bytes; null: r * record bytes) so records can go
// straight into state pages; unpack kernels read them back to fp32 rows. The nope dims hold
// exactly numeric::fp8_block_simulate(row, nope, 64) (codes and scales of fp8_block_quantize),
// the rope dims the row rounded to bf16, an index key exactly numeric::fp4_block_simulate(row,
// dim, 32) of the (Hadamard-rotated) key; packing a row that already holds those values gives
// the same values back (the quantisers are idempotent).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "numeric/records.h"

namespace dsinfer::cuda {

using numeric::index_key_record_bytes;
using numeric::kv_record_bytes;

struct KvRecordPackParams {
  const float* x = nullptr;  // [rows, dim] post-RoPE K=V rows (before any simulation)
  int64_t rows = 0;
  int64_t dim = 512;
  int64_t rope_dim = 64;
  uint8_t* out = nullptr;
  const int64_t* out_offsets = nullptr;  // [rows] byte offsets, 8-byte multiples; or null
};
Status launch_kv_record_pack(const KvRecordPackParams& p, cudaStream_t stream);

struct KvRecordUnpackParams {
  const uint8_t* records = nullptr;
  const int64_t* offsets = nullptr;  // [rows] byte offsets or null
  int64_t rows = 0;
  int64_t dim = 512;
  int64_t rope_dim = 64;
  float* out = nullptr;  // [rows, dim]
};
Status launch_kv_record_unpack(const KvRecordUnpackParams& p, cudaStream_t stream);

struct IndexKeyPackParams {
  const float* x = nullptr;  // [rows, dim] Hadamard-rotated keys (simulated or not)
  int64_t rows = 0;
  int64_t dim = 128;  // a multiple of 32
  uint8_t* out = nullptr;
  const int64_t* out_offsets = nullptr;  // [rows] byte offsets or null
};
Status launch_index_key_pack(const IndexKeyPackParams& p, cudaStream_t stream);

struct IndexKeyUnpackParams {
  const uint8_t* records = nullptr;
  const int64_t* offsets = nullptr;
  int64_t rows = 0;
  int64_t dim = 128;
  float* out = nullptr;  // [rows, dim]
};
Status launch_index_key_unpack(const IndexKeyUnpackParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
