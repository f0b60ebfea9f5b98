// The device mirror of a PageArena's pages (backends whose state lives on the GPU: the arena hands
// out page ids only): one device array of the arena's pages, grown with it, and the page copies
// of the backend seam (copy / read / write state pages, background reads and writes). Shared by
// CudaModel and CudaV41Backend.
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

// Page copies within the pool (pairs of from, to), each page page_floats floats, queued on s
// without waiting: every reader and writer of the pool works in s's order (forwards, page reads
// and writes, the next copies), so a fork's copy overlaps the forward still running. Runs of
// consecutive pairs are one copy each.
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

// Pinned host staging buffers and CUDA events reused between background page copies (reads and
// writes below), the buffers bounded in all by `limit` bytes (those held in flight included:
// the caller gives them back when their copy is done).
class StagingPool {
 public:
  explicit StagingPool(int64_t limit) : limit_(limit) {}
  ~StagingPool();  // destroys the free events
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  // The smallest free buffer of at least `bytes`, else a new one within the limit (giving back
  // free buffers too small to serve it); kResourceExhausted when the limit leaves no room.
  Result<device::PinnedBuffer> take(size_t bytes);
  void give(device::PinnedBuffer b) { free_.push_back(std::move(b)); }
  // Frees a buffer taken from here (its copies done) instead of keeping it for reuse.
  void release(device::PinnedBuffer b) {
    held_ -= static_cast<int64_t>(b.size());
    b.reset();
  }
  Result<cudaEvent_t> take_event();
  void give_event(cudaEvent_t e) { free_events_.push_back(e); }
  int64_t bytes() const { return held_; }

 private:
  int64_t limit_;
  int64_t held_ = 0;  // pinned bytes allocated, in use and free
  std::vector<device::PinnedBuffer> free_;
  std::vector<cudaEvent_t> free_events_;
};

// Queues the copies between pool pages pages[i] and host[i * page bytes] on s, one
// cudaMemcpyAsync per run of consecutive pages; device -> host (to_host) or host -> device.
// Returns at the first failed enqueue (copies queued before it may still run).
Status queue_page_copies(float* pool,
                         int64_t page_floats,
                         std::span<const int32_t> pages,
                         float* host,
                         bool to_host,
                         cudaStream_t s,
                         const char* what);

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
  int64_t staging_bytes() const { return staging_.bytes(); }

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
  // Ends r after its event reported `q`: fills dst on success, recycles staging and event.
  void end(Read& r, cudaError_t q);
  Result<bool> spend(size_t i);

  StagingPool staging_;
  int64_t next_ = 0;
  device::Stream side_;
  cudaEvent_t ordered_ = nullptr;  // recorded on the compute stream, waited for by side_
  std::vector<std::unique_ptr<Read>> reads_;
};

// Writes of pool pages from host memory that do not wait for the device (write_state_pages: the
// prefix cache's promotion of a stored image at admission). The source is copied into pinned
// staging on the host and the host -> device copies are queued on the compute stream itself, so
// that stream order alone puts them before the next forward (or page copy, or read) that uses
// the pages; the caller's memory is free again when write() returns. Staging is a ring of `slots`
// buffers of slot_bytes each (at least one page; allocated on first use), filled one after the
// other; an event recorded after the latest copies out of a buffer says when it may be refilled
// (cudaEventQuery). Only when the ring wraps onto a buffer whose copies are still running does
// write() wait, for that buffer's event (the oldest copies in flight): a promotion larger than
// the whole ring, or faster than the device drains it, blocks the caller for as long as it takes.
class AsyncPageWrites {
 public:
  explicit AsyncPageWrites(int slots = 4, int64_t slot_bytes = int64_t{16} << 20);
  ~AsyncPageWrites();  // waits for the copies in flight (their staging goes with this)
  AsyncPageWrites(const AsyncPageWrites&) = delete;
  AsyncPageWrites& operator=(const AsyncPageWrites&) = delete;

  // pages[i] of `pool` = src[i] (page_floats floats each), queued on `compute` after the work
  // queued there so far. A failed enqueue is its Status (after the compute stream is synced, so
  // that no staging is refilled under a copy queued before the failure); a device error seen on
  // an event is returned too.
  Status write(float* pool,
               int64_t page_floats,
               std::span<const int32_t> pages,
               const float* src,
               cudaStream_t compute);
  // Blocks until every queued copy is done.
  Status drain();
  // Buffers whose copies have not been seen done yet (cudaEventQuery, without waiting).
  int64_t in_flight();
  int64_t waits() const { return waits_; }  // times write() waited for a busy buffer
  int64_t staging_bytes() const { return staging_.bytes(); }

 private:
  struct Slot {
    device::PinnedBuffer buf;
    size_t used = 0;
    cudaEvent_t done = nullptr;
    bool recorded = false;  // done was recorded after copies out of buf
  };
  // Makes slot i empty: waits for its copies (counted in waits_ when they were still running).
  Status reclaim(Slot& slot);

  int slots_;
  int64_t slot_bytes_;
  StagingPool staging_;
  std::vector<Slot> ring_;
  size_t cur_ = 0;
  int64_t waits_ = 0;
};

}  // namespace dsinfer::gpu
