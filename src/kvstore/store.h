// KvStore: the tiered store of prefix-cache entries: host RAM, then SSD files in a directory
// (a device tier would sit above host RAM; see docs/kv-store.md). Thread-safe. One worker thread
// does every file operation (demotion = writing an entry to SSD, promotion = reading it back,
// the retention collector), so the engine's step loop never waits on disk except where it asks
// to (get() with a wait bound).
//
// Guarantees:
//  - Two-phase put: an entry is written to a "tmp-" file, fsynced, then renamed into place; a
//    crash before the rename leaves only a tmp- file, which the next open() deletes unseen.
//  - Every payload block carries a checksum; a corrupt, truncated or vanished file is a miss
//    (and is removed), never wrong data.
//  - A failing disk (full, read-only, deleted directory) only makes entries host-only: puts keep
//    working in RAM, errors are counted, and the directory is re-created when possible.
//  - Budgets: host bytes and SSD bytes never exceed their limits; above the high watermark the
//    least recently used entries are evicted down to the low watermark.
//  - Retention: each entry expires at created + retention of its class; collect() removes
//    expired entries (the worker calls it periodically; tests call it with an advanced clock).
//  - Restart: open() rescans the directory and serves the entries it finds.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kvstore/entry_file.h"
#include "kvstore/file_ops.h"
#include "kvstore/hash.h"

namespace dsinfer::kvstore {

enum class Tier { kHost = 0, kSsd = 1, kCount = 2 };
const char* tier_name(Tier t);  // "host", "ssd"

struct KvStoreOptions {
  int64_t host_bytes = int64_t{1} << 30;  // host RAM tier budget (> 0)
  std::string dir;                        // SSD tier directory; empty = no SSD tier
  int64_t ssd_bytes = int64_t{64} << 30;  // SSD tier budget
  double high_watermark = 0.95;           // evict when usage would pass this fraction ...
  double low_watermark = 0.85;            // ... down to this one
  int64_t retention_s[static_cast<int>(RetentionClass::kCount)] = {7 * 86400, 3 * 86400};
  // Clock in seconds (wall clock by default); injectable for retention tests.
  std::function<int64_t()> clock;
  int64_t collect_interval_s = 60;  // worker's collector period (store clock)
  FileOps* file_ops = nullptr;      // null: POSIX
};

struct Match {
  Key128 key;
  int64_t num_tokens = 0;
  Tier tier = Tier::kHost;  // where the entry is now
};

struct StoreStats {
  int64_t lookups = 0;
  int64_t hits[2] = {0, 0};  // by the tier the entry was served from
  int64_t hit_tokens = 0;
  int64_t puts = 0;
  int64_t entries = 0;
  int64_t bytes[2] = {0, 0};                                              // by tier
  int64_t class_bytes[2][static_cast<int>(RetentionClass::kCount)] = {};  // [tier][class]
  int64_t evictions[2] = {0, 0};
  int64_t expirations = 0;
  int64_t expired_bytes = 0;
  int64_t demotions = 0;   // entries written to SSD
  int64_t promotions = 0;  // entries read back from SSD
  int64_t write_errors = 0;
  int64_t corrupt = 0;   // entries found corrupt, truncated or missing (each a miss)
  int64_t rejected = 0;  // puts larger than a tier's budget
};

class KvStore {
 public:
  // Opens the store; with a directory, creates it when missing and rescans it (deleting tmp-
  // leftovers, corrupt and expired files). Fails only on bad options or an unusable directory.
  static Result<std::unique_ptr<KvStore>> open(KvStoreOptions options);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // The longest entry that `tokens` starts with, no longer than max_tokens. anchors[j] is the
  // block-chain hash of tokens[0, j*block) (anchors[0] the salt's root), for every j with
  // j*block <= max_tokens. Counts a lookup.
  std::optional<Match> match(std::span<const Key128> anchors,
                             std::span<const int32_t> tokens,
                             int64_t block,
                             int64_t max_tokens);
  // Starts reading an SSD-only entry into host RAM (no-op otherwise).
  void prefetch(const Key128& key);
  // The entry's payload once it is in host RAM (waiting up to wait_ms for a promotion; 0 = no
  // wait); null on a miss. Counts a hit on success, by the tier it came from.
  std::shared_ptr<const std::string> get(const Key128& key, int64_t wait_ms);
  // Stores an entry (meta.key, anchor, tail, num_tokens and retention set by the caller; the
  // times, size and checksums are set here). Replaces an entry of the same key. The SSD copy is
  // written asynchronously.
  void put(EntryMeta meta, std::string payload);
  // put() of a payload that the worker thread builds first (work the caller's thread should not
  // do: the engine's prefix cache assembles state images there). `build` runs on the worker,
  // after the jobs queued before it; its payload is then put(), or on an error nothing is
  // stored. `done` (optional) runs on the worker with build's outcome once the put is over. Jobs
  // queued before the store is destroyed still run.
  using PayloadBuilder = std::function<Result<std::string>()>;
  void put_built(EntryMeta meta,
                 PayloadBuilder build,
                 std::function<void(const Status&)> done = nullptr);
  // Removes expired entries now; returns how many.
  int64_t collect();
  // Blocks until the worker has nothing queued (tests, shutdown).
  void wait_idle();
  StoreStats stats() const;
  int64_t now_s() const { return clock_(); }
  const KvStoreOptions& options() const { return opts_; }

 private:
  struct Entry {
    EntryMeta meta;
    std::shared_ptr<const std::string> host;  // payload in RAM, or null
    bool on_ssd = false;
    bool writing = false;        // a write is queued or running
    bool write_started = false;  // the worker has taken the payload
    bool promoting = false;
    bool promoted = false;  // read back from SSD since the last get()
    int64_t ssd_bytes = 0;
    uint64_t last_use = 0;
  };
  struct Job {
    enum class Kind { kWrite, kPromote, kCollect, kRun } kind = Kind::kWrite;
    Key128 key;
    std::function<void()> run;  // kRun
  };
  explicit KvStore(KvStoreOptions options);
  void rescan();
  void worker();
  void do_write(const Key128& key);
  void do_promote(const Key128& key);
  std::string path_of(const Key128& key) const;
  // With mu_ held:
  void enqueue(Job j);
  void add_host(Entry& e, std::shared_ptr<const std::string> payload);
  void drop_host(Entry& e);
  void drop_ssd(Entry& e);        // forgets the SSD copy (and deletes the file)
  void erase(const Key128& key);  // removes the entry from every tier
  void evict_host(int64_t incoming);
  // Frees SSD room for `incoming` bytes; false when it cannot fit.
  bool evict_ssd(int64_t incoming);
  void forget_if_unbacked(const Key128& key);

  KvStoreOptions opts_;
  std::function<int64_t()> clock_;
  FileOps* fs_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // worker wake-up
  std::condition_variable done_cv_;  // job completion (get() waits, wait_idle())
  std::unordered_map<Key128, Entry, Key128Hash> entries_;
  std::unordered_multimap<Key128, Key128, Key128Hash> by_anchor_;
  std::deque<Job> jobs_;
  int busy_ = 0;
  bool stop_ = false;
  uint64_t use_counter_ = 0;
  uint64_t tmp_counter_ = 0;
  int64_t ssd_reserved_ = 0;  // bytes of writes in flight
  int64_t last_collect_s_ = 0;
  StoreStats stats_;
  std::thread thread_;
};

}  // namespace dsinfer::kvstore
