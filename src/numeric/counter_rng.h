// Counter-based uniform draws shared by the host sampler and the GPU sampling kernels: a pure
// function of (seed, counter), so a request's draw for step s is the same wherever it is computed
// and does not depend on batch composition. Header-only, DSI_HD: callable from CUDA device code.
#pragma once

#include <cstdint>

#include "numeric/float_formats.h"  // DSI_HD

namespace dsinfer::rng {

// splitmix64 over a mix of seed and counter (two rounds), then the top 53 bits as a double in
// [0, 1). Every operation is exact integer arithmetic plus one exact int->double conversion and
// one multiplication by 2^-53, so host and device return identical bits.
DSI_HD double uniform_from(uint64_t seed, uint64_t counter) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ULL + (counter + 1) * 0xbf58476d1ce4e5b9ULL;
  for (int i = 0; i < 2; ++i) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
  }
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

}  // namespace dsinfer::rng
