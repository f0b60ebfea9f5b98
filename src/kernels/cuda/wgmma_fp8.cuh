// The few wgmma (sm_90a) pieces the hand-written FP8 kernels use, as inline PTX: the warpgroup
// fences and groups, shared-memory descriptors for the unswizzled and the 128-byte-swizzled
// K-major layouts, and E4M3 MMAs with A in registers and B in shared memory (m64n8k32 and
// m64nNk32 for N = 32, 64, 128) or both in shared memory (N = 32, 64), fp32 accumulators.
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

// Descriptor of a K-major operand in the 128-byte swizzle (rows of 128 bytes, 8-row atoms of
// 1,024 bytes, 1,024-byte aligned; byte chunk c of row r stored at chunk c ^ (r % 8)). A k-step of
// 32 bytes within the rows adds 2 to the descriptor.
__device__ __forceinline__ uint64_t desc_k_major_sw128(uint32_t saddr) {
  uint64_t d = (saddr & 0x3FFFFu) >> 4;
  d |= uint64_t{1} << 16;          // leading byte offset: unused in this layout
  d |= uint64_t{1024 >> 4} << 32;  // stride byte offset: 8 rows x 128 bytes
  d |= uint64_t{1} << 62;          // 128-byte swizzle
  return d;
}

// Accumulator operand lists: d[i] .. d[i + 7] (and .. d[i + 31]) as read-write fp32 operands.
#define DSI_WGMMA_D8(i)                                                                       \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define DSI_WGMMA_D32(i) \
  DSI_WGMMA_D8(i), DSI_WGMMA_D8(i + 8), DSI_WGMMA_D8(i + 16), DSI_WGMMA_D8(i + 24)

// d (+)= A[64 x 32] . B[32 x N]^T for N = 32, 64 or 128: A (E4M3) in registers as
// mma_m64n8k32_e4m3 holds it, B (E4M3) in shared memory (descriptor), fp32 accumulators:
// d[4 j + i] is row 16 w + g (i < 2) or + 8 (i >= 2), column 8 j + 2 t + (i % 2), j < N / 8.
template <int N>
__device__ __forceinline__ void mma_m64nNk32_e4m3_rs(float (&d)[N / 2],
                                                     const uint32_t (&a)[4],
                                                     uint64_t desc_b,
                                                     bool accumulate) {
  static_assert(N == 32 || N == 64 || N == 128, "wgmma RS: N of 32, 64 or 128");
  if constexpr (N == 32) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, {%16, %17, %18, %19}, %20, p, 1, 1;\n"
        "}\n"
        : DSI_WGMMA_D8(0), DSI_WGMMA_D8(8)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n"
        "}\n"
        : DSI_WGMMA_D32(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0));
  } else {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
        "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
        "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n"
        "}\n"
        : DSI_WGMMA_D32(0), DSI_WGMMA_D32(32)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0));
  }
}

// d (+)= A[64 x 32] . B[32 x N]^T for N = 32 or 64 with both operands in shared memory
// (descriptors), E4M3, fp32 accumulators in mma_m64nNk32_e4m3_rs's layout.
template <int N>
__device__ __forceinline__ void mma_m64nNk32_e4m3_ss(float (&d)[N / 2],
                                                     uint64_t desc_a,
                                                     uint64_t desc_b,
                                                     bool accumulate) {
  static_assert(N == 32 || N == 64, "wgmma SS: N of 32 or 64");
  if constexpr (N == 32) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1;\n"
        "}\n"
        : DSI_WGMMA_D8(0), DSI_WGMMA_D8(8)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0));
  } else {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1;\n"
        "}\n"
        : DSI_WGMMA_D32(0)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0));
  }
}

#undef DSI_WGMMA_D32
#undef DSI_WGMMA_D8

}  // namespace dsinfer::cuda::wgmma
