// FastCpuModel: the step (rows of all items stacked), mHC, MoE grouped by expert, the head.
// Attention and the compressors live in fast_attention.cc.
#include "backend/cpu/fast/fast_model.h"

#include <algorithm>
#include <cmath>

#include "backend/forward_as_batch.h"
#include "base/check.h"
#include "base/strings.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cpu/ops.h"
#include "numeric/quant.h"

namespace dsinfer::cpu::fast {

using model::LayerPlan;
using model::MoeType;

FastCpuModel::FastCpuModel(const model::ModelConfig& config,
                           const model::ModelWeights& weights,
                           model::Numerics numerics,
                           ThreadPool* pool)
    : config_(config),
      weights_(weights),
      numerics_(numerics),
      pool_(pool),
      reference_(config, weights, numerics),
      inv_freq_main_(model::rope_inv_freq(config.rope_main, config.qk_rope_head_dim)),
      inv_freq_compress_(model::rope_inv_freq(config.rope_compress, config.qk_rope_head_dim)) {}

template <typename F>
void FastCpuModel::parallel_rows(int64_t n, int64_t min_rows_per_task, F&& fn) {
  const int threads = pool_ ? pool_->threads() : 1;
  const int64_t tasks = std::min<int64_t>(threads, n / std::max<int64_t>(1, min_rows_per_task));
  if (tasks <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  pool_->run(tasks, [&](int64_t t) { fn(n * t / tasks, n * (t + 1) / tasks); });
}

void FastCpuModel::linear(const WeightView& w,
                          const float* x,
                          int64_t ldx,
                          int64_t n,
                          float* y,
                          int64_t ldy,
                          bool quantize) {
  if (quantize) {
    const int64_t cols = w.cols;
    qbuf_.resize(static_cast<size_t>(n * cols));
    for (int64_t t = 0; t < n; ++t) {
      float* dst = qbuf_.data() + t * cols;
      std::copy(x + t * ldx, x + t * ldx + cols, dst);
      numeric::fp8_block_simulate(dst, cols, 128);
    }
    x = qbuf_.data();
    ldx = cols;
  }
  gemm(w, x, ldx, n, y, ldy, pool_);
}

const float* FastCpuModel::rope_table(model::RopeTable t) {
  const int i = t == model::RopeTable::kMain ? 0 : 1;
  if (!rope_ready_[i]) {
    const std::vector<float>& freqs = i == 0 ? inv_freq_main_ : inv_freq_compress_;
    const int64_t half = static_cast<int64_t>(freqs.size());
    rope_cs_[i].resize(static_cast<size_t>(rows_ * 2 * half));
    for (int64_t r = 0; r < rows_; ++r) {
      float* cs = rope_cs_[i].data() + r * 2 * half;
      const float pos = static_cast<float>(row_pos_[r]);
      for (int64_t k = 0; k < half; ++k) {
        const float angle = pos * freqs[static_cast<size_t>(k)];  // as rope_apply
        cs[2 * k] = std::cos(angle);
        cs[2 * k + 1] = std::sin(angle);
      }
    }
    rope_ready_[i] = true;
  }
  return rope_cs_[i].data();
}

Status FastCpuModel::forward(state::SequenceState& st,
                             std::span<const int32_t> tokens,
                             const backend::ForwardOptions& options,
                             backend::ForwardOutputs* out) {
  return backend::forward_as_batch(*this, st, tokens, options, out);
}

Status FastCpuModel::forward_batch(std::span<backend::ForwardItem> items) {
  const auto& c = config_;
  const int64_t hidden = c.hidden_size;
  const int64_t hc = c.hc_mult;
  const int64_t width = hc * hidden;
  segs_.clear();
  rows_ = 0;
  for (backend::ForwardItem& it : items) {
    it.status = state::check_row_format(*it.state, c, state::RowFormat::kFloat);
    if (!it.status.ok())
      continue;
    if (it.options.run_mtp) {  // checked before the state changes
      it.status = reference_.check_mtp(*it.state);
      if (!it.status.ok())
        continue;
    }
    bool ok = true;
    for (size_t i = 0; i < it.tokens.size() && ok; ++i) {
      if (it.tokens[i] < 0 || it.tokens[i] >= c.vocab_size) {
        it.status = invalid_argument(
            str_format("token id %d at index %zu is outside the vocabulary [0, %lld)",
                       it.tokens[i],
                       i,
                       static_cast<long long>(c.vocab_size)));
        ok = false;
      }
    }
    const int64_t n = static_cast<int64_t>(it.tokens.size());
    if (!ok || n == 0)
      continue;
    if (!it.state->reserve(n)) {
      it.status = Status(StatusCode::kResourceExhausted,
                         str_format("no state memory for %lld more tokens of sequence %lld",
                                    static_cast<long long>(n),
                                    static_cast<long long>(it.state->id())));
      continue;
    }
    Seg s;
    s.item = &it;
    s.row0 = rows_;
    s.n = n;
    s.first_pos = it.state->num_tokens();
    segs_.push_back(s);
    rows_ += n;
  }
  if (segs_.empty())
    return Status();

  const int64_t N = rows_;
  row_token_.resize(static_cast<size_t>(N));
  row_pos_.resize(static_cast<size_t>(N));
  row_seg_.resize(static_cast<size_t>(N));
  for (size_t si = 0; si < segs_.size(); ++si) {
    const Seg& s = segs_[si];
    for (int64_t t = 0; t < s.n; ++t) {
      row_token_[s.row0 + t] = s.item->tokens[static_cast<size_t>(t)];
      row_pos_[s.row0 + t] = s.first_pos + t;
      row_seg_[s.row0 + t] = static_cast<int32_t>(si);
    }
  }
  rope_ready_[0] = rope_ready_[1] = false;

  // 3.1 embedding, copied into every stream.
  x_.resize(static_cast<size_t>(N * width));
  for (int64_t t = 0; t < N; ++t) {
    float* row = x_.data() + t * width;
    weights_.embed.dequant_row(row_token_[t], row);
    for (int64_t j = 1; j < hc; ++j) std::copy(row, row + hidden, row + j * hidden);
  }
  for (size_t l = 0; l < c.layers.size(); ++l) layer(l, x_);

  // Logits: every row of items that want all, the last row of the others.
  logit_rows_.clear();
  for (const Seg& s : segs_) {
    backend::ForwardOutputs* out = s.item->out;
    if (out) {
      out->logits.clear();
      out->mtp_logits.clear();
      out->mtp_count = 0;
    }
    if (!out || !s.item->options.want_logits)
      continue;
    const int64_t r = s.item->options.last_logits_only ? 1 : s.n;
    for (int64_t t = s.n - r; t < s.n; ++t) logit_rows_.push_back(s.row0 + t);
  }
  if (!logit_rows_.empty()) {
    const int64_t R = static_cast<int64_t>(logit_rows_.size());
    head_in_.resize(static_cast<size_t>(R * width));
    for (int64_t i = 0; i < R; ++i) {
      const float* src = x_.data() + logit_rows_[i] * width;
      std::copy(src, src + width, head_in_.data() + i * width);
    }
    logits_.resize(static_cast<size_t>(R * c.vocab_size));
    head(weights_.hc_head, weights_.norm, head_in_.data(), R, logits_.data());
    int64_t i = 0;
    for (const Seg& s : segs_) {
      backend::ForwardOutputs* out = s.item->out;
      if (!out || !s.item->options.want_logits)
        continue;
      const int64_t r = s.item->options.last_logits_only ? 1 : s.n;
      const float* src = logits_.data() + i * c.vocab_size;
      out->logits.assign(src, src + r * c.vocab_size);
      i += r;
    }
  }

  // The MTP block's inputs for the items that ask for it: every position whose next token is now
  // known, from the block's own position (streams kept from the last call) to the chunk's
  // second-to-last (as CpuModel::mtp_chunk).
  main_segs_ = segs_;
  std::vector<Seg> mtp_segs;
  mtp_in_.clear();
  mtp_tokens_.clear();
  mtp_pos_.clear();
  if (!weights_.mtp.empty()) {
    for (const Seg& s : main_segs_) {
      if (!s.item->options.run_mtp)
        continue;
      const state::SequenceState& st = *s.item->state;
      const int64_t mtp_first = st.mtp_num_tokens();
      const int64_t m = s.first_pos + s.n - 1 - mtp_first;
      if (m <= 0)
        continue;
      Seg ms;
      ms.item = s.item;
      ms.row0 = static_cast<int64_t>(mtp_tokens_.size());
      ms.n = m;
      ms.first_pos = mtp_first;
      mtp_segs.push_back(ms);
      for (int64_t i = 0; i < m; ++i) {
        const int64_t pos = mtp_first + i;
        const float* src = pos < s.first_pos ? st.final_streams(pos)
                                             : x_.data() + (s.row0 + pos - s.first_pos) * width;
        mtp_in_.insert(mtp_in_.end(), src, src + width);
        mtp_tokens_.push_back(s.item->tokens[static_cast<size_t>(pos + 1 - s.first_pos)]);
        mtp_pos_.push_back(pos);
      }
    }
  }
  // The final streams the MTP block needs later (as the reference keeps them), then advance.
  for (const Seg& s : main_segs_) {
    state::SequenceState& st = *s.item->state;
    if (!weights_.mtp.empty())
      reference_.store_final_streams(st, x_.data() + s.row0 * width, s.n);
    st.advance(s.n);
  }
  if (mtp_segs.empty())
    return Status();
  // The MTP block over all of them at once.
  segs_ = mtp_segs;
  rows_ = static_cast<int64_t>(mtp_tokens_.size());
  set_rows(mtp_tokens_.data(), mtp_pos_.data());
  bool want = false;
  for (const Seg& s : segs_) want = want || (s.item->out && s.item->options.want_mtp_logits);
  if (want)
    mtp_logits_.resize(static_cast<size_t>(rows_ * c.vocab_size));
  mtp_rows(mtp_in_.data(), want ? mtp_logits_.data() : nullptr, nullptr);
  for (const Seg& s : segs_) {
    backend::ForwardOutputs* out = s.item->out;
    if (out && s.item->options.want_mtp_logits) {
      const float* src = mtp_logits_.data() + s.row0 * c.vocab_size;
      out->mtp_logits.assign(src, src + s.n * c.vocab_size);
      out->mtp_first_pos = s.first_pos;
      out->mtp_count = s.n;
    }
    s.item->state->set_mtp_num_tokens(s.first_pos + s.n);
  }
  return Status();
}

void FastCpuModel::set_rows(const int32_t* tokens, const int64_t* positions) {
  const int64_t N = rows_;
  row_token_.resize(static_cast<size_t>(N));
  row_pos_.resize(static_cast<size_t>(N));
  row_seg_.resize(static_cast<size_t>(N));
  for (size_t si = 0; si < segs_.size(); ++si) {
    const Seg& s = segs_[si];
    for (int64_t t = 0; t < s.n; ++t) row_seg_[s.row0 + t] = static_cast<int32_t>(si);
  }
  for (int64_t r = 0; r < N; ++r) {
    row_token_[r] = tokens[r];
    row_pos_[r] = positions[r];
  }
  rope_ready_[0] = rope_ready_[1] = false;
}

void FastCpuModel::mtp_rows(const float* streams, float* logits, float* streams_out) {
  // Spec 3.11 (as CpuModel::mtp): x = e_proj(enorm(embed[next])) + h_proj(hnorm(streams)) per
  // stream, the block's decoder layer, then its own head path.
  const auto& c = config_;
  const model::MtpWeights& w = weights_.mtp[0];
  const int64_t N = rows_;
  const int64_t hidden = c.hidden_size;
  const int64_t hc = c.hc_mult;
  const float eps = static_cast<float>(c.rms_norm_eps);
  mtp_e_.resize(static_cast<size_t>(N * hidden));
  for (int64_t t = 0; t < N; ++t)
    weights_.embed.dequant_row(row_token_[t], mtp_e_.data() + t * hidden);
  rms_norm(mtp_e_.data(), N, hidden, w.enorm.data(), eps, mtp_e_.data());
  mtp_ep_.resize(static_cast<size_t>(N * hidden));
  linear(w.e_proj, mtp_e_.data(), N, mtp_ep_.data(), quantize_acts());
  mtp_h_.resize(static_cast<size_t>(N * hc * hidden));
  rms_norm(streams, N * hc, hidden, w.hnorm.data(), eps, mtp_h_.data());
  mtp_x_.resize(static_cast<size_t>(N * hc * hidden));
  linear(w.h_proj, mtp_h_.data(), N * hc, mtp_x_.data(), quantize_acts());
  for (int64_t t = 0; t < N; ++t) {
    const float* e = mtp_ep_.data() + t * hidden;
    for (int64_t j = 0; j < hc; ++j) {
      float* row = mtp_x_.data() + (t * hc + j) * hidden;
      for (int64_t i = 0; i < hidden; ++i) row[i] += e[i];
    }
  }
  mtp_pass_ = true;
  layer(0, mtp_x_);
  mtp_pass_ = false;
  if (logits)
    head(w.hc_head, w.norm, mtp_x_.data(), N, logits);
  if (streams_out)
    std::copy(mtp_x_.begin(), mtp_x_.begin() + N * hc * hidden, streams_out);
}

Status FastCpuModel::mtp_draft_batch(std::span<backend::DraftItem> items) {
  const auto& c = config_;
  const int64_t width = c.hc_mult * c.hidden_size;
  // Every item's step s runs as one row of a batched MTP pass; items drop out after their
  // num_steps.
  draft_items_.assign(items.size(), backend::ForwardItem());
  int32_t max_steps = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    backend::DraftItem& it = items[i];
    it.status = reference_.check_draft(*it.state, it.next_token, it.num_steps, it.catch_up);
    draft_items_[i].state = it.state;
    if (it.status.ok())
      max_steps = std::max(max_steps, it.num_steps);
  }
  // The catch-up (DraftItem::catch_up): every item's positions behind as rows of one pass,
  // without the head.
  segs_.clear();
  mtp_tokens_.clear();
  mtp_pos_.clear();
  mtp_in_.clear();
  for (size_t i = 0; i < items.size(); ++i) {
    backend::DraftItem& it = items[i];
    if (!it.status.ok() || it.catch_up.empty())
      continue;
    Seg s;
    s.item = &draft_items_[i];
    s.row0 = static_cast<int64_t>(mtp_tokens_.size());
    s.n = static_cast<int64_t>(it.catch_up.size());
    s.first_pos = it.state->mtp_num_tokens();
    segs_.push_back(s);
    for (int64_t t = 0; t < s.n; ++t) {
      const float* src = it.state->final_streams(s.first_pos + t);
      mtp_in_.insert(mtp_in_.end(), src, src + width);
      mtp_tokens_.push_back(it.catch_up[static_cast<size_t>(t)]);
      mtp_pos_.push_back(s.first_pos + t);
    }
  }
  if (!segs_.empty()) {
    rows_ = static_cast<int64_t>(mtp_tokens_.size());
    set_rows(mtp_tokens_.data(), mtp_pos_.data());
    mtp_rows(mtp_in_.data(), nullptr, nullptr);
  }
  draft_tok_.resize(items.size());
  for (int32_t step = 0; step < max_steps; ++step) {
    segs_.clear();
    draft_active_.clear();
    mtp_tokens_.clear();
    mtp_pos_.clear();
    mtp_in_.resize(items.size() * static_cast<size_t>(width));
    for (size_t i = 0; i < items.size(); ++i) {
      backend::DraftItem& it = items[i];
      if (!it.status.ok() || step >= it.num_steps)
        continue;
      const int64_t pos0 = it.state->num_tokens() - 1;
      Seg s;
      s.item = &draft_items_[i];
      s.row0 = static_cast<int64_t>(draft_active_.size());
      s.n = 1;
      s.first_pos = pos0 + step;
      // Step 0: the main model's streams at the last position; later: the block's own output.
      const float* src = step == 0 ? it.state->final_streams(pos0)
                                   : draft_prev_.data() + static_cast<int64_t>(i) * width;
      std::copy(src, src + width, mtp_in_.data() + s.row0 * width);
      segs_.push_back(s);
      mtp_tokens_.push_back(step == 0 ? it.next_token : draft_tok_[i]);
      mtp_pos_.push_back(s.first_pos);
      draft_active_.push_back(i);
    }
    rows_ = static_cast<int64_t>(draft_active_.size());
    set_rows(mtp_tokens_.data(), mtp_pos_.data());
    mtp_logits_.resize(static_cast<size_t>(rows_ * c.vocab_size));
    draft_streams_.resize(static_cast<size_t>(rows_ * width));
    mtp_rows(mtp_in_.data(), mtp_logits_.data(), draft_streams_.data());
    // Keep each item's output streams at its own index for the next step.
    if (step_streams_.size() < items.size() * static_cast<size_t>(width))
      step_streams_.resize(items.size() * static_cast<size_t>(width));
    for (size_t r = 0; r < draft_active_.size(); ++r) {
      const size_t i = draft_active_[r];
      backend::DraftItem& it = items[i];
      const float* lg = mtp_logits_.data() + static_cast<int64_t>(r) * c.vocab_size;
      draft_tok_[i] = cpu::top1(lg, c.vocab_size, &it.probs[step]);
      it.tokens[step] = draft_tok_[i];
      std::copy(draft_streams_.data() + static_cast<int64_t>(r) * width,
                draft_streams_.data() + static_cast<int64_t>(r + 1) * width,
                step_streams_.data() + static_cast<int64_t>(i) * width);
    }
    draft_prev_.swap(step_streams_);
  }
  for (backend::DraftItem& it : items) {
    if (it.status.ok())
      it.state->set_mtp_num_tokens(it.state->num_tokens() - (it.num_steps > 0 ? 0 : 1));
  }
  return Status();
}

void FastCpuModel::layer(size_t l, std::vector<float>& x) {
  const auto& c = config_;
  const model::LayerWeights& w = layer_weights(l);
  const int64_t N = rows_;
  const int64_t hc = c.hc_mult;
  const int64_t hidden = c.hidden_size;
  const int64_t width = hc * hidden;
  const float norm_eps = static_cast<float>(c.rms_norm_eps);
  // One mHC-wrapped sub-layer over the step's rows: x [N, hc, hidden] updated in place.
  auto sublayer = [&](const model::HyperConnWeights& hw,
                      const std::vector<float>& norm_w,
                      auto&& body) {
    HyperConnParams p;
    p.fn = hw.fn.data();
    p.base = hw.base.data();
    p.scale = hw.scale.data();
    p.hc = hc;
    p.hidden = hidden;
    p.sinkhorn_iters = c.hc_sinkhorn_iters;
    p.hc_eps = static_cast<float>(c.hc_eps);
    p.norm_eps = norm_eps;
    const int64_t mix_rows = (2 + hc) * hc;
    WeightView fn;
    fn.elem = WeightElem::kF32;
    fn.data = hw.fn.data();
    fn.rows = mix_rows;
    fn.cols = width;
    fn.ld = width;
    mix_.resize(static_cast<size_t>(N * mix_rows));
    post_.resize(static_cast<size_t>(N * hc));
    comb_.resize(static_cast<size_t>(N * hc * hc));
    u_.resize(static_cast<size_t>(N * hidden));
    gemm(fn, x.data(), width, N, mix_.data(), mix_rows, pool_);
    const GemmKernels& vk = active_kernels();
    parallel_rows(N, 32, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const float* xt = x.data() + t * width;
        // The mean square in fp32 vector lanes (the reference sums in double: rounding only).
        const float ss = vk.dot(xt, xt, width);
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(width) + norm_eps);
        float* m = mix_.data() + t * mix_rows;
        for (int64_t i = 0; i < mix_rows; ++i) m[i] *= r;
        hc_pre_mixed(
            p, m, xt, post_.data() + t * hc, comb_.data() + t * hc * hc, u_.data() + t * hidden);
      }
    });
    rms_norm(u_.data(), N, hidden, norm_w.data(), norm_eps, u_.data());
    f_.resize(static_cast<size_t>(N * hidden));
    body(u_.data(), f_.data());
    xnext_.resize(static_cast<size_t>(N * width));
    parallel_rows(N, 32, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        vk.hc_post(hc,
                   hidden,
                   f_.data() + t * hidden,
                   x.data() + t * width,
                   post_.data() + t * hc,
                   comb_.data() + t * hc * hc,
                   xnext_.data() + t * width);
      }
    });
    x.swap(xnext_);
  };
  sublayer(w.hc_attn, w.attn_norm, [&](const float* u, float* f) { attention(l, u, f); });
  sublayer(
      w.hc_ffn, w.ffn_norm, [&](const float* u, float* f) { moe(w.ffn, layer_plan(l), u, f); });
}

void FastCpuModel::moe(const model::MoeWeights& w,
                       const LayerPlan& plan,
                       const float* x,
                       float* out) {
  const auto& c = config_;
  const int64_t N = rows_;
  const int64_t hidden = c.hidden_size;
  const int64_t n_exp = c.n_routed_experts;
  const int64_t k = c.num_experts_per_tok;
  // Router (fp32, never quantised), as CpuModel::moe_route.
  scores_.resize(static_cast<size_t>(N * n_exp));
  linear(w.gate, x, N, scores_.data(), false);
  ids_.resize(static_cast<size_t>(N * k));
  gates_.resize(static_cast<size_t>(N * k));
  parallel_rows(N, 64, [&](int64_t t0, int64_t t1) {
    float biased[256];
    int32_t order[256];
    DSI_CHECK(n_exp <= 256, "more than 256 routed experts");
    for (int64_t t = t0; t < t1; ++t) {
      float* s = scores_.data() + t * n_exp;
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
      int32_t* sel = ids_.data() + t * k;
      if (plan.moe == MoeType::kHash) {
        for (int64_t i = 0; i < k; ++i) {
          sel[i] = w.tid2eid[static_cast<size_t>(row_token_[t] * k + i)];
        }
      } else {
        for (int64_t e = 0; e < n_exp; ++e) {
          biased[e] = s[e] + (w.bias.empty() ? 0.0f : w.bias[e]);
          order[e] = static_cast<int32_t>(e);
        }
        std::partial_sort(order, order + k, order + n_exp, [&](int32_t a, int32_t b) {
          return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
        });
        std::copy(order, order + k, sel);
      }
      float sum = 0.0f;
      for (int64_t i = 0; i < k; ++i) sum += s[sel[i]];
      for (int64_t i = 0; i < k; ++i) {
        float g = s[sel[i]];
        if (c.norm_topk_prob)
          g = g / (sum + 1e-20f);
        gates_[t * k + i] = g * static_cast<float>(c.routed_scaling_factor);
      }
    }
  });

  // Shared expert over every row (gate 1), then each routed expert once over its rows, added in
  // ascending expert id (the reference's order of additions).
  std::fill(out, out + N * hidden, 0.0f);
  ones_.assign(static_cast<size_t>(N), 1.0f);
  // An expert gets at most every row: sized for that, a step never grows them.
  xs_.reserve(static_cast<size_t>(N * hidden));
  ys_.reserve(static_cast<size_t>(N * hidden));
  gs_.reserve(static_cast<size_t>(N));
  expert(w.shared, x, N, ones_.data(), out);
  // Group (row, slot) pairs by expert: counting sort, rows ascending within an expert.
  expert_start_.assign(static_cast<size_t>(n_exp + 1), 0);
  for (int64_t i = 0; i < N * k; ++i) ++expert_start_[ids_[i] + 1];
  for (int64_t e = 0; e < n_exp; ++e) expert_start_[e + 1] += expert_start_[e];
  expert_rows_.resize(static_cast<size_t>(N * k));
  {
    std::vector<int32_t>& fill = expert_start_;  // reuse: positions advance, then restored
    for (int64_t i = 0; i < N * k; ++i) expert_rows_[fill[ids_[i]]++] = static_cast<int32_t>(i);
    for (int64_t e = n_exp; e > 0; --e) fill[e] = fill[e - 1];
    fill[0] = 0;
  }
  for (int64_t e = 0; e < n_exp; ++e) {
    const int64_t b = expert_start_[e];
    const int64_t m = expert_start_[e + 1] - b;
    if (m == 0)
      continue;
    xs_.resize(static_cast<size_t>(m * hidden));
    gs_.resize(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r) {
      const int64_t slot = expert_rows_[b + r];
      const int64_t t = slot / k;
      std::copy(x + t * hidden, x + (t + 1) * hidden, xs_.data() + r * hidden);
      gs_[r] = gates_[slot];
    }
    ys_.assign(static_cast<size_t>(m * hidden), 0.0f);
    expert(w.experts[static_cast<size_t>(e)], xs_.data(), m, gs_.data(), ys_.data());
    for (int64_t r = 0; r < m; ++r) {
      float* o = out + (expert_rows_[b + r] / k) * hidden;
      const float* y = ys_.data() + r * hidden;
      for (int64_t i = 0; i < hidden; ++i) o[i] += y[i];
    }
  }
}

void FastCpuModel::expert(const model::ExpertWeights& w,
                          const float* x,
                          int64_t n,
                          const float* gates,
                          float* out_accum) {
  const int64_t inter = w.w1.rows;
  const int64_t hidden = w.w2.rows;
  const float limit = static_cast<float>(config_.swiglu_limit);
  ea_.resize(static_cast<size_t>(n * inter));
  eu_.resize(static_cast<size_t>(n * inter));
  linear(w.w1, x, n, ea_.data(), quantize_acts());
  linear(w.w3, x, n, eu_.data(), quantize_acts());
  const GemmKernels& vk = active_kernels();
  for (int64_t t = 0; t < n; ++t) {
    vk.swiglu(ea_.data() + t * inter, eu_.data() + t * inter, inter, gates[t], limit);
  }
  ey_.resize(static_cast<size_t>(n * hidden));
  linear(w.w2, ea_.data(), n, ey_.data(), quantize_acts());
  for (int64_t i = 0; i < n * hidden; ++i) out_accum[i] += ey_[i];
}

void FastCpuModel::head(const model::HyperHeadWeights& hw,
                        const std::vector<float>& norm,
                        const float* streams,
                        int64_t n,
                        float* logits) {
  const auto& c = config_;
  const int64_t hc = c.hc_mult;
  const int64_t hidden = c.hidden_size;
  const int64_t width = hc * hidden;
  const float norm_eps = static_cast<float>(c.rms_norm_eps);
  HyperHeadParams p;
  p.fn = hw.fn.data();
  p.base = hw.base.data();
  p.scale = hw.scale.data();
  p.hc = hc;
  p.hidden = hidden;
  p.hc_eps = static_cast<float>(c.hc_eps);
  p.norm_eps = norm_eps;
  WeightView fn;
  fn.elem = WeightElem::kF32;
  fn.data = hw.fn.data();
  fn.rows = hc;
  fn.cols = width;
  fn.ld = width;
  head_mix_.resize(static_cast<size_t>(n * hc));
  head_u_.resize(static_cast<size_t>(n * hidden));
  gemm(fn, streams, width, n, head_mix_.data(), hc, pool_);
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = streams + t * width;
    double ss = 0.0;
    for (int64_t i = 0; i < width; ++i) ss += static_cast<double>(xt[i]) * xt[i];
    const float r =
        1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(width)) + norm_eps);
    float* m = head_mix_.data() + t * hc;
    for (int64_t i = 0; i < hc; ++i) m[i] *= r;
    hc_head_mixed(p, m, xt, head_u_.data() + t * hidden);
  }
  rms_norm(head_u_.data(), n, hidden, norm.data(), norm_eps, head_u_.data());
  linear(weights_.head, head_u_.data(), n, logits, false);  // LM head in fp32
}

}  // namespace dsinfer::cpu::fast
