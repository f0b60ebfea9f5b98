// SequenceState: everything DeepSeek V4 keeps per sequence between forward calls (spec §4), in
// pages of a shared PageArena: per layer a window ring of raw KV, CSA/HCA compressed entries,
// CSA indexer keys, and ring buffers of the compressors' per-token rows (kept per token, not as
// running sums, so that rollback by k tokens is exact); plus the MTP block's state.
//
// Contract with the forward pass: before a forward over n new tokens, the owner calls
// reserve(n) (which may fail when the arena is out of pages); the forward then writes rows
// without allocating and calls advance(n).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "state/page_arena.h"

namespace dsinfer::state {

// Ring of per-token compressor rows [kv (width) | score (width)]; score = gate logits + ape.
// Holds positions [first_pos, end_pos); a row is addressed by position modulo the capacity.
class CompressorRows {
 public:
  CompressorRows() = default;
  CompressorRows(PageArena* arena, int64_t width, int64_t capacity, PageOwner owner);
  int64_t width() const { return width_; }
  bool enabled() const { return width_ > 0; }
  int64_t first_pos() const { return first_pos_; }
  int64_t end_pos() const { return end_pos_; }
  int64_t capacity() const { return capacity_; }
  // Backs the whole ring with pages; false when the arena is out of pages.
  bool reserve_all() { return rows_.reserve(capacity_); }
  // Appends the row of position end_pos(); the oldest row is dropped when the ring is full.
  void append(const float* kv, const float* score);
  // Metadata-only append (the row's contents are written elsewhere, e.g. on the device):
  // advances end_pos() like append() and returns the ring row that position occupies.
  int64_t push_row();
  // Ring row of position pos (must be held) and the row storage itself.
  int64_t ring_row(int64_t pos) const;
  const PagedRows& rows() const { return rows_; }
  const float* kv_row(int64_t pos) const;
  const float* score_row(int64_t pos) const;
  void drop_before(int64_t pos);  // forget rows before pos
  // Takes src's positions (same width and capacity; this ring's pages already reserved).
  void copy_positions_from(const CompressorRows& src) {
    first_pos_ = src.first_pos_;
    end_pos_ = src.end_pos_;
  }
  // Sets the held positions (a restored image; the rows' contents are written by the caller).
  void set_positions(int64_t first, int64_t end) {
    first_pos_ = first;
    end_pos_ = end;
  }
  void truncate(int64_t pos);  // forget rows at and after pos
  int64_t num_pages() const { return rows_.num_pages(); }

 private:
  PagedRows rows_;
  int64_t width_ = 0;
  int64_t capacity_ = 0;
  int64_t first_pos_ = 0;
  int64_t end_pos_ = 0;
};

struct LayerState {
  model::AttentionType attention = model::AttentionType::kSliding;
  int64_t ratio = 0;           // compress ratio m (0 for sliding)
  int64_t head_dim = 0;        // K=V row width (floats; a record's under RowFormat::kRecord)
  int64_t index_head_dim = 0;  // CSA only: index-key row width (floats)
  int64_t ring_capacity = 0;   // sliding_window + max_rollback
  PagedRows ring;              // [ring_capacity, head_dim], slot = position % ring_capacity
  PagedRows entries;           // [num_entries, head_dim] compressed K=V entries
  PagedRows index_keys;        // [num_entries, index_head_dim] (CSA)
  int64_t num_entries = 0;
  // Positions below it are never attended: their window rows were not written (a drafter's
  // block resumed after skipping them, SequenceState::resume_mtp). 0 everywhere else.
  int64_t window_floor = 0;
  CompressorRows comp_rows;   // main compressor (CSA/HCA)
  CompressorRows index_rows;  // indexer compressor (CSA)

  float* ring_slot(int64_t pos) { return ring.row(pos % ring_capacity); }
  const float* ring_slot(int64_t pos) const { return ring.row(pos % ring_capacity); }
  const float* entry(int64_t w) const { return entries.row(w); }
  const float* index_key(int64_t w) const { return index_keys.row(w); }
  // Appends compressed entry / index key number `w` (capacity reserved beforehand).
  void put_entry(int64_t w, const float* e);
  void put_index_key(int64_t w, const float* k);
  // Metadata-only variant of put_entry (contents written elsewhere): checks and counts entry w.
  void add_entry(int64_t w);
  void check_index_key(int64_t w) const;
};

// How the K=V rows (window rings, compressed entries) and the index keys of a V4 state are
// stored: fp32 rows (head_dim / index_head_dim floats), or the storage records of
// numeric/records.h in rows of *_record_floats floats (the CUDA backend in `deepseek` numerics:
// 584 B instead of 2 KiB per V4-Flash K=V row, 68 B instead of 512 per index key). The
// compressors' per-token rows and the MTP streams stay fp32 either way.
enum class RowFormat { kFloat, kRecord };
const char* row_format_name(RowFormat f);
// Whether `c`'s rows have a record layout (nope dims a multiple of 64, index dims of 32).
bool records_fit(const model::ModelConfig& c);
// Row widths (floats) of one K=V row and one index key of `c` in format f.
int64_t kv_row_floats(const model::ModelConfig& c, RowFormat f);
int64_t index_row_floats(const model::ModelConfig& c, RowFormat f);

class SequenceState;
// invalid_argument unless st's K=V rows and index keys are laid out in format f for `c` (a
// sequence made for another backend's row format).
Status check_row_format(const SequenceState& st, const model::ModelConfig& c, RowFormat f);

struct StateBytes {
  int64_t window = 0;      // raw-KV rings
  int64_t compressed = 0;  // CSA/HCA entries
  int64_t index_keys = 0;  // CSA indexer keys
  int64_t partial = 0;     // compressor partial rows
  int64_t mtp = 0;         // MTP block state
  int64_t total() const { return window + compressed + index_keys + partial + mtp; }
};

// Smallest page size (bytes) that holds the widest row the model keeps; the default page size is
// the larger of this and 64 KiB.
int64_t min_page_bytes(const model::ModelConfig& c);
int64_t default_page_bytes(const model::ModelConfig& c);

// The state of a model other than V4 (whose layout SequenceState derives from its ModelConfig),
// described layer by layer by that model's backend (DeepSeek V4.1: cpu_v41::v41_state_shape).
struct LayerShape {
  int64_t ratio = 0;             // one compressed entry per `ratio` tokens (0: a ring only)
  int64_t index_head_dim = 0;    // one index key per entry (0: none)
  int64_t partial_width = 0;     // compressor ring rows of 2 x partial_width floats (0: none)
  int64_t partial_capacity = 0;  // rows of that ring
};
struct StateShape {
  int64_t head_dim = 0;        // window-ring and compressed-entry row width (floats)
  int64_t sliding_window = 0;  // window including the current token
  int64_t ring_capacity = 0;   // slots of every window ring (>= sliding_window)
  int64_t max_rollback = 0;    // tokens rollback() may remove
  // Token ids kept (the latest ones), for a forward that reads earlier tokens (V4.1's Engram
  // n-grams); must cover max_rollback plus what the forward reads.
  int64_t token_history = 0;
  std::vector<LayerShape> layers;  // one per decoder layer
  int64_t extra_rings = 0;         // ring-only blocks beside the layers (draft blocks), kMtp pages
};
int64_t min_page_bytes(const StateShape& s);
int64_t default_page_bytes(const StateShape& s);

class SequenceState;
struct ImageAccess;

// Moves arena page contents to and from host memory: `pages.size() * page_floats` floats, in the
// order of `pages`. A host-storage arena copies directly; a device-mirrored one goes through the
// backend (backend::Model::read_state_pages / write_state_pages).
using PageReader = std::function<Status(std::span<const int32_t> pages, float* dst)>;
using PageWriter = std::function<Status(std::span<const int32_t> pages, const float* src)>;

// What a state image leaves out, for a model resumed by bounded replay (DeepSeek V4.1, spec
// deepseek-v41.md §5.3): the window rings the replay rebuilds (consumer layers, draft blocks) and
// the compressor rows. Without compressor rows an image can only be taken where no compression
// group is open (the length a multiple of every ratio) and a restored sequence cannot roll back
// below its restored length. Default: nothing left out (the whole state; exact at any length).
struct ImageOptions {
  std::vector<uint8_t> skip_rings;  // 1 = ring not stored; per layer, then per extra ring (or
                                    // empty: every ring stored)
  bool skip_compressor_rows = false;
  bool full() const;
};

// State images (state/state_image.cc): a self-contained, page-size-independent copy of a
// sequence's decode state (window rings, compressed entries, index keys, compressor rows, MTP
// state -- V4's MTP block at its own position count, with the final streams it reads next --,
// the token history) at its current length: what the prefix cache stores. With default
// options, restoring it into a fresh sequence of the same model and rollback limit gives exactly
// the state a forward over the same tokens leaves; with `options` leaving parts out, those parts
// are unspecified after a restore (the caller's replay must not read them). Version 1 images
// (V4's layout: no token history, nothing left out) are unchanged; a state with a token history
// or options that leave something out gives a version 2 image that records both.
Result<std::string> capture_state(const SequenceState& st,
                                  const PageReader& read,
                                  const ImageOptions& options = {});
// Fills the fresh sequence `st` from `image`, which must have been taken with the same
// `options`. invalid_argument / data_loss when the image does not parse or does not fit st's
// model or options; kResourceExhausted when the arena is out of pages (st is left fresh in every
// failure).
Status restore_state(std::string_view image,
                     SequenceState& st,
                     const PageWriter& write,
                     const ImageOptions& options = {});
// The arena pages capture_state(st, ..., options) reads, each once, in the order of their first
// read; the same errors as capture_state when st cannot be captured. A caller that copies these
// pages elsewhere (asynchronously, before st changes) can later serve capture_state's reads from
// that copy.
Result<std::vector<int32_t>> image_pages(const SequenceState& st, const ImageOptions& options = {});
// A capture split in two (the prefix cache's background captures): plan_image reads only st's
// metadata, at once, and lists the pages the capture reads; assemble_image later builds the
// image from a copy of those pages, on any thread, without st. The result is capture_state's
// image byte for byte as st was when planned, provided the copied pages hold what they held then.
struct ImageSegment {
  int32_t page = -1;   // index into ImagePlan::pages; -1: zeros
  int64_t offset = 0;  // first float within that page
  int64_t floats = 0;  // length
};
struct ImagePlan {
  std::string head;                    // the image up to its rows
  std::vector<int32_t> pages;          // image_pages(st, options)
  std::vector<ImageSegment> segments;  // the rows, in image order
  int64_t page_floats = 0;
  size_t image_bytes = 0;  // the whole image
};
Result<ImagePlan> plan_image(const SequenceState& st, const ImageOptions& options = {});
// `pages`: plan.pages.size() * plan.page_floats floats, the planned pages in that order.
Result<std::string> assemble_image(const ImagePlan& plan, std::span<const float> pages);
// Token count recorded in an image (data_loss when it is not one).
Result<int64_t> state_image_tokens(std::string_view image);

class SequenceState {
 public:
  // Allocates the fixed-size parts (rings, compressor rows) from `arena`; ok() is false when the
  // arena had no room. max_rollback: how many of the latest tokens rollback() may remove.
  // `format`: how K=V rows and index keys are stored (the backend's, backend::Model::
  // row_format()).
  SequenceState(const model::ModelConfig& config,
                PageArena* arena,
                int64_t sequence_id,
                int64_t max_rollback,
                RowFormat format = RowFormat::kFloat);
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;
  // The same from a StateShape (max_rollback from the shape).
  SequenceState(const StateShape& shape, PageArena* arena, int64_t sequence_id);
  bool ok() const { return ok_; }
  // Pages a sequence of num_tokens tokens holds (fixed parts included), without allocating.
  static int64_t pages_for(const model::ModelConfig& config,
                           int64_t page_bytes,
                           int64_t num_tokens,
                           int64_t max_rollback,
                           RowFormat format = RowFormat::kFloat);
  static int64_t pages_for(const StateShape& shape, int64_t page_bytes, int64_t num_tokens);

  int64_t id() const { return id_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t max_rollback() const { return max_rollback_; }
  std::vector<LayerState>& layers() { return layers_; }
  const std::vector<LayerState>& layers() const { return layers_; }

  // Pages needed (beyond those held) to extend the sequence by n tokens.
  int64_t pages_needed(int64_t n) const;
  // Reserves the pages for n more tokens; false (and no partial growth kept) when out of pages.
  bool reserve(int64_t n);

  // MTP block: its own layer state, the number of MTP positions processed, and the main model's
  // final residual streams ([hc*hidden]) of the latest max_rollback+1 positions.
  std::vector<LayerState>& mtp_layers() { return mtp_layers_; }
  const std::vector<LayerState>& mtp_layers() const { return mtp_layers_; }
  int64_t mtp_num_tokens() const { return mtp_num_tokens_; }
  void set_mtp_num_tokens(int64_t n) { mtp_num_tokens_ = n; }
  // Brings a MTP block that fell behind by more than the kept final streams back within catch-up
  // reach: its position moves to the oldest of the latest positions whose final streams are all
  // kept (up to max_rollback + 1 of them, ending at num_tokens() - 1), and its window attends
  // from there on (window_floor: the ring rows before it were never written). The drafts made
  // from it are weaker for one window (outputs are verified, so they stay exact). False, and
  // nothing changed, when there is no MTP state or the last position's streams are not kept.
  bool resume_mtp();
  void store_final_streams(int64_t pos, const float* streams);
  const float* final_streams(int64_t pos) const;  // null when not kept
  // Metadata-only variants (contents kept elsewhere, e.g. on the device): the row of
  // final_streams_rows() that holds position pos after mark_final_streams(pos), or -1 when no
  // row holds pos (no MTP state, or not kept).
  int64_t mark_final_streams(int64_t pos);
  int64_t final_streams_row(int64_t pos) const;
  const PagedRows& final_streams_rows() const { return final_streams_; }
  PageArena* arena() const { return arena_; }

  // Makes this fresh sequence (no tokens yet, same model and max_rollback) a copy of `src`:
  // allocates the same pages and copies the metadata. With a host-storage arena the page contents
  // are copied too; otherwise the (source page, destination page) pairs are appended to `pairs`
  // for the backend to copy (CudaModel::copy_pages). kResourceExhausted (and nothing kept beyond
  // the fixed parts) when the arena is out of pages.
  Status fork_from(const SequenceState& src, std::vector<std::pair<int32_t, int32_t>>* pairs);

  // Called by the forward after it appended n tokens; trims what rollback no longer needs.
  // `tokens` (the n ids) are kept when the state has a token history.
  void advance(int64_t n, std::span<const int32_t> tokens = {});
  // Token id at position pos from the token history (pos in [history_begin(), num_tokens())).
  int32_t token(int64_t pos) const;
  int64_t history_begin() const;
  // Removes the last k tokens (k <= max_rollback()); afterwards the state equals the state
  // after a forward over the first num_tokens()-k tokens, and unused pages are freed. Not below
  // the length an image without compressor rows was restored at (invalid_argument).
  Status rollback(int64_t k);
  // Token ids the history can hold (0: the state keeps none).
  int64_t history_capacity() const { return static_cast<int64_t>(history_.size()); }

  StateBytes bytes() const;
  // Aborts (DSI_CHECK) when an invariant is broken: entry counts vs num_tokens, row windows,
  // page ownership.
  void check_integrity() const;
  // The K=V row width every layer (MTP layers included) was made with, -1 where they differ;
  // the index-key width of every layer that has index keys, 0 where none has, -1 where they
  // differ. Fixed at construction (check_row_format reads them instead of every layer: a
  // 256-sequence step touched ~2,300 layer states for it).
  int64_t uniform_kv_width() const { return uniform_kv_width_; }
  int64_t uniform_index_width() const { return uniform_index_width_; }

 private:
  friend struct ImageAccess;  // capture_state and image_pages (state_image.cc)
  friend Status restore_state(std::string_view,
                              SequenceState&,
                              const PageWriter&,
                              const ImageOptions&);
  void trim(LayerState& ls) const;
  void note_row_widths();  // the constructors' last step
  PageArena* arena_;
  int64_t id_;
  bool ok_ = true;
  int64_t num_tokens_ = 0;
  int64_t max_rollback_ = 0;
  int64_t sliding_window_ = 0;
  int64_t hc_width_ = 0;
  int64_t uniform_kv_width_ = -1;
  int64_t uniform_index_width_ = -1;
  std::vector<LayerState> layers_;
  std::vector<LayerState> mtp_layers_;
  int64_t mtp_num_tokens_ = 0;
  PagedRows final_streams_;               // [max_rollback+1, hc_width] ring by position
  std::vector<int64_t> final_positions_;  // position held in each slot (-1 empty)
  std::vector<int32_t> history_;          // token ids, ring by position (StateShape only)
  int64_t history_first_ = 0;             // oldest position the history still holds
  // Lowest length rollback() may reach: a state restored from an image without compressor rows
  // holds none from before its restored length.
  int64_t rollback_floor_ = 0;
};

}  // namespace dsinfer::state
