// src/comm on a GPU: LocalComm's copies, NcclComm as rank 0 of 1 (bootstrapped through a
// temporary id file), and ranks started by spawn_ranks that bootstrap from their environment.
// Without a GPU every test skips; without NCCL (not built with it, see cmake/nccl.cmake, or
// libnccl.so.2 does not load at run time) the NcclComm tests skip.
//
// Only size-1 NCCL communicators can run on a one-GPU machine (NCCL refuses two ranks on one
// device). NcclGpu.NcclSpawnedRanks runs DSINFER_COMM_TEST_RANKS ranks (default 1), each this
// binary filtered to CommChild.NcclRankFromEnv, whose checks are written for any number of ranks:
//   DSINFER_COMM_TEST_RANKS=8 build/bin/gpu_comm_test --gtest_filter='NcclGpu.NcclSpawnedRanks'
#include "comm/comm.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/launcher.h"
#include "comm/nccl_comm.h"
#include "kernels/cuda/cuda_check.h"

namespace dsinfer::comm {
namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

#define DSI_EXPECT_OK(expr)                           \
  do {                                                \
    const ::dsinfer::Status dsi_st_ = (expr);         \
    ASSERT_TRUE(dsi_st_.ok()) << dsi_st_.to_string(); \
  } while (0)

// Raw device bytes, freed on destruction (plain cudaMalloc).
class DevBytes {
 public:
  explicit DevBytes(size_t n) : n_(n) {
    if (n_ > 0)
      DSI_CUDA_CHECK(cudaMalloc(&p_, n_));
  }
  ~DevBytes() {
    if (p_ != nullptr)
      DSI_CUDA_CHECK(cudaFree(p_));
  }
  DevBytes(const DevBytes&) = delete;
  DevBytes& operator=(const DevBytes&) = delete;
  char* get() const { return static_cast<char*>(p_); }
  void upload(const std::vector<char>& h) const {
    DSI_CUDA_CHECK(cudaMemcpy(p_, h.data(), h.size(), cudaMemcpyHostToDevice));
  }
  std::vector<char> download() const {
    std::vector<char> h(n_);
    if (n_ > 0)
      DSI_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_, cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  size_t n_ = 0;
  void* p_ = nullptr;
};

class Stream {
 public:
  Stream() { DSI_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { DSI_CUDA_CHECK(cudaStreamDestroy(s_)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { DSI_CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

class CommGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0)
      GTEST_SKIP() << "no CUDA device";
    DSI_CUDA_CHECK(cudaSetDevice(0));
  }
};

class NcclGpu : public CommGpu {
 protected:
  void SetUp() override {
    CommGpu::SetUp();
    if (IsSkipped())
      return;
    if (!NcclComm::built_with_nccl())
      GTEST_SKIP() << "built without NCCL (pip install nvidia-nccl-cu13 and reconfigure): "
                      "NcclComm tests skipped";
    if (!NcclComm::nccl_loadable())  // loaded at run time (comm/nccl_loader.h)
      GTEST_SKIP() << NcclComm::library_version().status().message() << ": NcclComm tests skipped";
    auto dir = make_id_file_path();
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    id_file_ = *dir;
  }
  void TearDown() override {
    if (!id_file_.empty())
      (void)remove_id_file(id_file_);
  }
  std::unique_ptr<NcclComm> make_single() {
    Bootstrap boot{.rank = 0, .size = 1, .id_file = id_file_, .timeout_ms = 60'000};
    auto c = NcclComm::create(boot, 0, 1, 0);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::string id_file_;
};

// One random size-1 all-to-all: a block somewhere in the send buffer to somewhere in the receive
// buffer; every other receive byte keeps its sentinel.
void check_single_rank_a2a(Comm& comm, size_t elem_bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t count = std::uniform_int_distribution<int64_t>(0, 3000)(rng);
  const int64_t send_off = std::uniform_int_distribution<int64_t>(0, 500)(rng);
  const int64_t recv_off = std::uniform_int_distribution<int64_t>(0, 500)(rng);
  const size_t send_bytes = static_cast<size_t>(send_off + count + 7) * elem_bytes;
  const size_t recv_bytes = static_cast<size_t>(recv_off + count + 9) * elem_bytes;
  std::vector<char> hs(send_bytes);
  for (char& b : hs) b = static_cast<char>(rng());
  DevBytes send(send_bytes);
  DevBytes recv(recv_bytes);
  send.upload(hs);
  recv.upload(std::vector<char>(recv_bytes, static_cast<char>(0xAB)));
  Stream stream;
  DSI_EXPECT_OK(comm.all_to_all_v(
      send.get(), &count, &send_off, recv.get(), &count, &recv_off, elem_bytes, stream.get()));
  stream.sync();
  const std::vector<char> hr = recv.download();
  const size_t rb = static_cast<size_t>(recv_off) * elem_bytes;
  const size_t n = static_cast<size_t>(count) * elem_bytes;
  for (size_t i = 0; i < recv_bytes; ++i) {
    const char want = (i >= rb && i < rb + n)
                          ? hs[static_cast<size_t>(send_off) * elem_bytes + (i - rb)]
                          : static_cast<char>(0xAB);
    ASSERT_EQ(hr[i], want) << "byte " << i << " (count " << count << ", send offset " << send_off
                           << ", recv offset " << recv_off << ", elem " << elem_bytes << ")";
  }
}

TEST_F(CommGpu, LocalCommAllToAllV) {
  LocalComm comm;
  uint32_t seed = 1;
  for (const size_t eb : {size_t{2}, size_t{4}}) {
    for (int trial = 0; trial < 20; ++trial) check_single_rank_a2a(comm, eb, seed++);
  }
  check_single_rank_a2a(comm, 1, 99);
  check_single_rank_a2a(comm, 8, 100);
  Stream stream;
  DSI_EXPECT_OK(comm.barrier(stream.get()));
  DSI_EXPECT_OK(comm.health());
}

TEST_F(NcclGpu, SingleRank) {
  auto comm = make_single();
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->device(), 0);
  auto version = NcclComm::library_version();
  ASSERT_TRUE(version.ok());
  ASSERT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);
  auto path = NcclComm::library_path();
  ASSERT_TRUE(path.ok());
  std::printf("NCCL %s from %s, NCCL_NVLS_ENABLE=%s\n",
              version->c_str(),
              path->c_str(),
              std::getenv("NCCL_NVLS_ENABLE"));
  DSI_EXPECT_OK(comm->health());

  uint32_t seed = 7;
  for (const size_t eb : {size_t{2}, size_t{4}}) {
    for (int trial = 0; trial < 10; ++trial) check_single_rank_a2a(*comm, eb, seed++);
  }

  Stream stream;
  const int64_t send_count = 12345;
  int64_t recv_count = -1;
  DSI_EXPECT_OK(comm->all_to_all_counts(&send_count, &recv_count, stream.get()));
  EXPECT_EQ(recv_count, 12345);

  // All-reduce over one rank leaves the values as they are (large and odd sizes).
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{(1 << 20) + 3}}) {
    std::vector<float> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      h[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i % 997) - 3.0f;
    DevBytes buf(h.size() * sizeof(float));
    DSI_CUDA_CHECK(
        cudaMemcpy(buf.get(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    DSI_EXPECT_OK(comm->all_reduce_sum_f32(reinterpret_cast<float*>(buf.get()), n, stream.get()));
    stream.sync();
    std::vector<float> got(h.size());
    DSI_CUDA_CHECK(
        cudaMemcpy(got.data(), buf.get(), got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(got.data(), h.data(), h.size() * sizeof(float)), 0) << "n = " << n;
  }
  DSI_EXPECT_OK(comm->all_reduce_sum_f32(nullptr, 0, stream.get()));
  DSI_EXPECT_OK(comm->barrier(stream.get()));
  DSI_EXPECT_OK(comm->health());
}

TEST_F(NcclGpu, SingleRankRejectsBadArgumentsAndStaysUsable) {
  auto comm = make_single();
  ASSERT_NE(comm, nullptr);
  Stream stream;
  DevBytes buf(4096);
  const int64_t zero = 0;
  const int64_t one = 1;
  const int64_t two = 2;
  const int64_t neg = -1;
  auto expect_invalid = [](const Status& st, const char* needle) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  char* b = buf.get();
  expect_invalid(comm->all_to_all_v(b, &neg, &zero, b + 64, &neg, &zero, 4, stream.get()),
                 "send_counts[0] = -1");
  expect_invalid(comm->all_to_all_v(b, &one, &neg, b + 64, &one, &zero, 4, stream.get()),
                 "send_offsets[0] = -1");
  expect_invalid(comm->all_to_all_v(b, &two, &zero, b + 64, &one, &zero, 4, stream.get()),
                 "sends itself 2 elements but expects 1");
  expect_invalid(comm->all_to_all_v(nullptr, &one, &zero, b, &one, &zero, 4, stream.get()),
                 "null send buffer");
  expect_invalid(comm->all_to_all_v(b, &one, &zero, nullptr, &one, &zero, 4, stream.get()),
                 "null recv buffer");
  expect_invalid(comm->all_to_all_v(b, &one, &zero, b + 64, &one, &zero, 0, stream.get()),
                 "elem_bytes");
  expect_invalid(comm->all_to_all_v(b, nullptr, &zero, b + 64, &one, &zero, 4, stream.get()),
                 "null count or offset array");
  int64_t rc = 0;
  expect_invalid(comm->all_to_all_counts(&neg, &rc, stream.get()), "send_counts[0] = -1");
  expect_invalid(comm->all_to_all_counts(&one, nullptr, stream.get()), "null count array");
  expect_invalid(comm->all_reduce_sum_f32(nullptr, 4, stream.get()), "null buffer");
  expect_invalid(comm->all_reduce_sum_f32(reinterpret_cast<float*>(b), -5, stream.get()), "n = -5");
  // Nothing was enqueued; the communicator still works.
  DSI_EXPECT_OK(comm->health());
  check_single_rank_a2a(*comm, 4, 1234);
  DSI_EXPECT_OK(comm->barrier(stream.get()));
}

TEST_F(NcclGpu, CreateErrorsAndRecreate) {
  Bootstrap boot{.rank = 0, .size = 1, .id_file = id_file_, .timeout_ms = 60'000};
  auto bad = NcclComm::create(boot, 0, 2, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  bad = NcclComm::create(boot, 0, 1, device_count());  // no such device
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cudaSetDevice"), std::string::npos)
      << bad.status().message();
  DSI_CUDA_CHECK(cudaSetDevice(0));
  // Communicators are created and destroyed one after another in one process.
  for (int i = 0; i < 3; ++i) {
    auto comm = make_single();
    ASSERT_NE(comm, nullptr);
    Stream stream;
    DSI_EXPECT_OK(comm->barrier(stream.get()));
  }
}

// Started by NcclGpu.NcclSpawnedRanks through spawn_ranks: rank r of N, one GPU visible.
// Checks written for any N: counts, a variable all-to-all, an all-reduce, a barrier.
TEST(CommChild, NcclRankFromEnv) {
  if (!rank_env_present())
    GTEST_SKIP() << "runs only as a rank started by NcclGpu.NcclSpawnedRanks";
  auto boot = bootstrap_from_env();
  ASSERT_TRUE(boot.ok()) << boot.status().to_string();
  const int r = boot->rank;
  const int n = boot->size;
  ASSERT_EQ(device_count(), 1) << "each rank must see exactly one GPU";
  auto created = NcclComm::create(*boot, r, n, 0);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  NcclComm& comm = **created;
  Stream stream;

  // Rank r sends (r + 1) * 10 + p int32 values to rank p: value r * 1e6 + p * 1e3 + i.
  std::vector<int64_t> sc(n), so(n), rc(n), ro(n);
  int64_t total = 0;
  for (int p = 0; p < n; ++p) {
    sc[p] = (r + 1) * 10 + p;
    so[p] = total;
    total += sc[p] + 1;
  }
  std::vector<int32_t> hs(static_cast<size_t>(total), -7);
  for (int p = 0; p < n; ++p) {
    for (int64_t i = 0; i < sc[p]; ++i)
      hs[so[p] + i] = r * 1000000 + p * 1000 + static_cast<int32_t>(i);
  }
  DSI_EXPECT_OK(comm.all_to_all_counts(sc.data(), rc.data(), stream.get()));
  int64_t rtotal = 0;
  for (int p = 0; p < n; ++p) {
    ASSERT_EQ(rc[p], (p + 1) * 10 + r) << "count from rank " << p;
    ro[p] = rtotal + 3;
    rtotal += rc[p] + 3;
  }
  DevBytes send(hs.size() * 4);
  DevBytes recv(static_cast<size_t>(rtotal) * 4);
  DSI_CUDA_CHECK(cudaMemcpy(send.get(), hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
  DSI_CUDA_CHECK(cudaMemset(recv.get(), 0xFF, static_cast<size_t>(rtotal) * 4));
  DSI_EXPECT_OK(comm.all_to_all_v(
      send.get(), sc.data(), so.data(), recv.get(), rc.data(), ro.data(), 4, stream.get()));
  stream.sync();
  std::vector<int32_t> hr(static_cast<size_t>(rtotal));
  DSI_CUDA_CHECK(cudaMemcpy(hr.data(), recv.get(), hr.size() * 4, cudaMemcpyDeviceToHost));
  for (int p = 0; p < n; ++p) {
    EXPECT_EQ(hr[ro[p] - 1], -1) << "gap before the block of rank " << p;
    for (int64_t i = 0; i < rc[p]; ++i)
      ASSERT_EQ(hr[ro[p] + i], p * 1000000 + r * 1000 + i)
          << "from rank " << p << ", element " << i;
  }

  // All-reduce: buf[i] = r + 1 + i on every rank -> n (n + 1) / 2 + n i.
  const int64_t m = 4099;
  std::vector<float> hf(m);
  for (int64_t i = 0; i < m; ++i) hf[i] = static_cast<float>(r + 1 + i);
  DevBytes fbuf(m * sizeof(float));
  DSI_CUDA_CHECK(cudaMemcpy(fbuf.get(), hf.data(), m * sizeof(float), cudaMemcpyHostToDevice));
  DSI_EXPECT_OK(comm.all_reduce_sum_f32(reinterpret_cast<float*>(fbuf.get()), m, stream.get()));
  stream.sync();
  DSI_CUDA_CHECK(cudaMemcpy(hf.data(), fbuf.get(), m * sizeof(float), cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < m; ++i)
    ASSERT_EQ(hf[i], static_cast<float>(n * (n + 1) / 2 + n * i)) << "element " << i;
  DSI_EXPECT_OK(comm.barrier(stream.get()));
  DSI_EXPECT_OK(comm.health());
}

TEST_F(NcclGpu, NcclSpawnedRanks) {
  int ranks = 1;
  if (const char* v = std::getenv("DSINFER_COMM_TEST_RANKS"))
    ranks = std::atoi(v);
  ASSERT_GE(ranks, 1);
  if (ranks > device_count())
    GTEST_SKIP() << ranks << " ranks need " << ranks << " GPUs; " << device_count() << " present";
  auto pids =
      spawn_ranks(ranks, {"/proc/self/exe", "--gtest_filter=CommChild.NcclRankFromEnv"}, id_file_);
  ASSERT_TRUE(pids.ok()) << pids.status().to_string();
  const Status st = wait_ranks(*pids);
  EXPECT_TRUE(st.ok()) << st.to_string();
}

}  // namespace
}  // namespace dsinfer::comm
