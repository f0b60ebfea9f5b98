// V4.1's Engram gate on the GPU (v41.h): one block per (token, stream), the twin of the gate
// loop of V41CpuModel::engram (the key-match sum is a tree sum here, serial there).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/v41.h"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) v41_engram_gate_kernel(V41EngramGateParams p) {
  __shared__ double dscratch[32];
  __shared__ float fscratch[32];
  const int64_t D = p.hidden;
  for (int64_t b = blockIdx.x; b < p.n * p.hc; b += gridDim.x) {
    const int64_t t = b / p.hc, k = b % p.hc;
    float* x = p.x + b * D;
    const float* key = p.kv + (t * (p.hc + 1) + k) * D;
    const float* value = p.kv + (t * (p.hc + 1) + p.hc) * D;
    const float* qk = p.qk + k * D;
    double sx = 0.0, sk = 0.0;
    float d = 0.0f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      sx += static_cast<double>(x[i]) * x[i];
      sk += static_cast<double>(key[i]) * key[i];
      d += x[i] * qk[i] * key[i];
    }
    sx = block_sum(sx, dscratch);
    sk = block_sum(sk, dscratch);
    d = block_sum(d, fscratch);
    const float rstd = (1.0f / sqrtf(static_cast<float>(sx / D) + p.eps)) *
                       (1.0f / sqrtf(static_cast<float>(sk / D) + p.eps));
    d = d * rstd * (1.0f / sqrtf(static_cast<float>(D)));
    const float s = copysignf(sqrtf(fmaxf(fabsf(d), 1e-6f)), d);
    const float g = 1.0f / (1.0f + expf(-s));
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) x[i] += g * value[i];
    __syncthreads();
  }
}

}  // namespace

Status launch_v41_engram_gate(const V41EngramGateParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("v41_engram_gate", {p.n, p.hidden}));
  DSI_RETURN_IF_ERROR(require(p.hc >= 1, "v41_engram_gate", "hc < 1"));
  if (p.n == 0 || p.hidden == 0)
    return Status();
  if (!p.x || !p.kv || !p.qk)
    return null_pointer("v41_engram_gate");
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.n * p.hc, 65535));
  v41_engram_gate_kernel<<<grid, kThreads, 0, stream>>>(p);
  return launched("v41_engram_gate launch");
}

}  // namespace dsinfer::cuda
