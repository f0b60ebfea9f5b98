// KvStore: index, tiers, budgets, the worker thread and the restart scan.
#include "kvstore/store.h"

#include <algorithm>
#include <chrono>

#include "base/check.h"
#include "base/strings.h"

namespace dsinfer::kvstore {
namespace {
constexpr const char* kTmpPrefix = "tmp-";
constexpr const char* kSuffix = ".kv";

int64_t wall_clock_s() {
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

int ti(Tier t) {
  return static_cast<int>(t);
}
int ci(RetentionClass c) {
  return static_cast<int>(c);
}
}  // namespace

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::kHost:
      return "host";
    case Tier::kSsd:
      return "ssd";
    case Tier::kCount:
      break;
  }
  return "?";
}

KvStore::KvStore(KvStoreOptions options) : opts_(std::move(options)) {
  clock_ = opts_.clock ? opts_.clock : wall_clock_s;
  fs_ = opts_.file_ops ? opts_.file_ops : posix_file_ops();
}

Result<std::unique_ptr<KvStore>> KvStore::open(KvStoreOptions options) {
  if (options.host_bytes <= 0)
    return invalid_argument("KV store: the host RAM budget must be > 0 bytes");
  if (!(options.low_watermark > 0 && options.low_watermark < options.high_watermark &&
        options.high_watermark <= 1.0))
    return invalid_argument("KV store: watermarks must satisfy 0 < low < high <= 1");
  for (int64_t r : options.retention_s) {
    if (r <= 0)
      return invalid_argument("KV store: retention periods must be > 0 seconds");
  }
  if (!options.dir.empty() && options.ssd_bytes <= 0)
    return invalid_argument("--kv-store-bytes must be > 0 with --kv-store");
  while (options.dir.size() > 1 && options.dir.back() == '/') options.dir.pop_back();
  std::unique_ptr<KvStore> s(new KvStore(std::move(options)));
  if (!s->opts_.dir.empty()) {
    Status made = s->fs_->make_dirs(s->opts_.dir);
    if (!made.ok())
      return Status(made.code(), "--kv-store: " + made.message());
    s->rescan();
  }
  s->last_collect_s_ = s->clock_();
  s->thread_ = std::thread([p = s.get()] { p->worker(); });
  return s;
}

KvStore::~KvStore() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable())
    thread_.join();
}

std::string KvStore::path_of(const Key128& key) const {
  return opts_.dir + "/" + key.hex() + kSuffix;
}

void KvStore::rescan() {
  auto names = fs_->list(opts_.dir);
  if (!names.ok())
    return;  // an unreadable directory is an empty SSD tier; writes will report errors
  const int64_t now = clock_();
  std::lock_guard<std::mutex> l(mu_);
  for (const std::string& name : *names) {
    const std::string path = opts_.dir + "/" + name;
    if (name.rfind(kTmpPrefix, 0) == 0) {
      (void)fs_->remove(path);  // a write that never published: invisible by construction
      continue;
    }
    if (!ends_with(name, kSuffix))
      continue;
    Key128 key;
    if (!Key128::from_hex(name.substr(0, name.size() - 3), &key))
      continue;
    auto bad = [&] {
      ++stats_.corrupt;
      (void)fs_->remove(path);
    };
    auto prefix = fs_->read_file(path, 12);
    if (!prefix.ok()) {
      bad();
      continue;
    }
    auto hlen = header_length(*prefix);
    if (!hlen.ok()) {
      bad();
      continue;
    }
    auto head = fs_->read_file(path, *hlen);
    auto size = fs_->file_size(path);
    if (!head.ok() || !size.ok()) {
      bad();
      continue;
    }
    auto meta = parse_header(*head);
    if (!meta.ok() || !(meta->key == key) || *size != *hlen + meta->payload_bytes) {
      bad();  // corrupt header, wrong name or truncated payload
      continue;
    }
    if (meta->expires_s <= now) {
      ++stats_.expirations;
      stats_.expired_bytes += static_cast<int64_t>(*size);
      (void)fs_->remove(path);
      continue;
    }
    Entry e;
    e.meta = std::move(meta).value();
    e.on_ssd = true;
    e.ssd_bytes = static_cast<int64_t>(*size);
    // Older entries first in LRU order: by creation time.
    e.last_use = static_cast<uint64_t>(std::max<int64_t>(0, e.meta.created_s));
    stats_.bytes[ti(Tier::kSsd)] += e.ssd_bytes;
    stats_.class_bytes[ti(Tier::kSsd)][ci(e.meta.retention)] += e.ssd_bytes;
    by_anchor_.emplace(e.meta.anchor, key);
    entries_.emplace(key, std::move(e));
  }
  use_counter_ = static_cast<uint64_t>(std::max<int64_t>(0, now)) + 1;
  evict_ssd(0);
}

std::optional<Match> KvStore::match(std::span<const Key128> anchors,
                                    std::span<const int32_t> tokens,
                                    int64_t block,
                                    int64_t max_tokens) {
  DSI_CHECK(block > 0, "block %lld", static_cast<long long>(block));
  std::lock_guard<std::mutex> l(mu_);
  ++stats_.lookups;
  max_tokens = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  for (int64_t j = static_cast<int64_t>(anchors.size()) - 1; j >= 0; --j) {
    const int64_t base = j * block;
    if (base > max_tokens)
      continue;
    std::optional<Match> best;
    auto range = by_anchor_.equal_range(anchors[static_cast<size_t>(j)]);
    for (auto it = range.first; it != range.second; ++it) {
      auto e = entries_.find(it->second);
      if (e == entries_.end())
        continue;
      const EntryMeta& m = e->second.meta;
      const int64_t n = m.num_tokens;
      if (n > max_tokens || n - base != static_cast<int64_t>(m.tail.size()))
        continue;
      if (!std::equal(m.tail.begin(), m.tail.end(), tokens.begin() + base))
        continue;
      if (!best || n > best->num_tokens) {
        best = Match{m.key, n, e->second.host ? Tier::kHost : Tier::kSsd};
      }
    }
    if (best)
      return best;
  }
  return std::nullopt;
}

void KvStore::enqueue(Job j) {
  jobs_.push_back(std::move(j));
  cv_.notify_one();
}

void KvStore::prefetch(const Key128& key) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end())
    return;
  Entry& e = it->second;
  if (!e.host && e.on_ssd && !e.promoting) {
    e.promoting = true;
    enqueue({Job::Kind::kPromote, key, {}});
  }
}

std::shared_ptr<const std::string> KvStore::get(const Key128& key, int64_t wait_ms) {
  std::unique_lock<std::mutex> l(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end())
    return nullptr;
  if (!it->second.host && it->second.on_ssd && wait_ms > 0) {
    if (!it->second.promoting) {
      it->second.promoting = true;
      enqueue({Job::Kind::kPromote, key, {}});
    }
    done_cv_.wait_for(l, std::chrono::milliseconds(wait_ms), [&] {
      auto e = entries_.find(key);
      return e == entries_.end() || e->second.host != nullptr || !e->second.promoting;
    });
    it = entries_.find(key);
    if (it == entries_.end())
      return nullptr;
  }
  Entry& e = it->second;
  if (!e.host)
    return nullptr;
  e.last_use = ++use_counter_;
  ++stats_.hits[ti(e.promoted ? Tier::kSsd : Tier::kHost)];
  stats_.hit_tokens += e.meta.num_tokens;
  e.promoted = false;
  return e.host;
}

void KvStore::add_host(Entry& e, std::shared_ptr<const std::string> payload) {
  const int64_t n = static_cast<int64_t>(payload->size());
  e.host = std::move(payload);
  stats_.bytes[ti(Tier::kHost)] += n;
  stats_.class_bytes[ti(Tier::kHost)][ci(e.meta.retention)] += n;
}

void KvStore::drop_host(Entry& e) {
  if (!e.host)
    return;
  const int64_t n = static_cast<int64_t>(e.host->size());
  stats_.bytes[ti(Tier::kHost)] -= n;
  stats_.class_bytes[ti(Tier::kHost)][ci(e.meta.retention)] -= n;
  e.host.reset();
}

void KvStore::drop_ssd(Entry& e) {
  if (!e.on_ssd)
    return;
  stats_.bytes[ti(Tier::kSsd)] -= e.ssd_bytes;
  stats_.class_bytes[ti(Tier::kSsd)][ci(e.meta.retention)] -= e.ssd_bytes;
  e.on_ssd = false;
  e.ssd_bytes = 0;
  (void)fs_->remove(path_of(e.meta.key));
}

void KvStore::erase(const Key128& key) {
  auto it = entries_.find(key);
  if (it == entries_.end())
    return;
  drop_host(it->second);
  drop_ssd(it->second);
  auto range = by_anchor_.equal_range(it->second.meta.anchor);
  for (auto a = range.first; a != range.second; ++a) {
    if (a->second == key) {
      by_anchor_.erase(a);
      break;
    }
  }
  entries_.erase(it);
}

void KvStore::forget_if_unbacked(const Key128& key) {
  auto it = entries_.find(key);
  if (it == entries_.end())
    return;
  const Entry& e = it->second;
  if (!e.host && !e.on_ssd && !e.writing && !e.promoting)
    erase(key);
}

void KvStore::evict_host(int64_t incoming) {
  const int64_t high =
      static_cast<int64_t>(static_cast<double>(opts_.host_bytes) * opts_.high_watermark);
  if (stats_.bytes[ti(Tier::kHost)] + incoming <= high)
    return;
  const int64_t target =
      static_cast<int64_t>(static_cast<double>(opts_.host_bytes) * opts_.low_watermark) - incoming;
  std::vector<std::pair<uint64_t, Key128>> order;
  for (auto& [k, e] : entries_) {
    if (e.host)
      order.emplace_back(e.last_use + (e.writing ? (uint64_t{1} << 62) : 0), k);
  }
  std::sort(
      order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [use, k] : order) {
    if (stats_.bytes[ti(Tier::kHost)] <= target)
      break;
    Entry& e = entries_.at(k);
    drop_host(e);
    if (!e.write_started)
      e.writing = false;  // a queued write is cancelled (the worker skips it)
    ++stats_.evictions[ti(Tier::kHost)];
    forget_if_unbacked(k);
  }
}

bool KvStore::evict_ssd(int64_t incoming) {
  const double cap = static_cast<double>(opts_.ssd_bytes);
  const int64_t high = static_cast<int64_t>(cap * opts_.high_watermark);
  auto used = [&] { return stats_.bytes[ti(Tier::kSsd)] + ssd_reserved_ + incoming; };
  if (used() <= high)
    return true;
  if (incoming > high)
    return false;
  const int64_t target = static_cast<int64_t>(cap * opts_.low_watermark);
  std::vector<std::pair<uint64_t, Key128>> order;
  for (auto& [k, e] : entries_) {
    if (e.on_ssd && !e.promoting)
      order.emplace_back(e.last_use, k);
  }
  std::sort(
      order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [use, k] : order) {
    if (used() <= target)
      break;
    drop_ssd(entries_.at(k));
    ++stats_.evictions[ti(Tier::kSsd)];
    forget_if_unbacked(k);
  }
  return used() <= high;
}

void KvStore::put(EntryMeta meta, std::string payload) {
  const int64_t size = static_cast<int64_t>(payload.size());
  std::lock_guard<std::mutex> l(mu_);
  if (size > static_cast<int64_t>(static_cast<double>(opts_.host_bytes) * opts_.low_watermark)) {
    ++stats_.rejected;
    return;
  }
  const int64_t now = clock_();
  auto existing = entries_.find(meta.key);
  if (existing != entries_.end()) {
    // Same key = same tokens under the same salt = the same state: refresh its use.
    existing->second.last_use = ++use_counter_;
    return;
  }
  meta.created_s = now;
  meta.expires_s = now + opts_.retention_s[ci(meta.retention)];
  meta.payload_bytes = static_cast<uint64_t>(size);  // block checksums: at the SSD write
  meta.block_sums.clear();
  evict_host(size);
  Entry e;
  e.meta = std::move(meta);
  e.last_use = ++use_counter_;
  const Key128 key = e.meta.key;
  add_host(e, std::make_shared<const std::string>(std::move(payload)));
  by_anchor_.emplace(e.meta.anchor, key);
  auto& stored = entries_.emplace(key, std::move(e)).first->second;
  ++stats_.puts;
  if (!opts_.dir.empty()) {
    stored.writing = true;
    enqueue({Job::Kind::kWrite, key, {}});
  }
}

void KvStore::put_built(EntryMeta meta,
                        PayloadBuilder build,
                        std::function<void(const Status&)> done) {
  Job j;
  j.kind = Job::Kind::kRun;
  j.key = meta.key;
  // Shared, so that the job stays copyable without copying what the builder holds.
  auto m = std::make_shared<EntryMeta>(std::move(meta));
  j.run = [this, m, build = std::move(build), done = std::move(done)] {
    Result<std::string> payload = build();
    if (payload.ok())
      put(std::move(*m), std::move(payload).value());
    if (done)
      done(payload.status());
  };
  std::lock_guard<std::mutex> l(mu_);
  enqueue(std::move(j));
}

void KvStore::do_write(const Key128& key) {
  std::shared_ptr<const std::string> payload;
  EntryMeta meta;
  int64_t size = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || !it->second.writing)
      return;
    Entry& e = it->second;
    payload = e.host;
    meta = e.meta;
    if (!payload) {
      e.writing = false;
      forget_if_unbacked(key);
      return;
    }
    // Header size: fixed part + tail + one checksum per block (sealed below, off the lock).
    seal(meta, std::string_view());
    meta.block_sums.resize((payload->size() + kPayloadBlock - 1) / kPayloadBlock);
    meta.payload_bytes = payload->size();
    size = static_cast<int64_t>(encode_header(meta).size() + payload->size());
    if (!evict_ssd(size)) {
      ++stats_.rejected;
      e.writing = false;
      return;
    }
    ssd_reserved_ += size;
    e.write_started = true;
  }
  seal(meta, *payload);  // off the caller's thread
  const std::string header = encode_header(meta);
  const std::string final_path = path_of(key);
  const std::string tmp =
      opts_.dir + "/" + kTmpPrefix + key.hex() + "-" + std::to_string(++tmp_counter_);
  Status s = fs_->write_file(tmp, header, *payload);
  if (!s.ok()) {
    (void)fs_->remove(tmp);
    // The directory may have been deleted under us: re-create it once and retry.
    if (fs_->make_dirs(opts_.dir).ok()) {
      s = fs_->write_file(tmp, header, *payload);
      if (!s.ok())
        (void)fs_->remove(tmp);
    }
  }
  if (s.ok()) {
    s = fs_->publish(tmp, final_path);
    if (!s.ok())
      (void)fs_->remove(tmp);
  }
  std::lock_guard<std::mutex> l(mu_);
  ssd_reserved_ -= size;
  auto it = entries_.find(key);
  if (!s.ok()) {
    ++stats_.write_errors;
    if (it != entries_.end()) {
      it->second.writing = it->second.write_started = false;
      forget_if_unbacked(key);
    }
    return;
  }
  if (it == entries_.end()) {
    (void)fs_->remove(final_path);  // dropped (expired) while being written
    return;
  }
  Entry& e = it->second;
  e.writing = e.write_started = false;
  e.on_ssd = true;
  e.ssd_bytes = size;
  stats_.bytes[ti(Tier::kSsd)] += size;
  stats_.class_bytes[ti(Tier::kSsd)][ci(e.meta.retention)] += size;
  ++stats_.demotions;
}

void KvStore::do_promote(const Key128& key) {
  EntryMeta meta;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end())
      return;
    if (it->second.host || !it->second.on_ssd) {
      it->second.promoting = false;
      return;
    }
    meta = it->second.meta;
  }
  const std::string path = path_of(key);
  Status bad;
  std::shared_ptr<std::string> payload;
  auto data = fs_->read_file(path, kMaxHeaderBytes + meta.payload_bytes + 1);
  if (!data.ok()) {
    bad = data.status();
  } else {
    auto hlen = header_length(*data);
    if (!hlen.ok() || *hlen > data->size()) {
      bad = data_loss("entry header unreadable");
    } else {
      auto disk = parse_header(std::string_view(*data).substr(0, *hlen));
      if (!disk.ok()) {
        bad = disk.status();
      } else if (!(disk->key == key) || disk->num_tokens != meta.num_tokens) {
        bad = data_loss("entry file holds another entry");
      } else {
        const std::string_view body = std::string_view(*data).substr(*hlen);
        bad = verify_payload(*disk, body);
        if (bad.ok())
          payload = std::make_shared<std::string>(body);
      }
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end())
    return;
  Entry& e = it->second;
  e.promoting = false;
  if (!payload) {
    ++stats_.corrupt;
    drop_ssd(e);
    forget_if_unbacked(key);
    return;
  }
  evict_host(static_cast<int64_t>(payload->size()));
  add_host(e, std::move(payload));
  e.promoted = true;
  ++stats_.promotions;
}

int64_t KvStore::collect() {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t now = clock_();
  last_collect_s_ = now;
  std::vector<Key128> expired;
  for (const auto& [k, e] : entries_) {
    if (e.meta.expires_s <= now && !e.writing && !e.promoting)
      expired.push_back(k);
  }
  for (const Key128& k : expired) {
    const Entry& e = entries_.at(k);
    stats_.expired_bytes += (e.host ? static_cast<int64_t>(e.host->size()) : 0) + e.ssd_bytes;
    ++stats_.expirations;
    erase(k);
  }
  return static_cast<int64_t>(expired.size());
}

void KvStore::worker() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait_for(l, std::chrono::seconds(1), [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) {
      if (stop_)
        break;
      if (clock_() - last_collect_s_ >= opts_.collect_interval_s) {
        l.unlock();
        collect();
        l.lock();
      }
      continue;
    }
    const Job j = std::move(jobs_.front());
    jobs_.pop_front();
    ++busy_;
    l.unlock();
    switch (j.kind) {
      case Job::Kind::kWrite:
        do_write(j.key);
        break;
      case Job::Kind::kPromote:
        do_promote(j.key);
        break;
      case Job::Kind::kCollect:
        collect();
        break;
      case Job::Kind::kRun:
        j.run();
        break;
    }
    l.lock();
    --busy_;
    done_cv_.notify_all();
  }
}

void KvStore::wait_idle() {
  std::unique_lock<std::mutex> l(mu_);
  done_cv_.wait(l, [&] { return jobs_.empty() && busy_ == 0; });
}

StoreStats KvStore::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  StoreStats s = stats_;
  s.entries = static_cast<int64_t>(entries_.size());
  return s;
}

}  // namespace dsinfer::kvstore
