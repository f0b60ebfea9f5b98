// Speculative decoding pieces: the --speculative flag, the step-time model's interpolation, the
// verify-length choice, the acceptance predictor, the metrics and the MTP drafter on the fixture
// model (its first draft is the MTP block's prediction of a forward with run_mtp, and drafting
// leaves the state as the verification needs it).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "backend/cpu/fast/fast_model.h"
#include "model/checkpoint.h"
#include "spec/config.h"
#include "spec/drafter.h"
#include "spec/measure.h"
#include "spec/stats.h"
#include "spec/verify_length.h"

namespace dsinfer::spec {
namespace {

TEST(SpecConfig, ParsesEveryModeAndRejectsTheRest) {
  EXPECT_EQ(parse_config("off")->mode, Mode::kOff);
  EXPECT_EQ(parse_config("auto")->mode, Mode::kAuto);
  EXPECT_EQ(parse_config("auto")->k, kDefaultAutoMax);
  EXPECT_EQ(parse_config("auto:3")->k, 3);
  EXPECT_EQ(parse_config("fixed:1")->mode, Mode::kFixed);
  EXPECT_EQ(parse_config("fixed:5")->k, 5);
  for (const char* bad : {"",
                          "on",
                          "fixed",
                          "fixed:",
                          "fixed:0",
                          "fixed:9",
                          "fixed:-1",
                          "fixed:2x",
                          "auto:",
                          "Auto",
                          "fixed: 2"}) {
    auto r = parse_config(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("--speculative"), std::string::npos);
    }
  }
  for (const char* s : {"off", "auto", "auto:2", "fixed:4"})
    EXPECT_EQ(to_string(*parse_config(s)), s);
}

// A synthetic step-time model: a forward costs base(b) + per_token * b * L, drafting costs
// draft_step * b per step.
StepTimes linear_times(
    std::vector<int64_t> batch, double base, double per_token, double draft_step, int32_t max_k) {
  StepTimes t;
  t.batch = batch;
  for (int64_t b : batch) {
    t.off_s.push_back(base + per_token * b);
    t.verify_s.emplace_back();
    for (int32_t l = 1; l <= max_k + 1; ++l)
      t.verify_s.back().push_back(base + per_token * b * l + draft_step * 0.2 * b);
    t.draft_s.emplace_back();
    for (int32_t s = 1; s <= max_k; ++s) t.draft_s.back().push_back(draft_step * b * s);
  }
  return t;
}

TEST(StepTimes, InterpolatesAndExtrapolates) {
  const StepTimes t = linear_times({1, 2, 4}, 1.0, 0.5, 0.0, 3);
  ASSERT_TRUE(t.valid());
  EXPECT_EQ(t.max_k(), 3);
  EXPECT_DOUBLE_EQ(t.off(1), 1.5);
  EXPECT_DOUBLE_EQ(t.off(3), 2.5);           // between 2 and 4
  EXPECT_DOUBLE_EQ(t.off(8), 3.0 * 2);       // proportional past the largest
  EXPECT_DOUBLE_EQ(t.verify(1, 2.5), 2.25);  // between L = 2 and 3
  EXPECT_DOUBLE_EQ(t.verify(1, 9), 3.0);     // clamped at the longest
  StepTimes bad = t;
  bad.batch = {2, 4, 8};
  EXPECT_FALSE(bad.valid());
}

TEST(VerifyLength, BandwidthBoundStepsVerifyManyDrafts) {
  // A step costs nearly the same whatever its token count (a bandwidth-bound decode): with high
  // acceptance every request verifies the most drafts allowed.
  const StepTimes t = linear_times({1, 8}, 1.0, 0.001, 0.0, 5);
  std::vector<std::vector<double>> a(8, std::vector<double>(5, 0.9));
  a[3].resize(2);  // capped (near max_tokens)
  const Choice c = choose_verify_lengths(t, a, true);
  for (size_t r = 0; r < 8; ++r) EXPECT_EQ(c.k[r], r == 3 ? 2 : 5) << r;
  EXPECT_GT(c.rate(), 8 / t.off(8));
}

TEST(VerifyLength, ComputeBoundStepsVerifyNone) {
  // Every token costs its full share (compute bound, nothing amortised): no draft pays.
  const StepTimes t = linear_times({1, 64}, 0.0, 1.0, 0.1, 5);
  std::vector<std::vector<double>> a(64, std::vector<double>(5, 0.8));
  const Choice c = choose_verify_lengths(t, a, true);
  for (int32_t k : c.k) EXPECT_EQ(k, 0);
}

TEST(VerifyLength, ConfidentRequestsGetMoreDrafts) {
  // In between: requests whose drafts are likely accepted verify more of them.
  const StepTimes t = linear_times({1, 4}, 1.0, 0.25, 0.0, 5);
  std::vector<std::vector<double>> a = {std::vector<double>(5, 0.95),
                                        std::vector<double>(5, 0.2),
                                        std::vector<double>(5, 0.6),
                                        std::vector<double>(5, 0.05)};
  const Choice c = choose_verify_lengths(t, a, false);
  EXPECT_GE(c.k[0], c.k[2]);
  EXPECT_GE(c.k[2], c.k[1]);
  EXPECT_GE(c.k[1], c.k[3]);
  EXPECT_GT(c.k[0], 0);
  EXPECT_EQ(c.k[3], 0);
  // The choice is at least as good as any uniform k.
  for (int32_t k = 0; k <= 5; ++k) {
    double tokens = 0;
    for (const auto& row : a) {
      double reach = 1;
      tokens += 1;
      for (int32_t i = 0; i < k; ++i) tokens += (reach *= row[static_cast<size_t>(i)]);
    }
    EXPECT_GE(c.rate() * (1 + 1e-12), tokens / t.verify(4, 1.0 + k)) << k;
  }
}

TEST(VerifyLength, AStepInTheCurveDoesNotStopTheChoiceShort) {
  // One sequence; a verification of 2..6 tokens costs 1.5x a single token: one draft at 0.45
  // does not pay (1.45 / 1.5 < 1), five do (1.80 / 1.5 > 1). A greedy stop would verify none.
  StepTimes t;
  t.batch = {1};
  t.off_s = {1.0};
  t.verify_s = {{1.0, 1.5, 1.5, 1.5, 1.5, 1.5}};
  t.draft_s = {{0, 0, 0, 0, 0}};
  ASSERT_TRUE(t.valid());
  const std::vector<std::vector<double>> a = {{0.45, 0.45, 0.45, 0.45, 0.45}};
  const Choice c = choose_verify_lengths(t, a, false);
  EXPECT_EQ(c.k, std::vector<int32_t>{5});
  EXPECT_GT(c.rate(), 1.0);
  // Below the break-even (0.3: 1.43 / 1.5 < 1 even with all five) it verifies none.
  const std::vector<std::vector<double>> low = {{0.3, 0.3, 0.3, 0.3, 0.3}};
  EXPECT_EQ(choose_verify_lengths(t, low, false).k, std::vector<int32_t>{0});
}

// A synthetic step-time model for StepCost: off costs `off`, a verification of L tokens with s
// drafts costs mtp + per_token * (L - 1) + draft * s, the same at every batch size.
StepTimes flat_times(double off, double mtp, double per_token, double draft, int32_t max_k) {
  StepTimes t;
  for (int64_t b : {1, 256}) {
    t.batch.push_back(b);
    t.off_s.push_back(off);
    t.verify_s.emplace_back();
    for (int32_t l = 1; l <= max_k + 1; ++l) t.verify_s.back().push_back(mtp + per_token * (l - 1));
    t.draft_s.emplace_back();
    for (int32_t s = 1; s <= max_k; ++s) t.draft_s.back().push_back(draft * s);
  }
  return t;
}

TEST(StepCost, CheapVerificationDraftsDeepAndExpensiveTurnsSpeculationOff) {
  const std::vector<double> accept(5, 0.8);
  // Verifying more tokens costs almost nothing: the deepest depth.
  const StepCost cheap(flat_times(1.0, 1.05, 0.01, 0.01, 5), 5);
  EXPECT_EQ(cheap.best_depth(1, accept), 5);
  // Every verified token costs a full step: speculation off (depth -1, not a depth-0 step that
  // would still pay for the drafter's forward work).
  const StepCost costly(flat_times(1.0, 1.1, 1.0, 0.1, 5), 5);
  EXPECT_EQ(costly.best_depth(1, accept), -1);
  EXPECT_EQ(costly.choose(1, accept), -1);
  // In between, the depth with the most tokens per second: E(d) = 1 + .8 + .64 + ..., step
  // 1 + 0.3 d: d = 2 gives 2.44 / 1.6 = 1.525, d = 1 1.8 / 1.3 = 1.385, d = 3 2.952 / 1.9 =
  // 1.554, d = 4 3.3616 / 2.2 = 1.528.
  const StepCost mid(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  EXPECT_EQ(mid.best_depth(1, accept), 3);
  for (int32_t d = -1; d <= 5; ++d) EXPECT_GE(mid.rate(1, 3, accept), mid.rate(1, d, accept)) << d;
  // Few drafts accepted: off even when verification is cheap.
  EXPECT_EQ(cheap.best_depth(1, std::vector<double>(5, 0.02)), -1);
  // The depth is capped by the acceptance rates given (a request near its end).
  EXPECT_EQ(cheap.best_depth(1, std::vector<double>(2, 0.8)), 2);
  // A start-up model whose noise made a verification of the pending token alone (depth 0, the
  // drafter's forward work and no drafts) cheaper than a plain decode: depth 0 is never chosen
  // over off, and never predicted cheaper.
  const StepCost noisy(flat_times(1.0, 0.9, 1.0, 0.1, 5), 5);
  EXPECT_EQ(noisy.best_depth(8, accept), -1);
  EXPECT_GE(noisy.step_s(8, 0), noisy.step_s(8, -1));
}

// Mixed steps (prefill chunks beside the decode requests) learn their extra time and draft
// deeper where it makes the verification's own cost small beside the step's.
TEST(StepCost, MixedStepsDraftDeeperWhereThePrefillDominates) {
  const std::vector<double> accept(5, 0.8);
  // Decode steps: E(d) / (1 + 0.6 d) is best at d = 1 (1.8 / 1.6 = 1.125; d = 2: 2.44 / 2.2).
  StepCost c(flat_times(1.0, 1.0, 0.55, 0.05, 5), 5);
  ASSERT_EQ(c.best_depth(1, accept), 1);
  // No mixed step measured yet: the decode steps' choice.
  EXPECT_EQ(c.choose_mixed(1, accept, 1), 1);
  EXPECT_EQ(c.mixed_extra(1), 0.0);
  // Mixed steps at depth 1 take 6 s more than a decode step: with E(d) / (7 + 0.6 d) the
  // deepest depth pays (5: 3.69 / 10 = 0.369 against 1: 1.8 / 7.6 = 0.237).
  for (int i = 0; i < 10; ++i) c.record_mixed(1, 1, c.step_s(1, 1) + 6.0);
  EXPECT_NEAR(c.mixed_extra(1), 6.0, 1e-9);
  EXPECT_EQ(c.choose_mixed(1, accept, 1), 5);
  // Off stays off (the requests do not speculate), and the decode steps' choice is unchanged.
  EXPECT_EQ(c.choose_mixed(1, accept, -1), -1);
  EXPECT_EQ(c.best_depth(1, accept), 1);
  // Another bucket has measured none.
  EXPECT_EQ(c.choose_mixed(64, accept, 1), 1);
}

TEST(StepCost, MeasuredStepTimesCorrectTheStartUpModel) {
  const std::vector<double> accept(5, 0.8);
  // The start-up model says verification is cheap at every batch size.
  StepCost c(flat_times(1.0, 1.05, 0.01, 0.01, 5), 5);
  EXPECT_EQ(c.best_depth(16, accept), 5);
  // The engine measures that at 16 requests a step of depth 5 takes 6x a plain step: there
  // speculation is turned off, while batch 1 (another bucket, not measured) keeps drafting deep.
  for (int i = 0; i < 4; ++i) {
    c.record(16, 5, 6.0);
    c.record(16, -1, 1.0);
  }
  EXPECT_NEAR(c.step_s(16, 5), 6.0, 1e-9);
  EXPECT_EQ(c.best_depth(16, accept), -1);
  EXPECT_EQ(c.best_depth(1, accept), 5);
  EXPECT_EQ(c.measured(16, 5), 4);
  EXPECT_EQ(c.measured(17, 5), 4);  // same bucket [16, 32)
  EXPECT_EQ(c.measured(1, 5), 0);
  // An unmeasured depth of a measured bucket: the corrections of the measured depths around it
  // (off, -1: 0; 5: 6.0 - 1.15), interpolated (depth 4: its prior 1.05 + 0.04 + 0.04 plus 5/6
  // of depth 5's correction).
  EXPECT_NEAR(c.step_s(16, 4), 1.05 + 0.04 + 0.04 + (6.0 - 1.15) * 5 / 6, 1e-9);
  // A fixed per-step overhead the start-up model missed (2 s on every step at batch 1) makes
  // deeper drafts pay: with the measured overhead the best depth goes from 1 to deeper.
  StepCost o(flat_times(1.0, 1.0, 0.5, 0.1, 5), 5);
  EXPECT_EQ(o.best_depth(1, accept), 1);
  for (int i = 0; i < 4; ++i) {
    o.record(1, -1, 3.0);
    o.record(1, 1, 1.6 + 2.0);
  }
  EXPECT_GT(o.best_depth(1, accept), 1);
  // The EWMA follows a change: after enough cheap measurements the correction is near 0 again.
  for (int i = 0; i < 200; ++i) o.record(1, 1, 1.6);
  EXPECT_NEAR(o.step_s(1, 1), 1.6, 1e-6);
}

// Past the deepest measured depth the correction continues along the line through the two
// deepest measured (a per-verified-position overhead the start-up model misses grows with the
// depth); held where that line falls, and below the shallowest.
TEST(StepCost, CorrectionsRisingWithDepthAreExtrapolatedDeeper) {
  const StepTimes prior = flat_times(2.0, 2.2, 0.1, 0.3, 5);
  StepCost c(prior, 5);
  // Measured exactly: off (correction 0) and depth 1 (0.5 over its prior 2.3 + 0.3).
  for (int i = 0; i < 50; ++i) {
    c.record(64, -1, 2.0);
    c.record(64, 1, 2.6 + 0.5);
  }
  EXPECT_NEAR(c.step_s(64, 1), 3.1, 1e-6);
  // Depth 3: prior 2.5 + 0.9, correction 0.5 + 2 * 0.25 (the line through off's 0 and 0.5).
  EXPECT_NEAR(c.step_s(64, 3), 2.5 + 0.9 + 1.0, 1e-6);
  // A correction that falls with depth is held past the deepest measured.
  StepCost f(prior, 5);
  for (int i = 0; i < 50; ++i) {
    f.record(64, -1, 2.5);
    f.record(64, 1, 2.6 + 0.1);
  }
  EXPECT_NEAR(f.step_s(64, 3), 2.5 + 0.9 + 0.1, 1e-6);
}

// choose_steady keeps the bucket's previous speculating depth while it is within kStay of the
// best's predicted rate, and switches when another is clearly better; exploration and off are
// chosen as choose would.
TEST(StepCost, SteadyChoiceKeepsANearlyAsGoodDepth) {
  const std::vector<double> accept(5, 0.8);
  // Step 1 + 0.3 d: tokens per second 1.385, 1.525, 1.554, 1.527, 1.476 for d = 1..5.
  StepCost c(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  for (int32_t d = -1; d <= 5; ++d) {
    for (int i = 0; i < StepCost::kExplore; ++i) c.record(1, d, c.step_s(1, d));
  }
  ASSERT_EQ(c.choose(1, accept), 3);
  EXPECT_EQ(c.choose_steady(1, accept), 3);
  // Depth 4 measured a little faster (2.14 s: 1.571 tokens/s, 3 within 2% of it; depth 3
  // measured again as before, so that the change is depth 4's alone, not the bucket's level):
  // 3 is kept.
  // (Depth 5 run now and then as predicted: not the periodic probe's turn.)
  for (int i = 0; i < 400; ++i) {
    c.record(1, 4, 2.14);
    c.record(1, 3, 1.9);
    if (i % 16 == 0)
      c.record(1, 5, c.step_s(1, 5));
  }
  ASSERT_EQ(c.choose(1, accept), 4);
  EXPECT_EQ(c.choose_steady(1, accept), 3);
  EXPECT_EQ(c.choose_steady(1, accept), 3);
  // Faster still (2.08 s: 1.616 tokens/s, 4% over depth 3): the switch.
  for (int i = 0; i < 400; ++i) {
    c.record(1, 4, 2.08);
    c.record(1, 3, 1.9);
    if (i % 16 == 0)
      c.record(1, 5, c.step_s(1, 5));
  }
  EXPECT_EQ(c.choose_steady(1, accept), 4);
  // Other buckets keep their own previous choice.
  EXPECT_EQ(c.choose_steady(64, accept), c.choose(64, accept));
}

// choose_warm: a cold best depth (its shape not prepared: an eager run and a capture) gives way
// to the best warm speculating depth within kCold of its rate, and only then; exploring picks,
// off, depth 0 and a warm choice are left alone, and the depth taken is the bucket's previous one
// for choose_steady.
TEST(StepCost, WarmChoiceAvoidsColdShapesThatGainLittle) {
  const std::vector<double> accept(5, 0.8);
  // Step 1 + 0.3 d, rates 1.385, 1.525, 1.554, 1.527, 1.476 for d = 1..5 (best 3).
  auto measured_all = [] {
    StepCost c(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
    for (int32_t d = -1; d <= 5; ++d) {
      for (int i = 0; i < StepCost::kExplore; ++i) c.record(1, d, c.step_s(1, d));
    }
    return c;
  };
  StepCost c = measured_all();
  ASSERT_EQ(c.choose(1, accept), 3);
  const std::vector<uint8_t> all(6, 1);
  EXPECT_EQ(c.choose_warm(1, accept, all), 3);
  // 3 cold: 2 (1.525) and 4 (1.527) are within 8% of it; 4 has the higher rate.
  EXPECT_EQ(c.choose_warm(1, accept, std::vector<uint8_t>{1, 1, 1, 0, 1, 1}), 4);
  // choose_steady now keeps 4 (its previous depth, within kStay of 3) with 3 warm again.
  EXPECT_EQ(c.choose_warm(1, accept, all), 4);
  // Only depth 2 warm: 2. Only depth 1 warm (1.385 < 0.92 x 1.554): the cold best, 3.
  StepCost d = measured_all();
  EXPECT_EQ(d.choose_warm(1, accept, std::vector<uint8_t>{1, 0, 1, 0, 0, 0}), 2);
  StepCost e = measured_all();
  EXPECT_EQ(e.choose_warm(1, accept, std::vector<uint8_t>{1, 1, 0, 0, 0, 0}), 3);
  // Nothing warm: the cold best is run (and gets captured).
  EXPECT_EQ(e.choose_warm(1, accept, std::vector<uint8_t>{1, 0, 0, 0, 0, 0}), 3);
  // A warm vector shorter than the depths: the depths past it count as warm.
  EXPECT_EQ(e.choose_warm(1, accept, std::vector<uint8_t>{1}), 3);
  // An exploring pick (best 3's neighbour 4, measured fewer than kExplore times) runs cold.
  StepCost x(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  for (int32_t k : {-1, 0, 1, 2, 3, 5}) {
    for (int i = 0; i < StepCost::kExplore; ++i) x.record(1, k, x.step_s(1, k));
  }
  ASSERT_EQ(x.choose(1, accept), 4);
  EXPECT_EQ(x.choose_warm(1, accept, std::vector<uint8_t>{1, 1, 1, 1, 0, 1}), 4);
  // A best that stays cold gets its turn after kColdPatience substitutes in a row (a steady batch
  // would otherwise never run, and so never prepare, its best depth); run once, it is warm.
  // Only 5 warm (1.476: within kCold of 3's 1.554, not within choose_steady's kStay).
  StepCost p = measured_all();
  const std::vector<uint8_t> only5{1, 0, 0, 0, 0, 1};
  for (int32_t i = 0; i < StepCost::kColdPatience; ++i)
    ASSERT_EQ(p.choose_warm(1, accept, only5), 5) << i;
  EXPECT_EQ(p.choose_warm(1, accept, only5), 3);
  EXPECT_EQ(p.choose_warm(1, accept, all), 3);
  // A warm best in between starts the count again.
  StepCost q = measured_all();
  for (int32_t i = 0; i + 1 < StepCost::kColdPatience; ++i) q.choose_warm(1, accept, only5);
  EXPECT_EQ(q.choose_warm(1, accept, all), 3);
  for (int32_t i = 0; i < StepCost::kColdPatience; ++i)
    EXPECT_EQ(q.choose_warm(1, accept, only5), 5) << i;
}

// Once every kProbeEvery of a bucket's steps, the depth next deeper than the best runs again: the
// acceptance of the draft positions past the best is learnt only from steps that verify them.
TEST(StepCost, DeeperNeighbourIsProbedPeriodically) {
  const std::vector<double> accept(5, 0.8);
  StepCost c(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);  // best 3 (see above)
  for (int32_t d = -1; d <= 5; ++d) {
    for (int i = 0; i < StepCost::kExplore; ++i) c.record(1, d, c.step_s(1, d));
  }
  ASSERT_EQ(c.choose(1, accept), 3);
  // Depth 4 last ran 3 steps before the end of the set-up (depth 5's steps came after it).
  for (int64_t i = 0; i + 3 < StepCost::kProbeEvery; ++i) {
    ASSERT_EQ(c.choose(1, accept), 3) << i;
    c.record(1, 3, c.step_s(1, 3));
  }
  EXPECT_EQ(c.choose(1, accept), 4);  // the probe
  c.record(1, 4, c.step_s(1, 4));
  for (int64_t i = 0; i < StepCost::kProbeEvery; ++i) {
    ASSERT_EQ(c.choose(1, accept), 3) << i;
    c.record(1, 3, c.step_s(1, 3));
  }
  EXPECT_EQ(c.choose(1, accept), 4);  // the next one
  // The deepest depth has no deeper neighbour: no probe.
  const std::vector<double> sure(5, 0.99);
  StepCost d(flat_times(1.0, 1.0, 0.01, 0.01, 5), 5);
  for (int32_t k = -1; k <= 5; ++k) {
    for (int i = 0; i < StepCost::kExplore; ++i) d.record(1, k, d.step_s(1, k));
  }
  ASSERT_EQ(d.choose(1, sure), 5);
  for (int64_t i = 0; i < 2 * StepCost::kProbeEvery; ++i) {
    ASSERT_EQ(d.choose(1, sure), 5) << i;
    d.record(1, 5, d.step_s(1, 5));
  }
}

// The tokens a depth's steps emitted against what the pooled acceptance rates promised scale that
// depth's rate in their bucket, shrunk (kGainPrior tokens) towards the depth's gain over every
// bucket, which is what other buckets read; other depths keep theirs.
TEST(StepCost, TokenGainScalesADepthsRate) {
  const std::vector<double> accept(5, 0.8);
  StepCost c(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  const double r2 = c.rate(8, 2, accept), r2b = c.rate(64, 2, accept), r3 = c.rate(64, 3, accept);
  EXPECT_EQ(c.gain(8, 2), 1.0);
  c.record_tokens(8, 2, 2.44, 2.64, 100);  // 264 emitted against 244 expected, at batch 8
  const double all = (264.0 + StepCost::kGainPrior) / (244.0 + StepCost::kGainPrior);
  const double own = (264.0 + StepCost::kGainPrior * all) / (244.0 + StepCost::kGainPrior);
  EXPECT_NEAR(c.gain(8, 2), own, 1e-12);
  EXPECT_NEAR(c.rate(8, 2, accept), r2 * own, 1e-9 * r2);
  EXPECT_NEAR(c.gain(64, 2), all, 1e-12);  // a bucket without depth-2 steps: every bucket's
  EXPECT_NEAR(c.rate(64, 2, accept), r2b * all, 1e-9 * r2b);
  EXPECT_EQ(c.rate(64, 3, accept), r3);
  // A bucket's own steps outweigh the others' once they are many.
  for (int i = 0; i < 100; ++i) c.record_tokens(64, 2, 2.44, 2.2, 64);
  EXPECT_LT(c.gain(64, 2), 0.91);
  EXPECT_GT(c.gain(8, 2), 1.0);
  // Nothing learnt from steps without speculation, bad counts or depths past max_k.
  c.record_tokens(8, 0, 1.0, 5.0, 10);
  c.record_tokens(8, 3, 2.0, 3.0, 0);
  c.record_tokens(8, 6, 2.0, 3.0, 10);
  c.record_tokens(8, 3, 0.0, 3.0, 10);
  c.record_tokens(0, 3, 2.0, 3.0, 10);
  EXPECT_EQ(c.gain(8, 0), 1.0);
  EXPECT_EQ(c.gain(8, 3), 1.0);
  EXPECT_EQ(c.gain(8, -1), 1.0);
}

// With padded buckets (a backend that pads steps to a power of two of sequences and captures a
// graph per padded batch), batches 33..64 are one bucket: measurements and choose_steady's
// previous depth are shared by the steps that replay one graph, and not with 32 or 65.
TEST(StepCost, PaddedBucketsAreThePaddedBatches) {
  const std::vector<double> accept(5, 0.8);
  StepCost p(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5, /*padded_buckets=*/true);
  StepCost f(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  p.record(64, 2, 1.5);
  f.record(64, 2, 1.5);
  EXPECT_EQ(p.measured(33, 2), 1);
  EXPECT_EQ(p.measured(32, 2), 0);
  EXPECT_EQ(p.measured(65, 2), 0);
  EXPECT_EQ(f.measured(33, 2), 0);  // [32, 64) and [64, 128)
  EXPECT_EQ(f.measured(127, 2), 1);
  EXPECT_EQ(p.measured(1, 2), 0);
  p.record(1, 2, 1.5);
  EXPECT_EQ(p.measured(1, 2), 1);
  EXPECT_EQ(p.measured(2, 2), 0);
  // choose_steady's previous choice at 64 is the one at 40 (one bucket), within kStay.
  for (int32_t d = -1; d <= 5; ++d) {
    for (int i = 0; i < StepCost::kExplore; ++i) p.record(64, d, p.step_s(64, d));
  }
  const int32_t at64 = p.choose_steady(64, accept);
  EXPECT_EQ(p.choose_steady(40, accept), at64);
  // A padded step costs what the start-up model measured at its padded batch (where it measured
  // one): 190 sequences replay the graph of 256.
  StepTimes grow = flat_times(1.0, 1.0, 0.25, 0.05, 5);
  grow.batch = {1, 128, 256};
  grow.off_s = {1.0, 2.0, 3.0};
  grow.verify_s.insert(grow.verify_s.begin() + 1, grow.verify_s[0]);
  grow.draft_s.insert(grow.draft_s.begin() + 1, grow.draft_s[0]);
  ASSERT_TRUE(grow.valid());
  const StepCost pg(grow, 5, /*padded_buckets=*/true);
  const StepCost fg(grow, 5);
  EXPECT_DOUBLE_EQ(pg.step_s(190, -1), 3.0);
  EXPECT_DOUBLE_EQ(pg.step_s(256, -1), 3.0);
  EXPECT_DOUBLE_EQ(pg.step_s(128, -1), 2.0);
  EXPECT_LT(fg.step_s(190, -1), 3.0);  // unpadded: between 128 and 256
  // Past the largest measured batch nothing is padded (eager steps).
  EXPECT_DOUBLE_EQ(pg.step_s(300, -1), fg.step_s(300, -1));
}

// A change of load that slows every depth alike (a slower wave of prompts, the device's clocks)
// goes to the bucket's level: the depth being run gets dearer, and so do the others, so that the
// best depth stays the best. (Learnt per depth alone, only the depth being run got dearer and
// auto moved to one measured before the change: twentieth session, the bundled model at batch
// 256, 0.88x the best fixed depth.)
TEST(StepCost, ASlowdownOfEveryDepthKeepsTheBestDepth) {
  const std::vector<double> accept(5, 0.8);
  // True times 1 + 0.3 d (rates 1.385, 1.525, 1.554, 1.527, 1.476): best 3, then 4.
  StepCost c(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  auto truth = [](int32_t d) { return d < 0 ? 1.0 : 1.0 + 0.3 * d; };
  for (int32_t d = -1; d <= 5; ++d) {
    for (int64_t i = 0; i < StepCost::kSettled; ++i) c.record(1, d, truth(d));
  }
  ASSERT_EQ(c.choose(1, accept), 3);
  // Every step 10% slower from now on; only depth 3 runs (the best).
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(c.choose(1, accept), 3) << i;
    c.record(1, 3, 1.1 * truth(3));
  }
  EXPECT_NEAR(c.step_s(1, 3), 1.1 * truth(3), 0.01);
  // The other depths' predictions moved with it.
  EXPECT_NEAR(c.step_s(1, 4), 1.1 * truth(4), 0.03);  // most of the 10% (the rest: depth 3)
  EXPECT_NEAR(c.step_s(1, -1), 1.1 * truth(-1), 0.015);
  EXPECT_GT(c.level(1), 1.07);
  EXPECT_DOUBLE_EQ(c.level(64), 1.0);  // another bucket
}

TEST(StepCost, ExploresTheDepthsNextToTheBestUntilMeasured) {
  const std::vector<double> accept(5, 0.8);
  StepCost c(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  ASSERT_EQ(c.best_depth(1, accept), 3);
  // The deeper neighbour first, kExplore times, then the shallower one, then depth 5 (never run,
  // its rate 1.476 within kNoise of the best's 1.554; depth 1's 1.385 is not), then the best;
  // every step measured exactly as predicted.
  std::vector<int32_t> seq;
  std::vector<int32_t> want;
  for (int64_t i = 0; i < StepCost::kExplore; ++i) want.push_back(4);
  for (int64_t i = 0; i < StepCost::kExplore; ++i) want.push_back(2);
  for (int64_t i = 0; i < StepCost::kExplore; ++i) want.push_back(5);
  want.push_back(3);
  want.push_back(3);
  for (size_t i = 0; i < want.size(); ++i) {
    const int32_t d = c.choose(1, accept);
    seq.push_back(d);
    c.record(1, d, c.step_s(1, d));
  }
  EXPECT_EQ(seq, want);
  // Measured steps that make the best (5, with depth 3's correction 4.0 - 1.65: 3.69 tokens /
  // 4.85) no better than off would be at the start-up model's time (1 / 1.0), off not measured:
  // depth 0 (up to kExplore times while the best stays >= 1) before anything else; off's prediction
  // then rests on depth 0's measured correction (not on depth 3's, which would make it 1.0 + 2.35)
  // and turns speculation off (depth 1, the best speculating one: 1.8 / (1.3 + 0.1 + 2.25 / 3) =
  // 0.84).
  StepCost p(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  p.record(1, 3, 4.0);
  EXPECT_EQ(p.best_depth(1, accept), 5);
  EXPECT_EQ(p.choose(1, accept), 0);
  p.record(1, 0, 1.1);  // one is enough here: off is then the best
  EXPECT_NEAR(p.step_s(1, -1), 1.1, 1e-9);
  EXPECT_EQ(p.best_depth(1, accept), -1);
  EXPECT_EQ(p.choose(1, accept), -1);
  // With off measured, no depth-0 steps.
  StepCost m(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  m.record(1, -1, 1.0);
  m.record(1, 3, 4.0);
  EXPECT_NE(m.choose(1, accept), 0);
  // Off is never explored from: a depth <= 0 is the choice as it is.
  const StepCost off(flat_times(1.0, 1.1, 1.0, 0.1, 5), 5);
  EXPECT_EQ(off.choose(1, accept), -1);
}

// A depth whose estimate rests on fewer than kExplore steps, one of them slow, is measured again
// while its rate is within kNoise of the best's, wherever the best is; the correction is the mean
// of the first steps, not the first step's value. (The H200, seventeenth session: depth 3 at
// batch 64 measured once, slow, and auto ran depth 5, 9% slower, for good.)
TEST(StepCost, UndermeasuredDepthsNearTheBestAreMeasuredAgain) {
  const std::vector<double> accept(5, 0.8);
  // Step 1 + 0.3 d: rates 1.385, 1.525, 1.554, 1.527, 1.476 for d = 1..5.
  StepCost c(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  for (int32_t d : {-1, 0, 1, 2, 4, 5}) {
    for (int i = 0; i < StepCost::kExplore; ++i) c.record(1, d, c.step_s(1, d));
  }
  const double true3 = c.step_s(1, 3);
  c.record(1, 3, true3 + 0.15);  // 2.952 / 2.05 = 1.44: 94% of depth 4's 1.527
  ASSERT_EQ(c.best_depth(1, accept), 4);
  EXPECT_EQ(c.choose(1, accept), 3);
  c.record(1, 3, true3);
  EXPECT_NEAR(c.step_s(1, 3), true3 + 0.075, 1e-9);  // the mean of the two
  EXPECT_EQ(c.choose(1, accept), 3);
  c.record(1, 3, true3);
  EXPECT_NEAR(c.step_s(1, 3), true3 + 0.05, 1e-9);
  EXPECT_EQ(c.choose(1, accept), c.best_depth(1, accept));  // kExplore steps: no more
  // Not next to the best (3): depth 5 measured once, as predicted (1.476, 95% of 1.554), is
  // measured again; one step 1.0 s slow (3.689 / 3.5 = 1.05) leaves it far from the best: not.
  for (double slow : {0.0, 1.0}) {
    StepCost f(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
    for (int32_t d : {-1, 0, 1, 2, 3, 4}) {
      for (int i = 0; i < StepCost::kExplore; ++i) f.record(1, d, f.step_s(1, d));
    }
    f.record(1, 5, f.step_s(1, 5) + slow);
    ASSERT_EQ(f.best_depth(1, accept), 3);
    EXPECT_EQ(f.choose(1, accept), slow > 0 ? 3 : 5) << slow;
  }
}

// A depth never run in a bucket, whose predicted rate is within kNoise of the best's, is
// explored too (its estimate is the prior plus a correction carried over from other depths, less
// than one measured step). The H200, twenty-fifth session, the bundled model at batch 64: the
// start-up model made depth 5 best, depth 4 was explored, and depth 3 -- predicted 7% below
// depth 5 with depth 4's correction held flat below it, measured 6% above it under fixed:3 --
// never ran in the bucket (auto 1.76x off against fixed:3's 1.92x).
TEST(StepCost, UnmeasuredDepthsNearTheBestAreExplored) {
  const std::vector<double> accept(5, 0.8);
  // Prior: a step of depth d costs 1.0 + 0.1 d (tokens per request and second 1.64, 2.03, 2.27,
  // 2.40, 2.46 for d = 1..5). Depths 4 and 5 measured 0.1 dearer: 2.24, 2.31, and depth 3 with
  // depth 4's correction, 2.11 (91% of depth 5's).
  StepCost c(flat_times(1.0, 1.0, 0.05, 0.05, 5), 5);
  const double t4 = c.step_s(64, 4) + 0.1, t5 = c.step_s(64, 5) + 0.1;
  for (int i = 0; i < StepCost::kExplore; ++i) {
    c.record(64, 4, t4);
    c.record(64, 5, t5);
  }
  ASSERT_EQ(c.best_depth(64, accept), 5);
  ASSERT_EQ(c.measured(64, 3), 0);
  const std::vector<double> rates = {c.rate(64, 3, accept), c.rate(64, 5, accept)};
  ASSERT_GE(rates[0], (1.0 - StepCost::kNoise) * rates[1]);
  EXPECT_EQ(c.choose(64, accept), 3);
  // Once measured kExplore times it is a candidate like any other: here as dear as predicted,
  // so the best again.
  for (int i = 0; i < StepCost::kExplore; ++i) c.record(64, 3, c.step_s(64, 3));
  EXPECT_NE(c.choose(64, accept), 3);
  // Far from the best's rate (more than kNoise below), an unmeasured depth is left alone.
  StepCost f(flat_times(1.0, 1.0, 0.05, 0.05, 5), 5);
  const double f4 = f.step_s(64, 4), f5 = f.step_s(64, 5);
  for (int i = 0; i < StepCost::kExplore; ++i) {
    f.record(64, 4, f4);
    f.record(64, 5, f5);
  }
  ASSERT_LT(f.rate(64, 1, accept), (1.0 - StepCost::kNoise) * f.rate(64, 5, accept));
  for (int i = 0; i < 3 * StepCost::kExplore; ++i) {
    const int32_t d = f.choose(64, accept);
    EXPECT_NE(d, 1) << i;
    f.record(64, d, f.step_s(64, d));
  }
}

// A depth never run in the bucket is also judged at the start-up model's time alone: the
// correction carried over from the measured depths can make it look slower than it is (the H200,
// twenty-seventh session, the bundled model at batch 16: depth 2's steps over the model, held
// below it, hid depth 1, the best depth).
TEST(StepCost, UnmeasuredDepthsTheStartUpModelFavoursAreExplored) {
  const std::vector<double> accept(5, 0.8);
  // Prior: step 1 + 0.3 d (rates 1.385, 1.525, 1.554, 1.527, 1.476 for d = 1..5). Depths 2..5
  // measured 0.4 s dearer (best 4: 3.3616 / 2.6 = 1.293); depth 1 with depth 2's correction held:
  // 1.8 / 1.7 = 1.059, more than kNoise below the best; at the prior alone 1.385.
  StepCost c(flat_times(1.0, 1.0, 0.25, 0.05, 5), 5);
  for (int32_t d = 2; d <= 5; ++d) {
    for (int i = 0; i < StepCost::kExplore; ++i) c.record(64, d, 1.0 + 0.3 * d + 0.4);
  }
  ASSERT_EQ(c.best_depth(64, accept), 4);
  ASSERT_LT(c.rate(64, 1, accept), (1.0 - StepCost::kNoise) * c.rate(64, 4, accept));
  EXPECT_EQ(c.choose(64, accept), 1);
  // Measured at the prior's time, it is the best.
  for (int i = 0; i < StepCost::kExplore; ++i) c.record(64, 1, 1.3);
  EXPECT_EQ(c.best_depth(64, accept), 1);
  EXPECT_EQ(c.choose(64, accept), 1);
}

// The engine under auto, step by step on synthetic timings: each step runs StepCost::choose's
// depth and records the step's true time. A choice of off (-1) stops speculation for the running
// requests (Engine::plan_drafts), so from then on every step is a plain decode. Returns the
// depths run.
std::vector<int32_t> simulate_auto(StepCost& c,
                                   int64_t b,
                                   std::span<const double> accept,
                                   const std::function<double(int32_t)>& true_s,
                                   int steps) {
  std::vector<int32_t> run;
  bool off = false;
  for (int i = 0; i < steps; ++i) {
    const int32_t d = off ? -1 : c.choose(b, accept);
    off = d < 0;
    c.record(b, d, true_s(d));
    run.push_back(d);
  }
  return run;
}

// The H200 pattern (CUDA, batch 16): the start-up model makes verification look nearly free
// (every depth a little dearer than off: deep drafts win), while the engine's own steps show
// that a verified position costs much more (host sampling and checking of every position,
// eager launches) and a plain decode stays cheap. Auto must leave the deep depths for off or
// depth 1 within a bounded number of steps, not lock into them.
TEST(StepCost, CheapLookingStartUpModelDoesNotLockAutoIntoDeepDrafts) {
  const std::vector<double> accept(5, 0.8);
  const StepTimes prior = flat_times(1.0, 1.1, 0.01, 0.01, 5);
  // True times at batch 16: off 1.0, a step of depth d >= 0 1.2 + 0.6 d. Tokens per request
  // and second: off 1.0; d=1 1.8 / 1.8 = 1.0; d=2 2.44 / 2.4 = 1.017; d=3 2.952 / 3.0 = 0.98;
  // d=5 3.689 / 4.2 = 0.88: depth 2 best by 2%, the deep depths losing.
  auto expensive = [](int32_t d) { return d < 0 ? 1.0 : 1.2 + 0.6 * d; };
  StepCost c(prior, 5);
  ASSERT_EQ(c.best_depth(16, accept), 5);  // the start-up model's pick
  const std::vector<int32_t> run = simulate_auto(c, 16, accept, expensive, 60);
  // Bounded: after 20 steps it runs depth <= 2 for good.
  for (size_t i = 20; i < run.size(); ++i) EXPECT_LE(run[i], 2) << i;
  // Deep steps (4, 5) are explored a few times, not run for long.
  EXPECT_LE(std::count_if(run.begin(), run.end(), [](int32_t d) { return d >= 4; }),
            2 * StepCost::kExplore + 1);

  // Where every depth clearly loses (d=1 1.8 / 2.2 = 0.82 of off), off within a few steps. (It
  // was depth 1 for good: off's predicted time carried depth 1's correction, which holds the
  // cost of sampling and checking the verified positions, and off was never tried.)
  auto costly = [](int32_t d) { return d < 0 ? 1.0 : 1.2 + 1.0 * d; };
  StepCost c2(prior, 5);
  const std::vector<int32_t> run2 = simulate_auto(c2, 16, accept, costly, 40);
  EXPECT_EQ(run2.back(), -1);
  EXPECT_LE(std::find(run2.begin(), run2.end(), -1) - run2.begin(), 10);

  // Batch 1 on the same start-up model, where the engine's steps show verification is cheap
  // (a plain step 1.0, a depth-d step 1.25 + 0.05 d): auto keeps speculating deep, without
  // depth-0 steps (off is never in question).
  auto cheap = [](int32_t d) { return d < 0 ? 1.0 : 1.25 + 0.05 * d; };
  StepCost c3(prior, 5);
  const std::vector<int32_t> run3 = simulate_auto(c3, 1, accept, cheap, 40);
  EXPECT_EQ(std::count(run3.begin(), run3.end(), -1), 0);
  EXPECT_EQ(std::count(run3.begin(), run3.end(), 0), 0);
  for (size_t i = 20; i < run3.size(); ++i) EXPECT_GE(run3[i], 4) << i;
}

TEST(AcceptancePredictor, LearnsRatesAndCalibration) {
  AcceptancePredictor p(3);
  EXPECT_NEAR(p.position_rate(0), 0.8, 1e-9);  // the optimistic prior
  for (int i = 0; i < 200; ++i) {
    p.record(0, 0.95f, i % 10 != 0);  // 90% accepted at confidence 0.95
    p.record(1, 0.15f, i % 2 == 0);   // 50% accepted at confidence 0.15
  }
  EXPECT_NEAR(p.position_rate(0), 0.9, 0.02);
  EXPECT_NEAR(p.position_rate(1), 0.5, 0.02);
  // Nothing seen at position 2 yet: the rate of position 1.
  EXPECT_NEAR(p.position_rate(2), p.position_rate(1), 1e-9);
  EXPECT_NEAR(p.calibrated(0, 0.97f), 0.9, 0.02);
  EXPECT_NEAR(p.calibrated(2, 0.12f), 0.5, 0.02);  // the drafter is underconfident there
  EXPECT_NEAR(p.calibrated(0, 0.55f), p.position_rate(0), 1e-9);  // no data: the rate
  EXPECT_NEAR(p.calibrated(2, 0.55f), p.position_rate(2), 1e-9);
}

// The counts forget (kWindow drafts): a change of traffic moves the rate within about a window.
TEST(AcceptancePredictor, FollowsAChangeOfTraffic) {
  AcceptancePredictor p(2);
  for (int i = 0; i < 20 * static_cast<int>(AcceptancePredictor::kWindow); ++i)
    p.record(0, 0.9f, i % 10 != 0);  // 90% accepted for a long time
  EXPECT_NEAR(p.position_rate(0), 0.9, 0.02);
  const int w = static_cast<int>(AcceptancePredictor::kWindow);
  for (int i = 0; i < 3 * w; ++i) p.record(0, 0.9f, i % 10 < 3);  // then 30%
  EXPECT_NEAR(p.position_rate(0), 0.3, 0.05);
  EXPECT_NEAR(p.calibrated(0, 0.9f), 0.3, 0.05);
  EXPECT_TRUE(p.settled());
  // A second position last seen at 90%, its drafts no longer verified: its old counts fade with
  // the first position's, and its prior (the first position's rate) takes over.
  AcceptancePredictor q(2);
  for (int i = 0; i < 4 * w; ++i) {
    q.record(0, 0.9f, i % 10 != 0);
    q.record(1, 0.9f, i % 10 != 0);
  }
  EXPECT_NEAR(q.position_rate(1), 0.9, 0.02);
  for (int i = 0; i < 10 * w; ++i) q.record(0, 0.9f, i % 10 < 3);
  EXPECT_NEAR(q.position_rate(1), 0.3, 0.05);
}

// Steps without verified drafts (auto off) fade the evidence, adding none: the rates go back to
// the prior (0.8) within several kUnobservedSteps, and the first drafts verified after that count
// at once.
TEST(AcceptancePredictor, EvidenceFadesWhileNothingIsVerified) {
  AcceptancePredictor p(2);
  const int w = static_cast<int>(AcceptancePredictor::kWindow);
  for (int i = 0; i < 4 * w; ++i) {
    p.record(0, 0.2f, i % 20 == 0);  // 5% accepted
    p.record(1, 0.2f, i % 20 == 0);
  }
  EXPECT_NEAR(p.position_rate(0), 0.05, 0.02);
  EXPECT_NEAR(p.calibrated(0, 0.2f), 0.05, 0.02);
  const int n = static_cast<int>(AcceptancePredictor::kUnobservedSteps);
  for (int i = 0; i < n; ++i) p.unobserved_step();
  EXPECT_LT(p.position_rate(0), 0.2);  // one window of steps: still mostly the evidence
  for (int i = 0; i < 6 * n; ++i) p.unobserved_step();
  EXPECT_GT(p.position_rate(0), 0.6);
  EXPECT_GT(p.position_rate(1), 0.6);
  EXPECT_GT(p.calibrated(0, 0.2f), 0.6);
  EXPECT_FALSE(p.settled());
  for (int i = 0; i < 16; ++i) p.record(0, 0.2f, false);
  EXPECT_LT(p.position_rate(0), 0.3);
}

// A verifying step of fewer than kMinDraftsPerStep requests fades the counts as that many first
// drafts would: at batch 1 a change of traffic shows within a few kWindow / kMinDraftsPerStep
// steps, at large batches nothing changes.
TEST(AcceptancePredictor, SmallBatchStepsFadeAsSeveralDrafts) {
  const int w = static_cast<int>(AcceptancePredictor::kWindow);
  const int steps = w / static_cast<int>(AcceptancePredictor::kMinDraftsPerStep);
  AcceptancePredictor one(2), plain(2);
  for (AcceptancePredictor* p : {&one, &plain}) {
    for (int i = 0; i < 4 * w; ++i) {
      p->record(0, 0.5f, i % 10 < 3);  // 30%
      p->verified_step(AcceptancePredictor::kMinDraftsPerStep);
    }
  }
  EXPECT_NEAR(one.position_rate(0), plain.position_rate(0), 1e-12);
  for (int i = 0; i < 2 * steps; ++i) {  // then 90%, one request per step
    one.record(0, 0.5f, i % 10 != 0);
    one.verified_step(1);
    plain.record(0, 0.5f, i % 10 != 0);
  }
  EXPECT_GT(one.position_rate(0), 0.62);    // ~0.67
  EXPECT_LT(plain.position_rate(0), 0.58);  // ~0.54
  AcceptancePredictor big(2);
  big.record(0, 0.5f, true);
  const double before = big.position_rate(0);
  big.verified_step(64);
  EXPECT_EQ(big.position_rate(0), before);
}

TEST(SpecStats, Summaries) {
  Stats s;
  s.resize(3);
  s.verified = {10, 8, 4};
  s.accepted = {8, 4, 1};
  s.verify_len = {2, 0, 0, 10};
  s.spec_steps = 10;
  s.spec_tokens = 23;
  EXPECT_DOUBLE_EQ(s.acceptance(0), 0.8);
  EXPECT_DOUBLE_EQ(s.acceptance(2), 0.25);
  EXPECT_DOUBLE_EQ(s.acceptance(7), 0.0);
  EXPECT_DOUBLE_EQ(s.mean_accepted_length(), 2.3);
  EXPECT_DOUBLE_EQ(s.mean_verify_len(), 2.5);
  EXPECT_NE(s.summary().find("0.800 0.500 0.250"), std::string::npos) << s.summary();
}

std::shared_ptr<const model::Checkpoint> fixture() {
  static std::shared_ptr<const model::Checkpoint> ckpt = [] {
    auto r =
        model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::shared_ptr<const model::Checkpoint>(std::move(r).value());
  }();
  return ckpt;
}

TEST(MtpDrafter, FirstDraftIsTheMtpPredictionAndLaterOnesFollowTheChain) {
  const auto& mc = fixture()->config();
  cpu::CpuModel model(mc, fixture()->weights(), model::Numerics::kReference);
  ASSERT_TRUE(model.can_draft());
  auto arena = state::PageArena::growable(state::default_page_bytes(mc));
  const std::vector<int32_t> prompt = {5, 17, 99, 3, 250, 41, 8, 77, 123};
  backend::ForwardOptions o;
  o.run_mtp = true;

  // Reference: one forward over prompt + [t] with MTP; its last MTP row (position P-1, next
  // token t) predicts the token after t.
  const int32_t t = 42;
  std::vector<int32_t> all = prompt;
  all.push_back(t);
  state::SequenceState ref(mc, arena.get(), 1, 4);
  backend::ForwardOutputs ro;
  ASSERT_TRUE(model.forward(ref, all, o, &ro).ok());
  ASSERT_EQ(ro.mtp_count, static_cast<int64_t>(prompt.size()));
  const float* last = ro.mtp_logits.data() + (ro.mtp_count - 1) * mc.vocab_size;
  const int32_t expect0 = static_cast<int32_t>(std::max_element(last, last + mc.vocab_size) - last);

  // Drafting after the prompt with pending token t.
  state::SequenceState st(mc, arena.get(), 2, 4);
  o.want_mtp_logits = false;
  backend::ForwardOutputs out;
  ASSERT_TRUE(model.forward(st, prompt, o, &out).ok());
  EXPECT_EQ(out.mtp_count, 0);
  EXPECT_EQ(st.mtp_num_tokens(), static_cast<int64_t>(prompt.size()) - 1);
  MtpDrafter drafter(&model, 4);
  Draft d;
  std::vector<DraftRequest> reqs(1);
  reqs[0].state = &st;
  reqs[0].next_token = t;
  reqs[0].max_drafts = 4;
  reqs[0].out = &d;
  ASSERT_TRUE(drafter.draft(reqs).ok());
  ASSERT_TRUE(reqs[0].status.ok()) << reqs[0].status.to_string();
  ASSERT_EQ(d.tokens.size(), 4u);
  EXPECT_EQ(d.tokens[0], expect0);
  for (float c : d.confidence) {
    EXPECT_GT(c, 0.0f);
    EXPECT_LE(c, 1.0f);
  }
  EXPECT_EQ(st.mtp_num_tokens(), static_cast<int64_t>(prompt.size()));
  // The same drafts again from a fresh copy: deterministic.
  state::SequenceState st2(mc, arena.get(), 3, 4);
  ASSERT_TRUE(model.forward(st2, prompt, o, nullptr).ok());
  Draft d2;
  reqs[0].state = &st2;
  reqs[0].out = &d2;
  ASSERT_TRUE(drafter.draft(reqs).ok());
  EXPECT_EQ(d2.tokens, d.tokens);

  // Verifying [t, drafts] with MTP, then rolling the drafts back, leaves the state equal to a
  // forward over prompt + [t]: the next forward's logits and MTP predictions agree exactly.
  ASSERT_TRUE(st.reserve(5));
  std::vector<int32_t> verify = {t};
  verify.insert(verify.end(), d.tokens.begin(), d.tokens.end());
  ASSERT_TRUE(model.forward(st, verify, o, nullptr).ok());
  ASSERT_TRUE(st.rollback(4).ok());
  EXPECT_EQ(st.mtp_num_tokens(), static_cast<int64_t>(prompt.size()));
  o.want_mtp_logits = true;
  const std::vector<int32_t> more = {7, 300};
  backend::ForwardOutputs a, b;
  ASSERT_TRUE(model.forward(st, more, o, &a).ok());
  ASSERT_TRUE(model.forward(ref, more, o, &b).ok());
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.mtp_logits, b.mtp_logits);
  EXPECT_EQ(a.mtp_first_pos, b.mtp_first_pos);

  // Errors: too many drafts for the rollback limit, MTP state behind.
  reqs[0].state = &st;
  reqs[0].max_drafts = 5;
  ASSERT_TRUE(drafter.draft(reqs).ok());
  EXPECT_FALSE(reqs[0].status.ok());
  state::SequenceState behind(mc, arena.get(), 4, 4);
  ASSERT_TRUE(model.forward(behind, prompt, backend::ForwardOptions(), nullptr).ok());
  reqs[0].state = &behind;
  reqs[0].max_drafts = 2;
  ASSERT_TRUE(drafter.draft(reqs).ok());
  EXPECT_EQ(reqs[0].status.code(), StatusCode::kFailedPrecondition);
}

// A verification that skips its MTP pass (MtpDrafter::prepare with drafts) leaves the MTP block
// behind by the accepted positions; the next drafting call catches up over them in its first
// pass. Its drafts, and the state after a catch-up-only call (no drafts) followed by a forward
// with MTP, equal those of the path that ran the MTP pass in the verification, on both CPU
// backends.
TEST(MtpDrafter, CatchUpAfterAVerificationWithoutMtpEqualsTheMtpPass) {
  const auto& mc = fixture()->config();
  cpu::CpuModel reference(mc, fixture()->weights(), model::Numerics::kReference);
  cpu::fast::FastCpuModel fast(mc, fixture()->weights(), model::Numerics::kReference, nullptr);
  for (backend::Model* model :
       {static_cast<backend::Model*>(&reference), static_cast<backend::Model*>(&fast)}) {
    SCOPED_TRACE(model == &fast ? "fast" : "reference");
    auto arena = state::PageArena::growable(state::default_page_bytes(mc));
    MtpDrafter drafter(model, 3);
    backend::ForwardOptions prompt_opts;
    drafter.prepare(prompt_opts, 0);
    ASSERT_TRUE(prompt_opts.run_mtp);
    backend::ForwardOptions verify_opts;
    drafter.prepare(verify_opts, 3);
    ASSERT_FALSE(verify_opts.run_mtp);
    const std::vector<int32_t> prompt = {5, 17, 99, 3, 250, 41, 8, 77, 123};
    const int64_t P = static_cast<int64_t>(prompt.size());
    const int32_t t = 42, bonus = 11;
    auto draft = [&](state::SequenceState& st,
                     int32_t next,
                     int32_t k,
                     std::span<const int32_t> up,
                     Draft* d) {
      std::vector<DraftRequest> reqs(1);
      reqs[0].state = &st;
      reqs[0].next_token = next;
      reqs[0].max_drafts = k;
      reqs[0].catch_up = up;
      reqs[0].out = d;
      EXPECT_TRUE(drafter.draft(reqs).ok());
      return reqs[0].status;
    };
    // Three sequences through the prompt and a first drafting call (nothing behind).
    std::vector<std::unique_ptr<state::SequenceState>> seqs;
    Draft first;
    for (int64_t id = 1; id <= 3; ++id) {
      seqs.push_back(std::make_unique<state::SequenceState>(mc, arena.get(), id, 3));
      ASSERT_TRUE(model->forward(*seqs.back(), prompt, prompt_opts, nullptr).ok());
      Draft d;
      ASSERT_TRUE(draft(*seqs.back(), t, 3, {}, &d).ok());
      if (id > 1) {
        ASSERT_EQ(d.tokens, first.tokens);
      }
      first = d;
    }
    // Verify [t, d0, d1, d2] and keep t, d0, d1 (two drafts accepted): sequence 0 with its MTP
    // pass, 1 and 2 without it.
    std::vector<int32_t> verify = {t};
    verify.insert(verify.end(), first.tokens.begin(), first.tokens.end());
    for (size_t i = 0; i < seqs.size(); ++i) {
      ASSERT_TRUE(seqs[i]->reserve(4));
      ASSERT_TRUE(
          model->forward(*seqs[i], verify, i == 0 ? prompt_opts : verify_opts, nullptr).ok());
      ASSERT_TRUE(seqs[i]->rollback(1).ok());
    }
    EXPECT_EQ(seqs[0]->mtp_num_tokens(), P + 2);  // one behind
    EXPECT_EQ(seqs[1]->mtp_num_tokens(), P);      // behind by t, d0, d1
    const std::vector<int32_t> up = {first.tokens[0], first.tokens[1]};
    Draft a, b;
    ASSERT_TRUE(draft(*seqs[0], bonus, 3, {}, &a).ok());
    ASSERT_TRUE(draft(*seqs[1], bonus, 3, up, &b).ok());
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.confidence, b.confidence);
    EXPECT_EQ(seqs[1]->mtp_num_tokens(), P + 3);
    // The wrong catch-up (too short; nothing when behind): refused, the state untouched.
    Draft bad;
    EXPECT_EQ(draft(*seqs[2], bonus, 3, std::span<const int32_t>(up.data(), 1), &bad).code(),
              StatusCode::kFailedPrecondition);
    EXPECT_EQ(draft(*seqs[2], bonus, 3, {}, &bad).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(seqs[2]->mtp_num_tokens(), P);
    // Catch-up only (no drafts), then a forward of the bonus token with MTP: the same logits and
    // MTP predictions as the sequence whose verification ran the MTP pass.
    Draft none;
    ASSERT_TRUE(draft(*seqs[2], bonus, 0, up, &none).ok());
    EXPECT_TRUE(none.tokens.empty());
    EXPECT_EQ(seqs[2]->mtp_num_tokens(), P + 2);
    state::SequenceState& ref = *seqs[0];
    ASSERT_TRUE(ref.rollback(0).ok());  // the MTP block back to one position behind
    backend::ForwardOptions o = prompt_opts;
    o.want_mtp_logits = true;
    backend::ForwardOutputs x, y;
    const std::vector<int32_t> next = {bonus, 300};
    ASSERT_TRUE(ref.reserve(2) && seqs[2]->reserve(2));
    ASSERT_TRUE(model->forward(ref, next, o, &x).ok());
    ASSERT_TRUE(model->forward(*seqs[2], next, o, &y).ok());
    EXPECT_EQ(x.logits, y.logits);
    EXPECT_EQ(x.mtp_logits, y.mtp_logits);
    EXPECT_EQ(x.mtp_first_pos, y.mtp_first_pos);
  }
}

TEST(MeasureStepTimes, MeasuresEveryBatchSizeAndLength) {
  const auto& mc = fixture()->config();
  cpu::CpuModel model(mc, fixture()->weights(), model::Numerics::kReference);
  auto arena = state::PageArena::growable(state::default_page_bytes(mc));
  MtpDrafter drafter(&model, 2);
  auto t = measure_step_times(model, drafter, *arena, 3, 2, false, 1);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(t->valid());
  EXPECT_EQ(t->batch, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(t->max_k(), 2);
  for (size_t i = 0; i < t->batch.size(); ++i) {
    EXPECT_GT(t->off_s[i], 0);
    for (double v : t->verify_s[i]) EXPECT_GT(v, 0);
    for (double v : t->draft_s[i]) EXPECT_GT(v, 0);
  }
  EXPECT_EQ(arena->used_bytes(), 0);  // the throwaway sequences are gone
}

}  // namespace
}  // namespace dsinfer::spec
