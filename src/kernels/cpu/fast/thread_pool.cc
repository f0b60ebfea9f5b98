#include "kernels/cpu/fast/thread_pool.h"

#include <cstdlib>

namespace dsinfer::cpu::fast {

ThreadPool& default_pool() {
  static ThreadPool pool([] {
    const char* env = std::getenv("DSINFER_CPU_THREADS");
    return env && *env ? std::atoi(env) : 0;
  }());
  return pool;
}

}  // namespace dsinfer::cpu::fast
