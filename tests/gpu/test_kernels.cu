// Test-only kernels: a deliberate illegal write (sticky-error handling), the device side of
// the counter RNG (host/device equality), and the hardware FP8 rounding against the software one.
#include <cstdint>

#include "kernels/cuda/quant.cuh"
#include "numeric/counter_rng.h"

namespace dsinfer::cuda::test {
namespace {

__global__ void illegal_write_kernel(int* p) {
  p[threadIdx.x] = 1;  // p is an invalid address
}

__global__ void uniform_kernel(const uint64_t* seeds,
                               const uint64_t* counters,
                               double* out,
                               int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = rng::uniform_from(seeds[i], counters[i]);
}

// Counts, over every fp32 bit pattern x (grid-stride over 2^32), the inputs where quant.cuh's
// hardware conversions differ from the software ones of numeric/float_formats.h:
//   [0] the code of clamp(x): fp8_code_clamped against f32_to_fp8_e4m3(clamp_sym(x, 448));
//   [1] the decoded code: fp8_decode against fp8_e4m3_to_f32 (bits; the NaN codes included);
//   [2] the simulated value at scale s: fp8_sim_value(x, s, 1 / s) against
//       fp8_e4m3_to_f32(f32_to_fp8_e4m3(clamp_sym(x / s, 448))) * s (bits).
// The first mismatching input of each kind goes to first[kind].
__global__ void fp8_rounding_kernel(float s, unsigned long long* bad, uint32_t* first) {
  const float inv_s = 1.0f / s;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float x = __uint_as_float(u);
    const uint8_t hw = fp8_code_clamped(x);
    const uint8_t sw = numeric::f32_to_fp8_e4m3(clamp_sym(x, numeric::kFp8Max));
    const bool bad_code = hw != sw;
    const bool bad_decode =
        __float_as_uint(fp8_decode(sw)) != __float_as_uint(numeric::fp8_e4m3_to_f32(sw));
    const float want =
        numeric::fp8_e4m3_to_f32(numeric::f32_to_fp8_e4m3(clamp_sym(x / s, numeric::kFp8Max))) * s;
    const bool bad_value = __float_as_uint(fp8_sim_value(x, s, inv_s)) != __float_as_uint(want);
    const bool fails[3] = {bad_code, bad_decode, bad_value};
    for (int k = 0; k < 3; ++k) {
      if (fails[k]) {
        atomicAdd(bad + k, 1ull);
        atomicCAS(first + k, 0xffffffffu, u);
      }
    }
  }
}

}  // namespace

void launch_fp8_rounding_check(float s,
                               unsigned long long* bad,
                               uint32_t* first,
                               cudaStream_t stream) {
  fp8_rounding_kernel<<<2048, 256, 0, stream>>>(s, bad, first);
}

void launch_illegal_write(cudaStream_t stream) {
  illegal_write_kernel<<<1, 32, 0, stream>>>(reinterpret_cast<int*>(uintptr_t{0x10}));
}

void launch_uniform_from(
    const uint64_t* seeds, const uint64_t* counters, double* out, int n, cudaStream_t stream) {
  uniform_kernel<<<(n + 255) / 256, 256, 0, stream>>>(seeds, counters, out, n);
}

}  // namespace dsinfer::cuda::test
