// Rank environment parsing and the id file (host only).
#include "comm/bootstrap.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "comm_test_util.h"

namespace dsinfer::comm {
namespace {

using test::file_exists;
using test::ScopedEnv;
using test::TempDir;

// The three variables of a rank, plus an unset timeout.
struct RankEnv {
  RankEnv(std::optional<std::string> rank,
          std::optional<std::string> size,
          std::optional<std::string> file,
          std::optional<std::string> timeout = std::nullopt)
      : r(kEnvRank, std::move(rank)),
        s(kEnvSize, std::move(size)),
        f(kEnvIdFile, std::move(file)),
        t(kEnvTimeout, std::move(timeout)) {}
  ScopedEnv r, s, f, t;
};

void expect_error(const Result<Bootstrap>& b, const std::string& needle) {
  ASSERT_FALSE(b.ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find(needle), std::string::npos) << b.status().message();
}

TEST(Bootstrap, FromEnv) {
  {
    RankEnv env("1", "4", "/tmp/some/nccl_id");
    EXPECT_TRUE(rank_env_present());
    auto b = bootstrap_from_env();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->rank, 1);
    EXPECT_EQ(b->size, 4);
    EXPECT_EQ(b->id_file, "/tmp/some/nccl_id");
    EXPECT_EQ(b->timeout_ms, kDefaultTimeoutMs);
  }
  {
    RankEnv env("0", "1", "id", "2.5");
    auto b = bootstrap_from_env();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->rank, 0);
    EXPECT_EQ(b->size, 1);
    EXPECT_EQ(b->timeout_ms, 2500);
  }
  {
    RankEnv env("1023", "1024", "id");
    ASSERT_TRUE(bootstrap_from_env().ok());
  }
  RankEnv none(std::nullopt, std::nullopt, std::nullopt);
  EXPECT_FALSE(rank_env_present());
}

TEST(Bootstrap, FromEnvErrorsNameTheVariable) {
  {
    RankEnv env(std::nullopt, "2", "id");
    expect_error(bootstrap_from_env(), "DSINFER_EP_RANK is not set");
  }
  {
    RankEnv env("0", std::nullopt, "id");
    expect_error(bootstrap_from_env(), "DSINFER_EP_SIZE is not set");
  }
  {
    RankEnv env("0", "2", std::nullopt);
    expect_error(bootstrap_from_env(), "DSINFER_EP_ID_FILE is not set");
  }
  {
    RankEnv env("0", "2", "");
    expect_error(bootstrap_from_env(), "DSINFER_EP_ID_FILE is empty");
  }
  for (const char* bad : {"", "abc", "1x", " 1", "0x1", "99999999999999999999"}) {
    RankEnv env(bad, "2", "id");
    expect_error(bootstrap_from_env(), "DSINFER_EP_RANK='");
  }
  for (const char* bad : {"", "two", "2.0"}) {
    RankEnv env("0", bad, "id");
    expect_error(bootstrap_from_env(), "DSINFER_EP_SIZE='");
  }
  {
    RankEnv env("0", "0", "id");
    expect_error(bootstrap_from_env(), "DSINFER_EP_SIZE=0 is out of range [1, 1024]");
  }
  {
    RankEnv env("0", "1025", "id");
    expect_error(bootstrap_from_env(), "DSINFER_EP_SIZE=1025 is out of range");
  }
  {
    RankEnv env("4", "4", "id");
    expect_error(bootstrap_from_env(), "DSINFER_EP_RANK=4 is out of range [0, 3]");
  }
  {
    RankEnv env("-1", "4", "id");
    expect_error(bootstrap_from_env(), "DSINFER_EP_RANK=-1 is out of range");
  }
  for (const char* bad : {"0", "-1", "abc", "inf", "nan", "1e9", ""}) {
    RankEnv env("0", "2", "id", bad);
    expect_error(bootstrap_from_env(), "DSINFER_EP_TIMEOUT_S='");
  }
}

UniqueId sample_id(char seed) {
  UniqueId id{};
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(seed + 7 * i);
  return id;
}

TEST(Bootstrap, IdFileRoundTrip) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.path() + "/nccl_id";
  const UniqueId id = sample_id(3);
  ASSERT_TRUE(publish_unique_id(path, id).ok());
  EXPECT_EQ(test::read_file(path).size(), kUniqueIdBytes);
  auto got = await_unique_id(path, 1000);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, id);
  // Publishing again replaces the id (rename over the old file); no temporary file is left.
  const UniqueId id2 = sample_id(11);
  ASSERT_TRUE(publish_unique_id(path, id2).ok());
  EXPECT_EQ(*await_unique_id(path, 1000), id2);
  EXPECT_FALSE(file_exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST(Bootstrap, AwaitTimesOutWithAClearError) {
  TempDir dir;
  const std::string path = dir.path() + "/never";
  const auto t0 = std::chrono::steady_clock::now();
  auto got = await_unique_id(path, 60);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find(path), std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find("rank 0"), std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find("DSINFER_EP_ID_FILE"), std::string::npos);
  EXPECT_GE(ms, 60.0);
  EXPECT_LT(ms, 5000.0);
}

TEST(Bootstrap, AwaitSeesALatePublisher) {
  TempDir dir;
  const std::string path = dir.path() + "/nccl_id";
  const UniqueId id = sample_id(42);
  std::thread publisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(publish_unique_id(path, id).ok());
  });
  auto got = await_unique_id(path, 10000);
  publisher.join();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, id);
}

TEST(Bootstrap, AwaitRejectsAWrongSizedFile) {
  TempDir dir;
  const std::string path = dir.path() + "/nccl_id";
  test::write_file(path, std::string(17, 'x'));
  auto got = await_unique_id(path, 1000);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("17 bytes, expected 128"), std::string::npos)
      << got.status().message();
  test::write_file(path, std::string(129, 'x'));
  got = await_unique_id(path, 1000);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
}

TEST(Bootstrap, PublishErrors) {
  TempDir dir;
  EXPECT_EQ(publish_unique_id("", sample_id(1)).code(), StatusCode::kInvalidArgument);
  const Status st = publish_unique_id(dir.path() + "/no/such/dir/nccl_id", sample_id(1));
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("cannot create"), std::string::npos) << st.message();
  EXPECT_EQ(await_unique_id("", 10).status().code(), StatusCode::kInvalidArgument);
}

TEST(Bootstrap, IdFilePathLifecycle) {
  TempDir tmp;
  ScopedEnv env("TMPDIR", tmp.path());
  auto path = make_id_file_path();
  ASSERT_TRUE(path.ok()) << path.status().to_string();
  EXPECT_EQ(path->rfind(tmp.path() + "/dsinfer-ep-", 0), 0u) << *path;
  EXPECT_FALSE(file_exists(*path));
  const std::string dir = path->substr(0, path->rfind('/'));
  EXPECT_TRUE(file_exists(dir));
  ASSERT_TRUE(publish_unique_id(*path, sample_id(5)).ok());
  test::write_file(*path + ".tmp.12345", "partial");  // a publisher that died mid-way
  ASSERT_TRUE(remove_id_file(*path).ok());
  EXPECT_FALSE(file_exists(*path));
  EXPECT_FALSE(file_exists(dir));
  EXPECT_TRUE(remove_id_file(*path).ok());  // already gone
  EXPECT_TRUE(remove_id_file("").ok());
  // A directory the launcher did not make is kept.
  const std::string own = tmp.path() + "/nccl_id";
  ASSERT_TRUE(publish_unique_id(own, sample_id(6)).ok());
  ASSERT_TRUE(remove_id_file(own).ok());
  EXPECT_FALSE(file_exists(own));
  EXPECT_TRUE(file_exists(tmp.path()));
}

}  // namespace
}  // namespace dsinfer::comm
