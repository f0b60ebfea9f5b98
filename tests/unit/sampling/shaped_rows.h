// Logit rows of chosen shapes for the sampling tests (the GPU kernels against the host sampler,
// and tools/cuda_emu's CPU emulation of them): 0 normal, 1 quantised (heavy ties), 2 with -inf,
// 3 all equal (one bucket: the long-list radix path), 4 two values only, 5 a narrow range around
// one value with an outlier every `outlier_period` tokens on average, 6 a wide range (weights
// underflow to 0). One logit is set to 1 so that every row has a finite one.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace dsinfer::test_support {

inline std::vector<float> make_shaped_row(int64_t vocab,
                                          int kind,
                                          std::mt19937& rng,
                                          uint32_t outlier_period = 1000) {
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (auto& v : l) {
    const float x = nd(rng);
    switch (kind) {
      case 1:
        v = std::round(x * 2.0f) / 2.0f;
        break;
      case 2:
        v = rng() % 3 == 0 ? -INFINITY : x;
        break;
      case 3:
        v = 0.75f;
        break;
      case 4:
        v = rng() % 2 ? 1.0f : -1.0f;
        break;
      case 5:
        v = rng() % outlier_period == 0 ? x * 10.0f : 2.0f + x * 1e-4f;
        break;
      case 6:
        v = x * 200.0f;
        break;
      default:
        v = x;
        break;
    }
  }
  l[rng() % static_cast<uint64_t>(vocab)] = 1.0f;
  return l;
}

}  // namespace dsinfer::test_support
