// Row-wise kernels: embedding gather, RMSNorm, RoPE, quantisation simulations, Hadamard. Thin
// launchers; the arithmetic mirrors kernels/cpu/ops.cc and numeric/quant.cc operation by
// operation (explicit __fmul_rn/__fadd_rn where the CPU's order must be kept without FMA
// contraction).
#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/quant.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

unsigned grid_1d(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>(work, 1, kMaxBlocks));
}

__global__ void embed_kernel(EmbedParams p) {
  const int64_t cols = p.table.cols;
  for (int64_t t = blockIdx.y; t < p.n; t += gridDim.y) {
    const int32_t tok = p.tokens[t];
    const bool valid = tok >= 0 && tok < p.table.rows;
    float* o = p.out + t * p.copies * cols;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const float v = valid ? load_weight(p.table, tok, c) : __int_as_float(0x7fc00000);
      for (int64_t j = 0; j < p.copies; ++j) o[j * cols + c] = v;
    }
  }
}

__global__ void rms_norm_kernel(RmsNormParams p) {
  __shared__ double scratch[32];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float* x = p.x + r * p.dim;
    double ss = 0.0;
    // Unrolled so that the loads of one row are in flight together (a decode row is one block:
    // latency-bound otherwise); the sum's order is unchanged.
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
      ss += static_cast<double>(x[i]) * x[i];
    }
    ss = block_sum(ss, scratch);
    const float rinv = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(p.dim)) + p.eps);
    float* o = p.out + r * p.dim;
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
      const float v = __fmul_rn(x[i], rinv);
      o[i] = p.weight ? __fmul_rn(p.weight[i], v) : v;
    }
  }
}

__global__ void rope_kernel(RopeParams p) {
  const int64_t rows = p.tokens * p.heads;
  const int64_t work = rows * p.half;
  const int64_t ld = p.ld > 0 ? p.ld : p.dim;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < work;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = w / p.half;
    const int64_t i = w % p.half;
    float* r = p.x + row * ld + (p.dim - 2 * p.half);
    const float pos = static_cast<float>(p.positions[row / p.heads]);
    const float angle = __fmul_rn(pos, p.inv_freq[i]);
    const float c = cosf(angle);
    const float s = p.inverse ? -sinf(angle) : sinf(angle);
    const float a = r[2 * i];
    const float b = r[2 * i + 1];
    r[2 * i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    r[2 * i + 1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  }
}

constexpr int64_t kMaxHadamard = 4096;

__global__ void quant_sim_kernel(QuantSimParams p) {
  extern __shared__ float sh[];
  const int64_t ld = p.ld > 0 ? p.ld : p.len;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    float* x = p.x + r * ld;
    float* v = x;
    if (p.hadamard) {
      for (int64_t i = threadIdx.x; i < p.len; i += blockDim.x) sh[i] = x[i];
      hadamard_block(sh, p.len);
      v = sh;
    }
    quant_row_block(v, p.len, p.block, p.kind);
    if (p.hadamard) {
      for (int64_t i = threadIdx.x; i < p.len; i += blockDim.x) x[i] = sh[i];
      __syncthreads();
    }
  }
}

}  // namespace

Status launch_embed(const EmbedParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("embed", {p.n, p.copies}));
  DSI_RETURN_IF_ERROR(check_weight(p.table, "embed table"));
  if (p.n == 0 || p.copies == 0 || p.table.cols == 0)
    return Status();
  if (!p.tokens || !p.out)
    return null_pointer("embed");
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(p.table.cols, kThreads), 1024)),
                  static_cast<unsigned>(std::min<int64_t>(p.n, kMaxBlocks)));
  embed_kernel<<<grid, kThreads, 0, stream>>>(p);
  return launched("embed launch");
}

Status launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_shape(p.rows, p.dim, "rms_norm"));
  if (p.rows == 0 || p.dim == 0)
    return Status();
  if (!p.x || !p.out)
    return null_pointer("rms_norm");
  rms_norm_kernel<<<grid_1d(p.rows), kThreads, 0, stream>>>(p);
  return launched("rms_norm launch");
}

Status launch_rope(const RopeParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("rope", {p.tokens, p.heads, p.dim, p.half, p.ld}));
  DSI_RETURN_IF_ERROR(require(2 * p.half <= p.dim, "rope", "2*half exceeds dim"));
  DSI_RETURN_IF_ERROR(require(p.ld == 0 || p.ld >= p.dim, "rope", "ld < dim"));
  if (p.tokens == 0 || p.heads == 0 || p.half == 0)
    return Status();
  if (!p.x || !p.positions || !p.inv_freq)
    return null_pointer("rope");
  rope_kernel<<<grid_1d(ceil_div(p.tokens * p.heads * p.half, kThreads)), kThreads, 0, stream>>>(p);
  return launched("rope launch");
}

Status launch_quant_sim(const QuantSimParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("quant_sim", {p.rows, p.len, p.ld}));
  DSI_RETURN_IF_ERROR(require(p.block > 0, "quant_sim", "block must be positive"));
  DSI_RETURN_IF_ERROR(require(p.ld == 0 || p.ld >= p.len, "quant_sim", "ld < len"));
  if (p.hadamard) {
    DSI_RETURN_IF_ERROR(
        require(p.len > 0 && (p.len & (p.len - 1)) == 0 && p.len <= kMaxHadamard,
                "quant_sim",
                "Hadamard length must be a power of two <= 4096, got " + std::to_string(p.len)));
  }
  if (p.rows == 0 || p.len == 0 || (p.kind == QuantSim::kNone && !p.hadamard))
    return Status();
  if (!p.x)
    return null_pointer("quant_sim");
  const size_t smem = p.hadamard ? static_cast<size_t>(p.len) * sizeof(float) : 0;
  quant_sim_kernel<<<grid_1d(p.rows), kThreads, smem, stream>>>(p);
  return launched("quant_sim launch");
}

}  // namespace dsinfer::cuda
