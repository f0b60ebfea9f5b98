// Seedless, process-independent hashing for the KV store: 128-bit keys (prefix-cache block
// chains, entry names) and 64-bit checksums (entry headers and payload blocks). Stable across
// processes and restarts, so keys written by one run are found by the next.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace dsinfer::kvstore {

struct Key128 {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator==(const Key128&) const = default;
  std::string hex() const;  // 32 lowercase hex digits
  // Parses hex(); false on anything else.
  static bool from_hex(std::string_view s, Key128* out);
};

struct Key128Hash {
  size_t operator()(const Key128& k) const { return static_cast<size_t>(k.hi ^ (k.lo * 31)); }
};

// Incremental 128-bit hash over bytes (two independent 64-bit lanes, each a multiply-rotate
// chain over 8-byte words, finalized with the length). Not cryptographic: tenants are separated
// by the salt being part of every key, not by the hash's strength.
class Hasher {
 public:
  Hasher& bytes(const void* data, size_t n);
  Hasher& u64(uint64_t v) { return bytes(&v, sizeof(v)); }
  Hasher& i64(int64_t v) { return bytes(&v, sizeof(v)); }
  Hasher& str(std::string_view s) {
    u64(s.size());
    return bytes(s.data(), s.size());
  }
  Key128 finish() const;

 private:
  void word(uint64_t w);
  uint64_t a_ = 0x6a09e667f3bcc908ull;
  uint64_t b_ = 0xbb67ae8584caa73bull;
  uint64_t pending_ = 0;
  int pending_bytes_ = 0;
  uint64_t length_ = 0;
};

// 64-bit checksum of a byte range.
uint64_t checksum64(const void* data, size_t n);

}  // namespace dsinfer::kvstore
