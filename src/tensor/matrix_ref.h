// MatrixRef: a read-only view of a 2-D weight in its checkpoint format (never expanded):
// plain float, FP8 E4M3 with 128x128 (V4) or 32x32 (V4.1) block scales, or MXFP4 (packed E2M1 +
// E8M0 per 32 inputs).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dsinfer {

enum class WeightFormat {
  kFloat,        // data: [rows, cols] of `dtype` (F32/BF16/F16)
  kFp8Block128,  // data: [rows, cols] F8_E4M3; scale: [ceil(rows/128), ceil(cols/128)] E8M0 or F32
  kFp8Block32,   // data: [rows, cols] F8_E4M3; scale: [ceil(rows/32), ceil(cols/32)] E8M0 (V4.1)
  kMxfp4,  // data: [rows, cols/2] I8 packed (low nibble = even col); scale: [rows, cols/32] E8M0
};

const char* weight_format_name(WeightFormat f);
// Tile edge of an FP8 block format (128 or 32); 0 for the other formats.
int64_t fp8_block_edge(WeightFormat f);

struct MatrixRef {
  WeightFormat format = WeightFormat::kFloat;
  DType dtype = DType::kF32;  // element dtype of `data` (kFloat) or F8E4M3 / I8
  DType scale_dtype = DType::kF8E8M0;
  const void* data = nullptr;   // not owned (mmap'ed checkpoint)
  const void* scale = nullptr;  // not owned; null for kFloat
  int64_t rows = 0;             // logical output features
  int64_t cols = 0;             // logical input features

  bool empty() const { return data == nullptr; }
  // Writes logical row r, dequantised to fp32, into out[0, cols).
  void dequant_row(int64_t r, float* out) const;
  // Logical element (r, c) dequantised to fp32 (slow; for tests and tools).
  float at(int64_t r, int64_t c) const;
  // Bytes of data + scale.
  int64_t nbytes() const;
  int64_t data_bytes() const;
  int64_t scale_bytes() const;
};

}  // namespace dsinfer
