#include "backend/cuda/select_device.h"

#include <cuda_runtime_api.h>

#include "base/strings.h"
#include "device/device_error.h"

namespace dsinfer::gpu {

Status select_device(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return Status(StatusCode::kFailedPrecondition,
                  "--device cuda: no CUDA device is available on this machine");
  }
  if (device < 0 || device >= count) {
    return invalid_argument(
        str_format("CUDA device %d does not exist (%d device(s))", device, count));
  }
  return device::check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

}  // namespace dsinfer::gpu
