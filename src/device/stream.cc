// RAII CUDA streams and events.
#include "device/stream.h"

#include "device/device_error.h"
#include "kernels/cuda/cuda_check.h"

namespace dsinfer::device {

Result<Stream> Stream::create(bool non_blocking, int priority) {
  cudaStream_t s = nullptr;
  DSI_RETURN_IF_ERROR(
      check_cuda(cudaStreamCreateWithPriority(
                     &s, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault, priority),
                 "cudaStreamCreateWithPriority"));
  return Stream(s);
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    reset();
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

Status Stream::synchronize() const {
  return sync_stream(s_, "cudaStreamSynchronize");
}

Result<bool> Stream::ready() const {
  const cudaError_t err = cudaStreamQuery(s_);
  if (err == cudaErrorNotReady)
    return false;
  DSI_RETURN_IF_ERROR(check_cuda(err, "cudaStreamQuery"));
  return true;
}

Status Stream::wait(const Event& e) const {
  return check_cuda(cudaStreamWaitEvent(s_, e.get(), 0), "cudaStreamWaitEvent");
}

void Stream::reset() {
  if (s_ != nullptr) {
    const cudaError_t err = cudaStreamDestroy(s_);
    DSI_CHECK(release_ok(err), "cudaStreamDestroy: %s", cudaGetErrorString(err));
    s_ = nullptr;
  }
}

Result<Event> Event::create(bool timing) {
  cudaEvent_t e = nullptr;
  DSI_RETURN_IF_ERROR(
      check_cuda(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
                 "cudaEventCreateWithFlags"));
  return Event(e);
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    reset();
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

Status Event::record(cudaStream_t stream) const {
  return check_cuda(cudaEventRecord(e_, stream), "cudaEventRecord");
}

Status Event::synchronize() const {
  return check_cuda(cudaEventSynchronize(e_), "cudaEventSynchronize");
}

Result<bool> Event::ready() const {
  const cudaError_t err = cudaEventQuery(e_);
  if (err == cudaErrorNotReady)
    return false;
  DSI_RETURN_IF_ERROR(check_cuda(err, "cudaEventQuery"));
  return true;
}

void Event::reset() {
  if (e_ != nullptr) {
    const cudaError_t err = cudaEventDestroy(e_);
    DSI_CHECK(release_ok(err), "cudaEventDestroy: %s", cudaGetErrorString(err));
    e_ = nullptr;
  }
}

Result<float> Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0.0f;
  DSI_RETURN_IF_ERROR(
      check_cuda(cudaEventElapsedTime(&ms, start.get(), end.get()), "cudaEventElapsedTime"));
  return ms;
}

}  // namespace dsinfer::device
