// Fixed-layout binary records (host byte order, as the files are only read back on the machine
// that wrote them): appending plain values to a string and reading them back with bounds checks.
// Shared by the KV store's entry files (kvstore/entry_file.cc) and sequence-state images
// (state/state_image.cc).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace dsinfer {

template <typename T>
void append_pod(std::string& s, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  s.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

class ByteReader {
 public:
  explicit ByteReader(std::string_view s) : s_(s) {}
  // The next sizeof(T) bytes as a T; false (nothing read) when fewer are left.
  template <typename T>
  bool get(T* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (s_.size() - pos_ < sizeof(T))
      return false;
    std::memcpy(v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // The next n floats; false (nothing read) when n < 0 or fewer are left.
  bool floats(float* dst, int64_t n) {
    if (n < 0 || (s_.size() - pos_) / 4 < static_cast<uint64_t>(n))
      return false;
    std::memcpy(dst, s_.data() + pos_, static_cast<size_t>(n) * 4);
    pos_ += static_cast<size_t>(n) * 4;
    return true;
  }
  size_t pos() const { return pos_; }
  size_t left() const { return s_.size() - pos_; }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace dsinfer
