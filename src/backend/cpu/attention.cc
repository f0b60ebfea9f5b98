// CpuModel::attention: the q low-rank path, the shared K=V head, the compressors (CSA with
// overlap, HCA) and the Lightning indexer, sink attention with inverse RoPE on the output, and
// the grouped output projection (spec §3.4-3.8, §4.2).
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_model.h"
#include "base/check.h"
#include "kernels/cpu/ops.h"
#include "numeric/float_formats.h"
#include "numeric/quant.h"

namespace dsinfer::cpu {

using model::AttentionType;

namespace {

enum class EntryPost { kKvFp8, kIndexFp4, kNone };

struct CompressorArgs {
  const model::CompressorWeights* w = nullptr;
  state::CompressorRows* rows = nullptr;
  int64_t ratio = 0;
  bool overlap = false;
  int64_t d = 0;  // entry width
  int64_t rope_dim = 0;
  const std::vector<float>* inv_freq = nullptr;
  float eps = 1e-6f;
  EntryPost post = EntryPost::kNone;
};

// Projects the chunk's tokens into the compressor's row ring and, whenever a token closes a
// block, pools that block into one entry and hands it to `emit(w, entry)` (spec §3.6). Pooling
// token by token keeps the ring small (3m + rollback rows) for chunks of any length.
template <typename Emit>
void compress_chunk(
    const CompressorArgs& a, const float* x, int64_t first_pos, int64_t n, Emit&& emit) {
  const int64_t width = a.rows->width();
  const int64_t m = a.ratio;
  const int64_t d = a.d;
  DSI_CHECK(a.rows->end_pos() == first_pos,
            "compressor rows end at %lld, chunk starts at %lld",
            static_cast<long long>(a.rows->end_pos()),
            static_cast<long long>(first_pos));
  std::vector<float> kv(static_cast<size_t>(n * width));
  std::vector<float> sc(static_cast<size_t>(n * width));
  linear(a.w->wkv, x, n, kv.data(), false);  // compressor projections stay fp32
  linear(a.w->wgate, x, n, sc.data(), false);
  std::vector<float> logit;
  std::vector<float> value;
  std::vector<float> e(static_cast<size_t>(d));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = first_pos + t;
    const float* ape = a.w->ape.data() + (pos % m) * width;
    float* srow = sc.data() + t * width;
    for (int64_t i = 0; i < width; ++i) srow[i] += ape[i];
    a.rows->append(kv.data() + t * width, srow);
    if ((pos + 1) % m != 0)
      continue;
    const int64_t w = (pos + 1) / m - 1;  // the block this token closes
    for (int64_t c = 0; c < d; ++c) {
      logit.clear();
      value.clear();
      if (a.overlap && w > 0) {  // previous block's first half feeds this entry
        for (int64_t p = (w - 1) * m; p < w * m; ++p) {
          logit.push_back(a.rows->score_row(p)[c]);
          value.push_back(a.rows->kv_row(p)[c]);
        }
      }
      const int64_t off = a.overlap ? d : 0;
      for (int64_t p = w * m; p < (w + 1) * m; ++p) {
        logit.push_back(a.rows->score_row(p)[off + c]);
        value.push_back(a.rows->kv_row(p)[off + c]);
      }
      softmax(logit.data(), static_cast<int64_t>(logit.size()));
      float acc = 0.0f;
      for (size_t i = 0; i < logit.size(); ++i) acc += logit[i] * value[i];
      e[c] = acc;
    }
    rms_norm(e.data(), 1, d, a.w->norm.data(), a.eps, e.data());
    rope_apply(e.data(), d, *a.inv_freq, w * m, false);  // at the block's first position
    if (a.post == EntryPost::kKvFp8) {
      numeric::fp8_block_simulate(e.data(), d - a.rope_dim, 64);
      numeric::bf16_simulate(e.data() + d - a.rope_dim, a.rope_dim);
    } else if (a.post == EntryPost::kIndexFp4) {
      numeric::hadamard_transform(e.data(), d);
      numeric::fp4_block_simulate(e.data(), d, 32);
    }
    emit(w, e.data());
  }
}

}  // namespace

void CpuModel::attention(const model::AttentionWeights& w,
                         const model::LayerPlan& plan,
                         state::LayerState& ls,
                         const float* x,
                         int64_t first_pos,
                         int64_t n,
                         float* out) const {
  const auto& c = config_;
  const int64_t heads = c.num_attention_heads;
  const int64_t hd = c.head_dim;
  const int64_t rd = c.qk_rope_head_dim;
  const int64_t nope = hd - rd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const bool q8 = quantize_acts();
  const bool deepseek = numerics_ == model::Numerics::kDeepSeek;
  const std::vector<float>& freqs = inv_freq(plan.rope);

  // 3.4 (1-3) queries.
  const int64_t qlr = c.q_lora_rank;
  std::vector<float> qr(static_cast<size_t>(n * qlr));
  linear(w.wq_a, x, n, qr.data(), q8);
  rms_norm(qr.data(), n, qlr, w.q_norm.data(), eps, qr.data());
  std::vector<float> q(static_cast<size_t>(n * heads * hd));
  linear(w.wq_b, qr.data(), n, q.data(), q8);
  rms_norm(q.data(), n * heads, hd, nullptr, eps, q.data());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      rope_apply(q.data() + (t * heads + h) * hd, hd, freqs, first_pos + t, false);
    }
  }
  // 3.4 (4) the shared K=V vector.
  std::vector<float> kv(static_cast<size_t>(n * hd));
  linear(w.wkv, x, n, kv.data(), q8);
  rms_norm(kv.data(), n, hd, w.kv_norm.data(), eps, kv.data());
  for (int64_t t = 0; t < n; ++t) {
    rope_apply(kv.data() + t * hd, hd, freqs, first_pos + t, false);
    if (deepseek) {  // the stored KV row: FP8 nope dims, BF16 RoPE dims
      numeric::fp8_block_simulate(kv.data() + t * hd, nope, 64);
      numeric::bf16_simulate(kv.data() + t * hd + nope, rd);
    }
  }

  // 3.6 compressors: append every entry that closes inside this chunk.
  if (plan.attention != AttentionType::kSliding) {
    CompressorArgs a;
    a.w = &w.compressor;
    a.rows = &ls.comp_rows;
    a.ratio = plan.compress_ratio;
    a.overlap = plan.attention == AttentionType::kCsa;
    a.d = hd;
    a.rope_dim = rd;
    a.inv_freq = &freqs;
    a.eps = eps;
    a.post = deepseek ? EntryPost::kKvFp8 : EntryPost::kNone;
    compress_chunk(
        a, x, first_pos, n, [&ls](int64_t blk, const float* e) { ls.put_entry(blk, e); });
  }

  // 3.8 Lightning indexer: per query, the top-k visible blocks.
  std::vector<std::vector<int32_t>> selected(static_cast<size_t>(n));
  if (plan.attention == AttentionType::kCsa) {
    const int64_t ih = c.index_n_heads;
    const int64_t ihd = c.index_head_dim;
    CompressorArgs a;
    a.w = &w.indexer_compressor;
    a.rows = &ls.index_rows;
    a.ratio = plan.compress_ratio;
    a.overlap = true;
    a.d = ihd;
    a.rope_dim = rd;
    a.inv_freq = &freqs;
    a.eps = eps;
    a.post = deepseek ? EntryPost::kIndexFp4 : EntryPost::kNone;
    compress_chunk(
        a, x, first_pos, n, [&ls](int64_t blk, const float* k) { ls.put_index_key(blk, k); });

    std::vector<float> qi(static_cast<size_t>(n * ih * ihd));
    linear(w.indexer_wq_b, qr.data(), n, qi.data(), q8);
    std::vector<float> hw(static_cast<size_t>(n * ih));
    linear(w.indexer_weights_proj, x, n, hw.data(), false);
    const float hw_scale =
        1.0f / std::sqrt(static_cast<float>(ihd)) / std::sqrt(static_cast<float>(ih));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < ih; ++h) {
        float* v = qi.data() + (t * ih + h) * ihd;
        rope_apply(v, ihd, freqs, first_pos + t, false);
        if (deepseek) {
          numeric::hadamard_transform(v, ihd);
          numeric::fp4_block_simulate(v, ihd, 32);
        }
      }
      const int64_t pos = first_pos + t;
      const int64_t visible = (pos + 1) / plan.compress_ratio;
      std::vector<float> score(static_cast<size_t>(visible), 0.0f);
      for (int64_t blk = 0; blk < visible; ++blk) {
        const float* key = ls.index_key(blk);
        float s = 0.0f;
        for (int64_t h = 0; h < ih; ++h) {
          const float* v = qi.data() + (t * ih + h) * ihd;
          float dotv = 0.0f;
          for (int64_t i = 0; i < ihd; ++i) dotv += v[i] * key[i];
          s += hw[t * ih + h] * hw_scale * std::max(0.0f, dotv);
        }
        score[blk] = s;
      }
      selected[t] = top_k_indices(score.data(), visible, std::min(c.index_topk, visible));
    }
  }

  // 3.4 (5-7) attention per query over window + compressed keys, inverse RoPE on the output.
  const int64_t window = c.sliding_window;
  std::vector<float> o(static_cast<size_t>(n * heads * hd));
  std::vector<const float*> keys;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = first_pos + t;
    keys.clear();
    for (int64_t p = std::max<int64_t>(ls.window_floor, pos - window + 1); p <= pos; ++p) {
      keys.push_back(p < first_pos ? ls.ring_slot(p) : kv.data() + (p - first_pos) * hd);
    }
    if (plan.attention == AttentionType::kHca) {
      const int64_t visible = (pos + 1) / plan.compress_ratio;
      for (int64_t blk = 0; blk < visible; ++blk) keys.push_back(ls.entry(blk));
    } else if (plan.attention == AttentionType::kCsa) {
      for (int32_t blk : selected[t]) keys.push_back(ls.entry(blk));
    }
    float* ot = o.data() + t * heads * hd;
    if (deepseek) {  // BF16 q, keys and probabilities (docs/numerics.md, point 4)
      attention_with_sink_bf16(
          q.data() + t * heads * hd, heads, hd, keys, w.attn_sink.data(), scale, ot);
    } else {
      attention_with_sink(
          q.data() + t * heads * hd, heads, hd, keys, w.attn_sink.data(), scale, ot);
    }
    for (int64_t h = 0; h < heads; ++h) rope_apply(ot + h * hd, hd, freqs, pos, true);
    if (deepseek) {  // BF16 attention output into wo_a (docs/numerics.md, point 5)
      for (int64_t i = 0; i < heads * hd; ++i) ot[i] = numeric::round_to_bf16(ot[i]);
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    std::copy(kv.data() + t * hd, kv.data() + (t + 1) * hd, ls.ring_slot(first_pos + t));
  }

  // 3.4 (8) grouped output projection: wo_a per group (bf16 in DeepSeek: never quantised), wo_b.
  const int64_t groups = c.o_groups;
  const int64_t olr = c.o_lora_rank;
  const int64_t group_in = heads * hd / groups;
  std::vector<float> og(static_cast<size_t>(n * group_in));
  std::vector<float> zg(static_cast<size_t>(n * olr));
  std::vector<float> z(static_cast<size_t>(n * groups * olr));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t t = 0; t < n; ++t) {
      const float* src = o.data() + t * heads * hd + g * group_in;
      std::copy(src, src + group_in, og.data() + t * group_in);
    }
    linear_rows(w.wo_a, g * olr, olr, og.data(), n, zg.data(), false);
    for (int64_t t = 0; t < n; ++t) {
      std::copy(zg.data() + t * olr, zg.data() + (t + 1) * olr, z.data() + (t * groups + g) * olr);
    }
  }
  linear(w.wo_b, z.data(), n, out, q8);
}

}  // namespace dsinfer::cpu
