// Entry header encoding and the defensive parser.
#include "kvstore/entry_file.h"

#include <cstring>

#include "base/bytes.h"
#include "base/strings.h"

namespace dsinfer::kvstore {
namespace {
constexpr char kMagic[8] = {'D', 'S', 'I', 'K', 'V', 'E', '0', '1'};
constexpr uint32_t kVersion = 1;

}  // namespace

const char* retention_class_name(RetentionClass c) {
  switch (c) {
    case RetentionClass::kChat:
      return "chat";
    case RetentionClass::kAgent:
      return "agent";
    case RetentionClass::kCount:
      break;
  }
  return "?";
}

Result<RetentionClass> parse_retention_class(std::string_view s) {
  if (s == "chat")
    return RetentionClass::kChat;
  if (s == "agent")
    return RetentionClass::kAgent;
  return invalid_argument(str_format(
      "unknown retention class '%.*s' (chat or agent)", static_cast<int>(s.size()), s.data()));
}

void seal(EntryMeta& meta, std::string_view payload) {
  meta.payload_bytes = payload.size();
  meta.block_sums.clear();
  for (uint64_t off = 0; off < payload.size(); off += kPayloadBlock) {
    const uint64_t n = std::min<uint64_t>(kPayloadBlock, payload.size() - off);
    meta.block_sums.push_back(checksum64(payload.data() + off, n));
  }
}

std::string encode_header(const EntryMeta& m) {
  std::string s(kMagic, sizeof(kMagic));
  append_pod<uint32_t>(s, 0);  // header length, patched below
  append_pod<uint32_t>(s, kVersion);
  append_pod(s, m.key.hi);
  append_pod(s, m.key.lo);
  append_pod(s, m.anchor.hi);
  append_pod(s, m.anchor.lo);
  append_pod(s, m.num_tokens);
  append_pod(s, static_cast<uint32_t>(m.retention));
  append_pod(s, m.created_s);
  append_pod(s, m.expires_s);
  append_pod(s, m.payload_bytes);
  append_pod(s, static_cast<uint32_t>(m.tail.size()));
  for (int32_t t : m.tail) append_pod(s, t);
  append_pod(s, static_cast<uint32_t>(m.block_sums.size()));
  for (uint64_t c : m.block_sums) append_pod(s, c);
  const uint32_t len = static_cast<uint32_t>(s.size() + sizeof(uint64_t));
  std::memcpy(s.data() + sizeof(kMagic), &len, sizeof(len));
  append_pod(s, checksum64(s.data(), s.size()));
  return s;
}

Result<uint64_t> header_length(std::string_view prefix) {
  if (prefix.size() < sizeof(kMagic) + 4 || std::memcmp(prefix.data(), kMagic, sizeof(kMagic)))
    return data_loss("not a KV store entry (bad magic)");
  uint32_t len;
  std::memcpy(&len, prefix.data() + sizeof(kMagic), sizeof(len));
  if (len < sizeof(kMagic) + 8 || len > kMaxHeaderBytes)
    return data_loss(str_format("entry header length %u out of range", len));
  return uint64_t{len};
}

Result<EntryMeta> parse_header(std::string_view bytes) {
  DSI_ASSIGN_OR_RETURN(uint64_t len, header_length(bytes));
  if (bytes.size() != len)
    return data_loss(str_format("entry header is %zu bytes, expected %llu",
                                bytes.size(),
                                static_cast<unsigned long long>(len)));
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + len - 8, 8);
  if (stored != checksum64(bytes.data(), len - 8))
    return data_loss("entry header checksum mismatch");
  ByteReader r(bytes.substr(0, len - 8));
  char magic[8];
  uint32_t hlen = 0, version = 0, cls = 0, ntail = 0, nsums = 0;
  EntryMeta m;
  bool ok = r.get(&magic) && r.get(&hlen) && r.get(&version);
  if (!ok || version != kVersion)
    return data_loss(str_format("unsupported entry version %u", version));
  ok = r.get(&m.key.hi) && r.get(&m.key.lo) && r.get(&m.anchor.hi) && r.get(&m.anchor.lo) &&
       r.get(&m.num_tokens) && r.get(&cls) && r.get(&m.created_s) && r.get(&m.expires_s) &&
       r.get(&m.payload_bytes) && r.get(&ntail);
  if (!ok)
    return data_loss("entry header truncated");
  if (cls >= static_cast<uint32_t>(RetentionClass::kCount))
    return data_loss(str_format("entry retention class %u unknown", cls));
  m.retention = static_cast<RetentionClass>(cls);
  if (m.num_tokens < 1 || ntail > r.left() / 4 || ntail > static_cast<uint64_t>(m.num_tokens))
    return data_loss("entry token counts inconsistent");
  m.tail.resize(ntail);
  for (auto& t : m.tail) {
    if (!r.get(&t) || t < 0)
      return data_loss("entry tail token invalid");
  }
  if (!r.get(&nsums) || nsums > r.left() / 8)
    return data_loss("entry block checksum list truncated");
  if (m.payload_bytes > kMaxPayloadBytes ||
      nsums != (m.payload_bytes + kPayloadBlock - 1) / kPayloadBlock)
    return data_loss("entry payload size and block count disagree");
  m.block_sums.resize(nsums);
  for (auto& c : m.block_sums) r.get(&c);
  if (r.left() != 0)
    return data_loss("entry header has trailing bytes");
  return m;
}

Status verify_payload(const EntryMeta& meta, std::string_view payload) {
  if (payload.size() != meta.payload_bytes) {
    return data_loss(str_format("entry %s payload is %zu bytes, expected %llu",
                                meta.key.hex().c_str(),
                                payload.size(),
                                static_cast<unsigned long long>(meta.payload_bytes)));
  }
  for (size_t b = 0; b < meta.block_sums.size(); ++b) {
    const uint64_t off = b * kPayloadBlock;
    const uint64_t n = std::min<uint64_t>(kPayloadBlock, payload.size() - off);
    if (checksum64(payload.data() + off, n) != meta.block_sums[b])
      return data_loss(
          str_format("entry %s payload block %zu checksum mismatch", meta.key.hex().c_str(), b));
  }
  return Status();
}

}  // namespace dsinfer::kvstore
