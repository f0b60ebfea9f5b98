// PageArena: one memory budget carved into fixed-size pages, shared by every kind of per-sequence
// state (window rings, CSA/HCA compressed entries, indexer keys, compressor partial rows). Each
// page is owned by exactly one (sequence, layer, kind) or is free; check_integrity() verifies
// that. Not thread-safe: the engine's step loop owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/check.h"
#include "base/status.h"

namespace dsinfer::state {

enum class StateKind : uint8_t { kWindow = 0, kCompressed, kIndexKeys, kPartial, kMtp, kCount };
const char* state_kind_name(StateKind k);

struct PageOwner {
  int64_t sequence = -1;  // -1 = free
  int32_t layer = -1;
  StateKind kind = StateKind::kWindow;
};

class PageArena {
 public:
  // Where page contents live. kHost: the arena owns host memory for every page (the CPU
  // backend). kNone: the arena only hands out page ids and tracks owners; the contents live
  // elsewhere (the CUDA backend mirrors the pages in device memory) and page() must not be used.
  enum class Storage { kHost, kNone };
  // A fixed budget: floor(budget_bytes / page_bytes) pages.
  static std::unique_ptr<PageArena> with_budget(int64_t budget_bytes,
                                                int64_t page_bytes,
                                                Storage storage = Storage::kHost);
  // No fixed budget: pages are added on demand (offline tools and tests).
  static std::unique_ptr<PageArena> growable(int64_t page_bytes, Storage storage = Storage::kHost);

  int64_t page_bytes() const { return page_bytes_; }
  int64_t page_floats() const { return page_bytes_ / 4; }
  int64_t num_pages() const { return static_cast<int64_t>(owners_.size()); }
  int64_t num_free() const {
    return static_cast<int64_t>(free_.size()) + (growable_ ? 1 << 30 : 0);
  }
  bool growable() const { return growable_; }
  bool has_host_storage() const { return storage_ == Storage::kHost; }

  // Allocates one page for `owner`; -1 when the budget is exhausted.
  int32_t alloc(const PageOwner& owner);
  void free(int32_t page);
  float* page(int32_t id) {
    DSI_CHECK(
        storage_ == Storage::kHost, "page %d has no host storage (device-mirrored arena)", id);
    return chunks_[id / kChunkPages].get() + (id % kChunkPages) * page_floats();
  }
  const float* page(int32_t id) const {
    DSI_CHECK(
        storage_ == Storage::kHost, "page %d has no host storage (device-mirrored arena)", id);
    return chunks_[id / kChunkPages].get() + (id % kChunkPages) * page_floats();
  }
  const PageOwner& owner(int32_t id) const { return owners_[static_cast<size_t>(id)]; }
  // Bytes in use per kind.
  int64_t used_bytes(StateKind k) const { return used_pages_[static_cast<int>(k)] * page_bytes_; }
  int64_t used_bytes() const;
  // Aborts when the free list and the owner table disagree.
  void check_integrity() const;

 private:
  static constexpr int64_t kChunkPages = 256;
  PageArena(int64_t page_bytes, bool growable, Storage storage)
      : page_bytes_(page_bytes), growable_(growable), storage_(storage) {}
  void add_chunk();
  int64_t page_bytes_;
  bool growable_;
  Storage storage_;
  int64_t num_chunks_ = 0;
  std::vector<std::unique_ptr<float[]>> chunks_;  // empty with Storage::kNone
  std::vector<PageOwner> owners_;
  std::vector<int32_t> free_;
  int64_t used_pages_[static_cast<int>(StateKind::kCount)] = {};
};

// A sequence of fixed-width float rows stored in arena pages (rows never straddle pages).
// Used both as a growable array (compressed entries, index keys) and, indexed modulo a fixed
// capacity, as a ring (window KV, compressor partial rows).
class PagedRows {
 public:
  PagedRows() = default;
  PagedRows(PageArena* arena, int64_t width, PageOwner owner);
  PagedRows(PagedRows&& o) noexcept { *this = std::move(o); }
  PagedRows& operator=(PagedRows&& o) noexcept;
  PagedRows(const PagedRows&) = delete;
  PagedRows& operator=(const PagedRows&) = delete;
  ~PagedRows() { release(); }

  int64_t width() const { return width_; }
  int64_t rows_per_page() const { return rows_per_page_; }
  // Rows backed by pages right now.
  int64_t capacity() const { return static_cast<int64_t>(pages_.size()) * rows_per_page_; }
  int64_t num_pages() const { return static_cast<int64_t>(pages_.size()); }
  // Pages needed to hold n rows.
  int64_t pages_for(int64_t n) const { return (n + rows_per_page_ - 1) / rows_per_page_; }
  // Makes rows [0, n) addressable; false (nothing allocated beyond what fit) when out of pages.
  bool reserve(int64_t n);
  // Frees pages not needed for rows [0, n).
  void shrink_to(int64_t n);
  float* row(int64_t i) {
    return arena_->page(pages_[static_cast<size_t>(i / rows_per_page_)]) +
           (i % rows_per_page_) * width_;
  }
  const float* row(int64_t i) const {
    return arena_->page(pages_[static_cast<size_t>(i / rows_per_page_)]) +
           (i % rows_per_page_) * width_;
  }
  const std::vector<int32_t>& pages() const { return pages_; }
  // Element offset of row i from the start of a pool of pages laid out by page id (the device
  // mirror of the arena): page_id * page_floats + (i % rows_per_page) * width.
  int64_t pool_offset(int64_t i) const {
    return static_cast<int64_t>(pages_[static_cast<size_t>(i / rows_per_page_)]) *
               (arena_->page_bytes() / 4) +
           (i % rows_per_page_) * width_;
  }
  const PageOwner& owner() const { return owner_; }
  void release();

 private:
  PageArena* arena_ = nullptr;
  int64_t width_ = 0;
  int64_t rows_per_page_ = 0;
  PageOwner owner_;
  std::vector<int32_t> pages_;
};

}  // namespace dsinfer::state
