// Host-side planning of one CUDA forward: for every layer, the key references and page tables
// the kernels read (attention key lists, compressor candidates and destinations, indexer page
// tables, ring writes), derived from the sequences' page tables exactly as the CPU forward
// (backend/cpu) walks its rows. Planning also advances the sequences' metadata (compressor
// rows, entry counts) — the device kernels write the contents. Pure host code.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/host_pack.h"
#include "base/thread_pool.h"
#include "model/config.h"
#include "state/sequence_state.h"

namespace dsinfer::gpu {

// One sequence's rows in a pass: rows [begin, begin + n) are positions first .. first + n - 1.
struct SeqSpan {
  state::SequenceState* st = nullptr;
  int64_t first = 0;
  int64_t n = 0;
  int64_t begin = 0;
  bool mtp = false;  // the MTP block's layer state instead of the main layers'
};

struct CompressorPlan {
  int64_t n_entries = 0;    // entries launched (padded to the row count in fixed-shape mode)
  int32_t local_dest = -1;  // [N] row t -> local buffer row t (kKvRefNone for padding rows)
  int32_t ring_dest = -1;   // [N] pool row kept in the sequence's ring, or kKvRefNone
  int32_t token_refs = -1;  // [E, (1 + overlap) * ratio] candidate rows
  int32_t block = -1;       // [E] block index (-1: unused slot)
  int32_t out_offset = -1;  // [E] pool offset of the entry / index-key row
};

struct LayerPass {
  int32_t key_begin = -1;  // [N + 1] attention CSR
  // [key_begin[N]], device-only (HostPack::reserve_device): window keys and HCA entries written
  // by launch_expand_keys from the page tables below, CSA selections by refs_from_indices.
  int32_t key_refs = -1;
  int32_t ring_pages = -1;       // the spans' window-ring page tables, concatenated
  int32_t ring_page_begin = -1;  // [spans]
  int32_t hca_pages = -1;        // HCA: the spans' entry page tables, concatenated
  int32_t hca_page_begin = -1;   // [spans]
  int64_t hca_ratio = 0;         // HCA: position p sees entries [0, (p + 1) / hca_ratio)
  int64_t ring_capacity = 0;
  int64_t ring_rows_per_page = 0;
  int64_t entry_rows_per_page = 0;
  int32_t ring_dest = -1;     // [N] where each row's K=V vector goes in its ring (or none)
  CompressorPlan comp;        // CSA / HCA main compressor
  CompressorPlan index_comp;  // CSA indexer compressor
  // CSA indexer + selection.
  int32_t index_pages = -1;       // concatenated index-key page tables
  int32_t index_page_begin = -1;  // [N]
  int32_t visible = -1;           // [N] visible blocks per row
  int64_t visible_room = 0;       // score columns (>= every visible; bucketed in fixed mode)
  int32_t entry_pages = -1;       // concatenated entry page tables
  int32_t entry_page_begin = -1;  // [N]
  int32_t select_begin = -1;      // [N] where row t's index_topk selected refs go in key_refs
};

// span_pos columns: the span's first position, its first row, and its window floor (the lowest
// position its window keys may read: the MTP block's LayerState::window_floor, else 0).
inline constexpr int64_t kSpanPosWidth = 3;

struct PassPlan {
  int64_t rows = 0;        // N (padding rows included)
  int32_t tokens = -1;     // [N] int32
  int32_t positions = -1;  // [N] int64
  int32_t row_span = -1;   // [N] int32: the span of each row, -1 for padding rows
  int32_t span_pos = -1;   // [spans, kSpanPosWidth] int64: first position, first row, floor
  std::vector<LayerPass> layers;
};

// A reference to element `elem_offset` of the pass's local buffer (pool offsets are >= 0, -1 is
// none): the encoding every key / row reference list of the plan uses.
inline int64_t local_ref(int64_t elem_offset) {
  return -2 - elem_offset;
}

// Fixed-shape steps pad their sequences to a power of two.
inline int64_t pow2_at_least(int64_t v) {
  int64_t b = 1;
  while (b < v) b *= 2;
  return b;
}

struct PlanContext {
  const model::ModelConfig* config = nullptr;
  int64_t page_floats = 0;
  bool fixed_shape = false;  // pad per-entry launches to the row count, bucket score columns
  // Fixed shape: the rows of each sequence's slot (its span anywhere inside, the other rows
  // padding); 0: every span is a whole slot (the first span's length).
  int64_t slot_rows = 0;
  // Row width (floats) of the sequences' K=V rows: state::kv_row_floats of the backend's row
  // format (0: the config's head_dim, fp32 rows).
  int64_t kv_width = 0;
  // Where a large pass plans its layers side by side (null: one after another). The plan is the
  // same either way.
  ThreadPool* pool = nullptr;
};

// Appends to a graph key what a pass's launches take by value rather than from the plan's
// arrays, layer by layer: the ring capacity and page geometry, the HCA ratio and the score
// columns. Two sequences of one model differ in these (the ring holds sliding_window +
// max_rollback rows: the engine's states and the speculative start-up measurement's differ by
// one), and a graph replayed for the other would index its rings wrongly.
void append_geometry_key(const PassPlan& plan, std::vector<int64_t>* key);

// Plans pass rows: tokens (one per real row; padding rows get token 0 and position 0) and the
// layers `layer_ids` (main layer indices, or the MTP block when the spans are mtp). Mutates the
// sequences' compressor and entry metadata.
void plan_pass(const PlanContext& ctx,
               const std::vector<SeqSpan>& spans,
               const std::vector<int32_t>& tokens,
               int64_t rows,
               HostPack& pack,
               PassPlan* out);

// The key list of layer `layer` of a planned pass, computed on the host exactly as
// launch_expand_keys computes it on the device (window keys and HCA entries), with kKvRefNone (-1)
// in the CSA selection slots that refs_from_indices fills. For tests and checks.
std::vector<int64_t> expand_keys_host(const PlanContext& ctx,
                                      const HostPack& pack,
                                      const PassPlan& plan,
                                      size_t layer);

}  // namespace dsinfer::gpu
