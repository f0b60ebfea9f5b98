// Speculative decoding end to end (src/spec + the engine's verification): outputs equal those
// without speculation token for token (greedy, and sampled with seeds, penalties and
// top-k/top-p/min-p), for batches of mixed lengths, with preemption and with every draft count;
// on the bundled model, whose MTP block is trained, drafts are mostly accepted; and the sampled
// distribution of the first tokens under speculation matches the model's exact distribution (a
// chi-square test over many seeds).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "engine/engine.h"
#include "model/checkpoint.h"
#include "spec/config.h"
#include "unit/engine/chi_square.h"
#include "unit/engine/engine_test_util.h"

namespace dsinfer::engine {
namespace {

std::shared_ptr<const model::Checkpoint> open_model(const std::string& dir) {
  auto r = model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/" + dir);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::shared_ptr<const model::Checkpoint>(std::move(r).value());
}

std::shared_ptr<const model::Checkpoint> fixture() {
  static auto ckpt = open_model("tests/fixtures/tiny-a/official");
  return ckpt;
}

std::shared_ptr<const model::Checkpoint> bundled() {
  static auto ckpt = open_model("models/dsv4-mini");
  return ckpt;
}

// A step-time model in which drafting pays (a forward costs about the same for 1..K+1 tokens):
// auto's choices then depend on the acceptance it observes, not on this machine's timings.
spec::StepTimes cheap_verify_times(int32_t max_k) {
  spec::StepTimes t;
  for (int64_t b : {1, 64}) {
    t.batch.push_back(b);
    t.off_s.push_back(1.0);
    t.verify_s.emplace_back();
    for (int32_t l = 1; l <= max_k + 1; ++l) t.verify_s.back().push_back(1.0 + 0.01 * l);
    t.draft_s.emplace_back();
    for (int32_t s = 1; s <= max_k; ++s) t.draft_s.back().push_back(0.02 * s);
  }
  return t;
}

struct EngineSetup {
  std::shared_ptr<const model::Checkpoint> ckpt;
  std::string speculative = "off";
  CpuKernels kernels = CpuKernels::kFast;
  model::Numerics numerics = model::Numerics::kReference;
  bool batch_invariant = false;
  std::optional<spec::StepTimes> step_times;  // auto: default cheap_verify_times
  int64_t budget = int64_t{256} << 20;
  SchedulerConfig sc;
  double forced_acceptance = 0;
  std::function<double()> clock;  // unset: the real one
};

std::unique_ptr<Engine> make_engine(const EngineSetup& s,
                                    std::unique_ptr<backend::Model> model = nullptr) {
  EngineConfig cfg;
  cfg.cpu_kernels = s.kernels;
  cfg.numerics = s.numerics;
  cfg.batch_invariant = s.batch_invariant;
  cfg.cpu_threads = 2;
  cfg.state_budget_bytes = s.budget;
  cfg.page_bytes = state::min_page_bytes(s.ckpt->config());
  cfg.scheduler = s.sc;
  auto sp = spec::parse_config(s.speculative);
  EXPECT_TRUE(sp.ok());
  cfg.speculative = *sp;
  if (cfg.speculative.mode == spec::Mode::kAuto)
    cfg.step_times = s.step_times ? *s.step_times : cheap_verify_times(cfg.speculative.k);
  cfg.forced_acceptance = s.forced_acceptance;
  cfg.clock = s.clock;
  auto e = model ? Engine::create(cfg, s.ckpt, std::move(model)) : Engine::create(cfg, s.ckpt);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

using test_support::Case;
using test_support::greedy;
using test_support::pays_only_alone_times;
using test_support::resume_test_prompts;
using test_support::run_all;

std::vector<Case> mixed_cases(int n, uint32_t seed, int32_t vocab, int max_out) {
  return test_support::random_cases(n, seed, 40, 2, vocab - 2, max_out);
}

using test_support::greedy_specs;
using test_support::sampled;

std::vector<RequestSpec> sampled_specs(const std::vector<Case>& cases) {
  return test_support::sampled_specs(cases, 1000);
}

class Speculative : public ::testing::TestWithParam<CpuKernels> {};
INSTANTIATE_TEST_SUITE_P(Cpu,
                         Speculative,
                         ::testing::Values(CpuKernels::kReference, CpuKernels::kFast),
                         [](const auto& info) {
                           return std::string(cpu_kernels_name(info.param));
                         });

TEST_P(Speculative, GreedyAndSeededOutputsEqualThoseWithoutSpeculation) {
  const auto cases = mixed_cases(16, 3, 512, 20);
  EngineSetup off;
  off.ckpt = fixture();
  off.kernels = GetParam();
  off.sc.max_tokens_per_step = 64;
  off.sc.prefill_chunk = 16;
  auto base = make_engine(off);
  const auto expected_greedy = run_all(*base, greedy_specs(cases));
  const auto expected_sampled = run_all(*base, sampled_specs(cases));
  const auto modes = GetParam() == CpuKernels::kFast
                         ? std::vector<const char*>{"fixed:1", "fixed:3", "fixed:5", "auto"}
                         : std::vector<const char*>{"fixed:2", "auto"};
  for (const char* mode : modes) {
    EngineSetup s = off;
    s.speculative = mode;
    auto e = make_engine(s);
    EXPECT_EQ(run_all(*e, greedy_specs(cases)), expected_greedy) << mode;
    EXPECT_EQ(run_all(*e, sampled_specs(cases)), expected_sampled) << mode;
    const EngineStats st = e->stats();
    EXPECT_EQ(st.speculative.mode, spec::parse_config(mode)->mode);
    EXPECT_GT(st.spec.verified[0], 0) << mode;
    EXPECT_GT(st.spec.spec_steps, 0) << mode;
  }
}

TEST_P(Speculative, PreemptionKeepsOutputs) {
  const auto cases = mixed_cases(12, 11, 512, 16);
  EngineSetup off;
  off.ckpt = fixture();
  off.kernels = GetParam();
  auto base = make_engine(off);
  const auto expected = run_all(*base, greedy_specs(cases));
  const auto expected_sampled = run_all(*base, sampled_specs(cases));
  // Room for about two sequences (with the drafts' rollback room): admission waits, running
  // requests are preempted and recomputed, drafts find no room at times.
  EngineSetup tight = off;
  tight.speculative = "fixed:4";
  const auto& mc = fixture()->config();
  const int64_t page = state::min_page_bytes(mc);
  const int64_t fixed = state::SequenceState::pages_for(mc, page, 1, 4);
  tight.budget = (2 * fixed + 8) * page;
  tight.sc.max_tokens_per_step = 64;
  tight.sc.prefill_chunk = 4;
  auto e = make_engine(tight);
  EXPECT_EQ(run_all(*e, greedy_specs(cases)), expected);
  EXPECT_EQ(run_all(*e, sampled_specs(cases)), expected_sampled);
  EXPECT_GT(e->stats().preemptions, 0);
  EXPECT_GT(e->stats().spec.spec_steps, 0);
}

TEST(Speculative, BundledModelAcceptsMostDraftsAndKeepsGreedyOutputs) {
  const int32_t vocab = static_cast<int32_t>(bundled()->config().vocab_size);
  const auto cases = mixed_cases(8, 5, vocab, 40);
  EngineSetup off;
  off.ckpt = bundled();
  auto base = make_engine(off);
  const auto expected = run_all(*base, greedy_specs(cases));
  for (const char* mode : {"fixed:3", "auto"}) {
    EngineSetup s = off;
    s.speculative = mode;
    auto e = make_engine(s);
    EXPECT_EQ(run_all(*e, greedy_specs(cases)), expected) << mode;
    const spec::Stats st = e->stats().spec;
    // The bundled MTP block is trained: most first drafts are accepted and a verification
    // emits well over one token.
    EXPECT_GT(st.acceptance(0), 0.6) << mode << ": " << st.summary();
    EXPECT_GT(st.mean_accepted_length(), 1.8) << mode << ": " << st.summary();
  }
}

// The CPU twin of CudaEngine.SpeculativeGreedyEqualsOffAndDraftsAreAccepted
// (tests/gpu/model_test.cu: the same 12 requests, DeepSeek numerics, a batch-invariant forward),
// with every verify length up to 5 and auto verifying different lengths per request in one forward:
// greedy outputs equal those without speculation, and drafts at positions 4 and 5 are both verified
// and accepted.
TEST(Speculative, BundledModelDeepAndMixedVerificationsKeepGreedyOutputs) {
  auto run = [&](const char* mode, EngineStats* stats) {
    EngineSetup s;
    s.ckpt = bundled();
    s.speculative = mode;
    s.numerics = model::Numerics::kDeepSeek;
    s.batch_invariant = true;
    s.sc.prefill_chunk = 32;
    auto e = make_engine(s);
    std::mt19937 g(21);
    std::vector<RequestId> ids;
    for (int i = 0; i < 12; ++i) {
      RequestSpec r;
      const int len = 4 + static_cast<int>(g() % 60);
      for (int j = 0; j < len; ++j) r.prompt.push_back(static_cast<int32_t>(100 + g() % 3000));
      r.max_tokens = 8 + static_cast<int64_t>(g() % 24);
      r.sampling.temperature = 0.0f;
      r.ignore_eos = true;
      auto id = e->submit(std::move(r));
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      ids.push_back(*id);
    }
    while (e->step()) e->check_integrity();
    std::vector<std::vector<int32_t>> out;
    for (RequestId id : ids) out.push_back(e->request(id)->output);
    if (stats)
      *stats = e->stats();
    return out;
  };
  const auto off = run("off", nullptr);
  for (const char* mode : {"fixed:1", "fixed:3", "fixed:4", "fixed:5", "auto"}) {
    EngineStats st;
    EXPECT_EQ(run(mode, &st), off) << mode;
    std::printf("[spec] %s: %s\n", mode, st.spec.summary().c_str());
    const size_t k = st.spec.verified.size();
    ASSERT_GE(k, 1u) << mode;
    EXPECT_GT(st.spec.acceptance(0), 0.5) << mode << ": " << st.spec.summary();
    if (k >= 4) {
      // Deep verifications happen and are accepted: the fixed modes' deepest position; auto's
      // fourth (its choices here stop at four drafts; it reached the fifth only while the steps
      // beside prefill chunks ran the decode steps' exploration picks, never recorded, before
      // StepCost::choose_mixed).
      const size_t deep = std::string(mode) == "auto" ? 3 : k - 1;
      EXPECT_GT(st.spec.verified[deep], 0) << mode << ": " << st.spec.summary();
      EXPECT_GT(st.spec.accepted[3], 0) << mode << ": " << st.spec.summary();
    }
  }
}

// Auto with a step-time model in which drafting pays for one request and not for several: a
// request running alone speculates, requests that start beside it start without the MTP block,
// so forwards mix an item verifying drafts (with the MTP block) and plain decode items (without
// it) — what only auto does. Greedy outputs equal those without speculation.
TEST(Speculative, AutoMixesSpeculatingAndPlainRequestsInOneForward) {
  const int32_t k = 5;
  spec::StepTimes t;
  for (int64_t b : {1, 64}) {
    t.batch.push_back(b);
    t.off_s.push_back(b == 1 ? 1.0 : 2.0);
    t.verify_s.emplace_back();
    for (int32_t l = 1; l <= k + 1; ++l)
      t.verify_s.back().push_back(b == 1 ? 1.0 + 0.01 * l : 2.0 + 10.0 * l);
    t.draft_s.emplace_back();
    for (int32_t d = 1; d <= k; ++d) t.draft_s.back().push_back(b == 1 ? 0.02 * d : 1.0 * d);
  }
  std::mt19937 g(33);
  struct Req {
    std::vector<int32_t> prompt;
    int64_t max_tokens = 0;
  };
  std::vector<Req> specs;
  for (int i = 0; i < 9; ++i) {
    Req r;
    const int len = 4 + static_cast<int>(g() % 40);
    for (int j = 0; j < len; ++j) r.prompt.push_back(static_cast<int32_t>(100 + g() % 3000));
    r.max_tokens = i == 0 ? 48 : 8 + static_cast<int64_t>(g() % 16);
    specs.push_back(std::move(r));
  }
  int64_t mixed_spec_steps = 0;  // verifications in steps with other requests running
  auto run = [&](const char* mode, std::vector<bool>* disabled, EngineStats* stats) {
    EngineSetup s;
    s.ckpt = bundled();
    s.speculative = mode;
    s.numerics = model::Numerics::kDeepSeek;
    s.batch_invariant = true;
    s.step_times = t;
    auto e = make_engine(s);
    std::vector<RequestId> ids;
    auto submit = [&](size_t i) {
      RequestSpec r;
      r.prompt = specs[i].prompt;
      r.max_tokens = specs[i].max_tokens;
      r.sampling.temperature = 0.0f;
      r.ignore_eos = true;
      auto id = e->submit(std::move(r));
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      ids.push_back(*id);
    };
    // The first request alone for a few steps, then eight more beside it.
    submit(0);
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(e->step());
    for (size_t i = 1; i < specs.size(); ++i) submit(i);
    if (disabled)
      disabled->clear();
    mixed_spec_steps = 0;
    while (true) {
      // Whether this step has request 0 beside the others (some of them started, not all done).
      bool beside = false;
      for (size_t i = 1; i < ids.size(); ++i) {
        const Request* r = e->request(ids[i]);
        beside = beside || (r->num_computed > 0 && !r->done());
      }
      const int64_t before = e->stats().spec.spec_steps;
      if (!e->step())
        break;
      e->check_integrity();
      if (beside)
        mixed_spec_steps += e->stats().spec.spec_steps - before;
      if (disabled && disabled->empty() && e->request(ids.back())->num_computed > 0) {
        for (RequestId id : ids) disabled->push_back(e->request(id)->spec_disabled);
      }
    }
    std::vector<std::vector<int32_t>> out;
    for (RequestId id : ids) out.push_back(e->request(id)->output);
    if (stats)
      *stats = e->stats();
    return out;
  };
  const auto off = run("off", nullptr, nullptr);
  std::vector<bool> disabled;
  EngineStats st;
  EXPECT_EQ(run("auto", &disabled, &st), off);
  ASSERT_EQ(disabled.size(), specs.size());
  EXPECT_FALSE(disabled[0]);  // speculating
  for (size_t i = 1; i < disabled.size(); ++i) EXPECT_TRUE(disabled[i]) << i;
  EXPECT_GT(mixed_spec_steps, 0) << st.spec.summary();
}

// Auto stops a request's speculation at a batch where it does not pay and resumes it once the
// batch has shrunk to where it does: two requests start together at batch 2 (verification made
// costly there), both without speculation; once the short one finishes, the long one decodes
// alone (verification cheap) and, after the resume's 16 steps, drafts again from the kept final
// streams with its MTP block's window floored there. Greedy outputs equal those without
// speculation; drafts are proposed and accepted after the resume. On a stopped clock: the CPU's
// real step times (slower still under sanitizers) would teach auto a model of their own.
TEST_P(Speculative, AStoppedRequestResumesWhenTheBatchShrinks) {
  const spec::StepTimes t = pays_only_alone_times(3);
  const std::vector<std::vector<int32_t>> prompts = resume_test_prompts();
  auto run = [&](const char* mode, EngineStats* stats, std::vector<bool>* disabled_early) {
    EngineSetup s;
    s.ckpt = bundled();
    s.kernels = GetParam();
    s.speculative = mode;
    s.step_times = t;
    s.clock = [] { return 0.0; };
    auto e = make_engine(s);
    std::vector<RequestId> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestSpec r;
      r.prompt = prompts[i];
      r.max_tokens = i == 0 ? 72 : 6;
      r.sampling.temperature = 0.0f;
      r.ignore_eos = true;
      auto id = e->submit(std::move(r));
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      ids.push_back(*id);
    }
    while (e->step()) {
      e->check_integrity();
      // Both decoding, the short one not done: neither speculates.
      const Request* a = e->request(ids[0]);
      const Request* b = e->request(ids[1]);
      if (disabled_early && disabled_early->empty() && !a->output.empty() && !b->done() &&
          b->output.size() >= 2)
        *disabled_early = {a->spec_disabled, b->spec_disabled};
    }
    std::vector<std::vector<int32_t>> out;
    for (RequestId id : ids) out.push_back(e->request(id)->output);
    if (stats)
      *stats = e->stats();
    return out;
  };
  const auto off = run("off", nullptr, nullptr);
  EngineStats st;
  std::vector<bool> early;
  EXPECT_EQ(run("auto:3", &st, &early), off);
  ASSERT_EQ(early.size(), 2u);
  EXPECT_TRUE(early[0]);
  EXPECT_TRUE(early[1]);
  EXPECT_EQ(st.spec.resumed, 1) << st.spec.summary();
  EXPECT_GT(st.spec.drafted, 0) << st.spec.summary();
  EXPECT_GT(st.spec.spec_steps, 0) << st.spec.summary();
  EXPECT_GT(st.spec.accepted[0], 0) << st.spec.summary();
}

TEST(Speculative, SharedPromptForksKeepTheirOutputs) {
  // n = 4 on the bundled model: three requests fork the first one's prompt state (MTP block
  // included) and then speculate on their own; each output equals the same seeded request run
  // without speculation.
  const auto cases = mixed_cases(1, 9, 8192, 24);
  auto run = [&](const char* mode) {
    EngineSetup s;
    s.ckpt = bundled();
    s.speculative = mode;
    auto e = make_engine(s);
    std::vector<RequestId> ids;
    for (uint64_t i = 0; i < 4; ++i) {
      RequestSpec r = sampled(cases[0], 700 + i);
      r.max_tokens = 24;
      if (i > 0)
        r.share_prompt_of = ids[0];
      auto id = e->submit(std::move(r));
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      ids.push_back(*id);
    }
    while (e->step()) e->check_integrity();
    EXPECT_EQ(e->stats().prompt_tokens, static_cast<int64_t>(cases[0].prompt.size()));
    std::vector<std::vector<int32_t>> outs;
    for (RequestId id : ids) outs.push_back(e->request(id)->output);
    return outs;
  };
  EXPECT_EQ(run("fixed:3"), run("off"));
}

// Auto with a step-time model in which drafting never pays: the parent's prompt runs without the
// MTP block, and its forks (n = 4) must not speculate from that (behind) drafter state either
// (they did: "MTP state is behind" failed the request, seen through the server's n = 3).
TEST(Speculative, ForksOfAParentThatDidNotSpeculateDoNotSpeculate) {
  const int32_t k = 5;  // auto's drafts
  spec::StepTimes t;
  for (int64_t b : {1, 64}) {
    t.batch.push_back(b);
    t.off_s.push_back(1.0);
    t.verify_s.emplace_back();
    for (int32_t l = 1; l <= k + 1; ++l) t.verify_s.back().push_back(1.0 + 10.0 * l);
    t.draft_s.emplace_back();
    for (int32_t d = 1; d <= k; ++d) t.draft_s.back().push_back(1.0 * d);
  }
  const auto cases = mixed_cases(1, 9, 8192, 24);
  auto run = [&](const char* mode) {
    EngineSetup s;
    s.ckpt = bundled();
    s.speculative = mode;
    s.step_times = t;
    s.kernels = CpuKernels::kReference;  // checks that the MTP state is not behind
    auto e = make_engine(s);
    std::vector<RequestId> ids;
    for (uint64_t i = 0; i < 4; ++i) {
      RequestSpec r = sampled(cases[0], 900 + i);
      r.max_tokens = 12;
      if (i > 0)
        r.share_prompt_of = ids[0];
      auto id = e->submit(std::move(r));
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      ids.push_back(*id);
    }
    while (e->step()) {
      e->check_integrity();
      // A fork speculates exactly when its parent does (the drafter state it inherits).
      for (size_t i = 1; i < ids.size(); ++i) {
        const Request* c = e->request(ids[i]);
        if (c->num_computed > 0 && !c->done()) {
          EXPECT_EQ(c->spec_disabled, e->request(ids[0])->spec_disabled) << mode;
        }
      }
    }
    EXPECT_EQ(e->stats().prompt_tokens, static_cast<int64_t>(cases[0].prompt.size())) << "forked";
    std::vector<std::vector<int32_t>> outs;
    for (RequestId id : ids) {
      const Request* r = e->request(id);
      EXPECT_EQ(r->finish_reason, FinishReason::kLength) << r->error;
      outs.push_back(r->output);
    }
    return outs;
  };
  EXPECT_EQ(run("auto"), run("off"));
}

// bench --forced-acceptance: each draft accepted with the given probability whatever the target
// says (the tiny fixture's MTP block accepts almost nothing), emitted as drafted; the counters
// see it like any acceptance.
TEST(Speculative, ForcedAcceptanceAcceptsDraftsAtTheGivenRate) {
  const auto cases = mixed_cases(8, 41, 512, 40);
  for (double p : {1.0, 0.5}) {
    SCOPED_TRACE("forced acceptance " + std::to_string(p));
    EngineSetup s;
    s.ckpt = fixture();
    s.speculative = "fixed:3";
    s.forced_acceptance = p;
    auto e = make_engine(s);
    const auto out = run_all(*e, greedy_specs(cases));
    for (size_t i = 0; i < cases.size(); ++i)
      EXPECT_EQ(out[i].size(), static_cast<size_t>(cases[i].max_tokens));
    const spec::Stats st = e->stats().spec;
    ASSERT_GT(st.verified[0], 20);
    for (size_t j = 0; j < 3; ++j) {
      if (p == 1.0) {
        EXPECT_EQ(st.acceptance(j), 1.0) << j;
      } else if (st.verified[j] >= 10) {
        EXPECT_NEAR(st.acceptance(j), p, 0.25) << j;
      }
    }
  }
  EngineConfig bad;
  bad.model_dir = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official";
  bad.forced_acceptance = 1.5;
  EXPECT_EQ(Engine::create(bad).status().code(), StatusCode::kInvalidArgument);
}

// EngineStats::phases: the step loop's wall time by phase. With speculation the drafter's calls
// and the forwards take time, the phases never sum to more than the steps' wall time, and
// without a drafter no step drafts.
// The CPU reference behind backend::Model, whose MTP drafting fails for the first request of
// every third call (a per-item error, the state untouched).
class FailingDrafts final : public test_support::CpuBackedModel {
 public:
  using CpuBackedModel::CpuBackedModel;
  bool can_draft() const override { return true; }
  Status mtp_draft_batch(std::span<backend::DraftItem> items) override {
    ++calls_;
    for (size_t i = 0; i < items.size(); ++i) {
      backend::DraftItem& it = items[i];
      it.status =
          i == 0 && calls_ % 3 == 0
              ? failed_precondition("injected drafting failure")
              : cpu_.mtp_draft(
                    *it.state, it.next_token, it.num_steps, it.catch_up, it.tokens, it.probs);
    }
    return Status();
  }
  const char* name() const override { return "failing-drafts"; }

 private:
  int64_t calls_ = 0;
};

// A request whose drafting fails decodes on without speculation (its MTP block, behind after
// verifications that skipped their MTP pass, could not follow a forward with MTP): no request
// fails and the outputs are those without speculation.
// (The bundled model: its trained MTP block's drafts are accepted, so the block is behind when a
// drafting call fails; the fixture's are not.)
TEST(Speculative, ARequestWhoseDraftingFailsDecodesOnWithoutSpeculation) {
  const int32_t vocab = static_cast<int32_t>(bundled()->config().vocab_size);
  const auto cases = mixed_cases(4, 11, vocab, 32);
  EngineSetup off;
  off.ckpt = bundled();
  off.kernels = CpuKernels::kReference;
  auto base = make_engine(off);
  const auto expected = run_all(*base, greedy_specs(cases));
  for (const char* mode : {"fixed:3", "auto"}) {
    EngineSetup s = off;
    s.speculative = mode;
    auto e = make_engine(s, std::make_unique<FailingDrafts>(*bundled()));
    EXPECT_EQ(run_all(*e, greedy_specs(cases)), expected) << mode;
    EXPECT_GT(e->stats().spec.mean_accepted_length(), 1.5) << mode;
  }
}

// A backend that leaves the drafts where it made them (DraftItem::deferred), as the CUDA backend
// does with its picks on the device: drafting returns placeholders, the verification's forward
// takes the drafts it kept (ForwardOptions::device_drafts) and writes the items' tokens and
// probabilities only when it returns.
class DeferringDrafts final : public test_support::CpuBackedModel {
 public:
  DeferringDrafts(const model::Checkpoint& ckpt, bool defer)
      : CpuBackedModel(ckpt), defer_(defer) {}
  bool can_draft() const override { return cpu_.can_draft(); }
  bool can_resume_drafting() const override { return cpu_.can_resume_drafting(); }
  Status mtp_draft_batch(std::span<backend::DraftItem> items) override {
    EXPECT_TRUE(held_.empty()) << "a drafting call before the deferred drafts were verified";
    complete();
    for (backend::DraftItem& it : items) {
      it.deferred = false;
      it.status =
          cpu_.mtp_draft(*it.state, it.next_token, it.num_steps, it.catch_up, it.tokens, it.probs);
      if (!it.status.ok() || it.num_steps == 0)
        continue;
      if (!defer_ || !it.may_defer) {
        ++immediate_;
        continue;
      }
      held_.push_back({it.state,
                       it.tokens,
                       it.probs,
                       std::vector<int32_t>(it.tokens, it.tokens + it.num_steps),
                       std::vector<float>(it.probs, it.probs + it.num_steps)});
      std::fill(it.tokens, it.tokens + it.num_steps, 1);  // what a verification must not read
      std::fill(it.probs, it.probs + it.num_steps, -1.0f);
      it.deferred = true;
      ++deferred_;
    }
    return Status();
  }
  Status forward_batch(std::span<backend::ForwardItem> items) override {
    std::vector<std::vector<int32_t>> tokens(items.size());
    std::vector<std::span<const int32_t>> given(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      backend::ForwardItem& it = items[i];
      given[i] = it.tokens;
      if (it.options.device_drafts == 0)
        continue;
      const Held* h = nullptr;
      for (const Held& e : held_) h = e.state == it.state ? &e : h;
      EXPECT_TRUE(h != nullptr &&
                  it.options.device_drafts <= static_cast<int32_t>(h->tokens.size()) &&
                  it.options.device_drafts < static_cast<int32_t>(it.tokens.size()));
      if (h == nullptr)
        return failed_precondition("device drafts of a sequence that has none");
      tokens[i].assign(it.tokens.begin(), it.tokens.end());
      for (int32_t j = 0; j < it.options.device_drafts; ++j)
        tokens[i][static_cast<size_t>(1 + j)] = h->tokens[static_cast<size_t>(j)];
      it.tokens = tokens[i];
      ++verified_;
    }
    const Status s = CpuBackedModel::forward_batch(items);
    for (size_t i = 0; i < items.size(); ++i) items[i].tokens = given[i];
    complete();
    return s;
  }
  const char* name() const override { return "deferring-drafts"; }
  int64_t deferred() const { return deferred_; }
  int64_t immediate() const { return immediate_; }
  int64_t verified() const { return verified_; }

 private:
  struct Held {
    const state::SequenceState* state;
    int32_t* out_tokens;
    float* out_probs;
    std::vector<int32_t> tokens;
    std::vector<float> probs;
  };
  void complete() {
    for (const Held& h : held_) {
      std::copy(h.tokens.begin(), h.tokens.end(), h.out_tokens);
      std::copy(h.probs.begin(), h.probs.end(), h.out_probs);
    }
    held_.clear();
  }
  bool defer_;
  std::vector<Held> held_;
  int64_t deferred_ = 0, immediate_ = 0, verified_ = 0;
};

// Drafts left on the backend until their verification (the CUDA backend's deferred picks): the
// outputs are those of the same backend returning its drafts at once, greedy and sampled (the
// requests whose penalties count the drafts are never deferred), under fixed depths and auto,
// and the verifications took the deferred drafts.
TEST(Speculative, DraftsLeftOnTheBackendUntilTheVerificationKeepOutputs) {
  const int32_t vocab = static_cast<int32_t>(bundled()->config().vocab_size);
  const auto cases = mixed_cases(4, 17, vocab, 16);
  for (const char* mode : {"fixed:3", "auto"}) {
    EngineSetup s;
    s.ckpt = bundled();
    s.kernels = CpuKernels::kReference;
    s.speculative = mode;
    s.sc.max_tokens_per_step = 64;
    s.sc.prefill_chunk = 16;
    auto now_model = std::make_unique<DeferringDrafts>(*bundled(), false);
    auto later_model = std::make_unique<DeferringDrafts>(*bundled(), true);
    DeferringDrafts* later = later_model.get();
    auto now = make_engine(s, std::move(now_model));
    auto deferred = make_engine(s, std::move(later_model));
    EXPECT_EQ(run_all(*deferred, greedy_specs(cases)), run_all(*now, greedy_specs(cases))) << mode;
    const int64_t greedy_deferred = later->deferred();
    EXPECT_GT(greedy_deferred, 0) << mode;
    EXPECT_EQ(later->immediate(), 0) << mode;
    EXPECT_EQ(run_all(*deferred, sampled_specs(cases)), run_all(*now, sampled_specs(cases)))
        << mode;
    EXPECT_GT(later->deferred(), greedy_deferred) << mode;
    EXPECT_GT(later->immediate(), 0) << mode << ": requests with penalties draft at once";
    EXPECT_EQ(later->verified(), later->deferred()) << mode;
    // The same drafts accepted (the deferred ones were the drafts made, not the placeholders);
    // under auto the depths follow the measured step times, so only at a fixed depth.
    if (std::string(mode) != "auto") {
      EXPECT_EQ(deferred->stats().spec.spec_tokens, now->stats().spec.spec_tokens) << mode;
    }
    EXPECT_GT(deferred->stats().spec.mean_accepted_length(), 1.3) << mode;
  }
}

TEST(Speculative, StepPhasesAccountForTheStepsTime) {
  const auto cases = mixed_cases(4, 43, 512, 12);
  for (const char* mode : {"fixed:2", "off"}) {
    SCOPED_TRACE(mode);
    EngineSetup s;
    s.ckpt = fixture();
    s.speculative = mode;
    auto e = make_engine(s);
    const auto t0 = std::chrono::steady_clock::now();
    run_all(*e, greedy_specs(cases));
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const EngineStats::StepPhases& p = e->stats().phases;
    for (double v : {p.schedule, p.draft, p.prepare, p.forward, p.finish}) EXPECT_GE(v, 0.0);
    EXPECT_GT(p.forward, 0.0);
    EXPECT_LE(p.schedule + p.draft + p.prepare + p.forward + p.finish, wall);
    if (std::string(mode) == "off") {
      EXPECT_LT(p.draft, 0.1 * p.forward);  // two clock reads a step, no drafter call
    } else {
      EXPECT_GT(e->stats().spec.drafted, 0);
      EXPECT_GT(p.draft, 0.0);
    }
  }
}

TEST(Speculative, NoDrafterIsAnErrorWhenAskedForAndOffByDefault) {
  auto tiny_b = open_model("tests/fixtures/tiny-b/official");  // no MTP weights
  EngineConfig cfg;
  cfg.speculative = *spec::parse_config("fixed:2");
  auto e = Engine::create(cfg, tiny_b);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("no MTP weights"), std::string::npos);
  cfg.speculative = *spec::parse_config("auto");
  cfg.speculative.defaulted = true;
  auto d = Engine::create(cfg, tiny_b);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ((*d)->speculative().mode, spec::Mode::kOff);
}

using testing_util::chi_square;

TEST(Speculative, SampledDistributionOfTheFirstTokensIsTheModels) {
  // The first three generated tokens of one prompt under temperature 1 and top-k 3, over many
  // seeds, with 2 drafts per step: tokens 2 and 3 come from verifications (accepted drafts or the
  // target's own token after a rejection). Their joint distribution must be the model's, computed
  // exactly from the reference forward.
  const auto ckpt = bundled();
  const auto& mc = ckpt->config();
  // "The history of the city begins" in the bundled tokenizer.
  const std::vector<int32_t> prompt = {1917, 436, 640, 1100, 377, 311, 286, 752, 6371, 1920};
  constexpr int kTopK = 3;
  auto topk_probs = [&](const float* logits) {
    std::vector<int32_t> idx(static_cast<size_t>(mc.vocab_size));
    for (int32_t i = 0; i < mc.vocab_size; ++i) idx[static_cast<size_t>(i)] = i;
    std::partial_sort(idx.begin(), idx.begin() + kTopK, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b];
    });
    std::vector<std::pair<int32_t, double>> out;
    double z = 0;
    for (int i = 0; i < kTopK; ++i) z += std::exp(double{logits[idx[i]]} - logits[idx[0]]);
    for (int i = 0; i < kTopK; ++i)
      out.push_back({idx[i], std::exp(double{logits[idx[i]]} - logits[idx[0]]) / z});
    return out;
  };
  // Exact joint probabilities of (t1, t2, t3): one reference forward per (t1, t2).
  cpu::CpuModel model(mc, ckpt->weights(), model::Numerics::kReference);
  auto arena = state::PageArena::growable(state::default_page_bytes(mc));
  std::map<std::vector<int32_t>, double> expected;
  {
    state::SequenceState st(mc, arena.get(), 0, 0);
    backend::ForwardOutputs out;
    ASSERT_TRUE(model.forward(st, prompt, backend::ForwardOptions(), &out).ok());
    const float* last = out.logits.data() + (prompt.size() - 1) * mc.vocab_size;
    for (const auto& [t1, p1] : topk_probs(last)) {
      state::SequenceState s1(mc, arena.get(), 1, 0);
      std::vector<int32_t> seq = prompt;
      seq.push_back(t1);
      backend::ForwardOutputs o1;
      ASSERT_TRUE(model.forward(s1, seq, backend::ForwardOptions(), &o1).ok());
      for (const auto& [t2, p2] : topk_probs(o1.logits.data() + prompt.size() * mc.vocab_size)) {
        state::SequenceState s2(mc, arena.get(), 2, 0);
        std::vector<int32_t> seq2 = seq;
        seq2.push_back(t2);
        backend::ForwardOutputs o2;
        ASSERT_TRUE(model.forward(s2, seq2, backend::ForwardOptions(), &o2).ok());
        for (const auto& [t3, p3] :
             topk_probs(o2.logits.data() + (prompt.size() + 1) * mc.vocab_size)) {
          expected[{t1, t2, t3}] = p1 * p2 * p3;
        }
      }
    }
  }
  constexpr int kRuns = 1500;
  EngineSetup s;
  s.ckpt = ckpt;
  s.speculative = "fixed:2";
  s.sc.max_running = 256;
  s.sc.max_tokens_per_step = 1024;
  auto e = make_engine(s);
  std::vector<RequestSpec> specs;
  for (int i = 0; i < kRuns; ++i) {
    RequestSpec r;
    r.prompt = prompt;
    r.max_tokens = 3;
    r.ignore_eos = true;
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = kTopK;
    r.sampling.seed = 0x5EED0000u + static_cast<uint64_t>(i);
    specs.push_back(std::move(r));
  }
  std::map<std::vector<int32_t>, int> observed;
  for (const auto& out : run_all(*e, std::move(specs))) ++observed[out];
  const spec::Stats st = e->stats().spec;
  // Both paths are exercised: drafts accepted (tokens from the draft) and rejected.
  EXPECT_GT(st.accepted[0], kRuns / 10) << st.summary();
  EXPECT_LT(st.accepted[0], st.verified[0]) << st.summary();
  int dof = 0;
  const double stat = chi_square(observed, expected, kRuns, &dof);
  ASSERT_GE(dof, 3);
  const double limit = testing_util::chi_square_limit_999(dof);
  EXPECT_LT(stat, limit) << "dof " << dof << ", " << st.summary();
  std::printf("chi-square %.1f, dof %d, limit %.1f\n", stat, dof, limit);
  // The test can fail: the same counts against a slightly different distribution (the most
  // likely third token 30% less likely, as a biased acceptance rule would make it) are far off.
  const int32_t t3 =
      std::max_element(expected.begin(), expected.end(), [](const auto& a, const auto& b) {
        return a.second < b.second;
      })->first[2];
  std::map<std::vector<int32_t>, double> skewed = expected;
  double zsum = 0;
  for (auto& [k, p] : skewed) zsum += (p *= k[2] == t3 ? 0.7 : 1.0);
  for (auto& [k, p] : skewed) p /= zsum;
  int dof2 = 0;
  EXPECT_GT(chi_square(observed, skewed, kRuns, &dof2), limit);
}

}  // namespace
}  // namespace dsinfer::engine
