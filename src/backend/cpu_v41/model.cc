// The V4.1 CPU forward (spec deepseek-v41.md §3–§4), plain fp32 loops.
#include "backend/cpu_v41/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/check.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops.h"
#include "model_v41/engram.h"
#include "numeric/float_formats.h"

namespace dsinfer::cpu_v41 {

using model_v41::LayerRole;
using model_v41::V41LayerPlan;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kBf16Max = 3.38953139e38f;

float pow2_ceil(float t) {
  int e = 0;
  const float m = std::frexp(t, &e);
  return std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
}

float e4m3_round(float v) {
  return numeric::fp8_e4m3_to_f32(numeric::f32_to_fp8_e4m3(v));
}

// Nearest E2M1 value of v (|v| <= 6), ties to the even code.
float e2m1_round(float v) {
  static constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = std::fabs(v);
  int lo = 0;
  while (lo < 7 && kGrid[lo + 1] <= a) ++lo;
  int pick = lo;
  if (lo < 7) {
    const float dlo = a - kGrid[lo], dhi = kGrid[lo + 1] - a;
    if (dhi < dlo || (dhi == dlo && (lo + 1) % 2 == 0)) {
      pick = lo + 1;
    }
  }
  return std::signbit(v) ? -kGrid[pick] : kGrid[pick];
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

void linear(const MatrixRef& w, const float* x, int64_t n, float* y) {
  cpu::linear(w, x, n, y, /*quantize_activations=*/false);
}

void rms(const float* x,
         int64_t n,
         int64_t dim,
         const std::vector<float>* weight,
         float eps,
         float* out) {
  cpu::rms_norm(x, n, dim, weight ? weight->data() : nullptr, eps, out);
}

// The mHC post step in place over n tokens, in V4.1's order (the comb mix summed first, then
// post * f added): X[t, k] = post[t, k] * F[t] + sum_j comb[t, j, k] * X[t, j].
void mix_streams(float* X,
                 int64_t n,
                 int64_t hc,
                 int64_t D,
                 const float* post,
                 const float* comb,
                 const float* F) {
  std::vector<float> mixed(static_cast<size_t>(hc * D));
  for (int64_t t = 0; t < n; ++t) {
    float* Xt = X + t * hc * D;
    const float* cb = comb + t * hc * hc;
    for (int64_t k = 0; k < hc; ++k) {
      for (int64_t i = 0; i < D; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < hc; ++j) acc += cb[j * hc + k] * Xt[j * D + i];
        mixed[static_cast<size_t>(k * D + i)] = post[t * hc + k] * F[t * D + i] + acc;
      }
    }
    std::copy(mixed.begin(), mixed.end(), Xt);
  }
}

}  // namespace

void fp8_window_quant(float* x, int64_t n) {
  DSI_CHECK(n % 32 == 0, "fp8 window quant of %lld values", static_cast<long long>(n));
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float s = pow2_ceil(std::max(amax, 1e-4f) * (1.0f / 448.0f));
    for (int i = 0; i < 32; ++i) {
      x[b + i] = e4m3_round(std::clamp(x[b + i] / s, -448.0f, 448.0f)) * s;
    }
  }
}

void fp4_index_quant(float* x, int64_t n) {
  DSI_CHECK(n % 32 == 0, "fp4 index quant of %lld values", static_cast<long long>(n));
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float s = pow2_ceil(std::max(amax, 6.0f * std::ldexp(1.0f, -126)) * (1.0f / 6.0f));
    for (int i = 0; i < 32; ++i) x[b + i] = e2m1_round(std::clamp(x[b + i] / s, -6.0f, 6.0f)) * s;
  }
}

void fp4_compressed_quant(float* x, int64_t n, bool clamp_scale) {
  DSI_CHECK(n % 16 == 0, "fp4 compressed quant of %lld values", static_cast<long long>(n));
  for (int64_t b = 0; b < n; b += 16) {
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    float s = std::max(amax, 6.0f * std::ldexp(1.0f, -9)) / 6.0f;
    if (clamp_scale) {
      s = std::min(s, 448.0f);
    }
    s = e4m3_round(s);
    // Unclamped, a scale past E4M3's range (|s| > 464) rounds to NaN: the block is that NaN
    // (written as is, not through the arithmetic, so the bits do not depend on how the hardware
    // propagates NaN payloads; the GPU twin writes the same bits).
    if (std::isnan(s)) {
      std::fill(x + b, x + b + 16, s);
      continue;
    }
    for (int i = 0; i < 16; ++i) x[b + i] = e2m1_round(std::clamp(x[b + i] / s, -6.0f, 6.0f)) * s;
  }
}

Status EngramHashParams::validate(const V41Config& c) const {
  if (c.engram_layer_ids.empty()) {
    return Status::ok_status();
  }
  if (static_cast<int64_t>(token_map.size()) != c.vocab_size) {
    return invalid_argument("Engram token map has " + std::to_string(token_map.size()) +
                            " entries, expected vocab_size " + std::to_string(c.vocab_size));
  }
  for (int32_t v : token_map) {
    if (v < 0 || v >= c.engram_compressed_vocab_size) {
      return invalid_argument("Engram token map value " + std::to_string(v) +
                              " is outside the compressed vocabulary [0, " +
                              std::to_string(c.engram_compressed_vocab_size) + ")");
    }
  }
  if (multipliers.size() != c.engram_layer_ids.size()) {
    return invalid_argument("Engram multipliers: " + std::to_string(multipliers.size()) +
                            " layers, expected " + std::to_string(c.engram_layer_ids.size()));
  }
  const int64_t bound = (std::numeric_limits<int64_t>::max() / c.engram_compressed_vocab_size) / 2;
  for (const auto& row : multipliers) {
    if (static_cast<int64_t>(row.size()) != c.engram_max_ngram_size) {
      return invalid_argument("Engram multipliers: a row has " + std::to_string(row.size()) +
                              " values, expected engram_max_ngram_size");
    }
    for (int64_t m : row) {
      if (m <= 0 || m % 2 == 0 || (m - 1) / 2 >= bound) {
        return invalid_argument("Engram multiplier " + std::to_string(m) +
                                " is not 2 r + 1 with r in [0, " + std::to_string(bound) + ")");
      }
    }
  }
  return Status::ok_status();
}

Result<EngramHashParams> EngramHashParams::from_config(const V41Config& c,
                                                       std::vector<int32_t> token_map) {
  EngramHashParams h;
  h.token_map = std::move(token_map);
  h.multipliers = model_v41::engram_multipliers(c);
  DSI_RETURN_IF_ERROR(h.validate(c));
  return h;
}

void engram_row_ids(const V41Config& c,
                    const EngramHashParams& h,
                    std::span<const int32_t> tokens,
                    int64_t p,
                    std::vector<std::vector<int64_t>>* out) {
  const int64_t N = c.engram_max_ngram_size;
  const int64_t pad = h.token_map[static_cast<size_t>(c.engram_pad_token_id)];
  std::vector<int64_t> t(static_cast<size_t>(N));
  bool blocked = false;
  for (int64_t r = 0; r < N; ++r) {
    const int64_t q = p - r;
    if (q < 0 || blocked || tokens[static_cast<size_t>(q)] >= c.vocab_size) {
      blocked = true;
      t[static_cast<size_t>(r)] = pad;
    } else {
      t[static_cast<size_t>(r)] = h.token_map[static_cast<size_t>(tokens[static_cast<size_t>(q)])];
    }
  }
  out->assign(c.engram_layer_ids.size(), {});
  for (size_t li = 0; li < c.engram_layer_ids.size(); ++li) {
    const auto& m = h.multipliers[li];
    const auto& primes = c.engram_primes[li];
    // Products fit in int64 (multiplier bound); XOR of non-negative values stays non-negative.
    int64_t hash = t[0] * m[0];
    int64_t off = 0;
    size_t k = 0;
    for (int64_t n = 2; n <= N; ++n) {
      hash ^= t[static_cast<size_t>(n - 1)] * m[static_cast<size_t>(n - 1)];
      for (int64_t j = 0; j < c.engram_n_heads; ++j, ++k) {
        (*out)[li].push_back(off + hash % primes[k]);
        off += primes[k];
      }
    }
  }
}

state::StateShape v41_state_shape(const V41Config& c, int64_t max_backtracking) {
  state::StateShape s;
  s.head_dim = c.head_dim;
  s.sliding_window = c.sliding_window;
  s.ring_capacity = c.sliding_window + max_backtracking;
  s.max_rollback = max_backtracking;
  // The Engram n-grams read the max_ngram - 1 tokens before a chunk, also after a rollback.
  s.token_history = max_backtracking + std::max<int64_t>(1, c.engram_max_ngram_size) + 8;
  s.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int l : c.kv_source_layer_ids) {
    state::LayerShape& ls = s.layers[static_cast<size_t>(l)];
    ls.ratio = c.compress_ratios[static_cast<size_t>(l)];
    if (std::find(c.index_k_source_layer_ids.begin(), c.index_k_source_layer_ids.end(), l) !=
        c.index_k_source_layer_ids.end()) {
      ls.index_head_dim = c.index_head_dim;
    }
    if (ls.ratio > 1) {
      ls.partial_width = c.head_dim;  // (c | z) rows
      ls.partial_capacity = ls.ratio + max_backtracking - 1;
    }
  }
  s.extra_rings = c.num_nextn_predict_layers;
  return s;
}

V41SequenceState make_v41_state(const V41Config& c, int64_t max_backtracking) {
  V41SequenceState st;
  const state::StateShape shape = v41_state_shape(c, max_backtracking);
  st.arena = state::PageArena::growable(state::default_page_bytes(shape));
  st.seq = std::make_unique<state::SequenceState>(shape, st.arena.get(), 0);
  DSI_CHECK(st.seq->ok(), "a growable arena ran out of pages");
  return st;
}

Status rollback_v41_state(const V41Config& c, V41SequenceState& st, int64_t new_length) {
  (void)c;
  const int64_t len = st.length();
  if (new_length < 0 || new_length > len) {
    return invalid_argument("rollback from " + std::to_string(len) + " to " +
                            std::to_string(new_length) + " tokens");
  }
  return st.seq->rollback(len - new_length);
}

struct V41CpuModel::Shared {
  // Top-k entry ids per chunk row of the last index source (-1 padded to nothing).
  std::vector<std::vector<int32_t>> topk;
  // Candidate pool per chunk row (entry mask) from the candidate source.
  std::vector<std::vector<uint8_t>> candidates;
  bool have_candidates = false;
  // DSpark target features (spec §7.2): per target layer, the mean of the streams entering its
  // attention site for rows [feature_first, feature_first + rows).
  std::vector<std::vector<float>> features;
  std::vector<int64_t> feature_first;
};

V41CpuModel::V41CpuModel(const V41Config& c,
                         const V41Weights& w,
                         EngramHashParams hash,
                         model::Numerics numerics,
                         const EngramStoreOptions& engram)
    : c_(c), w_(w), hash_(std::move(hash)), numerics_(numerics) {
  auto store = EngramStore::create(c, w, engram);
  DSI_CHECK(store.ok(), "Engram store: %s", store.status().message().c_str());
  engram_ = std::move(store).value();
  dspark_target_index_.assign(static_cast<size_t>(c.num_hidden_layers), -1);
  for (size_t i = 0; i < c.dspark_target_layer_ids.size(); ++i)
    dspark_target_index_[static_cast<size_t>(c.dspark_target_layer_ids[i])] = static_cast<int>(i);
  if (w.has_dspark) {
    const int64_t want = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * c.hidden_size;
    if (w.dspark.main_proj.cols != want) {
      dspark_error_ = "DSpark main_proj takes " + std::to_string(w.dspark.main_proj.cols) +
                      " inputs, but the features of the " +
                      std::to_string(c.dspark_target_layer_ids.size()) +
                      " dspark_target_layer_ids are " + std::to_string(want) + " wide";
    } else if (static_cast<int64_t>(w.dspark.blocks.size()) != c.num_nextn_predict_layers) {
      dspark_error_ = "DSpark: " + std::to_string(w.dspark.blocks.size()) + " blocks bound, " +
                      std::to_string(c.num_nextn_predict_layers) + " configured";
    }
  }
  inv_main_ = model::rope_inv_freq(c.rope_main, c.qk_rope_head_dim);
  inv_compress_ = model::rope_inv_freq(c.rope_compress, c.qk_rope_head_dim);
}

void V41CpuModel::mixes(
    const model_v41::HcSite& s, const float* X, float* pre, float* post, float* comb) const {
  const int64_t hc = c_.hc_mult, D = c_.hidden_size, flat = hc * D;
  double ss = 0.0;
  for (int64_t i = 0; i < flat; ++i) ss += static_cast<double>(X[i]) * X[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(flat)) +
                                   static_cast<float>(c_.rms_norm_eps));
  const int64_t mix = c_.hc_mix_dim();
  std::vector<float> mu(static_cast<size_t>(mix));
  for (int64_t k = 0; k < mix; ++k)
    mu[static_cast<size_t>(k)] = cpu::dot8(s.fn.data() + k * flat, X, flat) * r;
  const float eps = static_cast<float>(c_.hc_eps);
  for (int64_t j = 0; j < hc; ++j) {
    pre[j] =
        sigmoid(mu[static_cast<size_t>(j)] * s.scale[0] + s.base[static_cast<size_t>(j)]) + eps;
    post[j] = 2.0f * sigmoid(mu[static_cast<size_t>(hc + j)] * s.scale[1] +
                             s.base[static_cast<size_t>(hc + j)]);
  }
  for (int64_t j = 0; j < hc; ++j) {
    float* row = comb + j * hc;
    for (int64_t k = 0; k < hc; ++k) {
      row[k] = mu[static_cast<size_t>(2 * hc + j * hc + k)] * s.scale[2] +
               s.base[static_cast<size_t>(2 * hc + j * hc + k)];
    }
    cpu::softmax(row, hc);
    for (int64_t k = 0; k < hc; ++k) row[k] += eps;
  }
  auto col_norm = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int64_t j = 0; j < hc; ++j) sum += comb[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) comb[j * hc + k] /= sum + eps;
    }
  };
  auto row_norm = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      float sum = 0.0f;
      for (int64_t k = 0; k < hc; ++k) sum += comb[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) comb[j * hc + k] /= sum + eps;
    }
  };
  col_norm();
  for (int64_t it = 0; it < c_.hc_sinkhorn_iters - 1; ++it) {
    row_norm();
    col_norm();
  }
}

void V41CpuModel::engram(int l,
                         int64_t n,
                         EngramStore::Pending& rows,
                         std::vector<float>& X) const {
  const model_v41::EngramWeights& w = w_.layers[static_cast<size_t>(l)].engram;
  const int li = c_.layers[static_cast<size_t>(l)].engram_index;
  const int64_t hc = c_.hc_mult, D = c_.hidden_size, dim = c_.engram_head_dim;
  const int64_t cols = c_.engram_hash_cols();
  const float eps = static_cast<float>(c_.rms_norm_eps);
  std::vector<float> kv(static_cast<size_t>((hc + 1) * D));
  // This table's rows of every chunk token (gathered since before layer 0).
  const std::vector<float>& gathered = rows.wait(li);
  DSI_CHECK(static_cast<int64_t>(gathered.size()) == n * cols * dim,
            "Engram layer %d: %zu gathered values for %lld tokens",
            l,
            gathered.size(),
            static_cast<long long>(n));
  for (int64_t t = 0; t < n; ++t) {
    linear(w.wkv, gathered.data() + t * cols * dim, 1, kv.data());
    const float* value = kv.data() + hc * D;
    for (int64_t k = 0; k < hc; ++k) {
      float* xs = X.data() + (t * hc + k) * D;
      const float* key = kv.data() + k * D;
      double sx = 0.0, sk = 0.0;
      float d = 0.0f;
      for (int64_t i = 0; i < D; ++i) {
        sx += static_cast<double>(xs[i]) * xs[i];
        sk += static_cast<double>(key[i]) * key[i];
      }
      std::vector<float> prod(static_cast<size_t>(D));
      for (int64_t i = 0; i < D; ++i) {
        prod[static_cast<size_t>(i)] = xs[i] *
                                       (w.q_weight[static_cast<size_t>(k * D + i)] *
                                        w.k_weight[static_cast<size_t>(k * D + i)]) *
                                       key[i];
      }
      d = std::accumulate(prod.begin(), prod.end(), 0.0f);
      const float rstd = (1.0f / std::sqrt(static_cast<float>(sx / D) + eps)) *
                         (1.0f / std::sqrt(static_cast<float>(sk / D) + eps));
      d = d * rstd * (1.0f / std::sqrt(static_cast<float>(D)));
      const float g = sigmoid(std::copysign(std::sqrt(std::max(std::fabs(d), 1e-6f)), d));
      for (int64_t i = 0; i < D; ++i) xs[i] += g * value[i];
    }
  }
}

void V41CpuModel::compress(
    int l, state::SequenceState& st, int64_t first, int64_t n, const float* x) const {
  const model_v41::AttentionWeights& a = w_.layers[static_cast<size_t>(l)].attn;
  const int64_t hd = c_.head_dim, ratio = c_.compress_ratios[static_cast<size_t>(l)];
  const float eps = static_cast<float>(c_.rms_norm_eps);
  std::vector<float> cv(static_cast<size_t>(n * hd));
  linear(a.compressor.wkv, x, n, cv.data());
  std::vector<float> lat;
  std::vector<int64_t> gpos;
  if (ratio == 1) {
    lat = cv;
    for (int64_t t = 0; t < n; ++t) gpos.push_back(first + t);
  } else {
    std::vector<float> zv(static_cast<size_t>(n * hd));
    linear(a.compressor.wgate, x, n, zv.data());
    state::CompressorRows& ring = st.layers()[static_cast<size_t>(l)].comp_rows;
    auto zc = [&](int64_t pos, const float** z, const float** c) {
      if (pos >= first) {
        *z = zv.data() + (pos - first) * hd;
        *c = cv.data() + (pos - first) * hd;
      } else {
        *z = ring.score_row(pos);
        *c = ring.kv_row(pos);
      }
    };
    for (int64_t pos = first; pos < first + n; ++pos) {
      if ((pos + 1) % ratio != 0) {
        continue;
      }
      const int64_t g0 = pos + 1 - ratio;
      std::vector<float> out(static_cast<size_t>(hd));
      for (int64_t d = 0; d < hd; ++d) {
        float m = kNegInf;
        for (int64_t r = 0; r < ratio; ++r) {
          const float *z, *c;
          zc(g0 + r, &z, &c);
          m = std::max(m, z[d]);
        }
        float den = 0.0f, num = 0.0f;
        for (int64_t r = 0; r < ratio; ++r) {
          const float *z, *c;
          zc(g0 + r, &z, &c);
          den += std::exp(z[d] - m);
        }
        for (int64_t r = 0; r < ratio; ++r) {
          const float *z, *c;
          zc(g0 + r, &z, &c);
          num += (std::exp(z[d] - m) / den) * c[d];
        }
        out[static_cast<size_t>(d)] = num;
      }
      lat.insert(lat.end(), out.begin(), out.end());
      gpos.push_back(g0);
    }
    for (int64_t pos = first; pos < first + n; ++pos) {
      ring.append(cv.data() + (pos - first) * hd, zv.data() + (pos - first) * hd);
    }
  }
  const int64_t G = static_cast<int64_t>(gpos.size());
  if (G == 0) {
    return;
  }
  state::LayerState& owner = st.layers()[static_cast<size_t>(l)];
  rms(lat.data(), G, hd, &a.compressor.norm, eps, lat.data());
  if (!a.indexer.wk.empty()) {
    const int64_t id = c_.index_head_dim;
    std::vector<float> k(static_cast<size_t>(G * id));
    linear(a.indexer.wk, lat.data(), G, k.data());
    rms(k.data(), G, id, &a.indexer.k_norm, eps, k.data());
    for (int64_t g = 0; g < G; ++g) {
      cpu::rope_apply(k.data() + g * id, id, inv_compress_, gpos[static_cast<size_t>(g)], false);
      fp4_index_quant(k.data() + g * id, id);
    }
    for (int64_t g = 0; g < G; ++g) owner.put_index_key(owner.num_entries + g, k.data() + g * id);
  }
  for (int64_t g = 0; g < G; ++g) {
    cpu::rope_apply(lat.data() + g * hd, hd, inv_compress_, gpos[static_cast<size_t>(g)], false);
    // The compressed-KV record: FP4 (288 B at head_dim 512) or, with use_fp4_sparse_kv = false,
    // the FP8 main record of the window rings (spec §6.1).
    if (c_.use_fp4_sparse_kv) {
      fp4_compressed_quant(lat.data() + g * hd, hd, deepseek());
    } else {
      fp8_window_quant(lat.data() + g * hd, hd);
    }
  }
  for (int64_t g = 0; g < G; ++g) owner.put_entry(owner.num_entries, lat.data() + g * hd);
}

void V41CpuModel::indexer(int l,
                          state::SequenceState& st,
                          int64_t first,
                          int64_t n,
                          const float* x,
                          const float* q_res,
                          Shared& sh) const {
  const V41LayerPlan& plan = c_.layers[static_cast<size_t>(l)];
  const model_v41::IndexerWeights& w = w_.layers[static_cast<size_t>(l)].attn.indexer;
  const int64_t IH = c_.index_n_heads, ID = c_.index_head_dim, ratio = plan.compress_ratio;
  const state::LayerState& keys = st.layers()[static_cast<size_t>(plan.index_key_owner)];
  const int64_t G = keys.num_entries;
  sh.topk.assign(static_cast<size_t>(n), {});
  if (G == 0) {
    return;
  }
  std::vector<float> q(static_cast<size_t>(n * IH * ID)), hw(static_cast<size_t>(n * IH));
  linear(w.wq_b, q_res, n, q.data());
  linear(w.weights_proj, x, n, hw.data());
  const bool scale = !deepseek();
  const float s_scale = 1.0f / std::sqrt(static_cast<float>(ID));
  const float h_scale = 1.0f / std::sqrt(static_cast<float>(IH));
  if (plan.candidate_source) {
    sh.candidates.assign(static_cast<size_t>(n), {});
    sh.have_candidates = true;
  }
  std::vector<float> score(static_cast<size_t>(G));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = first + t;
    float* qt = q.data() + t * IH * ID;
    for (int64_t h = 0; h < IH; ++h) {
      cpu::rope_apply(qt + h * ID, ID, inv_compress_, p, false);
      fp4_index_quant(qt + h * ID, ID);
    }
    const int64_t visible = (p + 1) / ratio;
    for (int64_t g = 0; g < G; ++g) {
      if (g >= visible) {
        score[static_cast<size_t>(g)] = kNegInf;
        continue;
      }
      float s = 0.0f;
      for (int64_t h = 0; h < IH; ++h) {
        float v = std::max(cpu::dot8(qt + h * ID, keys.index_key(g), ID), 0.0f);
        float wh = hw[static_cast<size_t>(t * IH + h)];
        if (scale) {
          v *= s_scale;
          wh *= h_scale;
        }
        s += v * wh;
      }
      score[static_cast<size_t>(g)] = s;
    }
    if (plan.candidate_source) {
      const int64_t bs = c_.candidate_block_size, nb = (G + bs - 1) / bs;
      std::vector<float> blk(static_cast<size_t>(nb), kNegInf);
      for (int64_t g = 0; g < G; ++g) {
        float& b = blk[static_cast<size_t>(g / bs)];
        b = std::max(b, score[static_cast<size_t>(g)]);
      }
      if (deepseek()) {
        for (float& b : blk) b = std::min(b, kBf16Max);
      }
      std::vector<uint8_t>& keep = sh.candidates[static_cast<size_t>(t)];
      keep.assign(static_cast<size_t>(G), 0);
      if (visible > 0) {
        blk[static_cast<size_t>((visible - 1) / bs)] = std::numeric_limits<float>::infinity();
        const int64_t kb = std::min<int64_t>(c_.candidate_topk_blocks, nb);
        for (int32_t b : cpu::top_k_indices(blk.data(), nb, kb)) {
          if (blk[static_cast<size_t>(b)] == kNegInf) {
            continue;
          }
          for (int64_t g = b * bs; g < std::min(G, (b + 1) * bs); ++g)
            keep[static_cast<size_t>(g)] = 1;
        }
      }
    } else if (plan.uses_candidates && sh.have_candidates) {
      const auto& keep = sh.candidates[static_cast<size_t>(t)];
      for (int64_t g = 0; g < G; ++g) {
        if (g >= static_cast<int64_t>(keep.size()) || !keep[static_cast<size_t>(g)]) {
          score[static_cast<size_t>(g)] = kNegInf;
        }
      }
    }
    const int64_t k = std::min(c_.index_topk, G);
    for (int32_t g : cpu::top_k_indices(score.data(), G, k)) {
      if (score[static_cast<size_t>(g)] > kNegInf) {
        sh.topk[static_cast<size_t>(t)].push_back(g);
      }
    }
  }
}

void V41CpuModel::attention(int l,
                            state::SequenceState& st,
                            int64_t first,
                            int64_t n,
                            const float* x,
                            float* out,
                            Shared& sh,
                            bool compressed_already,
                            const Exit& ex) const {
  const V41LayerPlan& plan = c_.layers[static_cast<size_t>(l)];
  const model_v41::AttentionWeights& a = w_.layers[static_cast<size_t>(l)].attn;
  const int64_t H = c_.num_attention_heads, hd = c_.head_dim, W = c_.sliding_window;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const std::vector<float>& inv = plan.compress_ratio == 0 ? inv_main_ : inv_compress_;
  std::vector<float> q_res(static_cast<size_t>(n * c_.q_lora_rank));
  linear(a.wq_a, x, n, q_res.data());
  rms(q_res.data(), n, c_.q_lora_rank, &a.q_norm, eps, q_res.data());
  std::vector<float> q(static_cast<size_t>(n * H * hd)), kv(static_cast<size_t>(n * hd));
  linear(a.wq_b, q_res.data(), n, q.data());
  linear(a.wkv, x, n, kv.data());
  rms(kv.data(), n, hd, &a.kv_norm, eps, kv.data());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < H; ++h)
      cpu::rope_apply(q.data() + (t * H + h) * hd, hd, inv, first + t, false);
    cpu::rope_apply(kv.data() + t * hd, hd, inv, first + t, false);
    fp8_window_quant(kv.data() + t * hd, hd);
  }
  if (plan.compress_ratio > 0) {
    if (plan.kv_owner == l && !compressed_already) {
      compress(l, st, first, n, x);
    }
    if (plan.topk_source == l) {
      indexer(l, st, first, n, x, q_res.data(), sh);
    }
  }
  state::LayerState& ring = st.layers()[static_cast<size_t>(l)];
  const state::LayerState& comp =
      st.layers()[static_cast<size_t>(plan.compress_ratio > 0 ? plan.kv_owner : l)];
  std::vector<float> o(static_cast<size_t>(n * H * hd));
  std::vector<const float*> keys;
  // Early exit narrows the consumers' window to the kept tail (a placeholder row sees none).
  const bool narrowed = ex.active && !plan.producer;
  const int64_t floor = narrowed ? ex.window_floor : 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = first + t;
    keys.clear();
    for (int64_t k = std::max<int64_t>({0, p - W + 1, floor}); k <= p; ++k) {
      keys.push_back(k >= first ? kv.data() + (k - first) * hd : ring.ring_slot(k));
    }
    if (plan.compress_ratio > 0 && !sh.topk.empty()) {
      for (int32_t g : sh.topk[static_cast<size_t>(t)]) keys.push_back(comp.entry(g));
    }
    cpu::attention_with_sink(q.data() + t * H * hd,
                             H,
                             hd,
                             keys,
                             a.attn_sink.data(),
                             1.0f / std::sqrt(static_cast<float>(hd)),
                             o.data() + t * H * hd);
    for (int64_t h = 0; h < H; ++h) cpu::rope_apply(o.data() + (t * H + h) * hd, hd, inv, p, true);
  }
  // The chunk's window KV into the ring (the last ring_slots rows are the only ones kept; an
  // early-exit placeholder row writes nothing).
  for (int64_t t = std::max<int64_t>(0, n - ring.ring_capacity);
       t < n && !(narrowed && ex.placeholder);
       ++t) {
    std::copy_n(kv.data() + t * hd, hd, ring.ring_slot(first + t));
  }
  output_projection(a, o.data(), n, out);
}

void V41CpuModel::output_projection(const model_v41::AttentionWeights& a,
                                    const float* o,
                                    int64_t n,
                                    float* out) const {
  // Grouped low-rank output: wo_a per group of H / o_groups heads, then wo_b.
  const int64_t H = c_.num_attention_heads, hd = c_.head_dim;
  const int64_t G = c_.o_groups, in_g = H / G * hd, r = c_.o_lora_rank;
  std::vector<float> xg(static_cast<size_t>(n * in_g)), yg(static_cast<size_t>(n * r));
  std::vector<float> y(static_cast<size_t>(n * G * r));
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(o + t * H * hd + g * in_g, in_g, xg.data() + t * in_g);
    cpu::linear_rows(a.wo_a, g * r, r, xg.data(), n, yg.data(), false);
    for (int64_t t = 0; t < n; ++t) std::copy_n(yg.data() + t * r, r, y.data() + t * G * r + g * r);
  }
  linear(a.wo_b, y.data(), n, out);
}

void V41CpuModel::expert(const model_v41::ExpertWeights& w,
                         const float* x,
                         float gate,
                         bool weighted,
                         float* out) const {
  const int64_t inter = c_.moe_intermediate_size, D = c_.hidden_size;
  std::vector<float> g(static_cast<size_t>(inter)), u(static_cast<size_t>(inter));
  linear(w.w1, x, 1, g.data());
  linear(w.w3, x, 1, u.data());
  const float lim = static_cast<float>(c_.swiglu_limit);
  for (int64_t i = 0; i < inter; ++i) {
    float gi = g[static_cast<size_t>(i)], ui = u[static_cast<size_t>(i)];
    if (lim > 0) {
      ui = std::clamp(ui, -lim, lim);
      gi = std::min(gi, lim);
    }
    float hv = cpu::silu(gi) * ui;
    if (weighted) {
      hv *= gate;
    }
    g[static_cast<size_t>(i)] = hv;
  }
  std::vector<float> y(static_cast<size_t>(D));
  linear(w.w2, g.data(), 1, y.data());
  for (int64_t i = 0; i < D; ++i) out[i] += y[static_cast<size_t>(i)];
}

void V41CpuModel::moe(
    const model_v41::MoeWeights& w, const float* x, int64_t n, int64_t k, float* out) const {
  const int64_t D = c_.hidden_size, E = w.gate.rows;
  std::vector<float> logits(static_cast<size_t>(n * E));
  linear(w.gate, x, n, logits.data());
  std::vector<float> s(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
  const float temp = deepseek() ? 1.0f : static_cast<float>(c_.gate_temp);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      float l = logits[static_cast<size_t>(t * E + e)];
      if (!deepseek()) {
        l = l / temp;
      }
      s[static_cast<size_t>(e)] = std::sqrt(cpu::softplus(l));
      biased[static_cast<size_t>(e)] = s[static_cast<size_t>(e)] + w.bias[static_cast<size_t>(e)];
    }
    std::vector<int32_t> idx = cpu::top_k_indices(biased.data(), E, k);
    float sum = 0.0f;
    for (int32_t e : idx) sum += s[static_cast<size_t>(e)];
    float* o = out + t * D;
    std::fill(o, o + D, 0.0f);
    std::vector<int32_t> sorted = idx;
    std::sort(sorted.begin(), sorted.end());
    for (int32_t e : sorted) {
      const float gate =
          s[static_cast<size_t>(e)] / (sum + 1e-20f) * static_cast<float>(c_.routed_scaling_factor);
      expert(w.experts[static_cast<size_t>(e)], x + t * D, gate, true, o);
    }
    expert(w.shared, x + t * D, 0.0f, false, o);
  }
}

void V41CpuModel::layer(int l,
                        state::SequenceState& st,
                        int64_t& first,
                        int64_t& n,
                        EngramStore::Pending& rows,
                        std::vector<float>& X,
                        std::vector<float>& pi,
                        Shared& sh,
                        const Exit& ex) const {
  const model_v41::LayerWeights& w = w_.layers[static_cast<size_t>(l)];
  const int64_t hc = c_.hc_mult, D = c_.hidden_size;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  if (c_.layers[static_cast<size_t>(l)].engram) {
    engram(l, n, rows, X);
  }
  if (const int ti = dspark_target_index_[static_cast<size_t>(l)]; ti >= 0 && has_dspark()) {
    // DSpark target feature: the mean of the streams entering the attention site.
    std::vector<float>& f = sh.features[static_cast<size_t>(ti)];
    f.assign(static_cast<size_t>(n * D), 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < D; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < hc; ++j) acc += X[static_cast<size_t>((t * hc + j) * D + i)];
        f[static_cast<size_t>(t * D + i)] = acc / static_cast<float>(hc);
      }
    }
    sh.feature_first[static_cast<size_t>(ti)] = first;
  }
  std::vector<float> pre(static_cast<size_t>(n * hc)), post(static_cast<size_t>(n * hc));
  std::vector<float> comb(static_cast<size_t>(n * hc * hc)), u(static_cast<size_t>(n * D));
  std::vector<float> F(static_cast<size_t>(n * D));
  for (int site = 0; site < 2; ++site) {
    const model_v41::HcSite& hs = site == 0 ? w.hc_attn : w.hc_ffn;
    for (int64_t t = 0; t < n; ++t) {
      const float* Xt = X.data() + t * hc * D;
      mixes(hs, Xt, pre.data() + t * hc, post.data() + t * hc, comb.data() + t * hc * hc);
      float* ut = u.data() + t * D;
      for (int64_t i = 0; i < D; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < hc; ++j) acc += pi[static_cast<size_t>(t * hc + j)] * Xt[j * D + i];
        ut[i] = acc;
      }
    }
    rms(u.data(), n, D, site == 0 ? &w.attn_norm : &w.ffn_norm, eps, u.data());
    bool compressed_already = false;
    if (site == 0 && ex.active && l == c_.yoco_boundary) {
      // The global KV (compressed entries + index keys) from every row's attention-norm output,
      // then the consumer half continues on the kept suffix only.
      compress(l, st, first, n, u.data());
      compressed_already = true;
      const int64_t keep_from =
          ex.placeholder ? n - 1 : std::max<int64_t>(0, ex.window_floor - first);
      auto cut = [&](std::vector<float>& v, int64_t width) {
        v.erase(v.begin(), v.begin() + keep_from * width);
      };
      cut(X, hc * D);
      cut(pi, hc);
      cut(pre, hc);
      cut(post, hc);
      cut(comb, hc * hc);
      cut(u, D);
      F.resize(static_cast<size_t>((n - keep_from) * D));
      first += keep_from;
      n -= keep_from;
    }
    if (site == 0) {
      attention(l, st, first, n, u.data(), F.data(), sh, compressed_already, ex);
    } else {
      moe(w.ffn, u.data(), n, c_.num_experts_per_tok, F.data());
    }
    pi = pre;
    mix_streams(X.data(), n, hc, D, post.data(), comb.data(), F.data());
  }
}

void V41CpuModel::write_dspark_context(
    state::SequenceState& st, int64_t first, int64_t n, const Shared& sh, bool write) const {
  const int64_t D = c_.hidden_size, hd = c_.head_dim;
  const int64_t nt = static_cast<int64_t>(c_.dspark_target_layer_ids.size());
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const int64_t ring = st.mtp_layers().empty() ? 0 : st.mtp_layers()[0].ring_capacity;
  // Only the rows a ring keeps (the chunk's last ring-capacity rows).
  const int64_t t0 = std::max<int64_t>(0, n - ring);
  if (!write || n - t0 <= 0) {
    return;
  }
  const int64_t m = n - t0;
  std::vector<float> f(static_cast<size_t>(m * nt * D));
  for (int64_t i = 0; i < nt; ++i) {
    const std::vector<float>& src = sh.features[static_cast<size_t>(i)];
    const int64_t off = first + t0 - sh.feature_first[static_cast<size_t>(i)];
    DSI_CHECK(off >= 0 && (off + m) * D <= static_cast<int64_t>(src.size()),
              "DSpark features of target %lld do not cover rows [%lld, %lld)",
              static_cast<long long>(i),
              static_cast<long long>(first + t0),
              static_cast<long long>(first + n));
    for (int64_t t = 0; t < m; ++t)
      std::copy_n(src.data() + (off + t) * D, D, f.data() + (t * nt + i) * D);
  }
  std::vector<float> main_x(static_cast<size_t>(m * D)), kv(static_cast<size_t>(m * hd));
  linear(w_.dspark.main_proj, f.data(), m, main_x.data());
  rms(main_x.data(), m, D, &w_.dspark.main_norm, eps, main_x.data());
  for (size_t b = 0; b < w_.dspark.blocks.size(); ++b) {
    const model_v41::AttentionWeights& a = w_.dspark.blocks[b].layer.attn;
    linear(a.wkv, main_x.data(), m, kv.data());
    rms(kv.data(), m, hd, &a.kv_norm, eps, kv.data());
    state::LayerState& ls = st.mtp_layers()[b];
    for (int64_t t = 0; t < m; ++t) {
      cpu::rope_apply(kv.data() + t * hd, hd, inv_main_, first + t0 + t, false);
      fp8_window_quant(kv.data() + t * hd, hd);
      std::copy_n(kv.data() + t * hd, hd, ls.ring_slot(first + t0 + t));
    }
  }
}

Status V41CpuModel::draft(const state::SequenceState& st,
                          int32_t anchor,
                          const DraftOptions& o,
                          DraftResult* out) const {
  if (!w_.has_dspark) {
    return Status(StatusCode::kFailedPrecondition, "draft: the checkpoint has no DSpark blocks");
  }
  if (!dspark_error_.empty()) {
    return Status(StatusCode::kFailedPrecondition, "draft: " + dspark_error_);
  }
  if (st.mtp_layers().size() != static_cast<size_t>(c_.num_nextn_predict_layers) ||
      st.layers().size() != static_cast<size_t>(c_.num_hidden_layers)) {
    return invalid_argument("draft: the sequence state was not made for this V4.1 model");
  }
  if (st.num_tokens() < 1) {
    return invalid_argument("draft: the sequence has no computed token (prefill it first)");
  }
  const int64_t B = o.block;
  if (B < 1 || B + 1 > st.max_rollback()) {
    return invalid_argument(
        "draft: block " + std::to_string(B) + " must be in [1, " +
        std::to_string(st.max_rollback() - 1) +
        "] (max backtracking - 1: the verify step rolls back up to B + 1 rows)");
  }
  if (!(o.confidence_temperature > 0.0f)) {
    return invalid_argument("draft: the confidence temperature must be > 0");
  }
  const int32_t tok[1] = {anchor};
  DSI_RETURN_IF_ERROR(check_v41_tokens(c_, tok).with_context("draft anchor"));
  const int64_t hc = c_.hc_mult, D = c_.hidden_size, H = c_.num_attention_heads;
  const int64_t hd = c_.head_dim, W = c_.sliding_window, V = c_.vocab_size;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const int64_t a_pos = st.num_tokens() - 1;
  // Block rows: [anchor, noise x (B - 1)] at positions a+1 .. a+B; one-hot pi seed.
  std::vector<float> X(static_cast<size_t>(B * hc * D)), e(static_cast<size_t>(D));
  for (int64_t t = 0; t < B; ++t) {
    w_.embed.dequant_row(t == 0 ? anchor : static_cast<int64_t>(c_.dspark_noise_token_id),
                         e.data());
    for (int64_t j = 0; j < hc; ++j) std::copy(e.begin(), e.end(), X.begin() + (t * hc + j) * D);
  }
  std::vector<float> pi(static_cast<size_t>(B * hc), 0.0f);
  for (int64_t t = 0; t < B; ++t) pi[static_cast<size_t>(t * hc)] = 1.0f;
  std::vector<float> pre(static_cast<size_t>(B * hc)), post(static_cast<size_t>(B * hc));
  std::vector<float> comb(static_cast<size_t>(B * hc * hc)), u(static_cast<size_t>(B * D));
  std::vector<float> F(static_cast<size_t>(B * D));
  for (size_t b = 0; b < w_.dspark.blocks.size(); ++b) {
    const model_v41::LayerWeights& w = w_.dspark.blocks[b].layer;
    const state::LayerState& ring = st.mtp_layers()[b];
    for (int site = 0; site < 2; ++site) {
      const model_v41::HcSite& hs = site == 0 ? w.hc_attn : w.hc_ffn;
      for (int64_t t = 0; t < B; ++t) {
        const float* Xt = X.data() + t * hc * D;
        mixes(hs, Xt, pre.data() + t * hc, post.data() + t * hc, comb.data() + t * hc * hc);
        float* ut = u.data() + t * D;
        for (int64_t i = 0; i < D; ++i) {
          float acc = 0.0f;
          for (int64_t j = 0; j < hc; ++j)
            acc += pi[static_cast<size_t>(t * hc + j)] * Xt[j * D + i];
          ut[i] = acc;
        }
      }
      rms(u.data(), B, D, site == 0 ? &w.attn_norm : &w.ffn_norm, eps, u.data());
      if (site == 0) {
        // Window-only attention (main RoPE): the context KV of positions a-W+1 .. a from this
        // block's ring plus every block row, non-causal inside the block.
        const model_v41::AttentionWeights& at = w.attn;
        std::vector<float> q_res(static_cast<size_t>(B * c_.q_lora_rank));
        linear(at.wq_a, u.data(), B, q_res.data());
        rms(q_res.data(), B, c_.q_lora_rank, &at.q_norm, eps, q_res.data());
        std::vector<float> q(static_cast<size_t>(B * H * hd)), kv(static_cast<size_t>(B * hd));
        linear(at.wq_b, q_res.data(), B, q.data());
        linear(at.wkv, u.data(), B, kv.data());
        rms(kv.data(), B, hd, &at.kv_norm, eps, kv.data());
        for (int64_t t = 0; t < B; ++t) {
          const int64_t p = a_pos + 1 + t;
          for (int64_t h = 0; h < H; ++h)
            cpu::rope_apply(q.data() + (t * H + h) * hd, hd, inv_main_, p, false);
          cpu::rope_apply(kv.data() + t * hd, hd, inv_main_, p, false);
          fp8_window_quant(kv.data() + t * hd, hd);
        }
        std::vector<const float*> keys;
        for (int64_t k = std::max<int64_t>(0, a_pos - W + 1); k <= a_pos; ++k)
          keys.push_back(ring.ring_slot(k));
        for (int64_t t = 0; t < B; ++t) keys.push_back(kv.data() + t * hd);
        std::vector<float> attn(static_cast<size_t>(B * H * hd));
        for (int64_t t = 0; t < B; ++t) {
          cpu::attention_with_sink(q.data() + t * H * hd,
                                   H,
                                   hd,
                                   keys,
                                   at.attn_sink.data(),
                                   1.0f / std::sqrt(static_cast<float>(hd)),
                                   attn.data() + t * H * hd);
          for (int64_t h = 0; h < H; ++h)
            cpu::rope_apply(attn.data() + (t * H + h) * hd, hd, inv_main_, a_pos + 1 + t, true);
        }
        output_projection(at, attn.data(), B, F.data());
      } else {
        moe(w.ffn, u.data(), B, c_.dspark_num_experts_per_tok, F.data());
      }
      pi = pre;
      mix_streams(X.data(), B, hc, D, post.data(), comb.data(), F.data());
    }
  }
  // h_k: the final collapse with the last block's FFN-site pre (the pre-norm hidden).
  out->hidden.assign(static_cast<size_t>(B * D), 0.0f);
  for (int64_t t = 0; t < B; ++t) {
    for (int64_t i = 0; i < D; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < hc; ++j)
        acc += pi[static_cast<size_t>(t * hc + j)] * X[static_cast<size_t>((t * hc + j) * D + i)];
      out->hidden[static_cast<size_t>(t * D + i)] = acc;
    }
  }
  std::vector<float> hn(static_cast<size_t>(B * D));
  rms(out->hidden.data(), B, D, &w_.dspark.norm, eps, hn.data());
  out->logits.resize(static_cast<size_t>(B * V));
  linear(w_.head, hn.data(), B, out->logits.data());
  // Row by row: Markov bigram term and confidence from E_markov[prev_k], then d_k.
  const int64_t R = c_.dspark_markov_rank;
  std::vector<float> em(static_cast<size_t>(R)), mk(static_cast<size_t>(V));
  std::vector<float> conf_in(static_cast<size_t>(D + R));
  out->tokens.clear();
  out->confidence.clear();
  int32_t prev = anchor;
  for (int64_t k = 0; k < B; ++k) {
    w_.dspark.markov_embed.dequant_row(prev, em.data());
    linear(w_.dspark.markov_head, em.data(), 1, mk.data());
    float* lk = out->logits.data() + k * V;
    for (int64_t v = 0; v < V; ++v) lk[v] += mk[static_cast<size_t>(v)];
    std::copy_n(out->hidden.data() + k * D, D, conf_in.data());
    std::copy(em.begin(), em.end(), conf_in.begin() + D);
    const float z = cpu::dot8(w_.dspark.confidence.data(), conf_in.data(), D + R);
    const float zt = std::clamp(z / o.confidence_temperature, -60.0f, 60.0f);
    out->confidence.push_back(sigmoid(zt));
    const std::span<const float> row(lk, static_cast<size_t>(V));
    const int32_t d =
        o.sample ? o.sample(k, row) : static_cast<int32_t>(std::max_element(lk, lk + V) - lk);
    if (d < 0 || d >= V) {
      return invalid_argument("draft: the sampler picked token " + std::to_string(d) +
                              ", outside the vocabulary");
    }
    out->tokens.push_back(d);
    prev = d;
  }
  return Status::ok_status();
}

Status check_v41_tokens(const V41Config& c, std::span<const int32_t> tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    if (id == c.image_token_id) {
      return invalid_argument("token " + std::to_string(i) + " (id " + std::to_string(id) +
                              ") is the image placeholder; image inputs (the V4.1 vision tower) "
                              "are not supported yet");
    }
    if (id >= c.vocab_size && id < c.vocab_size + kV41MultimodalPlaceholders) {
      return invalid_argument("token " + std::to_string(i) + " (id " + std::to_string(id) +
                              ") is one of V4.1's multimodal placeholder ids [" +
                              std::to_string(c.vocab_size) + ", " +
                              std::to_string(c.vocab_size + kV41MultimodalPlaceholders) +
                              "); image inputs (the V4.1 vision tower) are not supported yet");
    }
    if (id < 0 || id >= c.vocab_size) {
      return invalid_argument("token " + std::to_string(i) + " (id " + std::to_string(id) +
                              ") is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                              ")");
    }
  }
  return Status::ok_status();
}

Status V41CpuModel::forward(V41SequenceState& st,
                            std::span<const int32_t> tokens,
                            std::vector<float>* logits) const {
  ForwardResult r;
  DSI_RETURN_IF_ERROR(forward(*st.seq, tokens, nullptr, &r));
  *logits = std::move(r.logits);
  return Status::ok_status();
}

Status V41CpuModel::forward(V41SequenceState& st,
                            std::span<const int32_t> tokens,
                            const PrefillExit* exit,
                            ForwardResult* result) const {
  return forward(*st.seq, tokens, exit, result);
}

Status V41CpuModel::forward(state::SequenceState& st,
                            std::span<const int32_t> tokens,
                            const PrefillExit* exit,
                            ForwardResult* result,
                            bool last_logits_only) const {
  int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) {
    return invalid_argument("forward: no tokens");
  }
  DSI_RETURN_IF_ERROR(check_v41_tokens(c_, tokens).with_context("forward"));
  if (st.layers().size() != static_cast<size_t>(c_.num_hidden_layers) ||
      st.max_rollback() + c_.sliding_window != st.layers()[0].ring_capacity) {
    return invalid_argument("forward: the sequence state was not made for this V4.1 model");
  }
  DSI_RETURN_IF_ERROR(hash_.validate(c_));
  const int64_t chunk_first = st.num_tokens();
  int64_t first = chunk_first;
  Exit ex;
  if (exit != nullptr && c_.yoco_boundary < c_.num_hidden_layers) {
    const int64_t min_keep = st.layers()[0].ring_capacity;  // window + max backtracking
    if (exit->keep_rows < min_keep) {
      return invalid_argument("prefill early exit: keep_rows " + std::to_string(exit->keep_rows) +
                              " is below window + max backtracking = " + std::to_string(min_keep));
    }
    if (first + n > exit->prompt_length) {
      return invalid_argument("prefill early exit: the chunk ends at " + std::to_string(first + n) +
                              ", past the prompt length " + std::to_string(exit->prompt_length));
    }
    for (int l : c_.engram_layer_ids) {
      if (l >= c_.yoco_boundary) {
        return invalid_argument("prefill early exit: Engram layer " + std::to_string(l) +
                                " is a consumer (the YOCO boundary is " +
                                std::to_string(c_.yoco_boundary) +
                                "); bounded replay needs every Engram layer among the producers");
      }
    }
    ex.active = true;
    ex.window_floor = std::max<int64_t>(0, exit->prompt_length - exit->keep_rows);
    ex.placeholder = first + n <= ex.window_floor;
  }
  if (!st.reserve(n)) {
    return Status(StatusCode::kResourceExhausted,
                  "forward: no state memory for " + std::to_string(n) + " more tokens");
  }
  const int64_t hc = c_.hc_mult, D = c_.hidden_size;
  std::vector<float> X(static_cast<size_t>(n * hc * D)), e(static_cast<size_t>(D));
  for (int64_t t = 0; t < n; ++t) {
    w_.embed.dequant_row(tokens[static_cast<size_t>(t)], e.data());
    for (int64_t j = 0; j < hc; ++j) std::copy(e.begin(), e.end(), X.begin() + (t * hc + j) * D);
  }
  std::vector<float> pi(static_cast<size_t>(n * hc), 0.0f);
  for (int64_t t = 0; t < n; ++t) pi[static_cast<size_t>(t * hc)] = 1.0f;
  // Engram row addresses of every table, hashed before layer 0 (spec §4.5), then gathered on a
  // helper thread while the first layers run.
  std::vector<std::vector<std::vector<int64_t>>> rows(static_cast<size_t>(n));
  if (!c_.engram_layer_ids.empty()) {
    // The n-grams read up to max_ngram - 1 tokens before the chunk (from the state's history).
    const int64_t back = std::min<int64_t>(first, c_.engram_max_ngram_size - 1);
    std::vector<int32_t> ctx;
    for (int64_t p = first - back; p < first; ++p) ctx.push_back(st.token(p));
    ctx.insert(ctx.end(), tokens.begin(), tokens.end());
    for (int64_t t = 0; t < n; ++t)
      engram_row_ids(c_, hash_, ctx, back + t, &rows[static_cast<size_t>(t)]);
  }
  std::vector<std::vector<int64_t>> by_table(c_.engram_layer_ids.size());
  for (size_t li = 0; li < by_table.size(); ++li) {
    for (int64_t t = 0; t < n; ++t) {
      const auto& r = rows[static_cast<size_t>(t)][li];
      by_table[li].insert(by_table[li].end(), r.begin(), r.end());
    }
  }
  EngramStore::Pending gathered = engram_->gather_async(std::move(by_table));
  Shared sh;
  const bool dspark =
      has_dspark() && st.mtp_layers().size() == static_cast<size_t>(c_.num_nextn_predict_layers);
  if (dspark) {
    sh.features.resize(c_.dspark_target_layer_ids.size());
    sh.feature_first.assign(c_.dspark_target_layer_ids.size(), 0);
  }
  for (int l = 0; l < c_.num_hidden_layers; ++l) layer(l, st, first, n, gathered, X, pi, sh, ex);
  if (dspark) {
    write_dspark_context(st, first, n, sh, !(ex.active && ex.placeholder));
  }
  result->first_row = first - chunk_first;
  result->placeholder = ex.active && ex.placeholder;
  st.advance(static_cast<int64_t>(tokens.size()), tokens);
  // The head on every row, or on the chunk's last row only.
  const int64_t t0 = last_logits_only ? n - 1 : 0;
  std::vector<float> h(static_cast<size_t>(n * D), 0.0f);
  for (int64_t t = t0; t < n; ++t) {
    for (int64_t i = 0; i < D; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < hc; ++j)
        acc += pi[static_cast<size_t>(t * hc + j)] * X[static_cast<size_t>((t * hc + j) * D + i)];
      h[static_cast<size_t>(t * D + i)] = acc;
    }
  }
  result->first_row += t0;
  const float* hr = h.data() + t0 * D;
  rms(hr, n - t0, D, &w_.norm, static_cast<float>(c_.rms_norm_eps), h.data());
  result->logits.resize(static_cast<size_t>((n - t0) * c_.vocab_size));
  linear(w_.head, h.data(), n - t0, result->logits.data());
  return Status::ok_status();
}

}  // namespace dsinfer::cpu_v41
