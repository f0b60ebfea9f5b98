// Argument checks of the communicators and LocalComm's host paths: no GPU, no CUDA call (every
// case here fails validation or moves nothing). NcclComm::create's checks that run before any
// CUDA call, and the build-without-NCCL and NCCL-does-not-load errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "comm/nccl_comm.h"
#include "comm_test_util.h"

namespace dsinfer::comm {
namespace {

void expect_invalid(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(CommArgs, LocalCommBasics) {
  LocalComm c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  int64_t send = 17;
  int64_t recv = -1;
  ASSERT_TRUE(c.all_to_all_counts(&send, &recv, nullptr).ok());
  EXPECT_EQ(recv, 17);
  send = -2;
  expect_invalid(c.all_to_all_counts(&send, &recv, nullptr), "send_counts[0] = -2");
  expect_invalid(c.all_to_all_counts(nullptr, &recv, nullptr), "null count array");
  // Nothing to move: OK without buffers and without touching the device.
  const int64_t zero = 0;
  EXPECT_TRUE(c.all_to_all_v(nullptr, &zero, &zero, nullptr, &zero, &zero, 4, nullptr).ok());
  EXPECT_TRUE(c.all_reduce_sum_f32(nullptr, 0, nullptr).ok());
  float x = 1.0f;
  EXPECT_TRUE(c.all_reduce_sum_f32(&x, 1, nullptr).ok());  // the sum over one rank
  EXPECT_EQ(x, 1.0f);
  expect_invalid(c.all_reduce_sum_f32(nullptr, 3, nullptr), "null buffer");
  expect_invalid(c.all_reduce_sum_f32(&x, -1, nullptr), "n = -1 is negative");
}

TEST(CommArgs, AllToAllV) {
  char buf[64];
  const int64_t one = 1;
  const int64_t zero = 0;
  LocalComm c;
  auto a2a =
      [&](const void* s, int64_t sc, int64_t so, void* r, int64_t rc, int64_t ro, size_t eb) {
        return c.all_to_all_v(s, &sc, &so, r, &rc, &ro, eb, nullptr);
      };
  expect_invalid(c.all_to_all_v(buf, nullptr, &zero, buf, &one, &zero, 4, nullptr),
                 "null count or offset array");
  expect_invalid(c.all_to_all_v(buf, &one, &zero, buf, &one, nullptr, 4, nullptr),
                 "null count or offset array");
  expect_invalid(a2a(buf, 1, 0, buf + 8, 1, 0, 0), "elem_bytes must be positive");
  expect_invalid(a2a(buf, -1, 0, buf + 8, -1, 0, 4), "send_counts[0] = -1 is negative");
  expect_invalid(a2a(buf, 1, -3, buf + 8, 1, 0, 4), "send_offsets[0] = -3 is negative");
  expect_invalid(a2a(buf, 1, 0, buf + 8, 1, -3, 4), "recv_offsets[0] = -3 is negative");
  expect_invalid(a2a(nullptr, 1, 0, buf + 8, 1, 0, 4), "null send buffer");
  expect_invalid(a2a(buf, 1, 0, nullptr, 1, 0, 4), "null recv buffer");
  expect_invalid(a2a(buf, 2, 0, buf + 8, 1, 0, 4), "rank 0 sends itself 2 elements but expects 1");
  expect_invalid(a2a(buf, int64_t{1} << 62, 0, buf, int64_t{1} << 62, 0, 4), "overflows int64");
  expect_invalid(a2a(buf, 1, int64_t{1} << 61, buf, 1, 0, 8), "overflows int64");
}

TEST(CommArgs, AllToAllVShared) {
  // Three ranks, as rank 1 sees them.
  char send[64];
  char recv[64];
  const std::vector<int64_t> sc = {2, 3, 0};
  const std::vector<int64_t> so = {0, 2, 5};
  std::vector<int64_t> rc = {4, 3, 1};
  std::vector<int64_t> ro = {0, 4, 7};
  EXPECT_TRUE(
      check_all_to_all_v_args(1, 3, send, sc.data(), so.data(), recv, rc.data(), ro.data(), 2)
          .ok());
  ro = {0, 3, 7};  // block 1 [3, 6) overlaps block 0 [0, 4)
  expect_invalid(
      check_all_to_all_v_args(1, 3, send, sc.data(), so.data(), recv, rc.data(), ro.data(), 2),
      "receive blocks overlap (bytes [0, 8) and [6, 12))");
  ro = {0, 4, 0};
  rc = {4, 3, 0};  // an empty block may sit anywhere
  EXPECT_TRUE(
      check_all_to_all_v_args(1, 3, send, sc.data(), so.data(), recv, rc.data(), ro.data(), 2)
          .ok());
  rc = {4, 2, 0};
  expect_invalid(
      check_all_to_all_v_args(1, 3, send, sc.data(), so.data(), recv, rc.data(), ro.data(), 2),
      "rank 1 sends itself 3 elements but expects 2");
  expect_invalid(check_all_to_all_counts_args(3, sc.data(), nullptr), "null count array");
}

TEST(CommArgs, NcclCommCreate) {
  if (!NcclComm::built_with_nccl()) {
    auto c = NcclComm::create(Bootstrap{}, 0, 1, 0);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
    EXPECT_EQ(c.status().message(),
              "built without NCCL: pip install nvidia-nccl-cu13 and reconfigure");
    EXPECT_FALSE(NcclComm::library_version().ok());
    GTEST_SKIP() << "built without NCCL: only the kUnimplemented path was checked";
  }
  // The argument checks come before NCCL is loaded: the same whether or not it loads.
  test::TempDir dir;
  Bootstrap boot{.rank = 1, .size = 2, .id_file = dir.path() + "/nccl_id", .timeout_ms = 80};
  expect_invalid(NcclComm::create(boot, 2, 2, 0).status(), "rank 2 out of range for size 2");
  expect_invalid(NcclComm::create(boot, 0, 2, 0).status(), "does not match the bootstrap");
  expect_invalid(NcclComm::create(boot, 1, 0, 0).status(), "size 0");
  expect_invalid(NcclComm::create(boot, 1, 2, -1).status(), "device -1");
  Bootstrap no_file = boot;
  no_file.id_file.clear();
  expect_invalid(NcclComm::create(no_file, 1, 2, 0).status(), "no id file");

  auto v = NcclComm::library_version();
  if (!NcclComm::nccl_loadable()) {
    // Built with NCCL, but libnccl.so.2 does not load here (nccl_loader_test.cc covers this).
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(v.status().message().rfind("NCCL is not available: ", 0), 0u) << v.status().message();
    auto c = NcclComm::create(boot, 1, 2, 0);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().message(), v.status().message());
    GTEST_SKIP() << "NCCL does not load: " << v.status().message();
  }
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->rfind("2.", 0), 0u) << *v;
  // Rank 1 waits for rank 0's id (before any CUDA call) and gives up with a clear error.
  auto c = NcclComm::create(boot, 1, 2, 0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("waiting for the NCCL id file"), std::string::npos)
      << c.status().message();
}

}  // namespace
}  // namespace dsinfer::comm
