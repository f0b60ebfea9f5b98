// Workspace: a bump allocator over device blocks for one forward's activations. Allocation
// order is deterministic, so equal forward shapes get equal addresses (what CUDA graph replay
// needs). When a forward outgrows the blocks a new block is added; consolidate() merges them
// into one before the next forward (and reports that addresses moved).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/status.h"

namespace dsinfer::gpu {

class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  void reset() {
    block_ = 0;
    offset_ = 0;
  }
  // A position of the bump pointer: release(mark()) frees what was taken since (the stream
  // orders the reuse: later kernels on the same stream run after the earlier users).
  struct Mark {
    size_t block = 0;
    int64_t offset = 0;
  };
  Mark mark() const { return Mark{block_, offset_}; }
  void release(const Mark& m) {
    block_ = m.block;
    offset_ = m.offset;
  }
  // Merges the blocks into one when there are several; true when addresses moved.
  Result<bool> consolidate();
  template <typename T>
  Status get(T** p, int64_t n) {
    void* v = nullptr;
    DSI_RETURN_IF_ERROR(alloc(static_cast<int64_t>(sizeof(T)) * std::max<int64_t>(n, 1), &v));
    *p = static_cast<T*>(v);
    return Status();
  }
  int64_t bytes() const;

 private:
  Status alloc(int64_t bytes, void** out);
  struct Block {
    void* p = nullptr;
    int64_t size = 0;
  };
  std::vector<Block> blocks_;
  size_t block_ = 0;
  int64_t offset_ = 0;
};

}  // namespace dsinfer::gpu
