// Storage records of the decode state (spec §4.4): the byte layouts a state row takes when it is
// stored in the formats DeepSeek's kernels read, and their scalar decoders (host and device).
//
//   KV record (vLLM's V4 `fp8_ds_mla`; 584 B for head_dim 512, rope 64): K=V rows of the window
//   rings and of the CSA/HCA compressed entries.
//     [0, nope)                    E4M3 codes of the nope dims (nope = dim - rope_dim, a multiple
//                                  of 64)
//     [nope, nope + 2 * rope)      the rope dims as bf16
//     [.., + nope / 64)            one UE8M0 scale byte per 64 nope dims
//     zero padding to a multiple of 8 bytes
//   Value of nope dim d: e4m3(code[d]) * 2^(scale[d / 64] - 127); of rope dim r: bf16.
//
//   Index-key record (MXFP4; 68 B for index_head_dim 128): the indexer's keys.
//     [0, dim / 2)                 packed E2M1 (low nibble = even dim)
//     [dim / 2, dim / 2 + dim / 32)  one UE8M0 scale byte per 32 dims
//     zero padding to a multiple of 4 bytes (the state's rows are whole floats)
//
// A state laid out in records (state::RowFormat::kRecord) keeps each record in a row of
// *_record_floats() floats of the paged arena; the values a record decodes to are exactly those
// `deepseek` numerics compute for the row (FP8 1x64 / BF16 RoPE, FP4 1x32), so reading a record
// gives the same arithmetic as reading the fp32 row it replaces.
#pragma once

#include <cstdint>

#include "numeric/float_formats.h"

namespace dsinfer::numeric {

DSI_HD constexpr int64_t kv_record_bytes(int64_t dim, int64_t rope_dim) {
  return ((dim - rope_dim) + 2 * rope_dim + (dim - rope_dim) / 64 + 7) / 8 * 8;
}
DSI_HD constexpr int64_t index_key_record_bytes(int64_t dim) {
  return dim / 2 + dim / 32;
}
// Arena row widths (floats) that hold one record.
DSI_HD constexpr int64_t kv_record_floats(int64_t dim, int64_t rope_dim) {
  return kv_record_bytes(dim, rope_dim) / 4;
}
DSI_HD constexpr int64_t index_key_record_floats(int64_t dim) {
  return (index_key_record_bytes(dim) + 3) / 4;
}
// Whether a row of `dim` with `rope_dim` RoPE dims has a KV record layout (nope a multiple of 64)
// and an index key of `index_dim` one (a multiple of 32).
DSI_HD constexpr bool kv_record_fits(int64_t dim, int64_t rope_dim) {
  return dim > 0 && rope_dim >= 0 && rope_dim <= dim && (dim - rope_dim) % 64 == 0;
}
DSI_HD constexpr bool index_key_record_fits(int64_t dim) {
  return dim > 0 && dim % 32 == 0;
}
static_assert(kv_record_bytes(512, 64) == 584);
static_assert(kv_record_floats(512, 64) == 146);
static_assert(index_key_record_bytes(128) == 68);
static_assert(index_key_record_floats(128) == 17);
static_assert(index_key_record_floats(64) == 9);

// Dim d of a KV record (dim, rope_dim) as fp32.
DSI_HD float kv_record_get(const uint8_t* rec, int64_t dim, int64_t rope_dim, int64_t d) {
  const int64_t nope = dim - rope_dim;
  if (d >= nope) {
    uint16_t h;
    std::memcpy(&h, rec + nope + 2 * (d - nope), 2);
    return bf16_to_f32(h);
  }
  return fp8_e4m3_to_f32(rec[d]) * e8m0_to_f32(rec[nope + 2 * rope_dim + d / 64]);
}
// Dim d of an index-key record of `dim` as fp32.
DSI_HD float index_key_record_get(const uint8_t* rec, int64_t dim, int64_t d) {
  return fp4_packed_get(rec, d) * e8m0_to_f32(rec[dim / 2 + d / 32]);
}

}  // namespace dsinfer::numeric
