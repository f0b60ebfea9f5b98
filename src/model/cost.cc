#include "model/cost.h"

#include <algorithm>
#include <cmath>

namespace dsinfer::model {
namespace {

double params(const MatrixRef& m) {
  return static_cast<double>(m.rows) * static_cast<double>(m.cols);
}

// Weights every token of a layer applies (all but the routed experts), and their bytes.
void dense_layer(const LayerWeights& w, double* p, double* bytes) {
  const AttentionWeights& a = w.attn;
  for (const MatrixRef* m : {&a.wq_a,
                             &a.wq_b,
                             &a.wkv,
                             &a.wo_a,
                             &a.wo_b,
                             &a.compressor.wkv,
                             &a.compressor.wgate,
                             &a.indexer_wq_b,
                             &a.indexer_weights_proj,
                             &a.indexer_compressor.wkv,
                             &a.indexer_compressor.wgate,
                             &w.ffn.gate,
                             &w.ffn.shared.w1,
                             &w.ffn.shared.w3,
                             &w.ffn.shared.w2}) {
    if (m->empty())
      continue;
    *p += params(*m);
    *bytes += static_cast<double>(m->nbytes());
  }
  // mHC mixing projections (fp32, two sub-layers).
  *p += static_cast<double>(w.hc_attn.fn.size() + w.hc_ffn.fn.size());
  *bytes += 4.0 * static_cast<double>(w.hc_attn.fn.size() + w.hc_ffn.fn.size());
}

void expert(const LayerWeights& w, double* p, double* bytes) {
  if (w.ffn.experts.empty())
    return;
  const ExpertWeights& e = w.ffn.experts.front();
  *p = params(e.w1) + params(e.w3) + params(e.w2);
  *bytes = static_cast<double>(e.w1.nbytes() + e.w3.nbytes() + e.w2.nbytes());
}

// Keys one query at position pos visits in a layer, and the indexer blocks it scores.
void keys_at(
    const ModelConfig& c, const LayerPlan& plan, int64_t pos, double* keys, double* blocks) {
  *keys = static_cast<double>(std::min<int64_t>(pos + 1, c.sliding_window));
  *blocks = 0;
  if (plan.attention == AttentionType::kSliding)
    return;
  const int64_t visible = (pos + 1) / plan.compress_ratio;
  if (plan.attention == AttentionType::kHca) {
    *keys += static_cast<double>(visible);
  } else {
    *keys += static_cast<double>(std::min(visible, c.index_topk));
    *blocks = static_cast<double>(visible);
  }
}

double attention_flops(const ModelConfig& c, double keys, double blocks) {
  return 4.0 * static_cast<double>(c.num_attention_heads * c.head_dim) * keys +
         2.0 * static_cast<double>(c.index_n_heads * c.index_head_dim) * blocks;
}

}  // namespace

ForwardCost prefill_cost(const ModelConfig& c, const ModelWeights& w, int64_t tokens) {
  ForwardCost f;
  const double n = static_cast<double>(tokens);
  for (size_t l = 0; l < c.layers.size() && l < w.layers.size(); ++l) {
    double p = 0, b = 0, ep = 0, eb = 0;
    dense_layer(w.layers[l], &p, &b);
    expert(w.layers[l], &ep, &eb);
    f.matmul_flops += 2.0 * n * (p + static_cast<double>(c.num_experts_per_tok) * ep);
    f.weight_bytes += b + eb * static_cast<double>(w.layers[l].ffn.experts.size());
    for (int64_t pos = 0; pos < tokens; ++pos) {
      double keys = 0, blocks = 0;
      keys_at(c, c.layers[l], pos, &keys, &blocks);
      f.attention_flops += attention_flops(c, keys, blocks);
    }
  }
  f.matmul_flops += 2.0 * params(w.head);
  f.weight_bytes += static_cast<double>(w.head.nbytes());
  return f;
}

ForwardCost decode_cost(const ModelConfig& c,
                        const ModelWeights& w,
                        int64_t batch,
                        int64_t context,
                        double kv_row_bytes,
                        double index_row_bytes) {
  ForwardCost f;
  if (kv_row_bytes <= 0)
    kv_row_bytes = 4.0 * static_cast<double>(c.head_dim);
  if (index_row_bytes <= 0)
    index_row_bytes = 4.0 * static_cast<double>(c.index_head_dim);
  const double b = static_cast<double>(batch);
  const double k = static_cast<double>(c.num_experts_per_tok);
  for (size_t l = 0; l < c.layers.size() && l < w.layers.size(); ++l) {
    double p = 0, bytes = 0, ep = 0, eb = 0;
    dense_layer(w.layers[l], &p, &bytes);
    expert(w.layers[l], &ep, &eb);
    const double e = static_cast<double>(w.layers[l].ffn.experts.size());
    const double distinct = e > 0 ? e * (1.0 - std::pow(1.0 - k / e, b)) : 0.0;
    f.matmul_flops += 2.0 * b * (p + k * ep);
    f.weight_bytes += bytes + distinct * eb;
    double keys = 0, blocks = 0;
    keys_at(c, c.layers[l], context, &keys, &blocks);
    f.attention_flops += b * attention_flops(c, keys, blocks);
    f.state_bytes += b * (keys * kv_row_bytes + blocks * index_row_bytes);
  }
  f.matmul_flops += 2.0 * b * params(w.head);
  f.weight_bytes += static_cast<double>(w.head.nbytes());
  return f;
}

}  // namespace dsinfer::model
