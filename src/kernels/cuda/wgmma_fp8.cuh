// The few wgmma (sm_90a) pieces the hand-written FP8 kernels use, as inline PTX: the warpgroup
// fences and groups, shared-memory descriptors for the unswizzled and the 128-byte-swizzled
// K-major layouts, the m64n8k32 E4M3 MMA with A in registers (B in shared memory) and the
// m64n128k32 one with both operands in shared memory, fp32 accumulators.
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

// d (+)= A[64 x 32] . B[32 x 128]^T, E4M3 operands both in shared memory (descriptors), fp32
// accumulators: d[4 j + i] is row 16 w + g (i < 2) or + 8 (i >= 2), column 8 j + 2 t + (i % 2).
__device__ __forceinline__ void mma_m64n128k32_e4m3_ss(float (&d)[64],
                                                       uint64_t desc_a,
                                                       uint64_t desc_b,
                                                       bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
      "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]),
        "+f"(d[1]),
        "+f"(d[2]),
        "+f"(d[3]),
        "+f"(d[4]),
        "+f"(d[5]),
        "+f"(d[6]),
        "+f"(d[7]),
        "+f"(d[8]),
        "+f"(d[9]),
        "+f"(d[10]),
        "+f"(d[11]),
        "+f"(d[12]),
        "+f"(d[13]),
        "+f"(d[14]),
        "+f"(d[15]),
        "+f"(d[16]),
        "+f"(d[17]),
        "+f"(d[18]),
        "+f"(d[19]),
        "+f"(d[20]),
        "+f"(d[21]),
        "+f"(d[22]),
        "+f"(d[23]),
        "+f"(d[24]),
        "+f"(d[25]),
        "+f"(d[26]),
        "+f"(d[27]),
        "+f"(d[28]),
        "+f"(d[29]),
        "+f"(d[30]),
        "+f"(d[31]),
        "+f"(d[32]),
        "+f"(d[33]),
        "+f"(d[34]),
        "+f"(d[35]),
        "+f"(d[36]),
        "+f"(d[37]),
        "+f"(d[38]),
        "+f"(d[39]),
        "+f"(d[40]),
        "+f"(d[41]),
        "+f"(d[42]),
        "+f"(d[43]),
        "+f"(d[44]),
        "+f"(d[45]),
        "+f"(d[46]),
        "+f"(d[47]),
        "+f"(d[48]),
        "+f"(d[49]),
        "+f"(d[50]),
        "+f"(d[51]),
        "+f"(d[52]),
        "+f"(d[53]),
        "+f"(d[54]),
        "+f"(d[55]),
        "+f"(d[56]),
        "+f"(d[57]),
        "+f"(d[58]),
        "+f"(d[59]),
        "+f"(d[60]),
        "+f"(d[61]),
        "+f"(d[62]),
        "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0));
}

}  // namespace dsinfer::cuda::wgmma
