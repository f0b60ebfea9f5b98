// HostPack: the index data of one forward (token ids, positions, key references, page tables,
// compressor plans) gathered on the host into typed arrays, laid out in one block, copied to the
// device with a single transfer and addressed by array id. With bucketed capacities the layout
// of a decode step depends only on its shape, so a CUDA graph captured once can be replayed over
// the next steps' data.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"

namespace dsinfer::gpu {

class HostPack {
 public:
  // Forgets the arrays but keeps their storage: a pack reused forward after forward copies into
  // memory it already touched (no page faults; an 8k-token prefill packs ~70 MB).
  void clear() {
    used_ = 0;
    total_ = 0;
    host_total_ = 0;
  }
  template <typename T>
  int32_t add(const std::vector<T>& v) {
    const int32_t id = add_slots(1);
    put(id, v);
    return id;
  }
  // An array of `count` T that only the device writes (e.g. key lists expanded by a kernel): it
  // takes room in the device layout, after every host array, and is never copied.
  template <typename T>
  int32_t reserve_device(int64_t count) {
    const int32_t id = add_slots(1);
    put_device<T>(id, count);
    return id;
  }
  // `n` arrays in a row, filled later by put / put_device (each exactly once): the ids first ..
  // first + n - 1. Filling distinct slots from several threads at once is safe; adding is not.
  int32_t add_slots(int32_t n) {
    const size_t first = used_;
    used_ += static_cast<size_t>(n);
    if (arrays_.size() < used_)
      arrays_.resize(used_);
    return static_cast<int32_t>(first);
  }
  template <typename T>
  void put(int32_t id, const std::vector<T>& v) {
    Array& a = slot(id);
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    a.bytes.assign(p, p + v.size() * sizeof(T));  // one pass, into the kept capacity
    a.device_bytes = -1;
  }
  template <typename T>
  void put_device(int32_t id, int64_t count) {
    Array& a = slot(id);
    a.bytes.clear();
    a.device_bytes = count * static_cast<int64_t>(sizeof(T));
  }
  // The host copy of an array (tests, diagnostics).
  template <typename T>
  std::vector<T> read(int32_t id) const {
    const auto& b = arrays_[static_cast<size_t>(id)].bytes;
    std::vector<T> v(b.size() / sizeof(T));
    if (!v.empty())
      std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
    return v;
  }
  // Lays the arrays out (256-byte aligned; host arrays first, then the device-only ones).
  // bucketed: each array's room is rounded up to a power of two (at least 256 bytes), so that
  // small changes of content keep the layout.
  void layout(bool bucketed);
  int64_t total_bytes() const { return total_; }
  // The prefix of the layout that holds host arrays: what copy_to writes and the device needs.
  int64_t host_bytes() const { return host_total_; }
  int64_t offset(int32_t id) const { return arrays_[static_cast<size_t>(id)].offset; }
  int64_t size_bytes(int32_t id) const {
    const Array& a = arrays_[static_cast<size_t>(id)];
    return a.device_bytes >= 0 ? a.device_bytes : static_cast<int64_t>(a.bytes.size());
  }
  // The room of every array (the layout): equal vectors mean equal layouts.
  std::vector<int64_t> layout_key() const;
  // Writes the host arrays at their offsets. With a pool, a large pack's arrays are copied by
  // its threads side by side.
  void copy_to(uint8_t* dst, ThreadPool* pool = nullptr) const;
  template <typename T>
  T* resolve(uint8_t* base, int32_t id) const {
    DSI_CHECK(id >= 0 && id < static_cast<int32_t>(used_), "pack array %d", id);
    return reinterpret_cast<T*>(base + offset(id));
  }

 private:
  struct Array {
    std::vector<uint8_t> bytes;
    int64_t device_bytes = -1;  // >= 0: a device-only array of this size (reserve_device)
    int64_t room = 0;
    int64_t offset = 0;
  };
  Array& slot(int32_t id) {
    DSI_CHECK(id >= 0 && static_cast<size_t>(id) < used_, "pack array %d", id);
    Array& a = arrays_[static_cast<size_t>(id)];
    a.room = 0;
    a.offset = 0;
    return a;
  }
  std::vector<Array> arrays_;  // [0, used_) are this pack's arrays; the rest keep storage
  size_t used_ = 0;
  int64_t total_ = 0;
  int64_t host_total_ = 0;
};

}  // namespace dsinfer::gpu
