// V4.1 checkpoints: both layouts load tensor by tensor; vision tensors are skipped; every broken
// checkpoint gets a named error (missing Engram table, wrong scale tile, schedule mismatch, ...).
#include "model_v41/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/strings.h"
#include "model_v41/engram.h"
#include "model_v41/synthetic.h"
#include "tensor/safetensors.h"

namespace dsinfer::model_v41 {
namespace {

using json = nlohmann::json;

std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path p = std::filesystem::path(DSI_BINARY_DIR) / "test-tmp" /
                            (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

std::string write(V41SyntheticSpec spec) {
  const std::string dir = test_dir();
  const Status s = write_v41_synthetic(spec, dir);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return dir;
}

std::string open_err(const std::string& dir) {
  auto ck = V41Checkpoint::open(dir);
  EXPECT_FALSE(ck.ok());
  return ck.ok() ? "" : ck.status().to_string();
}

// Rewrites model.safetensors through `edit` (on the list of tensors).
void rewrite(const std::string& dir, const std::function<void(std::vector<TensorToWrite>*)>& edit) {
  std::vector<TensorToWrite> ts;
  {
    auto f = SafetensorsFile::open(dir + "/model.safetensors");
    ASSERT_TRUE(f.ok());
    for (const TensorInfo& t : (*f)->tensors()) {
      const auto* b = static_cast<const uint8_t*>(t.data);
      ts.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(b, b + t.nbytes)});
    }
  }
  edit(&ts);
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", ts).ok());
}

void drop(std::vector<TensorToWrite>* ts, const std::string& name) {
  auto it = std::find_if(ts->begin(), ts->end(), [&](const auto& t) { return t.name == name; });
  ASSERT_NE(it, ts->end()) << name;
  ts->erase(it);
}

TEST(V41Checkpoint, OfficialLayoutLoads) {
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(true);
  spec.with_vision = true;
  auto ck = V41Checkpoint::open(write(spec));
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const V41Checkpoint& c = **ck;
  EXPECT_EQ(c.layout(), V41Layout::kOfficial);
  EXPECT_EQ(c.skipped_tensors(), 4);
  EXPECT_TRUE(c.weights().has_dspark);
  const V41Weights& w = c.weights();
  ASSERT_EQ(w.layers.size(), 8u);
  EXPECT_EQ(w.layers[2].attn.wq_a.format, WeightFormat::kFp8Block32);
  EXPECT_EQ(w.layers[2].ffn.experts[0].w1.format, WeightFormat::kMxfp4);
  EXPECT_FALSE(w.layers[2].attn.compressor.wgate.empty());
  EXPECT_TRUE(w.layers[5].attn.compressor.wgate.empty());  // ratio 1: no gate
  EXPECT_FALSE(w.layers[5].attn.indexer.wk.empty());
  EXPECT_FALSE(w.layers[7].attn.indexer.wq_b.empty());
  EXPECT_TRUE(w.layers[7].attn.indexer.wk.empty());  // Reindex: scores layer 5's keys
  EXPECT_TRUE(w.layers[6].attn.indexer.wq_b.empty());
  EXPECT_TRUE(w.layers[1].has_engram);
  EXPECT_TRUE(w.layers[1].engram.table.fp8);
  EXPECT_EQ(w.layers[1].engram.table.rows, c.config().engram_rows[0]);
  EXPECT_EQ(w.layers[1].ffn.bias_vl.size(), 8u);
  EXPECT_EQ(w.dspark.blocks.size(), 1u);
  EXPECT_EQ(w.dspark.blocks[0].layer.ffn.experts.size(), 4u);
  EXPECT_EQ(w.dspark.main_proj.cols, 64);  // one target layer's features (3 x hidden at 3)
  // The 32x32 tile dequantisation reads the right scale.
  const MatrixRef& m = w.layers[0].attn.wq_a;
  std::vector<float> row(static_cast<size_t>(m.cols));
  m.dequant_row(33, row.data());
  EXPECT_FLOAT_EQ(row[40], m.at(33, 40));
}

TEST(V41Checkpoint, TransformersLayoutLoads) {
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(false);
  spec.layout = V41Layout::kTransformers;
  spec.with_dspark = false;
  auto ck = V41Checkpoint::open(write(spec));
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->layout(), V41Layout::kTransformers);
  EXPECT_FALSE((*ck)->weights().has_dspark);
  EXPECT_EQ((*ck)->weights().layers[3].engram.table.fp8, false);
  EXPECT_EQ((*ck)->weights().head.format, WeightFormat::kFloat);
}

TEST(V41Checkpoint, MissingEngramTable) {
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(true);
  const std::string dir = write(spec);
  rewrite(dir, [](auto* ts) {
    drop(ts, "layers.3.engram.embed.weight");
    drop(ts, "layers.3.engram.embed.scale");
  });
  const std::string e = open_err(dir);
  EXPECT_NE(e.find("missing Engram table layers.3.engram.embed.weight for Engram layer 3"),
            std::string::npos)
      << e;
}

TEST(V41Checkpoint, WrongScaleTile) {
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(true);
  const std::string dir = write(spec);
  rewrite(dir, [](auto* ts) {
    for (auto& t : *ts) {
      if (t.name == "layers.4.attn.wq_b.scale") {
        t.shape = {2, 1};  // a 128x128 grid over [256, 32]
        t.bytes.resize(2);
      }
    }
  });
  const std::string e = open_err(dir);
  EXPECT_NE(e.find("wrong scale tile: scale tensor layers.4.attn.wq_b.scale"), std::string::npos)
      << e;
  EXPECT_NE(e.find("expected [8, 1]"), std::string::npos) << e;
}

TEST(V41Checkpoint, WrongEngramScaleTile) {
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(true);
  const std::string dir = write(spec);
  rewrite(dir, [](auto* ts) {
    for (auto& t : *ts) {
      if (t.name == "layers.1.engram.embed.scale") {
        t.shape = {t.shape[0] / 2, 2};
      }
    }
  });
  const std::string e = open_err(dir);
  EXPECT_NE(e.find("wrong scale tile"), std::string::npos) << e;
}

TEST(V41Checkpoint, ScheduleDisagreesWithTensors) {
  // The config moves the consumers' KV owner to layer 6; the tensors still have it at 5.
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(true);
  const std::string dir = write(spec);
  json j = spec.config;
  j["text_config"]["compress_ratios"] = {0, 0, 2, 2, 2, 2, 1, 1, 0};
  j["text_config"]["kv_source_layer_ids"] = {2, 6};
  j["text_config"]["index_source_layer_ids"] = {2, 6, 7};
  j["text_config"]["candidate_source_layer_id"] = 6;
  std::ofstream(dir + "/config.json") << j.dump();
  const std::string e = open_err(dir);
  EXPECT_NE(e.find("missing tensor(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("layers.6.attn.compressor.wkv.weight"), std::string::npos) << e;
}

TEST(V41Checkpoint, UnexpectedCompressorNamesTheSchedule) {
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(true);
  const std::string dir = write(spec);
  rewrite(dir, [](auto* ts) {
    TensorToWrite t = ts->front();
    for (const auto& x : *ts) {
      if (x.name == "layers.5.attn.compressor.norm.weight") {
        t = x;
      }
    }
    t.name = "layers.6.attn.compressor.norm.weight";
    ts->push_back(t);
  });
  const std::string e = open_err(dir);
  EXPECT_NE(e.find("unexpected tensor layers.6.attn.compressor.norm.weight"), std::string::npos)
      << e;
  EXPECT_NE(e.find("producer/consumer schedule"), std::string::npos) << e;
}

TEST(V41Checkpoint, WrongDtypeInOfficialLayout) {
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(true);
  const std::string dir = write(spec);
  rewrite(dir, [](auto* ts) {
    for (auto& t : *ts) {
      if (t.name == "layers.0.hc_attn_base") {
        t.dtype = DType::kBF16;
        t.bytes.resize(t.bytes.size() / 2);
      }
    }
  });
  const std::string e = open_err(dir);
  EXPECT_NE(e.find("layers.0.hc_attn_base"), std::string::npos) << e;
  EXPECT_NE(e.find("expected F32"), std::string::npos) << e;
}

TEST(V41Checkpoint, MissingExpertScale) {
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(true);
  const std::string dir = write(spec);
  rewrite(dir, [](auto* ts) { drop(ts, "layers.2.ffn.experts.7.w2.scale"); });
  const std::string e = open_err(dir);
  EXPECT_NE(e.find("layers.2.ffn.experts.7.w2.scale"), std::string::npos) << e;
}

TEST(V41Checkpoint, HcHeadIsNotV41) {
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(true);
  const std::string dir = write(spec);
  rewrite(dir, [](auto* ts) { ts->push_back(f32_tensor("hc_head_base", {4}, {0, 0, 0, 0})); });
  const std::string e = open_err(dir);
  EXPECT_NE(e.find("single-pass mHC"), std::string::npos) << e;
}

TEST(V41Checkpoint, MixedPrefixes) {
  V41SyntheticSpec spec;
  spec.config = v41_tiny_config_json(true);
  const std::string dir = write(spec);
  rewrite(dir, [](auto* ts) {
    for (auto& t : *ts) {
      if (t.name == "norm.weight") {
        t.name = "model.norm.weight";
      }
    }
  });
  EXPECT_NE(open_err(dir).find("mix"), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::model_v41

namespace dsinfer::model_v41 {
namespace {

TEST(V41Preset, FortyLayersIsThePublishedSchedule) {
  auto j = v41_flash_preset_config(40, /*real_engram_rows=*/true);
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_EQ((*j)["text_config"], v41_flash_config_json()["text_config"]);
  auto small = v41_flash_preset_config(40, false);
  ASSERT_TRUE(small.ok());
  auto c = parse_v41_config(small->dump(), "preset");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_LT(c->engram_rows[0], 30000);
  EXPECT_EQ(c->yoco_boundary, 20);
}

TEST(V41Preset, ReducedDepthKeepsBothHalves) {
  for (int n : {4, 5, 9, 23}) {
    auto j = v41_flash_preset_config(n, false);
    ASSERT_TRUE(j.ok()) << n;
    auto c = parse_v41_config(j->dump(), "preset");
    ASSERT_TRUE(c.ok()) << n << ": " << c.status().to_string();
    EXPECT_GT(c->yoco_boundary, 2) << n;
    EXPECT_LT(c->yoco_boundary, n) << n;
    EXPECT_EQ(c->hidden_size, 5120);
    EXPECT_EQ(c->layers[static_cast<size_t>(c->yoco_boundary)].role, LayerRole::kFull);
    EXPECT_TRUE(c->layers[1].engram);
  }
  EXPECT_FALSE(v41_flash_preset_config(3, false).ok());
  EXPECT_FALSE(v41_flash_preset_config(41, false).ok());
}

// make-checkpoint --preset v4.1-flash's token map (vocab 129280 onto 99092 compressed ids): one
// the loader accepts, deterministic, and another one for another seed.
TEST(V41Preset, SyntheticEngramTokenMapLoads) {
  auto j = v41_flash_preset_config(4, false);
  ASSERT_TRUE(j.ok());
  auto c = parse_v41_config(j->dump(), "preset");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_LT(c->engram_compressed_vocab_size, c->vocab_size);
  auto phi = synthetic_engram_token_map(*c, 5);
  ASSERT_TRUE(phi.ok()) << phi.status().to_string();
  const std::string dir = test_dir();
  const std::string path = dir + "/engram_token_map.json";
  ASSERT_TRUE(write_engram_token_map(path, *phi, *c).ok());
  auto loaded = load_engram_token_map(path, *c);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(*loaded, *phi);
  std::ifstream in(path);
  const json m = json::parse(in);
  EXPECT_EQ(m["compressed_vocab_size"].get<int64_t>(), c->engram_compressed_vocab_size);
  EXPECT_EQ(m["pad_id"].get<int32_t>(), (*phi)[static_cast<size_t>(c->engram_pad_token_id)]);
  // Not the identity below the compressed size: ids share compressed ids.
  EXPECT_NE(std::vector<int32_t>(phi->begin(), phi->begin() + 1000), [] {
    std::vector<int32_t> id(1000);
    for (int32_t i = 0; i < 1000; ++i) id[static_cast<size_t>(i)] = i;
    return id;
  }());
  EXPECT_EQ(*synthetic_engram_token_map(*c, 5), *phi);
  EXPECT_NE(*synthetic_engram_token_map(*c, 6), *phi);
  V41Config bad = *c;
  bad.engram_compressed_vocab_size = bad.vocab_size + 1;
  EXPECT_FALSE(synthetic_engram_token_map(bad, 5).ok());
}

TEST(V41Preset, StreamingWriterOpens) {
  const std::string dir = test_dir();
  V41StreamStats stats;
  ASSERT_TRUE(write_v41_streaming(v41_tiny_config_json(true), 7, 2, dir, &stats).ok());
  EXPECT_EQ(stats.files, 10);  // globals, 8 layers, 1 DSpark block
  auto ck = V41Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_TRUE((*ck)->weights().has_dspark);
  // The backends' Engram token map is written beside it (the tiny config: the identity).
  auto phi = load_engram_token_map(dir + "/engram_token_map.json", (*ck)->config());
  ASSERT_TRUE(phi.ok()) << phi.status().to_string();
  for (size_t i = 0; i < phi->size(); ++i) EXPECT_EQ((*phi)[i], static_cast<int32_t>(i));
  // Deterministic and independent of the thread count.
  const std::string dir1 = dir + "-1";
  V41StreamStats s1;
  ASSERT_TRUE(write_v41_streaming(v41_tiny_config_json(true), 7, 1, dir1, &s1).ok());
  auto a = SafetensorsFile::open(dir + "/model-00003-of-00010.safetensors");
  auto b = SafetensorsFile::open(dir1 + "/model-00003-of-00010.safetensors");
  ASSERT_TRUE(a.ok() && b.ok());
  const TensorInfo* ta = (*a)->find("layers.1.engram.embed.weight");
  const TensorInfo* tb = (*b)->find("layers.1.engram.embed.weight");
  ASSERT_TRUE(ta && tb);
  EXPECT_EQ(std::memcmp(ta->data, tb->data, static_cast<size_t>(ta->nbytes)), 0);
}

}  // namespace
}  // namespace dsinfer::model_v41

namespace dsinfer::model_v41 {
namespace {

// The official tensor inventory at the real config: the shapes and dtypes of spec §8.3.
TEST(V41Preset, FlashInventoryMatchesSpec) {
  auto c = parse_v41_config(v41_flash_config_json().dump(), "config.json");
  ASSERT_TRUE(c.ok());
  std::map<std::string, V41TensorSpec> inv;
  int64_t bytes = 0;
  for (const auto& t : v41_official_tensors(*c, true)) {
    int64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= d;
    bytes += n;
    inv[t.name] = t;
  }
  auto shape = [&](const std::string& n) { return inv.at(n).shape; };
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape("layers.0.attn.wq_a.scale"), (S{40, 160}));
  EXPECT_EQ(shape("layers.0.attn.wq_b.scale"), (S{1024, 40}));
  EXPECT_EQ(shape("layers.0.attn.wo_a.weight"), (S{8192, 4096}));
  EXPECT_EQ(shape("layers.0.attn.wo_a.scale"), (S{256, 128}));
  EXPECT_EQ(shape("layers.0.attn.wo_b.scale"), (S{160, 256}));
  EXPECT_EQ(shape("layers.0.hc_attn_fn"), (S{24, 20480}));
  EXPECT_EQ(inv.at("layers.0.hc_attn_fn").dtype, DType::kF32);
  EXPECT_EQ(shape("layers.5.ffn.experts.383.w1.weight"), (S{2304, 2560}));
  EXPECT_EQ(shape("layers.5.ffn.experts.383.w1.scale"), (S{2304, 160}));
  EXPECT_EQ(shape("layers.5.ffn.experts.0.w2.scale"), (S{5120, 72}));
  EXPECT_EQ(shape("layers.5.ffn.shared_experts.w1.scale"), (S{72, 160}));
  EXPECT_EQ(shape("layers.20.attn.indexer.wq_b.scale"), (S{128, 40}));
  EXPECT_EQ(shape("layers.20.attn.indexer.wk.weight"), (S{128, 512}));
  EXPECT_EQ(inv.count("layers.20.attn.compressor.wgate.weight"), 0u);
  EXPECT_EQ(inv.count("layers.24.attn.indexer.wk.weight"), 0u);
  EXPECT_EQ(shape("layers.24.attn.indexer.weights_proj.weight"), (S{32, 5120}));
  EXPECT_EQ(shape("layers.1.engram.embed.weight"), (S{384006168, 256}));
  EXPECT_EQ(shape("layers.14.engram.embed.scale"), (S{384016682, 8}));
  EXPECT_EQ(shape("layers.1.engram.wkv.scale"), (S{800, 192}));
  EXPECT_EQ(shape("mtp.0.main_proj.scale"), (S{160, 480}));
  EXPECT_EQ(shape("mtp.1.ffn.gate.bias_vl"), (S{128}));
  EXPECT_EQ(shape("mtp.2.confidence_head.proj.weight"), (S{1, 5376}));
  EXPECT_EQ(shape("mtp.2.markov_head.embed.weight"), (S{129280, 256}));
  // 4 compressor.wkv, 3 wgate, 8 indexer.wq_b, 4 indexer.wk (spec §1.2).
  int wkv = 0, wgate = 0, wqb = 0, wk = 0;
  for (const auto& [n, t] : inv) {
    wkv += str_ends_with(n, "compressor.wkv.weight");
    wgate += str_ends_with(n, "compressor.wgate.weight");
    wqb += str_ends_with(n, "indexer.wq_b.weight");
    wk += str_ends_with(n, "indexer.wk.weight");
  }
  EXPECT_EQ(wkv, 4);
  EXPECT_EQ(wgate, 3);
  EXPECT_EQ(wqb, 8);
  EXPECT_EQ(wk, 4);
  // Spec §8.1: 96,085 tensors and 475.3 GiB with the vision tower, aligner and image embeddings
  // (2 + 32 x 8 + 1 + 4 + 3 = 266 tensors, ~0.95 GiB), which the text model does not hold.
  EXPECT_EQ(inv.size(), 96085u - 266u);
  EXPECT_NEAR(static_cast<double>(bytes) / (1ull << 30), 475.3 - 0.95, 0.1);
}

}  // namespace
}  // namespace dsinfer::model_v41
