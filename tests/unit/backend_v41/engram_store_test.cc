// EngramStore: the Engram tables off the weight path. Host copies and in-place mapped tables give
// bit-identical rows and logits; kAuto copies what fits in the budget; the asynchronous gather
// (started before layer 0) returns exactly the synchronous rows.
#include "backend/cpu_v41/engram_store.h"

#include <gtest/gtest.h>

#include <random>

#include "backend/cpu_v41/model.h"
#include "model_v41/checkpoint.h"
#include "model_v41/engram.h"

namespace dsinfer::cpu_v41 {
namespace {

const std::string kTiny = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/v41-tiny/official";

std::unique_ptr<model_v41::V41Checkpoint> open_tiny() {
  auto ck = model_v41::V41Checkpoint::open(kTiny);
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
  return std::move(ck).value();
}

EngramHashParams hash(const model_v41::V41Config& c) {
  auto phi = model_v41::load_engram_token_map(kTiny + "/engram_token_map.json", c);
  EXPECT_TRUE(phi.ok()) << phi.status().to_string();
  auto h = EngramHashParams::from_config(c, std::move(phi).value());
  EXPECT_TRUE(h.ok());
  return std::move(h).value();
}

TEST(V41EngramStore, PlacementsAndBudget) {
  auto ck = open_tiny();
  const auto& c = ck->config();
  auto host = EngramStore::create(c, ck->weights(), {EngramPlacement::kHost, 0});
  auto mapped = EngramStore::create(c, ck->weights(), {EngramPlacement::kMapped, 0});
  ASSERT_TRUE(host.ok() && mapped.ok());
  ASSERT_EQ((*host)->num_tables(), 2);
  int64_t total = 0;
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ((*host)->placement(t), EngramPlacement::kHost);
    EXPECT_EQ((*mapped)->placement(t), EngramPlacement::kMapped);
    // e4m3 values + one E8M0 scale per 32.
    const int64_t rows = c.engram_rows[static_cast<size_t>(t)];
    EXPECT_EQ((*host)->table_bytes(t), rows * c.engram_head_dim + rows * c.engram_head_dim / 32);
    total += (*host)->table_bytes(t);
  }
  EXPECT_EQ((*host)->host_bytes(), total);
  EXPECT_EQ((*mapped)->host_bytes(), 0);
  // kAuto copies tables in layer order while they fit.
  auto first_only =
      EngramStore::create(c, ck->weights(), {EngramPlacement::kAuto, (*host)->table_bytes(0)});
  ASSERT_TRUE(first_only.ok());
  EXPECT_EQ((*first_only)->placement(0), EngramPlacement::kHost);
  EXPECT_EQ((*first_only)->placement(1), EngramPlacement::kMapped);
  auto none = EngramStore::create(c, ck->weights(), {EngramPlacement::kAuto, 1});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)->host_bytes(), 0);
  EXPECT_FALSE(EngramStore::create(c, ck->weights(), {EngramPlacement::kAuto, -1}).ok());
  EXPECT_FALSE(parse_engram_placement("gpu").ok());
  EXPECT_EQ(*parse_engram_placement("mapped"), EngramPlacement::kMapped);
  // `device` is the CUDA backend's placement: the store refuses it with a named error.
  auto device = EngramStore::create(c, ck->weights(), {EngramPlacement::kDevice, 0});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kFailedPrecondition);
  // A config that lists an Engram layer the weights do not have: a named error.
  model_v41::V41Config bad = c;
  bad.engram_layer_ids.push_back(0);
  auto missing = EngramStore::create(bad, ck->weights(), {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing Engram table"), std::string::npos);
}

TEST(V41EngramStore, GatherAndAsyncGatherEqualTheTableRows) {
  auto ck = open_tiny();
  const auto& c = ck->config();
  auto host = EngramStore::create(c, ck->weights(), {EngramPlacement::kHost, 0});
  ASSERT_TRUE(host.ok());
  std::mt19937 g(3);
  std::vector<std::vector<int64_t>> rows(2);
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < 50; ++i)
      rows[t].push_back(static_cast<int64_t>(g() % c.engram_rows[static_cast<size_t>(t)]));
  }
  const int64_t dim = c.engram_head_dim;
  EngramStore::Pending p = (*host)->gather_async(rows);
  for (int t = 1; t >= 0; --t) {  // any order
    const std::vector<float>& got = p.wait(t);
    ASSERT_EQ(got.size(), rows[t].size() * static_cast<size_t>(dim));
    const model_v41::EngramTable& tab =
        ck->weights().layers[static_cast<size_t>(c.engram_layer_ids[t])].engram.table;
    std::vector<float> want(static_cast<size_t>(dim));
    for (size_t i = 0; i < rows[t].size(); ++i) {
      tab.row(rows[t][i], want.data());
      for (int64_t k = 0; k < dim; ++k) {
        ASSERT_EQ(got[i * dim + k], want[static_cast<size_t>(k)]) << t << " " << i << " " << k;
      }
    }
  }
}

TEST(V41EngramStore, HostAndMappedTablesGiveIdenticalLogits) {
  auto ck = open_tiny();
  const auto& c = ck->config();
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<int32_t>(3 + (i * 37) % 90));
  std::vector<float> logits[2];
  int k = 0;
  for (EngramPlacement p : {EngramPlacement::kHost, EngramPlacement::kMapped}) {
    V41CpuModel m(c, ck->weights(), hash(c), model::Numerics::kDeepSeek, {p, 0});
    EXPECT_EQ(m.engram_store().placement(0), p);
    V41SequenceState st = make_v41_state(c);
    // Two chunks: the second one's n-grams read the first one's tokens from the state.
    std::vector<float> a, b;
    ASSERT_TRUE(m.forward(st, std::span(ids).first(13), &a).ok());
    ASSERT_TRUE(m.forward(st, std::span(ids).subspan(13), &b).ok());
    a.insert(a.end(), b.begin(), b.end());
    logits[k++] = a;
  }
  EXPECT_EQ(logits[0], logits[1]);
}

}  // namespace
}  // namespace dsinfer::cpu_v41
