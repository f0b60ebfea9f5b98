// Short forms of the launchers the CUDA model calls most (dense rows, in-place norms), shared by
// the layer chain and the MTP/head code of backend/cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"

namespace dsinfer::gpu {

inline Status linear(const MatrixRef& w,
                     const float* x,
                     int64_t n,
                     float* y,
                     bool q8,
                     cudaStream_t s,
                     bool accumulate = false) {
  cuda::LinearParams p;
  p.w = w;
  p.x = x;
  p.n = n;
  p.y = y;
  p.quantize_activations = q8;
  p.accumulate = accumulate;
  return cuda::launch_linear(p, s);
}

inline Status rms_norm(
    float* x, int64_t rows, int64_t dim, const float* w, float eps, cudaStream_t s) {
  cuda::RmsNormParams p;
  p.x = x;
  p.rows = rows;
  p.dim = dim;
  p.weight = w;
  p.eps = eps;
  p.out = x;
  return cuda::launch_rms_norm(p, s);
}

inline Status rope(float* x,
                   int64_t tokens,
                   int64_t heads,
                   int64_t dim,
                   const int64_t* positions,
                   const float* inv_freq,
                   int64_t half,
                   bool inverse,
                   cudaStream_t s) {
  cuda::RopeParams p;
  p.x = x;
  p.tokens = tokens;
  p.heads = heads;
  p.dim = dim;
  p.positions = positions;
  p.inv_freq = inv_freq;
  p.half = half;
  p.inverse = inverse;
  return cuda::launch_rope(p, s);
}

}  // namespace dsinfer::gpu
