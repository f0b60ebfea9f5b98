// Runs sampling.cu's kernels (select and full sort) on the CPU emulation (emu_shim.h) over random
// rows and configs (row shapes with ties, -inf, one value, narrow and wide ranges; greedy,
// temperature, top-k, top-p, min-p, penalties, masks, logprobs on and off) and compares each
// pick and logprob with the host sampler. Usage: sampling_emu_test SEED [VOCAB...].
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "kernels/cuda/sampling.h"
#include "sampling/sampler.h"
#include "unit/sampling/shaped_rows.h"

namespace dsinfer::cuda {
void emu_sample(const SampleParams& p, int grid);
}
using namespace dsinfer;

int main(int argc, char** argv) {
  std::mt19937 rng(argc > 1 ? atoi(argv[1]) : 5);
  int bad = 0, total = 0;
  std::vector<int64_t> vocabs = {1, 2, 7, 50, 129, 733, 2500, 9000};
  if (argc > 2) {
    vocabs.clear();
    for (int a = 2; a < argc; ++a) vocabs.push_back(atoll(argv[a]));
  }
  for (int64_t vocab : vocabs) {
    const int n = vocab >= 9000 ? 6 : 24;
    std::vector<float> logits;
    std::vector<sampling::SamplingConfig> cfgs;
    std::vector<sampling::PenaltyState> pens(n);
    std::vector<std::vector<uint32_t>> masks(n);
    std::vector<cuda::SamplingRequest> reqs;
    std::vector<int64_t> pbegin{0};
    std::vector<int32_t> ptok, pcnt;
    std::vector<uint32_t> allowed;
    const int64_t words = (vocab + 31) / 32;
    for (int i = 0; i < n; ++i) {
      auto l = test_support::make_shaped_row(vocab, i % 7, rng, 100);
      logits.insert(logits.end(), l.begin(), l.end());
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
      if (rng() % 3 == 0 && vocab > 3) {
        c.repetition_penalty = 1.4f;
        c.presence_penalty = 0.6f;
        c.frequency_penalty = 0.2f;
        std::vector<int32_t> prompt;
        for (int j = 0; j < 16; ++j) prompt.push_back(rng() % vocab);
        pens[i].add_prompt(prompt);
        for (int j = 0; j < 8; ++j) pens[i].add_output(rng() % vocab);
      }
      if (rng() % 4 == 0) {
        masks[i].assign(words, 0u);
        const int64_t keep = rng() % 2 ? 1 + vocab / 30 : vocab - vocab / 5;
        for (int64_t k = 0; k < keep; ++k) {
          const int64_t t = rng() % vocab;
          masks[i][t / 32] |= 1u << (t % 32);
        }
      }
      c.logprobs = rng() % 2 == 0;
      cfgs.push_back(c);
      cuda::SamplingRequest r{.temperature = c.temperature,
                              .top_p = c.top_p,
                              .top_k = c.top_k,
                              .min_p = c.min_p,
                              .presence_penalty = c.presence_penalty,
                              .frequency_penalty = c.frequency_penalty,
                              .repetition_penalty = c.repetition_penalty,
                              .seed = c.seed,
                              .step = static_cast<uint64_t>(rng() % 100000),
                              .row = i};
      r.logprobs = c.logprobs;
      if (!masks[i].empty()) {
        r.mask_row = static_cast<int32_t>(allowed.size() / words);
        allowed.insert(allowed.end(), masks[i].begin(), masks[i].end());
      }
      std::map<int32_t, int32_t> entries;
      for (const auto& [tok, cnt] : pens[i].seen()) entries[tok] = 0;
      for (const auto& [tok, cnt] : pens[i].output_counts()) entries[tok] = cnt;
      for (const auto& [tok, cnt] : entries) {
        ptok.push_back(tok);
        pcnt.push_back(cnt);
      }
      pbegin.push_back(ptok.size());
      reqs.push_back(r);
    }
    if (allowed.empty())
      allowed.push_back(0);
    if (ptok.empty()) {
      ptok.push_back(0);
      pcnt.push_back(0);
    }
    const size_t ws = cuda::sample_workspace_bytes(n, vocab, true);
    std::vector<double> wsbuf(ws / 8 + 1);
    for (bool full_sort : {false, true}) {
      std::vector<int32_t> tok(n, -7);
      std::vector<float> lp(n, -7.0f);
      cuda::SampleParams p{.logits = logits.data(),
                           .n = n,
                           .vocab = vocab,
                           .requests = reqs.data(),
                           .penalty_begin = pbegin.data(),
                           .penalty_token = ptok.data(),
                           .penalty_count = pcnt.data(),
                           .allowed = allowed.data(),
                           .allowed_words = words,
                           .workspace = wsbuf.data(),
                           .workspace_bytes = ws,
                           .full_sort = full_sort,
                           .out_tokens = tok.data(),
                           .out_logprobs = lp.data()};
      cuda::emu_sample(p, vocab % 2 ? 1 : 2);
      for (int i = 0; i < n; ++i) {
        std::vector<float> l(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
        sampling::SamplingConfig c = cfgs[i];
        c.logprobs = true;
        sampling::SamplerScratch sc;
        const auto want = sampling::sample(l, c, pens[i], reqs[i].step, sc, masks[i]);
        ++total;
        const bool lp_ok = cfgs[i].logprobs ? std::fabs(lp[i] - want.logprob) <=
                                                  1e-5 * (1 + std::fabs(want.logprob))
                                            : lp[i] == 0.0f;
        if (tok[i] != want.token || !lp_ok) {
          ++bad;
          std::printf(
              "MISMATCH vocab %lld row %d %s: got %d want %d (lp %g vs %g) T %g k %d p %g minp %g "
              "kind %d mask %d\n",
              (long long)vocab,
              i,
              full_sort ? "sort" : "select",
              tok[i],
              want.token,
              lp[i],
              want.logprob,
              c.temperature,
              c.top_k,
              c.top_p,
              c.min_p,
              i % 7,
              !masks[i].empty());
        }
      }
    }
    std::printf("vocab %lld done (%d bad of %d)\n", (long long)vocab, bad, total);
    std::fflush(stdout);
  }
  return bad != 0;
}
