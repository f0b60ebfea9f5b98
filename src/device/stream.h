// RAII CUDA streams and events. Move-only; creation returns Result (it can fail on a dead or
// absent device), operations return Status through device::check_cuda (sticky errors latch).
#pragma once

#include <cuda_runtime_api.h>

#include "base/status.h"

namespace dsinfer::device {

class Event;

class Stream {
 public:
  // A new stream; non_blocking: no implicit synchronisation with the legacy default stream.
  // priority: as cudaStreamCreateWithPriority (lower = higher priority; 0 = default).
  static Result<Stream> create(bool non_blocking = true, int priority = 0);

  Stream() = default;
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { reset(); }

  cudaStream_t get() const { return s_; }
  bool valid() const { return s_ != nullptr; }
  // Blocks until all queued work is done; reports asynchronous (kernel) errors.
  Status synchronize() const;
  // True when all queued work is done (cudaStreamQuery), false while work is pending.
  Result<bool> ready() const;
  // Makes later work on this stream wait for `e` (recorded on any stream).
  Status wait(const Event& e) const;
  void reset();

 private:
  explicit Stream(cudaStream_t s) : s_(s) {}
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  // timing=false (the default) is the cheap kind for synchronisation only.
  static Result<Event> create(bool timing = false);

  Event() = default;
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { reset(); }

  cudaEvent_t get() const { return e_; }
  bool valid() const { return e_ != nullptr; }
  Status record(cudaStream_t stream) const;
  Status synchronize() const;
  Result<bool> ready() const;
  void reset();

  // Milliseconds between two recorded timing events (both complete).
  static Result<float> elapsed_ms(const Event& start, const Event& end);

 private:
  explicit Event(cudaEvent_t e) : e_(e) {}
  cudaEvent_t e_ = nullptr;
};

}  // namespace dsinfer::device
