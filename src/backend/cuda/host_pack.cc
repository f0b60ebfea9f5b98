#include "backend/cuda/host_pack.h"

#include <algorithm>

namespace dsinfer::gpu {

void HostPack::layout(bool bucketed) {
  int64_t off = 0;
  for (int pass = 0; pass < 2; ++pass) {  // host arrays, then device-only ones
    for (size_t i = 0; i < used_; ++i) {
      Array& a = arrays_[i];
      if ((a.device_bytes >= 0) != (pass == 1))
        continue;
      const int64_t size =
          a.device_bytes >= 0 ? a.device_bytes : static_cast<int64_t>(a.bytes.size());
      int64_t room = std::max<int64_t>(size, 8);
      if (bucketed) {
        int64_t r = 256;
        while (r < room) r *= 2;
        room = r;
      }
      a.offset = off;
      a.room = room;
      off = (off + room + 255) / 256 * 256;
    }
    if (pass == 0)
      host_total_ = off;
  }
  total_ = off;
}

std::vector<int64_t> HostPack::layout_key() const {
  std::vector<int64_t> k;
  k.reserve(used_);
  for (size_t i = 0; i < used_; ++i) k.push_back(arrays_[i].room);
  return k;
}

void HostPack::copy_to(uint8_t* dst, ThreadPool* pool) const {
  auto one = [&](int64_t i) {
    const Array& a = arrays_[static_cast<size_t>(i)];
    if (!a.bytes.empty())
      std::memcpy(dst + a.offset, a.bytes.data(), a.bytes.size());
  };
  // (A 256-sequence decode step of the bundled model packs 0.4 MB in ~100 arrays.)
  constexpr int64_t kParallelBytes = 256 << 10;
  if (pool != nullptr && host_total_ >= kParallelBytes) {
    pool->run(static_cast<int64_t>(used_), one);
  } else {
    for (size_t i = 0; i < used_; ++i) one(static_cast<int64_t>(i));
  }
}

}  // namespace dsinfer::gpu
