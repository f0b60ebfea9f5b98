// CUDA error handling: DSI_CUDA_CHECK for calls that must not fail (a failure is a bug or a dead
// device: print file:line and abort, like DSI_CHECK), cuda_status() to turn an expected failure
// into a Status for the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "base/check.h"
#include "base/status.h"

#define DSI_CUDA_CHECK(expr)                                              \
  do {                                                                    \
    const cudaError_t dsi_cuda_err_ = (expr);                             \
    if (__builtin_expect(dsi_cuda_err_ != cudaSuccess, 0)) {              \
      ::dsinfer::detail::check_failed(__FILE__,                           \
                                      __LINE__,                           \
                                      #expr,                              \
                                      "CUDA error %d (%s): %s",           \
                                      static_cast<int>(dsi_cuda_err_),    \
                                      cudaGetErrorName(dsi_cuda_err_),    \
                                      cudaGetErrorString(dsi_cuda_err_)); \
    }                                                                     \
  } while (0)

namespace dsinfer {

// OK for cudaSuccess; otherwise "<what>: <cudaErrorName>: <description>", as kResourceExhausted
// for allocation failures and kInternal for everything else.
inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess)
    return Status();
  const StatusCode code =
      err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code,
                std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace dsinfer
