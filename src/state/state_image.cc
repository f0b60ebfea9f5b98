// State images: capture a sequence's decode state into packed rows, and restore it.
//
// Layout (little-endian): magic "DSISTIMG", u32 version, i64 num_tokens, i64 mtp_num_tokens,
// u32 layer count, u32 MTP layer count, i64 final-stream slots, [version 2: i64 token-history
// count, u8 per layer then per MTP layer (1 = window ring stored), u8 (1 = compressor rows
// stored)], then per layer a shape record (ratio, head_dim, index_head_dim, ring_capacity,
// num_entries, and per compressor ring its width, capacity, first and end positions), the
// final-stream positions, [version 2: the token ids of positions [num_tokens - count,
// num_tokens) as i32], then the float rows in the same order: per layer ring [ring_capacity x
// head_dim] (when stored), entries [num_entries x head_dim], index keys [num_entries x
// index_head_dim], main then index compressor rows for positions [first, end) in position order
// (when stored; otherwise first = end = num_tokens); then the final streams.
//
// Version 1 is V4's layout (no token history, everything stored); a state with a token history
// (DeepSeek V4.1) or ImageOptions that leave parts out give version 2. Each state and option set
// has exactly one image version, so that a restored image captures back to the same bytes.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "base/bytes.h"
#include "base/check.h"
#include "base/strings.h"
#include "state/sequence_state.h"

namespace dsinfer::state {
namespace {
constexpr char kMagic[8] = {'D', 'S', 'I', 'S', 'T', 'I', 'M', 'G'};
constexpr uint32_t kVersionFull = 1;  // V4: no token history, nothing left out
constexpr uint32_t kVersionPartial = 2;

struct RowsShape {
  int64_t width = 0, capacity = 0, first = 0, end = 0;
};
struct ImageLayerShape {
  int64_t ratio = 0, head_dim = 0, index_head_dim = 0, ring_capacity = 0, num_entries = 0;
  RowsShape comp, index;
};

ImageLayerShape shape_of(const LayerState& ls) {
  ImageLayerShape s;
  s.ratio = ls.ratio;
  s.head_dim = ls.head_dim;
  s.index_head_dim = ls.index_head_dim;
  s.ring_capacity = ls.ring_capacity;
  s.num_entries = ls.num_entries;
  auto rows = [](const CompressorRows& r) {
    return RowsShape{r.enabled() ? 2 * r.width() : 0, r.capacity(), r.first_pos(), r.end_pos()};
  };
  s.comp = rows(ls.comp_rows);
  s.index = rows(ls.index_rows);
  return s;
}

void put_shape(std::string& s, const ImageLayerShape& l) {
  for (int64_t v : {l.ratio,
                    l.head_dim,
                    l.index_head_dim,
                    l.ring_capacity,
                    l.num_entries,
                    l.comp.width,
                    l.comp.capacity,
                    l.comp.first,
                    l.comp.end,
                    l.index.width,
                    l.index.capacity,
                    l.index.first,
                    l.index.end})
    append_pod(s, v);
}

bool get_shape(ByteReader& r, ImageLayerShape* l) {
  int64_t* f[] = {&l->ratio,
                  &l->head_dim,
                  &l->index_head_dim,
                  &l->ring_capacity,
                  &l->num_entries,
                  &l->comp.width,
                  &l->comp.capacity,
                  &l->comp.first,
                  &l->comp.end,
                  &l->index.width,
                  &l->index.capacity,
                  &l->index.first,
                  &l->index.end};
  for (int64_t* v : f) {
    if (!r.get(v))
      return false;
  }
  return true;
}

struct AllWritten {
  bool operator()(int64_t) const { return true; }
};

bool all_zero_bits(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    if (u != 0)
      return false;
  }
  return true;
}

class Capturer {
 public:
  Capturer(const PageArena& arena, const PageReader& read, std::string* out)
      : page_floats_(arena.page_bytes() / 4), read_(&read), out_(out) {}
  // A capturer that only plans a capture: lists the pages it reads, in the order it reads them,
  // and (with `segments`) where each of its rows comes from.
  explicit Capturer(std::vector<int32_t>* pages, std::vector<ImageSegment>* segments = nullptr)
      : pages_(pages), segments_(segments) {}
  // Appends rows `row_of(i)` for i in [0, n) of `rows`; rows with !written(i) (slots the sequence
  // has not written: their pages may hold an earlier sequence's data) as zeros.
  template <typename RowOf, typename Written = AllWritten>
  Status rows(const PagedRows& rows, int64_t n, RowOf row_of, Written written = {}) {
    if (n <= 0)
      return Status();
    if (pages_) {
      pages_->insert(pages_->end(), rows.pages().begin(), rows.pages().end());
      if (segments_)
        plan_rows(rows, n, row_of, written);
      return Status();
    }
    buf_.resize(static_cast<size_t>(rows.num_pages() * page_floats_));
    DSI_RETURN_IF_ERROR((*read_)(rows.pages(), buf_.data()));
    const int64_t rpp = rows.rows_per_page();
    const size_t bytes = static_cast<size_t>(rows.width()) * 4;
    for (int64_t i = 0; i < n; ++i) {
      if (!written(i)) {
        out_->append(bytes, '\0');
        continue;
      }
      const int64_t row = row_of(i);
      const float* src = buf_.data() + (row / rpp) * page_floats_ + (row % rpp) * rows.width();
      out_->append(reinterpret_cast<const char*>(src), bytes);
    }
    return Status();
  }

 private:
  // Planning: one segment per row (zeros, or `width` floats of an arena page), merged with the
  // previous one where they continue each other.
  template <typename RowOf, typename Written>
  void plan_rows(const PagedRows& rows, int64_t n, RowOf row_of, Written written) {
    const int64_t rpp = rows.rows_per_page();
    for (int64_t i = 0; i < n; ++i) {
      ImageSegment g;
      g.floats = rows.width();
      if (written(i)) {
        const int64_t row = row_of(i);
        g.page = rows.pages()[static_cast<size_t>(row / rpp)];
        g.offset = (row % rpp) * rows.width();
      }
      if (!segments_->empty()) {
        ImageSegment& b = segments_->back();
        if (b.page == g.page && (g.page < 0 || b.offset + b.floats == g.offset)) {
          b.floats += g.floats;
          continue;
        }
      }
      segments_->push_back(g);
    }
  }

  int64_t page_floats_ = 0;
  const PageReader* read_ = nullptr;
  std::string* out_ = nullptr;
  std::vector<int32_t>* pages_ = nullptr;  // planning only
  std::vector<ImageSegment>* segments_ = nullptr;
  std::vector<float> buf_;
};

class Restorer {
 public:
  Restorer(const PageArena& arena, const PageWriter& write, ByteReader* in)
      : page_floats_(arena.page_bytes() / 4), write_(write), in_(in) {}
  // Reads n rows from the image into rows `row_of(i)` of `rows` (pages already held) and writes
  // the pages. Rows with !written(i) must be zeros, as Capturer::rows writes them.
  template <typename RowOf, typename Written = AllWritten>
  Status rows(const PagedRows& rows, int64_t n, RowOf row_of, Written written = {}) {
    if (n <= 0)
      return Status();
    buf_.assign(static_cast<size_t>(rows.num_pages() * page_floats_), 0.0f);
    const int64_t rpp = rows.rows_per_page();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = row_of(i);
      DSI_CHECK(row / rpp < rows.num_pages(),
                "restored row %lld beyond the held pages",
                static_cast<long long>(row));
      float* dst = buf_.data() + (row / rpp) * page_floats_ + (row % rpp) * rows.width();
      if (!in_->floats(dst, rows.width()))
        return data_loss("state image truncated");
      if (!written(i) && !all_zero_bits(dst, rows.width()))
        return data_loss("state image has data in slots the sequence never wrote");
    }
    return write_(rows.pages(), buf_.data());
  }

 private:
  int64_t page_floats_;
  const PageWriter& write_;
  ByteReader* in_;
  std::vector<float> buf_;
};

// ring_written: the ring slots the sequence has written (a ring of capacity C holds position p
// in slot p % C, so slots [0, min(C, tokens)) after `tokens` positions).
Status capture_layer(
    const LayerState& ls, bool ring, int64_t ring_written, bool comp_rows, Capturer& c) {
  if (ring)
    DSI_RETURN_IF_ERROR(c.rows(
        ls.ring,
        ls.ring_capacity,
        [](int64_t i) { return i; },
        [ring_written](int64_t i) { return i < ring_written; }));
  if (ls.ratio == 0)
    return Status();
  DSI_RETURN_IF_ERROR(c.rows(ls.entries, ls.num_entries, [](int64_t i) { return i; }));
  if (ls.index_head_dim)
    DSI_RETURN_IF_ERROR(c.rows(ls.index_keys, ls.num_entries, [](int64_t i) { return i; }));
  for (const CompressorRows* r : {&ls.comp_rows, &ls.index_rows}) {
    if (!r->enabled() || !comp_rows)
      continue;
    DSI_RETURN_IF_ERROR(c.rows(r->rows(), r->end_pos() - r->first_pos(), [r](int64_t i) {
      return r->ring_row(r->first_pos() + i);
    }));
  }
  return Status();
}

bool same_fixed_shape(const ImageLayerShape& a, const ImageLayerShape& b) {
  return a.ratio == b.ratio && a.head_dim == b.head_dim && a.index_head_dim == b.index_head_dim &&
         a.ring_capacity == b.ring_capacity && a.comp.width == b.comp.width &&
         a.comp.capacity == b.comp.capacity && a.index.width == b.index.width &&
         a.index.capacity == b.index.capacity;
}

// The image's shape must be one a real sequence of this layer can be in after num_tokens.
// comp_rows false: the image holds no compressor rows, which is only consistent where no
// compression group is open (num_tokens a multiple of the ratio).
Status check_shape(const ImageLayerShape& img,
                   const ImageLayerShape& fresh,
                   int64_t num_tokens,
                   size_t l,
                   bool comp_rows = true) {
  if (!same_fixed_shape(img, fresh))
    return invalid_argument(str_format("state image layer %zu has another layout", l));
  // A disabled ring holds nothing (also in sliding layers: an image is canonical, so that a
  // restored state captures back to the same bytes).
  for (const RowsShape* r : {&img.comp, &img.index}) {
    if (r->width == 0 && (r->first != 0 || r->end != 0))
      return data_loss(str_format("state image layer %zu: rows in a disabled ring", l));
  }
  if (img.ratio == 0) {
    if (img.num_entries != 0)
      return data_loss(str_format("state image layer %zu: entries in a sliding layer", l));
    return Status();
  }
  if (img.num_entries != num_tokens / img.ratio)
    return data_loss(str_format("state image layer %zu: entry count inconsistent", l));
  for (const RowsShape* r : {&img.comp, &img.index}) {
    if (r->width == 0)
      continue;
    if (!comp_rows) {
      // Spec deepseek-v41.md §5.3: "a ratio-2 group never straddles a 128-token boundary";
      // checked here for every image rather than assumed.
      if (num_tokens % img.ratio != 0 || r->first != num_tokens || r->end != num_tokens)
        return data_loss(str_format(
            "state image layer %zu: no compressor rows, but a compression group is open", l));
      continue;
    }
    const int64_t overlap = img.index_head_dim > 0 ? 1 : 0;
    const int64_t needed = std::max<int64_t>(0, (num_tokens / img.ratio - overlap) * img.ratio);
    if (r->end != num_tokens || r->first < 0 || r->first > r->end || r->first > needed ||
        r->end - r->first > r->capacity)
      return data_loss(str_format("state image layer %zu: compressor rows inconsistent", l));
  }
  return Status();
}
}  // namespace

bool ImageOptions::full() const {
  return !skip_compressor_rows &&
         std::all_of(skip_rings.begin(), skip_rings.end(), [](uint8_t v) { return v == 0; });
}

namespace {
// Positions written to a layer's ring: main layers and V4.1's extra (DSpark) rings follow the
// sequence; V4's MTP ring follows the MTP block (mtp_num_tokens, 0 before it ran).
int64_t ring_written(const SequenceState& st, bool main_layers) {
  return main_layers || st.history_capacity() > 0 ? st.num_tokens() : st.mtp_num_tokens();
}
// Final-stream slots in use (an unused slot's position is -1).
auto final_written(const std::vector<int64_t>& positions) {
  return [&positions](int64_t i) { return positions[static_cast<size_t>(i)] >= 0; };
}
// The image version a state and option set give (exactly one, so that images are canonical).
uint32_t image_version(const SequenceState& st, const ImageOptions& o) {
  return st.history_capacity() == 0 && o.full() ? kVersionFull : kVersionPartial;
}
// Whether the ring of layer i (layers, then MTP/extra layers) is stored.
bool ring_stored(const ImageOptions& o, size_t i) {
  return o.skip_rings.empty() || o.skip_rings[i] == 0;
}
}  // namespace

// capture_state's body over a capturer that either builds the image or lists its pages (a
// friend of SequenceState).
struct ImageAccess {
  template <typename C>
  static Status capture(const SequenceState& st,
                        C& c,
                        const ImageOptions& options,
                        std::string& out);
};

template <typename C>
Status ImageAccess::capture(const SequenceState& st,
                            C& c,
                            const ImageOptions& options,
                            std::string& out) {
  if (st.mtp_num_tokens_ != 0 && st.history_capacity() > 0)
    return unimplemented("state images of V4.1 sequences with an MTP position count");
  if (st.num_tokens_ < 1)
    return invalid_argument("no state to capture (empty sequence)");
  const size_t n_rings = st.layers_.size() + st.mtp_layers_.size();
  DSI_CHECK(options.skip_rings.empty() || options.skip_rings.size() == n_rings,
            "image options name %zu rings, the state has %zu",
            options.skip_rings.size(),
            n_rings);
  const bool comp_rows = !options.skip_compressor_rows;
  if (!comp_rows) {
    // Without compressor rows the image must end where no compression group is open.
    for (size_t l = 0; l < st.layers_.size(); ++l) {
      const LayerState& ls = st.layers_[l];
      if ((ls.comp_rows.enabled() || ls.index_rows.enabled()) && st.num_tokens_ % ls.ratio != 0)
        return failed_precondition(
            str_format("state image without compressor rows at %lld tokens: layer %zu's "
                       "ratio-%lld compression group is still open",
                       static_cast<long long>(st.num_tokens_),
                       l,
                       static_cast<long long>(ls.ratio)));
    }
  }
  const uint32_t version = image_version(st, options);
  out.assign(kMagic, sizeof(kMagic));
  append_pod(out, version);
  append_pod(out, st.num_tokens_);
  append_pod(out, st.mtp_num_tokens_);
  append_pod(out, static_cast<uint32_t>(st.layers_.size()));
  append_pod(out, static_cast<uint32_t>(st.mtp_layers_.size()));
  append_pod(out, static_cast<int64_t>(st.final_positions_.size()));
  const int64_t history = st.num_tokens_ - st.history_begin();
  if (version == kVersionPartial) {
    append_pod(out, st.history_capacity() > 0 ? history : int64_t{0});
    for (size_t i = 0; i < n_rings; ++i)
      append_pod(out, static_cast<uint8_t>(ring_stored(options, i) ? 1 : 0));
    append_pod(out, static_cast<uint8_t>(comp_rows ? 1 : 0));
  }
  for (const auto* v : {&st.layers_, &st.mtp_layers_}) {
    for (const LayerState& ls : *v) {
      ImageLayerShape sh = shape_of(ls);
      if (!comp_rows) {
        for (RowsShape* r : {&sh.comp, &sh.index}) {
          if (r->width > 0)
            r->first = r->end = v == &st.layers_ ? st.num_tokens_ : 0;
        }
      }
      put_shape(out, sh);
    }
  }
  for (int64_t p : st.final_positions_) append_pod(out, p);
  if (version == kVersionPartial && st.history_capacity() > 0) {
    for (int64_t p = st.history_begin(); p < st.num_tokens_; ++p) append_pod(out, st.token(p));
  }
  size_t i = 0;
  for (const auto* v : {&st.layers_, &st.mtp_layers_}) {
    const int64_t written = ring_written(st, v == &st.layers_);
    for (const LayerState& ls : *v)
      DSI_RETURN_IF_ERROR(capture_layer(ls, ring_stored(options, i++), written, comp_rows, c));
  }
  if (!st.final_positions_.empty()) {
    DSI_RETURN_IF_ERROR(c.rows(
        st.final_streams_,
        static_cast<int64_t>(st.final_positions_.size()),
        [](int64_t i) { return i; },
        final_written(st.final_positions_)));
  }
  return Status();
}

Result<std::string> capture_state(const SequenceState& st,
                                  const PageReader& read,
                                  const ImageOptions& options) {
  std::string out;
  Capturer c(*st.arena(), read, &out);
  DSI_RETURN_IF_ERROR(ImageAccess::capture(st, c, options, out));
  return out;
}

namespace {
// The planning capture: the head, the pages in the order of their first read and (with
// `segments`) the rows' sources, their page ids replaced by indices into `pages`.
Status plan(const SequenceState& st,
            const ImageOptions& options,
            std::string* head,
            std::vector<int32_t>* pages,
            std::vector<ImageSegment>* segments) {
  std::vector<int32_t> listed;
  Capturer c(&listed, segments);
  DSI_RETURN_IF_ERROR(ImageAccess::capture(st, c, options, *head));
  // Each page once, in the order of its first read.
  std::unordered_map<int32_t, int32_t> slot;
  for (int32_t p : listed) {
    if (slot.emplace(p, static_cast<int32_t>(pages->size())).second)
      pages->push_back(p);
  }
  if (segments) {
    for (ImageSegment& g : *segments) {
      if (g.page >= 0)
        g.page = slot.at(g.page);
    }
  }
  return Status();
}
}  // namespace

Result<std::vector<int32_t>> image_pages(const SequenceState& st, const ImageOptions& options) {
  std::string head;
  std::vector<int32_t> pages;
  DSI_RETURN_IF_ERROR(plan(st, options, &head, &pages, nullptr));
  return pages;
}

Result<ImagePlan> plan_image(const SequenceState& st, const ImageOptions& options) {
  ImagePlan p;
  p.page_floats = st.arena()->page_bytes() / 4;
  DSI_RETURN_IF_ERROR(plan(st, options, &p.head, &p.pages, &p.segments));
  p.image_bytes = p.head.size();
  for (const ImageSegment& g : p.segments) p.image_bytes += static_cast<size_t>(g.floats) * 4;
  return p;
}

Result<std::string> assemble_image(const ImagePlan& plan, std::span<const float> pages) {
  const size_t pf = static_cast<size_t>(plan.page_floats);
  if (pages.size() != plan.pages.size() * pf)
    return invalid_argument(str_format(
        "assemble_image: %zu floats for %zu pages of %zu", pages.size(), plan.pages.size(), pf));
  std::string out;
  out.reserve(plan.image_bytes);
  out.append(plan.head);
  for (const ImageSegment& g : plan.segments) {
    const size_t bytes = static_cast<size_t>(g.floats) * 4;
    if (g.page < 0) {
      out.append(bytes, '\0');
      continue;
    }
    const float* src = pages.data() + static_cast<size_t>(g.page) * pf + g.offset;
    out.append(reinterpret_cast<const char*>(src), bytes);
  }
  return out;
}

Result<int64_t> state_image_tokens(std::string_view image) {
  ByteReader r(image);
  char magic[8];
  uint32_t version = 0;
  int64_t n = 0;
  if (!r.get(&magic) || std::memcmp(magic, kMagic, 8) != 0 || !r.get(&version) ||
      (version != kVersionFull && version != kVersionPartial) || !r.get(&n) || n < 0)
    return data_loss("not a state image");
  return n;
}

Status restore_state(std::string_view image,
                     SequenceState& st,
                     const PageWriter& write,
                     const ImageOptions& options) {
  DSI_CHECK(st.num_tokens_ == 0, "restore_state needs a fresh sequence");
  const size_t n_rings = st.layers_.size() + st.mtp_layers_.size();
  DSI_CHECK(options.skip_rings.empty() || options.skip_rings.size() == n_rings,
            "image options name %zu rings, the state has %zu",
            options.skip_rings.size(),
            n_rings);
  ByteReader r(image);
  char magic[8];
  uint32_t version = 0, n_layers = 0, n_mtp = 0;
  int64_t num_tokens = 0, mtp_tokens = 0, n_final = 0;
  if (!r.get(&magic) || std::memcmp(magic, kMagic, 8) != 0 || !r.get(&version))
    return data_loss("not a state image");
  if (version != kVersionFull && version != kVersionPartial)
    return data_loss(str_format("state image version %u unsupported", version));
  if (version != image_version(st, options))
    return invalid_argument(
        str_format("state image version %u is for another state layout or image options", version));
  if (!r.get(&num_tokens) || !r.get(&mtp_tokens) || !r.get(&n_layers) || !r.get(&n_mtp) ||
      !r.get(&n_final))
    return data_loss("state image truncated");
  if (n_layers != st.layers_.size() || n_mtp != st.mtp_layers_.size() ||
      n_final != static_cast<int64_t>(st.final_positions_.size()))
    return invalid_argument("state image is for another model or rollback limit");
  // The MTP block (V4) at most one position behind the sequence (it reads the next token); none
  // in a state without one, or with a token history (V4.1).
  const bool mtp_ok = mtp_tokens == 0 || (n_mtp > 0 && st.history_capacity() == 0 &&
                                          mtp_tokens > 0 && mtp_tokens <= num_tokens - 1);
  if (num_tokens < 1 || !mtp_ok)
    return data_loss("state image token counts inconsistent");
  const bool comp_rows = !options.skip_compressor_rows;
  int64_t history = 0;
  if (version == kVersionPartial) {
    if (!r.get(&history))
      return data_loss("state image truncated");
    const int64_t want =
        st.history_capacity() > 0 ? std::min(num_tokens, st.history_capacity()) : 0;
    if (history != want)
      return data_loss("state image token history inconsistent");
    for (size_t i = 0; i < n_rings; ++i) {
      uint8_t stored = 0;
      if (!r.get(&stored))
        return data_loss("state image truncated");
      if (stored != (ring_stored(options, i) ? 1 : 0))
        return invalid_argument("state image stores other window rings than this cache's mode");
    }
    uint8_t stored = 0;
    if (!r.get(&stored))
      return data_loss("state image truncated");
    if (stored != (comp_rows ? 1 : 0))
      return invalid_argument("state image's compressor rows do not match this cache's mode");
  }
  std::vector<ImageLayerShape> shapes(n_layers + n_mtp);
  for (size_t l = 0; l < shapes.size(); ++l) {
    if (!get_shape(r, &shapes[l]))
      return data_loss("state image truncated");
    const LayerState& ls = l < n_layers ? st.layers_[l] : st.mtp_layers_[l - n_layers];
    // MTP layers: at the MTP block's position count.
    DSI_RETURN_IF_ERROR(
        check_shape(shapes[l], shape_of(ls), l < n_layers ? num_tokens : mtp_tokens, l, comp_rows));
  }
  std::vector<int64_t> finals(static_cast<size_t>(n_final));
  for (auto& p : finals) {
    if (!r.get(&p) || p < -1 || p >= num_tokens)
      return data_loss("state image final-stream positions invalid");
  }
  std::vector<int32_t> ids(static_cast<size_t>(history));
  for (auto& id : ids) {
    if (!r.get(&id))
      return data_loss("state image truncated");
    if (id < 0)
      return data_loss("state image token history has a negative id");
  }
  // Reserve the growing parts; a failure leaves the sequence fresh.
  auto undo = [&st] {
    for (auto* v : {&st.layers_, &st.mtp_layers_}) {
      for (LayerState& ls : *v) {
        ls.num_entries = 0;
        if (ls.ratio == 0)
          continue;
        ls.entries.shrink_to(0);
        if (ls.index_head_dim)
          ls.index_keys.shrink_to(0);
        ls.comp_rows.set_positions(0, 0);
        ls.index_rows.set_positions(0, 0);
      }
    }
  };
  for (size_t l = 0; l < n_layers; ++l) {
    LayerState& ls = st.layers_[l];
    if (ls.ratio == 0)
      continue;
    bool ok = ls.entries.reserve(shapes[l].num_entries);
    if (ls.index_head_dim)
      ok = ok && ls.index_keys.reserve(shapes[l].num_entries);
    if (!ok) {
      undo();
      return Status(StatusCode::kResourceExhausted, "no state memory to restore a cached prefix");
    }
  }
  Restorer in(*st.arena_, write, &r);
  auto restore_layer =
      [&](LayerState& ls, const ImageLayerShape& s, bool ring, int64_t written) -> Status {
    if (ring)
      DSI_RETURN_IF_ERROR(in.rows(
          ls.ring,
          ls.ring_capacity,
          [](int64_t i) { return i; },
          [written](int64_t i) { return i < written; }));
    if (ls.ratio == 0)
      return Status();
    DSI_RETURN_IF_ERROR(in.rows(ls.entries, s.num_entries, [](int64_t i) { return i; }));
    if (ls.index_head_dim)
      DSI_RETURN_IF_ERROR(in.rows(ls.index_keys, s.num_entries, [](int64_t i) { return i; }));
    ls.num_entries = s.num_entries;
    CompressorRows* rows[2] = {&ls.comp_rows, &ls.index_rows};
    const RowsShape* rs[2] = {&s.comp, &s.index};
    for (int k = 0; k < 2; ++k) {
      if (!rows[k]->enabled())
        continue;
      rows[k]->set_positions(rs[k]->first, rs[k]->end);
      CompressorRows* c = rows[k];
      DSI_RETURN_IF_ERROR(in.rows(c->rows(), rs[k]->end - rs[k]->first, [c](int64_t i) {
        return c->ring_row(c->first_pos() + i);
      }));
    }
    return Status();
  };
  Status s;
  for (size_t l = 0; l < shapes.size() && s.ok(); ++l) {
    LayerState& ls = l < n_layers ? st.layers_[l] : st.mtp_layers_[l - n_layers];
    const bool main_layer = l < n_layers;
    const int64_t written = main_layer || st.history_capacity() > 0 ? num_tokens : mtp_tokens;
    s = restore_layer(ls, shapes[l], ring_stored(options, l), written);
  }
  if (s.ok() && n_final > 0)
    s = in.rows(
        st.final_streams_, n_final, [](int64_t i) { return i; }, final_written(finals));
  if (s.ok() && r.left() != 0)
    s = data_loss("state image has trailing bytes");
  if (!s.ok()) {
    undo();
    return s;
  }
  st.num_tokens_ = num_tokens;
  st.mtp_num_tokens_ = mtp_tokens;
  st.final_positions_ = std::move(finals);
  if (st.history_capacity() > 0) {
    const int64_t cap = st.history_capacity();
    for (int64_t i = 0; i < history; ++i) {
      const int64_t p = num_tokens - history + i;
      st.history_[static_cast<size_t>(p % cap)] = ids[static_cast<size_t>(i)];
    }
    st.history_first_ = std::max<int64_t>(0, num_tokens - cap);
  }
  st.rollback_floor_ = comp_rows ? 0 : num_tokens;
  st.check_integrity();
  return Status();
}

}  // namespace dsinfer::state
