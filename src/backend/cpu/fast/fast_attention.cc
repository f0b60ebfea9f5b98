// FastCpuModel::attention: the projections of all rows of the step as GEMMs, the compressors'
// pooling and the ring updates per sequence, and the indexer scores and sink attention per row
// in parallel (spec §3.4-3.8). The arithmetic of each step is the reference's
// (backend/cpu/attention.cc); only the summation order of the linears and of the q.k and p.V
// products (vector lanes, FMAs) differs.
#include <algorithm>
#include <cmath>

#include "backend/cpu/fast/fast_model.h"
#include "base/check.h"
#include "kernels/cpu/ops.h"
#include "numeric/float_formats.h"
#include "numeric/quant.h"

namespace dsinfer::cpu::fast {

using model::AttentionType;

namespace {

enum EntryPost { kPostNone = 0, kPostKvFp8 = 1, kPostIndexFp4 = 2 };

// Interleaved RoPE on the last 2*half dims with a precomputed (cos, sin) row: rope_apply's
// arithmetic exactly.
void rope_rot(float* x, int64_t dim, const float* cs, int64_t half, bool inverse) {
  float* r = x + (dim - 2 * half);
  for (int64_t i = 0; i < half; ++i) {
    const float c = cs[2 * i];
    const float s = inverse ? -cs[2 * i + 1] : cs[2 * i + 1];
    const float a = r[2 * i];
    const float b = r[2 * i + 1];
    r[2 * i] = a * c - b * s;
    r[2 * i + 1] = a * s + b * c;
  }
}

// attention_with_sink (kernels/cpu/ops.h) with caller-owned scratch for the logits, all heads
// against each key at once (qk), and p.V as an outer product over the keys (pv).
void sink_attention(const GemmKernels& kk,
                    const float* q,
                    int64_t heads,
                    int64_t dim,
                    const std::vector<const float*>& keys,
                    const float* sinks,
                    float scale,
                    std::vector<float>& logits,
                    float* out) {
  const int64_t nk = static_cast<int64_t>(keys.size());
  logits.resize(static_cast<size_t>(heads * nk));
  kk.qk(q, heads, keys.data(), nk, dim, logits.data(), nk);
  for (int64_t h = 0; h < heads; ++h) {
    float* l = logits.data() + h * nk;
    float m = sinks[h];
    for (int64_t j = 0; j < nk; ++j) {
      l[j] *= scale;
      m = std::max(m, l[j]);
    }
    double denom = std::exp(static_cast<double>(sinks[h]) - m);
    for (int64_t j = 0; j < nk; ++j) {
      l[j] = std::exp(l[j] - m);
      denom += l[j];
    }
    const float inv = static_cast<float>(1.0 / denom);
    for (int64_t j = 0; j < nk; ++j) l[j] *= inv;
  }
  std::fill(out, out + heads * dim, 0.0f);
  kk.pv(logits.data(), nk, heads, keys.data(), nk, dim, out);
}

// attention_with_sink_bf16 (kernels/cpu/ops.h), the same way: q must already be BF16 values. The
// rounded probabilities go through pv unnormalised; each head's output is divided by its
// denominator afterwards, as the reference function does.
void sink_attention_bf16(const GemmKernels& kk,
                         const float* q,
                         int64_t heads,
                         int64_t dim,
                         const std::vector<const float*>& keys,
                         const float* sinks,
                         float scale,
                         std::vector<float>& logits,
                         float* out) {
  const int64_t nk = static_cast<int64_t>(keys.size());
  const float log2e = 1.4426950408889634f;
  const float c = scale * log2e;
  logits.resize(static_cast<size_t>(heads * nk + heads));
  float* inv = logits.data() + heads * nk;
  kk.qk(q, heads, keys.data(), nk, dim, logits.data(), nk);
  for (int64_t h = 0; h < heads; ++h) {
    float* l = logits.data() + h * nk;
    const float us = sinks[h] * log2e;
    float umax = us;
    for (int64_t j = 0; j < nk; ++j) {
      l[j] *= c;
      umax = std::max(umax, l[j]);
    }
    const float m = std::ceil(umax);
    double denom = std::exp2(us - m);
    for (int64_t j = 0; j < nk; ++j) {
      const float e = std::exp2(l[j] - m);
      denom += e;
      l[j] = numeric::round_to_bf16(e);
    }
    inv[h] = static_cast<float>(1.0 / denom);
  }
  std::fill(out, out + heads * dim, 0.0f);
  kk.pv(logits.data(), nk, heads, keys.data(), nk, dim, out);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t d = 0; d < dim; ++d) out[h * dim + d] *= inv[h];
  }
}

}  // namespace

template <typename Emit>
void FastCpuModel::compress_seg(const model::CompressorWeights& w,
                                state::CompressorRows& rows,
                                int64_t ratio,
                                bool overlap,
                                int64_t d,
                                int post,
                                const std::vector<float>& freqs,
                                const Seg& s,
                                float* kv,
                                float* score,
                                Emit&& emit) {
  const int64_t width = rows.width();
  const int64_t m = ratio;
  const int64_t rd = config_.qk_rope_head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  DSI_CHECK(rows.end_pos() == s.first_pos,
            "compressor rows end at %lld, chunk starts at %lld",
            static_cast<long long>(rows.end_pos()),
            static_cast<long long>(s.first_pos));
  entry_.resize(static_cast<size_t>(d));
  for (int64_t t = 0; t < s.n; ++t) {
    const int64_t pos = s.first_pos + t;
    const float* ape = w.ape.data() + (pos % m) * width;
    float* srow = score + t * width;
    for (int64_t i = 0; i < width; ++i) srow[i] += ape[i];
    rows.append(kv + t * width, srow);
    if ((pos + 1) % m != 0)
      continue;
    const int64_t blk = (pos + 1) / m - 1;  // the block this token closes
    for (int64_t c = 0; c < d; ++c) {
      pool_logit_.clear();
      pool_value_.clear();
      if (overlap && blk > 0) {
        for (int64_t p = (blk - 1) * m; p < blk * m; ++p) {
          pool_logit_.push_back(rows.score_row(p)[c]);
          pool_value_.push_back(rows.kv_row(p)[c]);
        }
      }
      const int64_t off = overlap ? d : 0;
      for (int64_t p = blk * m; p < (blk + 1) * m; ++p) {
        pool_logit_.push_back(rows.score_row(p)[off + c]);
        pool_value_.push_back(rows.kv_row(p)[off + c]);
      }
      softmax(pool_logit_.data(), static_cast<int64_t>(pool_logit_.size()));
      float acc = 0.0f;
      for (size_t i = 0; i < pool_logit_.size(); ++i) acc += pool_logit_[i] * pool_value_[i];
      entry_[c] = acc;
    }
    rms_norm(entry_.data(), 1, d, w.norm.data(), eps, entry_.data());
    rope_apply(entry_.data(), d, freqs, blk * m, false);  // at the block's first position
    if (post == kPostKvFp8) {
      numeric::fp8_block_simulate(entry_.data(), d - rd, 64);
      numeric::bf16_simulate(entry_.data() + d - rd, rd);
    } else if (post == kPostIndexFp4) {
      numeric::hadamard_transform(entry_.data(), d);
      numeric::fp4_block_simulate(entry_.data(), d, 32);
    }
    emit(blk, entry_.data());
  }
}

void FastCpuModel::attention(size_t l, const float* x, float* out) {
  const auto& c = config_;
  const model::AttentionWeights& w = layer_weights(l).attn;
  const model::LayerPlan& plan = layer_plan(l);
  const int64_t N = rows_;
  const int64_t heads = c.num_attention_heads;
  const int64_t hd = c.head_dim;
  const int64_t rd = c.qk_rope_head_dim;
  const int64_t nope = hd - rd;
  const int64_t half = rd / 2;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const bool q8 = quantize_acts();
  const bool deepseek = numerics_ == model::Numerics::kDeepSeek;
  const std::vector<float>& freqs =
      plan.rope == model::RopeTable::kMain ? inv_freq_main_ : inv_freq_compress_;
  DSI_CHECK(static_cast<int64_t>(freqs.size()) == half, "rope table of %zu", freqs.size());
  const float* cs = rope_table(plan.rope);
  auto ls_of = [&](int64_t row) -> state::LayerState& {
    return layer_state(*segs_[static_cast<size_t>(row_seg_[row])].item->state, l);
  };

  // 3.4 (1-3) queries.
  const int64_t qlr = c.q_lora_rank;
  qr_.resize(static_cast<size_t>(N * qlr));
  linear(w.wq_a, x, N, qr_.data(), q8);
  rms_norm(qr_.data(), N, qlr, w.q_norm.data(), eps, qr_.data());
  q_.resize(static_cast<size_t>(N * heads * hd));
  linear(w.wq_b, qr_.data(), N, q_.data(), q8);
  rms_norm(q_.data(), N * heads, hd, nullptr, eps, q_.data());
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      rope_rot(q_.data() + (t * heads + h) * hd, hd, cs + t * rd, half, false);
    }
  }
  if (deepseek)  // BF16 queries (q feeds nothing but the attention)
    numeric::bf16_simulate(q_.data(), N * heads * hd);
  // 3.4 (4) the shared K=V vector.
  kv_.resize(static_cast<size_t>(N * hd));
  linear(w.wkv, x, N, kv_.data(), q8);
  rms_norm(kv_.data(), N, hd, w.kv_norm.data(), eps, kv_.data());
  for (int64_t t = 0; t < N; ++t) {
    rope_rot(kv_.data() + t * hd, hd, cs + t * rd, half, false);
    if (deepseek) {  // the stored KV row: FP8 nope dims, BF16 RoPE dims
      numeric::fp8_block_simulate(kv_.data() + t * hd, nope, 64);
      numeric::bf16_simulate(kv_.data() + t * hd + nope, rd);
    }
  }

  // 3.6 compressors: projections for all rows, pooling per sequence.
  if (plan.attention != AttentionType::kSliding) {
    const int64_t width = w.compressor.wkv.rows;
    ckv_.resize(static_cast<size_t>(N * width));
    csc_.resize(static_cast<size_t>(N * width));
    linear(w.compressor.wkv, x, N, ckv_.data(), false);  // compressor projections stay fp32
    linear(w.compressor.wgate, x, N, csc_.data(), false);
    for (const Seg& s : segs_) {
      state::LayerState& ls = layer_state(*s.item->state, l);
      compress_seg(w.compressor,
                   ls.comp_rows,
                   plan.compress_ratio,
                   plan.attention == AttentionType::kCsa,
                   hd,
                   deepseek ? kPostKvFp8 : kPostNone,
                   freqs,
                   s,
                   ckv_.data() + s.row0 * width,
                   csc_.data() + s.row0 * width,
                   [&ls](int64_t blk, const float* e) { ls.put_entry(blk, e); });
    }
  }

  const int64_t ih = c.index_n_heads;
  const int64_t ihd = c.index_head_dim;
  const bool csa = plan.attention == AttentionType::kCsa;
  if (csa) {
    const int64_t width = w.indexer_compressor.wkv.rows;
    ikv_.resize(static_cast<size_t>(N * width));
    isc_.resize(static_cast<size_t>(N * width));
    linear(w.indexer_compressor.wkv, x, N, ikv_.data(), false);
    linear(w.indexer_compressor.wgate, x, N, isc_.data(), false);
    for (const Seg& s : segs_) {
      state::LayerState& ls = layer_state(*s.item->state, l);
      compress_seg(w.indexer_compressor,
                   ls.index_rows,
                   plan.compress_ratio,
                   true,
                   ihd,
                   deepseek ? kPostIndexFp4 : kPostNone,
                   freqs,
                   s,
                   ikv_.data() + s.row0 * width,
                   isc_.data() + s.row0 * width,
                   [&ls](int64_t blk, const float* k) { ls.put_index_key(blk, k); });
    }
    qi_.resize(static_cast<size_t>(N * ih * ihd));
    linear(w.indexer_wq_b, qr_.data(), N, qi_.data(), q8);
    hw_.resize(static_cast<size_t>(N * ih));
    linear(w.indexer_weights_proj, x, N, hw_.data(), false);
  }

  // 3.8 + 3.4 (5-7) per row, in parallel: the indexer's top-k, then sink attention over the
  // window and the compressed keys, inverse RoPE on the output.
  const int64_t window = c.sliding_window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float hw_scale =
      1.0f / std::sqrt(static_cast<float>(ihd)) / std::sqrt(static_cast<float>(ih));
  o_.resize(static_cast<size_t>(N * heads * hd));
  const int threads = pool_ ? pool_->threads() : 1;
  if (row_scratch_.size() < static_cast<size_t>(threads)) {
    // Sized once for the longest context, so that steps never grow them.
    int64_t min_ratio = 0;
    for (const model::LayerPlan& p : c.layers) {
      if (p.compress_ratio > 0 && (min_ratio == 0 || p.compress_ratio < min_ratio))
        min_ratio = p.compress_ratio;
    }
    const int64_t max_entries =
        min_ratio > 0 ? c.max_position_embeddings / min_ratio + 1 : int64_t{1};
    row_scratch_.resize(static_cast<size_t>(threads));
    for (RowScratch& sc : row_scratch_) {
      sc.keys.reserve(static_cast<size_t>(c.sliding_window + max_entries));
      sc.logits.reserve(
          static_cast<size_t>(c.num_attention_heads * (c.sliding_window + max_entries + 1)));
      sc.scores.reserve(static_cast<size_t>(max_entries));
      sc.order.reserve(static_cast<size_t>(max_entries));
      sc.selected.reserve(static_cast<size_t>(max_entries));
    }
  }
  const GemmKernels& kk = active_kernels();
  auto rows_task = [&](int64_t t0, int64_t t1, RowScratch& sc) {
    for (int64_t t = t0; t < t1; ++t) {
      const Seg& s = segs_[static_cast<size_t>(row_seg_[t])];
      const state::LayerState& ls = ls_of(t);
      const int64_t pos = row_pos_[t];
      sc.selected.clear();
      if (csa) {
        for (int64_t h = 0; h < ih; ++h) {
          float* v = qi_.data() + (t * ih + h) * ihd;
          rope_rot(v, ihd, cs + t * rd, half, false);
          if (deepseek) {
            numeric::hadamard_transform(v, ihd);
            numeric::fp4_block_simulate(v, ihd, 32);
          }
        }
        const int64_t visible = (pos + 1) / plan.compress_ratio;
        sc.scores.resize(static_cast<size_t>(visible));
        sc.order.resize(static_cast<size_t>(visible));
        for (int64_t blk = 0; blk < visible; ++blk) {
          const float* key = ls.index_key(blk);
          float sum = 0.0f;
          for (int64_t h = 0; h < ih; ++h) {
            const float* v = qi_.data() + (t * ih + h) * ihd;
            sum += hw_[t * ih + h] * hw_scale * std::max(0.0f, kk.dot(v, key, ihd));
          }
          sc.scores[blk] = sum;
          sc.order[blk] = static_cast<int32_t>(blk);
        }
        const int64_t k = std::min(c.index_topk, visible);
        const float* sv = sc.scores.data();
        std::partial_sort(
            sc.order.begin(), sc.order.begin() + k, sc.order.end(), [sv](int32_t a, int32_t b) {
              return sv[a] > sv[b] || (sv[a] == sv[b] && a < b);
            });
        sc.selected.assign(sc.order.begin(), sc.order.begin() + k);
      }
      sc.keys.clear();
      for (int64_t p = std::max<int64_t>(ls.window_floor, pos - window + 1); p <= pos; ++p) {
        sc.keys.push_back(p < s.first_pos ? ls.ring_slot(p)
                                          : kv_.data() + (s.row0 + (p - s.first_pos)) * hd);
      }
      if (plan.attention == AttentionType::kHca) {
        const int64_t visible = (pos + 1) / plan.compress_ratio;
        for (int64_t blk = 0; blk < visible; ++blk) sc.keys.push_back(ls.entry(blk));
      } else if (csa) {
        for (int32_t blk : sc.selected) sc.keys.push_back(ls.entry(blk));
      }
      float* ot = o_.data() + t * heads * hd;
      (deepseek ? sink_attention_bf16 : sink_attention)(kk,
                                                        q_.data() + t * heads * hd,
                                                        heads,
                                                        hd,
                                                        sc.keys,
                                                        w.attn_sink.data(),
                                                        scale,
                                                        sc.logits,
                                                        ot);
      for (int64_t h = 0; h < heads; ++h) rope_rot(ot + h * hd, hd, cs + t * rd, half, true);
      if (deepseek) {  // BF16 attention output into wo_a (docs/numerics.md, point 5)
        for (int64_t i = 0; i < heads * hd; ++i) ot[i] = numeric::round_to_bf16(ot[i]);
      }
    }
  };
  // A row's attention is some 0.1-0.5M multiply-adds: below 8 rows one thread does them all.
  const int64_t tasks = std::min<int64_t>(threads, N / 8);
  if (tasks <= 1 || !pool_) {
    rows_task(0, N, row_scratch_[0]);
  } else {
    pool_->run(tasks, [&](int64_t i) {
      rows_task(N * i / tasks, N * (i + 1) / tasks, row_scratch_[static_cast<size_t>(i)]);
    });
  }
  for (const Seg& s : segs_) {
    state::LayerState& ls = layer_state(*s.item->state, l);
    for (int64_t t = 0; t < s.n; ++t) {
      const float* src = kv_.data() + (s.row0 + t) * hd;
      std::copy(src, src + hd, ls.ring_slot(s.first_pos + t));
    }
  }

  // 3.4 (8) grouped output projection: wo_a per group (never quantised), then wo_b.
  const int64_t groups = c.o_groups;
  const int64_t olr = c.o_lora_rank;
  const int64_t group_in = heads * hd / groups;
  z_.resize(static_cast<size_t>(N * groups * olr));
  const WeightView wo_a = packed_.get(w.wo_a);
  for (int64_t g = 0; g < groups; ++g) {
    linear(wo_a.slice_rows(g * olr, olr),
           o_.data() + g * group_in,
           heads * hd,
           N,
           z_.data() + g * olr,
           groups * olr,
           false);
  }
  linear(w.wo_b, z_.data(), N, out, q8);
}

}  // namespace dsinfer::cpu::fast
