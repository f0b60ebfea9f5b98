// Presets and the streaming synthetic generator: the real-width V4-Flash preset (config only, no
// GB files), layer truncation, and kStreaming checkpoints of the tiny config (layout identical to
// the reference generator, deterministic for any thread count, sensibly scaled values).
#include "model/synthetic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "model/checkpoint.h"
#include "test_support.h"

namespace dsinfer::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::test_dir;
using testing::walk_weights;

// Spec §1.2: the attention type of real Flash layer i.
AttentionType flash_attention(int i) {
  if (i < 2) {
    return AttentionType::kSliding;
  }
  return i % 2 == 0 ? AttentionType::kCsa : AttentionType::kHca;
}

void expect_flash_widths(const ModelConfig& c) {
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.rope_main.theta, 10000.0);
  EXPECT_FALSE(c.rope_main.yarn);
  EXPECT_EQ(c.rope_compress.theta, 160000.0);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_EQ(c.rope_compress.factor, 16.0);
  EXPECT_EQ(c.rope_compress.original_max_position, 65536);
  EXPECT_EQ(c.rope_compress.beta_fast, 32.0);
  EXPECT_EQ(c.rope_compress.beta_slow, 1.0);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.hc_eps, 1e-6);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSqrtSoftplus);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_TRUE(c.fp8_quantized);
}

void expect_flash_schedule(const ModelConfig& c, int n) {
  ASSERT_EQ(c.num_hidden_layers, n);
  ASSERT_EQ(c.layers.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const LayerPlan& p = c.layers[static_cast<size_t>(i)];
    EXPECT_EQ(p.attention, flash_attention(i)) << "layer " << i;
    EXPECT_EQ(p.compress_ratio,
              flash_attention(i) == AttentionType::kSliding ? 0
              : flash_attention(i) == AttentionType::kCsa   ? 4
                                                            : 128)
        << "layer " << i;
    EXPECT_EQ(p.rope, i < 2 ? RopeTable::kMain : RopeTable::kCompress) << "layer " << i;
    EXPECT_EQ(p.moe, i < 3 ? MoeType::kHash : MoeType::kScore) << "layer " << i;
  }
  ASSERT_EQ(c.mtp_layers.size(), 1u);
  EXPECT_EQ(c.mtp_layers[0].attention, AttentionType::kSliding);
  EXPECT_EQ(c.mtp_layers[0].moe, MoeType::kScore);
}

TEST(V4FlashPreset, FullConfigHasTheRealValues) {
  auto c = v4_flash_preset_config();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  expect_flash_widths(*c);
  expect_flash_schedule(*c, kV4FlashLayers);
  int csa = 0, hca = 0, sliding = 0;
  for (const LayerPlan& p : c->layers) {
    csa += p.attention == AttentionType::kCsa;
    hca += p.attention == AttentionType::kHca;
    sliding += p.attention == AttentionType::kSliding;
  }
  EXPECT_EQ(sliding, 2);  // spec §1.2 counts
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
}

TEST(V4FlashPreset, TruncatedSchedulesRoundTripThroughTheDeepSeekDialect) {
  for (int n : {1, 2, 3, 4, 5, kV4FlashLayers}) {
    SCOPED_TRACE("layers = " + std::to_string(n));
    auto c = v4_flash_preset_config(n);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    expect_flash_widths(*c);
    expect_flash_schedule(*c, n);

    auto text = deepseek_config_json(*c, true);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    const json j = json::parse(*text);
    EXPECT_EQ(j["num_hidden_layers"], n);
    EXPECT_EQ(j["num_hash_layers"], std::min(3, n));
    ASSERT_EQ(j["compress_ratios"].size(), static_cast<size_t>(n + 1));
    EXPECT_EQ(j["compress_ratios"].back(), 0);  // the MTP block
    EXPECT_EQ(j["quantization_config"]["weight_block_size"], json({128, 128}));

    // Written to disk alone (no weights) and read back with the ordinary loader.
    const std::string dir = test_dir(std::string("-layers") + std::to_string(n));
    std::ofstream(dir + "/config.json") << *text;
    auto back = load_model_config(dir + "/config.json");
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    expect_flash_widths(*back);
    expect_flash_schedule(*back, n);
    auto again = deepseek_config_json(*back, true);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *text);  // the dialect text is a fixed point
  }
}

TEST(V4FlashPreset, RejectsLayerCountsOutsideTheRealSchedule) {
  for (int n : {0, -1, kV4FlashLayers + 1}) {
    auto c = v4_flash_preset_config(n);
    ASSERT_FALSE(c.ok()) << n;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("between 1 and 43"), std::string::npos)
        << c.status().message();
  }
}

TEST(TruncateLayers, TinyKeepsAPrefixOfTheSchedule) {
  const ModelConfig tiny = tiny_preset_config();
  for (int n = 1; n <= 5; ++n) {
    auto c = truncate_layers(tiny, n);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ASSERT_EQ(c->layers.size(), static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      const auto& a = c->layers[static_cast<size_t>(i)];
      const auto& b = tiny.layers[static_cast<size_t>(i)];
      EXPECT_EQ(a.attention, b.attention);
      EXPECT_EQ(a.compress_ratio, b.compress_ratio);
      EXPECT_EQ(a.moe, b.moe);
    }
    EXPECT_EQ(c->mtp_layers.size(), 1u);
    EXPECT_EQ(c->hidden_size, tiny.hidden_size);
  }
  EXPECT_FALSE(truncate_layers(tiny, 0).ok());
  EXPECT_FALSE(truncate_layers(tiny, 6).ok());
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Status write_streaming(const std::string& dir, int threads, uint64_t seed, bool with_mtp = true) {
  SyntheticSpec spec;
  spec.config = tiny_preset_config();
  spec.seed = seed;
  spec.quantized = true;
  spec.with_mtp = with_mtp;
  spec.generator = SyntheticGenerator::kStreaming;
  spec.threads = threads;
  return write_synthetic_checkpoint(spec, dir);
}

TEST(StreamingGenerator, SameLayoutAsTheReferenceGenerator) {
  const std::string dir = test_dir("-stream");
  std::vector<std::string> lines;
  SyntheticSpec spec;
  spec.config = tiny_preset_config();
  spec.seed = 3;
  spec.quantized = true;
  spec.with_mtp = true;
  spec.generator = SyntheticGenerator::kStreaming;
  spec.progress = [&](const std::string& l) { lines.push_back(l); };
  SyntheticWriteStats stats;
  spec.stats = &stats;
  ASSERT_TRUE(write_synthetic_checkpoint(spec, dir).ok());
  // One shard for the top-level tensors, one per layer, one for the MTP block.
  EXPECT_EQ(stats.files, 7);
  EXPECT_TRUE(fs::exists(dir + "/model-00007-of-00007.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(lines.size(), 1u + 7u + 1u);  // plan, one per shard, total

  const std::string ref_dir = test_dir("-ref");
  SyntheticSpec ref = spec;
  ref.generator = SyntheticGenerator::kReference;
  ref.progress = nullptr;
  ref.stats = nullptr;
  ASSERT_TRUE(write_synthetic_checkpoint(ref, ref_dir).ok());

  auto a = Checkpoint::open(dir);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = Checkpoint::open(ref_dir);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_TRUE((*a)->has_mtp());
  const auto& ia = (*a)->inventory();
  const auto& ib = (*b)->inventory();
  ASSERT_EQ(ia.size(), ib.size());
  EXPECT_EQ(stats.tensors, static_cast<int64_t>(ia.size()));
  uint64_t bytes = 0;
  std::set<std::string> files;
  for (size_t i = 0; i < ia.size(); ++i) {
    EXPECT_EQ(ia[i].name, ib[i].name);
    EXPECT_EQ(ia[i].dtype, ib[i].dtype) << ia[i].name;
    EXPECT_EQ(ia[i].shape, ib[i].shape) << ia[i].name;
    files.insert(ia[i].file);
  }
  for (const std::string& f : files) bytes += fs::file_size(dir + "/" + f);
  EXPECT_EQ(stats.bytes, bytes);
  EXPECT_EQ(read_file(dir + "/config.json"), read_file(ref_dir + "/config.json"));
}

TEST(StreamingGenerator, OutputDoesNotDependOnTheThreadCount) {
  const std::string d1 = test_dir("-t1"), d3 = test_dir("-t3"), d4 = test_dir("-seed4");
  ASSERT_TRUE(write_streaming(d1, 1, 9).ok());
  ASSERT_TRUE(write_streaming(d3, 3, 9).ok());
  ASSERT_TRUE(write_streaming(d4, 3, 4).ok());
  int compared = 0;
  for (const auto& e : fs::directory_iterator(d1)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(read_file(d1 + "/" + name), read_file(d3 + "/" + name)) << name;
    if (name.find(".safetensors") != std::string::npos && name.find("index") == std::string::npos) {
      EXPECT_NE(read_file(d1 + "/" + name), read_file(d4 + "/" + name)) << name;
    }
    ++compared;
  }
  EXPECT_EQ(compared, 1 + 7 + 1);  // config, shards, index
}

TEST(StreamingGenerator, ValuesAreFiniteAndSensiblyScaled) {
  const std::string dir = test_dir();
  ASSERT_TRUE(write_streaming(dir, 2, 1).ok());
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& c = (*ck)->config();
  int matrices = 0, vectors = 0;
  walk_weights(
      c,
      (*ck)->weights(),
      [&](const std::string& name, const MatrixRef& m) {
        ASSERT_FALSE(m.empty()) << name;
        double sum2 = 0.0;
        std::vector<float> row(static_cast<size_t>(m.cols));
        for (int64_t r = 0; r < m.rows; ++r) {
          m.dequant_row(r, row.data());
          for (float x : row) {
            ASSERT_TRUE(std::isfinite(x)) << name;
            sum2 += static_cast<double>(x) * x;
          }
        }
        const double rms = std::sqrt(sum2 / static_cast<double>(m.rows * m.cols));
        // ~1/sqrt(fan_in) (embed: ~1); MXFP4 block scales are powers of two, so within 2x.
        const double want = name == "embed.weight" ? 1.0 : 1.0 / std::sqrt(double(m.cols));
        EXPECT_GT(rms, want / 2) << name;
        EXPECT_LT(rms, want * 2) << name;
        ++matrices;
      },
      [&](const std::string& name, const std::vector<float>& v) {
        for (float x : v) {
          ASSERT_TRUE(std::isfinite(x)) << name;
          ASSERT_LT(std::fabs(x), 4.0f) << name;  // norms ~1, mHC/sinks/bias small
        }
        ++vectors;
      });
  EXPECT_GT(matrices, 50);
  EXPECT_GT(vectors, 50);
  // Hash routing: k distinct experts per token.
  for (size_t l = 0; l < c.layers.size(); ++l) {
    if (c.layers[l].moe != MoeType::kHash) {
      continue;
    }
    const auto& t = (*ck)->weights().layers[l].ffn.tid2eid;
    ASSERT_EQ(t.size(), static_cast<size_t>(c.vocab_size * c.num_experts_per_tok));
    for (int64_t tok = 0; tok < c.vocab_size; ++tok) {
      std::set<int32_t> ids;
      for (int64_t k = 0; k < c.num_experts_per_tok; ++k) {
        const int32_t e = t[static_cast<size_t>(tok * c.num_experts_per_tok + k)];
        ASSERT_GE(e, 0);
        ASSERT_LT(e, c.n_routed_experts);
        ids.insert(e);
      }
      EXPECT_EQ(ids.size(), static_cast<size_t>(c.num_experts_per_tok)) << "token " << tok;
    }
  }
}

TEST(StreamingGenerator, WithoutMtpAndRejectsValuesOut) {
  const std::string dir = test_dir();
  ASSERT_TRUE(write_streaming(dir, 2, 1, false).ok());
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_FALSE((*ck)->has_mtp());
  EXPECT_TRUE(fs::exists(dir + "/model-00006-of-00006.safetensors"));

  std::map<std::string, std::vector<float>> values;
  SyntheticSpec spec;
  spec.config = tiny_preset_config();
  spec.generator = SyntheticGenerator::kStreaming;
  spec.values_out = &values;
  EXPECT_FALSE(write_synthetic_checkpoint(spec, test_dir("-values")).ok());
}

}  // namespace
}  // namespace dsinfer::model
