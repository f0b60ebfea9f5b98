// Engine end to end on the CPU backend with a golden fixture model: batching invariance,
// agreement with the score path, preemption under a tight state budget, a randomized
// arrival/abort run with every integrity checker after each step, and bad input.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "model/checkpoint.h"
#include "unit/engine/engine_test_util.h"

namespace dsinfer::engine {
namespace {

std::shared_ptr<const model::Checkpoint> fixture() {
  return test_support::tiny_fixture();
}

// The CPU kernels of the engines the tests make (EngineKernels runs its tests with both).
CpuKernels g_kernels = CpuKernels::kReference;

std::unique_ptr<Engine> make_engine(int64_t budget_bytes, SchedulerConfig sc = {}) {
  EngineConfig cfg;
  cfg.cpu_kernels = g_kernels;
  cfg.state_budget_bytes = budget_bytes;
  cfg.page_bytes = state::min_page_bytes(fixture()->config());
  cfg.scheduler = sc;
  auto e = Engine::create(cfg, fixture());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

using test_support::Case;
using test_support::greedy;

std::vector<Case> mixed_cases(int n, uint32_t seed) {
  return test_support::random_cases(n, seed, 45, 2, 500, 12);
}

std::vector<int32_t> run_alone(const Case& c) {
  auto e = make_engine(int64_t{64} << 20);
  auto id = e->submit(greedy(c));
  EXPECT_TRUE(id.ok());
  e->run_until_done();
  return e->request(*id)->output;
}

std::vector<std::vector<int32_t>> run_batch(Engine& e, const std::vector<Case>& cases) {
  std::vector<RequestId> ids;
  for (const Case& c : cases) {
    auto id = e.submit(greedy(c));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  while (e.step()) e.check_integrity();
  e.check_integrity();
  std::vector<std::vector<int32_t>> out;
  for (RequestId id : ids) {
    const Request* r = e.request(id);
    EXPECT_EQ(r->state, RequestState::kFinished);
    EXPECT_EQ(r->finish_reason, FinishReason::kLength);
    out.push_back(r->output);
  }
  return out;
}

// Batch invariance, preemption, arrivals/aborts and seeded sampling, with the reference and
// with the fast CPU path (backend/cpu/fast), whose steps batch every sequence's rows.
class EngineKernels : public ::testing::TestWithParam<CpuKernels> {
 protected:
  void SetUp() override { g_kernels = GetParam(); }
  void TearDown() override { g_kernels = CpuKernels::kReference; }
};
INSTANTIATE_TEST_SUITE_P(Cpu,
                         EngineKernels,
                         ::testing::Values(CpuKernels::kReference, CpuKernels::kFast),
                         [](const auto& info) {
                           return std::string(cpu_kernels_name(info.param));
                         });

TEST_P(EngineKernels, BatchOf64EqualsAloneAndScoreArgmax) {
  const auto cases = mixed_cases(64, 7);
  SchedulerConfig sc;
  sc.max_tokens_per_step = 48;
  sc.prefill_chunk = 16;
  auto e = make_engine(int64_t{256} << 20, sc);
  const auto batch = run_batch(*e, cases);
  EXPECT_EQ(e->stats().preemptions, 0);
  const auto& mc = fixture()->config();
  cpu::CpuModel model(mc, fixture()->weights(), model::Numerics::kReference);
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(static_cast<int64_t>(batch[i].size()), cases[i].max_tokens);
    EXPECT_EQ(batch[i], run_alone(cases[i])) << "request " << i;
    // The score path: one full forward over prompt + output; the argmax after each prefix is the
    // next generated token.
    std::vector<int32_t> seq = cases[i].prompt;
    seq.insert(seq.end(), batch[i].begin(), batch[i].end());
    auto arena = state::PageArena::growable(state::default_page_bytes(mc));
    state::SequenceState st(mc, arena.get(), 0, 0);
    cpu::ForwardOutputs out;
    ASSERT_TRUE(model.forward(st, seq, cpu::ForwardOptions(), &out).ok());
    for (size_t k = 0; k < batch[i].size(); ++k) {
      const float* row = out.logits.data() + (cases[i].prompt.size() - 1 + k) * mc.vocab_size;
      EXPECT_EQ(std::max_element(row, row + mc.vocab_size) - row, batch[i][k])
          << "request " << i << " token " << k;
    }
  }
}

TEST_P(EngineKernels, PreemptionUnderATightBudgetKeepsOutputs) {
  const auto cases = mixed_cases(24, 11);
  auto roomy = make_engine(int64_t{256} << 20);
  const auto expected = run_batch(*roomy, cases);
  // Room for only a few sequences at a time: admission waits and running ones get preempted.
  const auto& mc = fixture()->config();
  const int64_t page = state::min_page_bytes(mc);
  // Fixed state (rings, compressor rows) for two sequences plus eight spare pages: two sequences
  // are admitted with 4-token prefill chunks, then their growing compressed entries and index
  // keys no longer fit and the newer one is preempted (and recomputed later).
  const int64_t fixed = state::SequenceState::pages_for(mc, page, 1, 0);
  SchedulerConfig sc;
  sc.max_tokens_per_step = 64;
  sc.prefill_chunk = 4;
  auto tight = make_engine((2 * fixed + 8) * page, sc);
  const auto got = run_batch(*tight, cases);
  EXPECT_GT(tight->stats().preemptions, 0);
  EXPECT_EQ(got, expected);
}

TEST_P(EngineKernels, RandomArrivalsAndAbortsKeepEveryInvariant) {
  std::mt19937 g(3);
  const auto& mc = fixture()->config();
  const int64_t page = state::min_page_bytes(mc);
  SchedulerConfig sc;
  sc.max_tokens_per_step = 20;
  sc.prefill_chunk = 6;
  sc.max_running = 5;
  auto e = make_engine(4 * state::SequenceState::pages_for(mc, page, 60, 0) * page, sc);
  std::vector<RequestId> live;
  int submitted = 0, aborted = 0;
  for (int step = 0; step < 400; ++step) {
    if (submitted < 60 && g() % 3 == 0) {
      Case c = mixed_cases(1, g())[0];
      RequestSpec s = greedy(c);
      s.sampling.temperature = (g() % 2) ? 0.0f : 0.8f;
      s.sampling.seed = g();
      auto id = e->submit(std::move(s));
      ASSERT_TRUE(id.ok());
      live.push_back(*id);
      ++submitted;
    }
    if (!live.empty() && g() % 11 == 0) {
      const RequestId victim = live[g() % live.size()];
      if (!e->request(victim)->done())
        ++aborted;
      e->abort(victim);
    }
    e->step();
    e->check_integrity();
  }
  e->run_until_done();
  e->check_integrity();
  EXPECT_EQ(e->stats().running, 0);
  EXPECT_EQ(e->arena().used_bytes(), 0) << "every page returned";
  for (RequestId id : live) EXPECT_TRUE(e->request(id)->done());
  EXPECT_GT(aborted, 0);
}

TEST_P(EngineKernels, SeededSamplingDoesNotDependOnTheBatch) {
  const auto cases = mixed_cases(6, 5);
  auto sample_all = [&](bool together) {
    std::vector<std::vector<int32_t>> out;
    auto e = make_engine(int64_t{64} << 20);
    std::vector<RequestId> ids;
    for (size_t i = 0; i < cases.size(); ++i) {
      RequestSpec s = greedy(cases[i]);
      s.sampling.temperature = 1.0f;
      s.sampling.top_p = 0.9f;
      s.sampling.seed = 100 + i;
      ids.push_back(*e->submit(std::move(s)));
      if (!together)
        e->run_until_done();
    }
    e->run_until_done();
    for (RequestId id : ids) out.push_back(e->request(id)->output);
    return out;
  };
  EXPECT_EQ(sample_all(true), sample_all(false));
}

using test_support::seeded;

using test_support::PositionalMask;

// The same seeded request (optionally under a token mask) alone, in a batch of 64 random others
// (their own seeds and sampling, some masked), and in that batch under a state budget that forces
// preemption: the same tokens each time. Both CPU kernels (the fast path is --device cpu's
// default; the masked run on the fast path only).
TEST_P(EngineKernels, SeededRequestIsTheSameAloneInABatchOf64AndUnderPreemption) {
  for (const bool masked : {false, true}) {
    // The mask path does not depend on the kernels: once, on the fast path (keeps this short).
    if (masked && GetParam() == CpuKernels::kReference)
      continue;
    SCOPED_TRACE(masked ? "masked" : "unmasked");
    Case target;
    for (int i = 0; i < 30; ++i) target.prompt.push_back(3 + 7 * i);
    target.max_tokens = 12;
    const uint64_t kSeed = 0xC0FFEE;
    auto target_spec = [&] {
      RequestSpec s = seeded(target, kSeed);
      if (masked)
        s.token_mask = std::make_unique<PositionalMask>();
      return s;
    };
    auto alone_engine = make_engine(int64_t{64} << 20);
    const RequestId alone_id = *alone_engine->submit(target_spec());
    alone_engine->run_until_done();
    const std::vector<int32_t> alone = alone_engine->request(alone_id)->output;
    ASSERT_EQ(alone.size(), 12u);
    if (masked) {
      for (size_t i = 0; i < alone.size(); ++i) EXPECT_EQ(alone[i] % 3, static_cast<int>(i % 3));
    }

    // 64 random others, the target submitted in the middle.
    auto run_mixed = [&](Engine& e) {
      std::mt19937 g(99);
      const auto others = mixed_cases(64, 23);
      RequestId id = 0;
      for (size_t i = 0; i < others.size(); ++i) {
        if (i == 32)
          id = *e.submit(target_spec());
        RequestSpec s = seeded(others[i], g());
        s.sampling.temperature = 0.2f + static_cast<float>(g() % 100) / 50.0f;
        s.sampling.top_k = static_cast<int32_t>(g() % 60);
        if (g() % 4 == 0)
          s.token_mask = std::make_unique<PositionalMask>();
        EXPECT_TRUE(e.submit(std::move(s)).ok());
      }
      while (e.step()) {
      }
      return e.request(id)->output;
    };
    SchedulerConfig sc;
    sc.max_tokens_per_step = 48;
    sc.prefill_chunk = 16;
    auto batch_engine = make_engine(int64_t{256} << 20, sc);
    EXPECT_EQ(run_mixed(*batch_engine), alone);

    // A budget that forces preemption (recomputation of the target's state).
    const auto& mc = fixture()->config();
    const int64_t page = state::min_page_bytes(mc);
    const int64_t fixed = state::SequenceState::pages_for(mc, page, 1, 0);
    SchedulerConfig tight_sc;
    tight_sc.max_tokens_per_step = 64;
    tight_sc.prefill_chunk = 4;
    auto tight = make_engine((2 * fixed + 8) * page, tight_sc);
    EXPECT_EQ(run_mixed(*tight), alone);
    EXPECT_GT(tight->stats().preemptions, 0);
  }
}

// The state footprint /metrics and `bench` report: one sequence's fixed pages, the growth per
// token at long contexts, and the longest context that fits the budget, against the pages a
// sequence of that length takes.
TEST(Engine, StateFootprintMatchesThePagesASequenceTakes) {
  const int64_t budget = int64_t{8} << 20;
  auto e = make_engine(budget);
  const auto& c = fixture()->config();
  const Footprint& f = e->footprint();
  const int64_t pb = state::min_page_bytes(c);
  EXPECT_EQ(f.page_bytes, pb);
  EXPECT_EQ(f.fixed_bytes, state::SequenceState::pages_for(c, pb, 1, 0) * pb);
  EXPECT_GT(f.bytes_per_token, 0.0);
  const int64_t pages = budget / pb;
  ASSERT_GT(f.max_context_tokens, 0);
  EXPECT_LE(state::SequenceState::pages_for(c, pb, f.max_context_tokens, 0), pages);
  if (f.max_context_tokens < c.max_position_embeddings) {
    EXPECT_GT(state::SequenceState::pages_for(c, pb, f.max_context_tokens + 1, 0), pages);
  }
  const EngineStats st = e->stats();
  EXPECT_EQ(st.state_bytes_fixed, f.fixed_bytes);
  EXPECT_EQ(st.state_max_context, f.max_context_tokens);
}

TEST(Engine, SeededDrawIsKeyedByAbsolutePosition) {
  // Resubmitting the prompt plus the first generated token continues with the same draws: the
  // draw for a token depends on (seed, its position in the sequence), not on how many tokens
  // this request has generated.
  Case c;
  for (int i = 0; i < 9; ++i) c.prompt.push_back(11 + 5 * i);
  c.max_tokens = 8;
  auto e = make_engine(int64_t{64} << 20);
  const RequestId a = *e->submit(seeded(c, 77));
  e->run_until_done();
  const std::vector<int32_t> first = e->request(a)->output;
  Case cont = c;
  cont.prompt.push_back(first[0]);
  cont.max_tokens = 7;
  const RequestId b = *e->submit(seeded(cont, 77));
  e->run_until_done();
  EXPECT_EQ(e->request(b)->output, std::vector<int32_t>(first.begin() + 1, first.end()));
  // Another seed draws differently.
  const RequestId d = *e->submit(seeded(c, 78));
  e->run_until_done();
  EXPECT_NE(e->request(d)->output, first);
}

// Penalty counts are kept only for requests whose sampling applies a penalty (counting every
// token of the others was the largest host cost per accepted token at large batches); a request
// with one counts its prompt and its output (backend_sampling_test samples under penalties).
TEST(Engine, RequestsWithoutPenaltiesCountNoTokens) {
  Case c;
  for (int i = 0; i < 9; ++i) c.prompt.push_back(11 + 5 * i);
  c.max_tokens = 6;
  auto e = make_engine(int64_t{64} << 20);
  const RequestId plain = *e->submit(greedy(c));
  RequestSpec with = greedy(c);
  with.sampling.repetition_penalty = 1.3f;
  const RequestId pen = *e->submit(std::move(with));
  RequestSpec freq = greedy(c);
  freq.sampling.frequency_penalty = 0.5f;
  const RequestId fp = *e->submit(std::move(freq));
  e->run_until_done();
  const Request* a = e->request(plain);
  ASSERT_EQ(a->output.size(), 6u);
  EXPECT_FALSE(a->penalties.counting());
  EXPECT_TRUE(a->penalties.seen().empty());
  EXPECT_TRUE(a->penalties.output_counts().empty());
  for (RequestId id : {pen, fp}) {
    const Request* r = e->request(id);
    ASSERT_EQ(r->output.size(), 6u);
    EXPECT_TRUE(r->penalties.counting());
    int64_t outputs = 0, seen = 0;
    for (const auto& [tok, n] : r->penalties.output_counts()) outputs += n;
    for (const auto& [tok, n] : r->penalties.seen()) seen += n;
    EXPECT_EQ(outputs, 6);
    EXPECT_EQ(seen, 9 + 6);
  }
}

std::vector<int32_t> run_seeded_alone(const Case& c, uint64_t seed) {
  auto e = make_engine(int64_t{64} << 20);
  const RequestId id = *e->submit(seeded(c, seed));
  e->run_until_done();
  return e->request(id)->output;
}

TEST(Engine, SharedPromptChoicesEqualEachChoiceAlone) {
  // n = 4: the first request computes the prompt, the other three fork its state and sample
  // with their own seeds; each equals the same request run alone with its seed.
  Case c;
  for (int i = 0; i < 40; ++i) c.prompt.push_back(2 + (i * 37) % 400);
  c.max_tokens = 10;
  SchedulerConfig sc;
  sc.prefill_chunk = 16;
  auto e = make_engine(int64_t{64} << 20, sc);
  std::vector<RequestId> ids;
  for (uint64_t i = 0; i < 4; ++i) {
    RequestSpec s = seeded(c, 500 + i);
    if (i > 0)
      s.share_prompt_of = ids[0];
    auto id = e->submit(std::move(s));
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  while (e->step()) e->check_integrity();
  // The prompt was computed once.
  EXPECT_EQ(e->stats().prompt_tokens, static_cast<int64_t>(c.prompt.size()));
  std::vector<std::vector<int32_t>> outs;
  for (uint64_t i = 0; i < 4; ++i) {
    outs.push_back(e->request(ids[i])->output);
    EXPECT_EQ(outs.back(), run_seeded_alone(c, 500 + i)) << "choice " << i;
  }
  EXPECT_NE(outs[0], outs[1]);
}

TEST(Engine, SharedPromptFallsBackWhenTheFirstChoiceEndsEarly) {
  Case c;
  for (int i = 0; i < 20; ++i) c.prompt.push_back(5 + i);
  c.max_tokens = 6;
  auto e = make_engine(int64_t{64} << 20);
  const RequestId first = *e->submit(seeded(c, 1));
  RequestSpec s = seeded(c, 2);
  s.share_prompt_of = first;
  const RequestId second = *e->submit(std::move(s));
  e->abort(first);  // before its prompt was computed: the second computes its own
  while (e->step()) e->check_integrity();
  EXPECT_EQ(e->request(second)->state, RequestState::kFinished);
  EXPECT_EQ(e->request(second)->output, run_seeded_alone(c, 2));

  // share_prompt_of naming an unknown request, a finished one or another prompt: rejected.
  RequestSpec bad = seeded(c, 3);
  bad.share_prompt_of = 999;
  EXPECT_FALSE(e->submit(std::move(bad)).ok());
  bad = seeded(c, 3);
  bad.share_prompt_of = second;
  EXPECT_FALSE(e->submit(std::move(bad)).ok());
  const RequestId third = *e->submit(seeded(c, 3));
  Case other = c;
  other.prompt.push_back(9);
  bad = seeded(other, 3);
  bad.share_prompt_of = third;
  EXPECT_FALSE(e->submit(std::move(bad)).ok());
  e->run_until_done();
}

TEST(Engine, BadInputIsRejectedAndOthersContinue) {
  auto e = make_engine(int64_t{64} << 20);
  auto good = e->submit(greedy({{5, 6, 7}, 4}));
  ASSERT_TRUE(good.ok());
  auto expect_error = [&](RequestSpec s, const std::string& needle) {
    auto r = e->submit(std::move(s));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  expect_error(greedy({{}, 4}), "prompt is empty");
  expect_error(greedy({{5, 9999}, 4}), "outside the vocabulary");
  expect_error(greedy({{5}, 0}), "max_tokens");
  RequestSpec bad = greedy({{5}, 4});
  bad.sampling.top_p = 1.5f;
  expect_error(std::move(bad), "top_p");
  expect_error(greedy({std::vector<int32_t>(10, 5), int64_t{1} << 40}), "context limit");
  auto small =
      make_engine(state::SequenceState::pages_for(
                      fixture()->config(), state::min_page_bytes(fixture()->config()), 40, 0) *
                  state::min_page_bytes(fixture()->config()));
  auto r = small->submit(greedy({std::vector<int32_t>(400, 5), 100}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("state memory budget"), std::string::npos);
  e->run_until_done();
  EXPECT_EQ(e->request(*good)->output.size(), 4u);
  EngineConfig missing;
  missing.model_dir = "/nonexistent/model";
  auto m = Engine::create(missing);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("/nonexistent/model"), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::engine

namespace dsinfer::engine {
namespace {

// A rank of a lockstepped (expert-parallel) group, on the CPU: the CPU reference forward plus the
// lockstep contract, with the other ranks simulated by a work counter. It records what the
// engine asks of it.
class LockstepRank final : public backend::Model {
 public:
  LockstepRank(const model::Checkpoint& ckpt, int other_busy_rounds)
      : cpu_(ckpt.config(), ckpt.weights(), model::Numerics::kReference),
        other_busy_(other_busy_rounds) {}
  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const backend::ForwardOptions& options,
                 backend::ForwardOutputs* out) override {
    return cpu_.forward(st, tokens, options, out);
  }
  Status forward_batch(std::span<backend::ForwardItem> items) override {
    ++passes;
    empty_passes += items.empty();
    EXPECT_TRUE(agreed_) << "a pass without a preceding agreement";
    agreed_ = false;
    return backend::Model::forward_batch(items);
  }
  bool lockstep() const override { return true; }
  Result<int64_t> all_ranks_sum(int64_t v) override {
    ++rounds;
    const int64_t others = other_busy_ > 0 ? 1 : 0;
    if (other_busy_ > 0)
      --other_busy_;
    agreed_ = v + others > 0;
    return v + others;
  }
  const char* name() const override { return "lockstep-cpu"; }
  const model::ModelConfig& config() const override { return cpu_.config(); }
  model::Numerics numerics() const override { return cpu_.numerics(); }

  int passes = 0;
  int empty_passes = 0;
  int rounds = 0;

 private:
  cpu::CpuModel cpu_;
  int other_busy_;
  bool agreed_ = false;
};

TEST(EngineLockstep, IdleRankKeepsServingUntilEveryRankIsDone) {
  const auto cases = mixed_cases(3, 17);
  for (int other : {0, 5, 60}) {
    SCOPED_TRACE("other rank busy for " + std::to_string(other) + " rounds");
    EngineConfig cfg;
    cfg.state_budget_bytes = int64_t{64} << 20;
    cfg.page_bytes = state::min_page_bytes(fixture()->config());
    auto probe = std::make_unique<LockstepRank>(*fixture(), other);
    LockstepRank* rank = probe.get();
    auto e = Engine::create(cfg, fixture(), std::move(probe));
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    std::vector<RequestId> ids;
    for (const Case& c : cases) ids.push_back(*(*e)->submit(greedy(c)));
    int steps = 0;
    while (true) {
      const Result<bool> more = (*e)->step_all_ranks();
      ASSERT_TRUE(more.ok()) << more.status().to_string();
      if (!*more)
        break;
      ASSERT_LT(++steps, 10000);
      (*e)->check_integrity();
    }
    // Every agreement that found work led to exactly one pass on this rank; the last agreement
    // found none. This rank's own requests came out as they do without lockstep.
    EXPECT_EQ(rank->passes, rank->rounds - 1);
    EXPECT_GE(rank->passes, other);
    if (other == 60) {
      EXPECT_GT(rank->empty_passes, 0);
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      const Request* r = (*e)->request(ids[i]);
      ASSERT_EQ(r->state, RequestState::kFinished);
      EXPECT_EQ(r->output, run_alone(cases[i])) << "request " << i;
    }
  }
}

}  // namespace
}  // namespace dsinfer::engine
