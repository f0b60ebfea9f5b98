// mHC kernels (mhc.h). The per-token scalar work (gates, Sinkhorn) mirrors kernels/cpu/mhc.cc
// operation by operation with explicit round-to-nearest intrinsics, so the only differences from
// the CPU are the exp() ulps and the order of the double-precision mixing sums.
#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/mhc.h"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;

__device__ __forceinline__ float sigmoidf(float x) {
  return 1.0f / __fadd_rn(1.0f, expf(-x));
}

// mix[i] = rsqrt(mean(x^2) + eps) * (fn[i] . x) for i < rows, x of width `width` (cpu
// rms_scaled_mix): one warp per mixing row, double accumulation.
__device__ void rms_scaled_mix(
    const float* fn, int rows, const float* x, int64_t width, float eps, float* mix) {
  __shared__ double scratch[32];
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) ss += static_cast<double>(x[i]) * x[i];
  ss = block_sum(ss, scratch);
  const float r = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(width)) + eps);
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x >> 5; i < rows; i += blockDim.x >> 5) {
    const float* w = fn + i * width;
    double acc = 0.0;
    for (int64_t c = lane; c < width; c += 32) {
      acc += static_cast<double>(w[c]) * static_cast<double>(__fmul_rn(x[c], r));
    }
    acc = warp_sum(acc);
    if (lane == 0)
      mix[i] = static_cast<float>(acc);
  }
  __syncthreads();
}

// Split mixing, pass 1: r[t] = rsqrt(mean(x^2) + eps) exactly as rms_scaled_mix computes it,
// stored in the last double slot of the token's scratch.
__global__ void hc_rms_kernel(
    const float* xs, int64_t width, float eps, int64_t n, int rows, double* scratch) {
  __shared__ double red[32];
  for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
    const float* x = xs + t * width;
    double ss = 0.0;
#pragma unroll 8  // loads in flight together (one decode token is one block); same sum order
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
      ss += static_cast<double>(x[i]) * x[i];
    ss = block_sum(ss, red);
    if (threadIdx.x == 0) {
      const float r = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(width)) + eps);
      scratch[t * (kHcMixSplits * rows + 1) + kHcMixSplits * rows] = r;
    }
    __syncthreads();
  }
}

// Split mixing, pass 2: block (s, g) computes the double partial dot products of every mixing row
// over column slice s for the kMixTokens tokens of group g, into scratch[t][s][row]. The slice of
// x * r is staged once in shared memory and each fn value read once per group (fn would otherwise
// be re-read from L2 for every token); per (token, row) the lane order and the butterfly are
// those of a warp over one token, so the sums do not depend on the grouping.
constexpr int kMixTokens = 8;

__global__ void hc_mix_partial_kernel(
    const float* fn, int rows, const float* xs, int64_t width, int64_t n, double* scratch) {
  extern __shared__ float xr[];  // [kMixTokens][slice]
  const int lane = threadIdx.x & 31;
  const int64_t slice = (width + kHcMixSplits - 1) / kHcMixSplits;
  const int64_t c0 = blockIdx.x * slice;
  const int64_t c1 = min(width, c0 + slice);
  const int64_t stride = kHcMixSplits * rows + 1;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kMixTokens; t0 < n;
       t0 += static_cast<int64_t>(gridDim.y) * kMixTokens) {
    const int count = n - t0 < kMixTokens ? static_cast<int>(n - t0) : kMixTokens;
    for (int j = 0; j < count; ++j) {
      const float r = static_cast<float>(scratch[(t0 + j) * stride + kHcMixSplits * rows]);
      const float* x = xs + (t0 + j) * width;
      for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x)
        xr[j * slice + (c - c0)] = __fmul_rn(x[c], r);
    }
    __syncthreads();
    for (int i = threadIdx.x >> 5; i < rows; i += blockDim.x >> 5) {
      const float* w = fn + i * width;
      double acc[kMixTokens];
#pragma unroll
      for (int j = 0; j < kMixTokens; ++j) acc[j] = 0.0;
#pragma unroll 8  // fn loads in flight together; each (token, row) sum keeps its order
      for (int64_t c = c0 + lane; c < c1; c += 32) {
        const double wv = static_cast<double>(w[c]);
#pragma unroll
        for (int j = 0; j < kMixTokens; ++j) {
          if (j < count)
            acc[j] += wv * static_cast<double>(xr[j * slice + (c - c0)]);
        }
      }
#pragma unroll
      for (int j = 0; j < kMixTokens; ++j) {
        if (j < count) {
          const double v = warp_sum(acc[j]);
          if (lane == 0)
            scratch[(t0 + j) * stride + blockIdx.x * rows + i] = v;
        }
      }
    }
    __syncthreads();  // xr is restaged for the next group
  }
}

// mix[i] = the token's split partials summed in slice order (threads < rows; then a barrier).
__device__ void gather_mix(const double* scratch, int64_t t, int rows, float* mix) {
  const double* part = scratch + t * (kHcMixSplits * rows + 1);
  for (int i = threadIdx.x; i < rows; i += blockDim.x) {
    double acc = 0.0;
    for (int64_t s = 0; s < kHcMixSplits; ++s) acc += part[s * rows + i];
    mix[i] = static_cast<float>(acc);
  }
  __syncthreads();
}

// collapsed[c] = sum_j pre[j] * x[j, c], serial over j in fp32 as the CPU.
__device__ void collapse(const float* pre, int64_t hc, const float* x, int64_t hidden, float* out) {
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < hc; ++j) acc = __fadd_rn(acc, __fmul_rn(pre[j], x[j * hidden + c]));
    out[c] = acc;
  }
}

__global__ void hc_pre_kernel(HcPreParams p) {
  __shared__ float mix[kMaxMix];
  __shared__ float pre[kMaxHc];
  __shared__ float comb_s[kMaxHc * kMaxHc];  // the Sinkhorn iterates in shared memory
  const int hc = static_cast<int>(p.hc);
  const int64_t width = p.hc * p.hidden;
  for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x) {
    const float* x = p.x + t * width;
    if (p.scratch != nullptr) {
      gather_mix(p.scratch, t, (2 + hc) * hc, mix);
    } else {
      rms_scaled_mix(p.fn, (2 + hc) * hc, x, width, p.norm_eps, mix);
    }
    // Gates: thread j < hc. The comb matrix: thread i = j * hc + k < hc * hc owns element (j, k)
    // and forms every row / column sum itself in the CPU's order (k, resp. j, ascending), so the
    // result is the serial loop's, bit for bit, with 2 barriers per normalisation.
    const int i = threadIdx.x;
    const bool own = i < hc * hc;
    const int j = own ? i / hc : 0;
    const int k = own ? i % hc : 0;
    const float eps = p.hc_eps;
    if (i < hc) {
      pre[i] = __fadd_rn(sigmoidf(__fadd_rn(__fmul_rn(mix[i], p.scale[0]), p.base[i])), eps);
      p.post[t * hc + i] =
          2.0f * sigmoidf(__fadd_rn(__fmul_rn(mix[hc + i], p.scale[1]), p.base[hc + i]));
    }
    float v = 0.0f;
    if (own) {
      v = __fadd_rn(__fmul_rn(mix[2 * hc + i], p.scale[2]), p.base[2 * hc + i]);
      comb_s[i] = v;
    }
    __syncthreads();
    if (own) {
      float m = -INFINITY;
      for (int kk = 0; kk < hc; ++kk) m = fmaxf(m, comb_s[j * hc + kk]);
      v = expf(__fsub_rn(v, m));
    }
    __syncthreads();
    if (own)
      comb_s[i] = v;
    __syncthreads();
    float sum = 0.0f;
    if (own) {
      for (int kk = 0; kk < hc; ++kk) sum = __fadd_rn(sum, comb_s[j * hc + kk]);
      v = __fadd_rn(__fdiv_rn(v, sum), eps);
    }
    __syncthreads();
    // One normalisation: every owner sums its row (rows) or column, then divides its element.
    auto normalise = [&](bool rows) {
      if (own)
        comb_s[i] = v;
      __syncthreads();
      if (own) {
        float s = 0.0f;
        for (int q = 0; q < hc; ++q)
          s = __fadd_rn(s, rows ? comb_s[j * hc + q] : comb_s[q * hc + k]);
        v = __fdiv_rn(v, s + eps);
      }
      __syncthreads();
    };
    normalise(false);
    for (int64_t it = 0; it + 1 < p.sinkhorn_iters; ++it) {
      normalise(true);
      normalise(false);
    }
    if (own)
      comb_s[i] = v;
    __syncthreads();
    for (int i = threadIdx.x; i < hc * hc; i += blockDim.x) p.comb[t * hc * hc + i] = comb_s[i];
    collapse(pre, hc, x, p.hidden, p.collapsed + t * p.hidden);
    __syncthreads();
  }
}

__global__ void hc_head_kernel(HcHeadParams p) {
  __shared__ float mix[kMaxHc];
  __shared__ float pre[kMaxHc];
  const int hc = static_cast<int>(p.hc);
  const int64_t width = p.hc * p.hidden;
  for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x) {
    const float* x = p.x + t * width;
    if (p.scratch != nullptr) {
      gather_mix(p.scratch, t, hc, mix);
    } else {
      rms_scaled_mix(p.fn, hc, x, width, p.norm_eps, mix);
    }
    if (threadIdx.x < hc) {
      const int j = threadIdx.x;
      pre[j] = __fadd_rn(sigmoidf(__fadd_rn(__fmul_rn(mix[j], p.scale[0]), p.base[j])), p.hc_eps);
    }
    __syncthreads();
    collapse(pre, hc, x, p.hidden, p.collapsed + t * p.hidden);
    __syncthreads();
  }
}

__global__ void hc_post_kernel(HcPostParams p) {
  const int64_t per_token = p.hc * p.hidden;
  const int64_t total = p.n * per_token;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token;
    const int64_t k = (i % per_token) / p.hidden;
    const int64_t c = i % p.hidden;
    const float* comb = p.comb + t * p.hc * p.hc;
    const float* x = p.x + t * per_token;
    float acc = __fmul_rn(p.post[t * p.hc + k], p.f[t * p.hidden + c]);
    for (int64_t j = 0; j < p.hc; ++j) {
      acc = __fadd_rn(acc, __fmul_rn(comb[j * p.hc + k], x[j * p.hidden + c]));
    }
    p.x_out[i] = acc;
  }
}

Status check_hc(int64_t hc, int64_t hidden, int64_t n, const char* what) {
  DSI_RETURN_IF_ERROR(check_nonneg(what, {hidden, n}));
  return require(hc > 0 && hc <= kMaxHc, what, "hc_mult must be in [1, 16]");
}

// The two split-mixing passes (hc_rms_kernel, hc_mix_partial_kernel) into scratch.
Status split_mix(const float* fn,
                 int rows,
                 const float* x,
                 int64_t width,
                 float eps,
                 int64_t n,
                 double* scratch,
                 cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::min(n, kMaxBlocks));
  hc_rms_kernel<<<blocks, kThreads, 0, stream>>>(x, width, eps, n, rows, scratch);
  DSI_RETURN_IF_ERROR(launched("hc_rms launch"));
  const int64_t slice = (width + kHcMixSplits - 1) / kHcMixSplits;
  const int smem = static_cast<int>(kMixTokens * slice * sizeof(float));
  static const cudaError_t attr = cudaFuncSetAttribute(
      hc_mix_partial_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  if (attr != cudaSuccess)
    return failed_precondition(std::string("hc_mix_partial: shared memory: ") +
                               cudaGetErrorString(attr));
  if (smem > 200 * 1024)
    return invalid_argument("hc_mix_partial: hc * hidden too large");
  const auto groups = static_cast<unsigned>(std::min(ceil_div(n, kMixTokens), kMaxBlocks));
  hc_mix_partial_kernel<<<dim3(static_cast<unsigned>(kHcMixSplits), groups),
                          kThreads,
                          smem,
                          stream>>>(fn, rows, x, width, n, scratch);
  return launched("hc_mix_partial launch");
}

}  // namespace

Status launch_hc_pre(const HcPreParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_hc(p.hc, p.hidden, p.n, "hc_pre"));
  if (p.n == 0)
    return Status();
  if (!p.fn || !p.base || !p.scale || !p.x || !p.post || !p.comb || !p.collapsed)
    return null_pointer("hc_pre");
  if (p.scratch != nullptr) {
    DSI_RETURN_IF_ERROR(split_mix(p.fn,
                                  static_cast<int>((2 + p.hc) * p.hc),
                                  p.x,
                                  p.hc * p.hidden,
                                  p.norm_eps,
                                  p.n,
                                  p.scratch,
                                  stream));
  }
  hc_pre_kernel<<<static_cast<unsigned>(std::min(p.n, kMaxBlocks)), kThreads, 0, stream>>>(p);
  return launched("hc_pre launch");
}

Status launch_hc_head(const HcHeadParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_hc(p.hc, p.hidden, p.n, "hc_head"));
  if (p.n == 0)
    return Status();
  if (!p.fn || !p.base || !p.scale || !p.x || !p.collapsed)
    return null_pointer("hc_head");
  if (p.scratch != nullptr) {
    DSI_RETURN_IF_ERROR(split_mix(
        p.fn, static_cast<int>(p.hc), p.x, p.hc * p.hidden, p.norm_eps, p.n, p.scratch, stream));
  }
  hc_head_kernel<<<static_cast<unsigned>(std::min(p.n, kMaxBlocks)), kThreads, 0, stream>>>(p);
  return launched("hc_head launch");
}

Status launch_hc_post(const HcPostParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_hc(p.hc, p.hidden, p.n, "hc_post"));
  const int64_t total = p.n * p.hc * p.hidden;
  if (total == 0)
    return Status();
  if (!p.f || !p.x || !p.post || !p.comb || !p.x_out)
    return null_pointer("hc_post");
  if (p.x_out == p.x)
    return invalid_argument("hc_post: x_out must not alias x");
  const auto blocks = static_cast<unsigned>(std::min(ceil_div(total, kThreads), kMaxBlocks));
  hc_post_kernel<<<blocks, kThreads, 0, stream>>>(p);
  return launched("hc_post launch");
}

}  // namespace dsinfer::cuda
