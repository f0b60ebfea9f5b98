// The expert GEMVs' tiles (moe_gemv.h), shared by the FP8 kernels (moe_gemv.cu) and the MXFP4
// wgmma kernels (moe_gemv_mxfp4.cu): each expert's grouped pairs cut into tiles of kTok, the
// block-wide search for a block's tile, and the MXFP4 launch the FP8 file dispatches to.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/moe_gemv.h"

namespace dsinfer::cuda::moe_gemv_detail {

inline constexpr int kTok = static_cast<int>(kExpertGemvTokens);
inline constexpr int kScanPer = 16;
// From this many tiles (pairs in 8-token tiles, per expert) the GPU has enough blocks without
// splitting work finely: the FP8 kernels give each warp whole rows (skipping the reduction's
// barriers, which held a quarter of the warps' cycles at batch 64; below, four warps share each
// row's K), the MXFP4 kernels give each block 4 row groups.
inline constexpr int64_t kWholeRowsFromTiles = 32;

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Block-wide: tile ty of the grouped pairs (each expert's pairs cut into kTok-pair tiles, experts
// ascending) -> found[0..2] = expert, first grouped pair, the expert's end; false past the last.
__device__ inline bool find_tile(const Fp8ExpertFfnParams& p, int64_t ty, int64_t* found) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    if (lane == 0)
      found[0] = -1;
    __syncwarp();
    if (p.expert_begin == nullptr) {
      if (lane == 0 && ty * kTok < p.num_pairs) {
        found[0] = 0;
        found[1] = ty * kTok;
        found[2] = p.num_pairs;
      }
    } else {
      // Lane l sums the tiles of experts [lo, hi); a scan over the lanes finds ty's lane. The
      // lane's boundaries are loaded together (up to kScanPer experts per lane: 512 experts),
      // not one dependent load per expert: this prologue is latency every block pays first.
      const int64_t per = (p.n_experts + 31) / 32;
      const int64_t lo = imin(lane * per, p.n_experts);
      const int64_t hi = imin(lo + per, p.n_experts);
      int64_t b[kScanPer + 1];
      const bool held = per <= kScanPer;
      if (held) {
#pragma unroll
        for (int k = 0; k <= kScanPer; ++k) b[k] = lo + k <= hi ? p.expert_begin[lo + k] : 0;
      }
      int64_t tiles = 0;
      if (held) {
#pragma unroll
        for (int k = 0; k < kScanPer; ++k)
          tiles += lo + k < hi ? (b[k + 1] - b[k] + kTok - 1) / kTok : 0;
      } else {
        for (int64_t e = lo; e < hi; ++e)
          tiles += (p.expert_begin[e + 1] - p.expert_begin[e] + kTok - 1) / kTok;
      }
      int64_t incl = tiles;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int64_t o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off)
          incl += o;
      }
      if (ty >= incl - tiles && ty < incl) {
        int64_t local = ty - (incl - tiles);
        // Expert e's tiles: local < its count finds it (block-uniform over the lane's range).
        auto visit = [&](int64_t e, int64_t bb, int64_t end) {
          const int64_t te = (end - bb + kTok - 1) / kTok;
          if (local >= 0 && local < te) {
            found[0] = e;
            found[1] = bb + local * kTok;
            found[2] = end;
          }
          local -= te;
        };
        if (held) {
#pragma unroll
          for (int k = 0; k < kScanPer; ++k)
            if (lo + k < hi)
              visit(lo + k, b[k], b[k + 1]);
        } else {
          for (int64_t e = lo; e < hi; ++e) visit(e, p.expert_begin[e], p.expert_begin[e + 1]);
        }
      }
    }
  }
  __syncthreads();
  return found[0] >= 0;
}

struct Tile {
  int64_t e = 0;   // expert
  int64_t g0 = 0;  // first grouped pair
  int count = 0;   // pairs (<= kTok)
};

// Block-wide prologue: the block's tile and the activation row of each of its pairs (by_token: the
// token row, as gate/up reads x; else the grouped pair row, as down reads h). False for the whole
// block past the last tile or past the weight's rows.
__device__ inline bool tile_prologue(
    const Fp8ExpertFfnParams& p, int64_t r0, int64_t rows, bool by_token, Tile* tl, int32_t* xrow) {
  __shared__ int64_t found[3];
  if (r0 >= rows || !find_tile(p, blockIdx.y, found))
    return false;
  tl->e = found[0];
  tl->g0 = found[1];
  tl->count = static_cast<int>(imin(kTok, found[2] - tl->g0));
  if (threadIdx.x < kTok) {
    const int j = threadIdx.x;
    const int64_t g = tl->g0 + j;  // read only below count: pair_src ends at the last pair
    xrow[j] = j >= tl->count ? -1
              : by_token     ? static_cast<int32_t>((p.pair_src ? p.pair_src[g] : g) / p.k)
                             : static_cast<int32_t>(g);
  }
  __syncthreads();
  return true;
}

// The MXFP4 experts of p on the wgmma GEMVs (moe_gemv_mxfp4.cu); p checked by
// launch_expert_gemv, `tiles` its tile count.
Status launch_mxfp4(const Fp8ExpertFfnParams& p, int64_t tiles, cudaStream_t stream);

}  // namespace dsinfer::cuda::moe_gemv_detail
