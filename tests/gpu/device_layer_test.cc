// The device layer: size classes, the caching allocator (reuse, stats, trim, budget/OOM retry,
// per-stream free lists), device/pinned RAII buffers, streams and events, the sticky-error latch
// (a deliberate illegal write in a death-test child), and host/device equality of the counter
// RNG the sampler shares.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "device/allocator.h"
#include "device/device_error.h"
#include "device/stream.h"
#include "numeric/counter_rng.h"
#include "sampling/sampler.h"
#include "test_util.h"

namespace dsinfer::device {
namespace {

using cuda::test::DevVec;
using cuda::test::GpuTest;

// ---- host-only ---------------------------------------------------------------------------------

TEST(DeviceLayer, SizeClasses) {
  EXPECT_EQ(CachingAllocator::size_class(1), 512u);
  EXPECT_EQ(CachingAllocator::size_class(512), 512u);
  EXPECT_EQ(CachingAllocator::size_class(513), 1024u);
  EXPECT_EQ(CachingAllocator::size_class(1 << 20), size_t{1} << 20);
  size_t prev = 0;
  std::set<size_t> classes;
  for (size_t b = 1; b < (size_t{1} << 34); b = b * 5 / 4 + 7) {
    const size_t c = CachingAllocator::size_class(b);
    EXPECT_GE(c, b);
    EXPECT_GE(c, prev);  // monotone
    EXPECT_EQ(c % 512, 0u);
    if (b > (1 << 20)) {
      EXPECT_LE(static_cast<double>(c), 1.25 * static_cast<double>(b) + 1) << b;
    }
    EXPECT_EQ(CachingAllocator::size_class(c), c);  // classes are fixed points
    prev = c;
    classes.insert(c);
  }
}

TEST(DeviceLayer, StickyClassification) {
  EXPECT_TRUE(is_sticky_error(cudaErrorIllegalAddress));
  EXPECT_TRUE(is_sticky_error(cudaErrorLaunchFailure));
  EXPECT_TRUE(is_sticky_error(cudaErrorAssert));
  EXPECT_FALSE(is_sticky_error(cudaErrorMemoryAllocation));
  EXPECT_FALSE(is_sticky_error(cudaErrorInvalidValue));
  EXPECT_FALSE(is_sticky_error(cudaErrorNotReady));
  EXPECT_TRUE(check_cuda(cudaSuccess, "x").ok());
  EXPECT_EQ(check_cuda(cudaErrorMemoryAllocation, "m").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(check_cuda(cudaErrorInvalidValue, "v").code(), StatusCode::kInternal);
  EXPECT_FALSE(device_failed());  // non-sticky errors do not latch
}

TEST(DeviceLayer, CounterRngMatchesSamplerFormula) {
  // Identical to the host sampler's draw (the header is meant to replace its body unchanged).
  for (uint64_t s : {uint64_t{0}, uint64_t{1}, uint64_t{42}, ~uint64_t{0}, uint64_t{1} << 63}) {
    for (uint64_t c = 0; c < 1000; ++c) {
      ASSERT_EQ(rng::uniform_from(s, c * 977), sampling::uniform_from(s, c * 977)) << s << " " << c;
    }
  }
  EXPECT_NE(rng::uniform_from(0, 0), rng::uniform_from(0, 1));
  EXPECT_NE(rng::uniform_from(1, 0), rng::uniform_from(0, 0));
  for (uint64_t s = 0; s < 50; ++s) {
    for (uint64_t c = 0; c < 50; ++c) {
      const double u = rng::uniform_from(s * 7919, c * 104729);
      EXPECT_GE(u, 0.0);
      EXPECT_LT(u, 1.0);
    }
  }
}

// ---- on the device ------------------------------------------------------------------------------

TEST_F(GpuTest, AllocatorReusesBlocksPerStream) {
  CachingAllocator alloc;
  auto a = alloc.allocate(1000, nullptr);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  void* pa = *a;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pa) % 256, 0u);
  DSI_CUDA_CHECK(cudaMemset(pa, 0, 1000));
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.in_use_bytes, 1024);
  EXPECT_EQ(s.requested_bytes, 1000);
  EXPECT_EQ(s.num_cuda_mallocs, 1);
  alloc.deallocate(pa);
  s = alloc.stats();
  EXPECT_EQ(s.in_use_bytes, 0);
  EXPECT_EQ(s.cached_bytes, 1024);
  // Same class, same stream: the cached block comes back without a cudaMalloc.
  auto b = alloc.allocate(1023, nullptr);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, pa);
  EXPECT_EQ(alloc.stats().num_cache_hits, 1);
  EXPECT_EQ(alloc.stats().num_cuda_mallocs, 1);
  // Another stream does not get a block freed on this one.
  auto st = Stream::create();
  ASSERT_TRUE(st.ok());
  alloc.deallocate(*b);
  auto c = alloc.allocate(1000, st->get());
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*c, pa);
  EXPECT_EQ(alloc.stats().num_cuda_mallocs, 2);
  alloc.deallocate(*c);
  EXPECT_EQ(alloc.stats().peak_in_use_bytes, 1024);
  ASSERT_TRUE(alloc.trim().ok());
  s = alloc.stats();
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(s.num_cuda_frees, 2);
  EXPECT_EQ(alloc.allocate(0, nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(GpuTest, AllocatorBudgetTrimsAndRetries) {
  CachingAllocator alloc(AllocatorOptions{.max_reserved_bytes = 3 << 20});
  auto a = alloc.allocate(2 << 20, nullptr);
  ASSERT_TRUE(a.ok());
  alloc.deallocate(*a);  // cached: 2 MiB reserved
  // 1.5 MiB does not fit next to the cached 2 MiB: the allocator trims and retries.
  auto b = alloc.allocate(3 << 19, nullptr);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.num_oom_retries, 1);
  EXPECT_EQ(s.num_cuda_frees, 1);
  EXPECT_EQ(s.reserved_bytes, 3 << 19);
  // Beyond the budget even after trimming: a clean kResourceExhausted, nothing leaked.
  auto c = alloc.allocate(2 << 20, nullptr);
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(alloc.stats().in_use_bytes, 3 << 19);
  alloc.deallocate(*b);
  // The device itself running out is the same error (and clears the non-sticky CUDA error).
  CachingAllocator big;
  auto huge = big.allocate(size_t{1} << 50, nullptr);
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_FALSE(device_failed());
}

TEST_F(GpuTest, DeviceBufferAndPinnedRoundTrip) {
  CachingAllocator alloc;
  auto st = Stream::create();
  ASSERT_TRUE(st.ok());
  constexpr size_t kN = 1 << 20;
  auto pin_in = PinnedBuffer::allocate(kN * 4);
  auto pin_out = PinnedBuffer::allocate(kN * 4);
  ASSERT_TRUE(pin_in.ok() && pin_out.ok());
  for (size_t i = 0; i < kN; ++i)
    pin_in->as<uint32_t>()[i] = static_cast<uint32_t>(i * 2654435761u);
  {
    auto buf = DeviceBuffer::allocate(alloc, kN * 4, st->get());
    ASSERT_TRUE(buf.ok());
    DeviceBuffer moved = std::move(*buf);
    EXPECT_EQ(buf->get(), nullptr);
    DSI_CUDA_CHECK(
        cudaMemcpyAsync(moved.get(), pin_in->get(), kN * 4, cudaMemcpyHostToDevice, st->get()));
    DSI_CUDA_CHECK(
        cudaMemcpyAsync(pin_out->get(), moved.get(), kN * 4, cudaMemcpyDeviceToHost, st->get()));
    ASSERT_TRUE(st->synchronize().ok());
    EXPECT_EQ(alloc.stats().in_use_bytes,
              static_cast<int64_t>(CachingAllocator::size_class(kN * 4)));
  }
  EXPECT_EQ(alloc.stats().in_use_bytes, 0);  // returned by the destructor
  EXPECT_EQ(std::memcmp(pin_in->get(), pin_out->get(), kN * 4), 0);
  auto empty = DeviceBuffer::allocate(alloc, 0, nullptr);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->get(), nullptr);
}

TEST_F(GpuTest, StreamsAndEvents) {
  auto s1 = Stream::create();
  auto s2 = Stream::create(/*non_blocking=*/true, /*priority=*/-1);
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto e0 = Event::create(/*timing=*/true);
  auto e1 = Event::create(/*timing=*/true);
  ASSERT_TRUE(e0.ok() && e1.ok());
  DevVec<float> buf(std::vector<float>(1 << 22, 1.0f));
  ASSERT_TRUE(e0->record(s1->get()).ok());
  DSI_CUDA_CHECK(cudaMemsetAsync(buf.get(), 0, buf.size() * 4, s1->get()));
  ASSERT_TRUE(e1->record(s1->get()).ok());
  ASSERT_TRUE(s2->wait(*e1).ok());  // s2 orders after s1's memset
  std::vector<float> host(buf.size(), 5.0f);
  DSI_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), buf.get(), buf.size() * 4, cudaMemcpyDeviceToHost, s2->get()));
  ASSERT_TRUE(s2->synchronize().ok());
  EXPECT_EQ(host.front(), 0.0f);
  EXPECT_EQ(host.back(), 0.0f);
  auto ready = e1->ready();
  ASSERT_TRUE(ready.ok());
  EXPECT_TRUE(*ready);
  auto ms = Event::elapsed_ms(*e0, *e1);
  ASSERT_TRUE(ms.ok()) << ms.status().to_string();
  EXPECT_GE(*ms, 0.0f);
  auto r = s1->ready();
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(*r);
  Stream moved = std::move(*s1);
  EXPECT_FALSE(s1->valid());
  EXPECT_TRUE(moved.valid());
  EXPECT_TRUE(poll_device().ok());
}

TEST_F(GpuTest, CounterRngHostDeviceIdentical) {
  std::vector<uint64_t> seeds;
  std::vector<uint64_t> counters;
  for (uint64_t i = 0; i < 4096; ++i) {
    seeds.push_back(i % 7 == 0 ? ~uint64_t{0} - i : i * 0x9e3779b97f4a7c15ULL);
    counters.push_back(i * 31 + (i % 5 == 0 ? uint64_t{1} << 40 : 0));
  }
  DevVec<uint64_t> d_s(seeds);
  DevVec<uint64_t> d_c(counters);
  DevVec<double> d_out(seeds.size());
  cuda::test::launch_uniform_from(d_s.get(), d_c.get(), d_out.get(), 4096, nullptr);
  cuda::test::sync();
  const std::vector<double> got = d_out.download();
  for (size_t i = 0; i < seeds.size(); ++i) {
    ASSERT_EQ(got[i], rng::uniform_from(seeds[i], counters[i])) << i;
  }
}

// A kernel fault is sticky: the latch records it, every later call reports the device failure,
// and device objects can still be destroyed (the engine fails in-flight requests and exits).
// Runs in a death-test child so the parent's context stays healthy.
TEST_F(GpuTest, StickyErrorIsLatchedAndShutdownIsClean) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        bool ok = false;
        {
          CachingAllocator alloc;
          auto st = Stream::create();
          if (!st.ok())
            std::exit(2);
          auto live = DeviceBuffer::allocate(alloc, 4096, st->get());
          auto cached = DeviceBuffer::allocate(alloc, 8192, st->get());
          if (!live.ok() || !cached.ok())
            std::exit(2);
          cached->reset();  // a cached block for the destructor to release
          cuda::test::launch_illegal_write(st->get());
          const Status s = st->synchronize();
          ok = !s.ok() && s.code() == StatusCode::kInternal && device_failed() &&
               s.message().find("CUDA device failed") != std::string::npos && !poll_device().ok() &&
               !alloc.allocate(64, nullptr).ok();
          std::fprintf(stderr, "sticky: %s\n", s.to_string().c_str());
          live->reset();
        }  // allocator, stream and buffers released after the failure: must not abort
        std::exit(ok ? 0 : 3);
      },
      ::testing::ExitedWithCode(0),
      "sticky: .*CUDA device failed");
}

}  // namespace
}  // namespace dsinfer::device
