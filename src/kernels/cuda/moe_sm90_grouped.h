// The two grouped block-scaled GEMMs of moe_sm90.cu (CUTLASS), one instantiation per weight scale
// granularity, each compiled in its own translation unit (moe_sm90_grouped_rows.cu,
// moe_sm90_grouped_blocks.cu): kScaleRows weight rows share a scale per 128-wide K block, 1 (one
// per row, any MXFP4 expert set within E4M3's range) or 128 (one per 128 x 128 block). The block
// form promotes each K block's partial sums with one scale per tile column instead of one per
// column: the same products (every scale is a power of two) with a quarter of the instructions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/moe_sm90.h"

namespace dsinfer::cuda::moe_sm90_detail {

// The scratch the GEMMs read and write (moe_sm90.cu carves it).
struct Buffers {
  uint8_t* a1;  // [pairs][hidden] gathered FP8 rows
  float* sfa1;  // per expert e at begin[e] * (hidden / 128): [hidden / 128][m_e]
  float* d1;    // [pairs][2 * inter]
  uint8_t* hq;  // [pairs][inter]
  float* sfa2;  // per expert e at begin[e] * (inter / 128): [inter / 128][m_e]
  uint8_t* g1;  // GEMM 1's per-expert argument arrays (arrays_bytes)
  uint8_t* g2;  // GEMM 2's
  void* ws;     // CUTLASS workspace (workspace_bytes)
};

template <int kScaleRows>
struct Grouped {
  static size_t arrays_bytes(int64_t n_experts);
  static size_t workspace_bytes(int64_t n_experts);
  // Both GEMMs' per-expert shapes, pointers, strides and scale layouts, on the device.
  static void setup(const MoeSm90Params& p, const Buffers& b, cudaStream_t stream);
  // GEMM 1 (pass 0: W1 | W3) or GEMM 2 (pass 1: W2), in 64-row ping-pong tiles or 128-row
  // cooperative tiles.
  static Status run(
      int pass, bool ping64, int64_t n_experts, const Buffers& b, cudaStream_t stream);
};

extern template struct Grouped<1>;
extern template struct Grouped<128>;

}  // namespace dsinfer::cuda::moe_sm90_detail
