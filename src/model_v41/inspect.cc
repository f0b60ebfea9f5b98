// V4.1 checkpoint / config inspection output (text or JSON).
#include "model_v41/inspect.h"

#include <map>
#include <string>

#include "base/strings.h"

namespace dsinfer::model_v41 {

namespace {

using json = nlohmann::json;

std::string ids_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string owner(int l) {
  return l < 0 ? "-" : std::to_string(l);
}

}  // namespace

json v41_plan_json(const V41Config& c, const StateLayout& s) {
  json layers = json::array();
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const V41LayerPlan& p = c.layers[l];
    layers.push_back({{"index", l},
                      {"compress_ratio", p.compress_ratio},
                      {"role", layer_role_name(p.role)},
                      {"half", p.producer ? "producer" : "consumer"},
                      {"rope", model::rope_table_name(p.rope)},
                      {"kv_owner", p.kv_owner},
                      {"topk_source", p.topk_source},
                      {"index_key_owner", p.index_key_owner},
                      {"candidate_source", p.candidate_source},
                      {"uses_candidates", p.uses_candidates},
                      {"engram", p.engram}});
  }
  json engram = json::array();
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) {
    const int64_t rows = c.engram_rows[i];
    engram.push_back({{"layer", c.engram_layer_ids[i]},
                      {"rows", rows},
                      {"first_prime", c.engram_primes[i].front()},
                      {"last_prime", c.engram_primes[i].back()},
                      {"bytes", rows * (c.engram_head_dim + c.engram_head_dim / 32)}});
  }
  json owners = json::array();
  for (const OwnerSection& o : s.owners) {
    owners.push_back({{"layer", o.layer},
                      {"ratio", o.ratio},
                      {"index_bytes_per_block", o.index_bytes},
                      {"main_bytes_per_block", o.main_bytes}});
  }
  return {
      {"form", config_form_name(c.form)},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"head_dim", c.head_dim},
      {"q_lora_rank", c.q_lora_rank},
      {"sliding_window", c.sliding_window},
      {"index_n_heads", c.index_n_heads},
      {"index_head_dim", c.index_head_dim},
      {"index_topk", c.index_topk},
      {"n_routed_experts", c.n_routed_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"quantized", c.quantized},
      {"yoco",
       {{"boundary", c.yoco_boundary},
        {"producers", c.yoco_boundary},
        {"consumers", c.num_hidden_layers - c.yoco_boundary}}},
      {"kv_source_layer_ids", c.kv_source_layer_ids},
      {"index_source_layer_ids", c.index_source_layer_ids},
      {"index_k_source_layer_ids", c.index_k_source_layer_ids},
      {"candidate",
       {{"source", c.candidate_source_layer_id},
        {"topk_blocks", c.candidate_topk_blocks},
        {"block_size", c.candidate_block_size}}},
      {"dspark",
       {{"blocks", c.num_nextn_predict_layers}, {"target_layer_ids", c.dspark_target_layer_ids}}},
      {"engram", engram},
      {"layers", layers},
      {"state",
       {{"window_record_bytes", s.window_record},
        {"compressed_record_bytes", s.compressed_record},
        {"index_record_bytes", s.index_record},
        {"owners", owners},
        {"block_tokens", 128},
        {"block_raw_bytes", s.block_raw_bytes},
        {"block_stride_bytes", s.block_stride},
        {"kv_bytes_per_token_raw", s.bytes_per_token_raw},
        {"kv_bytes_per_token", s.bytes_per_token},
        {"ring_slots", s.ring_slots},
        {"rings", s.n_rings},
        {"ring_bytes", s.ring_bytes},
        {"compressor_ring_slots", s.compressor_ring_slots},
        {"compressor_rings", s.n_compressor_rings},
        {"compressor_ring_bytes", s.compressor_ring_bytes},
        {"producer_ring_bytes", s.producer_ring_bytes},
        {"state_raw_bytes", s.state_raw_bytes},
        {"state_bytes_per_sequence", s.state_bytes}}},
  };
}

Status print_v41_inspect(const V41Config& c,
                         const V41Checkpoint* ck,
                         std::FILE* out,
                         bool as_json) {
  const StateLayout s = compute_state_layout(c);
  if (as_json) {
    json j = {{"model", "deepseek_v4.1"}, {"config", v41_plan_json(c, s)}};
    if (ck != nullptr) {
      j["layout"] = v41_layout_name(ck->layout());
      j["dspark_loaded"] = ck->weights().has_dspark;
      j["skipped_tensors"] = ck->skipped_tensors();
      j["skipped_bytes"] = ck->skipped_bytes();
      json inv = json::array();
      for (const auto& e : ck->inventory()) {
        inv.push_back({{"name", e.name},
                       {"file", e.file},
                       {"dtype", dtype_name(e.dtype)},
                       {"shape", e.shape},
                       {"bytes", e.nbytes}});
      }
      j["tensors"] = inv;
    }
    std::fprintf(out, "%s\n", j.dump(2).c_str());
    return Status::ok_status();
  }
  std::fprintf(out, "model: DeepSeek V4.1 (%s config)\n", config_form_name(c.form));
  if (ck != nullptr) {
    std::fprintf(out,
                 "checkpoint: %s layout, %zu tensors%s\n",
                 v41_layout_name(ck->layout()),
                 ck->inventory().size(),
                 ck->weights().has_dspark ? ", DSpark blocks loaded" : "");
    if (ck->skipped_tensors() > 0) {
      std::fprintf(
          out,
          "skipped (vision tower / aligner / image embeddings): %lld tensors, %lld bytes\n",
          static_cast<long long>(ck->skipped_tensors()),
          static_cast<long long>(ck->skipped_bytes()));
    }
  }
  std::fprintf(
      out,
      "hidden %lld, layers %lld, heads %lld x %lld, q_lora %lld, window %lld, experts %lld "
      "(top-%lld) x %lld, vocab %lld\n",
      static_cast<long long>(c.hidden_size),
      static_cast<long long>(c.num_hidden_layers),
      static_cast<long long>(c.num_attention_heads),
      static_cast<long long>(c.head_dim),
      static_cast<long long>(c.q_lora_rank),
      static_cast<long long>(c.sliding_window),
      static_cast<long long>(c.n_routed_experts),
      static_cast<long long>(c.num_experts_per_tok),
      static_cast<long long>(c.moe_intermediate_size),
      static_cast<long long>(c.vocab_size));
  const int b = c.yoco_boundary;
  std::fprintf(out,
               "YOCO: producers 0-%d (%d layers), consumers %d-%lld (%lld layers); boundary %d\n",
               b - 1,
               b,
               b,
               static_cast<long long>(c.num_hidden_layers - 1),
               static_cast<long long>(c.num_hidden_layers - b),
               b);
  std::fprintf(out,
               "KV owners %s, index sources %s, index-key owners %s\n",
               ids_str(c.kv_source_layer_ids).c_str(),
               ids_str(c.index_source_layer_ids).c_str(),
               ids_str(c.index_k_source_layer_ids).c_str());
  if (c.candidate_source_layer_id >= 0) {
    std::fprintf(out,
                 "two-level top-k: candidate source %d, %lld blocks of %lld\n",
                 c.candidate_source_layer_id,
                 static_cast<long long>(c.candidate_topk_blocks),
                 static_cast<long long>(c.candidate_block_size));
  }
  std::fprintf(out, "layer  ratio  half      role     kv  topk  ikey  extra\n");
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const V41LayerPlan& p = c.layers[l];
    std::string extra;
    if (p.candidate_source)
      extra += " candidate-source";
    if (p.uses_candidates)
      extra += " candidate-pool";
    if (p.engram)
      extra += " engram";
    std::fprintf(out,
                 "%5zu  %5d  %-8s  %-7s  %3s  %4s  %4s %s\n",
                 l,
                 p.compress_ratio,
                 p.producer ? "producer" : "consumer",
                 layer_role_name(p.role),
                 owner(p.kv_owner).c_str(),
                 owner(p.topk_source).c_str(),
                 owner(p.index_key_owner).c_str(),
                 extra.c_str());
  }
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) {
    const int64_t rows = c.engram_rows[i];
    std::fprintf(out,
                 "Engram layer %d: %lld rows (primes %lld..%lld), %lld bytes\n",
                 c.engram_layer_ids[i],
                 static_cast<long long>(rows),
                 static_cast<long long>(c.engram_primes[i].front()),
                 static_cast<long long>(c.engram_primes[i].back()),
                 static_cast<long long>(rows * (c.engram_head_dim + c.engram_head_dim / 32)));
  }
  if (c.num_nextn_predict_layers > 0) {
    std::fprintf(out,
                 "DSpark: %lld blocks, targets %s\n",
                 static_cast<long long>(c.num_nextn_predict_layers),
                 ids_str(c.dspark_target_layer_ids).c_str());
  }
  std::fprintf(out,
               "compressed KV: %.0f B/token raw, %.0f B/token paged (block %lld B raw, stride "
               "%lld B per 128 tokens)\n",
               s.bytes_per_token_raw,
               s.bytes_per_token,
               static_cast<long long>(s.block_raw_bytes),
               static_cast<long long>(s.block_stride));
  std::fprintf(out,
               "state per sequence: %lld B (%lld rings x %lld slots x %lld B + %lld compressor "
               "rings x %lld B, raw %lld)\n",
               static_cast<long long>(s.state_bytes),
               static_cast<long long>(s.n_rings),
               static_cast<long long>(s.ring_slots),
               static_cast<long long>(s.window_record),
               static_cast<long long>(s.n_compressor_rings),
               static_cast<long long>(s.compressor_ring_bytes),
               static_cast<long long>(s.state_raw_bytes));
  return Status::ok_status();
}

}  // namespace dsinfer::model_v41
