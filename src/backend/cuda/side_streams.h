// Side streams for the independent branches of a layer (docs/performance.md, fifteenth session):
// at decode the step is a chain of small latency-bound kernels, and a branch whose inputs are
// ready (the shared expert beside the router and the routed experts; the K=V head, its norm and
// the compressor beside the queries; the CSA indexer's compressor and head weights; the
// attention's ring write beside wo_a / wo_b) runs beside the main chain instead of after it.
//
// fork() hands out a side stream ordered after the main stream's work so far; Branch::join()
// makes the main stream wait for everything queued on the side. Under stream capture the
// record / wait pairs become graph edges, so replayed steps run the branches side by side too.
// The kernels are the same and every reader waits for its writers, so the results are the same
// bits as on one stream. Disabled (CudaModelOptions::side_streams, DSINFER_SIDE_STREAMS=0),
// fork() returns the main stream itself and join() does nothing.
#pragma once

#include <cuda_runtime.h>

#include <array>

#include "base/status.h"
#include "device/stream.h"

namespace dsinfer::gpu {

class SideStreams;

// A branch on one side stream; joined when it goes out of scope if join() was not called (also
// on early returns, so that a failed launch never leaves a capture with unjoined work).
class Branch {
 public:
  Branch() = default;
  Branch(Branch&& o) noexcept;
  Branch& operator=(Branch&& o) noexcept;
  Branch(const Branch&) = delete;
  Branch& operator=(const Branch&) = delete;
  ~Branch() { (void)join(); }

  // Where the branch's kernels go (the main stream when side streams are off).
  cudaStream_t stream() const { return stream_; }
  // The main stream waits for the work queued on the branch so far; later calls do nothing.
  Status join();

 private:
  friend class SideStreams;
  SideStreams* owner_ = nullptr;  // null: on the main stream, nothing to join
  cudaStream_t main_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int index_ = 0;
};

class SideStreams {
 public:
  static constexpr int kCount = 2;

  // enabled = false: every fork() runs on the main stream (no streams or events created).
  static Result<SideStreams> create(bool enabled);

  SideStreams() = default;
  SideStreams(SideStreams&&) noexcept = default;
  SideStreams& operator=(SideStreams&&) noexcept = default;

  bool enabled() const { return enabled_; }
  // Side i (0 <= i < kCount, not in use by another branch), after the work queued on `main`.
  // use = false: a branch on `main` itself (a caller's reasons not to fork, e.g. expert
  // parallelism, whose exchanges run on the main stream).
  Result<Branch> fork(cudaStream_t main, int i, bool use = true);

 private:
  friend class Branch;
  Status join(cudaStream_t main, int i);

  bool enabled_ = false;
  std::array<device::Stream, kCount> side_;
  std::array<device::Event, kCount> forked_;
  std::array<device::Event, kCount> done_;
  std::array<bool, kCount> busy_{};
};

}  // namespace dsinfer::gpu
