// The fast CPU path's process-wide pool (base::ThreadPool, shared by the fast kernels and models).
#pragma once

#include "base/thread_pool.h"

namespace dsinfer::cpu::fast {

using ThreadPool = dsinfer::ThreadPool;

// Created on first use with $DSINFER_CPU_THREADS threads (default: the hardware threads).
ThreadPool& default_pool();

}  // namespace dsinfer::cpu::fast
