// The device mirror of a PageArena's pages (backends whose state lives on the GPU: the arena hands
// out page ids only): one device array of the arena's pages, grown with it, and the page copies
// of the backend seam (copy / read / write state pages). Shared by CudaModel and CudaV41Backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "base/status.h"
#include "device/allocator.h"
#include "device/stream.h"
#include "state/page_arena.h"

namespace dsinfer::gpu {

struct StatePool {
  float* p = nullptr;
  int64_t pages = 0;
};

// Grows `pool` to the arena's page count (by half again at least: growable arenas), keeping its
// contents (copied on s, then s synced, the old array freed); *grew says whether it moved.
// `what` names the pool in errors.
Status grow_state_pool(
    StatePool* pool, const state::PageArena& arena, cudaStream_t s, const char* what, bool* grew);

// Page copies within the pool (pairs of from, to), each page page_floats floats; s synced after.
Status copy_pool_pages(float* pool,
                       int64_t page_floats,
                       const std::vector<std::pair<int32_t, int32_t>>& pairs,
                       cudaStream_t s);
// dst[i] = page pages[i] of the pool; s synced after.
Status read_pool_pages(const float* pool,
                       int64_t page_floats,
                       std::span<const int32_t> pages,
                       float* dst,
                       cudaStream_t s);
// Page pages[i] of the pool = src[i]; s synced after.
Status write_pool_pages(float* pool,
                        int64_t page_floats,
                        std::span<const int32_t> pages,
                        const float* src,
                        cudaStream_t s);

// Background reads of pool pages into host memory (backend::Model::begin_read_state_pages, the
// prefix cache's captures). A read is queued on a non-blocking side stream behind an event
// recorded on the compute stream (so it sees every forward and page copy queued before it, and
// the compute stream never waits for it), copies the pages into pinned staging and records an
// event that poll() queries with cudaEventQuery; the staging is copied into the caller's memory
// when poll() first sees the event done. Staging buffers are reused and bounded in all by
// staging_limit bytes: begin() is refused (kResourceExhausted) beyond that. Only wait(), drain()
// and the destructor block.
class AsyncPageReads {
 public:
  explicit AsyncPageReads(int64_t staging_limit = int64_t{256} << 20);
  ~AsyncPageReads();  // waits for the reads in flight; their results are dropped
  AsyncPageReads(const AsyncPageReads&) = delete;
  AsyncPageReads& operator=(const AsyncPageReads&) = delete;

  // Starts reading pages[i] of `pool` (page_floats floats each) into dst, after the work queued
  // on `compute` so far. The pages must stay allocated and unwritten, and dst alive, until the
  // ticket is spent (poll true or an error, or wait).
  Result<int64_t> begin(const float* pool,
                        int64_t page_floats,
                        std::span<const int32_t> pages,
                        float* dst,
                        cudaStream_t compute);
  // Without waiting: true (done, dst filled, ticket spent), false (still copying) or the copy's
  // error (ticket spent).
  Result<bool> poll(int64_t ticket);
  // Blocks until the read ends; spends the ticket as poll does.
  Status wait(int64_t ticket);
  // Blocks until every read in flight has ended (before the pool they read is moved or freed);
  // their tickets are spent by the next poll or wait, which returns the result at once.
  Status drain();
  // Checker: aborts when one of `pages` (or a destination of `pairs`) is being read, i.e. a
  // write into pages whose contents a capture is still copying.
  void check_not_reading(std::span<const int32_t> pages, const char* what) const;
  void check_not_reading(const std::vector<std::pair<int32_t, int32_t>>& pairs,
                         const char* what) const;
  int64_t in_flight() const { return static_cast<int64_t>(reads_.size()); }
  int64_t staging_bytes() const { return staged_; }

 private:
  struct Read {
    int64_t ticket = 0;
    std::vector<int32_t> pages;
    float* dst = nullptr;
    size_t bytes = 0;
    device::PinnedBuffer staging;
    cudaEvent_t done = nullptr;
    bool ended = false;  // drained: result holds the outcome
    Status result;
  };
  Result<device::PinnedBuffer> take_staging(size_t bytes);
  // Ends r after its event reported `q`: fills dst on success, recycles staging and event.
  void end(Read& r, cudaError_t q);
  Result<bool> spend(size_t i);

  int64_t limit_;
  int64_t staged_ = 0;  // pinned bytes held, in flight and free
  int64_t next_ = 0;
  device::Stream side_;
  cudaEvent_t ordered_ = nullptr;  // recorded on the compute stream, waited for by side_
  std::vector<std::unique_ptr<Read>> reads_;
  std::vector<device::PinnedBuffer> free_staging_;
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace dsinfer::gpu
