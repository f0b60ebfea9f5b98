// ThreadPool: a small fixed set of worker threads (the fast CPU path's kernels, the CUDA
// backend's planner). run(tasks, fn) calls
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
#include <type_traits>
#include <vector>

namespace dsinfer {

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
    using Fn = std::remove_reference_t<F>;
    run_erased(
        tasks,
        [](void* ctx, int64_t t) { (*static_cast<Fn*>(ctx))(t); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void*, int64_t);
  struct Run {  // one run's work, as a worker took it
    uint32_t generation = 0;
    TaskFn fn = nullptr;
    void* ctx = nullptr;
    int64_t tasks = 0;
  };
  void run_erased(int64_t tasks, TaskFn fn, void* ctx);
  void worker_loop();
  void drain(const Run& run);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one run at a time (several models or engines may share the pool)
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_cv_;
  bool stop_ = false;  // guarded by mu_
  Run run_;            // the current run, guarded by mu_
  // The next task to hand out, tagged with its run's generation: (generation << 32) | task. A
  // worker claims a task only while the tag is its run's, so one that wakes after its run ended
  // claims nothing, and a new run need not wait for such latecomers (a planner's two runs per
  // step did: the second waited for the slowest wake-up of the first).
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};  // tasks of the current run finished
};

}  // namespace dsinfer
