// PageArena and PagedRows.
#include "state/page_arena.h"

#include <algorithm>

#include "base/check.h"

namespace dsinfer::state {

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::kWindow:
      return "window";
    case StateKind::kCompressed:
      return "compressed";
    case StateKind::kIndexKeys:
      return "index_keys";
    case StateKind::kPartial:
      return "partial";
    case StateKind::kMtp:
      return "mtp";
    case StateKind::kCount:
      break;
  }
  return "?";
}

std::unique_ptr<PageArena> PageArena::with_budget(int64_t budget_bytes,
                                                  int64_t page_bytes,
                                                  Storage storage) {
  DSI_CHECK(page_bytes >= 64 && page_bytes % 4 == 0,
            "page size %lld",
            static_cast<long long>(page_bytes));
  std::unique_ptr<PageArena> a(new PageArena(page_bytes, false, storage));
  const int64_t pages = budget_bytes / page_bytes;
  while (a->num_pages() < pages) a->add_chunk();
  // Trim the last chunk's surplus pages out of the free list.
  a->free_.clear();
  a->owners_.resize(static_cast<size_t>(pages));
  for (int64_t i = pages - 1; i >= 0; --i) a->free_.push_back(static_cast<int32_t>(i));
  return a;
}

std::unique_ptr<PageArena> PageArena::growable(int64_t page_bytes, Storage storage) {
  DSI_CHECK(page_bytes >= 64 && page_bytes % 4 == 0,
            "page size %lld",
            static_cast<long long>(page_bytes));
  return std::unique_ptr<PageArena>(new PageArena(page_bytes, true, storage));
}

void PageArena::add_chunk() {
  const int64_t first = num_chunks_ * kChunkPages;
  ++num_chunks_;
  if (storage_ == Storage::kHost)
    chunks_.push_back(std::make_unique<float[]>(static_cast<size_t>(kChunkPages * page_floats())));
  owners_.resize(static_cast<size_t>(first + kChunkPages));
  for (int64_t i = first + kChunkPages - 1; i >= first; --i)
    free_.push_back(static_cast<int32_t>(i));
}

int32_t PageArena::alloc(const PageOwner& owner) {
  DSI_CHECK(owner.sequence >= 0, "page owner needs a sequence");
  if (free_.empty()) {
    if (!growable_)
      return -1;
    add_chunk();
  }
  const int32_t id = free_.back();
  free_.pop_back();
  owners_[static_cast<size_t>(id)] = owner;
  ++used_pages_[static_cast<int>(owner.kind)];
  return id;
}

void PageArena::free(int32_t id) {
  DSI_CHECK(id >= 0 && id < num_pages(), "free of page %d", id);
  PageOwner& o = owners_[static_cast<size_t>(id)];
  DSI_CHECK(o.sequence >= 0, "double free of page %d", id);
  --used_pages_[static_cast<int>(o.kind)];
  o = PageOwner();
  free_.push_back(id);
}

int64_t PageArena::used_bytes() const {
  int64_t n = 0;
  for (int64_t u : used_pages_) n += u;
  return n * page_bytes_;
}

void PageArena::check_integrity() const {
  std::vector<char> is_free(owners_.size(), 0);
  for (int32_t id : free_) {
    DSI_CHECK(id >= 0 && id < num_pages(), "free list holds page %d", id);
    DSI_CHECK(!is_free[static_cast<size_t>(id)], "page %d twice in the free list", id);
    is_free[static_cast<size_t>(id)] = 1;
  }
  int64_t used[static_cast<int>(StateKind::kCount)] = {};
  for (size_t i = 0; i < owners_.size(); ++i) {
    const bool owned = owners_[i].sequence >= 0;
    DSI_CHECK(owned != static_cast<bool>(is_free[i]),
              "page %zu is %s",
              i,
              owned ? "both owned and free" : "neither owned nor free");
    if (owned)
      ++used[static_cast<int>(owners_[i].kind)];
  }
  for (int k = 0; k < static_cast<int>(StateKind::kCount); ++k) {
    DSI_CHECK(used[k] == used_pages_[k],
              "kind %s: %lld pages owned, counter says %lld",
              state_kind_name(static_cast<StateKind>(k)),
              static_cast<long long>(used[k]),
              static_cast<long long>(used_pages_[k]));
  }
}

PagedRows::PagedRows(PageArena* arena, int64_t width, PageOwner owner)
    : arena_(arena), width_(width), owner_(owner) {
  DSI_CHECK(width > 0 && width <= arena->page_floats(),
            "row width %lld does not fit a %lld-byte page",
            static_cast<long long>(width),
            static_cast<long long>(arena->page_bytes()));
  rows_per_page_ = arena->page_floats() / width;
}

PagedRows& PagedRows::operator=(PagedRows&& o) noexcept {
  if (this != &o) {
    release();
    arena_ = o.arena_;
    width_ = o.width_;
    rows_per_page_ = o.rows_per_page_;
    owner_ = o.owner_;
    pages_ = std::move(o.pages_);
    o.pages_.clear();
    o.arena_ = nullptr;
  }
  return *this;
}

bool PagedRows::reserve(int64_t n) {
  while (capacity() < n) {
    const int32_t id = arena_->alloc(owner_);
    if (id < 0)
      return false;
    pages_.push_back(id);
  }
  return true;
}

void PagedRows::shrink_to(int64_t n) {
  const int64_t keep = pages_for(n);
  while (static_cast<int64_t>(pages_.size()) > keep) {
    arena_->free(pages_.back());
    pages_.pop_back();
  }
}

void PagedRows::release() {
  if (arena_ == nullptr)
    return;
  for (int32_t id : pages_) arena_->free(id);
  pages_.clear();
}

}  // namespace dsinfer::state
