// The host sampler (sampling/sampler.h) at DeepSeek V4's vocabulary: sample (radix-sorted keys)
// against sample_full_sort (the first implementation) for one and 64 rows per step, top-p 0.9,
// top-k 50 + top-p, min-p and temperature only. Run by hand:
//   build/bin/sampler_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "sampling/sampler.h"

namespace {

using dsinfer::sampling::PenaltyState;
using dsinfer::sampling::SamplerScratch;
using dsinfer::sampling::SamplingConfig;

constexpr int64_t kVocab = 129280;

// args: rows per step, mode (0 top-p 0.9, 1 top-k 50 + top-p 0.9, 2 min-p 0.05, 3 temperature
// only), full sort (0/1)
void BM_HostSample(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int64_t mode = state.range(1);
  const bool full_sort = state.range(2) != 0;
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(rows * kVocab));
  for (float& v : logits) v = nd(g);
  SamplingConfig c;
  c.temperature = 0.8f;
  c.seed = 3;
  c.top_p = mode <= 1 ? 0.9f : 1.0f;
  c.top_k = mode == 1 ? 50 : 0;
  c.min_p = mode == 2 ? 0.05f : 0.0f;
  const PenaltyState pen;
  SamplerScratch scratch;
  std::vector<float> work(static_cast<size_t>(kVocab));
  uint64_t step = 0;
  for (auto _ : state) {
    for (int64_t r = 0; r < rows; ++r) {
      work.assign(logits.begin() + r * kVocab, logits.begin() + (r + 1) * kVocab);
      const auto res = full_sort ? dsinfer::sampling::sample_full_sort(work, c, pen, step, scratch)
                                 : dsinfer::sampling::sample(work, c, pen, step, scratch);
      benchmark::DoNotOptimize(res.token);
    }
    ++step;
  }
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_HostSample)
    ->ArgsProduct({{1, 64}, {0, 1, 2, 3}, {0, 1}})
    ->ArgNames({"rows", "mode", "full_sort"})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
