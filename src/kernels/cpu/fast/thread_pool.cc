// ThreadPool: workers sleep on a condition variable between runs; the caller works too.
#include "kernels/cpu/fast/thread_pool.h"

#include <cstdlib>

namespace dsinfer::cpu::fast {

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

void ThreadPool::drain() {
  for (;;) {
    const int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
    if (t >= tasks_)
      return;
    fn_(ctx_, t);
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == tasks_) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_all();
    }
  }
}

void ThreadPool::run_erased(int64_t tasks, TaskFn fn, void* ctx) {
  std::lock_guard<std::mutex> run_lock(run_mu_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Workers still inside the previous run's drain() read its fields: let them leave first.
    idle_cv_.wait(lock, [this] { return active_ == 0; });
    fn_ = fn;
    ctx_ = ctx;
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    ++generation_;
  }
  wake_.notify_all();
  drain();
  if (done_.load(std::memory_order_acquire) < tasks) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire) >= tasks; });
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_)
        return;
      seen = generation_;
      ++active_;
    }
    drain();
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0)
      idle_cv_.notify_all();
  }
}

ThreadPool& default_pool() {
  static ThreadPool pool([] {
    const char* env = std::getenv("DSINFER_CPU_THREADS");
    return env && *env ? std::atoi(env) : 0;
  }());
  return pool;
}

}  // namespace dsinfer::cpu::fast
