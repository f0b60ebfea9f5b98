// Synthetic V4.1 checkpoints for tests (random weights, both layouts).
#include "model_v41/synthetic.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/file.h"
#include "base/strings.h"
#include "model_v41/engram.h"
#include "numeric/float_formats.h"
#include "tensor/safetensors.h"

namespace dsinfer::model_v41 {

using json = nlohmann::json;

json v41_flash_config_json() {
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 18; ++i) ratios.push_back(2);
  for (int i = 0; i < 20; ++i) ratios.push_back(1);
  for (int i = 0; i < 3; ++i) ratios.push_back(0);
  json text = {
      {"model_type", "deepseek_v41_text"},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"num_key_value_heads", 1},
      {"vocab_size", 129280},
      {"hidden_size", 5120},
      {"num_hidden_layers", 40},
      {"num_attention_heads", 64},
      {"head_dim", 512},
      {"qk_rope_head_dim", 64},
      {"q_lora_rank", 1280},
      {"o_groups", 8},
      {"o_lora_rank", 1024},
      {"rope_theta", 10000},
      {"compress_rope_theta", 160000},
      {"rope_scaling",
       {{"rope_type", "yarn"},
        {"factor", 16},
        {"original_max_position_embeddings", 65536},
        {"beta_fast", 32},
        {"beta_slow", 1}}},
      {"max_position_embeddings", 1048576},
      {"sliding_window", 128},
      {"tie_word_embeddings", false},
      {"compress_ratios", ratios},
      {"kv_source_layer_ids", {2, 8, 14, 20}},
      {"index_source_layer_ids", {2, 8, 14, 20, 24, 28, 32, 36}},
      {"candidate_source_layer_id", 20},
      {"candidate_topk_blocks", 2048},
      {"candidate_block_size", 8},
      {"index_n_heads", 32},
      {"index_head_dim", 128},
      {"index_topk", 512},
      {"moe_intermediate_size", 2304},
      {"n_routed_experts", 384},
      {"n_shared_experts", 1},
      {"num_experts_per_tok", 6},
      {"scoring_func", "sqrtsoftplus"},
      {"topk_method", "noaux_tc"},
      {"norm_topk_prob", true},
      {"routed_scaling_factor", 1.5},
      {"gate_temp", 1.0},
      {"swiglu_limit", 10.0},
      {"hc_mult", 4},
      {"hc_sinkhorn_iters", 20},
      {"hc_eps", 1e-6},
      {"rms_norm_eps", 1e-20},
      {"engram_layer_ids", {1, 14}},
      {"engram_vocab_size", 16000000},
      {"engram_num_embeddings", {384006168, 384016682}},
      {"engram_max_ngram_size", 4},
      {"engram_n_heads", 8},
      {"engram_head_dim", 256},
      {"engram_pad_token_id", 2},
      {"engram_compressed_vocab_size", 99092},
      {"num_nextn_predict_layers", 3},
      {"dspark_block_size", 5},
      {"dspark_noise_token_id", 128799},
      {"dspark_target_layer_ids", {37, 38, 39}},
      {"dspark_markov_rank", 256},
      {"dspark_n_routed_experts", 128},
      {"dspark_num_experts_per_tok", 3},
  };
  return {{"architectures", {"DeepseekV41ForCausalLM"}},
          {"model_type", "deepseek_v41"},
          {"dtype", "bfloat16"},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"pad_token_id", 2},
          {"image_token_id", 129264},
          {"quantization_config",
           {{"quant_method", "fp8"},
            {"expert_dtype", "fp4"},
            {"activation_scheme", "dynamic"},
            {"weight_block_size", {32, 32}},
            {"scale_fmt", "ue8m0"}}},
          {"text_config", text},
          {"vision_config",
           {{"hidden_size", 1024},
            {"patch_size", 14},
            {"downsample_ratio", 3},
            {"max_image_tokens", 1024},
            {"min_pixels", 295936},
            {"max_wh_ratio", nullptr}}}};
}

json v41_tiny_config_json(bool official) {
  json text = {
      {"model_type", "deepseek_v41_text"},
      {"vocab_size", 96},
      {"hidden_size", 64},
      {"num_hidden_layers", 8},
      {"num_attention_heads", 4},
      {"head_dim", 64},
      {"qk_rope_head_dim", 16},
      {"q_lora_rank", 32},
      {"o_groups", 2},
      {"o_lora_rank", 16},
      {"rope_theta", 10000},
      {"compress_rope_theta", 160000},
      {"rope_scaling",
       {{"rope_type", "yarn"},
        {"factor", 4},
        {"original_max_position_embeddings", 64},
        {"beta_fast", 32},
        {"beta_slow", 1}}},
      {"max_position_embeddings", 4096},
      {"sliding_window", 16},
      {"compress_ratios", {0, 0, 2, 2, 2, 1, 1, 1, 0}},
      {"kv_source_layer_ids", {2, 5}},
      {"index_source_layer_ids", {2, 5, 7}},
      {"candidate_source_layer_id", 5},
      {"candidate_topk_blocks", 8},
      {"candidate_block_size", 8},
      {"index_n_heads", 4},
      {"index_head_dim", 64},
      {"index_topk", 16},
      {"moe_intermediate_size", 32},
      {"n_routed_experts", 8},
      {"n_shared_experts", 1},
      {"num_experts_per_tok", 2},
      {"routed_scaling_factor", 1.5},
      {"swiglu_limit", 10.0},
      {"hc_mult", 4},
      {"hc_sinkhorn_iters", 20},
      {"hc_eps", 1e-6},
      {"rms_norm_eps", 1e-20},
      {"engram_layer_ids", {1, 3}},
      {"engram_vocab_size", 50},
      {"engram_max_ngram_size", 3},
      {"engram_n_heads", 2},
      {"engram_head_dim", 32},
      {"engram_pad_token_id", 2},
      {"engram_compressed_vocab_size", 96},
      {"num_nextn_predict_layers", 1},
      {"dspark_target_layer_ids", {7}},
      {"dspark_markov_rank", 32},
      {"dspark_n_routed_experts", 4},
      {"dspark_num_experts_per_tok", 2},
      {"dspark_noise_token_id", 95},
  };
  if (!official) {
    return text;
  }
  json top = v41_flash_config_json();
  top["text_config"] = text;
  return top;
}

std::vector<V41TensorSpec> v41_official_tensors(const V41Config& c, bool with_dspark) {
  std::vector<V41TensorSpec> out;
  auto add = [&](const std::string& n, DType t, std::vector<int64_t> s) {
    out.push_back({n, t, std::move(s)});
  };
  auto fp8 = [&](const std::string& base, int64_t r, int64_t k) {
    add(base + ".weight", DType::kF8E4M3, {r, k});
    add(base + ".scale", DType::kF8E8M0, {(r + 31) / 32, (k + 31) / 32});
  };
  auto fp4 = [&](const std::string& base, int64_t r, int64_t k) {
    add(base + ".weight", DType::kI8, {r, k / 2});
    add(base + ".scale", DType::kF8E8M0, {r, k / 32});
  };
  const int64_t h = c.hidden_size, hd = c.head_dim, hc = c.hc_mult, inter = c.moe_intermediate_size;
  auto block = [&](const std::string& p, int l, bool dspark) {
    add(p + "attn_norm.weight", DType::kBF16, {h});
    add(p + "ffn_norm.weight", DType::kBF16, {h});
    for (const char* w : {"attn", "ffn"}) {
      add(p + "hc_" + w + "_fn", DType::kF32, {c.hc_mix_dim(), hc * h});
      add(p + "hc_" + w + "_base", DType::kF32, {c.hc_mix_dim()});
      add(p + "hc_" + w + "_scale", DType::kF32, {3});
    }
    const std::string a = p + "attn.";
    fp8(a + "wq_a", c.q_lora_rank, h);
    add(a + "q_norm.weight", DType::kBF16, {c.q_lora_rank});
    fp8(a + "wq_b", c.num_attention_heads * hd, c.q_lora_rank);
    fp8(a + "wkv", hd, h);
    add(a + "kv_norm.weight", DType::kBF16, {hd});
    fp8(a + "wo_a", c.o_groups * c.o_lora_rank, c.num_attention_heads * hd / c.o_groups);
    fp8(a + "wo_b", h, c.o_groups * c.o_lora_rank);
    add(a + "attn_sink", DType::kF32, {c.num_attention_heads});
    if (!dspark) {
      const V41LayerPlan& pl = c.layers[static_cast<size_t>(l)];
      if (c.is_kv_owner(l)) {
        add(a + "compressor.wkv.weight", DType::kBF16, {hd, h});
        if (pl.compress_ratio > 1) {
          add(a + "compressor.wgate.weight", DType::kBF16, {hd, h});
        }
        add(a + "compressor.norm.weight", DType::kBF16, {hd});
      }
      if (pl.compress_ratio > 0 && pl.topk_source == l) {
        fp8(a + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
        add(a + "indexer.weights_proj.weight", DType::kBF16, {c.index_n_heads, h});
        if (std::find(c.index_k_source_layer_ids.begin(), c.index_k_source_layer_ids.end(), l) !=
            c.index_k_source_layer_ids.end()) {
          add(a + "indexer.wk.weight", DType::kBF16, {c.index_head_dim, hd});
          add(a + "indexer.k_norm.weight", DType::kBF16, {c.index_head_dim});
        }
      }
      if (pl.engram) {
        const int64_t rows = c.engram_rows[static_cast<size_t>(pl.engram_index)];
        add(p + "engram.embed.weight", DType::kF8E4M3, {rows, c.engram_head_dim});
        add(p + "engram.embed.scale", DType::kF8E8M0, {rows, c.engram_head_dim / 32});
        fp8(p + "engram.wkv", h * (hc + 1), c.engram_hash_cols() * c.engram_head_dim);
        add(p + "engram.q_weight", DType::kBF16, {hc, h});
        add(p + "engram.k_weight", DType::kBF16, {hc, h});
      }
    }
    const int64_t ne = dspark ? c.dspark_n_routed_experts : c.n_routed_experts;
    add(p + "ffn.gate.weight", DType::kBF16, {ne, h});
    add(p + "ffn.gate.bias", DType::kF32, {ne});
    add(p + "ffn.gate.bias_vl", DType::kF32, {ne});
    for (int64_t e = 0; e < ne; ++e) {
      const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
      fp4(ep + "w1", inter, h);
      fp4(ep + "w3", inter, h);
      fp4(ep + "w2", h, inter);
    }
    fp8(p + "ffn.shared_experts.w1", inter, h);
    fp8(p + "ffn.shared_experts.w3", inter, h);
    fp8(p + "ffn.shared_experts.w2", h, inter);
  };
  add("embed.weight", DType::kBF16, {c.vocab_size, h});
  add("head.weight", DType::kBF16, {c.vocab_size, h});
  add("norm.weight", DType::kBF16, {h});
  for (int l = 0; l < c.num_hidden_layers; ++l)
    block("layers." + std::to_string(l) + ".", l, false);
  if (with_dspark && c.num_nextn_predict_layers > 0) {
    for (int64_t b = 0; b < c.num_nextn_predict_layers; ++b) {
      block("mtp." + std::to_string(b) + ".", -1, true);
    }
    fp8("mtp.0.main_proj", h, static_cast<int64_t>(c.dspark_target_layer_ids.size()) * h);
    add("mtp.0.main_norm.weight", DType::kBF16, {h});
    const std::string last = "mtp." + std::to_string(c.num_nextn_predict_layers - 1) + ".";
    add(last + "norm.weight", DType::kBF16, {h});
    add(last + "markov_head.embed.weight", DType::kBF16, {c.vocab_size, c.dspark_markov_rank});
    add(last + "markov_head.head.weight", DType::kBF16, {c.vocab_size, c.dspark_markov_rank});
    add(last + "confidence_head.proj.weight", DType::kBF16, {1, h + c.dspark_markov_rank});
  }
  return out;
}

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>((next() >> 40) * (1.0 / 16777216.0)); }  // [0,1)
  float normal() {
    float a = 0;
    for (int i = 0; i < 4; ++i) a += uniform();
    return (a - 2.0f) * 1.7320508f;
  }
};

std::vector<uint8_t> random_bytes(const V41TensorSpec& t, Rng* rng) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  std::vector<uint8_t> b(static_cast<size_t>(n * dtype_size(t.dtype)));
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::kF8E8M0:
        b[static_cast<size_t>(i)] = static_cast<uint8_t>(127 - 6 + (rng->next() % 3));
        break;
      case DType::kF8E4M3:
        b[static_cast<size_t>(i)] = numeric::f32_to_fp8_e4m3(rng->normal() * 2.0f);
        break;
      case DType::kI8:
        b[static_cast<size_t>(i)] = static_cast<uint8_t>(rng->next() & 0x77);  // |v| <= 6 nibbles
        break;
      case DType::kBF16: {
        const float base = str_ends_with(t.name, "norm.weight") ? 1.0f : 0.0f;
        const uint16_t v = numeric::f32_to_bf16(rng->normal() * 0.1f + base);
        std::memcpy(&b[static_cast<size_t>(2 * i)], &v, 2);
        break;
      }
      case DType::kF32: {
        const float v = rng->normal() * 0.1f;
        std::memcpy(&b[static_cast<size_t>(4 * i)], &v, 4);
        break;
      }
      default:
        break;
    }
  }
  return b;
}

std::string transformers_name(const std::string& canon) {
  if (str_starts_with(canon, "mtp.")) {
    return canon;
  }
  if (canon == "head.weight") {
    return "lm_head.weight";
  }
  return "model." + canon;
}

}  // namespace

Status write_v41_synthetic(const V41SyntheticSpec& spec, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return io_error(dir + ": " + ec.message());
  }
  const std::string text = spec.config.dump(2);
  DSI_ASSIGN_OR_RETURN(V41Config c, parse_v41_config(text, "synthetic config"));
  {
    std::ofstream f(dir + "/config.json");
    f << text << "\n";
    if (!f) {
      return io_error(dir + "/config.json: cannot write");
    }
  }
  Rng rng{spec.seed};
  std::vector<TensorToWrite> tensors;
  for (const V41TensorSpec& t : v41_official_tensors(c, spec.with_dspark)) {
    if (spec.layout == V41Layout::kOfficial) {
      tensors.push_back({t.name, t.dtype, t.shape, random_bytes(t, &rng)});
      continue;
    }
    // Transformers layout: dense float tensors; `.scale` tensors disappear (the port keeps an
    // all-ones Engram scale parameter next to its float table).
    if (str_ends_with(t.name, ".scale") && !str_ends_with(t.name, "engram.embed.scale")) {
      continue;
    }
    V41TensorSpec f = t;
    f.dtype = DType::kF32;
    if (t.dtype == DType::kI8) {
      f.shape[1] *= 2;
    }
    if (str_ends_with(t.name, "engram.embed.scale")) {
      int64_t n = f.shape[0] * f.shape[1];
      tensors.push_back(f32_tensor(
          transformers_name(t.name), f.shape, std::vector<float>(static_cast<size_t>(n), 1.0f)));
      continue;
    }
    tensors.push_back({transformers_name(t.name), f.dtype, f.shape, random_bytes(f, &rng)});
  }
  if (spec.with_vision) {
    auto v = [&](const std::string& n, std::vector<int64_t> s) {
      V41TensorSpec t{n, DType::kBF16, s};
      tensors.push_back({n, DType::kBF16, s, random_bytes(t, &rng)});
    };
    v("vision.patch_embed.proj.weight", {16, 588});
    v("vision.norm.weight", {16});
    v("aligner.w1.weight", {c.hidden_size, 16});
    v("image_newline", {c.hidden_size});
  }
  return write_safetensors(dir + "/model.safetensors", tensors);
}

}  // namespace dsinfer::model_v41

namespace dsinfer::model_v41 {

Result<nlohmann::json> v41_flash_preset_config(int layers, bool real_engram_rows) {
  if (layers < 4 || layers > 40) {
    return invalid_argument("v4.1-flash keeps both YOCO halves: --layers must be in [4, 40], got " +
                            std::to_string(layers));
  }
  json j = v41_flash_config_json();
  json& t = j["text_config"];
  const int producers = std::max(1, static_cast<int>(std::lround((layers - 2) * 18.0 / 38.0)));
  const int boundary = 2 + producers;
  if (boundary >= layers) {
    return invalid_argument("--layers " + std::to_string(layers) + " leaves no consumer layer");
  }
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < producers; ++i) ratios.push_back(2);
  for (int i = boundary; i < layers; ++i) ratios.push_back(1);
  for (int i = 0; i < 3; ++i) ratios.push_back(0);
  std::vector<int> kv;
  for (int s : {2, 8, 14}) {
    if (s < boundary) {
      kv.push_back(s);
    }
  }
  kv.push_back(boundary);
  std::vector<int> index = kv;
  for (int l = boundary + 4; l < layers; l += 4) index.push_back(l);
  std::vector<int> engram = {1};
  if (std::min(14, boundary - 1) > 1) {
    engram.push_back(std::min(14, boundary - 1));
  }
  std::vector<int> targets;
  for (int l = std::max(boundary, layers - 3); l < layers; ++l) targets.push_back(l);
  t["num_hidden_layers"] = layers;
  t["compress_ratios"] = ratios;
  t["kv_source_layer_ids"] = kv;
  t["index_source_layer_ids"] = index;
  t["candidate_source_layer_id"] = boundary;
  t["engram_layer_ids"] = engram;
  t["dspark_target_layer_ids"] = targets;
  if (!real_engram_rows || engram != std::vector<int>{1, 14}) {
    t.erase("engram_num_embeddings");  // recomputed from the primes
  }
  if (!real_engram_rows) {
    t["engram_vocab_size"] = 1000;
  }
  return j;
}

namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t name_key(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return mix64(seed ^ h);
}

// Approximately N(0, 1) from one 64-bit hash (sum of four 16-bit lanes).
float approx_normal(uint64_t h) {
  const float s = static_cast<float>(h & 0xffffu) + static_cast<float>((h >> 16) & 0xffffu) +
                  static_cast<float>((h >> 32) & 0xffffu) + static_cast<float>(h >> 48);
  return (s - 131070.0f) * (1.7320508075688772f / 65536.0f);
}

// Bytes of rows [r0, r1) of a tensor (row = the first dimension).
void gen_rows(
    const V41TensorSpec& t, uint64_t key, int64_t r0, int64_t r1, std::vector<uint8_t>* out) {
  const int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
  const int64_t es = dtype_size(t.dtype);
  out->resize(static_cast<size_t>((r1 - r0) * cols * es));
  const bool norm = str_ends_with(t.name, "norm.weight") || str_ends_with(t.name, "_weight");
  for (int64_t r = r0; r < r1; ++r) {
    const uint64_t rk = mix64(key + static_cast<uint64_t>(r) * 0xd1b54a32d192ed03ull);
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t h = mix64(rk + static_cast<uint64_t>(c + 1) * 0x9e3779b97f4a7c15ull);
      uint8_t* o = out->data() + ((r - r0) * cols + c) * es;
      switch (t.dtype) {
        case DType::kF8E8M0:
          // Weights: tile / block scales around 2^-6 (with E4M3 / E2M1 codes of RMS ~1-2 this
          // gives weights of RMS ~0.02); jittered by one binade.
          *o = static_cast<uint8_t>(127 - 6 - 1 + static_cast<int>(h % 3));
          break;
        case DType::kF8E4M3:
          *o = numeric::f32_to_fp8_e4m3(approx_normal(h));
          break;
        case DType::kI8: {
          const uint8_t lo = static_cast<uint8_t>(h & 0xf),
                        hi = static_cast<uint8_t>((h >> 4) & 0xf);
          *o = static_cast<uint8_t>((lo & 0x7) == 7 ? lo & 0xd : lo) |
               static_cast<uint8_t>(((hi & 0x7) == 7 ? hi & 0xd : hi) << 4);
          break;
        }
        case DType::kBF16: {
          const float v = norm ? 1.0f + 0.05f * approx_normal(h) : 0.02f * approx_normal(h);
          const uint16_t b = numeric::f32_to_bf16(v);
          std::memcpy(o, &b, 2);
          break;
        }
        case DType::kF32: {
          const float v = 0.05f * approx_normal(h);
          std::memcpy(o, &v, 4);
          break;
        }
        default:
          break;
      }
    }
  }
}

}  // namespace

Status write_v41_streaming(const json& config_json,
                           uint64_t seed,
                           int threads,
                           const std::string& dir,
                           V41StreamStats* stats) {
  const std::string text = config_json.dump(2);
  DSI_ASSIGN_OR_RETURN(V41Config c, parse_v41_config(text, "preset config"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return io_error(dir + ": " + ec.message());
  }
  {
    std::ofstream f(dir + "/config.json");
    f << text << "\n";
    if (!f) {
      return io_error(dir + "/config.json: cannot write");
    }
  }
  // Shards: globals, one per layer, one per DSpark block (its head tensors with it).
  std::vector<std::pair<std::string, std::vector<V41TensorSpec>>> shards;
  auto shard_of = [&](const std::string& name) -> std::string {
    if (str_starts_with(name, "layers.")) {
      return "layer-" + name.substr(7, name.find('.', 7) - 7);
    }
    if (str_starts_with(name, "mtp.")) {
      return "mtp-" + name.substr(4, name.find('.', 4) - 4);
    }
    return "globals";
  };
  for (const V41TensorSpec& t : v41_official_tensors(c, true)) {
    const std::string s = shard_of(t.name);
    if (shards.empty() || shards.back().first != s) {
      shards.push_back({s, {}});
    }
    shards.back().second.push_back(t);
  }
  const int n_threads = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  json weight_map = json::object();
  uint64_t total = 0;
  const int nfiles = static_cast<int>(shards.size());
  for (int f = 0; f < nfiles; ++f) {
    // A plain reference, not a structured binding: the writer threads' lambda captures it
    // (clang before 16 cannot capture structured bindings).
    const auto& tensors = shards[static_cast<size_t>(f)].second;
    char fname[64];
    std::snprintf(fname, sizeof(fname), "model-%05d-of-%05d.safetensors", f + 1, nfiles);
    std::vector<TensorSpec> specs;
    for (const auto& t : tensors) {
      specs.push_back({t.name, t.dtype, t.shape});
      weight_map[t.name] = fname;
    }
    DSI_ASSIGN_OR_RETURN(auto w, SafetensorsWriter::create(dir + "/" + fname, specs));
    // Work items: row ranges of at most ~8 MB.
    struct Item {
      size_t tensor;
      int64_t r0, r1;
    };
    std::vector<Item> items;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      const int64_t rows = t.shape[0];
      const int64_t row_bytes =
          std::max<int64_t>(1, w->tensor_bytes(i) / std::max<int64_t>(1, rows));
      const int64_t step = std::max<int64_t>(1, (int64_t{8} << 20) / row_bytes);
      for (int64_t r = 0; r < rows; r += step) items.push_back({i, r, std::min(rows, r + step)});
    }
    std::atomic<size_t> next{0};
    std::vector<Status> errors(static_cast<size_t>(n_threads), Status::ok_status());
    std::vector<std::thread> pool;
    for (int k = 0; k < n_threads; ++k) {
      pool.emplace_back([&, k] {
        std::vector<uint8_t> buf;
        for (size_t it = next++; it < items.size(); it = next++) {
          const Item& item = items[it];
          const V41TensorSpec& t = tensors[item.tensor];
          gen_rows(t, name_key(seed, t.name), item.r0, item.r1, &buf);
          const int64_t row_bytes = static_cast<int64_t>(buf.size()) / (item.r1 - item.r0);
          Status s = w->write(
              item.tensor, item.r0 * row_bytes, buf.data(), static_cast<int64_t>(buf.size()));
          if (!s.ok()) {
            errors[static_cast<size_t>(k)] = s;
            return;
          }
        }
      });
    }
    for (auto& th : pool) th.join();
    for (const Status& s : errors) DSI_RETURN_IF_ERROR(s);
    DSI_RETURN_IF_ERROR(w->finish());
    total += w->file_bytes();
    if (stats) {
      stats->files += 1;
      stats->tensors += static_cast<int64_t>(tensors.size());
      stats->bytes += w->file_bytes();
    }
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream f(dir + "/model.safetensors.index.json");
  f << index.dump(1) << "\n";
  if (!f) {
    return io_error(dir + "/model.safetensors.index.json: cannot write");
  }
  // No tokenizer to derive phi from: a synthetic map, so that the backends can open the directory.
  if (!c.engram_layer_ids.empty()) {
    DSI_ASSIGN_OR_RETURN(std::vector<int32_t> phi, synthetic_engram_token_map(c, seed));
    DSI_RETURN_IF_ERROR(write_engram_token_map(dir + "/engram_token_map.json", phi, c));
  }
  return Status::ok_status();
}

}  // namespace dsinfer::model_v41
