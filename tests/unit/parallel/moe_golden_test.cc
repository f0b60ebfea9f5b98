// The expert-parallel MoE reference on the golden fixture tiny-a (4 routed experts, k = 2,
// two hash layers, three score layers and the MTP block's score layer): for N = 1..4 ranks with
// the tokens split across ranks (data-parallel attention, uneven, a rank with no tokens), each
// rank routing its own tokens, the outputs equal CpuModel::moe over all tokens bit for bit,
// in both numerics modes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "model/checkpoint.h"
#include "parallel/dispatch.h"
#include "parallel/moe_reference.h"

namespace dsinfer::parallel {
namespace {

class MoeGoldenTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto c =
        model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official");
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ckpt_ = std::move(c).value().release();
  }
  static void TearDownTestSuite() {
    delete ckpt_;
    ckpt_ = nullptr;
  }
  static model::Checkpoint* ckpt_;
};
model::Checkpoint* MoeGoldenTest::ckpt_ = nullptr;

struct MoeLayer {
  const model::MoeWeights* w;
  model::LayerPlan plan;
  std::string name;
};

// Runs the EP reference with the tokens [0, n) split into consecutive pieces of `split` sizes,
// one per rank, and compares with `want` (CpuModel::moe over all n tokens) bit for bit.
// Returns the number of routed pairs that crossed ranks (source != owner).
int64_t check_split(const cpu::CpuModel& m,
                    const MoeLayer& layer,
                    const std::vector<float>& x,
                    const std::vector<int32_t>& tokens,
                    const std::vector<float>& want,
                    const std::vector<int64_t>& split) {
  const model::ModelConfig& c = m.config();
  const int64_t hidden = c.hidden_size;
  const int64_t k = c.num_experts_per_tok;
  const int ranks = static_cast<int>(split.size());
  auto part = ExpertPartition::make(c.n_routed_experts, ranks);
  EXPECT_TRUE(part.ok()) << part.status().to_string();
  if (!part.ok())
    return 0;

  // Each rank: its own tokens, its own routing (CpuModel::moe_route) and shared expert.
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(ranks));
  std::vector<std::vector<float>> gates(static_cast<size_t>(ranks));
  std::vector<std::vector<float>> shared(static_cast<size_t>(ranks));
  std::vector<RankMoeInput> inputs(static_cast<size_t>(ranks));
  int64_t t0 = 0;
  int64_t crossed = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t n = split[r];
    const float* xr = x.data() + t0 * hidden;
    ids[r].resize(static_cast<size_t>(n * k));
    gates[r].resize(static_cast<size_t>(n * k));
    m.moe_route(*layer.w,
                layer.plan,
                xr,
                std::span<const int32_t>(tokens.data() + t0, static_cast<size_t>(n)),
                ids[r].data(),
                gates[r].data());
    shared[r].assign(static_cast<size_t>(n * hidden), 0.0f);
    const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
    m.expert(layer.w->shared, xr, n, ones.data(), shared[r].data());
    inputs[r] = {
        std::span<const float>(xr, static_cast<size_t>(n * hidden)), ids[r], gates[r], shared[r]};
    for (int32_t e : ids[r]) crossed += part->owner(e) != r ? 1 : 0;
    t0 += n;
  }
  EXPECT_EQ(t0, static_cast<int64_t>(tokens.size()));

  const auto got = moe_expert_parallel_reference(
      *part,
      inputs,
      k,
      hidden,
      [&](int64_t e, const float* xr, int64_t rows, const float* g, float* out) {
        m.expert(layer.w->experts[static_cast<size_t>(e)], xr, rows, g, out);
      });
  std::vector<float> all;
  for (const auto& o : got) all.insert(all.end(), o.begin(), o.end());
  EXPECT_EQ(all.size(), want.size());
  if (all.size() != want.size())
    return crossed;
  int64_t mismatches = 0;
  int64_t first_bad = -1;
  for (size_t i = 0; i < all.size(); ++i) {
    if (std::memcmp(&all[i], &want[i], sizeof(float)) != 0) {
      if (first_bad < 0)
        first_bad = static_cast<int64_t>(i);
      ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0) << layer.name << ", " << ranks << " ranks; first at " << first_bad
                           << ": " << (first_bad >= 0 ? all[first_bad] : 0.0f) << " vs "
                           << (first_bad >= 0 ? want[first_bad] : 0.0f);
  // And element by element as floats on the first few, for a readable failure.
  for (size_t i = 0; i < std::min<size_t>(all.size(), 64); ++i) EXPECT_EQ(all[i], want[i]);
  return crossed;
}

TEST_F(MoeGoldenTest, ExpertParallelEqualsSingleRankBitForBit) {
  const model::ModelConfig& c = ckpt_->config();
  const model::ModelWeights& w = ckpt_->weights();
  ASSERT_EQ(c.n_routed_experts, 4);
  ASSERT_EQ(c.num_experts_per_tok, 2);
  std::vector<MoeLayer> layers;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    layers.push_back({&w.layers[l].ffn, c.layers[l], "layer " + std::to_string(l)});
  }
  for (size_t l = 0; l < w.mtp.size(); ++l) {
    layers.push_back({&w.mtp[l].layer.ffn, c.mtp_layers[l], "mtp " + std::to_string(l)});
  }
  bool saw_hash = false, saw_score = false;
  for (const MoeLayer& l : layers) {
    (l.plan.moe == model::MoeType::kHash ? saw_hash : saw_score) = true;
  }
  EXPECT_TRUE(saw_hash && saw_score);

  const int64_t hidden = c.hidden_size;
  const int64_t n = 41;
  // Splits by rank count (data-parallel: consecutive tokens = whole sequences per rank),
  // uneven and with empty ranks.
  const std::vector<std::vector<int64_t>> splits = {
      {41},
      {20, 21},
      {41, 0},
      {0, 41},
      {14, 14, 13},
      {1, 0, 40},
      {10, 10, 10, 11},
      {3, 25, 0, 13},
      {0, 0, 0, 41},
  };
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  for (model::Numerics numerics : {model::Numerics::kReference, model::Numerics::kDeepSeek}) {
    cpu::CpuModel m(c, w, numerics);
    for (const MoeLayer& layer : layers) {
      SCOPED_TRACE(layer.name + ", " + model::numerics_name(numerics));
      // The MoE input rows (normalised, then the FFN norm weight: magnitudes of a few units,
      // enough for the SwiGLU clamps to engage).
      std::vector<float> x(static_cast<size_t>(n * hidden));
      for (auto& v : x) v = 2.5f * normal(rng);
      std::vector<int32_t> tokens(static_cast<size_t>(n));
      for (auto& t : tokens) t = tok(rng);
      std::vector<float> want(static_cast<size_t>(n * hidden));
      m.moe(*layer.w, layer.plan, x.data(), tokens, want.data());
      int64_t crossed = 0;
      for (const auto& split : splits) crossed += check_split(m, layer, x, tokens, want, split);
      EXPECT_GT(crossed, 0);  // the multi-rank splits do move pairs between ranks
      if (HasFailure())
        return;
    }
  }
}

}  // namespace
}  // namespace dsinfer::parallel
