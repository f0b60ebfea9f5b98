// Sampler: each mode's empirical distribution against its target, penalties, seeding, logprobs.
#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace dsinfer::sampling {
namespace {

const std::vector<float> kLogits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 3.0f, -2.0f, 1.5f};

std::vector<double> softmax(const std::vector<float>& l, double t) {
  std::vector<double> p(l.size());
  double m = -1e30, s = 0;
  for (float v : l) m = std::max(m, v / t);
  for (size_t i = 0; i < l.size(); ++i) s += (p[i] = std::exp(l[i] / t - m));
  for (auto& v : p) v /= s;
  return p;
}

// Empirical frequencies over `draws` samples with seeds 0.. (one step each).
std::vector<double> frequencies(const SamplingConfig& base, int draws) {
  std::vector<double> f(kLogits.size(), 0.0);
  PenaltyState pen;
  for (int i = 0; i < draws; ++i) {
    SamplingConfig c = base;
    c.seed = 1000 + static_cast<uint64_t>(i);
    std::vector<float> l = kLogits;
    f[sample(l, c, pen, 0).token] += 1.0;
  }
  for (auto& v : f) v /= draws;
  return f;
}

// |freq - p| within 5 standard errors for every token.
void expect_matches(const std::vector<double>& f, const std::vector<double>& p, int draws) {
  for (size_t i = 0; i < p.size(); ++i) {
    const double se = std::sqrt(std::max(p[i] * (1 - p[i]), 1e-12) / draws);
    EXPECT_NEAR(f[i], p[i], 5 * se + 1e-9) << "token " << i;
  }
}

constexpr int kDraws = 40000;

TEST(Sampler, GreedyPicksArgmax) {
  SamplingConfig c;
  c.temperature = 0.0f;
  std::vector<float> l = kLogits;
  EXPECT_EQ(sample(l, c, PenaltyState(), 0).token, 5);
}

TEST(Sampler, TemperatureMatchesSoftmax) {
  for (float t : {1.0f, 0.5f, 2.0f}) {
    SamplingConfig c;
    c.temperature = t;
    expect_matches(frequencies(c, kDraws), softmax(kLogits, t), kDraws);
  }
}

TEST(Sampler, TopKRenormalisesOverTheKBest) {
  SamplingConfig c;
  c.top_k = 3;  // tokens 5 (3.0), 0 (2.0), 7 (1.5)
  auto p = softmax(kLogits, 1.0);
  const double z = p[5] + p[0] + p[7];
  std::vector<double> target(kLogits.size(), 0.0);
  target[5] = p[5] / z;
  target[0] = p[0] / z;
  target[7] = p[7] / z;
  expect_matches(frequencies(c, kDraws), target, kDraws);
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  SamplingConfig c;
  c.top_p = 0.8f;
  auto p = softmax(kLogits, 1.0);
  // Sorted: 5, 0, 7, 1, 2, 3, 4, 6. Prefix mass: find the cut.
  const std::vector<int> order = {5, 0, 7, 1, 2, 3, 4, 6};
  std::vector<double> target(kLogits.size(), 0.0);
  double acc = 0;
  size_t keep = 0;
  while (keep < order.size()) {
    acc += p[order[keep++]];
    if (acc >= 0.8)
      break;
  }
  for (size_t i = 0; i < keep; ++i) target[order[i]] = p[order[i]] / acc;
  expect_matches(frequencies(c, kDraws), target, kDraws);
}

TEST(Sampler, MinPDropsTokensBelowTheFraction) {
  SamplingConfig c;
  c.min_p = 0.3f;  // keep p >= 0.3 * p_max
  auto p = softmax(kLogits, 1.0);
  std::vector<double> target(kLogits.size(), 0.0);
  double z = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] >= 0.3 * p[5])
      z += p[i];
  }
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] >= 0.3 * p[5])
      target[i] = p[i] / z;
  }
  expect_matches(frequencies(c, kDraws), target, kDraws);
}

TEST(Sampler, PenaltiesShiftLogits) {
  SamplingConfig c;
  c.temperature = 0.0f;
  PenaltyState pen;
  pen.add_output(5);
  pen.add_output(5);
  c.frequency_penalty = 0.6f;  // 3.0 - 1.2 = 1.8 < 2.0
  std::vector<float> l = kLogits;
  EXPECT_EQ(sample(l, c, pen, 0).token, 0);
  c.frequency_penalty = 0.0f;
  c.presence_penalty = 1.5f;  // 3.0 - 1.5 = 1.5 < 2.0
  l = kLogits;
  EXPECT_EQ(sample(l, c, pen, 0).token, 0);
  c.presence_penalty = 0.0f;
  c.repetition_penalty = 2.0f;  // 3.0 / 2 = 1.5 < 2.0
  l = kLogits;
  EXPECT_EQ(sample(l, c, pen, 0).token, 0);
  PenaltyState prompt_only;
  const std::vector<int32_t> prompt = {5};
  prompt_only.add_prompt(prompt);
  l = kLogits;
  EXPECT_EQ(sample(l, c, prompt_only, 0).token, 0) << "repetition covers the prompt";
  c.repetition_penalty = 1.0f;
  c.presence_penalty = 1.5f;
  l = kLogits;
  EXPECT_EQ(sample(l, c, prompt_only, 0).token, 5) << "presence covers generated tokens only";
}

// uses_penalties says whether a config applies any; a state made not counting keeps nothing.
TEST(Sampler, PenaltyStateCountsOnlyWhenAsked) {
  SamplingConfig c;
  EXPECT_FALSE(uses_penalties(c));
  c.repetition_penalty = 1.1f;
  EXPECT_TRUE(uses_penalties(c));
  c = SamplingConfig();
  c.presence_penalty = -0.5f;
  EXPECT_TRUE(uses_penalties(c));
  c = SamplingConfig();
  c.frequency_penalty = 0.1f;
  EXPECT_TRUE(uses_penalties(c));
  const std::vector<int32_t> prompt = {5, 5, 7};
  PenaltyState off(false);
  off.add_prompt(prompt);
  off.add_output(5);
  EXPECT_TRUE(off.seen().empty());
  EXPECT_TRUE(off.output_counts().empty());
  PenaltyState on;
  on.add_prompt(prompt);
  on.add_output(5);
  EXPECT_EQ(on.seen().at(5), 3);
  EXPECT_EQ(on.output_counts().at(5), 1);
}

TEST(Sampler, SeededDrawsAreReproducibleAndStepDependent) {
  SamplingConfig c;
  c.seed = 42;
  std::map<int32_t, int> seen;
  for (uint64_t step = 0; step < 200; ++step) {
    std::vector<float> a = kLogits, b = kLogits;
    const int32_t ta = sample(a, c, PenaltyState(), step).token;
    EXPECT_EQ(ta, sample(b, c, PenaltyState(), step).token);
    ++seen[ta];
  }
  EXPECT_GE(seen.size(), 4u);
  EXPECT_NE(uniform_from(1, 0), uniform_from(2, 0));
  EXPECT_NE(uniform_from(1, 0), uniform_from(1, 1));
}

TEST(Sampler, LogprobsAreTheModelDistribution) {
  SamplingConfig c;
  c.temperature = 0.0f;
  c.logprobs = true;
  c.top_logprobs = 3;
  c.presence_penalty = 2.0f;  // penalties do not change reported logprobs
  std::vector<float> l = kLogits;
  const SampleResult r = sample(l, c, PenaltyState(), 0);
  const auto p = softmax(kLogits, 1.0);
  EXPECT_NEAR(r.logprob, std::log(p[5]), 1e-5);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].token, 5);
  EXPECT_EQ(r.top[1].token, 0);
  EXPECT_EQ(r.top[2].token, 7);
  EXPECT_NEAR(r.top[1].logprob, std::log(p[0]), 1e-5);
}

TEST(Sampler, ValidateNamesTheField) {
  SamplingConfig c;
  c.top_p = 0.0f;
  EXPECT_NE(validate(c).message().find("top_p"), std::string::npos);
  c = SamplingConfig();
  c.temperature = -1.0f;
  EXPECT_NE(validate(c).message().find("temperature"), std::string::npos);
  c = SamplingConfig();
  c.top_logprobs = 21;
  EXPECT_NE(validate(c).message().find("top_logprobs"), std::string::npos);
  EXPECT_TRUE(validate(c, 21).ok());  // a server's --max-logprobs raises the bound
  EXPECT_FALSE(validate(c, 20).ok());
  EXPECT_TRUE(validate(SamplingConfig()).ok());
}

TEST(Sampler, LogprobsAreRawEvenWithTemperatureAndTopK) {
  // The reported distribution is the model's raw one (vLLM's default logprobs_mode), whatever
  // temperature, top-k and penalties do to the distribution the token is drawn from.
  SamplingConfig c;
  c.temperature = 0.3f;
  c.top_k = 2;
  c.repetition_penalty = 1.5f;
  c.logprobs = true;
  c.top_logprobs = 2;
  c.seed = 9;
  PenaltyState pen;
  const int32_t prompt[] = {5};
  pen.add_prompt(prompt);
  std::vector<float> l = kLogits;
  const SampleResult r = sample(l, c, pen, 3);
  const auto p = softmax(kLogits, 1.0);
  EXPECT_NEAR(r.logprob, std::log(p[r.token]), 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_NEAR(r.top[0].logprob, std::log(p[5]), 1e-5);
}

// Structured outputs: a token mask restricts the choice (greedy and sampled), keeps the raw
// logprobs, and one allowing nothing is ignored.
TEST(SamplerTest, TokenMaskRestrictsTheChoice) {
  // Allow tokens 1, 3 and 6 only (token 5, the argmax, is excluded).
  const std::vector<uint32_t> allowed = {(1u << 1) | (1u << 3) | (1u << 6)};
  PenaltyState pen;
  SamplerScratch scratch;
  SamplingConfig greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = true;
  std::vector<float> l = kLogits;
  SampleResult r = sample(l, greedy, pen, 0, scratch, allowed);
  EXPECT_EQ(r.token, 1);
  const double lse = std::log(softmax(kLogits, 1.0)[1]);
  EXPECT_NEAR(r.logprob, lse, 1e-5);  // the model's own distribution, not the masked one
  SamplingConfig c;
  c.temperature = 2.0f;
  std::map<int32_t, int> seen;
  for (uint64_t s = 0; s < 2000; ++s) {
    c.seed = s;
    l = kLogits;
    ++seen[sample(l, c, pen, 3, scratch, allowed).token];
  }
  EXPECT_EQ(seen.size(), 3u);
  for (const auto& [t, n] : seen) EXPECT_TRUE(t == 1 || t == 3 || t == 6) << t;
  // The masked distribution: renormalised over the allowed tokens.
  const auto p = softmax(kLogits, 2.0);
  const double z = p[1] + p[3] + p[6];
  EXPECT_NEAR(seen[1] / 2000.0, p[1] / z, 0.04);
  EXPECT_NEAR(seen[6] / 2000.0, p[6] / z, 0.04);
  // A mask that allows nothing is ignored.
  l = kLogits;
  EXPECT_EQ(sample(l, greedy, pen, 0, scratch, std::vector<uint32_t>{0u}).token, 5);
  EXPECT_FALSE(apply_token_mask(l, std::vector<uint32_t>{1u << 9}));  // past the vocabulary
}

}  // namespace
}  // namespace dsinfer::sampling
