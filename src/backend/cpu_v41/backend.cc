// V41Backend: the V4.1 CPU forward behind backend::Model.
#include "backend/cpu_v41/backend.h"

#include <algorithm>

#include "base/file.h"
#include "model_v41/engram.h"

namespace dsinfer::cpu_v41 {

bool is_v41_model_dir(const std::string& dir) {
  auto text = read_text_file(dir + "/config.json", uint64_t{1} << 26);
  return text.ok() && model_v41::is_v41_config_text(*text);
}

model::ModelConfig v41_engine_view(const model_v41::V41Config& c) {
  model::ModelConfig m;
  m.vocab_size = c.vocab_size;
  m.hidden_size = c.hidden_size;
  m.num_hidden_layers = c.num_hidden_layers;
  m.num_attention_heads = c.num_attention_heads;
  m.head_dim = c.head_dim;
  m.qk_rope_head_dim = c.qk_rope_head_dim;
  m.q_lora_rank = c.q_lora_rank;
  m.o_groups = c.o_groups;
  m.o_lora_rank = c.o_lora_rank;
  m.sliding_window = c.sliding_window;
  m.max_position_embeddings = c.max_position_embeddings;
  m.rope_main = c.rope_main;
  m.rope_compress = c.rope_compress;
  m.index_n_heads = c.index_n_heads;
  m.index_head_dim = c.index_head_dim;
  m.index_topk = c.index_topk;
  m.hc_mult = c.hc_mult;
  m.hc_sinkhorn_iters = c.hc_sinkhorn_iters;
  m.hc_eps = c.hc_eps;
  m.rms_norm_eps = c.rms_norm_eps;
  m.n_routed_experts = c.n_routed_experts;
  m.n_shared_experts = c.n_shared_experts;
  m.num_experts_per_tok = c.num_experts_per_tok;
  m.moe_intermediate_size = c.moe_intermediate_size;
  m.routed_scaling_factor = c.routed_scaling_factor;
  m.swiglu_limit = c.swiglu_limit;
  m.bos_token_id = c.bos_token_id;
  m.eos_token_id = c.eos_token_id;
  m.fp8_quantized = c.quantized;
  for (const model_v41::V41LayerPlan& p : c.layers) {
    model::LayerPlan lp;
    lp.attention =
        p.compress_ratio == 0 ? model::AttentionType::kSliding : model::AttentionType::kCsa;
    lp.compress_ratio = p.compress_ratio;
    lp.rope = p.rope;
    m.layers.push_back(lp);
  }
  return m;
}

Result<std::unique_ptr<V41Backend>> V41Backend::open(const std::string& dir,
                                                     const V41BackendOptions& options) {
  if (options.prefill_keep_rows < 0)
    return invalid_argument("--prefill-keep-rows must be >= 0 (0 = exact prefill)");
  if (options.engram.placement == EngramPlacement::kDevice)
    return engram_device_needs_cuda();
  auto ck = model_v41::V41Checkpoint::open(dir);
  if (!ck.ok())
    return ck.status();
  std::unique_ptr<V41Backend> b(new V41Backend());
  b->ckpt_ = std::move(ck).value();
  b->options_ = options;
  const model_v41::V41Config& cfg = b->ckpt_->config();
  b->shape_ = v41_state_shape(cfg);
  if (options.prefill_keep_rows > 0 && options.prefill_keep_rows < b->shape_.ring_capacity) {
    return invalid_argument(
        "--prefill-keep-rows " + std::to_string(options.prefill_keep_rows) +
        " is below the window + max backtracking = " + std::to_string(b->shape_.ring_capacity) +
        " rows a decode step needs after the prefill");
  }
  std::vector<int32_t> phi;
  if (!cfg.engram_layer_ids.empty()) {
    const std::string path = options.engram_token_map.empty() ? dir + "/engram_token_map.json"
                                                              : options.engram_token_map;
    auto m = model_v41::load_engram_token_map(path, cfg);
    if (!m.ok()) {
      return m.status().with_context(
          "the Engram token map (write it with tools/reference/v41/engram_token_map.py)");
    }
    phi = std::move(m).value();
  }
  auto hash = EngramHashParams::from_config(cfg, std::move(phi));
  if (!hash.ok())
    return hash.status();
  if (options.engram.host_budget_bytes < 0)
    return invalid_argument("Engram host memory budget must be >= 0");
  b->model_ = std::make_unique<V41CpuModel>(
      cfg, b->ckpt_->weights(), std::move(hash).value(), options.numerics, options.engram);
  b->view_ = v41_engine_view(cfg);
  return b;
}

Result<backend::PrefixCacheLayout> V41Backend::prefix_cache_layout() const {
  const model_v41::V41Config& c = ckpt_->config();
  backend::PrefixCacheLayout l;
  const bool replay = options_.prefill_keep_rows > 0 && c.yoco_boundary < c.num_hidden_layers;
  if (!replay) {
    // Exact prefill: every ring is the one an uncached run leaves, so the whole state is stored
    // (consumer and DSpark rings included) and a unit may end anywhere.
    l.salt = "v41-exact";
    return l;
  }
  // No compression group may be open at a save point, or its rows would be needed (the spec's
  // "a ratio-2 group never straddles a 128-token boundary", checked for this config).
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const int64_t r = c.compress_ratios[static_cast<size_t>(i)];
    if (r > 0 && kV41SavePoint % r != 0) {
      return invalid_argument("prefix cache with --prefill-keep-rows: layer " + std::to_string(i) +
                              "'s compression ratio " + std::to_string(r) +
                              " does not divide the save point of " +
                              std::to_string(kV41SavePoint) + " tokens");
    }
  }
  l.save_point = kV41SavePoint;
  l.replay_rows = options_.prefill_keep_rows;
  l.image.skip_compressor_rows = true;
  l.image.skip_rings.assign(shape_.layers.size() + static_cast<size_t>(shape_.extra_rings), 1);
  for (int i = 0; i < c.yoco_boundary; ++i) l.image.skip_rings[static_cast<size_t>(i)] = 0;
  l.salt = "v41-replay/save=" + std::to_string(kV41SavePoint) +
           "/keep=" + std::to_string(options_.prefill_keep_rows);
  return l;
}

Status V41Backend::forward(state::SequenceState& st,
                           std::span<const int32_t> tokens,
                           const backend::ForwardOptions& options,
                           backend::ForwardOutputs* out) {
  if (options.run_mtp)
    return invalid_argument("V4.1 has DSpark draft blocks, not an MTP head");
  const int64_t first = st.num_tokens(), n = static_cast<int64_t>(tokens.size());
  // Early exit on the chunks of a prefill (prefill_end: the tokens known when it was planned).
  PrefillExit exit{options.prefill_end, options_.prefill_keep_rows};
  const bool use_exit =
      options_.prefill_keep_rows > 0 && options.prefill_end > 0 && first + n <= options.prefill_end;
  const bool last_only = !options.want_logits || options.last_logits_only;
  ForwardResult r;
  DSI_RETURN_IF_ERROR(model_->forward(st, tokens, use_exit ? &exit : nullptr, &r, last_only));
  if (out == nullptr)
    return Status();
  out->mtp_logits.clear();
  out->mtp_count = 0;
  if (!options.want_logits) {
    out->logits.clear();
    return Status();
  }
  if (!last_only && (r.first_row != 0 || r.placeholder)) {
    return invalid_argument(
        "logits of every prompt row are not available with prefill early exit "
        "(--prefill-keep-rows): the consumer half runs on the last rows only");
  }
  out->logits = std::move(r.logits);
  return Status();
}

int32_t V41Backend::block_draft_size() const {
  if (!model_->has_dspark() || shape_.max_rollback < 2)
    return 0;
  return static_cast<int32_t>(shape_.max_rollback - 1);
}

Status V41Backend::block_draft_batch(std::span<backend::BlockDraftItem> items, int32_t block) {
  DraftOptions o;
  o.block = block;
  DraftResult r;
  for (backend::BlockDraftItem& it : items) {
    it.status = Status();
    if (it.state == nullptr || it.tokens == nullptr || it.confidence == nullptr) {
      it.status = invalid_argument("block draft: no state or output");
      continue;
    }
    it.status = model_->draft(*it.state, it.anchor, o, &r);
    if (!it.status.ok())
      continue;
    std::copy(r.tokens.begin(), r.tokens.end(), it.tokens);
    std::copy(r.confidence.begin(), r.confidence.end(), it.confidence);
  }
  return Status();
}

}  // namespace dsinfer::cpu_v41
