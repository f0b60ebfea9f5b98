// A plain cudaMalloc'd block for the measurements (move-only). Deliberately not the engine's
// caching allocator: the ceilings are measured on their own buffers, freed when done.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "base/check.h"
#include "base/status.h"
#include "device/device_error.h"

namespace dsinfer::perf {

class DeviceMemory {
 public:
  // `bytes` >= 1; kResourceExhausted (naming `what` and the size) when the device is full.
  static Result<DeviceMemory> allocate(size_t bytes, const char* what) {
    void* p = nullptr;
    const Status st = device::check_cuda(
        cudaMalloc(&p, bytes),
        (std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes for " + what).c_str());
    if (!st.ok()) {
      (void)cudaGetLastError();  // an out-of-memory error is not sticky: clear it
      return st;
    }
    return DeviceMemory(p, bytes);
  }

  DeviceMemory() = default;
  DeviceMemory(DeviceMemory&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      bytes_ = o.bytes_;
      o.p_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { reset(); }

  void* get() const { return p_; }
  size_t size() const { return bytes_; }
  void reset() {
    if (p_ != nullptr) {
      const cudaError_t err = cudaFree(p_);
      DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
      p_ = nullptr;
      bytes_ = 0;
    }
  }

 private:
  DeviceMemory(void* p, size_t bytes) : p_(p), bytes_(bytes) {}
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace dsinfer::perf
