// Reference fixtures written by tools/reference (tests/fixtures/tiny-{a,b}/{hf,official}): the
// transformers layout and the official layout of the same model bind to identical dequantised
// weights. Skipped when the fixtures are absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "model/checkpoint.h"
#include "test_support.h"

namespace dsinfer::model {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) {
  return std::string(DSI_SOURCE_DIR) + "/tests/fixtures/" + name;
}

class Fixtures : public ::testing::TestWithParam<const char*> {};

TEST_P(Fixtures, HfAndOfficialBindIdentically) {
  const std::string hf = fixture(std::string(GetParam()) + "/hf");
  const std::string off = fixture(std::string(GetParam()) + "/official");
  if (!fs::exists(hf + "/config.json") || !fs::exists(off + "/config.json")) {
    GTEST_SKIP() << "fixtures not present: " << hf << ", " << off;
  }
  auto a = Checkpoint::open(hf);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = Checkpoint::open(off);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ((*a)->layout(), CheckpointLayout::kTransformers);
  EXPECT_EQ((*b)->layout(), CheckpointLayout::kDeepSeek);
  EXPECT_FALSE((*a)->has_mtp());  // transformers has no MTP
  EXPECT_EQ((*b)->has_mtp(), (*b)->config().num_nextn_predict_layers > 0);
  const ModelConfig& ca = (*a)->config();
  const ModelConfig& cb = (*b)->config();
  ASSERT_EQ(ca.layers.size(), cb.layers.size());
  for (size_t i = 0; i < ca.layers.size(); ++i) {
    EXPECT_EQ(ca.layers[i].attention, cb.layers[i].attention) << i;
    EXPECT_EQ(ca.layers[i].compress_ratio, cb.layers[i].compress_ratio) << i;
    EXPECT_EQ(ca.layers[i].moe, cb.layers[i].moe) << i;
  }
  EXPECT_EQ(ca.hidden_size, cb.hidden_size);
  EXPECT_EQ(ca.qk_rope_head_dim, cb.qk_rope_head_dim);
  EXPECT_EQ(rope_inv_freq(ca.rope_compress, ca.qk_rope_head_dim),
            rope_inv_freq(cb.rope_compress, cb.qk_rope_head_dim));
  EXPECT_EQ(rope_inv_freq(ca.rope_main, ca.qk_rope_head_dim),
            rope_inv_freq(cb.rope_main, cb.qk_rope_head_dim));

  // Collect the official weights by canonical name, then compare the HF ones against them.
  std::map<std::string, MatrixRef> mats;
  std::map<std::string, std::vector<float>> vecs;
  testing::walk_weights(
      cb,
      (*b)->weights(),
      [&](const std::string& n, const MatrixRef& m) { mats[n] = m; },
      [&](const std::string& n, const std::vector<float>& v) { vecs[n] = v; });
  int compared = 0;
  testing::walk_weights(
      ca,
      (*a)->weights(),
      [&](const std::string& n, const MatrixRef& m) {
        auto it = mats.find(n);
        ASSERT_NE(it, mats.end()) << n;
        const MatrixRef& o = it->second;
        ASSERT_EQ(m.rows, o.rows) << n;
        ASSERT_EQ(m.cols, o.cols) << n;
        for (int64_t r = 0; r < m.rows; ++r) {
          for (int64_t c = 0; c < m.cols; ++c) {
            ASSERT_EQ(m.at(r, c), o.at(r, c)) << n << " [" << r << ", " << c << "]";
          }
        }
        ++compared;
      },
      [&](const std::string& n, const std::vector<float>& v) {
        auto it = vecs.find(n);
        ASSERT_NE(it, vecs.end()) << n;
        ASSERT_EQ(v, it->second) << n;
        ++compared;
      });
  EXPECT_GT(compared, 0);
  for (size_t l = 0; l < ca.layers.size(); ++l) {
    EXPECT_EQ((*a)->weights().layers[l].ffn.tid2eid, (*b)->weights().layers[l].ffn.tid2eid) << l;
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, Fixtures, ::testing::Values("tiny-a", "tiny-b"));

}  // namespace
}  // namespace dsinfer::model
