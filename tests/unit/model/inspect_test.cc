// print_inspect: text and JSON output of a synthetic checkpoint.
#include "model/inspect.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "model/synthetic.h"
#include "test_support.h"

namespace dsinfer::model {
namespace {

std::string capture(const Checkpoint& ck, bool json) {
  std::FILE* f = std::tmpfile();
  EXPECT_NE(f, nullptr);
  const Status s = print_inspect(ck, f, json);
  EXPECT_TRUE(s.ok()) << s.to_string();
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

std::unique_ptr<Checkpoint> open_tiny() {
  const std::string dir = testing::test_dir();
  SyntheticSpec spec;
  spec.config = tiny_preset_config();
  spec.quantized = true;
  spec.with_mtp = true;
  EXPECT_TRUE(write_synthetic_checkpoint(spec, dir).ok());
  auto ck = Checkpoint::open(dir);
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
  return std::move(ck).value();
}

TEST(Inspect, Text) {
  auto ck = open_tiny();
  const std::string out = capture(*ck, false);
  for (const char* needle : {"layout: deepseek",
                             "config dialect: deepseek",
                             "fp8 quantized: yes",
                             "MTP weights: yes",
                             "hidden_size",
                             "sliding",
                             "csa",
                             "hca",
                             "mtp.0",
                             "hash",
                             "score",
                             "theta=160000",
                             "yarn(factor=16, original=64, beta_fast=32, beta_slow=1)",
                             "layers.1.attn.wq_a.weight",
                             "F8_E4M3",
                             "F8_E8M0",
                             "I8",
                             "BF16",
                             "I32",
                             "totals by dtype",
                             "model.safetensors"}) {
    EXPECT_NE(out.find(needle), std::string::npos) << needle << "\n" << out.substr(0, 3000);
  }
}

TEST(Inspect, Json) {
  auto ck = open_tiny();
  const std::string out = capture(*ck, true);
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out.substr(0, 2000);
  EXPECT_EQ(j["layout"], "deepseek");
  EXPECT_EQ(j["config"]["hidden_size"], 64);
  ASSERT_EQ(j["layers"].size(), 5u);
  EXPECT_EQ(j["layers"][1]["attention"], "csa");
  EXPECT_EQ(j["layers"][1]["compress_ratio"], 4);
  EXPECT_EQ(j["layers"][1]["rope"], "compress");
  EXPECT_EQ(j["layers"][1]["rope_params"]["yarn"], true);
  EXPECT_EQ(j["layers"][2]["attention"], "hca");
  EXPECT_EQ(j["layers"][0]["moe"], "hash");
  ASSERT_EQ(j["mtp_layers"].size(), 1u);
  EXPECT_EQ(j["mtp_layers"][0]["index"], 5);
  EXPECT_EQ(j["tensors"].size(), ck->inventory().size());
  int64_t total = 0;
  for (const auto& [k, v] : j["totals"].items()) total += v["bytes"].get<int64_t>();
  EXPECT_EQ(total, j["total_bytes"].get<int64_t>());
  EXPECT_TRUE(j["totals"].contains("F8_E4M3"));
}

}  // namespace
}  // namespace dsinfer::model
