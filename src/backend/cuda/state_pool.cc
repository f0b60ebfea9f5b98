#include "backend/cuda/state_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "base/check.h"
#include "base/strings.h"
#include "device/device_error.h"

namespace dsinfer::gpu {

namespace {

// Calls copy(first, count) for each maximal run of indices [first, first + count) of [0, n) in
// which follows(i) holds for every i after the first (index i continues the pages of i - 1): one
// cudaMemcpyAsync per run of consecutive pages instead of one per page.
template <class Follows, class Copy>
Status for_each_run(size_t n, Follows follows, Copy copy) {
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && follows(j)) ++j;
    DSI_RETURN_IF_ERROR(copy(i, j - i));
    i = j;
  }
  return Status();
}

}  // namespace

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
  const size_t page_bytes = static_cast<size_t>(page_floats) * sizeof(float);
  // A run's source and destination pages do not overlap (fork_from's destinations are fresh).
  return for_each_run(
      pairs.size(),
      [&](size_t i) {
        return pairs[i].first == pairs[i - 1].first + 1 &&
               pairs[i].second == pairs[i - 1].second + 1;
      },
      [&](size_t i, size_t count) {
        return device::check_cuda(cudaMemcpyAsync(pool + pairs[i].second * page_floats,
                                                  pool + pairs[i].first * page_floats,
                                                  count * page_bytes,
                                                  cudaMemcpyDeviceToDevice,
                                                  s),
                                  "copying state pages");
      });
}

Status read_pool_pages(const float* pool,
                       int64_t page_floats,
                       std::span<const int32_t> pages,
                       float* dst,
                       cudaStream_t s) {
  DSI_RETURN_IF_ERROR(queue_page_copies(const_cast<float*>(pool),
                                        page_floats,
                                        pages,
                                        dst,
                                        /*to_host=*/true,
                                        s,
                                        "reading state pages"));
  return device::sync_stream(s, "reading state pages");
}

StagingPool::~StagingPool() {
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
}

Result<device::PinnedBuffer> StagingPool::take(size_t bytes) {
  // The smallest free buffer that holds the copy.
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i].size() >= bytes && (best == free_.size() || free_[i].size() < free_[best].size()))
      best = i;
  }
  if (best < free_.size()) {
    device::PinnedBuffer b = std::move(free_[best]);
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    return b;
  }
  // A new one within the limit, giving back free buffers too small to serve this copy.
  while (held_ + static_cast<int64_t>(bytes) > limit_ && !free_.empty()) {
    held_ -= static_cast<int64_t>(free_.back().size());
    free_.pop_back();
  }
  if (held_ + static_cast<int64_t>(bytes) > limit_)
    return Status(StatusCode::kResourceExhausted,
                  str_format("background page copies: %lld bytes of pinned staging in use, limit "
                             "%lld",
                             static_cast<long long>(held_),
                             static_cast<long long>(limit_)));
  DSI_ASSIGN_OR_RETURN(device::PinnedBuffer b, device::PinnedBuffer::allocate(bytes));
  held_ += static_cast<int64_t>(b.size());
  return b;
}

Result<cudaEvent_t> StagingPool::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
  return e;
}

Status queue_page_copies(float* pool,
                         int64_t page_floats,
                         std::span<const int32_t> pages,
                         float* host,
                         bool to_host,
                         cudaStream_t s,
                         const char* what) {
  const size_t page_bytes = static_cast<size_t>(page_floats) * sizeof(float);
  char* h = reinterpret_cast<char*>(host);
  return for_each_run(
      pages.size(),
      [&](size_t i) { return pages[i] == pages[i - 1] + 1; },
      [&](size_t i, size_t count) {
        DSI_CHECK(pages[i] >= 0, "%s: page %d", what, pages[i]);
        float* d = pool + static_cast<int64_t>(pages[i]) * page_floats;
        const size_t bytes = count * page_bytes;
        return device::check_cuda(
            to_host ? cudaMemcpyAsync(h + i * page_bytes, d, bytes, cudaMemcpyDeviceToHost, s)
                    : cudaMemcpyAsync(d, h + i * page_bytes, bytes, cudaMemcpyHostToDevice, s),
            what);
      });
}

AsyncPageReads::AsyncPageReads(int64_t staging_limit) : staging_(staging_limit) {}

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
  if (ordered_)
    (void)cudaEventDestroy(ordered_);
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
  DSI_ASSIGN_OR_RETURN(r->done, staging_.take_event());
  auto staging = staging_.take(std::max<size_t>(r->bytes, 1));
  if (!staging.ok()) {
    staging_.give_event(r->done);
    return staging.status();
  }
  r->staging = std::move(staging).value();
  auto fail = [&](const Status& s) {
    staging_.give_event(r->done);  // never recorded, or recorded before the failure
    staging_.give(std::move(r->staging));
    return s;
  };
  Status s = device::check_cuda(cudaEventRecord(ordered_, compute), "cudaEventRecord");
  if (s.ok())
    s = device::check_cuda(cudaStreamWaitEvent(side_.get(), ordered_, 0), "cudaStreamWaitEvent");
  if (s.ok())
    s = queue_page_copies(const_cast<float*>(pool),
                          page_floats,
                          pages,
                          r->staging.as<float>(),
                          /*to_host=*/true,
                          side_.get(),
                          "reading state pages in the background");
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
  staging_.give_event(r.done);
  r.done = nullptr;
  staging_.give(std::move(r.staging));
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

AsyncPageWrites::AsyncPageWrites(int slots, int64_t slot_bytes)
    : slots_(std::max(slots, 1)),
      slot_bytes_(std::max<int64_t>(slot_bytes, 1)),
      // Every slot may grow to one page above slot_bytes (a page larger than a slot).
      staging_(std::numeric_limits<int64_t>::max()) {}

AsyncPageWrites::~AsyncPageWrites() {
  // The staging must not be freed under a copy still reading it; errors are ignored here.
  for (Slot& slot : ring_) {
    if (slot.done) {
      if (slot.recorded)
        (void)cudaEventSynchronize(slot.done);
      staging_.give_event(slot.done);
    }
  }
}

Status AsyncPageWrites::reclaim(Slot& slot) {
  if (slot.recorded) {
    cudaError_t q = cudaEventQuery(slot.done);
    if (q == cudaErrorNotReady) {
      // The ring wrapped onto copies still running: the only wait on this path.
      ++waits_;
      q = cudaEventSynchronize(slot.done);
    }
    DSI_RETURN_IF_ERROR(device::check_cuda(q, "writing state pages"));
    slot.recorded = false;
  }
  slot.used = 0;
  return Status();
}

Status AsyncPageWrites::write(float* pool,
                              int64_t page_floats,
                              std::span<const int32_t> pages,
                              const float* src,
                              cudaStream_t compute) {
  const size_t page_bytes = static_cast<size_t>(page_floats) * sizeof(float);
  const size_t cap = std::max(static_cast<size_t>(slot_bytes_), page_bytes);
  for (size_t i = 0; i < pages.size();) {
    if (ring_.empty())
      ring_.emplace_back();
    Slot* slot = &ring_[cur_];
    if (slot->buf.size() - std::min(slot->buf.size(), slot->used) < page_bytes) {
      // No room for another page here: on to the next buffer of the ring (a new one while the
      // ring is not full), which must be done with its earlier copies.
      if (slot->buf.size() > 0) {
        if (ring_.size() < static_cast<size_t>(slots_)) {
          ring_.emplace_back();
          cur_ = ring_.size() - 1;
        } else {
          cur_ = (cur_ + 1) % ring_.size();
        }
        slot = &ring_[cur_];
      }
      DSI_RETURN_IF_ERROR(reclaim(*slot));
      if (slot->buf.size() < cap) {
        if (slot->buf.size() > 0)
          staging_.release(std::move(slot->buf));  // pages larger than the slots: grown
        DSI_ASSIGN_OR_RETURN(slot->buf, staging_.take(cap));
      }
      if (!slot->done) {
        DSI_ASSIGN_OR_RETURN(slot->done, staging_.take_event());
      }
    }
    // As many whole pages as the buffer still holds.
    const size_t n = std::min(pages.size() - i, (slot->buf.size() - slot->used) / page_bytes);
    char* host = slot->buf.as<char>() + slot->used;
    std::memcpy(host, src + i * static_cast<size_t>(page_floats), n * page_bytes);
    Status s = queue_page_copies(pool,
                                 page_floats,
                                 pages.subspan(i, n),
                                 reinterpret_cast<float*>(host),
                                 /*to_host=*/false,
                                 compute,
                                 "writing state pages");
    if (s.ok())
      s = device::check_cuda(cudaEventRecord(slot->done, compute), "cudaEventRecord");
    if (!s.ok()) {
      // Copies queued before the failure may still read this or other buffers: let them end
      // before anything is refilled (an error path only).
      (void)cudaStreamSynchronize(compute);
      for (Slot& o : ring_) {
        o.recorded = false;
        o.used = 0;
      }
      return s;
    }
    slot->recorded = true;
    slot->used += n * page_bytes;
    i += n;
  }
  return Status();
}

Status AsyncPageWrites::drain() {
  Status first;
  for (Slot& slot : ring_) {
    if (!slot.recorded)
      continue;
    const Status s = device::check_cuda(cudaEventSynchronize(slot.done), "writing state pages");
    slot.recorded = false;
    slot.used = 0;
    if (first.ok() && !s.ok())
      first = s;
  }
  return first;
}

int64_t AsyncPageWrites::in_flight() {
  int64_t n = 0;
  for (Slot& slot : ring_) {
    if (slot.recorded && cudaEventQuery(slot.done) == cudaErrorNotReady)
      ++n;
  }
  return n;
}

}  // namespace dsinfer::gpu
