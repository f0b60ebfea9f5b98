// Byte accounting of V4.1's caches and per-sequence state (spec §6.1–§6.3).
#include "model_v41/state_layout.h"

#include <algorithm>
#include <numeric>

namespace dsinfer::model_v41 {

namespace {

int64_t round_up(int64_t v, int64_t a) {
  return (v + a - 1) / a * a;
}

}  // namespace

StateLayout compute_state_layout(const V41Config& c, const StateOptions& o) {
  StateLayout s;
  s.window_record = c.head_dim + c.head_dim / 32;
  s.compressed_record = c.use_fp4_sparse_kv ? c.head_dim / 2 + c.head_dim / 16 : s.window_record;
  s.index_record = c.index_head_dim / 2 + c.index_head_dim / 32;
  for (int l : c.kv_source_layer_ids) {
    OwnerSection sec;
    sec.layer = l;
    sec.ratio = c.compress_ratios[static_cast<size_t>(l)];
    const int64_t entries = o.block_tokens / sec.ratio;
    const bool owns_keys =
        std::find(c.index_k_source_layer_ids.begin(), c.index_k_source_layer_ids.end(), l) !=
        c.index_k_source_layer_ids.end();
    sec.index_bytes = owns_keys ? round_up(entries * s.index_record, 32) : 0;
    sec.main_bytes = round_up(entries * s.compressed_record, 32);
    s.block_raw_bytes += sec.index_bytes + sec.main_bytes;
    s.owners.push_back(sec);
  }
  s.block_align = std::lcm(o.block_tokens, s.compressed_record);
  s.block_stride = s.block_raw_bytes == 0 ? 0 : round_up(s.block_raw_bytes, s.block_align);
  s.bytes_per_token_raw =
      static_cast<double>(s.block_raw_bytes) / static_cast<double>(o.block_tokens);
  s.bytes_per_token = static_cast<double>(s.block_stride) / static_cast<double>(o.block_tokens);

  s.ring_slots = c.sliding_window + o.max_backtracking;
  s.n_rings = c.num_hidden_layers + c.num_nextn_predict_layers;
  s.ring_bytes = s.ring_slots * s.window_record;
  s.producer_ring_bytes = static_cast<int64_t>(c.yoco_boundary) * s.ring_bytes;
  for (int l : c.kv_source_layer_ids) {
    const int r = c.compress_ratios[static_cast<size_t>(l)];
    if (r > 1) {
      ++s.n_compressor_rings;
      s.compressor_ring_slots = r + o.max_backtracking - 1;
      s.compressor_ring_bytes = s.compressor_ring_slots * 2 * c.head_dim * 4;
    }
  }
  s.state_raw_bytes = s.n_rings * s.ring_bytes + s.n_compressor_rings * s.compressor_ring_bytes;
  s.state_align = std::lcm(int64_t{32}, s.window_record);
  s.state_bytes = round_up(s.state_raw_bytes, s.state_align);
  return s;
}

}  // namespace dsinfer::model_v41
