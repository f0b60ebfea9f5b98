// Row dequantisation of checkpoint-format weights.
#include "tensor/matrix_ref.h"

#include "base/check.h"
#include "numeric/float_formats.h"

namespace dsinfer {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kFloat:
      return "float";
    case WeightFormat::kFp8Block128:
      return "fp8-block128";
    case WeightFormat::kFp8Block32:
      return "fp8-block32";
    case WeightFormat::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

int64_t fp8_block_edge(WeightFormat f) {
  switch (f) {
    case WeightFormat::kFp8Block128:
      return 128;
    case WeightFormat::kFp8Block32:
      return 32;
    case WeightFormat::kFloat:
    case WeightFormat::kMxfp4:
      return 0;
  }
  return 0;
}

void MatrixRef::dequant_row(int64_t r, float* out) const {
  DSI_DCHECK(r >= 0 && r < rows,
             "row %lld of %lld",
             static_cast<long long>(r),
             static_cast<long long>(rows));
  switch (format) {
    case WeightFormat::kFloat:
      if (dtype == DType::kF32) {
        const auto* p = static_cast<const float*>(data) + r * cols;
        for (int64_t c = 0; c < cols; ++c) out[c] = p[c];
      } else {
        for (int64_t c = 0; c < cols; ++c) out[c] = load_float(data, dtype, r * cols + c);
      }
      return;
    case WeightFormat::kFp8Block128:
    case WeightFormat::kFp8Block32: {
      const int64_t e = fp8_block_edge(format);
      const auto* q = static_cast<const uint8_t*>(data) + r * cols;
      const int64_t scale_cols = (cols + e - 1) / e;
      const int64_t srow = (r / e) * scale_cols;
      for (int64_t cb = 0; cb < scale_cols; ++cb) {
        const float s = load_float(scale, scale_dtype, srow + cb);
        const int64_t end = cb * e + e < cols ? cb * e + e : cols;
        for (int64_t c = cb * e; c < end; ++c) out[c] = numeric::fp8_e4m3_to_f32(q[c]) * s;
      }
      return;
    }
    case WeightFormat::kMxfp4: {
      const auto* q = static_cast<const uint8_t*>(data) + r * (cols / 2);
      const auto* s = static_cast<const uint8_t*>(scale) + r * (cols / 32);
      for (int64_t c = 0; c < cols; ++c) {
        out[c] = numeric::fp4_packed_get(q, c) * numeric::e8m0_to_f32(s[c / 32]);
      }
      return;
    }
  }
}

float MatrixRef::at(int64_t r, int64_t c) const {
  switch (format) {
    case WeightFormat::kFloat:
      return load_float(data, dtype, r * cols + c);
    case WeightFormat::kFp8Block128:
    case WeightFormat::kFp8Block32: {
      const int64_t e = fp8_block_edge(format);
      const int64_t scale_cols = (cols + e - 1) / e;
      const float s = load_float(scale, scale_dtype, (r / e) * scale_cols + c / e);
      return numeric::fp8_e4m3_to_f32(static_cast<const uint8_t*>(data)[r * cols + c]) * s;
    }
    case WeightFormat::kMxfp4: {
      const auto* q = static_cast<const uint8_t*>(data) + r * (cols / 2);
      const auto* s = static_cast<const uint8_t*>(scale) + r * (cols / 32);
      return numeric::fp4_packed_get(q, c) * numeric::e8m0_to_f32(s[c / 32]);
    }
  }
  return 0.0f;
}

int64_t MatrixRef::nbytes() const {
  return data_bytes() + scale_bytes();
}

int64_t MatrixRef::data_bytes() const {
  switch (format) {
    case WeightFormat::kFloat:
      return rows * cols * dtype_size(dtype);
    case WeightFormat::kFp8Block128:
    case WeightFormat::kFp8Block32:
      return rows * cols;
    case WeightFormat::kMxfp4:
      return rows * cols / 2;
  }
  return 0;
}

int64_t MatrixRef::scale_bytes() const {
  switch (format) {
    case WeightFormat::kFloat:
      return 0;
    case WeightFormat::kFp8Block128:
    case WeightFormat::kFp8Block32: {
      const int64_t e = fp8_block_edge(format);
      return ((rows + e - 1) / e) * ((cols + e - 1) / e) * dtype_size(scale_dtype);
    }
    case WeightFormat::kMxfp4:
      return rows * (cols / 32);
  }
  return 0;
}

}  // namespace dsinfer
