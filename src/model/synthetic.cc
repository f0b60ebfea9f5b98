// Synthetic DeepSeek V4 checkpoints with random weights (official layout, DeepSeek dialect).
#include "model/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "numeric/float_formats.h"
#include "numeric/quant.h"
#include "tensor/safetensors.h"

namespace dsinfer::model {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// splitmix64 stream + Box-Muller: deterministic on every platform (std:: distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double t = 2.0 * 3.14159265358979323846 * u2;
    spare_ = static_cast<float>(r * std::sin(t));
    have_spare_ = true;
    return static_cast<float>(r * std::cos(t));
  }

 private:
  uint64_t s_;
  bool have_spare_ = false;
  float spare_ = 0.0f;
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

enum class Storage { kBf16, kF32, kFp8, kMxfp4, kTid2eid };

struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;  // logical shape ([rows, cols] for matrices)
  Storage storage = Storage::kBf16;
  float mean = 0.0f;
  float stddev = 1.0f;
  int64_t id_range = 0;  // kTid2eid: ids are drawn from [0, id_range)
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string scale_name_for(const std::string& weight) {
  return str_ends_with(weight, ".weight") ? weight.substr(0, weight.size() - 7) + ".scale"
                                          : weight + ".scale";
}

// Every tensor of the checkpoint, in a stable order.
class Planner {
 public:
  Planner(const ModelConfig& c, bool quantized) : c_(c), q_(quantized) {}

  std::vector<TensorPlan> plan(bool with_mtp) {
    const int64_t h = c_.hidden_size;
    matrix("embed.weight", c_.vocab_size, h, false, 1.0f);
    matrix("head.weight", c_.vocab_size, h, false);
    norm("norm.weight", h);
    hyper_head("");
    for (size_t l = 0; l < c_.layers.size(); ++l) {
      layer("layers." + std::to_string(l) + ".", c_.layers[l]);
    }
    if (with_mtp) {
      for (size_t i = 0; i < c_.mtp_layers.size(); ++i) {
        const std::string p = "mtp." + std::to_string(i) + ".";
        matrix(p + "e_proj.weight", h, h, q_);
        matrix(p + "h_proj.weight", h, h, q_);
        norm(p + "enorm.weight", h);
        norm(p + "hnorm.weight", h);
        norm(p + "norm.weight", h);
        hyper_head(p);
        layer(p, c_.mtp_layers[i]);
      }
    }
    return std::move(out_);
  }

 private:
  void add(std::string name,
           std::vector<int64_t> shape,
           Storage s,
           float mean,
           float sd,
           int64_t id_range = 0) {
    out_.push_back({std::move(name), std::move(shape), s, mean, sd, id_range});
  }
  // fp8: FP8 when quantizing; stddev defaults to 1/sqrt(fan_in).
  void matrix(const std::string& name, int64_t rows, int64_t cols, bool fp8, float sd = 0.0f) {
    if (sd == 0.0f) {
      sd = 1.0f / std::sqrt(static_cast<float>(cols));
    }
    add(name, {rows, cols}, fp8 ? Storage::kFp8 : Storage::kBf16, 0.0f, sd);
  }
  void norm(const std::string& name, int64_t n) { add(name, {n}, Storage::kBf16, 1.0f, 0.05f); }
  void f32(const std::string& name, std::vector<int64_t> shape, float mean, float sd) {
    add(name, std::move(shape), Storage::kF32, mean, sd);
  }
  void hyper_conn(const std::string& p, const char* which) {
    const int64_t hc = c_.hc_mult;
    f32(p + "hc_" + which + "_fn", {c_.hc_mix_dim(), hc * c_.hidden_size}, 0.0f, 0.01f);
    f32(p + "hc_" + which + "_base", {c_.hc_mix_dim()}, 0.0f, 0.1f);
    f32(p + "hc_" + which + "_scale", {3}, 1.0f, 0.1f);
  }
  void hyper_head(const std::string& p) {
    const int64_t hc = c_.hc_mult;
    f32(p + "hc_head_fn", {hc, hc * c_.hidden_size}, 0.0f, 0.01f);
    f32(p + "hc_head_base", {hc}, 0.0f, 0.1f);
    f32(p + "hc_head_scale", {1}, 1.0f, 0.1f);
  }
  void compressor(const std::string& p, int64_t ratio, int64_t d, bool overlap) {
    const int64_t w = overlap ? 2 * d : d;
    matrix(p + "wkv.weight", w, c_.hidden_size, false);
    matrix(p + "wgate.weight", w, c_.hidden_size, false);
    f32(p + "ape", {ratio, w}, 0.0f, 0.1f);
    norm(p + "norm.weight", d);
  }
  void layer(const std::string& p, const LayerPlan& plan) {
    const int64_t h = c_.hidden_size;
    const int64_t hd = c_.head_dim;
    const int64_t heads = c_.num_attention_heads;
    norm(p + "attn_norm.weight", h);
    norm(p + "ffn_norm.weight", h);
    hyper_conn(p, "attn");
    hyper_conn(p, "ffn");
    const std::string a = p + "attn.";
    matrix(a + "wq_a.weight", c_.q_lora_rank, h, q_);
    norm(a + "q_norm.weight", c_.q_lora_rank);
    matrix(a + "wq_b.weight", heads * hd, c_.q_lora_rank, q_);
    matrix(a + "wkv.weight", hd, h, q_);
    norm(a + "kv_norm.weight", hd);
    matrix(a + "wo_a.weight", c_.o_groups * c_.o_lora_rank, heads * hd / c_.o_groups, q_);
    matrix(a + "wo_b.weight", h, c_.o_groups * c_.o_lora_rank, q_);
    f32(a + "attn_sink", {heads}, 0.0f, 0.5f);
    if (plan.attention == AttentionType::kCsa) {
      compressor(a + "compressor.", plan.compress_ratio, hd, true);
      matrix(a + "indexer.wq_b.weight", c_.index_n_heads * c_.index_head_dim, c_.q_lora_rank, q_);
      matrix(a + "indexer.weights_proj.weight", c_.index_n_heads, h, false);
      compressor(a + "indexer.compressor.", plan.compress_ratio, c_.index_head_dim, true);
    } else if (plan.attention == AttentionType::kHca) {
      compressor(a + "compressor.", plan.compress_ratio, hd, false);
    }
    const std::string f = p + "ffn.";
    matrix(f + "gate.weight", c_.n_routed_experts, h, false);
    if (plan.moe == MoeType::kScore) {
      f32(f + "gate.bias", {c_.n_routed_experts}, 0.0f, 0.01f);
    } else {
      add(f + "gate.tid2eid",
          {c_.vocab_size, c_.num_experts_per_tok},
          Storage::kTid2eid,
          0.0f,
          0.0f,
          c_.n_routed_experts);
    }
    const int64_t inter = c_.moe_intermediate_size;
    for (int64_t e = 0; e < c_.n_routed_experts; ++e) {
      const std::string ep = f + "experts." + std::to_string(e) + ".";
      const Storage s = q_ ? Storage::kMxfp4 : Storage::kBf16;
      add(ep + "w1.weight", {inter, h}, s, 0.0f, 1.0f / std::sqrt(static_cast<float>(h)));
      add(ep + "w2.weight", {h, inter}, s, 0.0f, 1.0f / std::sqrt(static_cast<float>(inter)));
      add(ep + "w3.weight", {inter, h}, s, 0.0f, 1.0f / std::sqrt(static_cast<float>(h)));
    }
    matrix(f + "shared_experts.w1.weight", inter, h, q_);
    matrix(f + "shared_experts.w2.weight", h, inter, q_);
    matrix(f + "shared_experts.w3.weight", inter, h, q_);
  }

  const ModelConfig& c_;
  bool q_;
  std::vector<TensorPlan> out_;
};

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) {
    std::memcpy(b.data(), v.data(), b.size());
  }
  return b;
}

// Generates one planned tensor (plus its scale for quantised formats).
void materialise(const TensorPlan& p,
                 uint64_t seed,
                 std::vector<TensorToWrite>* out,
                 std::map<std::string, std::vector<float>>* values) {
  Rng rng(seed ^ fnv1a(p.name));
  const int64_t n = numel_of(p.shape);
  if (p.storage == Storage::kTid2eid) {
    const int64_t rows = p.shape[0], k = p.shape[1];
    // k distinct expert ids per token (partial Fisher-Yates).
    const int64_t experts = p.id_range;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::vector<int32_t> perm(static_cast<size_t>(experts));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t e = 0; e < experts; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      for (int64_t j = 0; j < k; ++j) {
        const auto pick = j + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(experts - j));
        std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(pick)]);
        ids[static_cast<size_t>(r * k + j)] = perm[static_cast<size_t>(j)];
      }
    }
    out->push_back({p.name, DType::kI32, p.shape, as_bytes(ids)});
    return;
  }
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = p.mean + p.stddev * rng.normal();
  std::vector<float> stored(v.size());
  switch (p.storage) {
    case Storage::kF32:
      out->push_back(f32_tensor(p.name, p.shape, v));
      stored = v;
      break;
    case Storage::kBf16: {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        h[i] = numeric::f32_to_bf16(v[i]);
        stored[i] = numeric::bf16_to_f32(h[i]);
      }
      out->push_back({p.name, DType::kBF16, p.shape, as_bytes(h)});
      break;
    }
    case Storage::kFp8: {
      const int64_t rows = p.shape[0], cols = p.shape[1];
      const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
      std::vector<uint8_t> codes(static_cast<size_t>(n)), scales(static_cast<size_t>(sr * sc));
      fp8_block128_quantize(v.data(), rows, cols, codes.data(), scales.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          stored[i] = numeric::fp8_e4m3_to_f32(codes[i]) *
                      numeric::e8m0_to_f32(scales[static_cast<size_t>((r / 128) * sc + c / 128)]);
        }
      }
      out->push_back({p.name, DType::kF8E4M3, p.shape, std::move(codes)});
      out->push_back({scale_name_for(p.name), DType::kF8E8M0, {sr, sc}, std::move(scales)});
      break;
    }
    case Storage::kMxfp4: {
      const int64_t rows = p.shape[0], cols = p.shape[1];
      std::vector<uint8_t> packed(static_cast<size_t>(rows * cols / 2));
      std::vector<uint8_t> scales(static_cast<size_t>(rows * cols / 32));
      mxfp4_quantize(v.data(), rows, cols, packed.data(), scales.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          stored[static_cast<size_t>(r * cols + c)] =
              numeric::fp4_packed_get(packed.data() + r * (cols / 2), c) *
              numeric::e8m0_to_f32(scales[static_cast<size_t>(r * (cols / 32) + c / 32)]);
        }
      }
      out->push_back({p.name, DType::kI8, {rows, cols / 2}, std::move(packed)});
      out->push_back(
          {scale_name_for(p.name), DType::kF8E8M0, {rows, cols / 32}, std::move(scales)});
      break;
    }
    case Storage::kTid2eid:
      break;
  }
  if (values != nullptr) {
    (*values)[p.name] = std::move(stored);
  }
}

Status write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return io_error(path + ": cannot create: " + std::strerror(errno));
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int rc = std::fclose(f);
  if (!ok || rc != 0) {
    return io_error(path + ": write failed");
  }
  return Status::ok_status();
}

bool same_plan(const LayerPlan& a, const LayerPlan& b) {
  return a.attention == b.attention && a.compress_ratio == b.compress_ratio && a.rope == b.rope &&
         a.moe == b.moe;
}

}  // namespace

void fp8_block128_quantize(
    const float* w, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scale_bytes) {
  const int64_t sc = (cols + 127) / 128;
  for (int64_t rb = 0; rb < rows; rb += 128) {
    const int64_t re = std::min(rows, rb + 128);
    for (int64_t cb = 0; cb < cols; cb += 128) {
      const int64_t ce = std::min(cols, cb + 128);
      float amax = 0.0f;
      for (int64_t r = rb; r < re; ++r) {
        for (int64_t c = cb; c < ce; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      }
      const float s = numeric::ue8m0_block_scale(amax, numeric::kActAmaxFloor, numeric::kFp8Max);
      scale_bytes[(rb / 128) * sc + cb / 128] = numeric::e8m0_from_pow2(s);
      for (int64_t r = rb; r < re; ++r) {
        for (int64_t c = cb; c < ce; ++c) {
          const float q = std::clamp(w[r * cols + c] / s, -numeric::kFp8Max, numeric::kFp8Max);
          codes[r * cols + c] = numeric::f32_to_fp8_e4m3(q);
        }
      }
    }
  }
}

void mxfp4_quantize(
    const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scale_bytes) {
  DSI_CHECK(cols % 32 == 0, "MXFP4 needs cols %% 32 == 0, got %lld", static_cast<long long>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    uint8_t* prow = packed + r * (cols / 2);
    for (int64_t b = 0; b < cols; b += 32) {
      float amax = 0.0f;
      for (int64_t c = b; c < b + 32; ++c) amax = std::max(amax, std::fabs(row[c]));
      const float s = numeric::ue8m0_block_scale(amax, numeric::kFp4AmaxFloor, numeric::kFp4Max);
      scale_bytes[r * (cols / 32) + b / 32] = numeric::e8m0_from_pow2(s);
      for (int64_t c = b; c < b + 32; c += 2) {
        const uint8_t lo =
            numeric::f32_to_fp4_e2m1(std::clamp(row[c] / s, -numeric::kFp4Max, numeric::kFp4Max));
        const uint8_t hi = numeric::f32_to_fp4_e2m1(
            std::clamp(row[c + 1] / s, -numeric::kFp4Max, numeric::kFp4Max));
        prow[c / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

Result<std::string> deepseek_config_json(const ModelConfig& c, bool fp8_quantized) {
  if (c.rope_main.yarn) {
    return invalid_argument(
        "synthetic config: YaRN on the main RoPE table cannot be written "
        "in the DeepSeek dialect");
  }
  if (static_cast<int64_t>(c.layers.size()) != c.num_hidden_layers) {
    return invalid_argument(str_format("synthetic config: %zu layer plans for %lld layers",
                                       c.layers.size(),
                                       static_cast<long long>(c.num_hidden_layers)));
  }
  json ratios = json::array();
  int64_t n_hash = 0;
  bool hash_prefix = true;
  for (const LayerPlan& p : c.layers) {
    ratios.push_back(p.compress_ratio);
    if (p.moe == MoeType::kHash) {
      if (!hash_prefix) {
        return invalid_argument("synthetic config: hash-routed layers must be a prefix");
      }
      ++n_hash;
    } else {
      hash_prefix = false;
    }
  }
  for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) ratios.push_back(0);

  json j = json::object();
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["sliding_window"] = c.sliding_window;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_main.theta;
  j["compress_rope_theta"] = c.rope_compress.theta;
  if (c.rope_compress.yarn) {
    j["rope_scaling"] = {
        {"type", "yarn"},
        {"factor", c.rope_compress.factor},
        {"original_max_position_embeddings", c.rope_compress.original_max_position},
        {"beta_fast", c.rope_compress.beta_fast},
        {"beta_slow", c.rope_compress.beta_slow}};
  }
  j["compress_ratios"] = ratios;
  j["num_hash_layers"] = n_hash;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["scoring_func"] = scoring_func_name(c.scoring_func);
  j["topk_method"] = "noaux_tc";
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["swiglu_limit"] = c.swiglu_limit;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["tie_word_embeddings"] = false;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "bfloat16";
  if (fp8_quantized) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"scale_fmt", "ue8m0"},
                                {"weight_block_size", {128, 128}}};
  }
  std::string text = j.dump(2) + "\n";

  // The text must reproduce the plan exactly (CSA = smallest ratio, sliding <-> main table, ...).
  auto parsed = parse_model_config(text, "synthetic config.json");
  if (!parsed.ok()) {
    return parsed.status().with_context("synthetic config");
  }
  const ModelConfig& back = parsed.value();
  bool same =
      back.layers.size() == c.layers.size() && back.mtp_layers.size() == c.mtp_layers.size();
  for (size_t i = 0; same && i < c.layers.size(); ++i) {
    same = same_plan(back.layers[i], c.layers[i]);
  }
  for (size_t i = 0; same && i < c.mtp_layers.size(); ++i) {
    same = same_plan(back.mtp_layers[i], c.mtp_layers[i]);
  }
  if (!same) {
    return invalid_argument(
        "synthetic config: the layer plan cannot be expressed in the DeepSeek dialect (CSA must "
        "be the smallest compress ratio, sliding layers use the main table, compressed layers "
        "the compress table, MTP layers are sliding + score)");
  }
  return text;
}

Status write_synthetic_checkpoint(const SyntheticSpec& spec, const std::string& dir) {
  const ModelConfig& c = spec.config;
  if (spec.num_shards < 1) {
    return invalid_argument("synthetic checkpoint: num_shards must be >= 1");
  }
  if (spec.quantized && (c.hidden_size % 32 != 0 || c.moe_intermediate_size % 32 != 0)) {
    return invalid_argument(
        "synthetic checkpoint: MXFP4 experts need hidden_size and moe_intermediate_size to be "
        "multiples of 32");
  }
  DSI_ASSIGN_OR_RETURN(std::string config_text, deepseek_config_json(c, spec.quantized));

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return io_error(dir + ": cannot create directory: " + ec.message());
  }
  // Remove files of an earlier synthetic checkpoint (our own naming only).
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const bool ours = n == "model.safetensors" || n == "model.safetensors.index.json" ||
                      (str_starts_with(n, "model-") && str_ends_with(n, ".safetensors") &&
                       n.find("-of-") != std::string::npos);
    if (ours) {
      stale.push_back(it->path());
    }
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
  DSI_RETURN_IF_ERROR(write_text(dir + "/config.json", config_text));

  Planner planner(c, spec.quantized);
  std::vector<TensorPlan> plan = planner.plan(spec.with_mtp);
  const auto shards = static_cast<size_t>(spec.num_shards);
  if (shards > plan.size()) {
    return invalid_argument(
        str_format("synthetic checkpoint: %zu shards for %zu tensors", shards, plan.size()));
  }
  if (spec.values_out != nullptr) {
    spec.values_out->clear();
  }
  json weight_map = json::object();
  uint64_t total = 0;
  for (size_t s = 0; s < shards; ++s) {
    const size_t b = s * plan.size() / shards, e = (s + 1) * plan.size() / shards;
    const std::string file = shards == 1
                                 ? "model.safetensors"
                                 : str_format("model-%05zu-of-%05zu.safetensors", s + 1, shards);
    std::vector<TensorToWrite> tensors;
    for (size_t i = b; i < e; ++i) materialise(plan[i], spec.seed, &tensors, spec.values_out);
    for (const TensorToWrite& t : tensors) {
      weight_map[t.name] = file;
      total += t.bytes.size();
    }
    DSI_RETURN_IF_ERROR(write_safetensors(dir + "/" + file, tensors, {{"format", "pt"}}));
  }
  if (shards > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    DSI_RETURN_IF_ERROR(write_text(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  }
  return Status::ok_status();
}

ModelConfig tiny_preset_config() {
  static const char* kJson = R"({
    "model_type": "deepseek_v4",
    "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 5,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64,
    "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 32, "sliding_window": 8,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1},
    "compress_ratios": [0, 4, 16, 4, 16, 0], "num_hash_layers": 2,
    "index_n_heads": 2, "index_head_dim": 64, "index_topk": 3,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "scoring_func": "sqrtsoftplus", "norm_topk_prob": true,
    "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "num_nextn_predict_layers": 1,
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false
  })";
  auto c = parse_model_config(kJson, "tiny preset");
  DSI_CHECK(c.ok(), "tiny preset: %s", c.status().to_string().c_str());
  return std::move(c).value();
}

}  // namespace dsinfer::model
