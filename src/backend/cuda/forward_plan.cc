// plan_pass: the CPU forward's row walk (backend/cpu/attention.cc) turned into key references.
#include "backend/cuda/forward_plan.h"

#include <algorithm>

#include "base/check.h"

namespace dsinfer::gpu {
namespace {

using model::AttentionType;

constexpr int64_t kNone = -1;
int64_t local_ref(int64_t elem_offset) {
  return -2 - elem_offset;
}

state::LayerState& layer_state(const SeqSpan& s, size_t layer) {
  return s.mtp ? s.st->mtp_layers()[0] : s.st->layers()[layer];
}

int64_t bucket(int64_t v) {
  int64_t b = 64;
  while (b < v) b *= 2;
  return b;
}

// The compressor of one layer over every span: candidate references of the entries that close
// in this pass (rows before the pass from the ring, rows of the pass from the local buffer),
// then the metadata appends. `index` selects the indexer compressor.
CompressorPlan plan_compressor(const PlanContext& ctx,
                               const std::vector<SeqSpan>& spans,
                               size_t layer,
                               const model::LayerPlan& plan,
                               bool index,
                               int64_t rows,
                               HostPack& pack) {
  const auto& c = *ctx.config;
  const bool overlap = plan.attention == AttentionType::kCsa;
  const int64_t m = plan.compress_ratio;
  const int64_t d = index ? c.index_head_dim : c.head_dim;
  const int64_t row_width = 2 * (overlap ? 2 : 1) * d;  // [kv | score]
  const int64_t nc = (overlap ? 2 : 1) * m;
  std::vector<int64_t> local_dest(static_cast<size_t>(rows), kNone);
  std::vector<int64_t> ring_dest(static_cast<size_t>(rows), kNone);
  std::vector<int64_t> refs;
  std::vector<int64_t> block;
  std::vector<int64_t> out_off;
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
    std::vector<int64_t> closed;
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

}  // namespace

void plan_pass(const PlanContext& ctx,
               const std::vector<SeqSpan>& spans,
               const std::vector<int32_t>& tokens,
               int64_t rows,
               HostPack& pack,
               PassPlan* out) {
  const auto& c = *ctx.config;
  const int64_t hd = c.head_dim;
  const int64_t window = c.sliding_window;
  out->rows = rows;
  std::vector<int32_t> tok(static_cast<size_t>(rows), 0);
  std::vector<int64_t> pos(static_cast<size_t>(rows), 0);
  for (const SeqSpan& s : spans) {
    for (int64_t t = 0; t < s.n; ++t) {
      tok[static_cast<size_t>(s.begin + t)] = tokens[static_cast<size_t>(s.begin + t)];
      pos[static_cast<size_t>(s.begin + t)] = s.first + t;
    }
  }
  out->tokens = pack.add(tok);
  out->positions = pack.add(pos);

  const bool mtp = !spans.empty() && spans.front().mtp;
  const std::vector<model::LayerPlan>& plans = mtp ? c.mtp_layers : c.layers;
  const size_t n_layers = mtp ? 1 : plans.size();
  out->layers.assign(n_layers, LayerPass());
  for (size_t l = 0; l < n_layers; ++l) {
    const model::LayerPlan& plan = plans[l];
    LayerPass& lp = out->layers[l];
    const bool csa = plan.attention == AttentionType::kCsa;
    const bool hca = plan.attention == AttentionType::kHca;
    // Compressors first: their entries are written before attention reads them.
    if (csa || hca)
      lp.comp = plan_compressor(ctx, spans, l, plan, false, rows, pack);
    if (csa)
      lp.index_comp = plan_compressor(ctx, spans, l, plan, true, rows, pack);

    std::vector<int64_t> key_begin(static_cast<size_t>(rows + 1), 0);
    // The key list is this thread's scratch, kept from call to call: a prefill's list is tens of
    // MB, and fresh memory would be page-faulted in on every forward.
    thread_local std::vector<int64_t> keys_scratch;
    std::vector<int64_t>& keys = keys_scratch;
    keys.clear();
    {
      // One allocation: window keys, then per row the HCA entries or the CSA selections.
      int64_t room = 0;
      for (const SeqSpan& s : spans) {
        const int64_t last = s.first + s.n;
        room += s.n * (window + (csa ? c.index_topk : 0) +
                       (hca ? last / std::max<int64_t>(plan.compress_ratio, 1) : 0));
      }
      keys.reserve(static_cast<size_t>(room + (rows + 1) * (csa ? c.index_topk : 0)));
    }
    std::vector<int64_t> ring_dest(static_cast<size_t>(rows), kNone);
    std::vector<int64_t> select_begin(static_cast<size_t>(rows), 0);
    std::vector<int32_t> index_pages;
    std::vector<int32_t> entry_pages;
    std::vector<int64_t> index_page_begin(static_cast<size_t>(rows), 0);
    std::vector<int64_t> entry_page_begin(static_cast<size_t>(rows), 0);
    std::vector<int64_t> visible(static_cast<size_t>(rows), 0);
    int64_t max_visible = 0;
    int64_t next_row = 0;
    auto close_rows_until = [&](int64_t r) {  // padding rows: no keys
      for (; next_row < r; ++next_row) {
        if (csa) {
          select_begin[static_cast<size_t>(next_row)] = static_cast<int64_t>(keys.size());
          keys.resize(keys.size() + static_cast<size_t>(c.index_topk), kNone);
        }
        key_begin[static_cast<size_t>(next_row + 1)] = static_cast<int64_t>(keys.size());
      }
    };
    for (const SeqSpan& s : spans) {
      close_rows_until(s.begin);
      state::LayerState& ls = layer_state(s, l);
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
        for (int64_t p = std::max<int64_t>(0, p0 - window + 1); p <= p0; ++p) {
          keys.push_back(p < s.first ? ls.ring.pool_offset(p % ls.ring_capacity)
                                     : local_ref((s.begin + p - s.first) * hd));
        }
        if (hca) {
          const int64_t vis = (p0 + 1) / plan.compress_ratio;
          for (int64_t blk = 0; blk < vis; ++blk) keys.push_back(ls.entries.pool_offset(blk));
        } else if (csa) {
          const int64_t vis = (p0 + 1) / plan.compress_ratio;
          visible[static_cast<size_t>(r)] = vis;
          max_visible = std::max(max_visible, vis);
          index_page_begin[static_cast<size_t>(r)] = ipb;
          entry_page_begin[static_cast<size_t>(r)] = epb;
          select_begin[static_cast<size_t>(r)] = static_cast<int64_t>(keys.size());
          keys.resize(keys.size() + static_cast<size_t>(c.index_topk), kNone);
        }
        key_begin[static_cast<size_t>(r + 1)] = static_cast<int64_t>(keys.size());
        if (t >= s.n - ls.ring_capacity)
          ring_dest[static_cast<size_t>(r)] = ls.ring.pool_offset(p0 % ls.ring_capacity);
      }
      next_row = s.begin + s.n;
    }
    close_rows_until(rows);
    lp.key_begin = pack.add(key_begin);
    lp.key_refs = pack.add(keys);
    lp.ring_dest = pack.add(ring_dest);
    if (csa) {
      if (index_pages.empty())
        index_pages.push_back(0);
      if (entry_pages.empty())
        entry_pages.push_back(0);
      lp.index_pages = pack.add(index_pages);
      lp.index_page_begin = pack.add(index_page_begin);
      lp.visible = pack.add(visible);
      lp.entry_pages = pack.add(entry_pages);
      lp.entry_page_begin = pack.add(entry_page_begin);
      lp.select_begin = pack.add(select_begin);
      lp.visible_room = ctx.fixed_shape ? bucket(max_visible) : max_visible;
    }
  }
}

}  // namespace dsinfer::gpu
