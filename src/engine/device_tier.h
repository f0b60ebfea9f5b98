// The device tier of the prefix cache, above the KV store's host RAM and SSD tiers
// (docs/kv-store.md): stored prompt states kept as whole sequences in the engine's state arena,
// which the CUDA backend holds in device memory. A unit the engine stores is also forked here (a
// page copy inside the arena: device to device on CUDA, no host round trip); a request whose
// unit is still here is forked from it instead of having the unit's host image written into its
// pages (host to device), and an entry demoted to SSD is not read back.
//
// Entries hold arena pages within a budget and give them up first: when a running or admitted
// request needs pages the arena does not have, the engine evicts from here (least recently used
// first) before the scheduler preempts anyone. An entry evicted here stays in the host and SSD
// tiers (the store has its own copy), so eviction loses no hit, only makes it slower.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/model.h"
#include "base/status.h"
#include "kvstore/hash.h"
#include "state/page_arena.h"
#include "state/sequence_state.h"

namespace dsinfer::engine {

struct DeviceTierStats {
  int64_t entries = 0;
  int64_t bytes = 0;  // arena pages held, in bytes
  int64_t hits = 0;
  int64_t puts = 0;
  int64_t evictions = 0;  // for the budget or for running requests
  int64_t rejected = 0;   // puts that did not fit (larger than the budget, or no free pages)
};

class DeviceTier {
 public:
  // A fresh sequence of the engine's layout (the same model, rollback limit and arena as its
  // requests' states), with the given sequence id.
  using MakeState = std::function<std::unique_ptr<state::SequenceState>(int64_t id)>;
  DeviceTier(int64_t budget_bytes,
             MakeState make_state,
             backend::Model* model,
             state::PageArena* arena);

  // Keeps a copy of st's whole state under key (replacing an entry of that key), evicting least
  // recently used entries to stay within the budget. False, with nothing kept, when st does not
  // fit the budget or the arena lacks the pages (running requests come first).
  bool put(const kvstore::Key128& key, const state::SequenceState& st);
  // Forks the entry of key into dst, a fresh sequence, when the entry holds exactly num_tokens
  // tokens. not_found on a miss (no such entry, another length, no pages for the copy): dst is
  // left fresh. Any other error is the backend's page copy failing after the fork: dst then has
  // pages without their contents and must not be used.
  Status restore(const kvstore::Key128& key, int64_t num_tokens, state::SequenceState& dst);
  // The state of key's entry when it holds num_tokens tokens (null otherwise), shared: the prefix
  // cache's asynchronous capture reads its pages, which stay allocated while the caller holds
  // it, also when the entry is evicted or replaced meanwhile.
  std::shared_ptr<const state::SequenceState> share(const kvstore::Key128& key,
                                                    int64_t num_tokens) const;
  // Frees the least recently used entry's pages (not before a capture still holding them lets
  // go of them: share); false when there is none.
  bool evict_one();
  DeviceTierStats stats() const;
  // Every entry's state is consistent and the bytes add up.
  void check_integrity() const;

 private:
  struct Entry {
    std::shared_ptr<state::SequenceState> st;
    int64_t bytes = 0;
    uint64_t last_use = 0;
  };
  void erase(std::unordered_map<kvstore::Key128, Entry, kvstore::Key128Hash>::iterator it);
  // Sequence ids of the tier's states: far from request ids and from the step-time
  // measurement's throwaway sequences.
  static constexpr int64_t kIdBase = int64_t{3} << 60;

  int64_t budget_;
  MakeState make_state_;
  backend::Model* model_;
  state::PageArena* arena_;
  std::unordered_map<kvstore::Key128, Entry, kvstore::Key128Hash> entries_;
  std::vector<std::pair<int32_t, int32_t>> pairs_;
  int64_t bytes_ = 0;
  uint64_t clock_ = 0;
  int64_t next_id_ = 0;
  DeviceTierStats stats_;
};

}  // namespace dsinfer::engine
