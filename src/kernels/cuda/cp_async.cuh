// cp.async (sm_80+) as the hand-written wgmma kernels use it: 16-byte copies that bypass L1,
// 4-byte ones that do not (sources only 4-byte aligned), groups and their waits. Every asm
// statement clobbers memory, so that the compiler keeps shared-memory reads after the waits.
// (mma_sync.cuh has the mma.sync kernels' own variants, with a zero-filling 16-byte copy.)
#pragma once

#include <cstdint>

namespace dsinfer::cuda::cp_async {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void copy16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void copy16(void* dst, const void* src) {
  copy16(smem_u32(dst), src);
}

__device__ __forceinline__ void copy4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void copy4(void* dst, const void* src) {
  copy4(smem_u32(dst), src);
}

__device__ __forceinline__ void commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace dsinfer::cuda::cp_async
