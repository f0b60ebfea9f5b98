// KvStore: tiers, two-phase put, checksums, restart rescan, retention with an advanced clock,
// budgets under a random trace, and injected faults (full disk, read-only directory, a crash
// between write and publish, a deleted directory, corrupt and truncated files, kill -9 during
// writes in a child process).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "kvstore/store.h"

namespace dsinfer::kvstore {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("dsinfer-kvstore-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

// A unit of `n` tokens with a payload derived from `seed` (so a read can be checked).
struct Unit {
  EntryMeta meta;
  std::string payload;
};

Unit make_unit(uint64_t seed,
               int64_t payload_bytes,
               RetentionClass cls = RetentionClass::kChat,
               bool with_payload = true) {
  Unit u;
  u.meta.anchor = Hasher().u64(seed).str("anchor").finish();
  u.meta.tail = {static_cast<int32_t>(seed % 1000), 7};
  u.meta.num_tokens = 2;
  u.meta.key = Hasher().u64(seed).str("key").finish();
  u.meta.retention = cls;
  if (!with_payload)
    return u;
  u.payload.resize(static_cast<size_t>(payload_bytes));
  std::mt19937_64 g(seed);
  for (char& c : u.payload) c = static_cast<char>(g());
  return u;
}

std::optional<Match> find(KvStore& s, const Unit& u) {
  const Key128 anchors[1] = {u.meta.anchor};
  return s.match(anchors, u.meta.tail, 1000, u.meta.num_tokens);
}

// Gets a unit and checks it is byte-exact; false on a miss.
bool get_exact(KvStore& s, const Unit& u) {
  auto p = s.get(u.meta.key, 5000);
  if (!p)
    return false;
  EXPECT_EQ(*p, u.payload) << "served wrong bytes";
  return *p == u.payload;
}

KvStoreOptions opts(const std::string& dir, int64_t host = 1 << 20, int64_t ssd = 8 << 20) {
  KvStoreOptions o;
  o.host_bytes = host;
  o.dir = dir;
  o.ssd_bytes = ssd;
  return o;
}

std::vector<std::string> files(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir))
    return out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

TEST(KvHash, StableAndSensitive) {
  const Key128 a = Hasher().str("abc").u64(1).finish();
  EXPECT_EQ(a, Hasher().str("abc").u64(1).finish());
  EXPECT_FALSE(a == Hasher().str("abd").u64(1).finish());
  EXPECT_FALSE(a == Hasher().str("abc").u64(2).finish());
  // Byte-at-a-time and bulk updates agree.
  const std::string s = "the quick brown fox jumps";
  Hasher h;
  for (char c : s) h.bytes(&c, 1);
  EXPECT_EQ(h.finish(), Hasher().bytes(s.data(), s.size()).finish());
  Key128 back;
  ASSERT_TRUE(Key128::from_hex(a.hex(), &back));
  EXPECT_EQ(back, a);
  EXPECT_FALSE(Key128::from_hex("xyz", &back));
}

TEST(KvEntry, HeaderRoundTripAndCorruption) {
  Unit u = make_unit(3, 200000);
  seal(u.meta, u.payload);
  const std::string h = encode_header(u.meta);
  auto m = parse_header(h);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->key, u.meta.key);
  EXPECT_EQ(m->tail, u.meta.tail);
  EXPECT_EQ(m->block_sums.size(), 4u);  // 200000 bytes in 64 KiB blocks
  EXPECT_TRUE(verify_payload(*m, u.payload).ok());
  std::string bad = u.payload;
  bad[150000] ^= 1;
  const Status s = verify_payload(*m, bad);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("block 2"), std::string::npos) << s.message();
  for (size_t i = 0; i < h.size(); ++i) {
    std::string c = h;
    c[i] ^= 0x10;
    EXPECT_FALSE(parse_header(c).ok()) << "flipped byte " << i;
  }
  EXPECT_FALSE(parse_header(h.substr(0, h.size() - 1)).ok());
}

TEST(KvStore, HostTierMatchAndGet) {
  auto s = KvStore::open(opts(""));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  Unit u = make_unit(1, 1000);
  (*s)->put(u.meta, u.payload);
  auto m = find(**s, u);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->tier, Tier::kHost);
  EXPECT_EQ(m->num_tokens, 2);
  EXPECT_TRUE(get_exact(**s, u));
  // A different tail token is a miss.
  std::vector<int32_t> other = u.meta.tail;
  other[1] = 8;
  const Key128 anchors[1] = {u.meta.anchor};
  EXPECT_FALSE((*s)->match(anchors, other, 1000, 2).has_value());
  EXPECT_EQ((*s)->stats().hits[0], 1);
}

// put_built: the payload is built on the worker thread, not the caller's; a failed build stores
// nothing; `done` reports each outcome; jobs still queued when the store is destroyed run.
TEST(KvStore, PutBuiltBuildsOnTheWorker) {
  const std::string dir = temp_dir("put_built");
  auto s = KvStore::open(opts(dir));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> built{0}, ok{0}, failed{0};
  std::atomic<bool> on_caller{false};
  auto done = [&](const Status& st) { ++(st.ok() ? ok : failed); };
  Unit u = make_unit(3, 1000);
  (*s)->put_built(
      u.meta,
      [&, payload = u.payload]() -> Result<std::string> {
        on_caller = on_caller || std::this_thread::get_id() == caller;
        ++built;
        return payload;
      },
      done);
  Unit bad = make_unit(4, 1000);
  (*s)->put_built(
      bad.meta,
      [&]() -> Result<std::string> {
        on_caller = on_caller || std::this_thread::get_id() == caller;
        return Status(StatusCode::kInternal, "injected build failure");
      },
      done);
  (*s)->wait_idle();
  EXPECT_FALSE(on_caller);
  EXPECT_EQ(built, 1);
  EXPECT_EQ(ok, 1);
  EXPECT_EQ(failed, 1);
  EXPECT_TRUE(get_exact(**s, u));
  EXPECT_FALSE(find(**s, bad).has_value());
  EXPECT_EQ((*s)->stats().puts, 1);
  // Queued just before the store goes: still built and stored (on disk, for the next open).
  Unit late = make_unit(5, 1000);
  (*s)->put_built(
      late.meta, [payload = late.payload]() -> Result<std::string> { return payload; }, done);
  s->reset();
  EXPECT_EQ(ok, 2);
  auto again = KvStore::open(opts(dir));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(get_exact(**again, late));
}

TEST(KvStore, TwoPhaseWriteRestartRescanAndSsdHit) {
  const std::string dir = temp_dir("restart");
  std::vector<Unit> units;
  for (int i = 0; i < 5; ++i) units.push_back(make_unit(100 + i, 70000));
  {
    auto s = KvStore::open(opts(dir));
    ASSERT_TRUE(s.ok());
    for (auto& u : units) (*s)->put(u.meta, u.payload);
    (*s)->wait_idle();
    EXPECT_EQ((*s)->stats().demotions, 5);
    for (const auto& f : files(dir)) EXPECT_EQ(f.rfind("tmp-", 0), std::string::npos) << f;
  }
  // A crash between write and publish leaves a tmp- file: invisible, and removed on open.
  std::ofstream(dir + "/tmp-" + units[0].meta.key.hex() + "-9") << "partial";
  auto s = KvStore::open(opts(dir));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().entries, 5);
  for (const auto& f : files(dir)) EXPECT_EQ(f.rfind("tmp-", 0), std::string::npos) << f;
  for (auto& u : units) {
    auto m = find(**s, u);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->tier, Tier::kSsd);
    EXPECT_TRUE(get_exact(**s, u));
  }
  EXPECT_EQ((*s)->stats().hits[1], 5);
  EXPECT_EQ((*s)->stats().promotions, 5);
  // Promoted entries are now served from RAM.
  EXPECT_TRUE(get_exact(**s, units[0]));
  EXPECT_EQ((*s)->stats().hits[0], 1);
  fs::remove_all(dir);
}

TEST(KvStore, CorruptAndTruncatedFilesAreMisses) {
  const std::string dir = temp_dir("corrupt");
  Unit a = make_unit(1, 100000), b = make_unit(2, 100000), c = make_unit(3, 100000);
  {
    auto s = KvStore::open(opts(dir));
    ASSERT_TRUE(s.ok());
    for (auto* u : {&a, &b, &c}) (*s)->put(u->meta, u->payload);
    (*s)->wait_idle();
  }
  // a: one payload byte flipped (found at read); b: truncated (found at rescan); c: intact.
  {
    std::fstream f(dir + "/" + a.meta.key.hex() + ".kv",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('\x5a');
  }
  fs::resize_file(dir + "/" + b.meta.key.hex() + ".kv",
                  fs::file_size(dir + "/" + b.meta.key.hex() + ".kv") - 1000);
  auto s = KvStore::open(opts(dir));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().corrupt, 1);  // b
  EXPECT_FALSE(find(**s, b).has_value());
  ASSERT_TRUE(find(**s, a).has_value());            // header fine: found, but ...
  EXPECT_EQ((*s)->get(a.meta.key, 5000), nullptr);  // ... the bad block makes it a miss
  EXPECT_EQ((*s)->stats().corrupt, 2);
  EXPECT_FALSE(find(**s, a).has_value());  // and it is gone
  EXPECT_FALSE(fs::exists(dir + "/" + a.meta.key.hex() + ".kv"));
  EXPECT_TRUE(get_exact(**s, c));
  fs::remove_all(dir);
}

// Fault-injecting file operations.
class FaultyOps : public FileOps {
 public:
  enum class Mode { kNone, kNoSpace, kReadOnly, kCrashBeforePublish };
  std::atomic<Mode> mode{Mode::kNone};
  Status write_file(const std::string& path, std::string_view h, std::string_view b) override {
    if (mode == Mode::kNoSpace) {
      // A partial write then ENOSPC, as a full disk does.
      (void)FileOps::write_file(path, h.substr(0, h.size() / 2), "");
      return io_error("write " + path + ": No space left on device");
    }
    if (mode == Mode::kReadOnly)
      return io_error("create " + path + ": Read-only file system");
    return FileOps::write_file(path, h, b);
  }
  Status publish(const std::string& from, const std::string& to) override {
    if (mode == Mode::kCrashBeforePublish)
      return io_error("simulated crash before rename");  // leaves `from` behind
    return FileOps::publish(from, to);
  }
  Status make_dirs(const std::string& p) override {
    if (mode == Mode::kReadOnly)
      return io_error("mkdir " + p + ": Read-only file system");
    return FileOps::make_dirs(p);
  }
  Status remove(const std::string& p) override {
    if (mode == Mode::kCrashBeforePublish && p.find("/tmp-") != std::string::npos)
      return Status();  // the crashed process never cleaned up
    return FileOps::remove(p);
  }
};

TEST(KvStore, FullDiskAndReadOnlyKeepServingFromRam) {
  const std::string dir = temp_dir("faults");
  FaultyOps ops;
  KvStoreOptions o = opts(dir);
  o.file_ops = &ops;
  auto s = KvStore::open(o);
  ASSERT_TRUE(s.ok());
  for (auto mode : {FaultyOps::Mode::kNoSpace, FaultyOps::Mode::kReadOnly}) {
    ops.mode = mode;
    Unit u = make_unit(static_cast<uint64_t>(mode) + 10, 5000);
    (*s)->put(u.meta, u.payload);
    (*s)->wait_idle();
    EXPECT_TRUE(get_exact(**s, u));  // still served from RAM
  }
  EXPECT_EQ((*s)->stats().write_errors, 2);
  EXPECT_EQ((*s)->stats().bytes[1], 0);
  for (const auto& f : files(dir)) ADD_FAILURE() << "left behind: " << f;
  // The disk recovers: new puts reach it again.
  ops.mode = FaultyOps::Mode::kNone;
  Unit ok = make_unit(77, 5000);
  (*s)->put(ok.meta, ok.payload);
  (*s)->wait_idle();
  EXPECT_EQ((*s)->stats().demotions, 1);
  s->reset();
  fs::remove_all(dir);
}

TEST(KvStore, RealReadOnlyDirectory) {
  if (::geteuid() == 0)
    GTEST_SKIP() << "root ignores directory permissions (the injected variant covers it)";
  const std::string dir = temp_dir("ro");
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0555);
  auto s = KvStore::open(opts(dir));
  ASSERT_TRUE(s.ok());
  Unit u = make_unit(5, 5000);
  (*s)->put(u.meta, u.payload);
  (*s)->wait_idle();
  EXPECT_TRUE(get_exact(**s, u));
  EXPECT_GE((*s)->stats().write_errors, 1);
  ::chmod(dir.c_str(), 0755);
  fs::remove_all(dir);
}

TEST(KvStore, CrashBetweenWriteAndPublishLeavesNothingVisible) {
  const std::string dir = temp_dir("crash");
  FaultyOps ops;
  ops.mode = FaultyOps::Mode::kCrashBeforePublish;
  KvStoreOptions o = opts(dir);
  o.file_ops = &ops;
  Unit u = make_unit(9, 90000);
  {
    auto s = KvStore::open(o);
    ASSERT_TRUE(s.ok());
    (*s)->put(u.meta, u.payload);
    (*s)->wait_idle();
  }
  ASSERT_EQ(files(dir).size(), 1u);  // the unpublished tmp- file
  auto s = KvStore::open(opts(dir));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().entries, 0);
  EXPECT_FALSE(find(**s, u).has_value());
  EXPECT_TRUE(files(dir).empty());
  fs::remove_all(dir);
}

TEST(KvStore, DirectoryDeletedWhileRunning) {
  const std::string dir = temp_dir("deleted");
  auto s = KvStore::open(opts(dir, 100000));
  ASSERT_TRUE(s.ok());
  Unit a = make_unit(1, 60000), b = make_unit(2, 60000);
  (*s)->put(a.meta, a.payload);
  (*s)->wait_idle();
  fs::remove_all(dir);
  // b pushes a out of RAM (100 KB budget); a's file is gone too: a miss, never garbage.
  (*s)->put(b.meta, b.payload);
  (*s)->wait_idle();
  EXPECT_EQ((*s)->get(a.meta.key, 5000), nullptr);
  // b was written into the re-created directory.
  EXPECT_TRUE(fs::exists(dir + "/" + b.meta.key.hex() + ".kv"));
  EXPECT_TRUE(get_exact(**s, b));
  s->reset();
  fs::remove_all(dir);
}

TEST(KvStore, RetentionClassesExpireWithTheClock) {
  const std::string dir = temp_dir("retention");
  auto now = std::make_shared<std::atomic<int64_t>>(1'000'000);
  KvStoreOptions o = opts(dir);
  o.clock = [now] { return now->load(); };
  Unit chat = make_unit(1, 3000, RetentionClass::kChat);
  Unit agent = make_unit(2, 3000, RetentionClass::kAgent);
  {
    auto s = KvStore::open(o);
    ASSERT_TRUE(s.ok());
    (*s)->put(chat.meta, chat.payload);
    (*s)->put(agent.meta, agent.payload);
    (*s)->wait_idle();
    EXPECT_GT((*s)->stats().class_bytes[1][0], 0);
    EXPECT_GT((*s)->stats().class_bytes[1][1], 0);
    *now += 3 * 86400 - 1;
    EXPECT_EQ((*s)->collect(), 0);
    *now += 1;  // agent: 3 days
    EXPECT_EQ((*s)->collect(), 1);
    EXPECT_FALSE(find(**s, agent).has_value());
    EXPECT_TRUE(find(**s, chat).has_value());
    EXPECT_EQ((*s)->stats().class_bytes[1][1], 0);
    EXPECT_EQ((*s)->stats().expirations, 1);
  }
  // Expiry survives a restart (it is in the file): 7 days for chat.
  *now += 4 * 86400;
  auto s = KvStore::open(o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().entries, 0);
  EXPECT_EQ((*s)->stats().expirations, 1);
  EXPECT_TRUE(files(dir).empty());
  fs::remove_all(dir);
}

TEST(KvStore, BudgetsHoldUnderARandomTrace) {
  const std::string dir = temp_dir("budget");
  const int64_t host = 300000, ssd = 1000000;
  auto s = KvStore::open(opts(dir, host, ssd));
  ASSERT_TRUE(s.ok());
  std::mt19937 g(7);
  std::vector<Unit> all;
  int64_t served = 0;
  for (int i = 0; i < 400; ++i) {
    if (all.empty() || g() % 3 != 0) {
      all.push_back(make_unit(
          1000 + i, 1000 + g() % 40000, g() % 2 ? RetentionClass::kChat : RetentionClass::kAgent));
      (*s)->put(all.back().meta, all.back().payload);
    } else {
      const Unit& u = all[g() % all.size()];
      if (find(**s, u) && get_exact(**s, u))
        ++served;
    }
    const StoreStats st = (*s)->stats();
    ASSERT_LE(st.bytes[0], host) << "step " << i;
    ASSERT_LE(st.bytes[1], ssd) << "step " << i;
    if (i % 50 == 0)
      (*s)->wait_idle();
  }
  (*s)->wait_idle();
  int64_t on_disk = 0;
  for (const auto& f : files(dir)) on_disk += static_cast<int64_t>(fs::file_size(dir + "/" + f));
  EXPECT_LE(on_disk, ssd);
  EXPECT_EQ(on_disk, (*s)->stats().bytes[1]);
  EXPECT_GT(served, 0);
  EXPECT_GT((*s)->stats().evictions[0], 0);
  EXPECT_GT((*s)->stats().evictions[1], 0);
  s->reset();
  fs::remove_all(dir);
}

// kill -9 while a child process writes entries: the survivors all verify, nothing partial is
// visible, and tmp- leftovers are cleaned.
TEST(KvStore, KillDashNineDuringWrites) {
  const std::string dir = temp_dir("kill9");
  fs::create_directories(dir);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto s = KvStore::open(opts(dir, 4 << 20, 64 << 20));
    if (!s.ok())
      ::_exit(3);
    for (uint64_t i = 0;; ++i) {
      Unit u = make_unit(5000 + i, 200000 + static_cast<int64_t>(i % 7) * 30000);
      (*s)->put(u.meta, u.payload);
      if (i % 4 == 3)
        (*s)->wait_idle();
    }
  }
  // Let it write a while, then kill it mid-stream.
  for (int i = 0; i < 200 && files(dir).size() < 6; ++i) ::usleep(10000);
  ::usleep(3000);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  auto s = KvStore::open(opts(dir, 4 << 20, 64 << 20));
  ASSERT_TRUE(s.ok());
  const int64_t n = (*s)->stats().entries;
  EXPECT_GT(n, 0);
  for (const auto& f : files(dir)) EXPECT_EQ(f.rfind("tmp-", 0), std::string::npos) << f;
  // Every visible entry is complete and byte-exact.
  int64_t checked = 0;
  for (uint64_t i = 0; i < 100000 && checked < n; ++i) {
    Unit u = make_unit(5000 + i, 0, RetentionClass::kChat, false);
    if (find(**s, u)) {
      u = make_unit(5000 + i, 200000 + static_cast<int64_t>(i % 7) * 30000);
      EXPECT_TRUE(get_exact(**s, u)) << "entry " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, n);
  EXPECT_EQ((*s)->stats().corrupt, 0);
  s->reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dsinfer::kvstore
