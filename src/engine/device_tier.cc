// The prefix cache's device tier (device_tier.h).
#include "engine/device_tier.h"

#include "base/check.h"

namespace dsinfer::engine {

DeviceTier::DeviceTier(int64_t budget_bytes,
                       MakeState make_state,
                       backend::Model* model,
                       state::PageArena* arena)
    : budget_(budget_bytes), make_state_(std::move(make_state)), model_(model), arena_(arena) {
  DSI_CHECK(budget_ > 0 && make_state_ && model_ && arena_, "device tier: bad arguments");
}

void DeviceTier::erase(
    std::unordered_map<kvstore::Key128, Entry, kvstore::Key128Hash>::iterator it) {
  bytes_ -= it->second.bytes;
  entries_.erase(it);  // the state's pages go back to the arena with it
}

bool DeviceTier::evict_one() {
  if (entries_.empty())
    return false;
  auto lru = entries_.begin();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.last_use < lru->second.last_use)
      lru = it;
  }
  erase(lru);
  ++stats_.evictions;
  return true;
}

bool DeviceTier::put(const kvstore::Key128& key, const state::SequenceState& st) {
  const int64_t bytes = st.bytes().total();
  if (bytes > budget_) {
    ++stats_.rejected;
    return false;
  }
  if (auto it = entries_.find(key); it != entries_.end())
    erase(it);  // replaced (a unit of the same key holds the same tokens)
  while (bytes_ + bytes > budget_ && evict_one()) {
  }
  std::unique_ptr<state::SequenceState> copy = make_state_(kIdBase + next_id_++);
  pairs_.clear();
  if (!copy || !copy->ok() || !copy->fork_from(st, &pairs_).ok() ||
      !model_->copy_state_pages(*arena_, pairs_).ok()) {
    ++stats_.rejected;  // no pages to spare: running requests keep theirs
    return false;
  }
  const int64_t held = copy->bytes().total();
  entries_[key] = Entry{std::shared_ptr<state::SequenceState>(std::move(copy)), held, ++clock_};
  bytes_ += held;
  ++stats_.puts;
  return true;
}

Status DeviceTier::restore(const kvstore::Key128& key,
                           int64_t num_tokens,
                           state::SequenceState& dst) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.st->num_tokens() != num_tokens)
    return not_found("not in the device tier");
  if (dst.num_tokens() != 0)
    return not_found("the destination is not a fresh sequence");
  pairs_.clear();
  if (!dst.fork_from(*it->second.st, &pairs_).ok())
    return not_found("no state pages for the device tier's copy");  // dst left fresh
  DSI_RETURN_IF_ERROR(model_->copy_state_pages(*arena_, pairs_));
  it->second.last_use = ++clock_;
  ++stats_.hits;
  return Status();
}

std::shared_ptr<const state::SequenceState> DeviceTier::share(const kvstore::Key128& key,
                                                              int64_t num_tokens) const {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.st->num_tokens() != num_tokens)
    return nullptr;
  return it->second.st;
}

DeviceTierStats DeviceTier::stats() const {
  DeviceTierStats s = stats_;
  s.entries = static_cast<int64_t>(entries_.size());
  s.bytes = bytes_;
  return s;
}

void DeviceTier::check_integrity() const {
  int64_t sum = 0;
  for (const auto& [key, e] : entries_) {
    e.st->check_integrity();
    DSI_CHECK(e.st->bytes().total() == e.bytes, "device tier entry changed size");
    sum += e.bytes;
  }
  DSI_CHECK(sum == bytes_,
            "device tier holds %lld bytes, counted %lld",
            static_cast<long long>(sum),
            static_cast<long long>(bytes_));
  DSI_CHECK(bytes_ <= budget_, "device tier over its budget");
}

}  // namespace dsinfer::engine
