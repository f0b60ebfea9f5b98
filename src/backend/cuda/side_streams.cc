// Side streams for a layer's independent branches (side_streams.h).
#include "backend/cuda/side_streams.h"

#include <utility>

#include "base/check.h"
#include "device/device_error.h"

namespace dsinfer::gpu {

Branch::Branch(Branch&& o) noexcept
    : owner_(std::exchange(o.owner_, nullptr)),
      main_(o.main_),
      stream_(o.stream_),
      index_(o.index_) {}

Branch& Branch::operator=(Branch&& o) noexcept {
  if (this != &o) {
    (void)join();
    owner_ = std::exchange(o.owner_, nullptr);
    main_ = o.main_;
    stream_ = o.stream_;
    index_ = o.index_;
  }
  return *this;
}

Status Branch::join() {
  SideStreams* owner = std::exchange(owner_, nullptr);
  if (owner == nullptr)
    return Status();
  return owner->join(main_, index_);
}

Result<SideStreams> SideStreams::create(bool enabled) {
  SideStreams s;
  s.enabled_ = enabled;
  if (!enabled)
    return s;
  for (int i = 0; i < kCount; ++i) {
    DSI_ASSIGN_OR_RETURN(s.side_[i], device::Stream::create(/*non_blocking=*/true));
    DSI_ASSIGN_OR_RETURN(s.forked_[i], device::Event::create());
    DSI_ASSIGN_OR_RETURN(s.done_[i], device::Event::create());
  }
  return s;
}

Result<Branch> SideStreams::fork(cudaStream_t main, int i, bool use) {
  DSI_CHECK(i >= 0 && i < kCount, "side stream %d of %d", i, kCount);
  Branch b;
  b.main_ = main;
  b.stream_ = main;
  b.index_ = i;
  if (!enabled_ || !use)
    return b;
  DSI_CHECK(!busy_[i], "side stream %d forked twice without a join", i);
  DSI_RETURN_IF_ERROR(forked_[i].record(main));
  DSI_RETURN_IF_ERROR(side_[i].wait(forked_[i]));
  busy_[i] = true;
  b.owner_ = this;
  b.stream_ = side_[i].get();
  return b;
}

Status SideStreams::join(cudaStream_t main, int i) {
  DSI_CHECK(busy_[i], "side stream %d joined without a fork", i);
  busy_[i] = false;
  DSI_RETURN_IF_ERROR(done_[i].record(side_[i].get()));
  return device::check_cuda(cudaStreamWaitEvent(main, done_[i].get(), 0), "cudaStreamWaitEvent");
}

}  // namespace dsinfer::gpu
