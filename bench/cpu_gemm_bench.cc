// The fast CPU path's GEMM (kernels/cpu/fast/gemm.h) at the bundled model's shapes: multiply-adds
// per second for BF16 and F32 weights, 1 to 512 tokens, one thread and the pool. Run by hand:
//   build/bench/cpu_gemm_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/fast/gemm.h"
#include "kernels/cpu/fast/thread_pool.h"

namespace {

using dsinfer::cpu::fast::WeightElem;
using dsinfer::cpu::fast::WeightView;

// args: rows, cols, tokens, bf16 (0/1), threads (0 = the calling thread only)
void BM_FastGemm(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), n = state.range(2);
  const bool bf16 = state.range(3) != 0;
  const int threads = static_cast<int>(state.range(4));
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> w32(static_cast<size_t>(rows * cols));
  std::vector<uint16_t> w16(w32.size());
  for (size_t i = 0; i < w32.size(); ++i) {
    w32[i] = u(g);
    w16[i] = static_cast<uint16_t>(g() & 0x3fff);
  }
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = u(g);
  std::vector<float> y(static_cast<size_t>(n * rows));
  WeightView v{bf16 ? WeightElem::kBF16 : WeightElem::kF32,
               bf16 ? static_cast<const void*>(w16.data()) : w32.data(),
               rows,
               cols,
               cols};
  dsinfer::cpu::fast::ThreadPool pool(threads > 0 ? threads : 1);
  for (auto _ : state) {
    dsinfer::cpu::fast::gemm(v, x.data(), cols, n, y.data(), rows, threads > 0 ? &pool : nullptr);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["MAC/s"] = benchmark::Counter(static_cast<double>(rows * cols * n),
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(dsinfer::cpu::fast::gemm_isa());
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {1, 8, 64, 512}) {
    b->Args({256, 256, n, 1, 0});   // expert / attention projections (BF16 from FP8/MXFP4)
    b->Args({8192, 256, n, 1, 0});  // LM head (BF16)
    b->Args({8192, 256, n, 1, 2});  // the same on two threads
    b->Args({24, 1024, n, 0, 0});   // mHC mixing (F32)
  }
}
BENCHMARK(BM_FastGemm)->Apply(shapes)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
