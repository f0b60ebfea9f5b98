// Caching device allocator, device and pinned buffers.
#include "device/allocator.h"

#include <string>

#include "device/device_error.h"
#include "kernels/cuda/cuda_check.h"

namespace dsinfer::device {

size_t CachingAllocator::size_class(size_t bytes) {
  constexpr size_t kMin = 512;
  constexpr size_t kSmall = size_t{1} << 20;
  if (bytes <= kMin)
    return kMin;
  if (bytes <= kSmall)
    return (bytes + kMin - 1) / kMin * kMin;
  size_t floor_pow2 = kSmall;
  while (floor_pow2 <= bytes / 2) floor_pow2 *= 2;
  const size_t step = floor_pow2 / 4;
  return (bytes + step - 1) / step * step;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  DSI_CHECK(live_.empty() || device_failed(),
            "CachingAllocator destroyed with %zu live blocks (%lld bytes)",
            live_.size(),
            static_cast<long long>(stats_.in_use_bytes));
  for (auto& [key, blocks] : free_) {
    for (void* p : blocks) {
      const cudaError_t err = cudaFree(p);
      DSI_CHECK(release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
    }
  }
  free_.clear();
}

Result<void*> CachingAllocator::allocate(size_t bytes, cudaStream_t stream) {
  if (bytes == 0)
    return invalid_argument("CachingAllocator::allocate: zero bytes");
  DSI_RETURN_IF_ERROR(device_failure());
  const size_t size = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = free_.find(FreeKey{stream, size});
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= static_cast<int64_t>(size);
    ++stats_.num_cache_hits;
  } else {
    const auto budget = static_cast<size_t>(options_.max_reserved_bytes);
    auto over_budget = [&] {
      return budget > 0 && static_cast<size_t>(stats_.reserved_bytes) + size > budget;
    };
    cudaError_t err = over_budget() ? cudaErrorMemoryAllocation : cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the (non-sticky) OOM
      ++stats_.num_oom_retries;
      DSI_RETURN_IF_ERROR(trim_locked());
      err = over_budget() ? cudaErrorMemoryAllocation : cudaMalloc(&p, size);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return Status(StatusCode::kResourceExhausted,
                      "device allocation of " + std::to_string(bytes) + " bytes failed (" +
                          std::to_string(stats_.in_use_bytes) + " bytes in use" +
                          (budget > 0 ? ", budget " + std::to_string(budget) : std::string()) +
                          ")");
      }
    }
    DSI_RETURN_IF_ERROR(check_cuda(err, "cudaMalloc"));
    ++stats_.num_cuda_mallocs;
    stats_.reserved_bytes += static_cast<int64_t>(size);
  }
  live_[p] = Block{size, bytes, stream};
  ++stats_.num_allocs;
  stats_.in_use_bytes += static_cast<int64_t>(size);
  stats_.requested_bytes += static_cast<int64_t>(bytes);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return p;
}

void CachingAllocator::deallocate(void* p) {
  if (p == nullptr)
    return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  DSI_CHECK(it != live_.end(), "deallocate of unknown device pointer %p", p);
  const Block b = it->second;
  live_.erase(it);
  stats_.in_use_bytes -= static_cast<int64_t>(b.size);
  stats_.requested_bytes -= static_cast<int64_t>(b.requested);
  stats_.cached_bytes += static_cast<int64_t>(b.size);
  free_[FreeKey{b.stream, b.size}].push_back(p);
}

Status CachingAllocator::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  return trim_locked();
}

Status CachingAllocator::trim_locked() {
  if (stats_.cached_bytes == 0)
    return Status();
  // Cached blocks may still be in use by queued work on their streams.
  DSI_RETURN_IF_ERROR(check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (trim)"));
  for (auto& [key, blocks] : free_) {
    for (void* p : blocks) {
      DSI_RETURN_IF_ERROR(check_cuda(cudaFree(p), "cudaFree"));
      ++stats_.num_cuda_frees;
      stats_.reserved_bytes -= static_cast<int64_t>(key.second);
      stats_.cached_bytes -= static_cast<int64_t>(key.second);
    }
    blocks.clear();
  }
  free_.clear();
  return Status();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Result<DeviceBuffer> DeviceBuffer::allocate(CachingAllocator& alloc,
                                            size_t bytes,
                                            cudaStream_t stream) {
  DeviceBuffer b;
  if (bytes == 0)
    return b;
  DSI_ASSIGN_OR_RETURN(b.p_, alloc.allocate(bytes, stream));
  b.alloc_ = &alloc;
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    alloc_ = o.alloc_;
    p_ = o.p_;
    bytes_ = o.bytes_;
    o.alloc_ = nullptr;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (p_ != nullptr)
    alloc_->deallocate(p_);
  alloc_ = nullptr;
  p_ = nullptr;
  bytes_ = 0;
}

Result<PinnedBuffer> PinnedBuffer::allocate(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0)
    return b;
  DSI_RETURN_IF_ERROR(
      check_cuda(cudaHostAlloc(&b.p_, bytes, cudaHostAllocDefault), "cudaHostAlloc"));
  b.bytes_ = bytes;
  return b;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    p_ = o.p_;
    bytes_ = o.bytes_;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void PinnedBuffer::reset() {
  if (p_ != nullptr) {
    const cudaError_t err = cudaFreeHost(p_);
    DSI_CHECK(release_ok(err), "cudaFreeHost: %s", cudaGetErrorString(err));
  }
  p_ = nullptr;
  bytes_ = 0;
}

}  // namespace dsinfer::device
