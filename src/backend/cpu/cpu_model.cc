// CpuModel: embedding, decoder layers with mHC, MoE, head and the MTP block (spec §3.1-3.3,
// 3.9-3.11). Attention and the compressors live in attention.cc.
#include "backend/cpu/cpu_model.h"

#include <algorithm>
#include <cmath>

#include "backend/mtp_draft.h"
#include "base/check.h"
#include "base/strings.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cpu/ops.h"

namespace dsinfer::cpu {

using model::LayerPlan;
using model::MoeType;

CpuModel::CpuModel(const model::ModelConfig& config,
                   const model::ModelWeights& weights,
                   model::Numerics numerics)
    : config_(config),
      weights_(weights),
      numerics_(numerics),
      inv_freq_main_(model::rope_inv_freq(config.rope_main, config.qk_rope_head_dim)),
      inv_freq_compress_(model::rope_inv_freq(config.rope_compress, config.qk_rope_head_dim)) {}

namespace {
HyperConnParams hc_params(const model::ModelConfig& c, const model::HyperConnWeights& w) {
  HyperConnParams p;
  p.fn = w.fn.data();
  p.base = w.base.data();
  p.scale = w.scale.data();
  p.hc = c.hc_mult;
  p.hidden = c.hidden_size;
  p.sinkhorn_iters = c.hc_sinkhorn_iters;
  p.hc_eps = static_cast<float>(c.hc_eps);
  p.norm_eps = static_cast<float>(c.rms_norm_eps);
  return p;
}

// One mHC-wrapped sub-layer over n tokens: x [n, hc, hidden] is updated in place.
template <typename F>
void hc_sublayer(const model::ModelConfig& c,
                 const model::HyperConnWeights& hw,
                 const std::vector<float>& norm_w,
                 std::vector<float>& x,
                 int64_t n,
                 F&& body) {
  const int64_t hc = c.hc_mult;
  const int64_t hidden = c.hidden_size;
  const HyperConnParams p = hc_params(c, hw);
  std::vector<float> post(static_cast<size_t>(n * hc));
  std::vector<float> comb(static_cast<size_t>(n * hc * hc));
  std::vector<float> u(static_cast<size_t>(n * hidden));
  for (int64_t t = 0; t < n; ++t) {
    hc_pre(p,
           x.data() + t * hc * hidden,
           post.data() + t * hc,
           comb.data() + t * hc * hc,
           u.data() + t * hidden);
  }
  rms_norm(u.data(), n, hidden, norm_w.data(), static_cast<float>(c.rms_norm_eps), u.data());
  std::vector<float> f(static_cast<size_t>(n * hidden));
  body(u.data(), f.data());
  std::vector<float> out(static_cast<size_t>(n * hc * hidden));
  for (int64_t t = 0; t < n; ++t) {
    hc_post(hc,
            hidden,
            f.data() + t * hidden,
            x.data() + t * hc * hidden,
            post.data() + t * hc,
            comb.data() + t * hc * hc,
            out.data() + t * hc * hidden);
  }
  x.swap(out);
}
}  // namespace

Status CpuModel::forward(state::SequenceState& st,
                         std::span<const int32_t> tokens,
                         const ForwardOptions& options,
                         ForwardOutputs* out) const {
  const auto& c = config_;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size) {
      return invalid_argument(
          str_format("token id %d at index %zu is outside the vocabulary [0, %lld)",
                     tokens[i],
                     i,
                     static_cast<long long>(c.vocab_size)));
    }
  }
  DSI_RETURN_IF_ERROR(state::check_row_format(st, c, state::RowFormat::kFloat));
  if (options.run_mtp)
    DSI_RETURN_IF_ERROR(check_mtp(st));
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t first_pos = st.num_tokens();
  const int64_t hidden = c.hidden_size;
  const int64_t hc = c.hc_mult;
  if (n == 0)
    return Status();
  if (!st.reserve(n)) {
    return Status(StatusCode::kResourceExhausted,
                  str_format("no state memory for %lld more tokens of sequence %lld",
                             static_cast<long long>(n),
                             static_cast<long long>(st.id())));
  }

  // 3.1 embedding, copied into every stream.
  std::vector<float> x(static_cast<size_t>(n * hc * hidden));
  for (int64_t t = 0; t < n; ++t) {
    float* row = x.data() + t * hc * hidden;
    weights_.embed.dequant_row(tokens[t], row);
    for (int64_t j = 1; j < hc; ++j) std::copy(row, row + hidden, row + j * hidden);
  }
  for (size_t l = 0; l < c.layers.size(); ++l) {
    decoder_layer(weights_.layers[l], c.layers[l], st.layers()[l], tokens, first_pos, x);
  }

  if (out) {
    out->logits.clear();
    out->mtp_logits.clear();
    out->mtp_count = 0;
  }
  if (options.want_logits && out) {
    const int64_t rows = options.last_logits_only ? 1 : n;
    out->logits.resize(static_cast<size_t>(rows * c.vocab_size));
    head(weights_.hc_head,
         weights_.norm,
         x.data() + (n - rows) * hc * hidden,
         rows,
         out->logits.data());
  }

  // MTP for positions whose next token is now known, then the final streams MTP needs later.
  if (!weights_.mtp.empty()) {
    if (options.run_mtp)
      DSI_RETURN_IF_ERROR(mtp_chunk(st, x.data(), tokens, options.want_mtp_logits, out));
    store_final_streams(st, x.data(), n);
  }
  st.advance(n);
  return Status();
}

void CpuModel::decoder_layer(const model::LayerWeights& w,
                             const LayerPlan& plan,
                             state::LayerState& ls,
                             std::span<const int32_t> tokens,
                             int64_t first_pos,
                             std::vector<float>& x) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  hc_sublayer(config_, w.hc_attn, w.attn_norm, x, n, [&](const float* u, float* f) {
    attention(w.attn, plan, ls, u, first_pos, n, f);
  });
  hc_sublayer(config_, w.hc_ffn, w.ffn_norm, x, n, [&](const float* u, float* f) {
    moe(w.ffn, plan, u, tokens, f);
  });
}

void CpuModel::moe_route(const model::MoeWeights& w,
                         const LayerPlan& plan,
                         const float* x,
                         std::span<const int32_t> tokens,
                         int32_t* ids,
                         float* gates) const {
  const auto& c = config_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t n_exp = c.n_routed_experts;
  const int64_t k = c.num_experts_per_tok;
  std::vector<float> scores(static_cast<size_t>(n * n_exp));
  linear(w.gate, x, n, scores.data(), false);  // router in fp32, never quantised
  for (int64_t t = 0; t < n; ++t) {
    float* s = scores.data() + t * n_exp;
    switch (c.scoring_func) {
      case model::ScoringFunc::kSqrtSoftplus:
        for (int64_t e = 0; e < n_exp; ++e) s[e] = std::sqrt(softplus(s[e]));
        break;
      case model::ScoringFunc::kSigmoid:
        for (int64_t e = 0; e < n_exp; ++e) s[e] = 1.0f / (1.0f + std::exp(-s[e]));
        break;
      case model::ScoringFunc::kSoftmax:
        softmax(s, n_exp);
        break;
    }
  }
  // Routing: per token k expert ids and weights.
  std::vector<float> biased(static_cast<size_t>(n_exp));
  for (int64_t t = 0; t < n; ++t) {
    const float* s = scores.data() + t * n_exp;
    int32_t* sel = ids + t * k;
    if (plan.moe == MoeType::kHash) {
      for (int64_t i = 0; i < k; ++i) sel[i] = w.tid2eid[static_cast<size_t>(tokens[t] * k + i)];
    } else {
      for (int64_t e = 0; e < n_exp; ++e) biased[e] = s[e] + (w.bias.empty() ? 0.0f : w.bias[e]);
      const std::vector<int32_t> top = top_k_indices(biased.data(), n_exp, k);
      std::copy(top.begin(), top.end(), sel);
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) sum += s[sel[i]];
    for (int64_t i = 0; i < k; ++i) {
      float g = s[sel[i]];
      if (c.norm_topk_prob)
        g = g / (sum + 1e-20f);
      gates[t * k + i] = g * static_cast<float>(c.routed_scaling_factor);
    }
  }
}

void CpuModel::moe(const model::MoeWeights& w,
                   const LayerPlan& plan,
                   const float* x,
                   std::span<const int32_t> tokens,
                   float* out) const {
  const auto& c = config_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hidden = c.hidden_size;
  const int64_t n_exp = c.n_routed_experts;
  const int64_t k = c.num_experts_per_tok;
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::vector<float> gates(static_cast<size_t>(n * k));
  moe_route(w, plan, x, tokens, ids.data(), gates.data());
  // Shared expert (gate 1), then each routed expert over the tokens that chose it.
  std::fill(out, out + n * hidden, 0.0f);
  std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  expert(w.shared, x, n, ones.data(), out);
  std::vector<float> xs;
  std::vector<float> gs;
  std::vector<int64_t> rows;
  std::vector<float> ys;
  for (int64_t e = 0; e < n_exp; ++e) {
    rows.clear();
    gs.clear();
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < k; ++i) {
        if (ids[t * k + i] == e) {
          rows.push_back(t);
          gs.push_back(gates[t * k + i]);
        }
      }
    }
    if (rows.empty())
      continue;
    const int64_t m = static_cast<int64_t>(rows.size());
    xs.resize(static_cast<size_t>(m * hidden));
    for (int64_t r = 0; r < m; ++r) {
      std::copy(x + rows[r] * hidden, x + (rows[r] + 1) * hidden, xs.data() + r * hidden);
    }
    ys.assign(static_cast<size_t>(m * hidden), 0.0f);
    expert(w.experts[static_cast<size_t>(e)], xs.data(), m, gs.data(), ys.data());
    for (int64_t r = 0; r < m; ++r) {
      float* o = out + rows[r] * hidden;
      const float* y = ys.data() + r * hidden;
      for (int64_t cix = 0; cix < hidden; ++cix) o[cix] += y[cix];
    }
  }
}

void CpuModel::expert(const model::ExpertWeights& w,
                      const float* x,
                      int64_t n,
                      const float* gates,
                      float* out_accum) const {
  const int64_t inter = w.w1.rows;
  const int64_t hidden = w.w2.rows;
  const float limit = static_cast<float>(config_.swiglu_limit);
  std::vector<float> a(static_cast<size_t>(n * inter));
  std::vector<float> u(static_cast<size_t>(n * inter));
  linear(w.w1, x, n, a.data(), quantize_acts());
  linear(w.w3, x, n, u.data(), quantize_acts());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < inter; ++i) {
      float g = a[t * inter + i];
      float v = u[t * inter + i];
      if (limit > 0.0f) {
        g = std::min(g, limit);
        v = std::clamp(v, -limit, limit);
      }
      // The routing weight is applied before the down projection (DeepSeek's order).
      a[t * inter + i] = silu(g) * v * gates[t];
    }
  }
  std::vector<float> y(static_cast<size_t>(n * hidden));
  linear(w.w2, a.data(), n, y.data(), quantize_acts());
  for (int64_t i = 0; i < n * hidden; ++i) out_accum[i] += y[i];
}

void CpuModel::head(const model::HyperHeadWeights& hw,
                    const std::vector<float>& norm,
                    const float* streams,
                    int64_t n,
                    float* logits) const {
  const auto& c = config_;
  HyperHeadParams p;
  p.fn = hw.fn.data();
  p.base = hw.base.data();
  p.scale = hw.scale.data();
  p.hc = c.hc_mult;
  p.hidden = c.hidden_size;
  p.hc_eps = static_cast<float>(c.hc_eps);
  p.norm_eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> u(static_cast<size_t>(n * c.hidden_size));
  for (int64_t t = 0; t < n; ++t) {
    hc_head(p, streams + t * c.hc_mult * c.hidden_size, u.data() + t * c.hidden_size);
  }
  rms_norm(u.data(), n, c.hidden_size, norm.data(), static_cast<float>(c.rms_norm_eps), u.data());
  linear(weights_.head, u.data(), n, logits, false);  // LM head in fp32
}

void CpuModel::mtp(const model::MtpWeights& w,
                   const LayerPlan& plan,
                   state::LayerState& ls,
                   const float* streams,
                   std::span<const int32_t> next_tokens,
                   int64_t first_pos,
                   float* logits,
                   float* streams_out) const {
  const auto& c = config_;
  const int64_t n = static_cast<int64_t>(next_tokens.size());
  const int64_t hidden = c.hidden_size;
  const int64_t hc = c.hc_mult;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> e(static_cast<size_t>(n * hidden));
  for (int64_t t = 0; t < n; ++t) weights_.embed.dequant_row(next_tokens[t], e.data() + t * hidden);
  rms_norm(e.data(), n, hidden, w.enorm.data(), eps, e.data());
  std::vector<float> ep(static_cast<size_t>(n * hidden));
  linear(w.e_proj, e.data(), n, ep.data(), quantize_acts());
  std::vector<float> h(static_cast<size_t>(n * hc * hidden));
  rms_norm(streams, n * hc, hidden, w.hnorm.data(), eps, h.data());
  std::vector<float> x(static_cast<size_t>(n * hc * hidden));
  linear(w.h_proj, h.data(), n * hc, x.data(), quantize_acts());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < hc; ++j) {
      float* row = x.data() + (t * hc + j) * hidden;
      for (int64_t i = 0; i < hidden; ++i) row[i] += ep[t * hidden + i];
    }
  }
  decoder_layer(w.layer, plan, ls, next_tokens, first_pos, x);
  if (logits)
    head(w.hc_head, w.norm, x.data(), n, logits);
  if (streams_out)
    std::copy(x.begin(), x.end(), streams_out);
}

Status CpuModel::check_mtp(const state::SequenceState& st) const {
  if (weights_.mtp.empty())
    return failed_precondition("MTP requested but the checkpoint has no MTP weights");
  // The MTP block is at most one position behind the sequence (the position whose next token
  // the coming chunk brings), and that position's final streams are kept.
  const int64_t first_pos = st.num_tokens();
  const int64_t mtp_first = st.mtp_num_tokens();
  if (mtp_first < first_pos - 1 || (mtp_first == first_pos - 1 && !st.final_streams(mtp_first))) {
    return failed_precondition(
        str_format("MTP state is behind (at %lld, sequence at %lld); run every forward with MTP on",
                   static_cast<long long>(mtp_first),
                   static_cast<long long>(first_pos)));
  }
  return Status();
}

Status CpuModel::mtp_chunk(state::SequenceState& st,
                           const float* x,
                           std::span<const int32_t> tokens,
                           bool want_logits,
                           ForwardOutputs* out) const {
  const auto& c = config_;
  DSI_RETURN_IF_ERROR(check_mtp(st));
  const int64_t width = c.hc_mult * c.hidden_size;
  const int64_t first_pos = st.num_tokens();
  const int64_t n = static_cast<int64_t>(tokens.size());
  // Positions whose next token is now known: from the MTP block's position (streams kept from
  // earlier calls) up to first_pos + n - 2 (this chunk).
  const int64_t mtp_first = st.mtp_num_tokens();
  const int64_t mtp_end = first_pos + n - 1;  // exclusive
  const int64_t m = mtp_end - mtp_first;
  if (m <= 0)
    return Status();
  std::vector<float> streams(static_cast<size_t>(m * width));
  std::vector<int32_t> next(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    const int64_t pos = mtp_first + i;
    const float* src = pos < first_pos ? st.final_streams(pos) : x + (pos - first_pos) * width;
    std::copy(src, src + width, streams.data() + i * width);
    next[static_cast<size_t>(i)] = tokens[static_cast<size_t>(pos + 1 - first_pos)];
  }
  float* dst = nullptr;
  if (out && want_logits) {
    out->mtp_logits.resize(static_cast<size_t>(m * c.vocab_size));
    out->mtp_first_pos = mtp_first;
    out->mtp_count = m;
    dst = out->mtp_logits.data();
  }
  mtp(weights_.mtp[0], c.mtp_layers[0], st.mtp_layers()[0], streams.data(), next, mtp_first, dst);
  st.set_mtp_num_tokens(mtp_end);
  return Status();
}

void CpuModel::store_final_streams(state::SequenceState& st, const float* x, int64_t n) const {
  const int64_t width = config_.hc_mult * config_.hidden_size;
  const int64_t first_pos = st.num_tokens();
  const int64_t keep = std::min<int64_t>(n, st.max_rollback() + 1);
  for (int64_t t = n - keep; t < n; ++t) st.store_final_streams(first_pos + t, x + t * width);
}

}  // namespace dsinfer::cpu

namespace dsinfer::cpu {

int32_t top1(const float* logits, int64_t vocab, float* prob) {
  const float* best = std::max_element(logits, logits + vocab);
  double z = 0;
  for (int64_t i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(logits[i]) - *best);
  *prob = static_cast<float>(1.0 / z);
  return static_cast<int32_t>(best - logits);
}

Status CpuModel::check_draft(const state::SequenceState& st,
                             int32_t next_token,
                             int32_t steps,
                             std::span<const int32_t> catch_up) const {
  return backend::check_mtp_draft(config_, !weights_.mtp.empty(), st, next_token, steps, catch_up);
}

void CpuModel::mtp_catch_up(state::SequenceState& st, std::span<const int32_t> catch_up) const {
  const auto& c = config_;
  const int64_t m = static_cast<int64_t>(catch_up.size());
  if (m == 0)
    return;
  const int64_t width = c.hc_mult * c.hidden_size;
  const int64_t first = st.mtp_num_tokens();
  std::vector<float> streams(static_cast<size_t>(m * width));
  for (int64_t i = 0; i < m; ++i) {
    const float* src = st.final_streams(first + i);
    std::copy(src, src + width, streams.data() + i * width);
  }
  mtp(weights_.mtp[0],
      c.mtp_layers[0],
      st.mtp_layers()[0],
      streams.data(),
      catch_up,
      first,
      nullptr);
  st.set_mtp_num_tokens(first + m);
}

Status CpuModel::mtp_draft(state::SequenceState& st,
                           int32_t next_token,
                           int32_t steps,
                           std::span<const int32_t> catch_up,
                           int32_t* tokens,
                           float* probs) const {
  const auto& c = config_;
  DSI_RETURN_IF_ERROR(check_draft(st, next_token, steps, catch_up));
  mtp_catch_up(st, catch_up);
  if (steps == 0)
    return Status();
  const int64_t pos0 = st.num_tokens() - 1;
  const model::LayerPlan& plan = c.mtp_layers[0];
  const int64_t width = c.hc_mult * c.hidden_size;
  std::vector<float> streams(st.final_streams(pos0), st.final_streams(pos0) + width);
  std::vector<float> next_streams(static_cast<size_t>(width));
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  int32_t tok = next_token;
  for (int32_t s = 0; s < steps; ++s) {
    // Step 0 is the MTP block's real position pos0 (the main model's streams, the sampled
    // token); later steps feed the block's own output streams back with the previous draft.
    mtp(weights_.mtp[0],
        plan,
        st.mtp_layers()[0],
        streams.data(),
        std::span<const int32_t>(&tok, 1),
        pos0 + s,
        logits.data(),
        next_streams.data());
    tok = top1(logits.data(), c.vocab_size, &probs[s]);
    tokens[s] = tok;
    streams.swap(next_streams);
  }
  st.set_mtp_num_tokens(pos0 + 1);
  return Status();
}

Status CpuModel::mtp_draft_batch(std::span<backend::DraftItem> items) {
  for (backend::DraftItem& it : items) {
    it.status = mtp_draft(*it.state, it.next_token, it.num_steps, it.catch_up, it.tokens, it.probs);
  }
  return Status();
}

}  // namespace dsinfer::cpu
