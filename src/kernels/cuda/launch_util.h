// Host-side helpers shared by the kernel launchers: argument checks that return Status, grid
// arithmetic, and the post-launch check (which latches sticky device errors, device_error.h).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "base/status.h"
#include "device/device_error.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Streaming multiprocessors of the current device, queried once per process (132 on an H200;
// that figure where the query fails). Grid sizes and split plans use it.
inline int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        sms <= 0)
      return 132;
    return sms;
  }();
  return n;
}

// kInvalidArgument naming `what` unless every value is >= 0.
inline Status check_nonneg(const char* what, std::initializer_list<int64_t> values) {
  for (int64_t v : values) {
    if (v < 0)
      return invalid_argument(std::string(what) + ": negative size " + std::to_string(v));
  }
  return Status();
}

inline Status check_shape(int64_t rows, int64_t cols, const char* what) {
  if (rows < 0 || cols < 0) {
    return invalid_argument(std::string(what) + ": negative shape [" + std::to_string(rows) + ", " +
                            std::to_string(cols) + "]");
  }
  return Status();
}

inline Status null_pointer(const char* what) {
  return invalid_argument(std::string(what) + ": null device pointer for a non-empty shape");
}

// kInvalidArgument "<what>: <msg>" unless cond.
inline Status require(bool cond, const char* what, const std::string& msg) {
  if (cond)
    return Status();
  return invalid_argument(std::string(what) + ": " + msg);
}

// Status of the launch just made (configuration errors, or a sticky error from earlier work).
inline Status launched(const char* what) {
  return device::check_launch(what);
}

// Checks that a weight can be read by the GPU kernels (load_weight in dequant.cuh): a known
// format/dtype pair, non-negative shape, MXFP4 columns a multiple of 32, pointers set.
inline Status check_weight(const MatrixRef& w, const char* what) {
  DSI_RETURN_IF_ERROR(check_shape(w.rows, w.cols, what));
  switch (w.format) {
    case WeightFormat::kFloat:
      if (w.dtype != DType::kF32 && w.dtype != DType::kBF16 && w.dtype != DType::kF16) {
        return unimplemented(std::string(what) + ": float weights of dtype " + dtype_name(w.dtype));
      }
      break;
    case WeightFormat::kFp8Block128:
    case WeightFormat::kFp8Block32:
      if (w.dtype != DType::kF8E4M3 ||
          (w.scale_dtype != DType::kF8E8M0 && w.scale_dtype != DType::kF32)) {
        return invalid_argument(std::string(what) +
                                ": fp8 block weights need F8_E4M3 data and E8M0/F32 scales");
      }
      if (w.scale == nullptr && w.rows > 0 && w.cols > 0)
        return null_pointer(what);
      break;
    case WeightFormat::kMxfp4:
      if (w.cols % 32 != 0) {
        return invalid_argument(std::string(what) + ": mxfp4 cols " + std::to_string(w.cols) +
                                " is not a multiple of 32");
      }
      if (w.scale == nullptr && w.rows > 0 && w.cols > 0)
        return null_pointer(what);
      break;
    default:
      return invalid_argument(std::string(what) + ": unknown weight format");
  }
  if (w.data == nullptr && w.rows > 0 && w.cols > 0)
    return null_pointer(what);
  return Status();
}

}  // namespace dsinfer::cuda
