// ThreadPool: workers sleep on a condition variable between runs; the caller works too.
#include "base/thread_pool.h"

#include "base/check.h"

namespace dsinfer {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0)
    threads = static_cast<int>(std::thread::hardware_concurrency());
  if (threads < 1)
    threads = 1;
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::drain(const Run& run) {
  uint64_t c = claim_.load(std::memory_order_relaxed);
  for (;;) {
    if (static_cast<uint32_t>(c >> 32) != run.generation)
      return;  // a later run's tag: this one is over
    const int64_t t = static_cast<int64_t>(c & 0xffffffffu);
    if (t >= run.tasks)
      return;
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acquire))
      continue;  // c reloaded
    run.fn(run.ctx, t);
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == run.tasks) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_all();
    }
    c = claim_.load(std::memory_order_relaxed);
  }
}

void ThreadPool::run_erased(int64_t tasks, TaskFn fn, void* ctx) {
  DSI_CHECK(
      tasks < (int64_t{1} << 32), "a thread pool run of %lld tasks", static_cast<long long>(tasks));
  std::lock_guard<std::mutex> run_lock(run_mu_);
  Run run;
  {
    // Every task of the previous run has finished (its caller waited for them), and a worker that
    // has not claimed one by now never will: the fields can change at once.
    std::lock_guard<std::mutex> lock(mu_);
    run_.generation += 1;
    run_.fn = fn;
    run_.ctx = ctx;
    run_.tasks = tasks;
    run = run_;
    done_.store(0, std::memory_order_relaxed);
    claim_.store(static_cast<uint64_t>(run.generation) << 32, std::memory_order_release);
  }
  wake_.notify_all();
  drain(run);
  if (done_.load(std::memory_order_acquire) < tasks) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire) >= tasks; });
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    Run run;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || run_.generation != seen; });
      if (stop_)
        return;
      run = run_;
      seen = run.generation;
    }
    drain(run);
  }
}

}  // namespace dsinfer
