// Dense linear layers on the GPU over weights in their checkpoint formats (never expanded):
// y[t, r] = sum_c w[row_begin + r, c] * x[t, c] with fp32 accumulation, as cpu::linear_rows.
//
// Weight formats (MatrixRef with device pointers): float (F32 / BF16 / F16), FP8 E4M3 with
// 128x128 block scales (E8M0 or F32), MXFP4 (E2M1 + E8M0 per 32 inputs). With
// quantize_activations each 1x128 block of every x row is rounded through UE8M0-scaled FP8
// inside the kernel (the DeepSeek activation quantisation, spec §3.12.1), exactly as
// numeric::fp8_block_simulate does on the CPU.
//
// cuBLASLt's sm_90 FP8 matmul cannot express 128x128 weight-block scales with 1x128 UE8M0
// activation scales, so this is the engine's own kernel: a straightforward shared-memory tile
// (64 weight rows x 16 tokens x 128 K) that dequantises the weight tile on load. Correctness
// first; the fast wgmma path is a later issue and will keep this contract.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

struct LinearParams {
  MatrixRef w;               // device pointers, [w.rows, w.cols]
  int64_t row_begin = 0;     // first weight row used
  int64_t rows = -1;         // output features; -1: w.rows - row_begin
  const float* x = nullptr;  // [n, ldx], the first w.cols values of each row are read
  int64_t ldx = 0;           // 0: w.cols
  int64_t n = 0;             // tokens
  float* y = nullptr;        // [n, ldy], the first `rows` values of each row are written
  int64_t ldy = 0;           // 0: rows
  bool quantize_activations = false;
  bool accumulate = false;  // y += W x instead of y = W x
};
Status launch_linear(const LinearParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
