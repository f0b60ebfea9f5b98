// Host sampler.
#include "sampling/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/check.h"
#include "base/strings.h"
#include "numeric/counter_rng.h"

namespace dsinfer::sampling {

Status validate(const SamplingConfig& c, int32_t max_top_logprobs) {
  if (!(c.temperature >= 0.0f && c.temperature <= 100.0f)) {
    return invalid_argument(str_format("temperature must be in [0, 100], got %g", c.temperature));
  }
  if (!(c.top_p > 0.0f && c.top_p <= 1.0f)) {
    return invalid_argument(str_format("top_p must be in (0, 1], got %g", c.top_p));
  }
  if (c.top_k < 0)
    return invalid_argument(str_format("top_k must be >= 0, got %d", c.top_k));
  if (!(c.min_p >= 0.0f && c.min_p <= 1.0f)) {
    return invalid_argument(str_format("min_p must be in [0, 1], got %g", c.min_p));
  }
  if (!(c.presence_penalty >= -2.0f && c.presence_penalty <= 2.0f)) {
    return invalid_argument(
        str_format("presence_penalty must be in [-2, 2], got %g", c.presence_penalty));
  }
  if (!(c.frequency_penalty >= -2.0f && c.frequency_penalty <= 2.0f)) {
    return invalid_argument(
        str_format("frequency_penalty must be in [-2, 2], got %g", c.frequency_penalty));
  }
  if (!(c.repetition_penalty > 0.0f && c.repetition_penalty <= 10.0f)) {
    return invalid_argument(
        str_format("repetition_penalty must be in (0, 10], got %g", c.repetition_penalty));
  }
  if (c.top_logprobs < 0 || c.top_logprobs > max_top_logprobs) {
    return invalid_argument(
        str_format("top_logprobs must be in [0, %d], got %d", max_top_logprobs, c.top_logprobs));
  }
  return Status();
}

double uniform_from(uint64_t seed, uint64_t counter) {
  return rng::uniform_from(seed, counter);  // shared with the GPU sampling kernels
}

bool uses_penalties(const SamplingConfig& c) {
  return c.repetition_penalty != 1.0f || c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f;
}

void PenaltyState::add_prompt(std::span<const int32_t> tokens) {
  if (!counting_)
    return;
  for (int32_t t : tokens) ++seen_[t];
}

void PenaltyState::add_output(int32_t token) {
  if (!counting_)
    return;
  ++output_counts_[token];
  ++seen_[token];
}

namespace {
// log-softmax normaliser: log(sum(exp(x - max))) + max
double log_sum_exp(std::span<const float> x) {
  const float m = *std::max_element(x.begin(), x.end());
  double s = 0.0;
  for (float v : x) s += std::exp(static_cast<double>(v) - m);
  return std::log(s) + m;
}
}  // namespace

bool apply_token_mask(std::span<float> logits, std::span<const uint32_t> allowed) {
  const size_t vocab = logits.size();
  const size_t words = std::min(allowed.size(), (vocab + 31) / 32);
  bool any = false;
  for (size_t w = 0; w < words && !any; ++w) {
    uint32_t bits = allowed[w];
    if (w * 32 + 32 > vocab)
      bits &= (vocab % 32 == 0) ? ~0u : ((1u << (vocab % 32)) - 1u);
    any = bits != 0;
  }
  if (!any)
    return false;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w < words; ++w) {
    const uint32_t bits = allowed[w];
    if (bits == ~0u)
      continue;
    const size_t end = std::min(vocab, w * 32 + 32);
    for (size_t t = w * 32; t < end; ++t) {
      if (!((bits >> (t % 32)) & 1u))
        logits[t] = kNegInf;
    }
  }
  for (size_t t = words * 32; t < vocab; ++t) logits[t] = kNegInf;
  return true;
}

SampleResult sample(std::span<float> logits,
                    const SamplingConfig& c,
                    const PenaltyState& pen,
                    uint64_t step) {
  SamplerScratch scratch;
  return sample(logits, c, pen, step, scratch);
}

namespace {

// Ascending key = the candidate order's logit part (descending logit; -0 and +0 equal). NaN
// logits have no place in that order (the comparator is not a strict weak order over them).
uint32_t desc_key(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) == 0)
    u = 0;
  const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ord;
}

// The logit of a key (+0 for a zero of either sign, which gives the same weights below).
float key_logit(uint32_t key) {
  const uint32_t ord = ~key;
  return std::bit_cast<float>((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}

// Sorts keys ascending: LSD radix sort, digits of 11, 11 and 10 bits (stable; only the values
// matter here, equal keys are interchangeable).
void radix_sort(std::vector<uint32_t>& keys, std::vector<uint32_t>& tmp) {
  constexpr int kShift[3] = {0, 11, 22};
  constexpr uint32_t kMask[3] = {0x7ffu, 0x7ffu, 0x3ffu};
  std::array<uint32_t, 3 * 2048> hist{};
  for (uint32_t k : keys) {
    for (int d = 0; d < 3; ++d) ++hist[d * 2048 + ((k >> kShift[d]) & kMask[d])];
  }
  tmp.resize(keys.size());
  for (int d = 0; d < 3; ++d) {
    uint32_t* h = hist.data() + d * 2048;
    bool trivial = false;  // every key has the same digit: the pass would copy
    uint32_t acc = 0;
    for (int b = 0; b < 2048; ++b) {
      trivial = trivial || h[b] == keys.size();
      const uint32_t v = h[b];
      h[b] = acc;
      acc += v;
    }
    if (trivial)
      continue;
    for (uint32_t k : keys) tmp[h[(k >> kShift[d]) & kMask[d]]++] = k;
    keys.swap(tmp);
  }
}

// The first n candidates' keys in the candidate order.
void sorted_keys(std::span<const float> logits,
                 int64_t n,
                 std::vector<uint32_t>& keys,
                 std::vector<uint32_t>& tmp) {
  keys.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) keys[i] = desc_key(logits[i]);
  radix_sort(keys, tmp);
  keys.resize(static_cast<size_t>(n));
}

// The token at position `pos` of the candidate order, given the sorted keys of a prefix that
// holds it: among tokens of its key, ids ascend, so it is the (pos - first)-th of them.
int32_t token_at(std::span<const float> logits, std::span<const uint32_t> keys, int64_t pos) {
  const uint32_t k = keys[pos];
  const int64_t first = std::lower_bound(keys.begin(), keys.begin() + pos, k) - keys.begin();
  int64_t skip = pos - first;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (desc_key(logits[i]) == k && skip-- == 0)
      return static_cast<int32_t>(i);
  }
  DSI_CHECK(false, "candidate %lld not found", static_cast<long long>(pos));
  return 0;
}

// The sampled pick without sorting the vocabulary: the same candidates, weights, sums (in the
// candidate order, serially) and cuts as pick_full_sort, so the same token. Only the keys are
// sorted (radix), and only the picked position is mapped back to its token id.
int32_t pick_fast(std::span<const float> logits,
                  const SamplingConfig& c,
                  uint64_t step,
                  SamplerScratch& scratch) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  const int64_t n = (c.top_k > 0 && c.top_k < vocab) ? c.top_k : vocab;
  std::vector<uint32_t>& keys = scratch.keys;
  sorted_keys(logits, n, keys, scratch.tmp_keys);
  const double inv_t = 1.0 / c.temperature;
  const double m = key_logit(keys[0]) * inv_t;
  // Unnormalised weights in the candidate order; runs of equal logits share one exp.
  std::vector<double>& w = scratch.p;
  w.resize(static_cast<size_t>(n));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    w[i] = (i > 0 && keys[i] == keys[i - 1]) ? w[i - 1] : std::exp(key_logit(keys[i]) * inv_t - m);
    sum += w[i];
  }
  // Normalised as the reference does (each weight divided by the sum), on the prefix in use.
  auto prob = [&](int64_t i) { return w[i] / sum; };
  int64_t keep = n;
  if (c.top_p < 1.0f) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      acc += prob(i);
      if (acc >= c.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (c.min_p > 0.0f) {
    const double floor = c.min_p * prob(0);
    int64_t i = 1;
    while (i < keep && prob(i) >= floor) ++i;
    keep = i;
  }
  while (keep > 1 && prob(keep - 1) == 0.0) --keep;
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += prob(i);
  scratch.last_sum = sum;
  scratch.last_keep = keep;
  scratch.last_total = total;
  const double u = uniform_from(c.seed, step) * total;
  double acc = 0.0;
  int64_t pos = keep - 1;
  for (int64_t i = 0; i < keep; ++i) {
    acc += prob(i);
    if (u < acc) {
      pos = i;
      break;
    }
  }
  return token_at(logits, keys, pos);
}

// The sampled pick over the fully sorted candidates (the first implementation; the reference
// for pick_fast).
int32_t pick_full_sort(std::span<const float> logits,
                       const SamplingConfig& c,
                       uint64_t step,
                       SamplerScratch& scratch) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::vector<int32_t>& idx = scratch.idx;
  // Candidates sorted by logit (descending, ties by id), then top-k / top-p / min-p.
  idx.resize(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t n = vocab;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (c.top_k > 0 && c.top_k < vocab) {
    n = c.top_k;
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), by_logit);
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  const double inv_t = 1.0 / c.temperature;
  const double m = logits[idx[0]] * inv_t;
  std::vector<double>& p = scratch.p;
  p.resize(static_cast<size_t>(n));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    p[i] = std::exp(logits[idx[i]] * inv_t - m);
    sum += p[i];
  }
  for (auto& v : p) v /= sum;
  int64_t keep = n;
  if (c.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      acc += p[i];
      if (acc >= c.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (c.min_p > 0.0f) {
    const double floor = c.min_p * p[0];
    int64_t i = 1;
    while (i < keep && p[i] >= floor) ++i;
    keep = i;
  }
  // Tokens of probability 0 (masked out, or underflowed) are never chosen.
  while (keep > 1 && p[keep - 1] == 0.0) --keep;
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += p[i];
  scratch.last_sum = sum;
  scratch.last_keep = keep;
  scratch.last_total = total;
  const double u = uniform_from(c.seed, step) * total;
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc)
      return idx[i];
  }
  return idx[keep - 1];
}

SampleResult sample_impl(std::span<float> logits,
                         const SamplingConfig& c,
                         const PenaltyState& pen,
                         uint64_t step,
                         SamplerScratch& scratch,
                         std::span<const uint32_t> allowed,
                         bool full_sort) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  DSI_CHECK(vocab > 0, "empty logits");
  SampleResult r;
  // Logprobs report the model's own distribution (before penalties and temperature).
  const double lse_raw = (c.logprobs || c.top_logprobs > 0) ? log_sum_exp(logits) : 0.0;
  std::vector<TokenLogprob> top_raw;
  if (c.top_logprobs > 0) {
    std::vector<int32_t>& idx = scratch.idx;
    idx.resize(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    const int64_t k = std::min<int64_t>(c.top_logprobs, vocab);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t i = 0; i < k; ++i) {
      top_raw.push_back({idx[i], static_cast<float>(logits[idx[i]] - lse_raw)});
    }
  }
  std::vector<float>& raw = scratch.raw;
  if (c.logprobs)
    raw.assign(logits.begin(), logits.end());

  // Structured outputs: only the grammar's tokens stay candidates.
  if (!allowed.empty())
    apply_token_mask(logits, allowed);

  // Penalties.
  if (c.repetition_penalty != 1.0f) {
    for (const auto& [tok, cnt] : pen.seen()) {
      if (tok < 0 || tok >= vocab)
        continue;
      float& l = logits[tok];
      l = l > 0.0f ? l / c.repetition_penalty : l * c.repetition_penalty;
    }
  }
  if (c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f) {
    for (const auto& [tok, cnt] : pen.output_counts()) {
      if (tok < 0 || tok >= vocab)
        continue;
      logits[tok] -= c.presence_penalty + c.frequency_penalty * static_cast<float>(cnt);
    }
  }

  int32_t chosen = 0;
  if (c.temperature == 0.0f || c.top_k == 1) {
    chosen = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else {
    // A small top-k is a partial sort of the ids already (a heap of k, the rest compared with
    // its top), as fast as the radix path or faster.
    const bool few = c.top_k > 0 && static_cast<int64_t>(c.top_k) * 16 < vocab;
    chosen = full_sort || few ? pick_full_sort(logits, c, step, scratch)
                              : pick_fast(logits, c, step, scratch);
  }
  r.token = chosen;
  if (c.logprobs)
    r.logprob = static_cast<float>(raw[chosen] - lse_raw);
  r.top = std::move(top_raw);
  return r;
}

}  // namespace

SampleResult sample(std::span<float> logits,
                    const SamplingConfig& c,
                    const PenaltyState& pen,
                    uint64_t step,
                    SamplerScratch& scratch,
                    std::span<const uint32_t> allowed) {
  return sample_impl(logits, c, pen, step, scratch, allowed, /*full_sort=*/false);
}

SampleResult sample_full_sort(std::span<float> logits,
                              const SamplingConfig& c,
                              const PenaltyState& pen,
                              uint64_t step,
                              SamplerScratch& scratch,
                              std::span<const uint32_t> allowed) {
  return sample_impl(logits, c, pen, step, scratch, allowed, /*full_sort=*/true);
}

}  // namespace dsinfer::sampling
