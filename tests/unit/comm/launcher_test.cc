// spawn_ranks / wait_ranks with trivial children (/bin/true, sh -c ...): host only.
#include "comm/launcher.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm_test_util.h"

namespace dsinfer::comm {
namespace {

using test::file_exists;
using test::ScopedEnv;
using test::TempDir;

std::vector<std::string> sh(const std::string& script) {
  return {"/bin/sh", "-c", script};
}

// True when `pid` no longer exists (reaped).
bool gone(pid_t pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Launcher, AllRanksSucceed) {
  TempDir dir;
  auto pids = spawn_ranks(3, {"/bin/true"}, dir.path() + "/nccl_id");
  ASSERT_TRUE(pids.ok()) << pids.status().to_string();
  ASSERT_EQ(pids->size(), 3u);
  EXPECT_TRUE(wait_ranks(*pids).ok());
  for (const pid_t p : *pids) EXPECT_TRUE(gone(p));
  // A name without a slash is looked up in PATH.
  pids = spawn_ranks(2, {"true"}, dir.path() + "/nccl_id");
  ASSERT_TRUE(pids.ok()) << pids.status().to_string();
  EXPECT_TRUE(wait_ranks(*pids).ok());
}

TEST(Launcher, ExitCodeIsReportedWithTheRank) {
  TempDir dir;
  auto pids = spawn_ranks(1, sh("exit 3"), dir.path() + "/nccl_id");
  ASSERT_TRUE(pids.ok()) << pids.status().to_string();
  const Status st = wait_ranks(*pids);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(st.message(), "rank 0 (pid " + std::to_string((*pids)[0]) + ") exited with status 3");
}

TEST(Launcher, SignalIsReported) {
  TempDir dir;
  auto pids = spawn_ranks(
      2, sh("[ \"$DSINFER_EP_RANK\" = 1 ] && kill -9 $$; exit 0"), dir.path() + "/nccl_id");
  ASSERT_TRUE(pids.ok()) << pids.status().to_string();
  const Status st = wait_ranks(*pids);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(
      st.message().find("rank 1 (pid " + std::to_string((*pids)[1]) + ") was killed by signal 9"),
      std::string::npos)
      << st.message();
}

TEST(Launcher, OneFailureStopsTheOtherRanks) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 1 fails after a moment; the others would sleep for a minute (exec: the sleep is the
  // rank's process, so SIGTERM reaches it).
  auto pids =
      spawn_ranks(3,
                  sh("if [ \"$DSINFER_EP_RANK\" = 1 ]; then sleep 0.2; exit 5; fi; exec sleep 60"),
                  dir.path() + "/nccl_id");
  ASSERT_TRUE(pids.ok()) << pids.status().to_string();
  const Status st = wait_ranks(*pids, 5000);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "rank 1 (pid " + std::to_string((*pids)[1]) +
                ") exited with status 5; stopped the 2 other running ranks");
  EXPECT_LT(seconds_since(t0), 20.0);
  for (const pid_t p : *pids) EXPECT_TRUE(gone(p)) << p;
}

TEST(Launcher, RanksThatIgnoreSigtermAreKilled) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  auto pids = spawn_ranks(
      2,
      sh("if [ \"$DSINFER_EP_RANK\" = 0 ]; then exit 1; fi; trap '' TERM; exec sleep 60"),
      dir.path() + "/nccl_id");
  ASSERT_TRUE(pids.ok()) << pids.status().to_string();
  const Status st = wait_ranks(*pids, 300);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("stopped the 1 other running rank"), std::string::npos)
      << st.message();
  EXPECT_LT(seconds_since(t0), 20.0);
  for (const pid_t p : *pids) EXPECT_TRUE(gone(p)) << p;
}

// Each child writes what it was given to out/rank.<r>.
std::vector<std::string> env_of_ranks(const std::string& out, int n, const std::string& id_file) {
  auto pids = spawn_ranks(n,
                          sh("printf '%s %s %s %s' \"$DSINFER_EP_RANK\" \"$DSINFER_EP_SIZE\" "
                             "\"$DSINFER_EP_ID_FILE\" \"$CUDA_VISIBLE_DEVICES\" > '" +
                             out + "'/rank.$DSINFER_EP_RANK"),
                          id_file);
  EXPECT_TRUE(pids.ok()) << pids.status().to_string();
  if (!pids.ok())
    return {};
  EXPECT_TRUE(wait_ranks(*pids).ok());
  std::vector<std::string> got;
  for (int r = 0; r < n; ++r) got.push_back(test::read_file(out + "/rank." + std::to_string(r)));
  return got;
}

TEST(Launcher, RankEnvironment) {
  TempDir dir;
  const std::string id = dir.path() + "/nccl_id";
  {
    ScopedEnv vis("CUDA_VISIBLE_DEVICES", std::nullopt);
    ScopedEnv rank(kEnvRank, "7");  // the parent's own rank variables are replaced
    ScopedEnv size(kEnvSize, "9");
    const auto got = env_of_ranks(dir.path(), 3, id);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0], "0 3 " + id + " 0");
    EXPECT_EQ(got[1], "1 3 " + id + " 1");
    EXPECT_EQ(got[2], "2 3 " + id + " 2");
  }
  {
    // Rank r gets the r-th device the parent may use.
    ScopedEnv vis("CUDA_VISIBLE_DEVICES", "4, 6,7");
    const auto got = env_of_ranks(dir.path(), 2, id);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0], "0 2 " + id + " 4");
    EXPECT_EQ(got[1], "1 2 " + id + " 6");
  }
  {
    ScopedEnv vis("CUDA_VISIBLE_DEVICES", "GPU-1234abcd,GPU-5678");
    const auto got = env_of_ranks(dir.path(), 2, id);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[1], "1 2 " + id + " GPU-5678");
  }
  {
    ScopedEnv vis("CUDA_VISIBLE_DEVICES", "3");
    auto pids = spawn_ranks(2, {"/bin/true"}, id);
    ASSERT_FALSE(pids.ok());
    EXPECT_EQ(pids.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(pids.status().message().find("2 ranks need 2 GPUs but CUDA_VISIBLE_DEVICES='3'"),
              std::string::npos)
        << pids.status().message();
  }
}

TEST(Launcher, StaleIdFileIsRemoved) {
  TempDir dir;
  const std::string id = dir.path() + "/nccl_id";
  test::write_file(id, std::string(kUniqueIdBytes, 'x'));
  auto pids = spawn_ranks(1, {"/bin/true"}, id);
  ASSERT_TRUE(pids.ok());
  EXPECT_FALSE(file_exists(id));
  EXPECT_TRUE(wait_ranks(*pids).ok());
}

TEST(Launcher, Errors) {
  TempDir dir;
  const std::string id = dir.path() + "/nccl_id";
  auto pids = spawn_ranks(2, {dir.path() + "/no-such-binary"}, id);
  ASSERT_FALSE(pids.ok());
  EXPECT_NE(
      pids.status().message().find("cannot start rank 0 of 2: " + dir.path() + "/no-such-binary"),
      std::string::npos)
      << pids.status().message();
  pids = spawn_ranks(1, {"dsinfer-no-such-binary-in-path"}, id);
  ASSERT_FALSE(pids.ok());
  EXPECT_NE(pids.status().message().find("cannot start rank 0 of 1"), std::string::npos);
  EXPECT_EQ(spawn_ranks(0, {"/bin/true"}, id).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(spawn_ranks(kMaxRanks + 1, {"/bin/true"}, id).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(spawn_ranks(1, {}, id).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(spawn_ranks(1, {"/bin/true"}, "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(wait_ranks({0}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(wait_ranks({}).ok());
}

}  // namespace
}  // namespace dsinfer::comm
