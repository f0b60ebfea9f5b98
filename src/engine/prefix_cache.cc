// Prefix-cache keys: salted hash chains over token blocks.
#include "engine/prefix_cache.h"

#include "base/check.h"

namespace dsinfer::engine {

std::vector<kvstore::Key128> PrefixKeys::anchors(const std::string& tenant,
                                                 std::span<const int32_t> tokens,
                                                 int64_t upto) const {
  DSI_CHECK(upto <= static_cast<int64_t>(tokens.size()), "anchors past the tokens");
  std::vector<kvstore::Key128> out;
  out.reserve(static_cast<size_t>(upto / block_ + 1));
  out.push_back(kvstore::Hasher().str("dsinfer-prefix-cache-v1").str(salt_).str(tenant).finish());
  for (int64_t j = 1; j * block_ <= upto; ++j) {
    const kvstore::Key128& prev = out.back();
    out.push_back(
        kvstore::Hasher()
            .u64(prev.hi)
            .u64(prev.lo)
            .bytes(tokens.data() + (j - 1) * block_, static_cast<size_t>(block_) * sizeof(int32_t))
            .finish());
  }
  return out;
}

void PrefixKeys::unit(const std::string& tenant,
                      std::span<const int32_t> tokens,
                      int64_t n,
                      kvstore::Key128* key,
                      kvstore::Key128* anchor) const {
  const auto a = anchors(tenant, tokens, n);
  *anchor = a.back();
  const int64_t base = (static_cast<int64_t>(a.size()) - 1) * block_;
  *key = kvstore::Hasher()
             .u64(anchor->hi)
             .u64(anchor->lo)
             .i64(n)
             .bytes(tokens.data() + base, static_cast<size_t>(n - base) * sizeof(int32_t))
             .finish();
}

}  // namespace dsinfer::engine
