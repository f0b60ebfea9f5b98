// SequenceState: page reservation, trimming, rollback, accounting and the integrity checker.
#include "state/sequence_state.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/strings.h"
#include "numeric/records.h"

namespace dsinfer::state {

using model::AttentionType;

CompressorRows::CompressorRows(PageArena* arena, int64_t width, int64_t capacity, PageOwner owner)
    : rows_(arena, 2 * width, owner), width_(width), capacity_(capacity) {}

void CompressorRows::append(const float* kv, const float* score) {
  float* r = rows_.row(push_row());
  std::copy(kv, kv + width_, r);
  std::copy(score, score + width_, r + width_);
}

int64_t CompressorRows::push_row() {
  const int64_t row = end_pos_ % capacity_;
  ++end_pos_;
  first_pos_ = std::max(first_pos_, end_pos_ - capacity_);
  return row;
}

int64_t CompressorRows::ring_row(int64_t pos) const {
  DSI_CHECK(pos >= first_pos_ && pos < end_pos_,
            "compressor row %lld outside [%lld, %lld)",
            static_cast<long long>(pos),
            static_cast<long long>(first_pos_),
            static_cast<long long>(end_pos_));
  return pos % capacity_;
}

const float* CompressorRows::kv_row(int64_t pos) const {
  DSI_DCHECK(pos >= first_pos_ && pos < end_pos_,
             "compressor row %lld outside [%lld, %lld)",
             static_cast<long long>(pos),
             static_cast<long long>(first_pos_),
             static_cast<long long>(end_pos_));
  return rows_.row(pos % capacity_);
}

const float* CompressorRows::score_row(int64_t pos) const {
  return kv_row(pos) + width_;
}

void CompressorRows::drop_before(int64_t pos) {
  first_pos_ = std::clamp(pos, first_pos_, end_pos_);
}

void CompressorRows::truncate(int64_t pos) {
  end_pos_ = std::clamp(pos, first_pos_, end_pos_);
}

void LayerState::put_entry(int64_t w, const float* e) {
  add_entry(w);
  std::copy(e, e + head_dim, entries.row(w));
}

void LayerState::add_entry(int64_t w) {
  DSI_CHECK(w == num_entries && w < entries.capacity(),
            "entry %lld appended at count %lld with room for %lld (reserve() first)",
            static_cast<long long>(w),
            static_cast<long long>(num_entries),
            static_cast<long long>(entries.capacity()));
  ++num_entries;
}

void LayerState::put_index_key(int64_t w, const float* k) {
  check_index_key(w);
  std::copy(k, k + index_head_dim, index_keys.row(w));
}

void LayerState::check_index_key(int64_t w) const {
  DSI_CHECK(
      w < index_keys.capacity(), "index key %lld without reserved room", static_cast<long long>(w));
}

const char* row_format_name(RowFormat f) {
  return f == RowFormat::kRecord ? "records" : "fp32";
}

bool records_fit(const model::ModelConfig& c) {
  return numeric::kv_record_fits(c.head_dim, c.qk_rope_head_dim) &&
         (c.index_head_dim == 0 || numeric::index_key_record_fits(c.index_head_dim));
}

int64_t kv_row_floats(const model::ModelConfig& c, RowFormat f) {
  if (f == RowFormat::kFloat)
    return c.head_dim;
  DSI_CHECK(records_fit(c), "record rows for a model without a record layout");
  return numeric::kv_record_floats(c.head_dim, c.qk_rope_head_dim);
}

int64_t index_row_floats(const model::ModelConfig& c, RowFormat f) {
  if (f == RowFormat::kFloat || c.index_head_dim == 0)
    return c.index_head_dim;
  DSI_CHECK(records_fit(c), "record rows for a model without a record layout");
  return numeric::index_key_record_floats(c.index_head_dim);
}

Status check_row_format(const SequenceState& st, const model::ModelConfig& c, RowFormat f) {
  const int64_t kv = kv_row_floats(c, f);
  const int64_t index = index_row_floats(c, f);
  // Every layer alike (the constructors' states): one comparison instead of a walk.
  if (st.uniform_kv_width() >= 0 && st.uniform_index_width() >= 0 && st.uniform_kv_width() == kv &&
      (st.uniform_index_width() == 0 || st.uniform_index_width() == index))
    return Status();
  auto bad = [&](const LayerState& ls) {
    return ls.head_dim != kv || (ls.index_head_dim != 0 && ls.index_head_dim != index);
  };
  for (const auto* layers : {&st.layers(), &st.mtp_layers()}) {
    for (const LayerState& ls : *layers) {
      if (bad(ls)) {
        return invalid_argument(str_format(
            "sequence %lld's state holds %lld-float K=V rows; this backend reads %s rows of %lld "
            "floats (make its sequences with the backend's row_format())",
            static_cast<long long>(st.id()),
            static_cast<long long>(ls.head_dim),
            row_format_name(f),
            static_cast<long long>(kv)));
      }
    }
  }
  return Status();
}

namespace {
LayerState make_layer_state(const model::ModelConfig& c,
                            const model::LayerPlan& plan,
                            PageArena* arena,
                            int64_t seq,
                            int32_t layer,
                            int64_t max_rollback,
                            bool mtp,
                            RowFormat format) {
  LayerState ls;
  ls.attention = plan.attention;
  ls.ratio = plan.compress_ratio;
  const int64_t kv_w = kv_row_floats(c, format);
  ls.head_dim = kv_w;
  ls.ring_capacity = c.sliding_window + max_rollback;
  auto owner = [&](StateKind k) { return PageOwner{seq, layer, mtp ? StateKind::kMtp : k}; };
  ls.ring = PagedRows(arena, kv_w, owner(StateKind::kWindow));
  if (plan.attention == AttentionType::kSliding)
    return ls;
  const int64_t m = plan.compress_ratio;
  // Rows needed at once: two blocks for pooling with overlap, plus the rollback window, plus
  // one block of slack for the block-aligned retention boundary.
  const int64_t row_capacity = 3 * m + max_rollback;
  ls.entries = PagedRows(arena, kv_w, owner(StateKind::kCompressed));
  if (plan.attention == AttentionType::kCsa) {
    ls.index_head_dim = index_row_floats(c, format);
    ls.index_keys = PagedRows(arena, ls.index_head_dim, owner(StateKind::kIndexKeys));
    ls.comp_rows = CompressorRows(arena, 2 * c.head_dim, row_capacity, owner(StateKind::kPartial));
    ls.index_rows =
        CompressorRows(arena, 2 * c.index_head_dim, row_capacity, owner(StateKind::kPartial));
  } else {
    ls.comp_rows = CompressorRows(arena, c.head_dim, row_capacity, owner(StateKind::kPartial));
  }
  return ls;
}

bool reserve_fixed(LayerState& ls) {
  bool ok = ls.ring.reserve(ls.ring_capacity);
  if (ls.comp_rows.enabled())
    ok = ok && ls.comp_rows.reserve_all();
  if (ls.index_rows.enabled())
    ok = ok && ls.index_rows.reserve_all();
  return ok;
}
}  // namespace

int64_t min_page_bytes(const model::ModelConfig& c) {
  int64_t floats = std::max<int64_t>(c.head_dim, 4 * c.head_dim);  // CSA rows: kv|score, 2d each
  floats = std::max(floats, 4 * c.index_head_dim);
  if (!c.mtp_layers.empty())
    floats = std::max(floats, c.hc_mult * c.hidden_size);
  return floats * 4;
}

int64_t default_page_bytes(const model::ModelConfig& c) {
  return std::max<int64_t>(64 * 1024, min_page_bytes(c));
}

int64_t min_page_bytes(const StateShape& s) {
  int64_t floats = s.head_dim;
  for (const LayerShape& l : s.layers) {
    floats = std::max({floats, l.index_head_dim, 2 * l.partial_width});
  }
  return floats * 4;
}

int64_t default_page_bytes(const StateShape& s) {
  return std::max<int64_t>(64 * 1024, min_page_bytes(s));
}

SequenceState::SequenceState(const StateShape& shape, PageArena* arena, int64_t sequence_id)
    : arena_(arena),
      id_(sequence_id),
      max_rollback_(shape.max_rollback),
      sliding_window_(shape.sliding_window),
      hc_width_(0) {
  DSI_CHECK(shape.max_rollback >= 0 && shape.ring_capacity >= shape.sliding_window &&
                shape.token_history >= (shape.token_history > 0 ? shape.max_rollback + 1 : 0),
            "bad state shape (rollback %lld, ring %lld, window %lld, history %lld)",
            static_cast<long long>(shape.max_rollback),
            static_cast<long long>(shape.ring_capacity),
            static_cast<long long>(shape.sliding_window),
            static_cast<long long>(shape.token_history));
  for (size_t l = 0; l < shape.layers.size(); ++l) {
    const LayerShape& sh = shape.layers[l];
    const int32_t layer = static_cast<int32_t>(l);
    LayerState ls;
    // Compressed layers of a shape pool without overlap (kHca's retention rule).
    ls.attention = sh.ratio > 0 ? AttentionType::kHca : AttentionType::kSliding;
    ls.ratio = sh.ratio;
    ls.head_dim = shape.head_dim;
    ls.ring_capacity = shape.ring_capacity;
    ls.ring = PagedRows(arena, shape.head_dim, PageOwner{sequence_id, layer, StateKind::kWindow});
    if (sh.ratio > 0) {
      ls.entries =
          PagedRows(arena, shape.head_dim, PageOwner{sequence_id, layer, StateKind::kCompressed});
      if (sh.index_head_dim > 0) {
        ls.index_head_dim = sh.index_head_dim;
        ls.index_keys = PagedRows(
            arena, sh.index_head_dim, PageOwner{sequence_id, layer, StateKind::kIndexKeys});
      }
      if (sh.partial_width > 0) {
        ls.comp_rows = CompressorRows(arena,
                                      sh.partial_width,
                                      sh.partial_capacity,
                                      PageOwner{sequence_id, layer, StateKind::kPartial});
      }
    }
    layers_.push_back(std::move(ls));
    ok_ = ok_ && reserve_fixed(layers_.back());
  }
  for (int64_t b = 0; b < shape.extra_rings; ++b) {
    LayerState ls;
    ls.head_dim = shape.head_dim;
    ls.ring_capacity = shape.ring_capacity;
    ls.ring = PagedRows(
        arena,
        shape.head_dim,
        PageOwner{sequence_id, static_cast<int32_t>(shape.layers.size() + b), StateKind::kMtp});
    mtp_layers_.push_back(std::move(ls));
    ok_ = ok_ && reserve_fixed(mtp_layers_.back());
  }
  history_.assign(static_cast<size_t>(shape.token_history), -1);
  note_row_widths();
}

void SequenceState::note_row_widths() {
  int64_t kv = -2, index = 0;  // -2: no layer seen yet
  for (const auto* layers : {&layers_, &mtp_layers_}) {
    for (const LayerState& ls : *layers) {
      kv = kv == -2 || kv == ls.head_dim ? ls.head_dim : -1;
      if (ls.index_head_dim != 0)
        index = index == 0 || index == ls.index_head_dim ? ls.index_head_dim : -1;
    }
  }
  uniform_kv_width_ = kv == -2 ? -1 : kv;
  uniform_index_width_ = index;
}

int64_t SequenceState::pages_for(const StateShape& s, int64_t page_bytes, int64_t num_tokens) {
  const int64_t page_floats = page_bytes / 4;
  auto pages = [page_floats](int64_t width, int64_t rows) {
    const int64_t per_page = page_floats / width;
    return (rows + per_page - 1) / per_page;
  };
  int64_t total = s.extra_rings * pages(s.head_dim, s.ring_capacity);
  for (const LayerShape& l : s.layers) {
    total += pages(s.head_dim, s.ring_capacity);
    if (l.ratio == 0)
      continue;
    total += pages(s.head_dim, num_tokens / l.ratio);
    if (l.index_head_dim > 0)
      total += pages(l.index_head_dim, num_tokens / l.ratio);
    if (l.partial_width > 0)
      total += pages(2 * l.partial_width, l.partial_capacity);
  }
  return total;
}

int64_t SequenceState::history_begin() const {
  return std::max<int64_t>(0, history_first_);
}

int32_t SequenceState::token(int64_t pos) const {
  DSI_CHECK(!history_.empty() && pos >= history_begin() && pos < num_tokens_,
            "token %lld is not in the token history [%lld, %lld)",
            static_cast<long long>(pos),
            static_cast<long long>(history_begin()),
            static_cast<long long>(num_tokens_));
  return history_[static_cast<size_t>(pos % static_cast<int64_t>(history_.size()))];
}

SequenceState::SequenceState(const model::ModelConfig& config,
                             PageArena* arena,
                             int64_t sequence_id,
                             int64_t max_rollback,
                             RowFormat format)
    : arena_(arena),
      id_(sequence_id),
      max_rollback_(max_rollback),
      sliding_window_(config.sliding_window),
      hc_width_(config.hc_mult * config.hidden_size) {
  DSI_CHECK(max_rollback >= 0, "max_rollback %lld", static_cast<long long>(max_rollback));
  for (size_t l = 0; l < config.layers.size(); ++l) {
    layers_.push_back(make_layer_state(config,
                                       config.layers[l],
                                       arena,
                                       sequence_id,
                                       static_cast<int32_t>(l),
                                       max_rollback,
                                       false,
                                       format));
    ok_ = ok_ && reserve_fixed(layers_.back());
  }
  for (size_t l = 0; l < config.mtp_layers.size(); ++l) {
    mtp_layers_.push_back(make_layer_state(config,
                                           config.mtp_layers[l],
                                           arena,
                                           sequence_id,
                                           static_cast<int32_t>(config.layers.size() + l),
                                           max_rollback,
                                           true,
                                           format));
    ok_ = ok_ && reserve_fixed(mtp_layers_.back());
  }
  if (!config.mtp_layers.empty()) {
    final_streams_ = PagedRows(arena, hc_width_, PageOwner{sequence_id, -1, StateKind::kMtp});
    final_positions_.assign(static_cast<size_t>(max_rollback + 1), -1);
    ok_ = ok_ && final_streams_.reserve(max_rollback + 1);
  }
  note_row_widths();
}

int64_t SequenceState::pages_for(const model::ModelConfig& c,
                                 int64_t page_bytes,
                                 int64_t num_tokens,
                                 int64_t max_rollback,
                                 RowFormat format) {
  const int64_t page_floats = page_bytes / 4;
  const int64_t kv_w = kv_row_floats(c, format);
  const int64_t index_w = index_row_floats(c, format);
  auto pages = [page_floats](int64_t width, int64_t rows) {
    const int64_t per_page = page_floats / width;
    return (rows + per_page - 1) / per_page;
  };
  int64_t total = 0;
  auto add_layer = [&](const model::LayerPlan& plan, bool grows) {
    total += pages(kv_w, c.sliding_window + max_rollback);
    if (plan.attention == AttentionType::kSliding)
      return;
    const int64_t m = plan.compress_ratio;
    const int64_t entries = grows ? num_tokens / m : 0;
    total += pages(kv_w, entries);
    if (plan.attention == AttentionType::kCsa) {
      total += pages(index_w, entries);
      total += pages(4 * c.head_dim, 3 * m + max_rollback);
      total += pages(4 * c.index_head_dim, 3 * m + max_rollback);
    } else {
      total += pages(2 * c.head_dim, 3 * m + max_rollback);
    }
  };
  for (const auto& plan : c.layers) add_layer(plan, true);
  for (const auto& plan : c.mtp_layers) add_layer(plan, false);
  if (!c.mtp_layers.empty())
    total += pages(c.hc_mult * c.hidden_size, max_rollback + 1);
  return total;
}

int64_t SequenceState::pages_needed(int64_t n) const {
  int64_t pages = 0;
  const int64_t total = num_tokens_ + n;
  for (const auto& ls : layers_) {
    if (ls.ratio == 0)
      continue;
    const int64_t entries = total / ls.ratio;
    pages += std::max<int64_t>(0, ls.entries.pages_for(entries) - ls.entries.num_pages());
    if (ls.index_head_dim) {
      pages += std::max<int64_t>(0, ls.index_keys.pages_for(entries) - ls.index_keys.num_pages());
    }
  }
  return pages;
}

bool SequenceState::reserve(int64_t n) {
  const int64_t total = num_tokens_ + n;
  for (auto& ls : layers_) {
    if (ls.ratio == 0)
      continue;
    const int64_t entries = total / ls.ratio;
    bool ok = ls.entries.reserve(entries);
    if (ls.index_head_dim)
      ok = ok && ls.index_keys.reserve(entries);
    if (!ok) {
      for (auto& l2 : layers_) {
        if (l2.ratio == 0)
          continue;
        l2.entries.shrink_to(l2.num_entries);
        if (l2.index_head_dim)
          l2.index_keys.shrink_to(l2.num_entries);
      }
      return false;
    }
  }
  return true;
}

void SequenceState::store_final_streams(int64_t pos, const float* streams) {
  const int64_t slot = mark_final_streams(pos);
  if (slot >= 0)
    std::copy(streams, streams + hc_width_, final_streams_.row(slot));
}

const float* SequenceState::final_streams(int64_t pos) const {
  const int64_t slot = final_streams_row(pos);
  return slot >= 0 ? final_streams_.row(slot) : nullptr;
}

int64_t SequenceState::mark_final_streams(int64_t pos) {
  if (final_positions_.empty() || pos < 0)
    return -1;
  const int64_t slot = pos % static_cast<int64_t>(final_positions_.size());
  final_positions_[static_cast<size_t>(slot)] = pos;
  return slot;
}

bool SequenceState::resume_mtp() {
  if (mtp_layers_.empty() || final_positions_.empty() || num_tokens_ < 1)
    return false;
  int64_t from = num_tokens_ - 1;
  if (final_streams_row(from) < 0)
    return false;
  while (from > 0 && final_streams_row(from - 1) >= 0) --from;
  if (mtp_num_tokens_ >= from)
    return true;  // within the catch-up's reach already
  mtp_num_tokens_ = from;
  for (LayerState& ls : mtp_layers_) ls.window_floor = from;
  return true;
}

int64_t SequenceState::final_streams_row(int64_t pos) const {
  if (final_positions_.empty() || pos < 0)
    return -1;
  const int64_t slot = pos % static_cast<int64_t>(final_positions_.size());
  return final_positions_[static_cast<size_t>(slot)] == pos ? slot : -1;
}

void SequenceState::trim(LayerState& ls) const {
  if (ls.ratio == 0)
    return;
  const int64_t m = ls.ratio;
  const int64_t oldest = std::max<int64_t>(0, num_tokens_ - max_rollback_);
  const int64_t overlap = ls.attention == AttentionType::kCsa ? 1 : 0;
  const int64_t keep_from = std::max<int64_t>(0, (oldest / m - overlap) * m);
  ls.comp_rows.drop_before(keep_from);
  ls.index_rows.drop_before(keep_from);
}

void SequenceState::advance(int64_t n, std::span<const int32_t> tokens) {
  DSI_CHECK(n >= 0, "advance by %lld", static_cast<long long>(n));
  if (!history_.empty()) {
    DSI_CHECK(static_cast<int64_t>(tokens.size()) == n,
              "advance by %lld with %zu token ids (this state keeps a token history)",
              static_cast<long long>(n),
              tokens.size());
    const int64_t cap = static_cast<int64_t>(history_.size());
    for (int64_t i = 0; i < n; ++i)
      history_[static_cast<size_t>((num_tokens_ + i) % cap)] = tokens[static_cast<size_t>(i)];
    history_first_ = std::max(history_first_, num_tokens_ + n - cap);
  }
  num_tokens_ += n;
  for (auto& ls : layers_) trim(ls);
}

Status SequenceState::rollback(int64_t k) {
  if (k < 0 || k > max_rollback_ || k > num_tokens_) {
    return invalid_argument(str_format("cannot roll back %lld tokens (have %lld, limit %lld)",
                                       static_cast<long long>(k),
                                       static_cast<long long>(num_tokens_),
                                       static_cast<long long>(max_rollback_)));
  }
  if (num_tokens_ - k < rollback_floor_) {
    return invalid_argument(
        str_format("cannot roll back below %lld tokens: the state was restored there from a "
                   "prefix-cache image without compressor rows",
                   static_cast<long long>(rollback_floor_)));
  }
  num_tokens_ -= k;
  for (auto& ls : layers_) {
    if (ls.ratio == 0)
      continue;
    ls.num_entries = num_tokens_ / ls.ratio;
    ls.entries.shrink_to(ls.num_entries);
    if (ls.index_head_dim)
      ls.index_keys.shrink_to(ls.num_entries);
    ls.comp_rows.truncate(num_tokens_);
    ls.index_rows.truncate(num_tokens_);
  }
  // The MTP block at position i consumed token i+1: keep positions i < num_tokens - 1.
  mtp_num_tokens_ = std::min(mtp_num_tokens_, std::max<int64_t>(0, num_tokens_ - 1));
  for (auto& p : final_positions_) {
    if (p >= num_tokens_)
      p = -1;
  }
  check_integrity();
  return Status();
}

Status SequenceState::fork_from(const SequenceState& src,
                                std::vector<std::pair<int32_t, int32_t>>* pairs) {
  DSI_CHECK(num_tokens_ == 0 && layers_.size() == src.layers_.size() &&
                mtp_layers_.size() == src.mtp_layers_.size() &&
                max_rollback_ == src.max_rollback_ && arena_ == src.arena_,
            "fork_from needs a fresh sequence of the same model, rollback limit and arena");
  // Reserve first, so that a failure leaves this sequence fresh.
  auto grow = [&](const std::vector<LayerState>& from, std::vector<LayerState>& to) {
    for (size_t l = 0; l < from.size(); ++l) {
      if (from[l].ratio == 0)
        continue;
      if (!to[l].entries.reserve(from[l].num_entries))
        return false;
      if (from[l].index_head_dim && !to[l].index_keys.reserve(from[l].num_entries))
        return false;
    }
    return true;
  };
  if (!grow(src.layers_, layers_) || !grow(src.mtp_layers_, mtp_layers_)) {
    for (auto* v : {&layers_, &mtp_layers_}) {
      for (LayerState& ls : *v) {
        if (ls.ratio == 0)
          continue;
        ls.entries.shrink_to(0);
        if (ls.index_head_dim)
          ls.index_keys.shrink_to(0);
      }
    }
    return Status(
        StatusCode::kResourceExhausted,
        str_format("no state memory to fork sequence %lld", static_cast<long long>(src.id_)));
  }
  std::vector<std::pair<int32_t, int32_t>> local;
  auto pair_pages = [&](const PagedRows& a, const PagedRows& b, int64_t rows) {
    const int64_t n = std::min<int64_t>(a.pages_for(rows), a.num_pages());
    for (int64_t i = 0; i < n; ++i) local.emplace_back(a.pages()[i], b.pages()[i]);
  };
  auto copy_layers = [&](const std::vector<LayerState>& from, std::vector<LayerState>& to) {
    for (size_t l = 0; l < from.size(); ++l) {
      const LayerState& a = from[l];
      LayerState& b = to[l];
      pair_pages(a.ring, b.ring, a.ring_capacity);
      if (a.ratio == 0)
        continue;
      pair_pages(a.entries, b.entries, a.num_entries);
      if (a.index_head_dim)
        pair_pages(a.index_keys, b.index_keys, a.num_entries);
      b.num_entries = a.num_entries;
      for (int k = 0; k < 2; ++k) {
        const CompressorRows& ra = k == 0 ? a.comp_rows : a.index_rows;
        CompressorRows& rb = k == 0 ? b.comp_rows : b.index_rows;
        if (!ra.enabled())
          continue;
        pair_pages(ra.rows(), rb.rows(), ra.capacity());
        rb.copy_positions_from(ra);
      }
    }
  };
  copy_layers(src.layers_, layers_);
  copy_layers(src.mtp_layers_, mtp_layers_);
  if (!final_positions_.empty()) {
    pair_pages(src.final_streams_, final_streams_, max_rollback_ + 1);
    final_positions_ = src.final_positions_;
  }
  num_tokens_ = src.num_tokens_;
  mtp_num_tokens_ = src.mtp_num_tokens_;
  for (size_t l = 0; l < mtp_layers_.size(); ++l)
    mtp_layers_[l].window_floor = src.mtp_layers_[l].window_floor;
  history_ = src.history_;
  history_first_ = src.history_first_;
  rollback_floor_ = src.rollback_floor_;
  if (arena_->has_host_storage()) {
    const size_t bytes = static_cast<size_t>(arena_->page_bytes());
    for (const auto& [from, to] : local) std::memcpy(arena_->page(to), arena_->page(from), bytes);
  } else if (pairs) {
    pairs->insert(pairs->end(), local.begin(), local.end());
  }
  check_integrity();
  return Status();
}

StateBytes SequenceState::bytes() const {
  const int64_t pb = arena_->page_bytes();
  StateBytes b;
  for (const auto& ls : layers_) {
    b.window += ls.ring.num_pages() * pb;
    b.compressed += ls.entries.num_pages() * pb;
    b.index_keys += ls.index_keys.num_pages() * pb;
    b.partial += (ls.comp_rows.num_pages() + ls.index_rows.num_pages()) * pb;
  }
  for (const auto& ls : mtp_layers_) {
    b.mtp += (ls.ring.num_pages() + ls.entries.num_pages() + ls.comp_rows.num_pages()) * pb;
  }
  b.mtp += final_streams_.num_pages() * pb;
  return b;
}

void SequenceState::check_integrity() const {
  DSI_CHECK(num_tokens_ >= 0, "negative token count");
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerState& ls = layers_[l];
    DSI_CHECK(ls.ring.capacity() >= ls.ring_capacity,
              "layer %zu ring has %lld of %lld slots",
              l,
              static_cast<long long>(ls.ring.capacity()),
              static_cast<long long>(ls.ring_capacity));
    DSI_CHECK(ls.ring_capacity >= sliding_window_, "layer %zu ring smaller than the window", l);
    for (int32_t p : ls.ring.pages()) {
      const PageOwner& o = arena_->owner(p);
      DSI_CHECK(o.sequence == id_ && o.layer == static_cast<int32_t>(l),
                "layer %zu ring page %d owned by sequence %lld layer %d",
                l,
                p,
                static_cast<long long>(o.sequence),
                o.layer);
    }
    if (ls.ratio == 0) {
      DSI_CHECK(ls.num_entries == 0, "sliding layer %zu has entries", l);
      continue;
    }
    const int64_t n_entries = num_tokens_ / ls.ratio;
    DSI_CHECK(ls.num_entries == n_entries,
              "layer %zu: %lld entries for %lld tokens (ratio %lld)",
              l,
              static_cast<long long>(ls.num_entries),
              static_cast<long long>(num_tokens_),
              static_cast<long long>(ls.ratio));
    DSI_CHECK(ls.entries.capacity() >= n_entries, "layer %zu: entries exceed their pages", l);
    if (ls.index_head_dim) {
      DSI_CHECK(ls.index_keys.capacity() >= n_entries, "layer %zu: index keys exceed pages", l);
    }
    const CompressorRows* rows[2] = {&ls.comp_rows, &ls.index_rows};
    for (const CompressorRows* r : rows) {
      if (!r->enabled())
        continue;
      DSI_CHECK(r->end_pos() == num_tokens_,
                "layer %zu: compressor rows end at %lld but %lld tokens were processed",
                l,
                static_cast<long long>(r->end_pos()),
                static_cast<long long>(num_tokens_));
      const int64_t overlap = ls.attention == AttentionType::kCsa ? 1 : 0;
      const int64_t needed = std::max<int64_t>(0, (num_tokens_ / ls.ratio - overlap) * ls.ratio);
      DSI_CHECK(r->first_pos() <= needed,
                "layer %zu: rows start at %lld, pooling needs %lld",
                l,
                static_cast<long long>(r->first_pos()),
                static_cast<long long>(needed));
      DSI_CHECK(r->end_pos() - r->first_pos() <= r->capacity(), "layer %zu: ring overflow", l);
    }
  }
  DSI_CHECK(mtp_layers_.empty() || mtp_num_tokens_ <= std::max<int64_t>(0, num_tokens_ - 1),
            "MTP is ahead of the main model");
  for (const LayerState& ls : mtp_layers_) {
    DSI_CHECK(ls.window_floor >= 0 && ls.window_floor <= num_tokens_,
              "MTP window floor %lld past the sequence (%lld tokens)",
              static_cast<long long>(ls.window_floor),
              static_cast<long long>(num_tokens_));
  }
  for (const LayerState& ls : layers_)
    DSI_CHECK(ls.window_floor == 0, "a main layer with a window floor");
}

}  // namespace dsinfer::state
