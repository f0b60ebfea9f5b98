// plan_pass: the CPU forward's row walk (backend/cpu/attention.cc) turned into key references.
#include "backend/cuda/forward_plan.h"

#include <algorithm>

#include "base/check.h"

namespace dsinfer::gpu {
namespace {

using model::AttentionType;

constexpr int64_t kNone = -1;

state::LayerState& layer_state(const SeqSpan& s, size_t layer) {
  return s.mtp ? s.st->mtp_layers()[0] : s.st->layers()[layer];
}

int64_t bucket(int64_t v) {
  int64_t b = 64;
  while (b < v) b *= 2;
  return b;
}

// Fixed-shape passes (graph-replayed steps) size their per-sequence arrays for every padded
// sequence and their page lists and key lists by bounds that move only by powers of two, so that
// the plan's layout -- part of the graph's key -- stays the same from step to step: as a short
// context grows (window keys up to the window, a sequence's first entry pages) and as the
// sequences of a padded batch finish (the bundled model's speculative decode met a new layout at
// most steps of a wave's tail; twelfth session). Padding entries are never read.
template <typename T>
void pad_to(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n)
    v.resize(static_cast<size_t>(n), T{});
}

// The planner's working arrays, kept from pass to pass on each thread: a 256-sequence decode step
// of the bundled model built ~150 vectors per pass (a tenth of its planning time in allocation),
// and storage that is reused is also warm in the cache. Every use starts with assign or clear.
struct Scratch {
  struct Compressor {  // plan_compressor
    std::vector<int64_t> local_dest, ring_dest, refs, block, out_off, closed;
  } comp;
  struct Rows {  // plan_pass: the pass's rows and spans
    std::vector<int32_t> tok, row_span;
    std::vector<int64_t> pos, span_pos;
  } rows;
  struct Layer {  // plan_pass: one layer's arrays (declaration order: the binding's)
    std::vector<int64_t> key_begin, ring_dest, select_begin, index_page_begin, entry_page_begin,
        visible;
    std::vector<int32_t> index_pages, entry_pages, ring_pages, ring_page_begin, hca_pages,
        hca_page_begin;
  } layer;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// A layer's arrays in the pack: the slots HostPack::add_slots set aside for it, filled in order
// (layer_arrays of them), so that layers can be planned on several threads at once and still
// give the pack, and so the layout, that planning them one after another gives.
struct Slots {
  HostPack* pack = nullptr;
  int32_t next = 0;
  int32_t end = 0;
  template <typename T>
  int32_t add(const std::vector<T>& v) {
    DSI_CHECK(next < end, "a layer plans more pack arrays than layer_arrays counts");
    pack->put(next, v);
    return next++;
  }
  template <typename T>
  int32_t reserve_device(int64_t count) {
    DSI_CHECK(next < end, "a layer plans more pack arrays than layer_arrays counts");
    pack->put_device<T>(next, count);
    return next++;
  }
};

// The pack arrays plan_layer adds for a layer: each compressor's five, then the attention's
// key_begin, key_refs, ring_pages, ring_page_begin and ring_dest, HCA's two entry page lists and
// CSA's six indexer arrays.
int32_t layer_arrays(const model::LayerPlan& plan) {
  const bool csa = plan.attention == AttentionType::kCsa;
  const bool hca = plan.attention == AttentionType::kHca;
  return (csa ? 10 : hca ? 5 : 0) + 5 + (hca ? 2 : 0) + (csa ? 6 : 0);
}

// Passes of at least this many rows plan their layers on the context's pool (PlanContext::pool):
// a 256-sequence decode step of the bundled model spent 0.16 ms planning on the device host,
// 10% of the step's GPU time (docs/performance.md, thirty-fourth session), 0.21 ms in the plan
// test on an H100 host against 0.14 ms on four threads. At 64 rows (0.05 ms) the threads'
// wake-ups cost what they saved (thirty-fifth session).
constexpr int64_t kParallelRows = 128;

// The compressor of one layer over every span: candidate references of the entries that close
// in this pass (rows before the pass from the ring, rows of the pass from the local buffer),
// then the metadata appends. `index` selects the indexer compressor.
CompressorPlan plan_compressor(const PlanContext& ctx,
                               const std::vector<SeqSpan>& spans,
                               size_t layer,
                               const model::LayerPlan& plan,
                               bool index,
                               int64_t rows,
                               Slots& pack) {
  const auto& c = *ctx.config;
  const bool overlap = plan.attention == AttentionType::kCsa;
  const int64_t m = plan.compress_ratio;
  const int64_t d = index ? c.index_head_dim : c.head_dim;
  const int64_t row_width = 2 * (overlap ? 2 : 1) * d;  // [kv | score]
  const int64_t nc = (overlap ? 2 : 1) * m;
  auto& [local_dest, ring_dest, refs, block, out_off, closed] = scratch().comp;
  local_dest.assign(static_cast<size_t>(rows), kNone);
  ring_dest.assign(static_cast<size_t>(rows), kNone);
  refs.clear();
  block.clear();
  out_off.clear();
  for (const SeqSpan& s : spans) {
    state::LayerState& ls = layer_state(s, layer);
    state::CompressorRows& cr = index ? ls.index_rows : ls.comp_rows;
    const state::PagedRows& dest = index ? ls.index_keys : ls.entries;
    DSI_CHECK(cr.end_pos() == s.first,
              "compressor rows end at %lld, chunk starts at %lld",
              static_cast<long long>(cr.end_pos()),
              static_cast<long long>(s.first));
    auto ref = [&](int64_t p) -> int64_t {
      if (p < s.first)
        return cr.rows().pool_offset(cr.ring_row(p));
      return local_ref((s.begin + p - s.first) * row_width);
    };
    closed.clear();
    for (int64_t t = 0; t < s.n; ++t) {
      const int64_t pos = s.first + t;
      if ((pos + 1) % m != 0)
        continue;
      const int64_t w = (pos + 1) / m - 1;
      if (overlap) {
        for (int64_t p = (w - 1) * m; p < w * m; ++p) refs.push_back(w == 0 ? kNone : ref(p));
      }
      for (int64_t p = w * m; p < (w + 1) * m; ++p) refs.push_back(ref(p));
      block.push_back(w);
      out_off.push_back(dest.pool_offset(w));
      closed.push_back(w);
    }
    for (int64_t t = 0; t < s.n; ++t) {
      const int64_t row = cr.push_row();
      const int64_t r = s.begin + t;
      local_dest[static_cast<size_t>(r)] = local_ref(r * row_width);
      if (t >= s.n - cr.capacity())
        ring_dest[static_cast<size_t>(r)] = cr.rows().pool_offset(row);
    }
    for (int64_t w : closed) {
      if (index)
        ls.check_index_key(w);
      else
        ls.add_entry(w);
    }
  }
  CompressorPlan cp;
  cp.n_entries = static_cast<int64_t>(block.size());
  if (ctx.fixed_shape) {
    DSI_CHECK(cp.n_entries <= rows, "fixed-shape pass closes more entries than rows");
    refs.resize(static_cast<size_t>(rows * nc), kNone);
    block.resize(static_cast<size_t>(rows), -1);
    out_off.resize(static_cast<size_t>(rows), 0);
    cp.n_entries = rows;
  }
  cp.local_dest = pack.add(local_dest);
  cp.ring_dest = pack.add(ring_dest);
  cp.token_refs = pack.add(refs);
  cp.block = pack.add(block);
  cp.out_offset = pack.add(out_off);
  return cp;
}

// One layer of plan_pass: its compressors, then its attention's key counts and page tables.
void plan_layer(const PlanContext& ctx,
                const std::vector<SeqSpan>& spans,
                size_t l,
                const model::LayerPlan& plan,
                int64_t rows,
                int64_t seq_pad,
                Slots& pack,
                LayerPass* out) {
  const auto& c = *ctx.config;
  const int64_t window = c.sliding_window;
  LayerPass& lp = *out;
  const bool csa = plan.attention == AttentionType::kCsa;
  const bool hca = plan.attention == AttentionType::kHca;
  // Compressors first: their entries are written before attention reads them.
  if (csa || hca)
    lp.comp = plan_compressor(ctx, spans, l, plan, false, rows, pack);
  if (csa)
    lp.index_comp = plan_compressor(ctx, spans, l, plan, true, rows, pack);

  // Key counts only: the lists themselves are expanded on the device (launch_expand_keys).
  auto& [key_begin,
         ring_dest,
         select_begin,
         index_page_begin,
         entry_page_begin,
         visible,
         index_pages,
         entry_pages,
         ring_pages,
         ring_page_begin,
         hca_pages,
         hca_page_begin] = scratch().layer;
  key_begin.assign(static_cast<size_t>(rows + 1), 0);
  ring_dest.assign(static_cast<size_t>(rows), kNone);
  select_begin.assign(static_cast<size_t>(rows), 0);
  index_pages.clear();
  entry_pages.clear();
  ring_pages.clear();
  ring_page_begin.clear();
  hca_pages.clear();
  hca_page_begin.clear();
  index_page_begin.assign(static_cast<size_t>(rows), 0);
  entry_page_begin.assign(static_cast<size_t>(rows), 0);
  visible.assign(static_cast<size_t>(rows), 0);
  int64_t max_visible = 0;
  int64_t max_hca = 0;    // HCA entries of a row
  int64_t max_pages = 1;  // entry (and index key) pages of a sequence
  int64_t next_row = 0;
  int64_t nkeys = 0;
  auto close_rows_until = [&](int64_t r) {  // padding rows: no keys (CSA: unused slots)
    for (; next_row < r; ++next_row) {
      if (csa) {
        select_begin[static_cast<size_t>(next_row)] = nkeys;
        nkeys += c.index_topk;
      }
      key_begin[static_cast<size_t>(next_row + 1)] = nkeys;
    }
  };
  for (const SeqSpan& s : spans) {
    close_rows_until(s.begin);
    state::LayerState& ls = layer_state(s, l);
    if (lp.ring_capacity == 0) {
      lp.ring_capacity = ls.ring_capacity;
      lp.ring_rows_per_page = ls.ring.rows_per_page();
      lp.entry_rows_per_page = ls.entries.rows_per_page();
    }
    DSI_CHECK(lp.ring_capacity == ls.ring_capacity &&
                  lp.ring_rows_per_page == ls.ring.rows_per_page() &&
                  lp.entry_rows_per_page == ls.entries.rows_per_page(),
              "sequences of one pass disagree on a layer's ring or entry layout");
    DSI_CHECK(ls.ring.width() == (ctx.kv_width > 0 ? ctx.kv_width : c.head_dim),
              "sequence %lld's K=V rows are %lld floats wide, the pass plans %lld",
              static_cast<long long>(s.st->id()),
              static_cast<long long>(ls.ring.width()),
              static_cast<long long>(ctx.kv_width > 0 ? ctx.kv_width : c.head_dim));
    ring_page_begin.push_back(static_cast<int32_t>(ring_pages.size()));
    ring_pages.insert(ring_pages.end(), ls.ring.pages().begin(), ls.ring.pages().end());
    if (hca) {
      hca_page_begin.push_back(static_cast<int32_t>(hca_pages.size()));
      hca_pages.insert(hca_pages.end(), ls.entries.pages().begin(), ls.entries.pages().end());
    }
    max_pages = std::max<int64_t>({max_pages,
                                   static_cast<int64_t>(ls.entries.pages().size()),
                                   static_cast<int64_t>(ls.index_keys.pages().size())});
    const int64_t ipb = static_cast<int64_t>(index_pages.size());
    const int64_t epb = static_cast<int64_t>(entry_pages.size());
    if (csa) {
      index_pages.insert(
          index_pages.end(), ls.index_keys.pages().begin(), ls.index_keys.pages().end());
      entry_pages.insert(entry_pages.end(), ls.entries.pages().begin(), ls.entries.pages().end());
    }
    for (int64_t t = 0; t < s.n; ++t) {
      const int64_t p0 = s.first + t;
      const int64_t r = s.begin + t;
      nkeys += std::min<int64_t>(p0 + 1, window);
      if (hca) {
        nkeys += (p0 + 1) / plan.compress_ratio;
        max_hca = std::max(max_hca, (p0 + 1) / plan.compress_ratio);
      } else if (csa) {
        const int64_t vis = (p0 + 1) / plan.compress_ratio;
        visible[static_cast<size_t>(r)] = vis;
        max_visible = std::max(max_visible, vis);
        index_page_begin[static_cast<size_t>(r)] = ipb;
        entry_page_begin[static_cast<size_t>(r)] = epb;
        select_begin[static_cast<size_t>(r)] = nkeys;
        nkeys += c.index_topk;
      }
      key_begin[static_cast<size_t>(r + 1)] = nkeys;
      if (t >= s.n - ls.ring_capacity)
        ring_dest[static_cast<size_t>(r)] = ls.ring.pool_offset(p0 % ls.ring_capacity);
    }
    next_row = s.begin + s.n;
  }
  close_rows_until(rows);
  lp.key_begin = pack.add(key_begin);
  int64_t key_room = nkeys;
  if (ctx.fixed_shape) {  // every row: the whole window, the HCA entries' bucket, the top-k
    const int64_t per_row = window + (hca ? bucket(max_hca) : 0) + (csa ? c.index_topk : 0);
    DSI_CHECK(nkeys <= rows * per_row, "fixed-shape key bound");
    key_room = rows * per_row;
    const int64_t page_room = seq_pad * pow2_at_least(max_pages);
    const int64_t ring_room =
        seq_pad * static_cast<int64_t>(ring_pages.size() / std::max<size_t>(spans.size(), 1));
    pad_to(ring_pages, ring_room);
    pad_to(ring_page_begin, seq_pad);
    pad_to(hca_pages, hca ? page_room : 0);
    pad_to(hca_page_begin, hca ? seq_pad : 0);
    pad_to(index_pages, csa ? page_room : 0);
    pad_to(entry_pages, csa ? page_room : 0);
  }
  lp.key_refs = pack.reserve_device<int64_t>(std::max<int64_t>(key_room, 1));
  // A list with no pages gets one unread entry: every array the kernels take has an address.
  auto add_pages = [&](std::vector<int32_t>& v) {
    if (v.empty())
      v.push_back(0);
    return pack.add(v);
  };
  lp.ring_pages = add_pages(ring_pages);
  lp.ring_page_begin = add_pages(ring_page_begin);
  if (hca) {
    lp.hca_pages = add_pages(hca_pages);
    lp.hca_page_begin = add_pages(hca_page_begin);
    lp.hca_ratio = plan.compress_ratio;
  }
  lp.ring_dest = pack.add(ring_dest);
  if (csa) {
    lp.index_pages = add_pages(index_pages);
    lp.index_page_begin = pack.add(index_page_begin);
    lp.visible = pack.add(visible);
    lp.entry_pages = add_pages(entry_pages);
    lp.entry_page_begin = pack.add(entry_page_begin);
    lp.select_begin = pack.add(select_begin);
    lp.visible_room = ctx.fixed_shape ? bucket(max_visible) : max_visible;
  }
}

}  // namespace

void append_geometry_key(const PassPlan& plan, std::vector<int64_t>* key) {
  key->push_back(static_cast<int64_t>(plan.layers.size()));
  for (const LayerPass& lp : plan.layers) {
    key->push_back(lp.ring_capacity);
    key->push_back(lp.ring_rows_per_page);
    key->push_back(lp.entry_rows_per_page);
    key->push_back(lp.hca_ratio);
    key->push_back(lp.visible_room);
  }
}

void plan_pass(const PlanContext& ctx,
               const std::vector<SeqSpan>& spans,
               const std::vector<int32_t>& tokens,
               int64_t rows,
               HostPack& pack,
               PassPlan* out) {
  const auto& c = *ctx.config;
  out->rows = rows;
  auto& [tok, row_span, pos, span_pos] = scratch().rows;
  tok.assign(static_cast<size_t>(rows), 0);
  pos.assign(static_cast<size_t>(rows), 0);
  for (const SeqSpan& s : spans) {
    for (int64_t t = 0; t < s.n; ++t) {
      tok[static_cast<size_t>(s.begin + t)] = tokens[static_cast<size_t>(s.begin + t)];
      pos[static_cast<size_t>(s.begin + t)] = s.first + t;
    }
  }
  out->tokens = pack.add(tok);
  out->positions = pack.add(pos);
  row_span.assign(static_cast<size_t>(std::max<int64_t>(rows, 1)), -1);
  span_pos.clear();
  for (size_t i = 0; i < spans.size(); ++i) {
    const SeqSpan& s = spans[i];
    for (int64_t t = 0; t < s.n; ++t)
      row_span[static_cast<size_t>(s.begin + t)] = static_cast<int32_t>(i);
    span_pos.push_back(s.first);
    span_pos.push_back(s.begin);
    // The MTP block's window floor (SequenceState::resume_mtp): ring rows below it were never
    // written, so its keys there are left out (kKvRefNone).
    span_pos.push_back(s.mtp ? s.st->mtp_layers()[0].window_floor : 0);
  }
  if (span_pos.empty())
    span_pos.assign(kSpanPosWidth, 0);
  // Fixed shape: a slot of L rows per sequence (every span L rows unless slot_rows says
  // otherwise), rows = the padded sequence count x L.
  const int64_t slot = ctx.slot_rows > 0 ? ctx.slot_rows
                       : spans.empty()   ? 1
                                         : std::max<int64_t>(spans.front().n, 1);
  const int64_t seq_pad = ctx.fixed_shape && !spans.empty() ? rows / slot : 0;
  pad_to(span_pos, kSpanPosWidth * seq_pad);
  out->row_span = pack.add(row_span);
  out->span_pos = pack.add(span_pos);

  const bool mtp = !spans.empty() && spans.front().mtp;
  const std::vector<model::LayerPlan>& plans = mtp ? c.mtp_layers : c.layers;
  const size_t n_layers = mtp ? 1 : plans.size();
  out->layers.assign(n_layers, LayerPass());
  std::vector<int32_t> first(n_layers);
  for (size_t l = 0; l < n_layers; ++l) first[l] = pack.add_slots(layer_arrays(plans[l]));
  auto one = [&](int64_t layer) {
    const size_t l = static_cast<size_t>(layer);
    Slots slots{&pack, first[l], first[l] + layer_arrays(plans[l])};
    plan_layer(ctx, spans, l, plans[l], rows, seq_pad, slots, &out->layers[l]);
    DSI_CHECK(slots.next == slots.end, "layer %zu planned fewer pack arrays than counted", l);
  };
  // Each layer's planning reads and advances that layer's state only (its LayerState of every
  // sequence), and each thread keeps its own scratch arrays.
  if (ctx.pool != nullptr && n_layers > 1 && rows >= kParallelRows) {
    ctx.pool->run(static_cast<int64_t>(n_layers), one);
  } else {
    for (size_t l = 0; l < n_layers; ++l) one(static_cast<int64_t>(l));
  }
}

std::vector<int64_t> expand_keys_host(const PlanContext& ctx,
                                      const HostPack& pack,
                                      const PassPlan& plan,
                                      size_t layer) {
  const auto& c = *ctx.config;
  const LayerPass& lp = plan.layers[layer];
  const std::vector<int64_t> begin = pack.read<int64_t>(lp.key_begin);
  const std::vector<int32_t> row_span = pack.read<int32_t>(plan.row_span);
  const std::vector<int64_t> span_pos = pack.read<int64_t>(plan.span_pos);
  const std::vector<int32_t> ring_pages = pack.read<int32_t>(lp.ring_pages);
  const std::vector<int32_t> ring_pb = pack.read<int32_t>(lp.ring_page_begin);
  const bool hca = lp.hca_pages >= 0;
  const std::vector<int32_t> hca_pages =
      hca ? pack.read<int32_t>(lp.hca_pages) : std::vector<int32_t>();
  const std::vector<int32_t> hca_pb =
      hca ? pack.read<int32_t>(lp.hca_page_begin) : std::vector<int32_t>();
  const int64_t ratio = lp.hca_ratio;
  const int64_t hd = ctx.kv_width > 0 ? ctx.kv_width : c.head_dim;
  const int64_t pf = ctx.page_floats;
  std::vector<int64_t> out(static_cast<size_t>(begin.back()), kNone);
  for (int64_t r = 0; r < plan.rows; ++r) {
    const int32_t s = row_span[static_cast<size_t>(r)];
    if (s < 0)
      continue;
    const int64_t first = span_pos[static_cast<size_t>(kSpanPosWidth * s)];
    const int64_t row0 = span_pos[static_cast<size_t>(kSpanPosWidth * s + 1)];
    const int64_t floor = span_pos[static_cast<size_t>(kSpanPosWidth * s + 2)];
    const int64_t p0 = first + (r - row0);
    const int64_t lo = std::max<int64_t>(0, p0 - c.sliding_window + 1);
    int64_t j = begin[static_cast<size_t>(r)];
    for (int64_t p = lo; p <= p0; ++p, ++j) {
      if (p < first && p < floor) {
        out[static_cast<size_t>(j)] = kNone;
      } else if (p < first) {
        const int64_t row = p % lp.ring_capacity;
        const int32_t page = ring_pages[static_cast<size_t>(ring_pb[static_cast<size_t>(s)] +
                                                            row / lp.ring_rows_per_page)];
        out[static_cast<size_t>(j)] =
            static_cast<int64_t>(page) * pf + (row % lp.ring_rows_per_page) * hd;
      } else {
        out[static_cast<size_t>(j)] = local_ref((row0 + p - first) * hd);
      }
    }
    if (hca) {
      for (int64_t blk = 0; blk < (p0 + 1) / ratio; ++blk, ++j) {
        const int32_t page = hca_pages[static_cast<size_t>(hca_pb[static_cast<size_t>(s)] +
                                                           blk / lp.entry_rows_per_page)];
        out[static_cast<size_t>(j)] =
            static_cast<int64_t>(page) * pf + (blk % lp.entry_rows_per_page) * hd;
      }
    }
  }
  return out;
}

}  // namespace dsinfer::gpu
