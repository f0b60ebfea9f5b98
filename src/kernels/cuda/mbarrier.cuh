// Shared-memory mbarriers (sm_80+; the phase-parity wait as sm_90 has it) as the hand-written
// pipelines use them: a barrier completes a phase when its expected count of arrivals is in, and a
// waiter names the phase it waits for by its parity. cp.async copies can arrive on one when they
// land (arrive_on_copies), so a loader hands a stage over without waiting for its own copies.
// Every asm statement clobbers memory, so that the compiler keeps shared-memory accesses on their
// side of the arrivals and waits.
#pragma once

#include <cstdint>

namespace dsinfer::cuda::mbarrier {

// One thread initialises; a __syncthreads before any other thread uses the barrier.
__device__ __forceinline__ void init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Arrives (one of the expected count) once all of this thread's earlier cp.async copies landed.
__device__ __forceinline__ void arrive_on_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the phase of the given parity (0 for the barrier's first phase, 1 for its second,
// and so on alternately) has completed.
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

}  // namespace dsinfer::cuda::mbarrier
