// Caching device allocator over cudaMalloc (never managed memory).
//
// Requests are rounded up to a size class; freed blocks go to a free list keyed by (stream,
// class) and are handed out again to the next request of the same class on the same stream
// without a cudaMalloc/cudaFree (both synchronise the device). Reuse is stream-ordered: a block
// freed while kernels on its stream may still use it is only reused by later work on that same
// stream, which runs after them. A block used on several streams must be freed only after those
// streams are synchronised with its allocation stream (the caller's job, as with cudaFreeAsync).
//
// When cudaMalloc fails (or the optional budget would be exceeded) the allocator synchronises the
// device, releases every cached block and retries once; a second failure is kResourceExhausted.
// Thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dsinfer::device {

struct AllocatorStats {
  int64_t in_use_bytes = 0;       // class bytes of live blocks
  int64_t cached_bytes = 0;       // class bytes of free blocks kept for reuse
  int64_t reserved_bytes = 0;     // in_use + cached: what cudaMalloc handed out
  int64_t peak_in_use_bytes = 0;  // high-water mark of in_use_bytes
  int64_t requested_bytes = 0;    // sum of live requests before rounding
  int64_t num_allocs = 0;         // successful allocate() calls
  int64_t num_cache_hits = 0;     // ... served from a free list
  int64_t num_cuda_mallocs = 0;
  int64_t num_cuda_frees = 0;
  int64_t num_oom_retries = 0;  // allocate() calls that had to trim and retry
};

struct AllocatorOptions {
  int64_t max_reserved_bytes = 0;  // 0: no budget beyond the device's memory
};

class CachingAllocator {
 public:
  explicit CachingAllocator(AllocatorOptions options = {}) : options_(options) {}
  // Releases the cached blocks. Live blocks at destruction are a leak and abort (DSI_CHECK)
  // unless the device failed (then nothing can be released anyway).
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Bytes actually reserved for a request of `bytes`: at least 512, then a multiple of 512 up to
  // 1 MiB, and above that a multiple of a quarter of the request's power-of-two floor (so at most
  // 25% is wasted and the number of classes stays small).
  static size_t size_class(size_t bytes);

  // A block of at least `bytes` (>= 1) usable on `stream`, 256-byte aligned.
  Result<void*> allocate(size_t bytes, cudaStream_t stream);
  // Returns a block to the free list of its stream. Unknown pointers abort (a bug).
  void deallocate(void* p);
  // Synchronises the device and cudaFree's every cached block.
  Status trim();
  AllocatorStats stats() const;

 private:
  struct Block {
    size_t size = 0;       // class bytes
    size_t requested = 0;  // request bytes
    cudaStream_t stream = nullptr;
  };
  using FreeKey = std::pair<cudaStream_t, size_t>;
  Status trim_locked();

  AllocatorOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::map<FreeKey, std::vector<void*>> free_;
  AllocatorStats stats_;
};

// A move-only device allocation that returns itself to its allocator.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> allocate(CachingAllocator& alloc, size_t bytes, cudaStream_t stream);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return bytes_; }
  void reset();

 private:
  CachingAllocator* alloc_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory (cudaHostAlloc) for asynchronous copies. Move-only.
class PinnedBuffer {
 public:
  static Result<PinnedBuffer> allocate(size_t bytes);

  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }

  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return bytes_; }
  void reset();

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace dsinfer::device
