// The K order of the activations that the W4A8 grouped GEMM (moe_w4a8_sm90.cu) multiplies: within
// every 32 values, the eight 4-byte groups of E4M3 codes stored as groups 0, 2, 4, 6, 1, 3, 5, 7.
// Lane t of a wgmma's register fragment holds K 4 t .. 4 t + 3 and 16 + 4 t .. 16 + 4 t + 3 of a
// 32-wide K step; that order lets it take those from one 32-bit word of MXFP4 codes (K 8 t ..
// 8 t + 7 in the checkpoint's order), so the weights need no reordering. The activations' scales
// (per 128 values) are unchanged.
#pragma once

#include <cstdint>

namespace dsinfer::cuda {

// The position of 4-byte group w (K 4 w .. 4 w + 3) of a row in W4A8 order.
__device__ __forceinline__ int64_t w4a8_group_position(int64_t w) {
  const int64_t r = w & 7;
  return (w & ~int64_t{7}) + ((r & 1) ? 4 + (r >> 1) : (r >> 1));
}

// 32 bytes (eight groups) in checkpoint order -> W4A8 order.
__device__ __forceinline__ void w4a8_order_32(const uint4& lo, const uint4& hi, uint4* out) {
  out[0] = make_uint4(lo.x, lo.z, hi.x, hi.z);
  out[1] = make_uint4(lo.y, lo.w, hi.y, hi.w);
}

}  // namespace dsinfer::cuda
