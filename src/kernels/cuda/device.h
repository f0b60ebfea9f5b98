// CUDA device discovery (host code). Safe to call on machines without a GPU or driver.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace dsinfer::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  int64_t total_memory = 0;  // bytes
  int sm_count = 0;
};

// Number of usable CUDA devices; 0 (not an error) when there is no driver or no GPU.
int cuda_device_count();

// True when at least one CUDA device can be used. Never aborts.
bool cuda_available();

// Properties of device `ordinal`; kNotFound if there is no such device, kInternal on driver errors.
Result<DeviceInfo> query_device(int ordinal);

}  // namespace dsinfer::cuda
