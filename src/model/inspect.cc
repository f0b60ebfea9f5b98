// Checkpoint inspection output (text or JSON).
#include "model/inspect.h"

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "base/strings.h"

namespace dsinfer::model {

namespace {

using json = nlohmann::json;

const char* dialect_name(ConfigDialect d) {
  return d == ConfigDialect::kTransformers ? "transformers" : "deepseek";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) {
      s += ", ";
    }
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string rope_str(const RopeParams& p) {
  std::string s = str_format("theta=%g", p.theta);
  if (p.yarn) {
    s += str_format(" yarn(factor=%g, original=%lld, beta_fast=%g, beta_slow=%g)",
                    p.factor,
                    static_cast<long long>(p.original_max_position),
                    p.beta_fast,
                    p.beta_slow);
  }
  return s;
}

json rope_json(const RopeParams& p) {
  json j = {{"theta", p.theta}, {"yarn", p.yarn}};
  if (p.yarn) {
    j["factor"] = p.factor;
    j["original_max_position_embeddings"] = p.original_max_position;
    j["beta_fast"] = p.beta_fast;
    j["beta_slow"] = p.beta_slow;
  }
  return j;
}

json layer_json(int64_t index, const LayerPlan& p, const ModelConfig& c) {
  return {{"index", index},
          {"attention", attention_type_name(p.attention)},
          {"compress_ratio", p.compress_ratio},
          {"rope", rope_table_name(p.rope)},
          {"rope_params", rope_json(p.rope == RopeTable::kMain ? c.rope_main : c.rope_compress)},
          {"moe", moe_type_name(p.moe)}};
}

json config_json(const ModelConfig& c) {
  return {{"dialect", dialect_name(c.dialect)},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim},
          {"qk_rope_head_dim", c.qk_rope_head_dim},
          {"q_lora_rank", c.q_lora_rank},
          {"o_groups", c.o_groups},
          {"o_lora_rank", c.o_lora_rank},
          {"sliding_window", c.sliding_window},
          {"max_position_embeddings", c.max_position_embeddings},
          {"rope_main", rope_json(c.rope_main)},
          {"rope_compress", rope_json(c.rope_compress)},
          {"index_n_heads", c.index_n_heads},
          {"index_head_dim", c.index_head_dim},
          {"index_topk", c.index_topk},
          {"hc_mult", c.hc_mult},
          {"hc_sinkhorn_iters", c.hc_sinkhorn_iters},
          {"hc_eps", c.hc_eps},
          {"rms_norm_eps", c.rms_norm_eps},
          {"n_routed_experts", c.n_routed_experts},
          {"n_shared_experts", c.n_shared_experts},
          {"num_experts_per_tok", c.num_experts_per_tok},
          {"moe_intermediate_size", c.moe_intermediate_size},
          {"scoring_func", scoring_func_name(c.scoring_func)},
          {"norm_topk_prob", c.norm_topk_prob},
          {"routed_scaling_factor", c.routed_scaling_factor},
          {"swiglu_limit", c.swiglu_limit},
          {"num_nextn_predict_layers", c.num_nextn_predict_layers},
          {"bos_token_id", c.bos_token_id},
          {"eos_token_id", c.eos_token_id},
          {"fp8_quantized", c.fp8_quantized}};
}

struct DtypeTotal {
  int64_t count = 0;
  int64_t bytes = 0;
};

Status write_out(std::FILE* out, const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), out) != s.size()) {
    return io_error("inspect: write failed");
  }
  return Status::ok_status();
}

}  // namespace

Status print_inspect(const Checkpoint& ck, std::FILE* out, bool as_json) {
  const ModelConfig& c = ck.config();
  std::map<std::string, DtypeTotal> totals;
  int64_t total_bytes = 0;
  for (const InventoryEntry& e : ck.inventory()) {
    DtypeTotal& t = totals[dtype_name(e.dtype)];
    ++t.count;
    t.bytes += e.nbytes;
    total_bytes += e.nbytes;
  }

  if (as_json) {
    json j = json::object();
    j["dir"] = ck.dir();
    j["layout"] = checkpoint_layout_name(ck.layout());
    j["has_mtp_weights"] = ck.has_mtp();
    j["config"] = config_json(c);
    json layers = json::array();
    for (size_t i = 0; i < c.layers.size(); ++i) {
      layers.push_back(layer_json(static_cast<int64_t>(i), c.layers[i], c));
    }
    j["layers"] = std::move(layers);
    json mtp = json::array();
    for (size_t i = 0; i < c.mtp_layers.size(); ++i) {
      mtp.push_back(layer_json(c.num_hidden_layers + static_cast<int64_t>(i), c.mtp_layers[i], c));
    }
    j["mtp_layers"] = std::move(mtp);
    json tensors = json::array();
    for (const InventoryEntry& e : ck.inventory()) {
      tensors.push_back({{"name", e.name},
                         {"dtype", dtype_name(e.dtype)},
                         {"shape", e.shape},
                         {"bytes", e.nbytes},
                         {"file", e.file}});
    }
    j["tensors"] = std::move(tensors);
    json tot = json::object();
    for (const auto& [name, t] : totals) tot[name] = {{"count", t.count}, {"bytes", t.bytes}};
    j["totals"] = std::move(tot);
    j["total_bytes"] = total_bytes;
    j["tensor_count"] = ck.inventory().size();
    return write_out(out, j.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
  }

  std::string s;
  s += "checkpoint: " + ck.dir() + "\n";
  s += str_format("layout: %s   config dialect: %s   fp8 quantized: %s   MTP weights: %s\n",
                  checkpoint_layout_name(ck.layout()),
                  dialect_name(c.dialect),
                  c.fp8_quantized ? "yes" : "no",
                  ck.has_mtp() ? "yes" : "no");
  s += "\nconfig:\n";
  auto kv = [&](const char* k, long long v) { s += str_format("  %-26s %lld\n", k, v); };
  auto kd = [&](const char* k, double v) { s += str_format("  %-26s %g\n", k, v); };
  kv("vocab_size", c.vocab_size);
  kv("hidden_size", c.hidden_size);
  kv("num_hidden_layers", c.num_hidden_layers);
  kv("num_attention_heads", c.num_attention_heads);
  kv("num_key_value_heads", c.num_key_value_heads);
  kv("head_dim", c.head_dim);
  kv("qk_rope_head_dim", c.qk_rope_head_dim);
  kv("q_lora_rank", c.q_lora_rank);
  kv("o_groups", c.o_groups);
  kv("o_lora_rank", c.o_lora_rank);
  kv("sliding_window", c.sliding_window);
  kv("max_position_embeddings", c.max_position_embeddings);
  s += str_format("  %-26s %s\n", "rope_main", rope_str(c.rope_main).c_str());
  s += str_format("  %-26s %s\n", "rope_compress", rope_str(c.rope_compress).c_str());
  kv("index_n_heads", c.index_n_heads);
  kv("index_head_dim", c.index_head_dim);
  kv("index_topk", c.index_topk);
  kv("hc_mult", c.hc_mult);
  kv("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  kd("hc_eps", c.hc_eps);
  kd("rms_norm_eps", c.rms_norm_eps);
  kv("n_routed_experts", c.n_routed_experts);
  kv("n_shared_experts", c.n_shared_experts);
  kv("num_experts_per_tok", c.num_experts_per_tok);
  kv("moe_intermediate_size", c.moe_intermediate_size);
  s += str_format("  %-26s %s\n", "scoring_func", scoring_func_name(c.scoring_func));
  s += str_format("  %-26s %s\n", "norm_topk_prob", c.norm_topk_prob ? "true" : "false");
  kd("routed_scaling_factor", c.routed_scaling_factor);
  kd("swiglu_limit", c.swiglu_limit);
  kv("num_nextn_predict_layers", c.num_nextn_predict_layers);
  kv("bos_token_id", c.bos_token_id);
  kv("eos_token_id", c.eos_token_id);

  s += "\nlayers:\n";
  s += str_format("  %-6s %-9s %-6s %-9s %-6s %s\n",
                  "layer",
                  "attention",
                  "ratio",
                  "rope",
                  "moe",
                  "rope params");
  auto layer_line = [&](const std::string& idx, const LayerPlan& p) {
    const RopeParams& rp = p.rope == RopeTable::kMain ? c.rope_main : c.rope_compress;
    s += str_format("  %-6s %-9s %-6d %-9s %-6s %s\n",
                    idx.c_str(),
                    attention_type_name(p.attention),
                    p.compress_ratio,
                    rope_table_name(p.rope),
                    moe_type_name(p.moe),
                    rope_str(rp).c_str());
  };
  for (size_t i = 0; i < c.layers.size(); ++i) layer_line(std::to_string(i), c.layers[i]);
  for (size_t i = 0; i < c.mtp_layers.size(); ++i) {
    layer_line("mtp." + std::to_string(i), c.mtp_layers[i]);
  }

  s += str_format("\ntensors (%zu):\n", ck.inventory().size());
  for (const InventoryEntry& e : ck.inventory()) {
    s += str_format("  %-60s %-8s %-18s %12lld  %s\n",
                    e.name.c_str(),
                    dtype_name(e.dtype),
                    shape_str(e.shape).c_str(),
                    static_cast<long long>(e.nbytes),
                    e.file.c_str());
  }
  s += "\ntotals by dtype:\n";
  for (const auto& [name, t] : totals) {
    s += str_format("  %-8s %8lld tensors %14lld bytes (%s)\n",
                    name.c_str(),
                    static_cast<long long>(t.count),
                    static_cast<long long>(t.bytes),
                    human_bytes(static_cast<uint64_t>(t.bytes)).c_str());
  }
  s += str_format("  %-8s %8zu tensors %14lld bytes (%s)\n",
                  "all",
                  ck.inventory().size(),
                  static_cast<long long>(total_bytes),
                  human_bytes(static_cast<uint64_t>(total_bytes)).c_str());
  return write_out(out, s);
}

}  // namespace dsinfer::model
