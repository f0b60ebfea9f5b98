// GPU sampling against the host sampler (sampling::sample) on the same logits, config, penalty
// state and step: greedy, temperature, top-k, top-p, min-p, penalties and their combinations,
// vocabularies 1 .. 129280 with heavy ties (quantised logits) and -inf entries, many seeds.
// The pick must be identical: the uniform draw is the same function (numeric/counter_rng.h) and
// the candidate order is exact; only the double sums are reduced in another order, which can
// change a pick only when u lands within ~1e-15 of a cumulative boundary (never seen here).
#include "kernels/cuda/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "sampling/sampler.h"
#include "test_util.h"
#include "unit/sampling/shaped_rows.h"

namespace dsinfer::cuda::test {
namespace {

struct Batch {
  std::vector<float> logits;  // [n, vocab]
  std::vector<sampling::SamplingConfig> configs;
  std::vector<sampling::PenaltyState> pens;
  std::vector<uint64_t> steps;
  // Optional per request: a token mask (empty = none; must allow a token of the vocabulary).
  std::vector<std::vector<uint32_t>> masks;
  bool reversed_rows = false;  // request r samples logits row n - 1 - r (SamplingRequest::row)
  // Optional per request: false = no logprob asked (SamplingRequest::logprobs); default true.
  std::vector<bool> logprobs;
};

void run_batch(const Batch& b, int64_t vocab, const std::string& what) {
  SCOPED_TRACE(what);
  const auto n = static_cast<int64_t>(b.configs.size());
  std::vector<SamplingRequest> reqs;
  std::vector<int64_t> pbegin{0};
  std::vector<int32_t> ptok, pcnt;
  const int64_t words = (vocab + 31) / 32;
  std::vector<uint32_t> allowed;
  auto row_of = [&](int64_t r) { return b.reversed_rows ? n - 1 - r : r; };
  auto mask_of = [&](int64_t r) -> std::span<const uint32_t> {
    if (static_cast<size_t>(r) >= b.masks.size())
      return {};
    return b.masks[r];
  };
  auto want_logprob = [&](int64_t r) {
    return static_cast<size_t>(r) >= b.logprobs.size() || b.logprobs[r];
  };
  for (int64_t r = 0; r < n; ++r) {
    const sampling::SamplingConfig& c = b.configs[r];
    reqs.push_back(SamplingRequest{.temperature = c.temperature,
                                   .top_p = c.top_p,
                                   .top_k = c.top_k,
                                   .min_p = c.min_p,
                                   .presence_penalty = c.presence_penalty,
                                   .frequency_penalty = c.frequency_penalty,
                                   .repetition_penalty = c.repetition_penalty,
                                   .seed = c.seed,
                                   .step = b.steps[r],
                                   .row = row_of(r)});
    reqs.back().logprobs = want_logprob(r);
    if (!mask_of(r).empty()) {
      reqs.back().mask_row = static_cast<int32_t>(allowed.size() / words);
      allowed.insert(allowed.end(), mask_of(r).begin(), mask_of(r).end());
      allowed.resize(allowed.size() + words - mask_of(r).size(), 0u);
    }
    std::map<int32_t, int32_t> entries;  // seen tokens with their output counts
    for (const auto& [tok, cnt] : b.pens[r].seen()) entries[tok] = 0;
    for (const auto& [tok, cnt] : b.pens[r].output_counts()) entries[tok] = cnt;
    for (const auto& [tok, cnt] : entries) {
      ptok.push_back(tok);
      pcnt.push_back(cnt);
    }
    pbegin.push_back(static_cast<int64_t>(ptok.size()));
  }
  if (ptok.empty()) {
    ptok.push_back(0);
    pcnt.push_back(0);
  }
  std::vector<uint8_t> req_bytes(reqs.size() * sizeof(SamplingRequest));
  std::memcpy(req_bytes.data(), reqs.data(), req_bytes.size());
  DevVec<float> d_logits(b.logits);
  DevVec<uint8_t> d_reqs(req_bytes);
  DevVec<int64_t> d_pb(pbegin);
  DevVec<int32_t> d_pt(ptok), d_pc(pcnt);
  if (allowed.empty())
    allowed.push_back(0);
  DevVec<uint32_t> d_allowed(allowed);
  const size_t ws = sample_workspace_bytes(n, vocab, /*full_sort=*/true);  // enough for both
  DevVec<double> d_ws(ws / 8 + 1);
  DevVec<int32_t> d_tok(static_cast<size_t>(n));
  DevVec<float> d_lp(static_cast<size_t>(n));
  for (const bool full_sort : {false, true}) {
    SCOPED_TRACE(full_sort ? "full sort" : "select");
    DSI_EXPECT_OK(launch_sample(
        SampleParams{.logits = d_logits.get(),
                     .n = n,
                     .vocab = vocab,
                     .requests = reinterpret_cast<const SamplingRequest*>(d_reqs.get()),
                     .penalty_begin = d_pb.get(),
                     .penalty_token = d_pt.get(),
                     .penalty_count = d_pc.get(),
                     .allowed = d_allowed.get(),
                     .allowed_words = words,
                     .workspace = d_ws.get(),
                     .workspace_bytes = ws,
                     .full_sort = full_sort,
                     .out_tokens = d_tok.get(),
                     .out_logprobs = d_lp.get()},
        nullptr));
    sync();
    const std::vector<int32_t> got = d_tok.download();
    const std::vector<float> lp = d_lp.download();
    for (int64_t r = 0; r < n; ++r) {
      const int64_t row = row_of(r);
      std::vector<float> l(b.logits.begin() + row * vocab, b.logits.begin() + (row + 1) * vocab);
      sampling::SamplingConfig c = b.configs[r];
      c.logprobs = true;
      sampling::SamplerScratch scratch;
      const sampling::SampleResult want =
          sampling::sample(l, c, b.pens[r], b.steps[r], scratch, mask_of(r));
      ASSERT_EQ(got[r], want.token) << "request " << r << " T " << c.temperature << " top_k "
                                    << c.top_k << " top_p " << c.top_p << " min_p " << c.min_p;
      if (want_logprob(r)) {
        EXPECT_NEAR(lp[r], want.logprob, 1e-5 * (1.0 + std::fabs(want.logprob)));
      } else {
        EXPECT_EQ(lp[r], 0.0f) << "request " << r << " asked for no logprob";
      }
    }
  }
}

std::vector<float> make_logits(int64_t vocab, int kind, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (auto& v : l) {
    v = nd(rng);
    if (kind == 1)
      v = std::round(v * 2.0f) / 2.0f;  // heavy ties
    if (kind == 2 && rng() % 4 == 0)
      v = -INFINITY;  // masked tokens
  }
  l[rng() % vocab] = 1.0f;  // at least one finite logit
  return l;
}

TEST_F(GpuTest, SamplingMatchesHostSampler) {
  std::mt19937 rng(7);
  uint64_t seed = 1;
  const bool small = small_mode();
  for (int64_t vocab : {1, 3, 7, 129, 733, 5000, 129280}) {
    Batch b;
    const int per_vocab = small && vocab > 5000 ? 8 : (vocab > 5000 ? 24 : 48);
    for (int i = 0; i < per_vocab; ++i) {
      const std::vector<float> l = make_logits(vocab, i % 3, rng);
      b.logits.insert(b.logits.end(), l.begin(), l.end());
      sampling::SamplingConfig c;
      c.seed = seed++;
      switch (i % 8) {
        case 0:
          c.temperature = 0.0f;  // greedy
          break;
        case 1:
          c.temperature = 0.7f;
          break;
        case 2:
          c.temperature = 1.3f;
          c.top_k = static_cast<int32_t>(1 + rng() % 50);
          break;
        case 3:
          c.temperature = 1.0f;
          c.top_p = 0.9f;
          break;
        case 4:
          c.temperature = 0.8f;
          c.min_p = 0.05f;
          break;
        case 5:
          c.temperature = 1.1f;
          c.top_k = 40;
          c.top_p = 0.95f;
          c.min_p = 0.02f;
          break;
        case 6:
          c.temperature = 1.0f;
          c.top_k = 1;  // greedy through top_k
          break;
        default:
          c.temperature = 2.5f;
          c.top_p = 0.3f;
          break;
      }
      sampling::PenaltyState pen;
      if (i % 2 == 1 && vocab > 3) {
        c.repetition_penalty = 1.3f;
        c.presence_penalty = 0.5f;
        c.frequency_penalty = 0.25f;
        std::vector<int32_t> prompt;
        for (int j = 0; j < 20; ++j) prompt.push_back(static_cast<int32_t>(rng() % vocab));
        pen.add_prompt(prompt);
        for (int j = 0; j < 10; ++j) pen.add_output(static_cast<int32_t>(rng() % vocab));
      }
      b.configs.push_back(c);
      b.pens.push_back(std::move(pen));
      b.steps.push_back(rng() % 1000);
      b.logprobs.push_back(i % 3 != 2);
    }
    run_batch(b, vocab, "vocab " + std::to_string(vocab));
  }
}

TEST_F(GpuTest, SamplingManyDrawsSameLogits) {
  // One distribution, many steps: every draw's pick must match (exercises the inverse CDF).
  std::mt19937 rng(11);
  const int64_t vocab = 1000;
  const std::vector<float> l = make_logits(vocab, 0, rng);
  Batch b;
  for (uint64_t step = 0; step < 512; ++step) {
    b.logits.insert(b.logits.end(), l.begin(), l.end());
    sampling::SamplingConfig c;
    c.temperature = 1.0f;
    c.top_p = step % 2 ? 0.8f : 1.0f;
    c.seed = 42;
    b.configs.push_back(c);
    b.pens.emplace_back();
    b.steps.push_back(step);
  }
  run_batch(b, vocab, "512 draws");
}

TEST_F(GpuTest, SamplingUnderTokenMasksAndRowIndirection) {
  // Structured outputs' masks (removed before penalties; logprobs of the model's own
  // distribution) with every sampling mode, requests reading their logits rows in reverse order,
  // some without a mask; masks that allow one token, a few, or most.
  std::mt19937 rng(23);
  for (int64_t vocab : {37, 5000, 129280}) {
    Batch b;
    b.reversed_rows = true;
    const int64_t words = (vocab + 31) / 32;
    for (int i = 0; i < 24; ++i) {
      const std::vector<float> l = make_logits(vocab, i % 2, rng);
      b.logits.insert(b.logits.end(), l.begin(), l.end());
      sampling::SamplingConfig c;
      c.seed = 900 + i;
      c.temperature = i % 4 == 0 ? 0.0f : 0.7f + 0.1f * static_cast<float>(i % 5);
      c.top_k = i % 3 == 1 ? 20 : 0;
      c.top_p = i % 5 == 2 ? 0.9f : 1.0f;
      c.min_p = i % 7 == 3 ? 0.05f : 0.0f;
      sampling::PenaltyState pen;
      if (i % 2 == 1) {
        c.repetition_penalty = 1.2f;
        c.frequency_penalty = 0.3f;
        for (int j = 0; j < 8; ++j) pen.add_output(static_cast<int32_t>(rng() % vocab));
      }
      std::vector<uint32_t> mask;
      if (i % 6 != 5) {
        mask.assign(static_cast<size_t>(words), 0u);
        const int64_t keep = i % 3 == 0 ? 1 : (i % 3 == 1 ? 1 + vocab / 50 : vocab - vocab / 4);
        for (int64_t k = 0; k < keep; ++k) {
          const int64_t t = static_cast<int64_t>(rng() % vocab);
          mask[t / 32] |= 1u << (t % 32);
        }
      }
      b.configs.push_back(c);
      b.pens.push_back(std::move(pen));
      b.steps.push_back(rng() % 1000);
      b.masks.push_back(std::move(mask));
    }
    run_batch(b, vocab, "masked, vocab " + std::to_string(vocab));
  }
}

using test_support::make_shaped_row;

TEST_F(GpuTest, SamplingRandomConfigsMatchHostAndFullSort) {
  // Random mixes of every option (greedy and sampled, temperature, top-k up to past the
  // vocabulary, top-p, min-p, penalties, masks, logprobs on and off) over row shapes that send the
  // select path's descents down both of their list paths; run_batch compares select and full sort
  // with the host sampler.
  std::mt19937 rng(31);
  const bool small = small_mode();
  for (int64_t vocab : {2, 50, 3000, 129280}) {
    Batch b;
    const int rows = vocab >= 129280 ? (small ? 8 : 40) : 96;
    const int64_t words = (vocab + 31) / 32;
    for (int i = 0; i < rows; ++i) {
      const std::vector<float> l = make_shaped_row(vocab, i % 7, rng);
      b.logits.insert(b.logits.end(), l.begin(), l.end());
      sampling::SamplingConfig c;
      const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.0f, 1.5f, 4.0f};
      const float top_ps[] = {1.0f, 1.0f, 0.99f, 0.9f, 0.5f, 0.05f};
      const float min_ps[] = {0.0f, 0.0f, 0.0f, 0.02f, 0.3f};
      const int64_t top_ks[] = {0, 0, 1, 2, 20, 50, vocab - 1, vocab, vocab + 3};
      c.temperature = temps[rng() % 7];
      c.top_p = top_ps[rng() % 6];
      c.min_p = min_ps[rng() % 5];
      c.top_k = static_cast<int32_t>(std::max<int64_t>(0, top_ks[rng() % 9]));
      c.seed = rng();
      sampling::PenaltyState pen;
      if (rng() % 3 == 0) {
        c.repetition_penalty = 1.4f;
        c.presence_penalty = 0.6f;
        c.frequency_penalty = 0.2f;
        std::vector<int32_t> prompt;
        for (int j = 0; j < 16; ++j) prompt.push_back(static_cast<int32_t>(rng() % vocab));
        pen.add_prompt(prompt);
        for (int j = 0; j < 8; ++j) pen.add_output(static_cast<int32_t>(rng() % vocab));
      }
      std::vector<uint32_t> mask;
      if (rng() % 4 == 0) {
        mask.assign(static_cast<size_t>(words), 0u);
        const int64_t keep = rng() % 2 ? 1 + vocab / 30 : vocab - vocab / 5;
        for (int64_t k = 0; k < keep; ++k) {
          const int64_t t = static_cast<int64_t>(rng() % vocab);
          mask[t / 32] |= 1u << (t % 32);
        }
      }
      b.configs.push_back(c);
      b.pens.push_back(std::move(pen));
      b.steps.push_back(rng() % 100000);
      b.masks.push_back(std::move(mask));
      b.logprobs.push_back(rng() % 2 == 0);
    }
    run_batch(b, vocab, "random configs, vocab " + std::to_string(vocab));
  }
}

// Microseconds per launch at DeepSeek V4's vocabulary (129280), 1 and 64 requests: greedy, top-p
// 0.9, top-k 50 + top-p 0.9, each with and without logprobs, select and full sort. Prints only
// (for the lead's H200 runs: --gtest_filter='*SamplingTimings*'); skipped in small mode.
TEST_F(GpuTest, SamplingTimings) {
  if (small_mode())
    GTEST_SKIP() << "timings skipped in small mode";
  const int64_t vocab = 129280;
  struct Case {
    const char* name;
    float temperature;
    float top_p;
    int32_t top_k;
  };
  const Case cases[] = {{"greedy", 0.0f, 1.0f, 0},
                        {"top-p 0.9", 1.0f, 0.9f, 0},
                        {"top-k 50 + top-p 0.9", 1.0f, 0.9f, 50},
                        {"temperature 0.8 only", 0.8f, 1.0f, 0}};
  for (int64_t n : {1, 64}) {
    DevVec<float> logits(normal_floats(static_cast<size_t>(n * vocab), 8, 3.0f));
    const size_t ws = sample_workspace_bytes(n, vocab, /*full_sort=*/true);  // enough for both
    DevVec<double> d_ws(ws / 8 + 1);
    DevVec<int32_t> toks(static_cast<size_t>(n));
    DevVec<float> lps(static_cast<size_t>(n));
    for (const Case& k : cases) {
      for (const bool logprobs : {false, true}) {
        std::vector<SamplingRequest> reqs(static_cast<size_t>(n));
        for (size_t r = 0; r < reqs.size(); ++r) {
          reqs[r].temperature = k.temperature;
          reqs[r].top_p = k.top_p;
          reqs[r].top_k = k.top_k;
          reqs[r].seed = 100 + r;
          reqs[r].step = 7;
          reqs[r].logprobs = logprobs;
        }
        std::vector<uint8_t> bytes(reqs.size() * sizeof(SamplingRequest));
        std::memcpy(bytes.data(), reqs.data(), bytes.size());
        DevVec<uint8_t> d_reqs(bytes);
        for (const bool full_sort : {false, true}) {
          auto launch = [&] {
            DSI_EXPECT_OK(launch_sample(
                SampleParams{.logits = logits.get(),
                             .n = n,
                             .vocab = vocab,
                             .requests = reinterpret_cast<const SamplingRequest*>(d_reqs.get()),
                             .workspace = d_ws.get(),
                             .workspace_bytes = ws,
                             .full_sort = full_sort,
                             .out_tokens = toks.get(),
                             .out_logprobs = lps.get()},
                nullptr));
          };
          launch();  // warm-up
          sync();
          const int reps = 20;
          cudaEvent_t e0, e1;
          ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
          ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
          ASSERT_EQ(cudaEventRecord(e0, nullptr), cudaSuccess);
          for (int i = 0; i < reps; ++i) launch();
          ASSERT_EQ(cudaEventRecord(e1, nullptr), cudaSuccess);
          ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
          float ms = 0.0f;
          ASSERT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
          cudaEventDestroy(e0);
          cudaEventDestroy(e1);
          std::printf("sampling timing vocab %lld n %2lld %-22s logprobs %-3s %-9s: %9.1f us\n",
                      static_cast<long long>(vocab),
                      static_cast<long long>(n),
                      k.name,
                      logprobs ? "on" : "off",
                      full_sort ? "full sort" : "select",
                      1000.0 * ms / reps);
        }
      }
    }
  }
}

// The chained drafting's greedy picks (launch_greedy_pick: no request blob, graph-capturable)
// are the bits a greedy request with logprobs gets from launch_sample: the first maximum under
// heavy ties and -inf entries, the same log-softmax, rows of a wider matrix (ld), the tokens
// also written to `next`.
TEST_F(GpuTest, GreedyPickEqualsGreedySampling) {
  std::mt19937 rng(41);
  for (const int64_t vocab :
       {int64_t{1}, int64_t{7}, int64_t{1500}, int64_t{5001}, int64_t{8192}, int64_t{129280}}) {
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " kind " + std::to_string(kind));
      const int64_t n = 5;
      const int64_t ld = vocab + (kind == 1 ? 3 : 0);
      std::vector<float> logits(static_cast<size_t>(n * ld), -7.0f);
      for (int64_t r = 0; r < n; ++r) {
        const std::vector<float> row = make_logits(vocab, kind, rng);
        std::copy(row.begin(), row.end(), logits.begin() + r * ld);
      }
      std::vector<SamplingRequest> reqs(static_cast<size_t>(n));
      for (SamplingRequest& q : reqs) q.temperature = 0.0f;
      std::vector<uint8_t> req_bytes(reqs.size() * sizeof(SamplingRequest));
      std::memcpy(req_bytes.data(), reqs.data(), req_bytes.size());
      DevVec<float> d_logits(logits);
      DevVec<uint8_t> d_reqs(req_bytes);
      const size_t ws = sample_workspace_bytes(n, vocab);
      DevVec<double> d_ws(ws / 8 + 1);
      DevVec<int32_t> d_tok(static_cast<size_t>(n)), d_pick(static_cast<size_t>(n)),
          d_next(static_cast<size_t>(n));
      DevVec<float> d_lp(static_cast<size_t>(n)), d_pick_lp(static_cast<size_t>(n));
      DSI_EXPECT_OK(launch_sample(
          SampleParams{.logits = d_logits.get(),
                       .ld = ld,
                       .n = n,
                       .vocab = vocab,
                       .requests = reinterpret_cast<const SamplingRequest*>(d_reqs.get()),
                       .workspace = d_ws.get(),
                       .workspace_bytes = ws,
                       .out_tokens = d_tok.get(),
                       .out_logprobs = d_lp.get()},
          nullptr));
      DSI_EXPECT_OK(launch_greedy_pick(GreedyPickParams{.logits = d_logits.get(),
                                                        .ld = ld,
                                                        .n = n,
                                                        .vocab = vocab,
                                                        .tokens = d_pick.get(),
                                                        .logprobs = d_pick_lp.get(),
                                                        .next = d_next.get()},
                                       nullptr));
      sync();
      const std::vector<int32_t> want = d_tok.download();
      EXPECT_EQ(d_pick.download(), want);
      EXPECT_EQ(d_next.download(), want);
      const std::vector<float> pick_lp = d_pick_lp.download();
      const std::vector<float> want_lp = d_lp.download();
      for (int64_t r = 0; r < n; ++r) {  // the double sums in another order
        EXPECT_NEAR(pick_lp[r], want_lp[r], 1e-6 * std::max(1.0f, std::fabs(want_lp[r])))
            << "row " << r;
      }
      for (int64_t r = 0; r < n; ++r) {
        const float* row = logits.data() + r * ld;
        EXPECT_EQ(want[r], std::max_element(row, row + vocab) - row) << "row " << r;
      }
    }
  }
}

// Deferred drafts into a verification's token rows (launch_scatter_tokens) against the host's
// dst[dst_index[i]] = src[src_index[i]], over sizes past one block and the kernel's grid cap.
TEST_F(GpuTest, ScatterTokensEqualsHost) {
  std::mt19937 rng(43);
  for (const int64_t n : {int64_t{1}, int64_t{5}, int64_t{129}, int64_t{20000}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const int64_t rows = 2 * n + 3;
    std::vector<int32_t> src(static_cast<size_t>(n + 7)), dst(static_cast<size_t>(rows));
    for (int32_t& v : src) v = static_cast<int32_t>(rng() % 129280);
    for (int32_t& v : dst) v = -1;
    std::vector<int32_t> src_index(static_cast<size_t>(n)), dst_index(static_cast<size_t>(rows));
    for (int32_t& v : src_index) v = static_cast<int32_t>(rng() % src.size());
    for (int64_t r = 0; r < rows; ++r) dst_index[static_cast<size_t>(r)] = static_cast<int32_t>(r);
    std::shuffle(dst_index.begin(), dst_index.end(), rng);
    dst_index.resize(static_cast<size_t>(n));  // distinct rows, some left as they were
    std::vector<int32_t> want = dst;
    for (int64_t i = 0; i < n; ++i)
      want[static_cast<size_t>(dst_index[static_cast<size_t>(i)])] =
          src[static_cast<size_t>(src_index[static_cast<size_t>(i)])];
    DevVec<int32_t> d_src(src), d_src_index(src_index), d_dst(dst), d_dst_index(dst_index);
    DSI_EXPECT_OK(launch_scatter_tokens(
        d_src.get(), d_src_index.get(), d_dst.get(), d_dst_index.get(), n, nullptr));
    sync();
    EXPECT_EQ(d_dst.download(), want);
  }
  EXPECT_TRUE(launch_scatter_tokens(nullptr, nullptr, nullptr, nullptr, 0, nullptr).ok());
  int32_t t = 0;
  EXPECT_EQ(launch_scatter_tokens(&t, nullptr, &t, &t, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST(GpuOpsArgs, SamplingValidates) {
  EXPECT_TRUE(launch_sample(SampleParams{.n = 0, .vocab = 10}, nullptr).ok());
  EXPECT_EQ(launch_sample(SampleParams{.n = 1, .vocab = 10}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sample_workspace_bytes(0, 10), 0u);
  EXPECT_GE(sample_workspace_bytes(2, 129280), 2u * 129280u * 26u);
  EXPECT_GE(sample_workspace_bytes(2, 129280, true), 2u * 129280u * 28u);
  EXPECT_TRUE(launch_greedy_pick(GreedyPickParams{.n = 0, .vocab = 10}, nullptr).ok());
  EXPECT_EQ(launch_greedy_pick(GreedyPickParams{.n = 1, .vocab = 10}, nullptr).code(),
            StatusCode::kInvalidArgument);
  float f = 0.0f;
  int32_t t = 0;
  EXPECT_EQ(launch_greedy_pick(
                GreedyPickParams{
                    .logits = &f, .ld = 4, .n = 1, .vocab = 10, .tokens = &t, .logprobs = &f},
                nullptr)
                .code(),
            StatusCode::kInvalidArgument);  // ld < vocab
}

}  // namespace
}  // namespace dsinfer::cuda::test
