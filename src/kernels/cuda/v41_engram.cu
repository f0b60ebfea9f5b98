// V4.1's Engram gate on the GPU (v41.h): one block per (token, stream), the twin of the gate
// loop of V41CpuModel::engram. The key-match sum d is taken in double (products and sum), so it is
// the nearly exact value whatever the reduction order (the CPU sums float products serially); the
// rest is the CPU's float arithmetic in the CPU's order with explicit round-to-nearest intrinsics
// (no FMA contraction), and the sigmoid's exp is computed in double and rounded, which matches
// glibc's expf (about half an ulp) far more often than CUDA's expf (2 ulp) does. The gate
// multiplies values that then cancel against x, so an ulp of g shows as a large relative error in
// small outputs.
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
  const int64_t D = p.hidden;
  for (int64_t b = blockIdx.x; b < p.n * p.hc; b += gridDim.x) {
    const int64_t t = b / p.hc, k = b % p.hc;
    float* x = p.x + b * D;
    const float* key = p.kv + (t * (p.hc + 1) + k) * D;
    const float* value = p.kv + (t * (p.hc + 1) + p.hc) * D;
    const float* qk = p.qk + k * D;
    double sx = 0.0, sk = 0.0, dd = 0.0;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      sx += static_cast<double>(x[i]) * x[i];
      sk += static_cast<double>(key[i]) * key[i];
      dd += static_cast<double>(x[i]) * qk[i] * key[i];
    }
    sx = block_sum(sx, dscratch);
    sk = block_sum(sk, dscratch);
    dd = block_sum(dd, dscratch);
    const float rstd =
        __fmul_rn(__fdiv_rn(1.0f, sqrtf(__fadd_rn(static_cast<float>(sx / D), p.eps))),
                  __fdiv_rn(1.0f, sqrtf(__fadd_rn(static_cast<float>(sk / D), p.eps))));
    const float d = __fmul_rn(__fmul_rn(static_cast<float>(dd), rstd),
                              __fdiv_rn(1.0f, sqrtf(static_cast<float>(D))));
    const float s = copysignf(sqrtf(fmaxf(fabsf(d), 1e-6f)), d);
    const float e = static_cast<float>(exp(-static_cast<double>(s)));
    const float g = __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
      x[i] = __fadd_rn(x[i], __fmul_rn(g, value[i]));
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
