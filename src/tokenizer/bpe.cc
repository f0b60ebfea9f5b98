#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace dsinfer::tokenizer {

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  int bits = 4;
  while (cap < n * 2) {
    cap <<= 1;
    ++bits;
  }
  std::vector<Entry> old = std::move(entries_);
  entries_.assign(cap, Entry{});
  mask_ = cap - 1;
  shift_ = 64 - bits;
  size_ = 0;
  for (const Entry& e : old) {
    if (e.key != kEmpty) {
      insert(static_cast<int32_t>(e.key >> 32), static_cast<int32_t>(e.key & 0xFFFFFFFFu), e.value);
    }
  }
}

void MergeTable::insert(int32_t a, int32_t b, Value v) {
  if ((size_ + 1) * 2 > entries_.size())
    reserve(std::max<size_t>(16, (size_ + 1) * 2));
  const uint64_t key = pack(a, b);
  size_t i = slot(key);
  while (entries_[i].key != kEmpty && entries_[i].key != key) i = (i + 1) & mask_;
  if (entries_[i].key == kEmpty)
    ++size_;
  entries_[i].key = key;
  entries_[i].value = v;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>* syms) const {
  // Unknown bytes become the unknown token; with fuse_unk, a run of them becomes one.
  bool pending_unk = false;
  for (char c : word) {
    const ByteInit& init = byte_init[static_cast<uint8_t>(c)];
    if (!init.ids.empty()) {
      if (pending_unk) {
        syms->push_back(unk_id);
        pending_unk = false;
      }
      syms->insert(syms->end(), init.ids.begin(), init.ids.end());
      continue;
    }
    if (unk_id < 0)
      continue;
    if (pending_unk && !fuse_unk)
      syms->push_back(unk_id);
    pending_unk = true;
  }
  if (pending_unk)
    syms->push_back(unk_id);
}

// Quadratic scan for short words: repeatedly merge the adjacent pair with the lowest rank,
// the leftmost one on ties. Same result as the heap below.
void BpeModel::merge_small(std::vector<int32_t>* syms) const {
  std::vector<int32_t>& s = *syms;
  size_t n = s.size();
  if (n < 2)
    return;
  constexpr int32_t kNone = INT32_MAX;
  int32_t rank[64];
  int32_t merged[64];
  for (size_t i = 0; i + 1 < n; ++i) {
    const MergeTable::Value* v = merges.find(s[i], s[i + 1]);
    rank[i] = v ? v->rank : kNone;
    merged[i] = v ? v->id : -1;
  }
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < rank[best])
        best = i;
    }
    if (rank[best] == kNone)
      break;
    s[best] = merged[best];
    const size_t tail = n - best - 2;  // symbols after best+1
    std::memmove(&s[best + 1], &s[best + 2], tail * sizeof(int32_t));
    std::memmove(&rank[best], &rank[best + 1], tail * sizeof(int32_t));
    std::memmove(&merged[best], &merged[best + 1], tail * sizeof(int32_t));
    --n;
    if (best > 0) {
      const MergeTable::Value* v = merges.find(s[best - 1], s[best]);
      rank[best - 1] = v ? v->rank : kNone;
      merged[best - 1] = v ? v->id : -1;
    }
    if (best + 1 < n) {
      const MergeTable::Value* v = merges.find(s[best], s[best + 1]);
      rank[best] = v ? v->rank : kNone;
      merged[best] = v ? v->id : -1;
    }
  }
  s.resize(n);
}

// O(n log n) merge for long words: candidate pairs in a min-heap keyed by (rank, position). An
// entry is stale when its pair changed after it was pushed; a changed pair is a different (longer)
// pair, so it has no merge or one with a different rank, and the rank check finds it.
void BpeModel::merge_heap(std::vector<int32_t>* syms) const {
  std::vector<int32_t>& s = *syms;
  const int32_t n = static_cast<int32_t>(s.size());
  thread_local std::vector<int32_t> prev, next;
  thread_local std::vector<uint64_t> heap;
  prev.resize(n);
  next.resize(n);
  heap.clear();
  auto key = [](int32_t rank, int32_t pos) {
    return (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(pos);
  };
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
    if (i + 1 < n) {
      if (const MergeTable::Value* v = merges.find(s[i], s[i + 1]))
        heap.push_back(key(v->rank, i));
    }
  }
  const auto greater = std::greater<uint64_t>();
  std::make_heap(heap.begin(), heap.end(), greater);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), greater);
    const uint64_t top = heap.back();
    heap.pop_back();
    const int32_t pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
    const int32_t rank = static_cast<int32_t>(top >> 32);
    if (s[pos] < 0 || next[pos] < 0)
      continue;  // merged away, or last symbol
    const int32_t right = next[pos];
    const MergeTable::Value* v = merges.find(s[pos], s[right]);
    if (v == nullptr || v->rank != rank)
      continue;  // stale entry
    s[pos] = v->id;
    s[right] = -1;
    next[pos] = next[right];
    if (next[pos] >= 0)
      prev[next[pos]] = pos;
    if (prev[pos] >= 0) {
      if (const MergeTable::Value* pv = merges.find(s[prev[pos]], s[pos])) {
        heap.push_back(key(pv->rank, prev[pos]));
        std::push_heap(heap.begin(), heap.end(), greater);
      }
    }
    if (next[pos] >= 0) {
      if (const MergeTable::Value* nv = merges.find(s[pos], s[next[pos]])) {
        heap.push_back(key(nv->rank, pos));
        std::push_heap(heap.begin(), heap.end(), greater);
      }
    }
  }
  s.erase(std::remove(s.begin(), s.end(), -1), s.end());
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty())
    return;
  if (ignore_merges) {
    auto it = byte_vocab.find(word);
    if (it != byte_vocab.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    const ByteInit& init = byte_init[static_cast<uint8_t>(word[0])];
    if (!init.ids.empty() && init.ids.size() == 1) {
      out->push_back(init.ids[0]);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedLen;
  Shard* shard = nullptr;
  if (cacheable) {
    const size_t h = StringHash{}(word);
    shard = &cache_[(h >> 7) % kShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    auto it = shard->map.find(word);
    if (it != shard->map.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<int32_t> syms;
  syms.clear();
  initial_symbols(word, &syms);
  if (syms.size() <= 64) {
    merge_small(&syms);
  } else {
    merge_heap(&syms);
  }
  out->insert(out->end(), syms.begin(), syms.end());
  if (shard != nullptr) {
    std::lock_guard<std::mutex> lock(shard->mu);
    if (shard->map.size() >= kMaxEntriesPerShard)
      shard->map.clear();
    shard->map.emplace(std::string(word), syms);
  }
}

void BpeModel::clear_cache() const {
  for (Shard& s : cache_) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.map.clear();
  }
}

}  // namespace dsinfer::tokenizer
