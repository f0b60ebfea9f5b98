// ModelConfig: the DeepSeek V4 hyper-parameters parsed and validated from config.json, in either
// dialect (official DeepSeek: compress_ratios / num_hash_layers / rope_scaling /
// qk_rope_head_dim / quantization_config; transformers: layer_types / mlp_layer_types /
// compress_rates / rope_parameters{main,compress}), plus the derived per-layer plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace dsinfer::model {

enum class AttentionType { kSliding, kCsa, kHca };
enum class MoeType { kHash, kScore };
enum class RopeTable { kMain, kCompress };
enum class ScoringFunc { kSqrtSoftplus, kSigmoid, kSoftmax };
enum class ConfigDialect { kDeepSeek, kTransformers };

const char* attention_type_name(AttentionType t);  // "sliding" / "csa" / "hca"
const char* moe_type_name(MoeType t);              // "hash" / "score"
const char* rope_table_name(RopeTable t);          // "main" / "compress"
const char* scoring_func_name(ScoringFunc f);

struct RopeParams {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;                // YaRN scale factor
  int64_t original_max_position = 0;  // YaRN original context
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct LayerPlan {
  AttentionType attention = AttentionType::kSliding;
  int compress_ratio = 0;  // 0 sliding, CSA ratio (4) or HCA ratio (128)
  RopeTable rope = RopeTable::kMain;
  MoeType moe = MoeType::kScore;
};

struct ModelConfig {
  ConfigDialect dialect = ConfigDialect::kDeepSeek;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 1;
  int64_t head_dim = 0;
  int64_t qk_rope_head_dim = 0;  // RoPE on the last qk_rope_head_dim dims of each head
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t sliding_window = 0;  // raw-KV window including the current token
  int64_t max_position_embeddings = 0;
  RopeParams rope_main;      // sliding-only layers (and MTP)
  RopeParams rope_compress;  // CSA / HCA layers (YaRN when configured)
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 1;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  ScoringFunc scoring_func = ScoringFunc::kSqrtSoftplus;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double swiglu_limit = 0.0;  // 0 = no clamp
  int64_t num_nextn_predict_layers = 0;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  bool fp8_quantized = false;  // quantization_config declares fp8 128x128 weights

  std::vector<LayerPlan> layers;      // one per main decoder layer
  std::vector<LayerPlan> mtp_layers;  // one per MTP block (sliding attention, score MoE)

  int64_t nope_head_dim() const { return head_dim - qk_rope_head_dim; }
  int64_t hc_mix_dim() const { return (2 + hc_mult) * hc_mult; }
};

// Parses config.json text. `source` names the file in error messages.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
// Reads and parses a config.json file.
Result<ModelConfig> load_model_config(const std::string& path);

// YaRN/plain inverse frequencies for one table: rope_dim/2 entries, fp32 as transformers
// computes them (spec §3.4).
std::vector<float> rope_inv_freq(const RopeParams& p, int64_t rope_dim);

}  // namespace dsinfer::model
