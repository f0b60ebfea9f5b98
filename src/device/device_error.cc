// Device-error classification and the process-wide sticky-failure latch.
#include "device/device_error.h"

#include <atomic>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace dsinfer::device {
namespace {

std::atomic<bool> g_failed{false};
std::mutex g_mu;
Status* g_failure = nullptr;  // guarded by g_mu; leaked on purpose (read during shutdown)

void latch(const Status& st) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_failure == nullptr) {
    g_failure = new Status(StatusCode::kInternal, "CUDA device failed: " + st.message());
    g_failed.store(true, std::memory_order_release);
  }
}

}  // namespace

bool is_sticky_error(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorDevicesUnavailable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

Status check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess)
    return Status();
  Status st = cuda_status(err, what);
  if (is_sticky_error(err)) {
    latch(st);
    return device_failure();
  }
  return st;
}

Status check_launch(const char* what) {
  return check_cuda(cudaGetLastError(), what);
}

Status sync_stream(cudaStream_t stream, const char* what) {
  return check_cuda(cudaStreamSynchronize(stream), what);
}

Status poll_device() {
  if (device_failed())
    return device_failure();
  const cudaError_t err = cudaPeekAtLastError();
  if (err != cudaSuccess && is_sticky_error(err))
    return check_cuda(err, "device poll");
  return Status();
}

Status device_failure() {
  if (!g_failed.load(std::memory_order_acquire))
    return Status();
  std::lock_guard<std::mutex> lock(g_mu);
  return *g_failure;
}

bool device_failed() {
  return g_failed.load(std::memory_order_acquire);
}

bool release_ok(cudaError_t err) {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading)
    return true;  // success, or a static destructor running after the runtime shut down
  if (is_sticky_error(err) || device_failed()) {
    (void)check_cuda(err, "release");
    return true;  // the context is gone: nothing left to release
  }
  return false;
}

}  // namespace dsinfer::device
