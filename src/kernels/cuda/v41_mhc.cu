// V4.1's single-pass mHC on the GPU (v41.h): the site mixes, the collapse with the carried mix and
// the post step, each the twin of V41CpuModel's loops. The float arithmetic is written with
// explicit round-to-nearest intrinsics in the CPU's order (nvcc would otherwise contract a * b + c
// into one FMA, which the CPU build does not), so the collapse and the post step equal the CPU's
// bit for bit given the same inputs; the mixes differ from the CPU by the order of the mixing dot
// products (a block tree here, cpu::dot8 there) and by expf's ulps.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/v41.h"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

__device__ __forceinline__ float sigmoidf_cpu(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

// cpu::softmax over n values in place: float exp of x - max, double sum, times float 1 / sum.
__device__ void softmax_row(float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = fmaxf(m, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = expf(x[i] - m);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] = __fmul_rn(x[i], inv);
}

__global__ void __launch_bounds__(kThreads) v41_hc_mix_kernel(V41HcMixParams p) {
  __shared__ double dscratch[32];
  __shared__ float fscratch[32];
  __shared__ float mu[kV41MaxMix];
  const int64_t hc = p.hc, flat = hc * p.hidden, mix = (2 + hc) * hc;
  for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x) {
    const float* x = p.x + t * flat;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < flat; i += blockDim.x)
      ss += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    ss = block_sum(ss, dscratch);
    const float r = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(flat)) + p.norm_eps);
    for (int64_t k = 0; k < mix; ++k) {
      const float* w = p.fn + k * flat;
      float acc = 0.0f;
      for (int64_t i = threadIdx.x; i < flat; i += blockDim.x)
        acc = __fadd_rn(acc, __fmul_rn(w[i], x[i]));
      acc = block_sum(acc, fscratch);
      if (threadIdx.x == 0)
        mu[k] = __fmul_rn(acc, r);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const float eps = p.hc_eps;
      float* pre = p.pre + t * hc;
      float* post = p.post + t * hc;
      float* comb = p.comb + t * hc * hc;
      for (int64_t j = 0; j < hc; ++j) {
        pre[j] = __fadd_rn(sigmoidf_cpu(__fadd_rn(__fmul_rn(mu[j], p.scale[0]), p.base[j])), eps);
        post[j] = __fmul_rn(
            2.0f, sigmoidf_cpu(__fadd_rn(__fmul_rn(mu[hc + j], p.scale[1]), p.base[hc + j])));
      }
      for (int64_t j = 0; j < hc; ++j) {
        float* row = comb + j * hc;
        for (int64_t k = 0; k < hc; ++k)
          row[k] = __fadd_rn(__fmul_rn(mu[2 * hc + j * hc + k], p.scale[2]),
                             p.base[2 * hc + j * hc + k]);
        softmax_row(row, hc);
        for (int64_t k = 0; k < hc; ++k) row[k] = __fadd_rn(row[k], eps);
      }
      auto col_norm = [&] {
        for (int64_t k = 0; k < hc; ++k) {
          float sum = 0.0f;
          for (int64_t j = 0; j < hc; ++j) sum = __fadd_rn(sum, comb[j * hc + k]);
          const float den = __fadd_rn(sum, eps);
          for (int64_t j = 0; j < hc; ++j) comb[j * hc + k] = __fdiv_rn(comb[j * hc + k], den);
        }
      };
      auto row_norm = [&] {
        for (int64_t j = 0; j < hc; ++j) {
          float sum = 0.0f;
          for (int64_t k = 0; k < hc; ++k) sum = __fadd_rn(sum, comb[j * hc + k]);
          const float den = __fadd_rn(sum, eps);
          for (int64_t k = 0; k < hc; ++k) comb[j * hc + k] = __fdiv_rn(comb[j * hc + k], den);
        }
      };
      col_norm();
      for (int64_t it = 0; it < p.sinkhorn_iters - 1; ++it) {
        row_norm();
        col_norm();
      }
    }
    __syncthreads();
  }
}

__global__ void v41_collapse_kernel(V41CollapseParams p) {
  const int64_t total = p.n * p.hidden;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / p.hidden, c = i % p.hidden;
    const float* x = p.x + t * p.hc * p.hidden + c;
    float acc = 0.0f;
    if (p.mean) {
      for (int64_t j = 0; j < p.hc; ++j) acc = __fadd_rn(acc, x[j * p.hidden]);
      acc = __fdiv_rn(acc, static_cast<float>(p.hc));
    } else {
      for (int64_t j = 0; j < p.hc; ++j)
        acc = __fadd_rn(acc, __fmul_rn(p.pi[t * p.hc + j], x[j * p.hidden]));
    }
    p.out[i] = acc;
  }
}

__global__ void v41_hc_post_kernel(V41HcPostParams p) {
  const int64_t per_token = p.hc * p.hidden;
  const int64_t total = p.n * per_token;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token;
    const int64_t k = (i % per_token) / p.hidden;
    const int64_t c = i % p.hidden;
    const float* comb = p.comb + t * p.hc * p.hc;
    const float* x = p.x + t * per_token + c;
    float acc = 0.0f;
    for (int64_t j = 0; j < p.hc; ++j)
      acc = __fadd_rn(acc, __fmul_rn(comb[j * p.hc + k], x[j * p.hidden]));
    // mix_streams' order: the comb mix summed first, then post * f added.
    p.x_out[i] = __fadd_rn(__fmul_rn(p.post[t * p.hc + k], p.f[t * p.hidden + c]), acc);
  }
}

unsigned grid_for(int64_t total) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(total, kThreads), 1, kMaxBlocks));
}

Status check_hc(int64_t hc, int64_t hidden, int64_t n, const char* what) {
  DSI_RETURN_IF_ERROR(check_nonneg(what, {hidden, n}));
  return require(hc > 0 && (2 + hc) * hc <= kV41MaxMix, what, "hc_mult must be in [1, 4]");
}

}  // namespace

Status launch_v41_hc_mix(const V41HcMixParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_hc(p.hc, p.hidden, p.n, "v41_hc_mix"));
  DSI_RETURN_IF_ERROR(require(p.sinkhorn_iters >= 1, "v41_hc_mix", "sinkhorn_iters < 1"));
  if (p.n == 0)
    return Status();
  if (!p.fn || !p.base || !p.scale || !p.x || !p.pre || !p.post || !p.comb)
    return null_pointer("v41_hc_mix");
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.n, 65535));
  v41_hc_mix_kernel<<<grid, kThreads, 0, stream>>>(p);
  return launched("v41_hc_mix launch");
}

Status launch_v41_collapse(const V41CollapseParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_hc(p.hc, p.hidden, p.n, "v41_collapse"));
  if (p.n == 0 || p.hidden == 0)
    return Status();
  if (!p.x || !p.out || (!p.mean && !p.pi))
    return null_pointer("v41_collapse");
  v41_collapse_kernel<<<grid_for(p.n * p.hidden), kThreads, 0, stream>>>(p);
  return launched("v41_collapse launch");
}

Status launch_v41_hc_post(const V41HcPostParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_hc(p.hc, p.hidden, p.n, "v41_hc_post"));
  if (p.n == 0 || p.hidden == 0)
    return Status();
  if (!p.f || !p.x || !p.post || !p.comb || !p.x_out)
    return null_pointer("v41_hc_post");
  DSI_RETURN_IF_ERROR(require(p.x != p.x_out, "v41_hc_post", "x_out aliases x"));
  v41_hc_post_kernel<<<grid_for(p.n * p.hc * p.hidden), kThreads, 0, stream>>>(p);
  return launched("v41_hc_post launch");
}

}  // namespace dsinfer::cuda
