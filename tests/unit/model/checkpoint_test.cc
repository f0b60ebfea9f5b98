// Checkpoint round trips through write_synthetic_checkpoint: quantised, bf16, sharded, MTP, and
// the transformers layout; dequantised MatrixRef values equal what the writer stored.
#include "model/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "model/synthetic.h"
#include "numeric/float_formats.h"
#include "test_support.h"

namespace dsinfer::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::test_dir;
using testing::walk_weights;
using Values = std::map<std::string, std::vector<float>>;

struct Written {
  std::string dir;
  Values values;
};

Written write_tiny(
    bool quantized, bool with_mtp, int shards, uint64_t seed = 7, const std::string& suffix = "") {
  Written w;
  w.dir = test_dir(suffix);
  SyntheticSpec spec;
  spec.config = tiny_preset_config();
  spec.seed = seed;
  spec.quantized = quantized;
  spec.with_mtp = with_mtp;
  spec.num_shards = shards;
  spec.values_out = &w.values;
  const Status s = write_synthetic_checkpoint(spec, w.dir);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return w;
}

// Every bound weight equals the writer's values exactly; returns the number checked.
int expect_values(const Checkpoint& ck, const Values& values) {
  int checked = 0;
  walk_weights(
      ck.config(),
      ck.weights(),
      [&](const std::string& name, const MatrixRef& m) {
        auto it = values.find(name);
        ASSERT_NE(it, values.end()) << name;
        ASSERT_FALSE(m.empty()) << name;
        ASSERT_EQ(static_cast<size_t>(m.rows * m.cols), it->second.size()) << name;
        std::vector<float> row(static_cast<size_t>(m.cols));
        for (int64_t r = 0; r < m.rows; ++r) {
          m.dequant_row(r, row.data());
          for (int64_t c = 0; c < m.cols; ++c) {
            const float want = it->second[static_cast<size_t>(r * m.cols + c)];
            ASSERT_EQ(m.at(r, c), want) << name << " [" << r << ", " << c << "]";
            ASSERT_EQ(row[static_cast<size_t>(c)], want) << name << " row " << r;
          }
        }
        ++checked;
      },
      [&](const std::string& name, const std::vector<float>& v) {
        auto it = values.find(name);
        ASSERT_NE(it, values.end()) << name;
        ASSERT_EQ(v, it->second) << name;
        ++checked;
      });
  return checked;
}

void expect_tid2eid(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const auto& t = ck.weights().layers[l].ffn.tid2eid;
    if (c.layers[l].moe == MoeType::kScore) {
      EXPECT_TRUE(t.empty());
      EXPECT_EQ(ck.weights().layers[l].ffn.bias.size(), static_cast<size_t>(c.n_routed_experts));
      continue;
    }
    ASSERT_EQ(t.size(), static_cast<size_t>(c.vocab_size * c.num_experts_per_tok));
    for (int64_t tok = 0; tok < c.vocab_size; ++tok) {
      std::set<int32_t> ids;
      for (int64_t k = 0; k < c.num_experts_per_tok; ++k) {
        const int32_t e = t[static_cast<size_t>(tok * c.num_experts_per_tok + k)];
        EXPECT_GE(e, 0);
        EXPECT_LT(e, c.n_routed_experts);
        ids.insert(e);
      }
      EXPECT_EQ(ids.size(), static_cast<size_t>(c.num_experts_per_tok)) << "token " << tok;
    }
  }
}

TEST(Checkpoint, QuantizedWithMtpRoundTrip) {
  Written w = write_tiny(/*quantized=*/true, /*with_mtp=*/true, 1);
  auto ck = Checkpoint::open(w.dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const Checkpoint& c = **ck;
  EXPECT_EQ(c.layout(), CheckpointLayout::kDeepSeek);
  EXPECT_TRUE(c.config().fp8_quantized);
  EXPECT_TRUE(c.has_mtp());
  ASSERT_EQ(c.weights().layers.size(), 5u);
  ASSERT_EQ(c.weights().mtp.size(), 1u);
  const LayerWeights& l1 = c.weights().layers[1];
  EXPECT_EQ(l1.attn.wq_a.format, WeightFormat::kFp8Block128);
  EXPECT_EQ(l1.attn.wq_a.scale_dtype, DType::kF8E8M0);
  EXPECT_EQ(l1.attn.wo_a.format, WeightFormat::kFp8Block128);
  EXPECT_EQ(l1.attn.indexer_wq_b.format, WeightFormat::kFp8Block128);
  EXPECT_EQ(l1.attn.compressor.wkv.format, WeightFormat::kFloat);
  EXPECT_EQ(l1.attn.compressor.wkv.rows, 256);  // CSA: 2 * head_dim
  EXPECT_EQ(l1.attn.indexer_compressor.wkv.rows, 128);
  EXPECT_EQ(l1.attn.compressor.ape.size(), 4u * 256u);
  EXPECT_EQ(c.weights().layers[2].attn.compressor.wkv.rows, 128);  // HCA: head_dim
  EXPECT_EQ(c.weights().layers[2].attn.compressor.ape.size(), 16u * 128u);
  EXPECT_TRUE(c.weights().layers[2].attn.indexer_wq_b.empty());
  EXPECT_TRUE(c.weights().layers[0].attn.compressor.wkv.empty());
  EXPECT_EQ(l1.ffn.experts[0].w1.format, WeightFormat::kMxfp4);
  EXPECT_EQ(l1.ffn.experts[3].w2.format, WeightFormat::kMxfp4);
  EXPECT_EQ(l1.ffn.experts[3].w2.cols, 32);
  EXPECT_EQ(l1.ffn.shared.w2.format, WeightFormat::kFp8Block128);
  EXPECT_EQ(l1.ffn.gate.format, WeightFormat::kFloat);
  EXPECT_EQ(c.weights().embed.format, WeightFormat::kFloat);
  EXPECT_EQ(c.weights().embed.dtype, DType::kBF16);
  EXPECT_EQ(c.weights().mtp[0].e_proj.format, WeightFormat::kFp8Block128);
  const int checked = expect_values(c, w.values);
  EXPECT_GT(checked, 200);
  expect_tid2eid(c);

  // Inventory: sorted, one entry per stored tensor, bytes add up.
  const auto& inv = c.inventory();
  ASSERT_FALSE(inv.empty());
  for (size_t i = 1; i < inv.size(); ++i) EXPECT_LT(inv[i - 1].name, inv[i].name);
  int64_t bytes = 0;
  for (const auto& e : inv) {
    EXPECT_EQ(e.file, "model.safetensors");
    bytes += e.nbytes;
  }
  EXPECT_LT(static_cast<uint64_t>(bytes), fs::file_size(w.dir + "/model.safetensors"));
}

TEST(Checkpoint, QuantisationIsCloseToTheSource) {
  // Quantised and bf16 checkpoints from the same seed: dequantised FP8/MXFP4 values stay within
  // the format's relative step of the bf16-rounded source values.
  Written q = write_tiny(true, false, 1, 11, "-q");
  Written b = write_tiny(false, false, 1, 11, "-b");
  for (const char* name : {"layers.1.attn.wq_b.weight", "layers.3.ffn.experts.2.w1.weight"}) {
    const auto& qv = q.values.at(name);
    const auto& bv = b.values.at(name);
    ASSERT_EQ(qv.size(), bv.size());
    double err = 0, ref = 0;
    for (size_t i = 0; i < qv.size(); ++i) {
      err += (qv[i] - bv[i]) * (qv[i] - bv[i]);
      ref += bv[i] * bv[i];
    }
    EXPECT_LT(std::sqrt(err / ref), 0.2) << name;
  }
}

TEST(Checkpoint, Bf16WithoutMtp) {
  Written w = write_tiny(false, false, 1);
  auto ck = Checkpoint::open(w.dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const Checkpoint& c = **ck;
  EXPECT_FALSE(c.config().fp8_quantized);
  EXPECT_EQ(c.config().num_nextn_predict_layers, 1);
  EXPECT_FALSE(c.has_mtp());
  EXPECT_TRUE(c.weights().mtp.empty());
  EXPECT_EQ(c.weights().layers[1].attn.wq_a.format, WeightFormat::kFloat);
  EXPECT_EQ(c.weights().layers[1].attn.wq_a.dtype, DType::kBF16);
  EXPECT_EQ(c.weights().layers[1].ffn.experts[0].w1.format, WeightFormat::kFloat);
  expect_values(c, w.values);
  expect_tid2eid(c);
}

TEST(Checkpoint, ShardedWithIndex) {
  Written w = write_tiny(true, true, 3);
  ASSERT_TRUE(fs::exists(w.dir + "/model.safetensors.index.json"));
  ASSERT_TRUE(fs::exists(w.dir + "/model-00003-of-00003.safetensors"));
  ASSERT_FALSE(fs::exists(w.dir + "/model.safetensors"));
  auto ck = Checkpoint::open(w.dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  std::set<std::string> files;
  for (const auto& e : (*ck)->inventory()) files.insert(e.file);
  EXPECT_EQ(files.size(), 3u);
  expect_values(**ck, w.values);

  // Rewriting the same dir unsharded removes the old shards and index.
  SyntheticSpec spec;
  spec.config = tiny_preset_config();
  spec.num_shards = 1;
  ASSERT_TRUE(write_synthetic_checkpoint(spec, w.dir).ok());
  EXPECT_FALSE(fs::exists(w.dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(w.dir + "/model-00001-of-00003.safetensors"));
  ASSERT_TRUE(Checkpoint::open(w.dir).ok());
}

TEST(Checkpoint, ShardedWithoutIndexGlobsAllFiles) {
  Written w = write_tiny(false, false, 2);
  fs::remove(w.dir + "/model.safetensors.index.json");
  auto ck = Checkpoint::open(w.dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  expect_values(**ck, w.values);
}

TEST(Checkpoint, DeterministicPerSeed) {
  Written a = write_tiny(true, false, 1, 5, "-a");
  Written b = write_tiny(true, false, 1, 5, "-b");
  Written c = write_tiny(true, false, 1, 6, "-c");
  EXPECT_EQ(a.values, b.values);
  EXPECT_NE(a.values, c.values);
}

TEST(Checkpoint, SyntheticRejectsInexpressibleConfigs) {
  const std::string dir = test_dir();
  SyntheticSpec spec;
  spec.config = tiny_preset_config();
  spec.config.rope_main.yarn = true;
  EXPECT_FALSE(write_synthetic_checkpoint(spec, dir).ok());
  spec.config = tiny_preset_config();
  spec.config.layers[3].moe = MoeType::kHash;  // hash layers not a prefix
  EXPECT_FALSE(write_synthetic_checkpoint(spec, dir).ok());
  spec.config = tiny_preset_config();
  spec.config.layers[1].compress_ratio = 32;  // CSA ratio larger than HCA's
  EXPECT_FALSE(write_synthetic_checkpoint(spec, dir).ok());
  spec.config = tiny_preset_config();
  spec.num_shards = 0;
  EXPECT_FALSE(write_synthetic_checkpoint(spec, dir).ok());
}

TEST(Checkpoint, TinyPreset) {
  const ModelConfig c = tiny_preset_config();
  EXPECT_EQ(c.hidden_size, 64);
  ASSERT_EQ(c.layers.size(), 5u);
  EXPECT_EQ(c.layers[0].attention, AttentionType::kSliding);
  EXPECT_EQ(c.layers[1].attention, AttentionType::kCsa);
  EXPECT_EQ(c.layers[1].compress_ratio, 4);
  EXPECT_EQ(c.layers[2].attention, AttentionType::kHca);
  EXPECT_EQ(c.layers[2].compress_ratio, 16);
  EXPECT_EQ(c.layers[1].moe, MoeType::kHash);
  EXPECT_EQ(c.layers[2].moe, MoeType::kScore);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_EQ(c.mtp_layers.size(), 1u);
  auto text = deepseek_config_json(c, true);
  ASSERT_TRUE(text.ok());
  auto back = parse_model_config(*text, "x");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->fp8_quantized);
}

// Renames an official bf16 checkpoint the way transformers' save_pretrained stores it (fp32,
// `model.` prefix, embed_tokens, hc_head.hc_*, attn.norm, I64 tid2eid) with a transformers
// dialect config.json.
void convert_to_transformers(const std::string& src, const std::string& dst) {
  std::vector<TensorToWrite> in = testing::read_all(src + "/model.safetensors");
  std::vector<TensorToWrite> out;
  for (TensorToWrite& t : in) {
    std::string n = t.name;
    if (n == "embed.weight") {
      n = "embed_tokens.weight";
    }
    if (n == "hc_head_fn") {
      n = "hc_head.hc_fn";
    }
    if (n == "hc_head_base") {
      n = "hc_head.hc_base";
    }
    if (n == "hc_head_scale") {
      n = "hc_head.hc_scale";
    }
    const std::string kv = ".attn.kv_norm.weight";
    if (n.size() > kv.size() && n.compare(n.size() - kv.size(), kv.size(), kv) == 0) {
      n = n.substr(0, n.size() - kv.size()) + ".attn.norm.weight";
    }
    if (n != "head.weight") {
      n = "model." + n;
    }
    TensorToWrite o{n, t.dtype, t.shape, {}};
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (t.dtype == DType::kBF16) {
      std::vector<float> f(static_cast<size_t>(numel));
      for (int64_t i = 0; i < numel; ++i) f[i] = load_float(t.bytes.data(), DType::kBF16, i);
      o = f32_tensor(n, t.shape, f);
    } else if (t.dtype == DType::kI32) {
      o.dtype = DType::kI64;
      o.bytes.resize(static_cast<size_t>(numel) * 8);
      for (int64_t i = 0; i < numel; ++i) {
        const int64_t v = load_int(t.bytes.data(), DType::kI32, i);
        std::memcpy(o.bytes.data() + 8 * i, &v, 8);
      }
    } else {
      o.bytes = t.bytes;
    }
    out.push_back(std::move(o));
  }
  ASSERT_TRUE(write_safetensors(dst + "/model.safetensors", out).ok());
  json cfg = json::parse(std::ifstream(src + "/config.json"), nullptr, false);
  ASSERT_FALSE(cfg.is_discarded());
  const json ratios = cfg["compress_ratios"];
  json lt = json::array(), mt = json::array();
  for (int i = 0; i < cfg["num_hidden_layers"].get<int>(); ++i) {
    const int r = ratios[i].get<int>();
    lt.push_back(r == 0
                     ? "sliding_attention"
                     : (r == 4 ? "compressed_sparse_attention" : "heavily_compressed_attention"));
    mt.push_back(i < cfg["num_hash_layers"].get<int>() ? "hash_moe" : "moe");
  }
  cfg["layer_types"] = lt;
  cfg["mlp_layer_types"] = mt;
  cfg["compress_rates"] = {{"compressed_sparse_attention", 4},
                           {"heavily_compressed_attention", 16}};
  cfg["rope_parameters"] = {
      {"main", {{"rope_theta", 10000.0}, {"rope_type", "default"}, {"partial_rotary_factor", 0.5}}},
      {"compress",
       {{"rope_type", "yarn"},
        {"rope_theta", 160000.0},
        {"factor", 16},
        {"original_max_position_embeddings", 64},
        {"beta_fast", 32},
        {"beta_slow", 1},
        {"attention_factor", 1.0},
        {"partial_rotary_factor", 0.5}}}};
  for (const char* k : {"compress_ratios", "num_hash_layers", "rope_scaling"}) cfg.erase(k);
  cfg["partial_rotary_factor"] = 0.5;
  std::ofstream(dst + "/config.json") << cfg.dump(2);
}

TEST(Checkpoint, TransformersLayout) {
  Written w = write_tiny(false, false, 1, 9, "-src");
  const std::string dst = test_dir("-hf");
  convert_to_transformers(w.dir, dst);
  auto ck = Checkpoint::open(dst);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->layout(), CheckpointLayout::kTransformers);
  EXPECT_EQ((*ck)->config().dialect, ConfigDialect::kTransformers);
  EXPECT_EQ((*ck)->weights().embed.dtype, DType::kF32);
  expect_values(**ck, w.values);
  expect_tid2eid(**ck);
  auto orig = Checkpoint::open(w.dir);
  ASSERT_TRUE(orig.ok());
  for (size_t l = 0; l < 5; ++l) {
    EXPECT_EQ((*ck)->weights().layers[l].ffn.tid2eid, (*orig)->weights().layers[l].ffn.tid2eid);
  }
  // Inventory keeps the stored names.
  bool saw = false;
  for (const auto& e : (*ck)->inventory()) saw |= e.name == "model.layers.0.attn.norm.weight";
  EXPECT_TRUE(saw);
}

TEST(Checkpoint, TransformersLayoutAcceptsLmHeadAlias) {
  Written w = write_tiny(false, false, 1, 9, "-src");
  const std::string dst = test_dir("-hf");
  convert_to_transformers(w.dir, dst);
  testing::rewrite(dst + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    testing::find_tensor(ts, "head.weight")->name = "lm_head.weight";
  });
  auto ck = Checkpoint::open(dst);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  expect_values(**ck, w.values);
}

}  // namespace
}  // namespace dsinfer::model
