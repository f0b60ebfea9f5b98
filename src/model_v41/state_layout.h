// V4.1 cache and state sizes (spec deepseek-v41.md §6): record formats, the paged compressed
// cache (128-token blocks, per-owner index + main sections, block stride aligned to
// lcm(128, main record)) and the fixed per-sequence state slot (window rings of window +
// backtracking slots for every layer and DSpark block, 7-token fp32 ring per ratio-2 compressor).
#pragma once

#include <cstdint>
#include <vector>

#include "model_v41/config.h"

namespace dsinfer::model_v41 {

struct StateOptions {
  int64_t max_backtracking = 6;  // DSpark block (5) + 1
  int64_t block_tokens = 128;    // paged compressed-cache block
};

struct OwnerSection {
  int layer = 0;
  int ratio = 0;
  int64_t index_bytes = 0;  // per block, padded to 32
  int64_t main_bytes = 0;   // per block, padded to 32
};

struct StateLayout {
  // Records.
  int64_t window_record = 0;      // FP8 main: head_dim e4m3 + head_dim/32 UE8M0
  int64_t compressed_record = 0;  // FP4 main (head_dim/2 + head_dim/16 E4M3) or the FP8 record
  int64_t index_record = 0;       // FP4 index: index_head_dim/2 + index_head_dim/32
  // Paged compressed cache.
  std::vector<OwnerSection> owners;
  int64_t block_raw_bytes = 0;     // sum of the sections
  int64_t block_align = 0;         // lcm(128, compressed_record)
  int64_t block_stride = 0;        // raw rounded up to block_align
  double bytes_per_token_raw = 0;  // block_raw_bytes / block_tokens
  double bytes_per_token = 0;      // block_stride / block_tokens
  // Fixed state per sequence.
  int64_t ring_slots = 0;             // window + max_backtracking
  int64_t n_rings = 0;                // layers + DSpark blocks
  int64_t ring_bytes = 0;             // one ring
  int64_t compressor_ring_slots = 0;  // ratio + max_backtracking - 1 (ratio-2 owners)
  int64_t compressor_ring_bytes = 0;  // one ratio-2 owner: slots x (z, c) x head_dim x fp32
  int64_t n_compressor_rings = 0;
  int64_t state_raw_bytes = 0;
  int64_t state_align = 0;          // lcm(32, window_record)
  int64_t state_bytes = 0;          // per sequence slot
  int64_t producer_ring_bytes = 0;  // rings of layers below the YOCO boundary (persisted)
};

StateLayout compute_state_layout(const V41Config& c, const StateOptions& o = {});

}  // namespace dsinfer::model_v41
