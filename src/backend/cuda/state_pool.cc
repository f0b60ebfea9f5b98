#include "backend/cuda/state_pool.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/strings.h"
#include "device/device_error.h"

namespace dsinfer::gpu {

Status grow_state_pool(
    StatePool* pool, const state::PageArena& arena, cudaStream_t s, const char* what, bool* grew) {
  *grew = false;
  const int64_t need = arena.num_pages();
  if (pool->pages >= need)
    return Status();
  // Growable arenas: grow by half again, keeping the contents.
  const int64_t pages = std::max(need, pool->pages + pool->pages / 2);
  float* p = nullptr;
  DSI_RETURN_IF_ERROR(device::check_cuda(
      cudaMalloc(reinterpret_cast<void**>(&p), static_cast<size_t>(pages * arena.page_bytes())),
      str_format("cudaMalloc of the %s (%lld pages of %lld bytes)",
                 what,
                 static_cast<long long>(pages),
                 static_cast<long long>(arena.page_bytes()))
          .c_str()));
  if (pool->p) {
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaMemcpyAsync(p,
                                           pool->p,
                                           static_cast<size_t>(pool->pages * arena.page_bytes()),
                                           cudaMemcpyDeviceToDevice,
                                           s),
                           "growing the state pool"));
    DSI_RETURN_IF_ERROR(device::sync_stream(s, "growing the state pool"));
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaFree(pool->p), "cudaFree"));
  }
  pool->p = p;
  pool->pages = pages;
  *grew = true;
  return Status();
}

Status copy_pool_pages(float* pool,
                       int64_t page_floats,
                       const std::vector<std::pair<int32_t, int32_t>>& pairs,
                       cudaStream_t s) {
  for (const auto& [from, to] : pairs) {
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaMemcpyAsync(pool + to * page_floats,
                                                           pool + from * page_floats,
                                                           static_cast<size_t>(page_floats * 4),
                                                           cudaMemcpyDeviceToDevice,
                                                           s),
                                           "copying state pages"));
  }
  return device::sync_stream(s, "copying state pages");
}

Status read_pool_pages(const float* pool,
                       int64_t page_floats,
                       std::span<const int32_t> pages,
                       float* dst,
                       cudaStream_t s) {
  for (size_t i = 0; i < pages.size(); ++i) {
    DSI_CHECK(pages[i] >= 0, "read_state_pages: page %d", pages[i]);
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaMemcpyAsync(dst + static_cast<int64_t>(i) * page_floats,
                                           pool + pages[i] * page_floats,
                                           static_cast<size_t>(page_floats * 4),
                                           cudaMemcpyDeviceToHost,
                                           s),
                           "reading state pages"));
  }
  return device::sync_stream(s, "reading state pages");
}

Status write_pool_pages(float* pool,
                        int64_t page_floats,
                        std::span<const int32_t> pages,
                        const float* src,
                        cudaStream_t s) {
  for (size_t i = 0; i < pages.size(); ++i) {
    DSI_CHECK(pages[i] >= 0, "write_state_pages: page %d", pages[i]);
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaMemcpyAsync(pool + pages[i] * page_floats,
                                           src + static_cast<int64_t>(i) * page_floats,
                                           static_cast<size_t>(page_floats * 4),
                                           cudaMemcpyHostToDevice,
                                           s),
                           "writing state pages"));
  }
  return device::sync_stream(s, "writing state pages");
}

AsyncPageReads::AsyncPageReads(int64_t staging_limit) : limit_(staging_limit) {}

AsyncPageReads::~AsyncPageReads() {
  // Nothing may still write into staging or read the pool after this; a failed device only
  // makes these calls return errors, which are ignored here.
  for (auto& r : reads_) {
    if (r->done) {
      if (!r->ended)
        (void)cudaEventSynchronize(r->done);
      (void)cudaEventDestroy(r->done);
    }
  }
  reads_.clear();
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  if (ordered_)
    (void)cudaEventDestroy(ordered_);
}

Result<device::PinnedBuffer> AsyncPageReads::take_staging(size_t bytes) {
  // The smallest free buffer that holds the read.
  size_t best = free_staging_.size();
  for (size_t i = 0; i < free_staging_.size(); ++i) {
    if (free_staging_[i].size() >= bytes &&
        (best == free_staging_.size() || free_staging_[i].size() < free_staging_[best].size()))
      best = i;
  }
  if (best < free_staging_.size()) {
    device::PinnedBuffer b = std::move(free_staging_[best]);
    free_staging_.erase(free_staging_.begin() + static_cast<std::ptrdiff_t>(best));
    return b;
  }
  // A new one within the limit, giving back free buffers too small to serve this read.
  while (staged_ + static_cast<int64_t>(bytes) > limit_ && !free_staging_.empty()) {
    staged_ -= static_cast<int64_t>(free_staging_.back().size());
    free_staging_.pop_back();
  }
  if (staged_ + static_cast<int64_t>(bytes) > limit_)
    return Status(StatusCode::kResourceExhausted,
                  str_format("background page reads: %lld bytes of pinned staging in use, limit "
                             "%lld",
                             static_cast<long long>(staged_),
                             static_cast<long long>(limit_)));
  DSI_ASSIGN_OR_RETURN(device::PinnedBuffer b, device::PinnedBuffer::allocate(bytes));
  staged_ += static_cast<int64_t>(b.size());
  return b;
}

Result<int64_t> AsyncPageReads::begin(const float* pool,
                                      int64_t page_floats,
                                      std::span<const int32_t> pages,
                                      float* dst,
                                      cudaStream_t compute) {
  if (!side_.valid()) {
    DSI_ASSIGN_OR_RETURN(side_, device::Stream::create(/*non_blocking=*/true));
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaEventCreateWithFlags(&ordered_, cudaEventDisableTiming), "cudaEventCreate"));
  }
  const size_t page_bytes = static_cast<size_t>(page_floats) * sizeof(float);
  auto r = std::make_unique<Read>();
  r->pages.assign(pages.begin(), pages.end());
  r->dst = dst;
  r->bytes = pages.size() * page_bytes;
  if (!free_events_.empty()) {
    r->done = free_events_.back();
    free_events_.pop_back();
  } else {
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming), "cudaEventCreate"));
  }
  auto staging = take_staging(std::max<size_t>(r->bytes, 1));
  if (!staging.ok()) {
    free_events_.push_back(r->done);
    return staging.status();
  }
  r->staging = std::move(staging).value();
  auto fail = [&](const Status& s) {
    free_events_.push_back(r->done);  // never recorded, or recorded before the failure
    free_staging_.push_back(std::move(r->staging));
    return s;
  };
  Status s = device::check_cuda(cudaEventRecord(ordered_, compute), "cudaEventRecord");
  if (s.ok())
    s = device::check_cuda(cudaStreamWaitEvent(side_.get(), ordered_, 0), "cudaStreamWaitEvent");
  // Runs of consecutive pages in one copy each.
  char* host = r->staging.as<char>();
  for (size_t i = 0; s.ok() && i < pages.size();) {
    DSI_CHECK(pages[i] >= 0, "begin_read_state_pages: page %d", pages[i]);
    size_t j = i + 1;
    while (j < pages.size() && pages[j] == pages[j - 1] + 1) ++j;
    s = device::check_cuda(cudaMemcpyAsync(host + i * page_bytes,
                                           pool + static_cast<int64_t>(pages[i]) * page_floats,
                                           (j - i) * page_bytes,
                                           cudaMemcpyDeviceToHost,
                                           side_.get()),
                           "reading state pages in the background");
    i = j;
  }
  if (s.ok())
    s = device::check_cuda(cudaEventRecord(r->done, side_.get()), "cudaEventRecord");
  if (!s.ok()) {
    // Copies already queued may still run: wait for them before the staging is reused.
    (void)cudaStreamSynchronize(side_.get());
    return fail(s);
  }
  r->ticket = ++next_;
  reads_.push_back(std::move(r));
  return next_;
}

void AsyncPageReads::end(Read& r, cudaError_t q) {
  if (q == cudaSuccess) {
    if (r.bytes > 0)
      std::memcpy(r.dst, r.staging.get(), r.bytes);
    r.result = Status();
  } else {
    r.result = device::check_cuda(q, "reading state pages in the background");
  }
  r.ended = true;
  free_events_.push_back(r.done);
  r.done = nullptr;
  free_staging_.push_back(std::move(r.staging));
}

Result<bool> AsyncPageReads::spend(size_t i) {
  const Status s = reads_[i]->result;
  reads_.erase(reads_.begin() + static_cast<std::ptrdiff_t>(i));
  if (!s.ok())
    return s;
  return true;
}

Result<bool> AsyncPageReads::poll(int64_t ticket) {
  for (size_t i = 0; i < reads_.size(); ++i) {
    Read& r = *reads_[i];
    if (r.ticket != ticket)
      continue;
    if (!r.ended) {
      const cudaError_t q = cudaEventQuery(r.done);
      if (q == cudaErrorNotReady)
        return false;
      end(r, q);
    }
    return spend(i);
  }
  return Status(StatusCode::kInvalidArgument, "background page reads: unknown ticket");
}

Status AsyncPageReads::wait(int64_t ticket) {
  for (size_t i = 0; i < reads_.size(); ++i) {
    Read& r = *reads_[i];
    if (r.ticket != ticket)
      continue;
    if (!r.ended)
      end(r, cudaEventSynchronize(r.done));
    return spend(i).status();
  }
  return Status(StatusCode::kInvalidArgument, "background page reads: unknown ticket");
}

Status AsyncPageReads::drain() {
  Status first;
  for (auto& r : reads_) {
    if (r->ended)
      continue;
    end(*r, cudaEventSynchronize(r->done));
    if (first.ok() && !r->result.ok())
      first = r->result;
  }
  return first;
}

void AsyncPageReads::check_not_reading(std::span<const int32_t> pages, const char* what) const {
  for (const auto& r : reads_) {
    if (r->ended)
      continue;
    for (int32_t p : pages) {
      DSI_CHECK(std::find(r->pages.begin(), r->pages.end(), p) == r->pages.end(),
                "%s: page %d is being read in the background",
                what,
                p);
    }
  }
}

void AsyncPageReads::check_not_reading(const std::vector<std::pair<int32_t, int32_t>>& pairs,
                                       const char* what) const {
  for (const auto& r : reads_) {
    if (r->ended)
      continue;
    for (const auto& [from, to] : pairs) {
      DSI_CHECK(std::find(r->pages.begin(), r->pages.end(), to) == r->pages.end(),
                "%s: page %d is being read in the background",
                what,
                to);
    }
  }
}

}  // namespace dsinfer::gpu
