// Hasher: two 64-bit lanes over 8-byte little-endian words.
#include "kvstore/hash.h"

#include <cstring>

namespace dsinfer::kvstore {
namespace {
constexpr uint64_t kMulA = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kMulB = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kMulC = 0x165667b19e3779f9ull;

uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

// Avalanche: every input bit affects every output bit.
uint64_t avalanche(uint64_t x) {
  x ^= x >> 31;
  x *= kMulB;
  x ^= x >> 29;
  x *= kMulC;
  x ^= x >> 32;
  return x;
}
}  // namespace

std::string Key128::hex() const {
  static const char* d = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[static_cast<size_t>(i)] = d[(hi >> (60 - 4 * i)) & 15];
    s[static_cast<size_t>(16 + i)] = d[(lo >> (60 - 4 * i)) & 15];
  }
  return s;
}

bool Key128::from_hex(std::string_view s, Key128* out) {
  if (s.size() != 32)
    return false;
  uint64_t v[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const char c = s[i];
    int x;
    if (c >= '0' && c <= '9')
      x = c - '0';
    else if (c >= 'a' && c <= 'f')
      x = c - 'a' + 10;
    else
      return false;
    v[i / 16] = (v[i / 16] << 4) | static_cast<uint64_t>(x);
  }
  out->hi = v[0];
  out->lo = v[1];
  return true;
}

void Hasher::word(uint64_t w) {
  a_ = rotl(a_ ^ (w * kMulA), 27) * kMulB + kMulC;
  b_ = rotl(b_ + (w ^ kMulC) * kMulB, 31) * kMulA ^ a_;
}

Hasher& Hasher::bytes(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  length_ += n;
  while (n > 0) {
    if (pending_bytes_ == 0 && n >= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      word(w);
      p += 8;
      n -= 8;
      continue;
    }
    pending_ |= static_cast<uint64_t>(*p) << (8 * pending_bytes_);
    ++p;
    --n;
    if (++pending_bytes_ == 8) {
      word(pending_);
      pending_ = 0;
      pending_bytes_ = 0;
    }
  }
  return *this;
}

Key128 Hasher::finish() const {
  Hasher h = *this;
  if (h.pending_bytes_ > 0)
    h.word(h.pending_ ^ (static_cast<uint64_t>(h.pending_bytes_) << 56));
  h.word(h.length_);
  Key128 k;
  k.hi = avalanche(h.a_ ^ rotl(h.b_, 17));
  k.lo = avalanche(h.b_ + h.a_ * kMulA);
  return k;
}

uint64_t checksum64(const void* data, size_t n) {
  return Hasher().bytes(data, n).finish().lo;
}

}  // namespace dsinfer::kvstore
