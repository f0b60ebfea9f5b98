// `dsinfer inspect` for V4.1: the producer/consumer split, the owners, Engram and the state
// figures.
#include "model_v41/inspect.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "model_v41/synthetic.h"

namespace dsinfer::model_v41 {
namespace {

std::string capture(const V41Config& c, bool json) {
  std::FILE* f = std::tmpfile();
  EXPECT_NE(f, nullptr);
  EXPECT_TRUE(print_v41_inspect(c, nullptr, f, json).ok());
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

TEST(V41Inspect, FlashText) {
  auto c = parse_v41_config(v41_flash_config_json().dump(), "config.json");
  ASSERT_TRUE(c.ok());
  const std::string t = capture(*c, false);
  EXPECT_NE(t.find("YOCO: producers 0-19 (20 layers), consumers 20-39 (20 layers)"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("KV owners [2, 8, 14, 20], index sources [2, 8, 14, 20, 24, 28, 32, 36]"),
            std::string::npos);
  EXPECT_NE(t.find("Engram layer 1: 384006168 rows"), std::string::npos);
  EXPECT_NE(t.find("Engram layer 14: 384016682 rows"), std::string::npos);
  EXPECT_NE(t.find("890 B/token raw, 891 B/token paged"), std::string::npos);
  EXPECT_NE(t.find("state per sequence: 3128928 B"), std::string::npos);
  EXPECT_NE(t.find("   24      1  consumer  reindex   20    24    20  candidate-pool"),
            std::string::npos)
      << t;
}

TEST(V41Inspect, FlashJson) {
  auto c = parse_v41_config(v41_flash_config_json().dump(), "config.json");
  ASSERT_TRUE(c.ok());
  const auto j = nlohmann::json::parse(capture(*c, true));
  EXPECT_EQ(j["config"]["yoco"]["boundary"], 20);
  EXPECT_EQ(j["config"]["state"]["kv_bytes_per_token"], 891.0);
  EXPECT_EQ(j["config"]["state"]["state_bytes_per_sequence"], 3128928);
  EXPECT_EQ(j["config"]["layers"][33]["topk_source"], 32);
  EXPECT_EQ(j["config"]["layers"][33]["kv_owner"], 20);
  EXPECT_EQ(j["config"]["engram"][1]["layer"], 14);
}

}  // namespace
}  // namespace dsinfer::model_v41
