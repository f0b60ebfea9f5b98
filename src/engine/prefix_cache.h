// PrefixCache: the engine's view of the KV store. A cache unit is a sequence-state image after
// the first n tokens of a request (any n: inside a compression block, at a page edge, inside the
// first window; the image holds the window ring, compressed entries, index keys and compressor
// rows, so resuming from it is exact). Units are found through hash chains over `block`-token
// blocks: anchor j = hash(anchor j-1, tokens of block j), anchor 0 = the salt (model/weights
// version, tokenizer version, numerics, state layout, tenant). A unit of n tokens is keyed by
// its anchor floor(n/block) plus the tail tokens past it, so a lookup walks the prompt's chain
// and compares at most one block of tail tokens per anchor.
//
// Units are stored where the engine holds a state at a useful length: every `interval` prompt
// tokens (a shared system prompt or document then hits whatever follows it), after the prompt's
// first P-1 tokens (a repeated prompt then computes one token) and when a request finishes (the
// conversation so far; the next turn resends it as its prompt).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvstore/store.h"

namespace dsinfer::engine {

struct PrefixCacheConfig {
  std::shared_ptr<kvstore::KvStore> store;  // null: no prefix cache
  int64_t block = 64;                       // tokens per hash block (> 0)
  // Model/weights version and tokenizer version (the caller's words); the engine adds the
  // numerics, the CPU kernels, the device and the state layout before hashing.
  std::string salt;
  int64_t min_tokens = 16;  // shortest unit worth storing
  // Units also every `interval` prompt tokens (0 = only at P-1 and at the end of a request).
  int64_t interval = 512;
  int64_t promote_wait_ms = 100;  // bound on waiting for an SSD entry at admission
  kvstore::RetentionClass default_retention = kvstore::RetentionClass::kChat;
  // The device tier (engine/device_tier.h): bytes of the state arena that stored units may keep
  // (0: none; they yield to running requests).
  int64_t device_bytes = 0;
};

class PrefixKeys {
 public:
  PrefixKeys(std::string salt, int64_t block) : salt_(std::move(salt)), block_(block) {}
  int64_t block() const { return block_; }
  // anchors[j] for j*block <= upto (anchors[0] = the tenant's root).
  std::vector<kvstore::Key128> anchors(const std::string& tenant,
                                       std::span<const int32_t> tokens,
                                       int64_t upto) const;
  // The unit key and anchor of tokens[0, n).
  void unit(const std::string& tenant,
            std::span<const int32_t> tokens,
            int64_t n,
            kvstore::Key128* key,
            kvstore::Key128* anchor) const;

 private:
  std::string salt_;
  int64_t block_;
};

}  // namespace dsinfer::engine
