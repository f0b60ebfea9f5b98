// V41Config: the DeepSeek V4.1 hyper-parameters parsed and validated from config.json (spec
// deepseek-v41.md §1), in the three forms a V4.1 checkpoint carries: the official composite config
// (`model_type: deepseek_v41`, `text_config` + `vision_config`, top-level `quantization_config`),
// the transformers port's composite config (same model type, written by save_pretrained) and its
// text-only config (`model_type: deepseek_v41_text`, flat). Plus the derived layer schedule: the
// YOCO boundary, the KV / top-k / index-key / candidate maps (§2.1) and the role of every layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"

namespace dsinfer::model_v41 {

using model::RopeParams;

enum class V41ConfigForm { kOfficial, kTransformersComposite, kTransformersText };
const char* config_form_name(V41ConfigForm f);

// What a layer does in the CSA2 schedule (§2.2).
enum class LayerRole {
  kWindow,   // ratio 0: sliding window only
  kFull,     // KV owner and index source: compressor, index keys, indexer
  kReindex,  // index source that is not a KV owner: own queries, scores the owner's keys
  kReuse,    // reads its KV owner's cache and the nearest index source's top-k
};
const char* layer_role_name(LayerRole r);

struct V41LayerPlan {
  int compress_ratio = 0;  // 0 window only, 2 (encoder) or 1 (decoder)
  model::RopeTable rope = model::RopeTable::kMain;
  LayerRole role = LayerRole::kWindow;
  bool producer = true;      // below the YOCO boundary
  int kv_owner = -1;         // whose compressed-KV cache the layer reads; -1 for ratio 0
  int topk_source = -1;      // whose top-k list the layer uses; -1 for ratio 0
  int index_key_owner = -1;  // whose index-key cache its top-k source scores; -1 for ratio 0
  bool candidate_source = false;
  bool uses_candidates = false;  // a Reindex layer after the candidate source
  bool engram = false;
  int engram_index = -1;  // position in engram_layer_ids
};

struct V41Config {
  V41ConfigForm form = V41ConfigForm::kOfficial;
  // Top level (official / composite).
  int64_t image_token_id = 129264;
  bool quantized = false;  // quantization_config present (fp8 32x32 ue8m0, fp4 experts)
  std::string tokenizer_compatibility = "release";
  bool has_vision_config = false;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t sliding_window = 0;
  int64_t max_position_embeddings = 0;
  RopeParams rope_main;
  RopeParams rope_compress;
  std::vector<int> compress_ratios;  // backbone entries only (the DSpark tail is checked to be 0)
  std::vector<int> kv_source_layer_ids;
  std::vector<int> index_source_layer_ids;
  std::vector<int> index_k_source_layer_ids;
  int candidate_source_layer_id = -1;  // -1: no two-level top-k
  int64_t candidate_topk_blocks = 0;
  int64_t candidate_block_size = 0;
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 1;
  int64_t num_experts_per_tok = 0;
  double routed_scaling_factor = 1.0;
  double gate_temp = 1.0;  // read by the transformers port only (DeepInfer ignores it)
  double swiglu_limit = 0.0;
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-20;
  // Engram.
  std::vector<int> engram_layer_ids;
  int64_t engram_vocab_size = 0;
  std::vector<int64_t> engram_num_embeddings;  // declared; checked against the primes
  int64_t engram_max_ngram_size = 4;
  int64_t engram_n_heads = 8;
  int64_t engram_head_dim = 256;
  int64_t engram_pad_token_id = 2;
  int64_t engram_compressed_vocab_size = 0;
  // DSpark.
  int64_t num_nextn_predict_layers = 0;
  int64_t dspark_block_size = 5;
  int64_t dspark_noise_token_id = 0;
  std::vector<int> dspark_target_layer_ids;
  int64_t dspark_markov_rank = 0;
  int64_t dspark_n_routed_experts = 0;
  int64_t dspark_num_experts_per_tok = 0;
  bool use_fp4_sparse_kv = true;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  int64_t pad_token_id = 2;

  // Derived.
  int yoco_boundary = -1;  // first layer with ratio 1 (== num_hidden_layers when none)
  std::vector<V41LayerPlan> layers;
  std::vector<std::vector<int64_t>> engram_primes;  // per Engram layer: (n-1)*heads primes
  std::vector<int64_t> engram_rows;                 // per Engram layer: sum of its primes

  int64_t nope_head_dim() const { return head_dim - qk_rope_head_dim; }
  int64_t hc_mix_dim() const { return (2 + hc_mult) * hc_mult; }
  int64_t engram_hash_cols() const { return (engram_max_ngram_size - 1) * engram_n_heads; }
  bool is_kv_owner(int l) const;
};

// Parses config.json text; `source` names the file in messages. Every error names the field.
Result<V41Config> parse_v41_config(const std::string& json_text, const std::string& source);
Result<V41Config> load_v41_config(const std::string& path);
// True when a config.json's model_type (top level, or text_config's) is a V4.1 one.
bool is_v41_config_text(const std::string& json_text);

// The Engram bucket primes (§4.1): for each Engram layer, each n-gram order 2..N, each head, the
// next prime after a start value never used before; the start is engram_vocab_size - 1 at each
// order and the previous prime within an order.
std::vector<std::vector<int64_t>> engram_primes(int64_t vocab_size,
                                                int64_t n_layers,
                                                int64_t max_ngram,
                                                int64_t n_heads);
bool is_prime_u64(uint64_t n);

}  // namespace dsinfer::model_v41
