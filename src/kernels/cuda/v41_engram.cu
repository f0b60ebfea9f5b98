// V4.1's Engram gate on the GPU (v41.h): one block per (token, stream), the twin of the gate
// loop of V41CpuModel::engram. The key-match sum d is taken in double (products and sum), so it is
// the nearly exact value whatever the reduction order (the CPU sums float products serially); the
// rest is the CPU's float arithmetic in the CPU's order with explicit round-to-nearest intrinsics
// (no FMA contraction), and the sigmoid's exp is computed in double and rounded, which matches
// glibc's expf (about half an ulp) far more often than CUDA's expf (2 ulp) does. The gate
// multiplies values that then cancel against x, so an ulp of g shows as a large relative error in
// small outputs.
//
// The gather of Engram rows from tables in device memory: one thread per output value, the
// host's conversions (numeric/float_formats.h, shared with the CPU) and one rounded multiply.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/v41.h"
#include "numeric/float_formats.h"
#include "tensor/dtype.h"

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

constexpr int kGatherThreads = 256;

// value * scale as the host build's EngramTable::row gives it on x86: a NaN operand comes out as
// is, the scale's when both are NaN (the compiled multiply takes the scale as its first operand;
// the GPU's own multiply would return the canonical NaN).
__device__ __forceinline__ float host_mul(float value, float scale) {
  if (isnan(scale))
    return scale;
  if (isnan(value))
    return value;
  return __fmul_rn(value, scale);
}

__global__ void __launch_bounds__(kGatherThreads)
    v41_engram_gather_kernel(V41EngramGatherParams p) {
  const int64_t total = p.n * p.dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = p.rows[i / p.dim], c = i % p.dim;
    const int64_t e = r * p.dim + c;
    float v;
    if (p.fp8) {
      const uint8_t q = static_cast<const uint8_t*>(p.data)[e];
      const uint8_t s = p.scale[r * (p.dim / 32) + c / 32];
      v = host_mul(numeric::fp8_e4m3_to_f32(q), numeric::e8m0_to_f32(s));
    } else if (p.dtype == static_cast<int>(DType::kF32)) {
      v = static_cast<const float*>(p.data)[e];
    } else if (p.dtype == static_cast<int>(DType::kBF16)) {
      v = numeric::bf16_to_f32(static_cast<const uint16_t*>(p.data)[e]);
    } else if (p.dtype == static_cast<int>(DType::kF16)) {
      v = numeric::f16_to_f32(static_cast<const uint16_t*>(p.data)[e]);
    } else {
      v = numeric::fp8_e4m3_to_f32(static_cast<const uint8_t*>(p.data)[e]);
    }
    p.out[i] = v;
  }
}

}  // namespace

Status launch_v41_engram_gather(const V41EngramGatherParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("v41_engram_gather", {p.n, p.dim, p.table_rows}));
  if (p.fp8) {
    DSI_RETURN_IF_ERROR(
        require(p.dim % 32 == 0, "v41_engram_gather", "FP8 rows not a multiple of 32 wide"));
  } else if (p.dtype != static_cast<int>(DType::kF32) &&
             p.dtype != static_cast<int>(DType::kBF16) &&
             p.dtype != static_cast<int>(DType::kF16) &&
             p.dtype != static_cast<int>(DType::kF8E4M3)) {
    return unimplemented(std::string("v41_engram_gather: tables of dtype ") +
                         dtype_name(static_cast<DType>(p.dtype)));
  }
  if (p.n == 0 || p.dim == 0)
    return Status();
  if (!p.data || !p.rows || !p.out || (p.fp8 && !p.scale))
    return null_pointer("v41_engram_gather");
  const int64_t blocks = ceil_div(p.n * p.dim, kGatherThreads);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks, 65535));
  v41_engram_gather_kernel<<<grid, kGatherThreads, 0, stream>>>(p);
  return launched("v41_engram_gather launch");
}

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
