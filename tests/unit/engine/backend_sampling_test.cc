// In-backend sampling (ForwardOptions::sample, EngineConfig::backend_sampling): the engine hands
// the sampling of a chunk's last position to a backend that can do it (CUDA: on the device) and
// gets only the token back. Here the backend is the CPU reference with the host sampler behind
// that interface, so every output must be identical to the engine sampling itself: seeds keyed
// by position, penalties, masks taken before the forward and told the token after it, logprobs,
// the fallbacks (top_logprobs, shared-prompt choices) and preemption.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "backend/forward_as_batch.h"
#include "engine/engine.h"
#include "model/checkpoint.h"
#include "spec/config.h"
#include "unit/engine/engine_test_util.h"

namespace dsinfer::engine {
namespace {

std::shared_ptr<const model::Checkpoint> fixture() {
  return test_support::tiny_fixture();
}

// The CPU reference forward; ForwardOptions::sample honoured with the host sampler on the
// item's logits (which then do not come back), as a device backend would.
class HostSamplingModel final : public test_support::CpuBackedModel {
 public:
  using CpuBackedModel::CpuBackedModel;
  Status forward_batch(std::span<backend::ForwardItem> items) override {
    for (backend::ForwardItem& it : items) {
      if (it.out) {
        it.out->sampled = false;
        it.out->row_samples.clear();
      }
      it.status = cpu_.forward(*it.state, it.tokens, it.options, it.out);
      if (it.status.ok() && it.out && !it.options.sample_rows.empty()) {
        // Every row (a verification): as CudaModel, only the picks come back.
        EXPECT_TRUE(it.options.want_logits && !it.options.last_logits_only);
        EXPECT_EQ(it.options.sample_rows.size(), it.tokens.size());
        const auto vocab = static_cast<size_t>(cpu_.config().vocab_size);
        // Row j is sampled under the request's penalties with the drafts before it (tokens
        // 1..j) as extra output, and at row 0's RNG step + j: the state the host samples row j
        // in once they are accepted. The device sampler merges extra_output into its penalty
        // list; here a copy of the state takes them.
        const backend::SampleRequest& q0 = it.options.sample_rows[0];
        for (size_t j = 0; j < it.options.sample_rows.size(); ++j) {
          const backend::SampleRequest& q = it.options.sample_rows[j];
          EXPECT_EQ(q.config->top_logprobs, 0);
          EXPECT_TRUE(q.allowed.empty());
          EXPECT_EQ(q.step, q0.step + j);
          EXPECT_EQ(q.penalties, q0.penalties);
          EXPECT_EQ(std::vector<int32_t>(q.extra_output.begin(), q.extra_output.end()),
                    std::vector<int32_t>(it.tokens.begin() + 1,
                                         it.tokens.begin() + 1 + static_cast<std::ptrdiff_t>(j)))
              << "row " << j;
          sampling::PenaltyState pen = *q.penalties;
          for (int32_t tok : q.extra_output) pen.add_output(tok);
          const sampling::SamplingConfig& c = *q.config;
          if (c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f ||
              c.repetition_penalty != 1.0f)
            ++penalised_verify_rows;
          std::vector<float> row(
              it.out->logits.begin() + static_cast<std::ptrdiff_t>(j * vocab),
              it.out->logits.begin() + static_cast<std::ptrdiff_t>((j + 1) * vocab));
          it.out->row_samples.push_back(sampling::sample(row, c, pen, q.step, scratch_, q.allowed));
          ++verify_rows;
        }
        it.out->logits.clear();
        continue;
      }
      const backend::SampleRequest* q = it.options.sample;
      if (!it.status.ok() || !q || !it.out)
        continue;
      EXPECT_TRUE(it.options.want_logits && it.options.last_logits_only);
      EXPECT_EQ(q->config->top_logprobs, 0);
      if (!q->allowed.empty())
        ++masked_rows;
      it.out->sample = sampling::sample(
          it.out->logits, *q->config, *q->penalties, q->step, scratch_, q->allowed);
      it.out->sampled = true;
      it.out->logits.clear();
      ++sampled_rows;
    }
    return Status();
  }
  bool can_sample() const override { return true; }
  bool can_draft() const override { return cpu_.can_draft(); }
  Status mtp_draft_batch(std::span<backend::DraftItem> items) override {
    return cpu_.mtp_draft_batch(items);
  }
  const char* name() const override { return "cpu+sampling"; }

  int64_t sampled_rows = 0;
  int64_t masked_rows = 0;
  int64_t verify_rows = 0;  // rows of verifications sampled here (ForwardOptions::sample_rows)
  int64_t penalised_verify_rows = 0;

 private:
  sampling::SamplerScratch scratch_;
};

using test_support::PositionalMask;

struct MixRun {
  std::vector<std::vector<int32_t>> outputs;
  std::vector<std::vector<float>> logprobs;
  std::vector<size_t> top_counts;  // top_logprobs alternatives of each request's first token
  int64_t sampled_rows = 0;
  int64_t masked_rows = 0;
  int64_t preemptions = 0;
};

// 24 requests of mixed settings; every 6th is a shared-prompt choice of the one before it.
MixRun run_mix(bool backend_sampling, int64_t budget_bytes, SchedulerConfig sc = {}) {
  EngineConfig cfg;
  cfg.state_budget_bytes = budget_bytes;
  cfg.page_bytes = state::min_page_bytes(fixture()->config());
  cfg.backend_sampling = backend_sampling;
  cfg.scheduler = sc;
  auto probe = std::make_unique<HostSamplingModel>(*fixture());
  HostSamplingModel* model = probe.get();
  auto e = Engine::create(cfg, fixture(), std::move(probe));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  std::mt19937 g(11);
  std::vector<RequestId> ids;
  std::vector<std::vector<TokenEvent>> events(24);
  for (int i = 0; i < 24; ++i) {
    RequestSpec s;
    const int len = (i % 6 == 5) ? static_cast<int>(ids.empty() ? 3 : 0) : 1 + g() % 40;
    for (int j = 0; j < len; ++j) s.prompt.push_back(static_cast<int32_t>(2 + g() % 500));
    if (i % 6 == 5)  // the same prompt as request i - 1, sharing its state
      s.prompt = (*e)->request(ids.back())->spec.prompt;
    s.max_tokens = 3 + static_cast<int64_t>(g() % 10);
    s.ignore_eos = true;
    s.sampling.seed = 1000 + i;
    s.sampling.logprobs = i % 2 == 0;
    switch (i % 6) {
      case 0:
        s.sampling.temperature = 0.0f;
        break;
      case 1:
        s.sampling.temperature = 0.9f;
        s.sampling.top_p = 0.95f;
        s.sampling.top_k = 40;
        s.sampling.repetition_penalty = 1.3f;
        s.sampling.presence_penalty = 0.5f;
        s.sampling.frequency_penalty = 0.25f;
        break;
      case 2:
        s.sampling.temperature = 1.2f;
        s.sampling.min_p = 0.02f;
        s.token_mask = std::make_unique<PositionalMask>();
        break;
      case 3:
        s.sampling.temperature = 1.0f;
        s.sampling.top_logprobs = 3;  // needs the logits on the host
        break;
      default:
        s.sampling.temperature = 0.8f;
        s.sampling.top_p = 0.9f;
        break;
    }
    if (i % 6 == 5)
      s.share_prompt_of = ids.back();
    auto id = (*e)->submit(std::move(s), [&events, i](const TokenEvent& ev) {
      events[static_cast<size_t>(i)].push_back(ev);
    });
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  while ((*e)->step()) (*e)->check_integrity();
  MixRun r;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Request* q = (*e)->request(ids[i]);
    EXPECT_EQ(q->state, RequestState::kFinished);
    r.outputs.push_back(q->output);
    r.logprobs.push_back(q->output_logprobs);
    r.top_counts.push_back(events[i].empty() ? 0 : events[i][0].top_logprobs.size());
  }
  r.sampled_rows = model->sampled_rows;
  r.masked_rows = model->masked_rows;
  r.preemptions = (*e)->stats().preemptions;
  return r;
}

TEST(BackendSampling, EqualsSamplingInTheEngine) {
  const MixRun host = run_mix(false, int64_t{64} << 20);
  const MixRun dev = run_mix(true, int64_t{64} << 20);
  EXPECT_EQ(host.sampled_rows, 0);
  EXPECT_GT(dev.sampled_rows, 0);
  EXPECT_GT(dev.masked_rows, 0);
  EXPECT_EQ(dev.outputs, host.outputs);
  EXPECT_EQ(dev.logprobs, host.logprobs);
  EXPECT_EQ(dev.top_counts, host.top_counts);
  for (size_t i = 3; i < dev.top_counts.size(); i += 6) EXPECT_EQ(dev.top_counts[i], 3u) << i;
  // The masked requests (i % 6 == 2) follow their mask: token n is n mod 3 (mod 3).
  for (size_t i = 2; i < dev.outputs.size(); i += 6) {
    for (size_t n = 0; n < dev.outputs[i].size(); ++n)
      EXPECT_EQ(dev.outputs[i][n] % 3, static_cast<int32_t>(n % 3)) << i;
  }
}

TEST(BackendSampling, EqualsSamplingInTheEngineUnderPreemption) {
  const auto& mc = fixture()->config();
  const int64_t page = state::min_page_bytes(mc);
  const int64_t fixed = state::SequenceState::pages_for(mc, page, 1, 0);
  // Fixed state for two sequences and eight spare pages, 4-token prefill chunks (engine_test's
  // preemption setting): running sequences get preempted and recomputed.
  SchedulerConfig sc;
  sc.max_tokens_per_step = 64;
  sc.prefill_chunk = 4;
  const MixRun roomy = run_mix(false, int64_t{64} << 20);
  const MixRun tight = run_mix(true, (2 * fixed + 8) * page, sc);
  EXPECT_GT(tight.preemptions, 0);
  EXPECT_GT(tight.sampled_rows, 0);
  EXPECT_EQ(tight.outputs, roomy.outputs);
}

// Speculation with in-backend sampling: a chunk that verifies drafts needs every position's
// logits on the host, but a decode chunk without drafts (auto's off and depth-0 steps, a fixed
// request's last tokens where no draft could be emitted) samples in the backend as it would
// without speculation, so that auto's off costs what --speculative off does. Outputs equal the
// non-speculative engine's either way.
struct SpecRun {
  std::vector<std::vector<int32_t>> outputs;
  int64_t sampled_rows = 0;
  int64_t verify_rows = 0;
  int64_t penalised_verify_rows = 0;
  int64_t spec_steps = 0;
};

SpecRun run_speculative(const std::string& mode,
                        std::vector<RequestSpec> specs,
                        bool backend_sampling = true,
                        std::shared_ptr<const model::Checkpoint> ckpt = fixture(),
                        double forced_acceptance = 0) {
  EngineConfig cfg;
  cfg.forced_acceptance = forced_acceptance;
  cfg.state_budget_bytes = int64_t{64} << 20;
  cfg.page_bytes = state::min_page_bytes(ckpt->config());
  cfg.backend_sampling = backend_sampling;
  auto sp = spec::parse_config(mode);
  EXPECT_TRUE(sp.ok());
  cfg.speculative = *sp;
  if (cfg.speculative.mode == spec::Mode::kAuto) {
    // A step-time model in which verifying never pays: auto turns speculation off.
    spec::StepTimes t;
    for (int64_t b : {1, 64}) {
      t.batch.push_back(b);
      t.off_s.push_back(1.0);
      t.verify_s.emplace_back();
      for (int32_t l = 1; l <= cfg.speculative.k + 1; ++l)
        t.verify_s.back().push_back(l == 1 ? 1.2 : 10.0 * l);
      t.draft_s.emplace_back();
      for (int32_t st = 1; st <= cfg.speculative.k; ++st) t.draft_s.back().push_back(5.0 * st);
    }
    cfg.step_times = t;
  }
  auto probe = std::make_unique<HostSamplingModel>(*ckpt);
  HostSamplingModel* model = probe.get();
  auto e = Engine::create(cfg, ckpt, std::move(probe));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  SpecRun r;
  r.outputs = test_support::run_all(**e, std::move(specs));
  r.sampled_rows = model->sampled_rows;
  r.verify_rows = model->verify_rows;
  r.penalised_verify_rows = model->penalised_verify_rows;
  r.spec_steps = (*e)->stats().spec.spec_steps;
  return r;
}

TEST(BackendSampling, SpeculatingEngineSamplesChunksWithoutDraftsInTheBackend) {
  const auto cases = test_support::random_cases(8, 21, 30, 2, 500, 12);
  for (bool seeded : {false, true}) {
    SCOPED_TRACE(seeded ? "seeded" : "greedy");
    auto specs = [&] {
      return seeded ? test_support::sampled_specs(cases, 500) : test_support::greedy_specs(cases);
    };
    const SpecRun off = run_speculative("off", specs());
    const SpecRun fixed = run_speculative("fixed:2", specs());
    const SpecRun automatic = run_speculative("auto", specs());
    EXPECT_EQ(fixed.outputs, off.outputs);
    EXPECT_EQ(automatic.outputs, off.outputs);
    EXPECT_GT(off.sampled_rows, 0);
    // fixed: verifications sample every position in the backend (sample_rows), the steps
    // where no draft fits (a request's last token) their one row (sample).
    EXPECT_GT(fixed.spec_steps, 0);
    EXPECT_GT(fixed.sampled_rows, 0);
    EXPECT_LT(fixed.sampled_rows, off.sampled_rows);
    EXPECT_GT(fixed.verify_rows, 0);
    EXPECT_EQ(off.verify_rows, 0);
    // auto, where verifying never pays: no verification, every decode step sampled in the
    // backend as with speculation off.
    EXPECT_EQ(automatic.spec_steps, 0);
    EXPECT_EQ(automatic.sampled_rows, off.sampled_rows);
  }
}

// Verification sampled in the backend (ForwardOptions::sample_rows) against the engine's own
// host sampling of the same verifications: position p is drawn with its step and with the drafts
// before it added to the penalties, so every output is identical, greedy and seeded (with
// presence, frequency and repetition penalties strong enough to move the picks), for 2 and 5
// drafts, with more drafts than tokens left. On the bundled model, whose MTP drafts are mostly
// accepted, so that the positions after accepted drafts (and their penalties) are exercised.
// Without backend sampling no row goes through sample_rows.
TEST(BackendSampling, VerificationRowsSampledInTheBackendEqualHostVerification) {
  const std::shared_ptr<const model::Checkpoint> mini = test_support::bundled_model();
  ASSERT_TRUE(mini);
  const auto cases = test_support::random_cases(4, 33, 12, 2, 3000, 12);
  for (bool seeded : {false, true}) {
    SCOPED_TRACE(seeded ? "seeded" : "greedy");
    auto specs = [&] {
      auto v = seeded ? test_support::sampled_specs(cases, 700) : test_support::greedy_specs(cases);
      for (size_t i = 0; i < v.size(); i += 2) {
        v[i].sampling.presence_penalty = 1.5f;
        v[i].sampling.frequency_penalty = 0.5f;
        v[i].sampling.repetition_penalty = 1.5f;
      }
      return v;
    };
    for (const char* mode : {"fixed:2", "fixed:5"}) {
      SCOPED_TRACE(mode);
      const SpecRun host = run_speculative(mode, specs(), false, mini);
      const SpecRun dev = run_speculative(mode, specs(), true, mini);
      EXPECT_EQ(dev.outputs, host.outputs);
      EXPECT_EQ(host.verify_rows, 0);
      EXPECT_GT(dev.verify_rows, 0);
      EXPECT_GT(dev.penalised_verify_rows, 0);
      EXPECT_GT(dev.spec_steps, 0);
      EXPECT_EQ(dev.spec_steps, host.spec_steps);
    }
  }
  // bench --forced-acceptance: the emitted draft is what the next position's row assumed.
  const SpecRun host = run_speculative(
      "fixed:3", test_support::greedy_specs(cases), false, mini, /*forced_acceptance=*/0.6);
  const SpecRun dev = run_speculative(
      "fixed:3", test_support::greedy_specs(cases), true, mini, /*forced_acceptance=*/0.6);
  EXPECT_EQ(dev.outputs, host.outputs);
  EXPECT_GT(dev.verify_rows, 0);
}

// A backend that prefers uniform steps (Model::prefers_uniform_steps, as CUDA with graphs): a
// speculating engine drafts and verifies as many drafts for every sequence, also past a request's
// max_tokens near its end (those tokens are never emitted), so that its steps keep one shape.
// Outputs equal speculation off on the same backend, and every verification is of k drafts.
class UniformStepsModel : public test_support::CpuBackedModel {
 public:
  using CpuBackedModel::CpuBackedModel;
  bool prefers_uniform_steps() const override { return true; }
  bool can_draft() const override { return cpu_.can_draft(); }
  Status mtp_draft_batch(std::span<backend::DraftItem> items) override {
    return cpu_.mtp_draft_batch(items);
  }
  const char* name() const override { return "cpu+uniform"; }
};

TEST(BackendSampling, UniformStepsVerifyAsManyDraftsPastMaxTokens) {
  const std::shared_ptr<const model::Checkpoint> mini = test_support::bundled_model();
  ASSERT_TRUE(mini);
  const auto cases = test_support::random_cases(6, 77, 10, 2, 3000, 9);
  auto run = [&](const char* mode, EngineStats* stats) {
    EngineConfig cfg;
    cfg.state_budget_bytes = int64_t{64} << 20;
    cfg.page_bytes = state::min_page_bytes(mini->config());
    cfg.speculative = *spec::parse_config(mode);
    auto e = Engine::create(cfg, mini, std::make_unique<UniformStepsModel>(*mini));
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    auto out = test_support::run_all(**e, test_support::greedy_specs(cases));
    *stats = (*e)->stats();
    return out;
  };
  EngineStats off_stats, spec_stats;
  const auto off = run("off", &off_stats);
  const auto spec = run("fixed:3", &spec_stats);
  EXPECT_EQ(spec, off);
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(static_cast<int64_t>(spec[i].size()), cases[i].max_tokens) << "request " << i;
  const auto& vl = spec_stats.spec.verify_len;
  ASSERT_EQ(vl.size(), 4u);
  EXPECT_GT(vl[3], 0);
  EXPECT_EQ(vl[1] + vl[2], 0) << spec_stats.spec.summary();
}

// An engine config running auto on a checkpoint.

EngineConfig auto_config(const model::Checkpoint& ckpt) {
  EngineConfig cfg;
  cfg.state_budget_bytes = int64_t{64} << 20;
  cfg.page_bytes = state::min_page_bytes(ckpt.config());
  cfg.speculative = *spec::parse_config("auto");
  return cfg;
}

// Auto learns step times from the steps it measures, but not from a step that ran a shape for
// the first times (Model::shape_warmups: CUDA's eager run and graph capture): a backend whose
// first two runs of each (batch, tokens per sequence) shape take 300 ms longer leaves auto's
// predicted step times where the steady steps put them (it once measured the captures and
// verified 3.4 drafts on average at batch 16, where verifying 1 was best).
class WarmupModel final : public UniformStepsModel {
 public:
  using UniformStepsModel::UniformStepsModel;
  Status forward_batch(std::span<backend::ForwardItem> items) override {
    const std::pair<size_t, size_t> shape{items.size(), items.empty() ? 0 : items[0].tokens.size()};
    if (seen_[shape]++ < 2) {
      ++warmups_;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    return CpuBackedModel::forward_batch(items);
  }
  int64_t shape_warmups() const override { return warmups_; }
  const char* name() const override { return "cpu+warmups"; }
  // Forwards of `batch` sequences x `tokens` that were not warm-ups.
  int64_t steady_calls(size_t batch, size_t tokens) const {
    const auto it = seen_.find({batch, tokens});
    return it == seen_.end() ? 0 : std::max(it->second - 2, 0);
  }

 private:
  std::map<std::pair<size_t, size_t>, int> seen_;
  int64_t warmups_ = 0;
};

TEST(BackendSampling, AutoDoesNotLearnFromShapeWarmups) {
  const std::shared_ptr<const model::Checkpoint> mini = test_support::bundled_model();
  ASSERT_TRUE(mini);
  EngineConfig cfg = auto_config(*mini);
  // A start-up model in which every step costs 1 ms (drafting free): deeper always pays.
  spec::StepTimes t;
  for (int64_t b : {1, 64}) {
    t.batch.push_back(b);
    t.off_s.push_back(1e-3);
    t.verify_s.emplace_back(static_cast<size_t>(cfg.speculative.k + 1), 1e-3);
    t.draft_s.emplace_back(static_cast<size_t>(cfg.speculative.k), 0.0);
  }
  cfg.step_times = t;
  auto model = std::make_unique<WarmupModel>(*mini);
  const WarmupModel* m = model.get();
  auto e = Engine::create(cfg, mini, std::move(model));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto cases = test_support::random_cases(1, 5, 8, 2, 3000, 1);
  cases[0].max_tokens = 24;
  test_support::run_all(**e, test_support::greedy_specs(cases));
  EXPECT_GT(m->shape_warmups(), 0);
  const spec::StepCost* cost = (*e)->step_cost();
  ASSERT_NE(cost, nullptr);
  // Every recorded step ran a steady forward: at batch 1 and depth d the forward is 1 x (d + 1)
  // tokens (off and depth 0 both 1 x 1), so a shape's recorded steps are at most its forwards
  // that were not warm-ups (prefills of as many tokens can only add to those). This holds however
  // slow the machine is; the step times themselves do not (a loaded CI machine took 0.47-1.25 s
  // per reference step where an idle one takes ~0.15 s).
  int64_t measured = 0;
  for (int32_t d = -1; d <= cost->max_k(); ++d) {
    measured += cost->measured(1, d);
    if (d == 0)
      continue;  // counted with off below
    const size_t tokens = static_cast<size_t>(std::max(d, 0) + 1);
    const int64_t recorded = cost->measured(1, d) + (d == -1 ? cost->measured(1, 0) : 0);
    EXPECT_LE(recorded, m->steady_calls(1, tokens)) << "depth " << d;
  }
  EXPECT_GT(measured, 0);
}

// Auto on a backend that prefers uniform steps keeps each decode step one kind: requests that
// arrive while a running one has stopped speculating stop too, instead of verifying beside its
// plain decodes (a mixed step, which CUDA runs without its graphs). Verifying never pays at
// batch 1 and always at batch 2: A alone stops speculating; C and D then start together.
class MixedStepProbe final : public UniformStepsModel {
 public:
  using UniformStepsModel::UniformStepsModel;
  Status forward_batch(std::span<backend::ForwardItem> items) override {
    bool plain = false, verify = false;
    for (const backend::ForwardItem& it : items) {
      plain |= it.tokens.size() == 1 && !it.options.run_mtp;
      verify |= it.tokens.size() > 1 && it.options.want_logits && !it.options.last_logits_only;
    }
    mixed += plain && verify ? 1 : 0;
    verifications += verify ? 1 : 0;
    return CpuBackedModel::forward_batch(items);
  }
  const char* name() const override { return "cpu+mixed-probe"; }
  int64_t mixed = 0;
  int64_t verifications = 0;
};

TEST(BackendSampling, AutoKeepsUniformStepsWhenARequestStopsSpeculating) {
  const std::shared_ptr<const model::Checkpoint> mini = test_support::bundled_model();
  ASSERT_TRUE(mini);
  EngineConfig cfg = auto_config(*mini);
  spec::StepTimes t;
  for (int64_t b : {1, 2}) {
    t.batch.push_back(b);
    t.off_s.push_back(1.0);
    t.verify_s.emplace_back();
    t.draft_s.emplace_back();
    for (int32_t l = 1; l <= cfg.speculative.k + 1; ++l)
      t.verify_s.back().push_back(b == 1 ? (l == 1 ? 1.2 : 10.0 * l) : 1.0);
    for (int32_t st = 1; st <= cfg.speculative.k; ++st)
      t.draft_s.back().push_back(b == 1 ? 5.0 * st : 0.0);
  }
  cfg.step_times = t;
  auto model = std::make_unique<MixedStepProbe>(*mini);
  const MixedStepProbe* m = model.get();
  auto e = Engine::create(cfg, mini, std::move(model));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto cases = test_support::random_cases(3, 9, 6, 2, 3000, 1);
  cases[0].max_tokens = 30;
  cases[1].max_tokens = cases[2].max_tokens = 12;
  auto specs = test_support::greedy_specs(cases);
  auto a = (*e)->submit(std::move(specs[0]));
  ASSERT_TRUE(a.ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE((*e)->step());
  EXPECT_TRUE((*e)->request(*a)->spec_disabled) << "A alone (verifying never pays) speculates";
  ASSERT_TRUE((*e)->submit(std::move(specs[1])).ok());
  ASSERT_TRUE((*e)->submit(std::move(specs[2])).ok());
  while ((*e)->step()) (*e)->check_integrity();
  EXPECT_EQ(m->mixed, 0) << "plain decodes beside verifications";
}

}  // namespace
}  // namespace dsinfer::engine
