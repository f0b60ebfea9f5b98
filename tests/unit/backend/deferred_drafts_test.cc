// backend::DeferredDrafts: a drafting call's picks ([steps][rows] ids, then log-probabilities)
// found by sequence and written into their items, for one call of many sequences in any order
// and for one step at a time.
#include "backend/deferred_drafts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint.h"

namespace dsinfer {
namespace {

struct States {
  std::unique_ptr<model::Checkpoint> ckpt;
  std::unique_ptr<state::PageArena> arena;
  std::vector<std::unique_ptr<state::SequenceState>> seqs;
};

States make_states(int n) {
  States s;
  auto r = model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official");
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  s.ckpt = std::move(r).value();
  const auto& c = s.ckpt->config();
  s.arena = state::PageArena::growable(state::min_page_bytes(c), state::PageArena::Storage::kNone);
  for (int i = 0; i < n; ++i)
    s.seqs.push_back(std::make_unique<state::SequenceState>(c, s.arena.get(), i, 4));
  return s;
}

// Picks of `steps` x `rows`: id 1000 * step + column, log-probability -0.01 * (that id).
std::vector<int32_t> picks(int32_t steps, int64_t rows) {
  const int64_t n = steps * rows;
  std::vector<int32_t> buf(static_cast<size_t>(2 * n));
  auto* lp = reinterpret_cast<float*>(buf.data() + n);
  for (int32_t s = 0; s < steps; ++s) {
    for (int64_t c = 0; c < rows; ++c) {
      const int64_t at = s * rows + c;
      buf[static_cast<size_t>(at)] = static_cast<int32_t>(1000 * s + c);
      lp[at] = -0.01f * static_cast<float>(1000 * s + c);
    }
  }
  return buf;
}

TEST(DeferredDrafts, FindsEachSequenceAndWritesItsColumn) {
  States st = make_states(5);
  constexpr int32_t kSteps = 3;
  constexpr int64_t kRows = 8;  // a padded batch: 5 sequences, 8 rows
  std::vector<std::vector<int32_t>> tokens(5, std::vector<int32_t>(kSteps, -1));
  std::vector<std::vector<float>> probs(5, std::vector<float>(kSteps, -1.0f));
  backend::DeferredDrafts d;
  d.reset(kRows, kSteps * kRows);
  // Added in an order unlike the states' addresses; sequence 3 drafts nothing in this call.
  const int order[] = {4, 0, 2, 1};
  for (int k = 0; k < 4; ++k) {
    const int i = order[k];
    d.add({st.seqs[i].get(), tokens[i].data(), probs[i].data(), kSteps, k});
  }
  d.seal();
  EXPECT_FALSE(d.empty());
  EXPECT_EQ(d.find(st.seqs[3].get()), nullptr);
  for (int k = 0; k < 4; ++k) {
    const backend::DeferredDrafts::Entry* e = d.find(st.seqs[order[k]].get());
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->col, k);
    EXPECT_EQ(d.index(*e, 2), 2 * kRows + k);
  }
  const std::vector<int32_t> host = picks(kSteps, kRows);
  d.deliver(host.data());
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(d.find(st.seqs[0].get()), nullptr);
  for (int k = 0; k < 4; ++k) {
    const int i = order[k];
    for (int32_t s = 0; s < kSteps; ++s) {
      EXPECT_EQ(tokens[i][s], 1000 * s + k);
      EXPECT_FLOAT_EQ(probs[i][s], std::exp(-0.01f * static_cast<float>(1000 * s + k)));
    }
  }
  EXPECT_EQ(tokens[3][0], -1);  // untouched
}

TEST(DeferredDrafts, OneStepAtATimeWritesThatStepOnly) {
  States st = make_states(2);
  constexpr int32_t kSteps = 2;
  constexpr int64_t kRows = 2;
  std::vector<int32_t> tok(kSteps, -1);
  std::vector<float> pr(kSteps, -1.0f);
  const std::vector<int32_t> host = picks(kSteps, kRows);
  backend::DeferredDrafts d;
  d.reset(kRows, kSteps * kRows);
  d.add({st.seqs[1].get(), tok.data() + 1, pr.data() + 1, 1, 1 * kRows + 1});  // step 1, row 1
  d.deliver(host.data());
  EXPECT_EQ(tok[0], -1);
  EXPECT_EQ(tok[1], 1001);
  EXPECT_FLOAT_EQ(pr[1], std::exp(-10.01f));
  EXPECT_EQ(d.find(st.seqs[1].get()), nullptr);  // delivered: nothing left to find
}

TEST(DeferredDraftsDeath, ChecksItsInvariants) {
  States st = make_states(1);
  int32_t tok[4];
  float pr[4];
  backend::DeferredDrafts d;
  d.reset(2, 4);
  EXPECT_DEATH(d.add({st.seqs[0].get(), tok, pr, 3, 0}), "drafts beyond the picks");
  d.add({st.seqs[0].get(), tok, pr, 2, 1});
  EXPECT_DEATH((void)d.find(st.seqs[0].get()), "before seal");
  d.add({st.seqs[0].get(), tok, pr, 1, 0});
  EXPECT_DEATH(d.seal(), "drafted twice");
}

}  // namespace
}  // namespace dsinfer
