// Random GEMM operands (fill.h): one tiny grid-stride kernel, integer bit patterns only (no FP8
// headers, nothing to instantiate).
#include <cstdint>

#include "device/device_error.h"
#include "perf/fill.h"

namespace dsinfer::perf {
namespace {

__device__ uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void fill_kernel(void* p, int64_t n, bool bf16, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint64_t r = mix64(seed ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull));
    const uint32_t sign = static_cast<uint32_t>(r & 1u);
    const uint32_t e = static_cast<uint32_t>((r >> 1) & 3u);  // 0..3
    const uint32_t man = static_cast<uint32_t>(r >> 8);
    if (bf16) {
      // bf16: 1 sign, 8 exponent (bias 127), 7 mantissa bits; exponent 125..128.
      static_cast<uint16_t*>(p)[i] =
          static_cast<uint16_t>((sign << 15) | ((125u + e) << 7) | (man & 0x7Fu));
    } else {
      // E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent field 5..8 (never NaN).
      static_cast<uint8_t*>(p)[i] =
          static_cast<uint8_t>((sign << 7) | ((5u + e) << 3) | (man & 7u));
    }
  }
}

}  // namespace

Status fill_random(void* p, int64_t n, GemmInput t, uint64_t seed, cudaStream_t stream) {
  if (n < 0)
    return invalid_argument("fill_random: negative size " + std::to_string(n));
  if (n == 0)
    return Status();
  if (p == nullptr)
    return invalid_argument("fill_random: null device pointer");
  const int threads = 256;
  const int64_t want = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 4096 ? want : 4096);
  fill_kernel<<<blocks, threads, 0, stream>>>(p, n, t == GemmInput::kBf16, seed);
  return device::check_launch("fill_random");
}

}  // namespace dsinfer::perf
