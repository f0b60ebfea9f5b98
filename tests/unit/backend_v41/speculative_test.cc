// Speculative decoding on DeepSeek V4.1 with the DSpark block drafter (spec::BlockDrafter over
// V41Backend::block_draft_batch): outputs equal those without speculation token for token
// (greedy and seeded sampling) for batches of mixed lengths, with every block length, auto and
// preemption; a verification rolled back leaves the state (window rings, DSpark rings, compressor
// rings, compressed KV, index keys) as if the rejected tokens were never seen; the sampled
// distribution of the first tokens under speculation is the model's (chi-square).
//
// The tiny fixture's DSpark blocks are random, so their drafts are rarely accepted. To exercise
// accepted prefixes of every length, most tests run the backend through InjectedDrafts: DSpark
// drafts the block (its code and confidences run), then a prefix of it whose length varies with
// the position is replaced by the target's own greedy continuation (computed by forwarding and
// rolling back the sequence's state), as a trained drafter would propose.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu_v41/backend.h"
#include "engine/engine.h"
#include "spec/config.h"
#include "unit/engine/chi_square.h"
#include "unit/engine/engine_test_util.h"

namespace dsinfer::cpu_v41 {
namespace {

using engine::Engine;
using engine::EngineConfig;
using engine::RequestId;
using engine::RequestSpec;
using engine::SchedulerConfig;

const std::string kTiny = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/v41-tiny/official";

std::unique_ptr<V41Backend> open_backend(const std::string& dir = kTiny) {
  auto b = V41Backend::open(dir, {});
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? std::move(b).value() : nullptr;
}

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

class InjectedDrafts final : public backend::Model {
 public:
  explicit InjectedDrafts(std::unique_ptr<V41Backend> b) : b_(std::move(b)) {}
  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const backend::ForwardOptions& options,
                 backend::ForwardOutputs* out) override {
    return b_->forward(st, tokens, options, out);
  }
  const state::StateShape* state_shape() const override { return b_->state_shape(); }
  Status check_prompt(std::span<const int32_t> tokens) const override {
    return b_->check_prompt(tokens);
  }
  const char* name() const override { return "cpu-v41+injected"; }
  const model::ModelConfig& config() const override { return b_->config(); }
  model::Numerics numerics() const override { return b_->numerics(); }
  int32_t block_draft_size() const override { return b_->block_draft_size(); }
  Status block_draft_batch(std::span<backend::BlockDraftItem> items, int32_t block) override {
    DSI_RETURN_IF_ERROR(b_->block_draft_batch(items, block));
    const int64_t V = b_->config().vocab_size;
    for (backend::BlockDraftItem& it : items) {
      if (!it.status.ok())
        continue;
      // The target's greedy continuation after the anchor, then the state back as it was.
      std::vector<int32_t> oracle;
      int32_t t = it.anchor;
      backend::ForwardOptions o;
      o.last_logits_only = true;
      for (int32_t k = 0; k < block; ++k) {
        backend::ForwardOutputs out;
        const int32_t tok[1] = {t};
        if (!b_->forward(*it.state, tok, o, &out).ok())
          break;  // no state memory: the block stays DSpark's own
        t = argmax(out.logits.data(), V);
        oracle.push_back(t);
      }
      DSI_CHECK(it.state->rollback(static_cast<int64_t>(oracle.size())).ok(), "oracle rollback");
      // 0..block of the drafts from the target, varying with the position.
      const int64_t keep = std::min<int64_t>(static_cast<int64_t>(oracle.size()),
                                             (it.state->num_tokens() * 5 + 3) % (block + 1));
      for (int64_t k = 0; k < keep; ++k) it.tokens[k] = oracle[static_cast<size_t>(k)];
      ++injected;
    }
    return Status();
  }
  int64_t injected = 0;

 private:
  std::unique_ptr<V41Backend> b_;
};

// A step-time model in which drafting pays (a forward costs about the same for 1..K+1 tokens):
// auto's choices then depend on the confidences and the acceptance it observes.
spec::StepTimes cheap_verify_times(int32_t max_k) {
  spec::StepTimes t;
  for (int64_t b : {1, 64}) {
    t.batch.push_back(b);
    t.off_s.push_back(1.0);
    t.verify_s.emplace_back();
    for (int32_t l = 1; l <= max_k + 1; ++l) t.verify_s.back().push_back(1.0 + 0.01 * l);
    t.draft_s.emplace_back();
    for (int32_t s = 1; s <= max_k; ++s) t.draft_s.back().push_back(0.05);
  }
  return t;
}

struct EngineSetup {
  std::string speculative = "off";
  bool inject = true;
  int64_t budget = int64_t{256} << 20;
  SchedulerConfig sc;
};

std::unique_ptr<Engine> make_engine(const EngineSetup& s) {
  EngineConfig cfg;
  cfg.model_dir = kTiny;
  cfg.state_budget_bytes = s.budget;
  cfg.scheduler = s.sc;
  auto sp = spec::parse_config(s.speculative);
  EXPECT_TRUE(sp.ok());
  cfg.speculative = *sp;
  if (cfg.speculative.mode == spec::Mode::kAuto)
    cfg.step_times = cheap_verify_times(cfg.speculative.k);
  std::unique_ptr<backend::Model> m;
  if (s.inject)
    m = std::make_unique<InjectedDrafts>(open_backend());
  else
    m = open_backend();
  auto e = Engine::create(cfg, nullptr, std::move(m));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

using engine::test_support::Case;
using engine::test_support::greedy;
using engine::test_support::run_all;

std::vector<Case> mixed_cases(int n, uint32_t seed, int max_out, int max_prompt = 40) {
  return engine::test_support::random_cases(n, seed, max_prompt, 3, 90, max_out);
}

using engine::test_support::greedy_specs;

std::vector<RequestSpec> sampled_specs(const std::vector<Case>& cs) {
  return engine::test_support::sampled_specs(cs, 100);
}

TEST(V41Speculative, OutputsEqualThoseWithoutSpeculation) {
  const auto cases = mixed_cases(10, 3, 16);
  EngineSetup off;
  off.sc.max_tokens_per_step = 64;
  off.sc.prefill_chunk = 7;
  auto base = make_engine(off);
  ASSERT_NE(base, nullptr);
  const auto expected_greedy = run_all(*base, greedy_specs(cases));
  const auto expected_sampled = run_all(*base, sampled_specs(cases));
  struct Mode {
    const char* mode;
    bool inject;
  };
  for (const Mode m : {Mode{"fixed:5", false},
                       Mode{"fixed:1", true},
                       Mode{"fixed:3", true},
                       Mode{"fixed:5", true},
                       Mode{"auto", true}}) {
    EngineSetup s = off;
    s.speculative = m.mode;
    s.inject = m.inject;
    auto e = make_engine(s);
    ASSERT_NE(e, nullptr);
    const std::string what = std::string(m.mode) + (m.inject ? " injected" : " dspark");
    EXPECT_EQ(run_all(*e, greedy_specs(cases)), expected_greedy) << what;
    EXPECT_EQ(run_all(*e, sampled_specs(cases)), expected_sampled) << what;
    const engine::EngineStats st = e->stats();
    EXPECT_EQ(st.speculative.mode, spec::parse_config(m.mode)->mode) << what;
    EXPECT_GT(st.spec.verified[0], 0) << what;
    EXPECT_GT(st.spec.spec_steps, 0) << what;
    if (m.inject) {
      // Accepted prefixes of several lengths, and rejections after them.
      const size_t last = st.spec.accepted.size() - 1;
      EXPECT_GT(st.spec.accepted[0], 0) << what << ": " << st.spec.summary();
      EXPECT_GT(st.spec.accepted[last], 0) << what << ": " << st.spec.summary();
      EXPECT_LT(st.spec.accepted[0], st.spec.verified[0]) << what << ": " << st.spec.summary();
    }
  }
}

TEST(V41Speculative, PreemptionKeepsOutputs) {
  const auto cases = mixed_cases(8, 9, 14, 64);
  EngineSetup off;
  off.sc.max_tokens_per_step = 64;
  off.sc.prefill_chunk = 5;
  auto base = make_engine(off);
  ASSERT_NE(base, nullptr);
  const auto expected = run_all(*base, greedy_specs(cases));
  const auto expected_sampled = run_all(*base, sampled_specs(cases));
  auto ck = model_v41::V41Checkpoint::open(kTiny);
  ASSERT_TRUE(ck.ok());
  const state::StateShape shape = v41_state_shape((*ck)->config());
  const int64_t page = state::default_page_bytes(shape);
  const int64_t fixed = state::SequenceState::pages_for(shape, page, 1);
  for (const char* mode : {"fixed:5", "auto"}) {
    EngineSetup tight = off;
    tight.speculative = mode;
    tight.budget = (2 * fixed + 2) * page;
    auto e = make_engine(tight);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(run_all(*e, greedy_specs(cases)), expected) << mode;
    EXPECT_EQ(run_all(*e, sampled_specs(cases)), expected_sampled) << mode;
    EXPECT_GT(e->stats().preemptions, 0) << mode;
    EXPECT_GT(e->stats().spec.spec_steps, 0) << mode;
  }
}

// A verification of [anchor, 5 drafts] with r of them rejected and rolled back leaves a state
// that behaves exactly as one that only ever saw [anchor, the accepted drafts]: the same logits
// and the same DSpark drafts (which read the DSpark rings) for several decode steps after, at
// prompt lengths around the window (16) and the compression ratios.
TEST(V41Speculative, RollbackLeavesTheStateOfARunThatNeverSawTheRejectedTokens) {
  auto b = open_backend();
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(b->block_draft_size(), 5);
  const int64_t V = b->config().vocab_size;
  auto arena = state::PageArena::growable(state::default_page_bytes(*b->state_shape()));
  int64_t next_id = 0;
  auto feed = [&](state::SequenceState& st, std::span<const int32_t> toks) {
    backend::ForwardOutputs out;
    EXPECT_TRUE(b->forward(st, toks, backend::ForwardOptions(), &out).ok());
    return out.logits;
  };
  std::mt19937 g(17);
  int compared = 0;
  for (int plen : {3, 14, 15, 16, 17, 31, 33}) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < plen; ++i) prompt.push_back(static_cast<int32_t>(3 + g() % 90));
    const int32_t anchor = static_cast<int32_t>(3 + g() % 90);
    std::vector<int32_t> drafts;
    for (int i = 0; i < 5; ++i) drafts.push_back(static_cast<int32_t>(3 + g() % 90));
    for (int64_t reject = 0; reject <= 5; ++reject) {
      state::SequenceState a(*b->state_shape(), arena.get(), next_id++);
      state::SequenceState c(*b->state_shape(), arena.get(), next_id++);
      ASSERT_TRUE(a.ok() && c.ok());
      feed(a, prompt);
      feed(c, prompt);
      std::vector<int32_t> verify = {anchor};
      verify.insert(verify.end(), drafts.begin(), drafts.end());
      feed(a, verify);
      ASSERT_TRUE(a.rollback(reject).ok());
      feed(c, std::span<const int32_t>(verify.data(), verify.size() - reject));
      ASSERT_EQ(a.num_tokens(), c.num_tokens());
      // Decode on from both: identical logits and drafts at every step.
      int32_t t = static_cast<int32_t>(3 + g() % 90);
      for (int step = 0; step < 8; ++step) {
        DraftResult da, dc;
        ASSERT_TRUE(b->draft(a, t, {}, &da).ok());
        ASSERT_TRUE(b->draft(c, t, {}, &dc).ok());
        ASSERT_EQ(da.logits, dc.logits) << "prompt " << plen << " reject " << reject;
        ASSERT_EQ(da.confidence, dc.confidence);
        const int32_t tok[1] = {t};
        const auto la = feed(a, tok), lc = feed(c, tok);
        ASSERT_EQ(la, lc) << "prompt " << plen << " reject " << reject << " step " << step;
        t = argmax(la.data(), V);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 7 * 6 * 8);
}

// The first three generated tokens of one prompt at temperature 1 and top-k 2 over many seeds,
// with 2 drafts per step (the first a target token most of the time, so that drafts are both
// accepted and rejected): their joint distribution is the model's, computed exactly from the
// V4.1 forward.
TEST(V41Speculative, SampledDistributionOfTheFirstTokensIsTheModels) {
  auto b = open_backend();
  ASSERT_NE(b, nullptr);
  const int64_t V = b->config().vocab_size;
  const std::vector<int32_t> prompt = {7, 19, 33, 41, 5, 60, 12, 88, 23, 9, 71};
  constexpr int kTopK = 2;
  auto topk_probs = [&](const float* logits) {
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int32_t i = 0; i < V; ++i) idx[static_cast<size_t>(i)] = i;
    std::partial_sort(idx.begin(), idx.begin() + kTopK, idx.end(), [&](int32_t x, int32_t y) {
      return logits[x] > logits[y];
    });
    std::vector<std::pair<int32_t, double>> out;
    double z = 0;
    for (int i = 0; i < kTopK; ++i) z += std::exp(double{logits[idx[i]]} - logits[idx[0]]);
    for (int i = 0; i < kTopK; ++i)
      out.push_back({idx[i], std::exp(double{logits[idx[i]]} - logits[idx[0]]) / z});
    return out;
  };
  auto arena = state::PageArena::growable(state::default_page_bytes(*b->state_shape()));
  auto last_logits = [&](const std::vector<int32_t>& seq) {
    state::SequenceState st(*b->state_shape(), arena.get(), 0);
    backend::ForwardOptions o;
    o.last_logits_only = true;
    backend::ForwardOutputs out;
    EXPECT_TRUE(b->forward(st, seq, o, &out).ok());
    return out.logits;
  };
  std::map<std::vector<int32_t>, double> expected;
  for (const auto& [t1, p1] : topk_probs(last_logits(prompt).data())) {
    std::vector<int32_t> s1 = prompt;
    s1.push_back(t1);
    for (const auto& [t2, p2] : topk_probs(last_logits(s1).data())) {
      std::vector<int32_t> s2 = s1;
      s2.push_back(t2);
      for (const auto& [t3, p3] : topk_probs(last_logits(s2).data()))
        expected[{t1, t2, t3}] = p1 * p2 * p3;
    }
  }
  constexpr int kRuns = 1500;
  EngineSetup s;
  s.speculative = "fixed:2";
  s.sc.max_running = 256;
  s.sc.max_tokens_per_step = 1024;
  auto e = make_engine(s);
  ASSERT_NE(e, nullptr);
  std::vector<RequestSpec> specs;
  for (int i = 0; i < kRuns; ++i) {
    RequestSpec r;
    r.prompt = prompt;
    r.max_tokens = 3;
    r.ignore_eos = true;
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = kTopK;
    r.sampling.seed = 0xD5A2C000u + static_cast<uint64_t>(i);
    specs.push_back(std::move(r));
  }
  std::map<std::vector<int32_t>, int> observed;
  for (const auto& out : run_all(*e, std::move(specs))) ++observed[out];
  const spec::Stats st = e->stats().spec;
  EXPECT_GT(st.accepted[0], kRuns / 10) << st.summary();
  EXPECT_LT(st.accepted[0], st.verified[0]) << st.summary();
  int dof = 0;
  const double stat = testing_util::chi_square(observed, expected, kRuns, &dof);
  ASSERT_GE(dof, 3);
  const double limit = testing_util::chi_square_limit_999(dof);
  EXPECT_LT(stat, limit) << "dof " << dof << ", " << st.summary();
  std::printf("chi-square %.1f, dof %d, limit %.1f\n", stat, dof, limit);
  // The test can fail: the same counts against the distribution with the most likely third
  // token 30% less likely are far off.
  const int32_t t3 =
      std::max_element(expected.begin(), expected.end(), [](const auto& x, const auto& y) {
        return x.second < y.second;
      })->first[2];
  std::map<std::vector<int32_t>, double> skewed = expected;
  double zsum = 0;
  for (auto& [k, p] : skewed) zsum += (p *= k[2] == t3 ? 0.7 : 1.0);
  for (auto& [k, p] : skewed) p /= zsum;
  int dof2 = 0;
  EXPECT_GT(testing_util::chi_square(observed, skewed, kRuns, &dof2), limit);
}

TEST(V41Speculative, DrafterSettingsAndErrors) {
  // Default auto: DSpark with its 5-token block where the checkpoint has DSpark blocks.
  EngineConfig cfg;
  cfg.model_dir = kTiny;
  cfg.cpu_kernels = engine::CpuKernels::kFast;
  cfg.state_budget_bytes = int64_t{64} << 20;
  cfg.speculative = *spec::parse_config("auto");
  cfg.speculative.defaulted = true;
  cfg.step_times = cheap_verify_times(5);
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->speculative().mode, spec::Mode::kAuto);
  EXPECT_EQ((*e)->speculative().k, 5);
  // Without a given step-time model, auto measures one over V4.1 states and DSpark blocks.
  cfg.step_times.reset();
  auto measured = Engine::create(cfg);
  ASSERT_TRUE(measured.ok()) << measured.status().to_string();
  EXPECT_TRUE((*measured)->step_times().valid());
  EXPECT_EQ((*measured)->step_times().max_k(), 5);
  std::vector<RequestSpec> one;
  one.push_back(greedy({{7, 8, 9, 10}, 12}));
  EXPECT_EQ(run_all(**measured, std::move(one)).front().size(), 12u);
  // More drafts than the rollback allows: an error naming the limit.
  cfg.speculative = *spec::parse_config("fixed:6");
  cfg.step_times.reset();
  auto six = Engine::create(cfg);
  ASSERT_FALSE(six.ok());
  EXPECT_NE(six.status().message().find("at most 5 drafts"), std::string::npos)
      << six.status().to_string();
  // A V4.1 checkpoint without DSpark blocks: off by default, an error when asked for.
  cfg.model_dir = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/v41-tiny-b/official";
  cfg.speculative = *spec::parse_config("fixed:2");
  auto nb = Engine::create(cfg);
  ASSERT_FALSE(nb.ok());
  EXPECT_NE(nb.status().message().find("no usable DSpark"), std::string::npos)
      << nb.status().to_string();
  cfg.speculative = *spec::parse_config("auto");
  cfg.speculative.defaulted = true;
  auto d = Engine::create(cfg);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ((*d)->speculative().mode, spec::Mode::kOff);
}

}  // namespace
}  // namespace dsinfer::cpu_v41
