// One stored prefix-cache entry ("unit") as it lies on disk: a self-describing header (key,
// anchor block-chain hash, the tail tokens past the anchor, token count, retention class,
// creation and expiry times, payload size, one checksum per payload block, a header checksum),
// then the payload (a serialized sequence-state image). A reader trusts nothing: every field is
// bounds-checked, the header checksum must match, and the payload blocks are verified before
// use (a corrupt block makes the entry a miss).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kvstore/hash.h"

namespace dsinfer::kvstore {

// Retention class of an entry: how long it is kept after it was written.
enum class RetentionClass : uint32_t { kChat = 0, kAgent = 1, kCount = 2 };
const char* retention_class_name(RetentionClass c);  // "chat", "agent"
// Parses "chat" / "agent"; invalid_argument otherwise.
Result<RetentionClass> parse_retention_class(std::string_view s);

struct EntryMeta {
  Key128 key;                 // names the entry: hash(anchor, tail, num_tokens)
  Key128 anchor;              // block-chain hash of the first num_tokens - tail.size() tokens
  std::vector<int32_t> tail;  // tokens after the anchor's blocks (fewer than one block)
  int64_t num_tokens = 0;
  RetentionClass retention = RetentionClass::kChat;
  int64_t created_s = 0;  // store clock, seconds
  int64_t expires_s = 0;
  uint64_t payload_bytes = 0;
  std::vector<uint64_t> block_sums;  // checksum64 of each kPayloadBlock-byte payload block
};

inline constexpr uint64_t kPayloadBlock = 64 * 1024;
inline constexpr uint64_t kMaxHeaderBytes = 1 << 20;
inline constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 40;

// Fills meta.payload_bytes and meta.block_sums from the payload.
void seal(EntryMeta& meta, std::string_view payload);
// The header bytes of meta (sealed first).
std::string encode_header(const EntryMeta& meta);
// The header's length from its first 12 bytes; data_loss when they are not a header.
Result<uint64_t> header_length(std::string_view prefix);
// Parses a header (exactly header_length() bytes); data_loss on any inconsistency.
Result<EntryMeta> parse_header(std::string_view bytes);
// Verifies the payload against the header's block checksums; data_loss names the first bad block.
Status verify_payload(const EntryMeta& meta, std::string_view payload);

}  // namespace dsinfer::kvstore
