// base::ThreadPool: every task of every run exactly once, runs from several threads taking
// turns, and no task running after its run returned (a worker that wakes late claims nothing).
#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace dsinfer {
namespace {

// Many short runs back to back (workers often still asleep or still inside the previous run):
// every task of every run runs exactly once, and runs from two threads take turns.
TEST(ThreadPool, EveryTaskOnceAcrossManyRuns) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(64);
  auto many = [&](int runs) {
    for (int r = 0; r < runs; ++r) {
      const int64_t tasks = 1 + r % 64;
      pool.run(tasks, [&](int64_t t) { hits[static_cast<size_t>(t)].fetch_add(1); });
    }
  };
  std::thread other([&] { many(2000); });
  many(2000);
  other.join();
  int64_t expected_total = 0;
  for (int r = 0; r < 2000; ++r) expected_total += 2 * (1 + r % 64);
  int64_t total = 0;
  for (size_t t = 0; t < hits.size(); ++t) {
    int64_t want = 0;
    for (int r = 0; r < 2000; ++r) want += (static_cast<int64_t>(t) < 1 + r % 64) ? 2 : 0;
    EXPECT_EQ(hits[t].load(), want) << "task " << t;
    total += hits[t].load();
  }
  EXPECT_EQ(total, expected_total);
}

// Each run's tasks write into storage that dies when the run returns (a late task would write
// into freed memory: the sanitizer build reports it) and the caller sees every write, plain
// stores included, once run returns. More workers than this machine's cores, so that some wake
// only after their run is over.
TEST(ThreadPool, NoTaskRunsAfterItsRunReturnedAndItsWritesAreSeen) {
  ThreadPool pool(static_cast<int>(2 * std::max(2u, std::thread::hardware_concurrency())));
  for (int r = 0; r < 5000; ++r) {
    const int64_t tasks = 2 + r % 17;
    std::vector<int64_t> out(static_cast<size_t>(tasks), -1);
    pool.run(tasks, [&](int64_t t) { out[static_cast<size_t>(t)] = t * t + r; });
    for (int64_t t = 0; t < tasks; ++t) ASSERT_EQ(out[static_cast<size_t>(t)], t * t + r);
  }
}

// A callable given as an lvalue, const or not, runs as one given as a temporary.
TEST(ThreadPool, TakesLvalueAndConstCallables) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  auto add = [&](int64_t t) { sum.fetch_add(t); };
  pool.run(10, add);
  const auto& cadd = add;
  pool.run(10, cadd);
  EXPECT_EQ(sum.load(), 90);
}

}  // namespace
}  // namespace dsinfer
