// Asynchronous prefix-cache captures (backend::Model::async_state_reads): the engine forks the
// request's state, starts a background read of the fork's pages and stores the unit only once
// that read has finished. Here the backend is the CPU reference whose reads finish only when the
// test says so, and copy the pages only then: a page reused before the read finished would put
// another sequence's data into the image, and the next turn's output would differ from the
// uncached engine's. The image itself is assembled on the store's worker thread.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "backend/forward_as_batch.h"
#include "engine/engine.h"
#include "kvstore/store.h"
#include "model/checkpoint.h"
#include "unit/engine/engine_test_util.h"

namespace dsinfer::engine {
namespace {

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(2 + g() % static_cast<uint32_t>(vocab - 2));
  return t;
}

// The CPU reference forward with page reads that run "in the background" until finish_reads.
class ControlledReads final : public test_support::CpuBackedModel {
 public:
  using CpuBackedModel::CpuBackedModel;
  const char* name() const override { return "cpu+controlled-reads"; }

  bool async_state_reads() const override { return true; }
  Result<int64_t> begin_read_state_pages(const state::PageArena& arena,
                                         std::span<const int32_t> pages,
                                         float* dst) override {
    if (refuse)
      return Status(StatusCode::kResourceExhausted, "no staging");
    Read& r = reads_[++next_];
    r.arena = &arena;
    r.pages.assign(pages.begin(), pages.end());
    r.dst = dst;
    ++begun;
    return next_;
  }
  Result<bool> poll_state_read(int64_t ticket) override {
    auto it = reads_.find(ticket);
    EXPECT_NE(it, reads_.end()) << "poll of a spent ticket";
    if (it == reads_.end())
      return Status(StatusCode::kInternal, "spent ticket");
    if (!it->second.done)
      return false;
    const Status s = it->second.result;
    reads_.erase(it);
    if (!s.ok())
      return s;
    return true;
  }
  Status wait_state_read(int64_t ticket) override {
    ++*waits;
    auto it = reads_.find(ticket);
    if (it == reads_.end())
      return Status(StatusCode::kInternal, "spent ticket");
    if (!it->second.done)
      finish(it->second, Status());
    const Status s = it->second.result;
    reads_.erase(it);
    return s;
  }

  // Ends every read in flight: copies its pages now (ok) or fails it.
  void finish_reads(bool ok) {
    for (auto& [t, r] : reads_) {
      if (!r.done)
        finish(r, ok ? Status() : Status(StatusCode::kInternal, "injected copy failure"));
    }
  }
  // Pages of the reads still in flight.
  std::vector<int32_t> reading() const {
    std::vector<int32_t> p;
    for (const auto& [t, r] : reads_) {
      if (!r.done)
        p.insert(p.end(), r.pages.begin(), r.pages.end());
    }
    return p;
  }
  int64_t in_flight() const { return static_cast<int64_t>(reading().size()); }

  bool refuse = false;
  int64_t begun = 0;
  // wait_state_read calls (shared: read after the engine and its model are gone).
  std::shared_ptr<int64_t> waits = std::make_shared<int64_t>(0);

 private:
  struct Read {
    const state::PageArena* arena = nullptr;
    std::vector<int32_t> pages;
    float* dst = nullptr;
    bool done = false;
    Status result;
  };
  void finish(Read& r, Status s) {
    if (s.ok())
      s = Model::read_state_pages(*r.arena, r.pages, r.dst);  // the host copy, only now
    r.done = true;
    r.result = s;
  }
  std::map<int64_t, Read> reads_;
  int64_t next_ = 0;
};

std::shared_ptr<kvstore::KvStore> open_store() {
  kvstore::KvStoreOptions o;
  o.host_bytes = int64_t{64} << 20;
  auto s = kvstore::KvStore::open(o);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::shared_ptr<kvstore::KvStore>(std::move(s).value());
}

EngineConfig config(std::shared_ptr<kvstore::KvStore> store, int64_t device_bytes) {
  const auto& mc = test_support::tiny_fixture()->config();
  EngineConfig cfg;
  cfg.state_budget_bytes = int64_t{64} << 20;
  cfg.page_bytes = state::min_page_bytes(mc);
  cfg.scheduler.prefill_chunk = 32;
  cfg.prefix_cache.store = std::move(store);
  cfg.prefix_cache.block = 16;
  cfg.prefix_cache.min_tokens = 4;
  cfg.prefix_cache.promote_wait_ms = 5000;
  cfg.prefix_cache.device_bytes = device_bytes;
  cfg.prefix_cache.salt = "async-capture-test";
  return cfg;
}

struct Rig {
  std::unique_ptr<Engine> engine;
  ControlledReads* model = nullptr;
  std::shared_ptr<kvstore::KvStore> store;
};

Rig make(int64_t device_bytes = 0, std::shared_ptr<kvstore::KvStore> store = nullptr) {
  Rig s;
  auto ckpt = test_support::tiny_fixture();
  s.store = store ? store : open_store();
  auto m = std::make_unique<ControlledReads>(*ckpt);
  s.model = m.get();
  auto e = Engine::create(config(s.store, device_bytes), ckpt, std::move(m));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  s.engine = std::move(e).value();
  return s;
}

std::unique_ptr<Engine> make_plain() {
  EngineConfig cfg = config(nullptr, 0);
  auto e = Engine::create(cfg, test_support::tiny_fixture());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

using test_support::Turn;

RequestId submit(Engine& e, const std::vector<int32_t>& prompt) {
  RequestSpec s;
  s.prompt = prompt;
  s.max_tokens = 6;
  s.sampling.temperature = 0.0f;
  s.ignore_eos = true;
  auto id = e.submit(std::move(s));
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  return *id;
}

// Steps until request id is done (never waiting for captures), checking the engine each step.
Turn finish(Engine& e, RequestId id, int64_t* steps = nullptr) {
  while (!e.request(id)->done()) {
    e.step();
    e.check_integrity();
    if (steps)
      ++*steps;
  }
  const Request* r = e.request(id);
  Turn t{r->output, r->output_logprobs, r->cached_tokens};
  e.release(id);
  return t;
}

Turn run_plain(Engine& e, const std::vector<int32_t>& prompt) {
  const RequestId id = submit(e, prompt);
  e.run_until_done();
  return finish(e, id);
}

// Two turns of a conversation and the uncached engine's outputs for them.
struct Conversation {
  std::vector<int32_t> first, second;
  Turn first_want, second_want;
};
Conversation conversation(uint32_t seed) {
  auto plain = make_plain();
  const int64_t vocab = plain->model_config().vocab_size;
  Conversation c;
  c.first = random_tokens(23, vocab, seed);
  c.first_want = run_plain(*plain, c.first);
  c.second = c.first;
  c.second.insert(c.second.end(), c.first_want.output.begin(), c.first_want.output.end());
  const auto more = random_tokens(9, vocab, seed + 1);
  c.second.insert(c.second.end(), more.begin(), more.end());
  c.second_want = run_plain(*plain, c.second);
  return c;
}

void expect_same(const Turn& got, const Turn& want) {
  EXPECT_EQ(got.output, want.output);
  EXPECT_EQ(got.logprobs, want.logprobs);  // bit-equal floats
}

// (1) the step loop runs another request while the captures are pending, (2) the unit reaches
// the store only after the copy, (3) the captured pages stay allocated until then and go back
// to the arena after, and the stored image is the state as it was (bit-identical next turn).
void check_pending_then_stored(int64_t device_bytes) {
  const Conversation c = conversation(41);
  Rig s = make(device_bytes);
  Engine& e = *s.engine;
  const Turn first = finish(e, submit(e, c.first));
  expect_same(first, c.first_want);
  ASSERT_GT(e.pending_captures(), 0);
  EXPECT_EQ(s.model->begun, e.stats().cache_async_captures);
  EXPECT_EQ(e.stats().cache_units_stored, 0);
  EXPECT_EQ(s.store->stats().puts, 0) << "stored before its copy finished";
  // The request is gone, its captured pages are not.
  EXPECT_GT(e.arena().used_bytes(), 0);
  const std::vector<int32_t> held = s.model->reading();
  for (int32_t p : held) EXPECT_GE(e.arena().owner(p).sequence, 0) << "page " << p << " freed";

  // The next turn, submitted while the copy runs: a miss, computed in full, with steps that
  // never wait for the copy. Its pages come from the arena while the captured ones stay put.
  int64_t steps = 0;
  const Turn second = finish(e, submit(e, c.second), &steps);
  expect_same(second, c.second_want);
  EXPECT_EQ(second.cached, 0);
  EXPECT_GT(steps, 1);
  EXPECT_GT(e.pending_captures(), 0);
  for (int32_t p : held) EXPECT_GE(e.arena().owner(p).sequence, 0) << "page " << p << " freed";

  // The copies finish: the next step hands their pages to the store's worker, which assembles
  // and stores the units, and lets the pages go.
  s.model->finish_reads(true);
  e.step();
  e.check_integrity();
  EXPECT_EQ(e.pending_captures(), 0);
  e.wait_stored_captures();
  EXPECT_GT(e.stats().cache_units_stored, 0);
  EXPECT_EQ(s.store->stats().puts, e.stats().cache_units_stored);
  EXPECT_EQ(e.stats().cache_store_failures, 0);
  if (device_bytes == 0) {
    EXPECT_EQ(e.arena().used_bytes(), 0) << "capture forks not freed";
  }

  // The second turn again: served from what the copies brought back, bit for bit.
  const RequestId id = submit(e, c.second);
  const Turn again = finish(e, id);
  expect_same(again, c.second_want);
  EXPECT_GT(again.cached, 0);
  s.model->finish_reads(true);
  e.run_until_done();
  EXPECT_EQ(e.pending_captures(), 0);
}

TEST(AsyncCapture, StoredOnlyAfterTheCopyWithPagesHeldUntilThen) {
  check_pending_then_stored(0);
}

TEST(AsyncCapture, FromTheDeviceTierStoredOnlyAfterTheCopy) {
  check_pending_then_stored(int64_t{32} << 20);
}

// (4) A copy that fails stores nothing: the next turn misses and is computed, identically.
TEST(AsyncCapture, FailedCopyStoresNothing) {
  const Conversation c = conversation(43);
  Rig s = make();
  Engine& e = *s.engine;
  expect_same(finish(e, submit(e, c.first)), c.first_want);
  ASSERT_GT(e.pending_captures(), 0);
  s.model->finish_reads(false);
  e.step();
  e.check_integrity();
  EXPECT_EQ(e.pending_captures(), 0);
  EXPECT_EQ(e.stats().cache_units_stored, 0);
  EXPECT_GT(e.stats().cache_store_failures, 0);
  EXPECT_EQ(s.store->stats().puts, 0);
  EXPECT_EQ(e.arena().used_bytes(), 0);
  const Turn second = finish(e, submit(e, c.second));
  expect_same(second, c.second_want);
  EXPECT_EQ(second.cached, 0);
}

// (5) Shutdown waits for the copies in flight and stores their units: a new engine over the
// same store hits them.
TEST(AsyncCapture, ShutdownDrainsPendingCopies) {
  const Conversation c = conversation(47);
  auto store = open_store();
  {
    Rig s = make(0, store);
    expect_same(finish(*s.engine, submit(*s.engine, c.first)), c.first_want);
    const int64_t pending = s.engine->pending_captures();
    ASSERT_GT(pending, 0);
    const std::shared_ptr<int64_t> waits = s.model->waits;
    EXPECT_EQ(*waits, 0);
    s.engine.reset();  // the model goes with it
    EXPECT_EQ(*waits, pending);
  }
  EXPECT_GT(store->stats().puts, 0);
  Rig s = make(0, store);
  const Turn second = finish(*s.engine, submit(*s.engine, c.second));
  expect_same(second, c.second_want);
  EXPECT_GT(second.cached, 0);
  s.model->finish_reads(true);
}

// Every unit stored by a rig: its image and the thread that assembled it.
struct Seen {
  std::mutex mu;
  std::map<std::string, std::pair<std::string, std::thread::id>> units;  // by key (hex)
};
std::shared_ptr<Seen> observe(Engine& e) {
  auto seen = std::make_shared<Seen>();
  e.set_store_observer([seen](const kvstore::Key128& key, std::string_view image) {
    std::lock_guard<std::mutex> l(seen->mu);
    seen->units[key.hex()] = {std::string(image), std::this_thread::get_id()};
  });
  return seen;
}

// (6) The image of a background capture is assembled off the step loop's thread (the store's
// worker), from the copied pages only, and is byte for byte the image the synchronous capture
// takes of the same request; the store holds exactly that. Shutdown with the copies still
// running stores every unit, assembled off the loop thread too.
void check_assembled_off_the_loop(int64_t device_bytes) {
  const Conversation c = conversation(59);
  const std::thread::id loop = std::this_thread::get_id();
  // The synchronous capture (the backend refuses background reads).
  Rig sync = make(device_bytes);
  sync.model->refuse = true;
  auto want = observe(*sync.engine);
  expect_same(finish(*sync.engine, submit(*sync.engine, c.first)), c.first_want);
  ASSERT_FALSE(want->units.empty());
  for (const auto& [key, unit] : want->units) EXPECT_EQ(unit.second, loop) << key;

  auto check = [&](Seen& got, kvstore::KvStore& store) {
    std::lock_guard<std::mutex> l(got.mu);
    ASSERT_EQ(got.units.size(), want->units.size());
    for (const auto& [key, unit] : got.units) {
      auto w = want->units.find(key);
      ASSERT_NE(w, want->units.end()) << key;
      EXPECT_TRUE(unit.first == w->second.first) << "image of " << key << " differs";
      EXPECT_NE(unit.second, loop) << "image of " << key << " assembled on the loop thread";
    }
    EXPECT_EQ(store.stats().puts, static_cast<int64_t>(want->units.size()));
  };

  // Background captures, stored while the loop runs.
  {
    Rig s = make(device_bytes);
    auto got = observe(*s.engine);
    Engine& e = *s.engine;
    expect_same(finish(e, submit(e, c.first)), c.first_want);
    ASSERT_GT(e.pending_captures(), 0);
    s.model->finish_reads(true);
    e.step();
    e.wait_stored_captures();
    EXPECT_EQ(e.stats().cache_captures_pending, 0);
    EXPECT_EQ(e.stats().cache_units_stored, static_cast<int64_t>(want->units.size()));
    EXPECT_EQ(e.stats().cache_store_failures, 0);
    check(*got, *s.store);
  }
  // Background captures still copying at shutdown: the destructor stores them all.
  {
    Rig s = make(device_bytes);
    auto got = observe(*s.engine);
    expect_same(finish(*s.engine, submit(*s.engine, c.first)), c.first_want);
    ASSERT_GT(s.engine->pending_captures(), 0);
    s.engine.reset();
    check(*got, *s.store);
  }
}

TEST(AsyncCapture, ImageAssembledOffTheLoopEqualsTheSynchronousCapture) {
  check_assembled_off_the_loop(0);
}

TEST(AsyncCapture, FromTheDeviceTierImageAssembledOffTheLoop) {
  check_assembled_off_the_loop(int64_t{32} << 20);
}

// A backend that cannot start a read (no staging): the capture is taken synchronously, as
// before, and the unit is stored at once.
TEST(AsyncCapture, RefusedReadFallsBackToTheSynchronousCapture) {
  const Conversation c = conversation(53);
  Rig s = make();
  s.model->refuse = true;
  Engine& e = *s.engine;
  expect_same(finish(e, submit(e, c.first)), c.first_want);
  EXPECT_EQ(e.pending_captures(), 0);
  EXPECT_GT(e.stats().cache_units_stored, 0);
  EXPECT_EQ(e.arena().used_bytes(), 0);
  const Turn second = finish(e, submit(e, c.second));
  expect_same(second, c.second_want);
  EXPECT_GT(second.cached, 0);
}

}  // namespace
}  // namespace dsinfer::engine
