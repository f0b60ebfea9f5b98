// config.json parsing: both dialects, aliases, the derived plan and validation errors.
#include "model/config.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace dsinfer::model {
namespace {

using json = nlohmann::json;

// The official DeepSeek-V4-Flash config.json (fields that matter; spec §1).
json flash_config() {
  json ratios = json::array();
  for (int i = 0; i < 44; ++i) {
    int r = 0;
    if (i >= 2 && i <= 42) {
      r = (i % 2 == 0) ? 4 : 128;
    }
    ratios.push_back(r);
  }
  return {{"architectures", {"DeepseekV4ForCausalLM"}},
          {"model_type", "deepseek_v4"},
          {"vocab_size", 129280},
          {"hidden_size", 4096},
          {"num_hidden_layers", 43},
          {"num_attention_heads", 64},
          {"num_key_value_heads", 1},
          {"head_dim", 512},
          {"qk_rope_head_dim", 64},
          {"q_lora_rank", 1024},
          {"o_groups", 8},
          {"o_lora_rank", 1024},
          {"sliding_window", 128},
          {"compress_ratios", ratios},
          {"rope_theta", 10000},
          {"compress_rope_theta", 160000},
          {"rope_scaling",
           {{"type", "yarn"},
            {"factor", 16},
            {"original_max_position_embeddings", 65536},
            {"beta_fast", 32},
            {"beta_slow", 1}}},
          {"max_position_embeddings", 1048576},
          {"index_n_heads", 64},
          {"index_head_dim", 128},
          {"index_topk", 512},
          {"hc_mult", 4},
          {"hc_sinkhorn_iters", 20},
          {"hc_eps", 1e-6},
          {"rms_norm_eps", 1e-6},
          {"n_routed_experts", 256},
          {"n_shared_experts", 1},
          {"num_experts_per_tok", 6},
          {"moe_intermediate_size", 2048},
          {"num_hash_layers", 3},
          {"scoring_func", "sqrtsoftplus"},
          {"topk_method", "noaux_tc"},
          {"norm_topk_prob", true},
          {"routed_scaling_factor", 1.5},
          {"swiglu_limit", 10.0},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", false},
          {"num_nextn_predict_layers", 1},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"torch_dtype", "bfloat16"},
          {"quantization_config",
           {{"activation_scheme", "dynamic"},
            {"fmt", "e4m3"},
            {"quant_method", "fp8"},
            {"scale_fmt", "ue8m0"},
            {"weight_block_size", {128, 128}}}}};
}

// What transformers 5.17 save_pretrained writes for a tiny V4 model (verbatim layout).
const char* kTransformersConfig = R"({
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "compress_rates": {
    "compressed_sparse_attention": 4,
    "heavily_compressed_attention": 8
  },
  "compress_rope_theta": 160000.0,
  "eos_token_id": 1,
  "hc_eps": 1e-06,
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 64,
  "index_head_dim": 64,
  "index_n_heads": 2,
  "index_topk": 3,
  "initializer_range": 0.02,
  "layer_types": [
    "sliding_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention"
  ],
  "max_position_embeddings": 1024,
  "mlp_bias": false,
  "mlp_layer_types": [
    "hash_moe",
    "hash_moe",
    "moe",
    "moe",
    "moe"
  ],
  "model_type": "deepseek_v4",
  "moe_intermediate_size": 32,
  "n_routed_experts": 4,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 4,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 5,
  "num_key_value_heads": 1,
  "num_nextn_predict_layers": 1,
  "o_groups": 2,
  "o_lora_rank": 32,
  "output_router_logits": false,
  "pad_token_id": null,
  "partial_rotary_factor": 0.5,
  "q_lora_rank": 32,
  "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {
    "compress": {
      "attention_factor": 1.0,
      "beta_fast": 32,
      "beta_slow": 1,
      "factor": 16,
      "original_max_position_embeddings": 64,
      "partial_rotary_factor": 0.5,
      "rope_theta": 160000.0,
      "rope_type": "yarn",
      "type": "yarn"
    },
    "main": {
      "partial_rotary_factor": 0.5,
      "rope_theta": 10000.0,
      "rope_type": "default"
    }
  },
  "rope_theta": 10000.0,
  "routed_scaling_factor": 1.5,
  "router_aux_loss_coef": 0.001,
  "router_jitter_noise": 0.0,
  "scoring_func": "sqrtsoftplus",
  "sliding_window": 8,
  "swiglu_limit": 10.0,
  "tie_word_embeddings": false,
  "transformers_version": "5.17.0",
  "use_cache": true,
  "vocab_size": 512
})";

Result<ModelConfig> parse(const json& j) {
  return parse_model_config(j.dump(), "cfg.json");
}

TEST(Config, DeepSeekFlash) {
  auto r = parse(flash_config());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.dialect, ConfigDialect::kDeepSeek);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.nope_head_dim(), 448);
  EXPECT_EQ(c.hc_mix_dim(), 24);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSqrtSoftplus);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
  EXPECT_TRUE(c.fp8_quantized);
  EXPECT_DOUBLE_EQ(c.rope_main.theta, 10000.0);
  EXPECT_FALSE(c.rope_main.yarn);
  EXPECT_DOUBLE_EQ(c.rope_compress.theta, 160000.0);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_DOUBLE_EQ(c.rope_compress.factor, 16.0);
  EXPECT_EQ(c.rope_compress.original_max_position, 65536);
  EXPECT_DOUBLE_EQ(c.rope_compress.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_compress.beta_slow, 1.0);
  ASSERT_EQ(c.layers.size(), 43u);
  int sliding = 0, csa = 0, hca = 0, hash = 0;
  for (const LayerPlan& p : c.layers) {
    sliding += p.attention == AttentionType::kSliding;
    csa += p.attention == AttentionType::kCsa;
    hca += p.attention == AttentionType::kHca;
    hash += p.moe == MoeType::kHash;
    EXPECT_EQ(p.rope,
              p.attention == AttentionType::kSliding ? RopeTable::kMain : RopeTable::kCompress);
  }
  EXPECT_EQ(sliding, 2);
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(hash, 3);
  EXPECT_EQ(c.layers[2].attention, AttentionType::kCsa);
  EXPECT_EQ(c.layers[2].compress_ratio, 4);
  EXPECT_EQ(c.layers[2].moe, MoeType::kHash);
  EXPECT_EQ(c.layers[3].attention, AttentionType::kHca);
  EXPECT_EQ(c.layers[3].compress_ratio, 128);
  EXPECT_EQ(c.layers[3].moe, MoeType::kScore);
  ASSERT_EQ(c.mtp_layers.size(), 1u);
  EXPECT_EQ(c.mtp_layers[0].attention, AttentionType::kSliding);
  EXPECT_EQ(c.mtp_layers[0].rope, RopeTable::kMain);
  EXPECT_EQ(c.mtp_layers[0].moe, MoeType::kScore);
}

TEST(Config, DeepSeekWithoutTrailingMtpRatio) {
  json j = flash_config();
  j["compress_ratios"].erase(43);
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->layers.size(), 43u);
}

TEST(Config, TransformersDialectVerbatim) {
  auto r = parse_model_config(kTransformersConfig, "hf/config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.dialect, ConfigDialect::kTransformers);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.fp8_quantized);
  ASSERT_EQ(c.layers.size(), 5u);
  const AttentionType at[] = {AttentionType::kSliding,
                              AttentionType::kCsa,
                              AttentionType::kHca,
                              AttentionType::kCsa,
                              AttentionType::kHca};
  const int ratio[] = {0, 4, 8, 4, 8};
  const MoeType mt[] = {
      MoeType::kHash, MoeType::kHash, MoeType::kScore, MoeType::kScore, MoeType::kScore};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(c.layers[i].attention, at[i]) << i;
    EXPECT_EQ(c.layers[i].compress_ratio, ratio[i]) << i;
    EXPECT_EQ(c.layers[i].moe, mt[i]) << i;
    EXPECT_EQ(c.layers[i].rope, i == 0 ? RopeTable::kMain : RopeTable::kCompress) << i;
  }
  EXPECT_FALSE(c.rope_main.yarn);
  EXPECT_DOUBLE_EQ(c.rope_main.theta, 10000.0);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_DOUBLE_EQ(c.rope_compress.theta, 160000.0);
  EXPECT_DOUBLE_EQ(c.rope_compress.factor, 16.0);
  EXPECT_EQ(c.rope_compress.original_max_position, 64);
  ASSERT_EQ(c.mtp_layers.size(), 1u);
}

TEST(Config, TransformersDefaultCompressRope) {
  json j = json::parse(kTransformersConfig);
  j["rope_parameters"]["compress"] = {
      {"rope_type", "default"}, {"rope_theta", 160000.0}, {"partial_rotary_factor", 0.5}};
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->rope_compress.yarn);
  EXPECT_DOUBLE_EQ(r->rope_compress.theta, 160000.0);
}

TEST(Config, TransformersDerivesRopeDimFromPartialFactor) {
  json j = json::parse(kTransformersConfig);
  j.erase("qk_rope_head_dim");
  j["partial_rotary_factor"] = 0.25;
  for (auto t : {"main", "compress"}) j["rope_parameters"][t]["partial_rotary_factor"] = 0.25;
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->qk_rope_head_dim, 32);
}

TEST(Config, InferenceConfigAliases) {
  json j = {{"vocab_size", 512},
            {"dim", 64},
            {"n_layers", 3},
            {"n_heads", 4},
            {"head_dim", 128},
            {"rope_head_dim", 64},
            {"q_lora_rank", 32},
            {"o_groups", 2},
            {"o_lora_rank", 32},
            {"window_size", 8},
            {"compress_ratios", {0, 4, 128, 0}},
            {"n_hash_layers", 1},
            {"index_n_heads", 2},
            {"index_head_dim", 64},
            {"index_topk", 3},
            {"n_routed_experts", 4},
            {"n_activated_experts", 2},
            {"moe_inter_dim", 32},
            {"score_func", "sigmoid"},
            {"route_scale", 2.5},
            {"norm_eps", 1e-5},
            {"n_mtp_layers", 1},
            {"rope_theta", 10000.0},
            {"compress_rope_theta", 160000.0},
            {"rope_factor", 16},
            {"original_seq_len", 65536},
            {"beta_fast", 32},
            {"beta_slow", 1},
            {"dtype", "fp8"}};
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_EQ(c.rope_compress.original_max_position, 65536);
  EXPECT_TRUE(c.fp8_quantized);
  EXPECT_EQ(c.layers[0].moe, MoeType::kHash);
  EXPECT_EQ(c.layers[1].moe, MoeType::kScore);
  EXPECT_EQ(c.layers[1].attention, AttentionType::kCsa);
  EXPECT_EQ(c.layers[2].attention, AttentionType::kHca);
}

TEST(Config, MtpCountInferredFromTrailingRatios) {
  json j = flash_config();
  j.erase("num_nextn_predict_layers");
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->num_nextn_predict_layers, 1);
  EXPECT_EQ(r->mtp_layers.size(), 1u);
  j["num_nextn_predict_layers"] = 0;  // explicit count wins: 44 entries are then an error
  EXPECT_FALSE(parse(j).ok());
}

TEST(Config, SingleDistinctRatioFollowsDeepSeekAndEosList) {
  json j = flash_config();
  j["num_hidden_layers"] = 3;
  j["compress_ratios"] = {0, 8, 8};
  j["num_hash_layers"] = 0;
  j["num_nextn_predict_layers"] = 0;
  j["eos_token_id"] = {7, 8};
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Only ratio 4 has the overlapping compressor and the indexer in DeepSeek's reference.
  EXPECT_EQ(r->layers[1].attention, AttentionType::kHca);
  EXPECT_EQ(r->layers[2].compress_ratio, 8);
  EXPECT_EQ(r->eos_token_id, 7);
  EXPECT_TRUE(r->mtp_layers.empty());
  j["compress_ratios"] = {0, 4, 4};
  r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->layers[1].attention, AttentionType::kCsa);
  j["compress_ratios"] = {4, 8, 16};
  r = parse(j);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than two distinct"), std::string::npos);
}

struct ErrorCase {
  const char* what;
  std::function<void(json&)> mutate;
  const char* needle;
  bool transformers = false;
};

TEST(Config, Errors) {
  const ErrorCase cases[] = {
      {"missing field",
       [](json& j) { j.erase("hidden_size"); },
       "missing required field 'hidden_size'"},
      {"wrong type",
       [](json& j) { j["hidden_size"] = "4096"; },
       "'hidden_size' must be an integer"},
      {"float dim", [](json& j) { j["hidden_size"] = 40.5; }, "'hidden_size' must be an integer"},
      {"non-positive", [](json& j) { j["num_attention_heads"] = 0; }, "'num_attention_heads' = 0"},
      {"negative", [](json& j) { j["q_lora_rank"] = -3; }, "'q_lora_rank' = -3"},
      {"bool type",
       [](json& j) { j["norm_topk_prob"] = "yes"; },
       "'norm_topk_prob' must be a boolean"},
      {"double type", [](json& j) { j["rms_norm_eps"] = "x"; }, "'rms_norm_eps' must be a number"},
      {"head_dim", [](json& j) { j["head_dim"] = 64; }, "'head_dim' = 64 must be greater"},
      {"rope odd", [](json& j) { j["qk_rope_head_dim"] = 63; }, "must be even"},
      {"index small",
       [](json& j) { j["index_head_dim"] = 32; },
       "'index_head_dim' = 32 must be at least"},
      {"index pow2", [](json& j) { j["index_head_dim"] = 96; }, "power of two"},
      {"experts", [](json& j) { j["num_experts_per_tok"] = 300; }, "exceeds n_routed_experts"},
      {"o_groups", [](json& j) { j["o_groups"] = 7; }, "does not divide num_attention_heads"},
      {"scoring",
       [](json& j) { j["scoring_func"] = "relu"; },
       "'scoring_func' has unknown value 'relu'"},
      {"model_type",
       [](json& j) { j["model_type"] = "deepseek_v3"; },
       "'model_type' = 'deepseek_v3'"},
      {"kv heads", [](json& j) { j["num_key_value_heads"] = 2; }, "'num_key_value_heads' = 2"},
      {"shared", [](json& j) { j["n_shared_experts"] = 2; }, "'n_shared_experts' = 2"},
      {"tie", [](json& j) { j["tie_word_embeddings"] = true; }, "tie_word_embeddings"},
      {"act", [](json& j) { j["hidden_act"] = "gelu"; }, "'hidden_act' = 'gelu'"},
      {"ratios length",
       [](json& j) {
         j["compress_ratios"] = {0, 4, 128};
       },
       "'compress_ratios' has 3 entries"},
      {"ratios type",
       [](json& j) { j["compress_ratios"] = "0,4"; },
       "'compress_ratios' must be a list"},
      {"ratio negative",
       [](json& j) { j["compress_ratios"][5] = -4; },
       "'compress_ratios[5]' = -4"},
      {"ratio entry type",
       [](json& j) { j["compress_ratios"][5] = "4"; },
       "'compress_ratios[5]' must be an integer"},
      {"mtp ratio", [](json& j) { j["compress_ratios"][43] = 4; }, "MTP layers must be sliding"},
      {"no schedule",
       [](json& j) { j.erase("compress_ratios"); },
       "missing required field 'compress_ratios'"},
      {"hash too many",
       [](json& j) { j["num_hash_layers"] = 50; },
       "'num_hash_layers' = 50 exceeds"},
      {"quant method",
       [](json& j) { j["quantization_config"]["quant_method"] = "gptq"; },
       "'quantization_config.quant_method' = 'gptq'"},
      {"quant block",
       [](json& j) {
         j["quantization_config"]["weight_block_size"] = {64, 64};
       },
       "weight_block_size"},
      {"quant type",
       [](json& j) { j["quantization_config"] = "fp8"; },
       "'quantization_config' must be an object"},
      {"rope type",
       [](json& j) { j["rope_scaling"]["type"] = "linear"; },
       "'rope_scaling.rope_type' = 'linear'"},
      {"yarn factor",
       [](json& j) { j["rope_scaling"].erase("factor"); },
       "missing required field 'rope_scaling.factor'"},
      {"yarn bad factor", [](json& j) { j["rope_scaling"]["factor"] = -1; }, "factor must be > 0"},
      {"theta", [](json& j) { j["rope_theta"] = 0; }, "rope_theta must be > 1"},
      {"huge dim",
       [](json& j) { j["hidden_size"] = int64_t{1} << 40; },
       "'hidden_size' = 1099511627776 is out of range"},
      {"eos empty",
       [](json& j) { j["eos_token_id"] = json::array(); },
       "'eos_token_id' must not be an empty list"},
      // transformers dialect
      {"layer type",
       [](json& j) { j["layer_types"][2] = "full_attention"; },
       "'layer_types[2]' has unknown layer type 'full_attention'",
       true},
      {"layer types length",
       [](json& j) { j["layer_types"].erase(4); },
       "'layer_types' has 4 entries but num_hidden_layers is 5",
       true},
      {"mlp type",
       [](json& j) { j["mlp_layer_types"][0] = "dense"; },
       "'mlp_layer_types[0]' has unknown MoE type 'dense'",
       true},
      {"mlp length",
       [](json& j) { j["mlp_layer_types"].erase(0); },
       "'mlp_layer_types' has 4 entries",
       true},
      {"compress rates",
       [](json& j) { j["compress_rates"]["heavily_compressed_attention"] = 0; },
       "'compress_rates.heavily_compressed_attention' = 0",
       true},
      {"rope main theta",
       [](json& j) { j["rope_parameters"]["main"].erase("rope_theta"); },
       "missing required field 'rope_parameters.main.rope_theta'",
       true},
      {"attention factor",
       [](json& j) { j["rope_parameters"]["compress"]["attention_factor"] = 1.277; },
       "attention_factor",
       true},
      {"partial factor",
       [](json& j) { j["partial_rotary_factor"] = 0.25; },
       "'partial_rotary_factor' = 0.25 does not match",
       true},
      {"nested partial factor",
       [](json& j) { j["rope_parameters"]["compress"]["partial_rotary_factor"] = 0.25; },
       "rope_parameters.compress.partial_rotary_factor",
       true},
      {"rope_parameters type",
       [](json& j) { j["rope_parameters"]["main"] = 3; },
       "'rope_parameters.main' must be an object",
       true},
  };
  for (const ErrorCase& ec : cases) {
    json j = ec.transformers ? json::parse(kTransformersConfig) : flash_config();
    ec.mutate(j);
    auto r = parse(j);
    ASSERT_FALSE(r.ok()) << ec.what;
    EXPECT_NE(r.status().message().find(ec.needle), std::string::npos)
        << ec.what << ": " << r.status().message();
    EXPECT_NE(r.status().message().find("cfg.json"), std::string::npos)
        << ec.what << ": " << r.status().message();
  }
}

TEST(Config, MalformedJson) {
  auto r = parse_model_config("{\"hidden_size\": 4096,", "bad/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bad/config.json: not valid JSON"), std::string::npos);
  r = parse_model_config("[1, 2]", "bad/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("must be a JSON object"), std::string::npos);
  r = parse_model_config("", "bad/config.json");
  ASSERT_FALSE(r.ok());
}

TEST(Config, LoadMissingFile) {
  auto r = load_model_config("/nonexistent/dir/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/dir/config.json"), std::string::npos);
}

TEST(Config, Names) {
  EXPECT_STREQ(attention_type_name(AttentionType::kCsa), "csa");
  EXPECT_STREQ(attention_type_name(AttentionType::kHca), "hca");
  EXPECT_STREQ(attention_type_name(AttentionType::kSliding), "sliding");
  EXPECT_STREQ(moe_type_name(MoeType::kHash), "hash");
  EXPECT_STREQ(rope_table_name(RopeTable::kCompress), "compress");
  EXPECT_STREQ(scoring_func_name(ScoringFunc::kSqrtSoftplus), "sqrtsoftplus");
}

}  // namespace
}  // namespace dsinfer::model
