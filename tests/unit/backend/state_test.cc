// Sequence state features the backends rely on: forking a sequence (identical continuation),
// metadata-only arenas (Storage::kNone), and the cost model used by `dsinfer bench`.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "model/checkpoint.h"
#include "model/cost.h"
#include "numeric/float_formats.h"

namespace dsinfer {
namespace {

std::unique_ptr<model::Checkpoint> tiny() {
  auto r = model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official");
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

std::vector<int32_t> ids(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(2 + g() % 500));
  return v;
}

TEST(Fork, ForkedSequenceContinuesExactlyLikeTheSource) {
  auto ckpt = tiny();
  const auto& c = ckpt->config();
  cpu::CpuModel m(c, ckpt->weights(), model::Numerics::kDeepSeek);
  auto arena = state::PageArena::growable(state::min_page_bytes(c));
  backend::ForwardOptions opts;
  opts.run_mtp = true;
  for (int64_t rollback : {0, 3}) {
    state::SequenceState a(c, arena.get(), 1, rollback);
    backend::ForwardOutputs out;
    ASSERT_TRUE(m.forward(a, ids(37, 1), opts, &out).ok());
    state::SequenceState b(c, arena.get(), 2, rollback);
    ASSERT_TRUE(b.fork_from(a, nullptr).ok());
    EXPECT_EQ(b.num_tokens(), a.num_tokens());
    b.check_integrity();
    const auto more = ids(23, 2);
    backend::ForwardOutputs oa, ob;
    ASSERT_TRUE(m.forward(a, more, opts, &oa).ok());
    ASSERT_TRUE(m.forward(b, more, opts, &ob).ok());
    EXPECT_EQ(oa.logits, ob.logits);
    EXPECT_EQ(oa.mtp_logits, ob.mtp_logits);
    arena->check_integrity();
  }
}

// deepseek numerics store every KV value (window rows and compressed entries, main layers and
// the MTP layer) as a BF16 value: FP8 no-RoPE dims, BF16-rounded RoPE dims (docs/numerics.md
// points 2 and 4); reference numerics keep fp32 rows.
TEST(KvRows, DeepSeekRowsAreBf16Exact) {
  auto ckpt = tiny();
  const auto& c = ckpt->config();
  for (model::Numerics nm : {model::Numerics::kDeepSeek, model::Numerics::kReference}) {
    cpu::CpuModel m(c, ckpt->weights(), nm);
    auto arena = state::PageArena::growable(state::min_page_bytes(c));
    state::SequenceState st(c, arena.get(), 1, 0);
    backend::ForwardOptions opts;
    opts.run_mtp = true;
    backend::ForwardOutputs out;
    const int64_t n = 40;
    ASSERT_TRUE(m.forward(st, ids(static_cast<int>(n), 4), opts, &out).ok());
    int64_t rows = 0, inexact = 0;
    auto check = [&](const float* r) {
      ++rows;
      for (int64_t d = 0; d < c.head_dim; ++d) inexact += numeric::round_to_bf16(r[d]) != r[d];
    };
    for (const bool mtp : {false, true}) {
      const int64_t end = mtp ? st.mtp_num_tokens() : n;  // positions written so far
      for (const state::LayerState& ls : mtp ? st.mtp_layers() : st.layers()) {
        for (int64_t p = std::max<int64_t>(0, end - c.sliding_window); p < end; ++p)
          check(ls.ring_slot(p));
        for (int64_t w = 0; w < ls.num_entries; ++w) check(ls.entry(w));
      }
    }
    EXPECT_GT(rows, 0);
    if (nm == model::Numerics::kDeepSeek) {
      EXPECT_EQ(inexact, 0) << "of " << rows << " rows";
    } else {
      EXPECT_GT(inexact, rows);  // fp32 rows
    }
  }
}

// RowFormat::kRecord (the CUDA backend's deepseek layout): K=V rows and index keys one record
// wide, the compressor rows fp32; pages_for counts exactly what a sequence reserves; a backend
// refuses a sequence made for another row format.
TEST(RowFormat, RecordRowsAreNarrowAndCountedExactly) {
  auto ckpt = tiny();
  const auto& c = ckpt->config();
  ASSERT_TRUE(state::records_fit(c));
  // tiny-a: head_dim 128 with 64 RoPE dims (64 FP8 + 128 B BF16 + 1 scale -> 200 B), index keys
  // of 64 dims (32 B codes + 2 scales -> 36 B).
  EXPECT_EQ(state::kv_row_floats(c, state::RowFormat::kRecord), 50);
  EXPECT_EQ(state::index_row_floats(c, state::RowFormat::kRecord), 9);
  EXPECT_EQ(state::kv_row_floats(c, state::RowFormat::kFloat), c.head_dim);
  EXPECT_EQ(state::index_row_floats(c, state::RowFormat::kFloat), c.index_head_dim);
  const int64_t page_bytes = state::min_page_bytes(c);
  state::StateBytes bytes[2];
  for (state::RowFormat f : {state::RowFormat::kFloat, state::RowFormat::kRecord}) {
    SCOPED_TRACE(state::row_format_name(f));
    for (int64_t n : {0, 1, 37, 500}) {
      auto arena = state::PageArena::growable(page_bytes, state::PageArena::Storage::kNone);
      state::SequenceState st(c, arena.get(), 1, 3, f);
      ASSERT_TRUE(st.ok());
      ASSERT_TRUE(st.reserve(n));
      EXPECT_EQ(arena->used_bytes() / page_bytes,
                state::SequenceState::pages_for(c, page_bytes, n, 3, f))
          << n << " tokens";
      EXPECT_TRUE(state::check_row_format(st, c, f).ok());
      const state::RowFormat other =
          f == state::RowFormat::kFloat ? state::RowFormat::kRecord : state::RowFormat::kFloat;
      EXPECT_EQ(state::check_row_format(st, c, other).code(), StatusCode::kInvalidArgument);
      for (const auto& ls : st.layers()) {
        EXPECT_EQ(ls.ring.width(), state::kv_row_floats(c, f));
        if (ls.comp_rows.enabled()) {  // the compressors' token rows stay fp32 [kv | score]
          EXPECT_EQ(ls.comp_rows.rows().width() % c.head_dim, 0);
        }
      }
    }
    // Ring bytes per sequence (the window): 200 B against 512 B per row.
    auto arena = state::PageArena::growable(page_bytes);
    state::SequenceState st(c, arena.get(), 1, 0, f);
    bytes[f == state::RowFormat::kRecord] = st.bytes();
  }
  EXPECT_LT(bytes[1].window, bytes[0].window);
  // The CPU backends read fp32 rows only: a record-layout sequence is refused, not misread.
  cpu::CpuModel m(c, ckpt->weights(), model::Numerics::kDeepSeek);
  auto arena = state::PageArena::growable(page_bytes);
  state::SequenceState st(c, arena.get(), 1, 0, state::RowFormat::kRecord);
  backend::ForwardOutputs out;
  EXPECT_EQ(m.forward(st, ids(5, 3), {}, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.num_tokens(), 0);
}

TEST(Fork, OutOfPagesLeavesTheTargetFresh) {
  auto ckpt = tiny();
  const auto& c = ckpt->config();
  cpu::CpuModel m(c, ckpt->weights(), model::Numerics::kReference);
  const int64_t page = state::min_page_bytes(c);
  const int64_t fixed = state::SequenceState::pages_for(c, page, 0, 0);
  const int64_t full = state::SequenceState::pages_for(c, page, 60, 0);
  // Room for the source and only the fixed part of the fork.
  auto arena = state::PageArena::with_budget((full + fixed) * page, page);
  state::SequenceState a(c, arena.get(), 1, 0);
  backend::ForwardOutputs out;
  ASSERT_TRUE(m.forward(a, ids(60, 3), {}, &out).ok());
  state::SequenceState b(c, arena.get(), 2, 0);
  ASSERT_TRUE(b.ok());
  std::vector<std::pair<int32_t, int32_t>> pairs;
  const Status s = b.fork_from(a, &pairs);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_EQ(b.num_tokens(), 0);
  EXPECT_TRUE(pairs.empty());
  b.check_integrity();
  arena->check_integrity();
}

TEST(Fork, MetadataOnlyArenaReportsPagePairs) {
  auto ckpt = tiny();
  const auto& c = ckpt->config();
  auto host = state::PageArena::growable(state::min_page_bytes(c));
  auto meta =
      state::PageArena::growable(state::min_page_bytes(c), state::PageArena::Storage::kNone);
  EXPECT_TRUE(host->has_host_storage());
  EXPECT_FALSE(meta->has_host_storage());
  state::SequenceState a(c, meta.get(), 1, 0);
  ASSERT_TRUE(a.reserve(40));
  // Metadata-only appends, as the CUDA backend does them.
  for (auto& ls : a.layers()) {
    for (int64_t p = 0; p < 40; ++p) {
      if (ls.comp_rows.enabled())
        ls.comp_rows.push_row();
      if (ls.index_rows.enabled())
        ls.index_rows.push_row();
      if (ls.ratio && (p + 1) % ls.ratio == 0)
        ls.add_entry((p + 1) / ls.ratio - 1);
    }
  }
  a.advance(40);
  a.check_integrity();
  state::SequenceState b(c, meta.get(), 2, 0);
  std::vector<std::pair<int32_t, int32_t>> pairs;
  ASSERT_TRUE(b.fork_from(a, &pairs).ok());
  EXPECT_FALSE(pairs.empty());
  for (const auto& [from, to] : pairs) {
    EXPECT_EQ(meta->owner(from).sequence, 1);
    EXPECT_EQ(meta->owner(to).sequence, 2);
  }
  EXPECT_DEATH(meta->page(pairs.front().first), "no host storage");
}

TEST(Cost, CountsWeightsAttentionAndExperts) {
  auto ckpt = tiny();
  const auto& c = ckpt->config();
  const auto& w = ckpt->weights();
  const model::ForwardCost p1 = model::prefill_cost(c, w, 1);
  const model::ForwardCost p64 = model::prefill_cost(c, w, 64);
  // Matmul work is linear in tokens (apart from the one LM-head row); attention grows faster.
  const double head = 2.0 * static_cast<double>(w.head.rows * w.head.cols);
  EXPECT_NEAR(p64.matmul_flops - head, 64 * (p1.matmul_flops - head), 1e-6 * p64.matmul_flops);
  EXPECT_GT(p64.attention_flops, 64 * p1.attention_flops);
  // One decode step of batch 1 applies the same weights as a one-token prefill.
  const model::ForwardCost d1 = model::decode_cost(c, w, 1, 0);
  EXPECT_DOUBLE_EQ(d1.matmul_flops, p1.matmul_flops);
  // Larger batches touch more distinct experts, never more than all of them.
  const model::ForwardCost d4 = model::decode_cost(c, w, 4, 100);
  const model::ForwardCost d4k = model::decode_cost(c, w, 4096, 100);
  EXPECT_GT(d4k.weight_bytes, d4.weight_bytes);
  double all = 0;
  for (const auto& l : w.layers) {
    for (const auto& e : l.ffn.experts) all += e.w1.nbytes() + e.w3.nbytes() + e.w2.nbytes();
  }
  EXPECT_LT(d4k.weight_bytes, p1.weight_bytes + 1);  // prefill reads every expert once
  EXPECT_GT(all, 0);
  EXPECT_GT(d4.state_bytes, 0);
}

}  // namespace
}  // namespace dsinfer
