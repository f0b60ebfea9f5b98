// Storage records of the decode state (spec §4.4), the layouts the paged state will hold on the
// GPU instead of fp32 rows:
//
//   KV record (vLLM's V4 `fp8_ds_mla`; 584 B for head_dim 512, rope 64): K=V rows of the window
//   ring and of the CSA/HCA compressed entries.
//     [0, nope)                 E4M3 codes of the nope dims (nope = dim - rope_dim, a multiple of
//     64) [nope, nope + 2*rope)     the rope dims as bf16 (RNE)
//     [.., + nope/64)           one UE8M0 scale byte per 64 nope dims
//     zero padding to a multiple of 8 bytes
//   The nope dims hold exactly numeric::fp8_block_simulate(row, nope, 64) (codes and scales of
//   fp8_block_quantize); the rope dims are rounded to bf16 (as `deepseek` numerics store them;
//   `reference` numerics keep them fp32).
//
//   Index-key record (MXFP4; 68 B for index_head_dim 128): the indexer's keys.
//     [0, dim/2)                packed E2M1 (low nibble = even dim)
//     [dim/2, dim/2 + dim/32)   one UE8M0 scale byte per 32 dims
//   Holds exactly numeric::fp4_block_simulate(row, dim, 32) of the (Hadamard-rotated) key.
//
// Pack kernels write record r at out + out_offsets[r] (bytes; null: r * record bytes) so records
// can go straight into state pages; unpack kernels read them back to fp32 rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "numeric/float_formats.h"  // DSI_HD

namespace dsinfer::cuda {

DSI_HD constexpr int64_t kv_record_bytes(int64_t dim, int64_t rope_dim) {
  return ((dim - rope_dim) + 2 * rope_dim + (dim - rope_dim) / 64 + 7) / 8 * 8;
}
DSI_HD constexpr int64_t index_key_record_bytes(int64_t dim) {
  return dim / 2 + dim / 32;
}
static_assert(kv_record_bytes(512, 64) == 584);
static_assert(index_key_record_bytes(128) == 68);

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
