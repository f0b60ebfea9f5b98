// Host API of the CUDA (de)quantisation kernels (dequant.cu). Plain C++: include from .cc files.
// All pointers are device pointers; every launcher validates its params, enqueues on `stream`
// (asynchronous) and returns the launch status. Empty shapes launch nothing and return OK.
//
// Results are bit-identical to the CPU path (MatrixRef::dequant_row, numeric::fp8_block_quantize):
// both use the DSI_HD conversions of numeric/float_formats.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

// FP8 E4M3 weight with one scale per 128x128 tile (spec §5.3).
struct Fp8BlockDequantParams {
  const uint8_t* codes = nullptr;  // [rows, cols] E4M3
  const void* scales = nullptr;    // [ceil(rows/128), ceil(cols/128)] E8M0 bytes or fp32
  bool scales_f32 = false;         // true: fp32 scales; false: E8M0 bytes
  int64_t rows = 0;
  int64_t cols = 0;
  float* out = nullptr;  // [rows, cols]
};

// MXFP4 weight (spec §5.4): packed E2M1 (low nibble = even column), one E8M0 scale per 32 columns.
struct Mxfp4DequantParams {
  const uint8_t* packed = nullptr;  // [rows, cols/2]
  const uint8_t* scales = nullptr;  // [rows, cols/32] E8M0
  int64_t rows = 0;
  int64_t cols = 0;      // multiple of 32
  float* out = nullptr;  // [rows, cols]
};

// 1x128 FP8 activation quantisation with UE8M0 scales (spec §3.12.1): per row r and block kb,
// s = 2^ceil(log2(max(amax, 1e-4) / 448)), codes = e4m3(clamp(x / s, +-448)), and the scale's
// exponent byte; row by row identical to numeric::fp8_block_quantize(x_r, cols, 128, ...).
struct ActQuantParams {
  const float* x = nullptr;  // [rows, cols]
  int64_t rows = 0;
  int64_t cols = 0;
  uint8_t* codes = nullptr;        // [rows, cols] E4M3
  uint8_t* scale_bytes = nullptr;  // [rows, ceil(cols/128)] E8M0
};

inline constexpr int64_t kActQuantBlock = 128;

Status launch_fp8_block_dequant(const Fp8BlockDequantParams& p, cudaStream_t stream);
Status launch_mxfp4_dequant(const Mxfp4DequantParams& p, cudaStream_t stream);
Status launch_act_quant_fp8(const ActQuantParams& p, cudaStream_t stream);

// Dequantises a whole weight whose data/scale pointers are device pointers into out[rows, cols]
// (fp32, device). Handles kFp8Block128 (E8M0 or F32 scales), kMxfp4 and kFloat with F32 data
// (a device-to-device copy); other float dtypes are kUnimplemented for now.
Status dequant_matrix(const MatrixRef& w, float* out, cudaStream_t stream);

// An FP8 block-128 weight (device pointers) as BF16 [rows, cols] in out (exact).
Status fp8_block_to_bf16(const MatrixRef& w, uint16_t* out, cudaStream_t stream);

}  // namespace dsinfer::cuda
