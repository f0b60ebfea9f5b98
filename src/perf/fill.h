// Pseudo-random GEMM operands on the device (the ceilings must not run on zeros: a tensor core
// fed constant data draws less power and clocks higher than on real weights).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "perf/lt_gemm.h"

namespace dsinfer::perf {

// Writes n elements of type `t` at p: random sign, magnitude in [0.25, 4) (E4M3: exponent field
// 5..8, any mantissa; BF16: 2^-2..2^1 with a random 7-bit mantissa), a function of (seed, index).
// Asynchronous on `stream`; the launch status through device::check_launch.
Status fill_random(void* p, int64_t n, GemmInput t, uint64_t seed, cudaStream_t stream);

}  // namespace dsinfer::perf
