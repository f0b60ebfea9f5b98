// Device-side building blocks shared by the kernels: warp/block reductions and the decoding of
// key references (attention.h) and paged rows (the engine's PageArena layout on the device).
#pragma once

#include <cstdint>

namespace dsinfer::cuda {

// prmt in its generic mode (byte permute of a:b by the selector's nibbles; a nibble's bit 3 picks
// the sign-replicate mode).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// The last i in [0, n) with a[i] <= v, for a ascending and a[0] <= v (a segment's index from its
// begin offsets: the expert of a grouped row, the expert of a tile).
template <class T, class I>
__device__ __forceinline__ I last_at_most(const T* a, I n, T v) {
  I lo = 0;
  I hi = n - 1;
  while (lo < hi) {
    const I mid = (lo + hi + 1) / 2;
    if (a[mid] <= v)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// RoPE's rotation of one pair (a, b) by the angle pos * inv_freq, each product and sum rounded
// as cpu::rope_apply rounds them; inverse rotates back (the sine negated). Every kernel that
// rotates (the fused norm, the RoPE op, the compressor, attention's output un-rotation) uses it,
// or rope_cos_sin once per angle and rope_apply per pair (the same operations, the same bits).
__device__ __forceinline__ float2 rope_cos_sin(float pos, float inv_freq, bool inverse = false) {
  const float angle = __fmul_rn(pos, inv_freq);
  return make_float2(cosf(angle), inverse ? -sinf(angle) : sinf(angle));
}
__device__ __forceinline__ void rope_apply(float& a, float& b, float2 cs) {
  const float x = a;
  const float y = b;
  a = __fsub_rn(__fmul_rn(x, cs.x), __fmul_rn(y, cs.y));
  b = __fadd_rn(__fmul_rn(x, cs.y), __fmul_rn(y, cs.x));
}
__device__ __forceinline__ void rope_rotate(
    float& a, float& b, float pos, float inv_freq, bool inverse = false) {
  rope_apply(a, b, rope_cos_sin(pos, inv_freq, inverse));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `scratch` holds 32 values; it may be reused after the call returns.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  T r = lane < nwarps ? scratch[lane] : T(0);
  return warp_sum(r);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  const float r = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(r);
}

// Key references (attention.h): >= 0 is an element offset into the pool, <= -2 an element offset
// (-2 - ref) into the chunk-local buffer, -1 no key.
__device__ __forceinline__ const float* kv_ref_ptr(const float* pool,
                                                   const float* local,
                                                   int64_t ref) {
  if (ref >= 0)
    return pool + ref;
  if (ref <= -2)
    return local + (-2 - ref);
  return nullptr;
}

__device__ __forceinline__ float* kv_ref_mut(float* pool, float* local, int64_t ref) {
  if (ref >= 0)
    return pool + ref;
  if (ref <= -2)
    return local + (-2 - ref);
  return nullptr;
}

}  // namespace dsinfer::cuda
