// The few wgmma (sm_90a) pieces the hand-written FP8 kernels use, as inline PTX: the warpgroup
// fences and groups, a shared-memory descriptor for the unswizzled K-major layout, and the
// m64n8k32 E4M3 MMA with A in registers (B in shared memory, fp32 accumulators).
//
// Register fragments (per warp w of the warpgroup, lane = 4 g + t): A's four registers hold rows
// 16 w + g (a0, a2) and 16 w + g + 8 (a1, a3), K bytes 4 t .. 4 t + 3 (a0, a1) and 16 + 4 t ..
// (a2, a3); the accumulators d0..d3 rows 16 w + g (d0, d1) / + 8 (d2, d3), columns 2 t, 2 t + 1.
#pragma once

#include <cstdint>

namespace dsinfer::cuda::wgmma {

// Orders this warpgroup's register writes before the wgmmas that follow (required before a wgmma
// whose A or accumulator registers other instructions wrote).
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most N committed groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Generic-proxy shared-memory writes made visible to the wgmmas (async proxy) that read them.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Keeps the compiler from moving reads of accumulators across a wait (the MMA writes them
// asynchronously; the asm below tells the compiler they change here).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Descriptor of an unswizzled K-major operand: core matrices of 8 rows x 16 bytes (128 contiguous
// bytes); lbo = bytes between the core matrices of neighbouring K, sbo = between neighbouring
// 8-row groups.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = (saddr & 0x3FFFFu) >> 4;
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
  return d;  // layout type 0: no swizzle
}

// d (+)= A[64 x 32] . B[32 x 8]^T, E4M3 operands; accumulate = false overwrites d.
__device__ __forceinline__ void mma_m64n8k32_e4m3(const uint32_t (&a)[4],
                                                  uint64_t desc_b,
                                                  float (&d)[4],
                                                  bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0));
}

}  // namespace dsinfer::cuda::wgmma
