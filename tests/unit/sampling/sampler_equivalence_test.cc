// The sampler without a full sort (sample) against the first implementation (sample_full_sort) on
// random rows: the same token, logprob and top_logprobs, bit for bit, under every option.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace dsinfer::sampling {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row shapes: 0 normal, 1 quantised (heavy ties), 2 with -inf entries, 3 all equal, 4 one finite
// logit, 5 a wide range (weights underflow to 0), 6 all -inf, 7 +0 and -0 mixed in ties.
std::vector<float> make_row(int64_t vocab, int kind, std::mt19937& g) {
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (auto& v : l) {
    v = nd(g);
    switch (kind) {
      case 1:
        v = std::round(v * 2.0f) / 2.0f;
        break;
      case 2:
        v = g() % 3 == 0 ? kNegInf : v;
        break;
      case 3:
        v = 1.25f;
        break;
      case 4:
        v = kNegInf;
        break;
      case 5:
        v *= 300.0f;
        break;
      case 6:
        v = kNegInf;
        break;
      case 7:
        v = g() % 2 ? 0.0f : (g() % 2 ? -0.0f : std::round(v));
        break;
      default:
        break;
    }
  }
  if (kind == 4)
    l[g() % vocab] = 0.5f;
  return l;
}

SamplingConfig random_config(int64_t vocab, std::mt19937& g) {
  const float temps[] = {0.0f, 0.05f, 0.5f, 0.7f, 1.0f, 1.3f, 2.5f, 100.0f};
  const float top_ps[] = {1.0f, 1.0f, 0.999f, 0.95f, 0.9f, 0.5f, 0.1f, 1e-6f};
  const float min_ps[] = {0.0f, 0.0f, 0.0f, 0.01f, 0.1f, 0.9f, 1.0f};
  const int64_t top_ks[] = {0, 0, 0, 1, 2, 5, 50, 1000, vocab - 1, vocab, vocab + 5};
  SamplingConfig c;
  c.temperature = temps[g() % 8];
  c.top_p = top_ps[g() % 8];
  c.min_p = min_ps[g() % 7];
  c.top_k = static_cast<int32_t>(std::max<int64_t>(0, top_ks[g() % 11]));
  if (g() % 3 == 0) {
    c.repetition_penalty = g() % 2 ? 1.3f : 0.8f;
    c.presence_penalty = g() % 2 ? 0.5f : -1.0f;
    c.frequency_penalty = g() % 2 ? 0.25f : 0.0f;
  }
  c.seed = g();
  c.logprobs = g() % 2 == 0;
  c.top_logprobs = g() % 3 == 0 ? static_cast<int32_t>(g() % 21) : 0;
  return c;
}

void expect_same(const SampleResult& a, const SampleResult& b, const std::string& what) {
  ASSERT_EQ(a.token, b.token) << what;
  ASSERT_EQ(std::memcmp(&a.logprob, &b.logprob, sizeof(float)), 0) << what;
  ASSERT_EQ(a.top.size(), b.top.size()) << what;
  for (size_t i = 0; i < a.top.size(); ++i) {
    ASSERT_EQ(a.top[i].token, b.top[i].token) << what;
    ASSERT_EQ(std::memcmp(&a.top[i].logprob, &b.top[i].logprob, sizeof(float)), 0) << what;
  }
}

// The sampled pick's sums, bit for bit (a different summation order would change them in the last
// bits long before it changed a token).
void expect_same_sums(const SamplingConfig& c,
                      const SamplerScratch& a,
                      const SamplerScratch& b,
                      int64_t vocab,
                      const std::string& what) {
  if (c.temperature == 0.0f || c.top_k == 1 || vocab == 0)
    return;
  ASSERT_EQ(a.last_keep, b.last_keep) << what;
  ASSERT_EQ(std::memcmp(&a.last_sum, &b.last_sum, sizeof(double)), 0) << what;
  ASSERT_EQ(std::memcmp(&a.last_total, &b.last_total, sizeof(double)), 0) << what;
}

TEST(SamplerEquivalence, MatchesFullSortOnRandomRows) {
  std::mt19937 g(2024);
  SamplerScratch fast_scratch, ref_scratch;  // reused across rows, as the engine does
  for (int64_t vocab : {1, 2, 3, 7, 64, 100, 1000, 5000, 129280}) {
    const int rows = vocab >= 129280 ? 48 : (vocab >= 5000 ? 160 : 400);
    for (int i = 0; i < rows; ++i) {
      const int kind = static_cast<int>(g() % 8);
      const std::vector<float> row = make_row(vocab, kind, g);
      const SamplingConfig c = random_config(vocab, g);
      PenaltyState pen;
      if (c.repetition_penalty != 1.0f || c.presence_penalty != 0.0f) {
        std::vector<int32_t> prompt;
        for (int j = 0; j < 30; ++j) prompt.push_back(static_cast<int32_t>(g() % (vocab + 2)) - 1);
        pen.add_prompt(prompt);
        for (int j = 0; j < 12; ++j) pen.add_output(static_cast<int32_t>(g() % vocab));
      }
      std::vector<uint32_t> mask;
      if (g() % 4 == 0) {  // structured outputs: a few tokens, most, or none (ignored)
        mask.assign(static_cast<size_t>((vocab + 31) / 32), 0u);
        const int64_t allow = g() % 3 == 0 ? 0 : (g() % 2 ? 1 + vocab / 20 : vocab - vocab / 4);
        for (int64_t k = 0; k < allow; ++k) {
          const int64_t t = static_cast<int64_t>(g() % vocab);
          mask[t / 32] |= 1u << (t % 32);
        }
      }
      const uint64_t step = g() % 100000;
      std::vector<float> a = row, b = row;
      const SampleResult fast = sample(a, c, pen, step, fast_scratch, mask);
      const SampleResult ref = sample_full_sort(b, c, pen, step, ref_scratch, mask);
      const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(i) +
                               " kind " + std::to_string(kind) + " T " +
                               std::to_string(c.temperature) + " top_p " + std::to_string(c.top_p) +
                               " top_k " + std::to_string(c.top_k) + " min_p " +
                               std::to_string(c.min_p);
      expect_same_sums(c, fast_scratch, ref_scratch, vocab, what);
      expect_same(fast, ref, what);
    }
  }
}

TEST(SamplerEquivalence, ManyDrawsFromOneRow) {
  // One distribution, many steps: every inverse-CDF position, including the tail's.
  std::mt19937 g(5);
  const std::vector<float> row = make_row(5000, 0, g);
  SamplerScratch s1, s2;
  for (float top_p : {1.0f, 0.9f}) {
    for (uint64_t step = 0; step < 2000; ++step) {
      SamplingConfig c;
      c.temperature = 1.5f;
      c.top_p = top_p;
      c.seed = 77;
      std::vector<float> a = row, b = row;
      const SampleResult fast = sample(a, c, PenaltyState(), step, s1);
      const SampleResult ref = sample_full_sort(b, c, PenaltyState(), step, s2);
      expect_same_sums(c, s1, s2, 5000, "step " + std::to_string(step));
      expect_same(fast, ref, "step " + std::to_string(step));
    }
  }
}

}  // namespace
}  // namespace dsinfer::sampling
