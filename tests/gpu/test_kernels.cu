// Test-only kernels: a deliberate illegal write (sticky-error handling) and the device side of
// the counter RNG (host/device equality).
#include <cstdint>

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

}  // namespace

void launch_illegal_write(cudaStream_t stream) {
  illegal_write_kernel<<<1, 32, 0, stream>>>(reinterpret_cast<int*>(uintptr_t{0x10}));
}

void launch_uniform_from(
    const uint64_t* seeds, const uint64_t* counters, double* out, int n, cudaStream_t stream) {
  uniform_kernel<<<(n + 255) / 256, 256, 0, stream>>>(seeds, counters, out, n);
}

}  // namespace dsinfer::cuda::test
