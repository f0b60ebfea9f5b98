// ThreadPool: a small fixed set of worker threads for the fast CPU path. run(tasks, fn) calls
// fn(task) for task in [0, tasks) across the workers and the calling thread and returns when all
// are done; runs from several threads take turns (a task must not call run itself). Tasks are
// handed out dynamically (an atomic counter), so a core taken by another process only slows its
// own share, and a run waits for its tasks, not for workers that have not woken up yet (on a
// loaded machine the caller may do all of them). No allocation per run: the callable is passed
// by reference.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace dsinfer::cpu::fast {

class ThreadPool {
 public:
  // threads <= 0: the number of hardware threads (at least 1). The calling thread counts as one.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  template <typename F>
  void run(int64_t tasks, F&& fn) {
    if (tasks <= 0)
      return;
    if (tasks == 1 || workers_.empty()) {
      for (int64_t t = 0; t < tasks; ++t) fn(t);
      return;
    }
    run_erased(
        tasks, [](void* ctx, int64_t t) { (*static_cast<F*>(ctx))(t); }, &fn);
  }

 private:
  using TaskFn = void (*)(void*, int64_t);
  void run_erased(int64_t tasks, TaskFn fn, void* ctx);
  void worker_loop();
  void drain();

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one run at a time (several models or engines may share the pool)
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_cv_;
  std::condition_variable idle_cv_;
  uint64_t generation_ = 0;  // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  int active_ = 0;           // workers inside drain(), guarded by mu_
  // The current run: written under mu_ while no worker is inside drain().
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> done_{0};
};

// The process-wide pool of the fast CPU path, created on first use with
// $DSINFER_CPU_THREADS threads (default: the hardware threads).
ThreadPool& default_pool();

}  // namespace dsinfer::cpu::fast
