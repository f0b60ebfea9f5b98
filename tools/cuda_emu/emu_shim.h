// A CPU stand-in for the CUDA features that kernels/cuda/sampling.cu uses, so that its kernels'
// logic can be checked on a machine without a GPU: one OS thread per CUDA thread, a barrier per
// block for __syncthreads and one per warp for the warp-wide intrinsics (shuffles, ballot,
// match_any), std::atomic_ref for atomics, plain IEEE float ops for the __f*_rn intrinsics and
// __shared__ as function-local statics (blocks run one after another). Development tool only
// (see run.sh): slow, and it checks logic, not the device's memory model or its exp/log.
#pragma once
#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

struct EmuWarp {
  std::barrier<> bar{32};
  uint64_t slot[32];
};
struct EmuCtx {
  uint3 tid, bid;
  dim3 bdim, gdim;
  std::barrier<>* block_bar;
  EmuWarp* warp;
};
inline thread_local EmuCtx emu;

template <class T>
T emu_exchange(T v, int src) {
  EmuWarp& w = *emu.warp;
  const int lane = emu.tid.x & 31;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  w.slot[lane] = bits;
  w.bar.arrive_and_wait();
  const uint64_t got = w.slot[src & 31];
  w.bar.arrive_and_wait();
  T r;
  std::memcpy(&r, &got, sizeof(T));
  return r;
}
template <class T>
T __shfl_sync(unsigned, T v, int src, int = 32) {
  return emu_exchange(v, src);
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int m) {
  return emu_exchange(v, (int(emu.tid.x) & 31) ^ m);
}
template <class T>
T __shfl_up_sync(unsigned, T v, unsigned d) {
  const int lane = emu.tid.x & 31;
  return emu_exchange(v, lane >= int(d) ? lane - int(d) : lane);
}
inline unsigned emu_collect(uint64_t mine, bool eq_mode) {
  EmuWarp& w = *emu.warp;
  const int lane = emu.tid.x & 31;
  w.slot[lane] = mine;
  w.bar.arrive_and_wait();
  unsigned m = 0;
  for (int i = 0; i < 32; ++i) {
    if (eq_mode ? w.slot[i] == mine : w.slot[i] != 0)
      m |= 1u << i;
  }
  w.bar.arrive_and_wait();
  return m;
}
inline unsigned __ballot_sync(unsigned, bool p) {
  return emu_collect(p ? 1 : 0, false);
}
inline unsigned __match_any_sync(unsigned, int v) {
  return emu_collect(static_cast<uint64_t>(static_cast<uint32_t>(v)), true);
}
inline int __popc(unsigned x) {
  return std::popcount(x);
}
inline int __ffs(unsigned x) {
  return x ? std::countr_zero(x) + 1 : 0;
}
inline void __syncthreads() {
  emu.block_bar->arrive_and_wait();
}
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*a).fetch_add(v);
}
inline int atomicAdd(int* a, int v) {
  return std::atomic_ref<int>(*a).fetch_add(v);
}
inline int atomicMin(int* a, int v) {
  std::atomic_ref<int> r(*a);
  int cur = r.load();
  while (v < cur && !r.compare_exchange_weak(cur, v)) {
  }
  return cur;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline unsigned long long __double2ull_rn(double x) {
  if (std::isnan(x) || x <= 0.0)
    return 0;
  return static_cast<unsigned long long>(std::nearbyint(x));
}
inline uint32_t __float_as_uint(float f) {
  return std::bit_cast<uint32_t>(f);
}
template <class T>
T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
T max(T a, T b) {
  return a < b ? b : a;
}
using std::isfinite;

#define threadIdx (emu.tid)
#define blockIdx (emu.bid)
#define blockDim (emu.bdim)
#define gridDim (emu.gdim)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static

template <class K, class P>
void emu_launch(K kernel, int grid, int block, const P& p) {
  for (int b = 0; b < grid; ++b) {
    std::barrier<> bar(block);
    std::vector<std::unique_ptr<EmuWarp>> warps;
    for (int i = 0; i < block / 32; ++i) warps.push_back(std::make_unique<EmuWarp>());
    std::vector<std::thread> ts;
    for (int t = 0; t < block; ++t) {
      ts.emplace_back([&, t] {
        emu.tid = uint3{unsigned(t), 0, 0};
        emu.bid = uint3{unsigned(b), 0, 0};
        emu.bdim = dim3(block);
        emu.gdim = dim3(grid);
        emu.block_bar = &bar;
        emu.warp = warps[t / 32].get();
        kernel(p);
      });
    }
    for (auto& th : ts) th.join();
  }
}
