// libFuzzer: a KV store entry file (header + payload) from arbitrary bytes. A header that parses
// must re-encode to the same bytes, and verify_payload must agree with a recomputed seal.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvstore/entry_file.h"

using namespace dsinfer::kvstore;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  auto len = header_length(file);
  if (!len.ok() || *len > file.size())
    return 0;
  auto meta = parse_header(file.substr(0, *len));
  if (!meta.ok())
    return 0;
  if (encode_header(*meta) != file.substr(0, *len))
    __builtin_trap();
  const std::string_view payload = file.substr(*len);
  const bool ok = verify_payload(*meta, payload).ok();
  EntryMeta resealed = *meta;
  seal(resealed, payload);
  if (ok !=
      (resealed.block_sums == meta->block_sums && resealed.payload_bytes == meta->payload_bytes))
    __builtin_trap();
  return 0;
}
