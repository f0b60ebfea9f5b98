// The CPU forwards' dot product: eight running partial sums (vectorisable without -ffast-math,
// and closer to a blocked GEMM's summation order than one serial chain), then their fixed sum.
#pragma once

#include <cstdint>

namespace dsinfer::cpu {

inline float dot8(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace dsinfer::cpu
