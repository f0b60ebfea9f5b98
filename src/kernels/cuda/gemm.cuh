// The GEMM tile shared by the dense linear (gemm.cu) and the grouped expert GEMMs (moe.cu): one
// 256-thread block computes a 64-row x 16-token tile of W x, K in chunks of 128. The weight tile
// is dequantised from its checkpoint format on load (load_weight), the activation tile optionally
// rounded through 1x128 UE8M0 FP8 (chunks are 128-aligned, so a chunk is one quantisation block).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"

namespace dsinfer::cuda {

inline constexpr int kGemmTileR = 64;
inline constexpr int kGemmTileT = 16;
inline constexpr int kGemmTileK = 128;
inline constexpr int kGemmThreads = 256;
inline constexpr int kGemmRowsPerThread = kGemmTileR * kGemmTileT / kGemmThreads;  // 4

struct GemmSmem {
  float w[kGemmTileR][kGemmTileK + 1];  // +1: conflict-free column reads
  float x[kGemmTileT][kGemmTileK + 1];
  int64_t src[kGemmTileT];  // x row of each tile token, -1 = padding
};

// Thread -> outputs: token tt = tid % 16, rows rr + 16 j (j < 4) with rr = tid / 16.
__device__ __forceinline__ int gemm_tile_token() {
  return threadIdx.x % kGemmTileT;
}
__device__ __forceinline__ int gemm_tile_row(int j) {
  return threadIdx.x / kGemmTileT + kGemmTileT * j;
}

// acc[j] = sum_c w[r0 + gemm_tile_row(j), c] * x[src[tt], c] for weight rows < r_end (others 0).
// sm.src must be filled (and synchronised) by the caller.
__device__ inline void gemm_tile(const MatrixRef& w,
                                 int64_t r0,
                                 int64_t r_end,
                                 const float* x,
                                 int64_t ldx,
                                 bool quant,
                                 GemmSmem& sm,
                                 float (&acc)[kGemmRowsPerThread]) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int64_t cols = w.cols;
#pragma unroll
  for (int j = 0; j < kGemmRowsPerThread; ++j) acc[j] = 0.0f;
  for (int64_t k0 = 0; k0 < cols; k0 += kGemmTileK) {
    for (int idx = tid; idx < kGemmTileR * kGemmTileK; idx += kGemmThreads) {
      const int r = idx / kGemmTileK;
      const int c = idx % kGemmTileK;
      const int64_t gr = r0 + r;
      const int64_t gc = k0 + c;
      sm.w[r][c] = (gr < r_end && gc < cols) ? load_weight(w, gr, gc) : 0.0f;
    }
    for (int t = warp; t < kGemmTileT; t += kGemmThreads / 32) {
      const int64_t src = sm.src[t];
      float v[kGemmTileK / 32];
      float amax = 0.0f;
#pragma unroll
      for (int j = 0; j < kGemmTileK / 32; ++j) {
        const int64_t gc = k0 + lane + 32 * j;
        v[j] = (src >= 0 && gc < cols) ? x[src * ldx + gc] : 0.0f;
        amax = fmaxf(amax, fabsf(v[j]));
      }
      if (quant) {
        amax = warp_max(amax);
        const float s = act_block_scale(amax);
#pragma unroll
        for (int j = 0; j < kGemmTileK / 32; ++j) {
          v[j] = numeric::fp8_e4m3_to_f32(act_quant_code(v[j], s)) * s;
        }
      }
#pragma unroll
      for (int j = 0; j < kGemmTileK / 32; ++j) sm.x[t][lane + 32 * j] = v[j];
    }
    __syncthreads();
    const int tt = gemm_tile_token();
#pragma unroll 8
    for (int c = 0; c < kGemmTileK; ++c) {
      const float xv = sm.x[tt][c];
#pragma unroll
      for (int j = 0; j < kGemmRowsPerThread; ++j) acc[j] += sm.w[gemm_tile_row(j)][c] * xv;
    }
    __syncthreads();
  }
}

}  // namespace dsinfer::cuda
