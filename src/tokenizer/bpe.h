// Byte-level BPE model: initial symbols are the bytes of a pre-token (each byte stands for its
// GPT-2 printable character in the vocabulary), then the adjacent pair with the lowest merge rank
// is merged (leftmost first on ties) until no pair has a merge. Results for short pre-tokens are
// cached.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dsinfer::tokenizer {

// Open-addressing map (pair of ids) -> (merge rank, merged id).
class MergeTable {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n);
  // Later insertions of the same pair replace earlier ones (as a later merges entry does in HF).
  void insert(int32_t a, int32_t b, Value v);
  const Value* find(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    size_t i = slot(key);
    while (true) {
      const Entry& e = entries_[i];
      if (e.key == key)
        return &e.value;
      if (e.key == kEmpty)
        return nullptr;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Entry {
    uint64_t key = kEmpty;
    Value value{};
  };
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  std::vector<Entry> entries_ = std::vector<Entry>(1);
  size_t mask_ = 0;
  int shift_ = 63;
  size_t size_ = 0;
};

class BpeModel {
 public:
  // How one input byte becomes initial symbols (HF BPE: the byte's stand-in character is looked
  // up in the vocabulary; else byte fallback <0xXX> tokens of that character's UTF-8 bytes; else
  // the unknown token; else the byte is dropped).
  struct ByteInit {
    std::vector<int32_t> ids;  // empty: unknown
  };

  BpeModel() = default;
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  std::array<ByteInit, 256> byte_init;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  MergeTable merges;
  bool ignore_merges = false;
  // Raw-bytes spelling -> id of vocabulary entries made only of byte stand-ins
  // (used when ignore_merges is set).
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> byte_vocab;

  // Appends the ids of one pre-token (raw bytes). Thread-safe.
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;

  // Drops all cached words.
  void clear_cache() const;

 private:
  void merge_small(std::vector<int32_t>* syms) const;
  void merge_heap(std::vector<int32_t>* syms) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>* syms) const;

  static constexpr size_t kMaxCachedLen = 96;
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxEntriesPerShard = 8192;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  mutable std::array<Shard, kShards> cache_;
};

}  // namespace dsinfer::tokenizer
