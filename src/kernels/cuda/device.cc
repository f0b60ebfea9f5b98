// CUDA device discovery.
#include "kernels/cuda/device.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_check.h"

namespace dsinfer::cuda {

int cuda_device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // No driver (cudaErrorInsufficientDriver), no device (cudaErrorNoDevice), ...: clear the
    // error so later runtime calls are not confused by it, and report "none".
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool cuda_available() {
  return cuda_device_count() > 0;
}

Result<DeviceInfo> query_device(int ordinal) {
  const int n = cuda_device_count();
  if (ordinal < 0 || ordinal >= n) {
    return not_found("CUDA device " + std::to_string(ordinal) + " (" + std::to_string(n) +
                     " device(s) present)");
  }
  cudaDeviceProp prop{};
  DSI_RETURN_IF_ERROR(
      cuda_status(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties"));
  DeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.total_memory = static_cast<int64_t>(prop.totalGlobalMem);
  info.sm_count = prop.multiProcessorCount;
  return info;
}

}  // namespace dsinfer::cuda
