// config.json parsing for DeepSeek V4.1 (official composite, transformers composite and
// transformers text-only forms), validation of the layer schedule and the derived maps.
#include "model_v41/config.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>

#include "base/file.h"

namespace dsinfer::model_v41 {

const char* config_form_name(V41ConfigForm f) {
  switch (f) {
    case V41ConfigForm::kOfficial:
      return "official";
    case V41ConfigForm::kTransformersComposite:
      return "transformers (deepseek_v41)";
    case V41ConfigForm::kTransformersText:
      return "transformers (deepseek_v41_text)";
  }
  return "?";
}

const char* layer_role_name(LayerRole r) {
  switch (r) {
    case LayerRole::kWindow:
      return "window";
    case LayerRole::kFull:
      return "full";
    case LayerRole::kReindex:
      return "reindex";
    case LayerRole::kReuse:
      return "reuse";
  }
  return "?";
}

bool V41Config::is_kv_owner(int l) const {
  return std::find(kv_source_layer_ids.begin(), kv_source_layer_ids.end(), l) !=
         kv_source_layer_ids.end();
}

bool is_prime_u64(uint64_t n) {
  if (n < 2) {
    return false;
  }
  for (uint64_t p :
       {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull}) {
    if (n % p == 0) {
      return n == p;
    }
  }
  auto mulmod = [](uint64_t a, uint64_t b, uint64_t m) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % m);
  };
  auto powmod = [&](uint64_t a, uint64_t e, uint64_t m) {
    uint64_t r = 1;
    a %= m;
    while (e) {
      if (e & 1) {
        r = mulmod(r, a, m);
      }
      a = mulmod(a, a, m);
      e >>= 1;
    }
    return r;
  };
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) {
    d >>= 1;
    ++s;
  }
  // Deterministic Miller-Rabin for every 64-bit n with these bases.
  for (uint64_t a :
       {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull}) {
    uint64_t x = powmod(a, d, n);
    if (x == 1 || x == n - 1) {
      continue;
    }
    bool composite = true;
    for (int i = 1; i < s; ++i) {
      x = mulmod(x, x, n);
      if (x == n - 1) {
        composite = false;
        break;
      }
    }
    if (composite) {
      return false;
    }
  }
  return true;
}

std::vector<std::vector<int64_t>> engram_primes(int64_t vocab_size,
                                                int64_t n_layers,
                                                int64_t max_ngram,
                                                int64_t n_heads) {
  std::set<int64_t> seen;
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n_layers));
  for (int64_t l = 0; l < n_layers; ++l) {
    for (int64_t n = 2; n <= max_ngram; ++n) {
      int64_t current = vocab_size - 1;
      for (int64_t h = 0; h < n_heads; ++h) {
        int64_t c = current + 1;
        while (!is_prime_u64(static_cast<uint64_t>(c)) || seen.count(c)) ++c;
        seen.insert(c);
        out[static_cast<size_t>(l)].push_back(c);
        current = c;
      }
    }
  }
  return out;
}

namespace {

using json = nlohmann::json;

constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxLayers = 4096;

// Typed, non-throwing access to one JSON object; errors name the file and the field path.
class Obj {
 public:
  Obj(const json& j, std::string source, std::string path)
      : j_(j), source_(std::move(source)), path_(std::move(path)) {}

  const json* find(std::initializer_list<const char*> names, std::string* used = nullptr) const {
    for (const char* n : names) {
      auto it = j_.find(n);
      if (it != j_.end() && !it->is_null()) {
        if (used) {
          *used = n;
        }
        return &*it;
      }
    }
    return nullptr;
  }
  std::string q(const std::string& n) const { return path_.empty() ? n : path_ + "." + n; }
  Status err(const std::string& n, const std::string& what) const {
    return invalid_argument(source_ + ": field '" + q(n) + "' " + what);
  }
  Status get_int(const char* n, int64_t* out, bool required, int64_t lo, int64_t hi) const {
    const json* v = find({n});
    if (v == nullptr) {
      return required ? err(n, "is required") : Status::ok_status();
    }
    if (v->is_number_integer()) {
      *out = v->get<int64_t>();
    } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
               std::fabs(v->get<double>()) < 9e15) {
      *out = static_cast<int64_t>(v->get<double>());
    } else {
      return err(n, std::string("must be an integer, got ") + v->type_name());
    }
    if (*out < lo || *out > hi) {
      return err(n,
                 "= " + std::to_string(*out) + " is out of range [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
    }
    return Status::ok_status();
  }
  Status get_double(const char* n, double* out, bool required) const {
    const json* v = find({n});
    if (v == nullptr) {
      return required ? err(n, "is required") : Status::ok_status();
    }
    if (!v->is_number()) {
      return err(n, std::string("must be a number, got ") + v->type_name());
    }
    *out = v->get<double>();
    if (!std::isfinite(*out)) {
      return err(n, "must be finite");
    }
    return Status::ok_status();
  }
  Status get_bool(const char* n, bool* out) const {
    const json* v = find({n});
    if (v == nullptr) {
      return Status::ok_status();
    }
    if (!v->is_boolean()) {
      return err(n, std::string("must be a boolean, got ") + v->type_name());
    }
    *out = v->get<bool>();
    return Status::ok_status();
  }
  Status get_string(const char* n, std::string* out, bool required) const {
    const json* v = find({n});
    if (v == nullptr) {
      return required ? err(n, "is required") : Status::ok_status();
    }
    if (!v->is_string()) {
      return err(n, std::string("must be a string, got ") + v->type_name());
    }
    *out = v->get<std::string>();
    return Status::ok_status();
  }
  // `present` tells whether the list was there.
  Status get_ints(const char* n, std::vector<int64_t>* out, bool* present) const {
    const json* v = find({n});
    *present = v != nullptr;
    if (v == nullptr) {
      return Status::ok_status();
    }
    if (!v->is_array()) {
      return err(n, std::string("must be a list of integers, got ") + v->type_name());
    }
    out->clear();
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_number_integer()) {
        return err(n, "entry " + std::to_string(i) + " must be an integer");
      }
      out->push_back((*v)[i].get<int64_t>());
    }
    return Status::ok_status();
  }
  Status expect_string(const char* n, const std::string& want) const {
    std::string got;
    DSI_RETURN_IF_ERROR(get_string(n, &got, false));
    if (find({n}) != nullptr && got != want) {
      return err(n, "= \"" + got + "\", V4.1 requires \"" + want + "\"");
    }
    return Status::ok_status();
  }
  const json& raw() const { return j_; }
  const std::string& source() const { return source_; }

 private:
  const json& j_;
  std::string source_;
  std::string path_;
};

std::string list_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(v[i]);
  }
  return s + "]";
}

Status to_layer_ids(const Obj& o,
                    const char* n,
                    const std::vector<int64_t>& in,
                    int64_t n_layers,
                    std::vector<int>* out) {
  out->clear();
  for (int64_t v : in) {
    if (v < 0 || v >= n_layers) {
      return o.err(n,
                   "entry " + std::to_string(v) + " is not a backbone layer [0, " +
                       std::to_string(n_layers) + ")");
    }
    if (!out->empty() && v <= out->back()) {
      return o.err(n, "must be strictly increasing");
    }
    out->push_back(static_cast<int>(v));
  }
  return Status::ok_status();
}

Status parse_rope(const Obj& t, V41Config* c) {
  double theta = 10000.0, ctheta = 160000.0;
  DSI_RETURN_IF_ERROR(t.get_double("rope_theta", &theta, false));
  DSI_RETURN_IF_ERROR(t.get_double("compress_rope_theta", &ctheta, false));
  c->rope_main = RopeParams{};
  c->rope_main.theta = theta;
  c->rope_compress = RopeParams{};
  c->rope_compress.theta = ctheta;
  auto read_yarn = [&](const json& rs, const std::string& path, RopeParams* p) -> Status {
    Obj r(rs, t.source(), path);
    std::string type;
    const json* tv = r.find({"rope_type", "type"});
    if (tv == nullptr) {
      // The transformers port silently runs without YaRN when rope_type is absent; refuse.
      return r.err("rope_type", "is required (the transformers port ignores YaRN without it)");
    }
    if (!tv->is_string()) {
      return r.err("rope_type", "must be a string");
    }
    type = tv->get<std::string>();
    if (type == "default") {
      return Status::ok_status();
    }
    if (type != "yarn") {
      return r.err("rope_type", "= \"" + type + "\"; V4.1 supports \"yarn\" or \"default\"");
    }
    p->yarn = true;
    DSI_RETURN_IF_ERROR(r.get_double("factor", &p->factor, true));
    DSI_RETURN_IF_ERROR(r.get_int(
        "original_max_position_embeddings", &p->original_max_position, true, 1, int64_t{1} << 40));
    DSI_RETURN_IF_ERROR(r.get_double("beta_fast", &p->beta_fast, false));
    DSI_RETURN_IF_ERROR(r.get_double("beta_slow", &p->beta_slow, false));
    double mscale_factor = 1.0;
    DSI_RETURN_IF_ERROR(r.get_double("attention_factor", &mscale_factor, false));
    if (mscale_factor != 1.0) {
      return r.err("attention_factor", "must be 1.0 (V4.1 forces the YaRN amplitude off)");
    }
    if (!(p->factor >= 1.0)) {
      return r.err("factor", "must be >= 1");
    }
    return Status::ok_status();
  };
  const json* rp = t.find({"rope_parameters"});
  if (rp != nullptr && rp->is_object() && rp->contains("main") && rp->contains("compress") &&
      (*rp)["main"].is_object() && (*rp)["compress"].is_object()) {
    Obj m((*rp)["main"], t.source(), t.q("rope_parameters.main"));
    Obj k((*rp)["compress"], t.source(), t.q("rope_parameters.compress"));
    DSI_RETURN_IF_ERROR(m.get_double("rope_theta", &c->rope_main.theta, true));
    DSI_RETURN_IF_ERROR(k.get_double("rope_theta", &c->rope_compress.theta, true));
    std::string mt = "default";
    DSI_RETURN_IF_ERROR(m.get_string("rope_type", &mt, false));
    if (mt != "default") {
      return m.err("rope_type", "must be \"default\" (no YaRN on the main table)");
    }
    return read_yarn((*rp)["compress"], t.q("rope_parameters.compress"), &c->rope_compress);
  }
  const json* rs = t.find({"rope_scaling"});
  if (rs != nullptr) {
    if (!rs->is_object()) {
      return t.err("rope_scaling", "must be an object");
    }
    return read_yarn(*rs, t.q("rope_scaling"), &c->rope_compress);
  }
  return Status::ok_status();
}

Status parse_quantization(const Obj& top, V41Config* c) {
  const json* q = top.find({"quantization_config"});
  if (q == nullptr) {
    return Status::ok_status();
  }
  if (!q->is_object()) {
    return top.err("quantization_config", "must be an object");
  }
  Obj o(*q, top.source(), top.q("quantization_config"));
  DSI_RETURN_IF_ERROR(o.expect_string("quant_method", "fp8"));
  DSI_RETURN_IF_ERROR(o.expect_string("expert_dtype", "fp4"));
  DSI_RETURN_IF_ERROR(o.expect_string("activation_scheme", "dynamic"));
  DSI_RETURN_IF_ERROR(o.expect_string("scale_fmt", "ue8m0"));
  std::vector<int64_t> wbs;
  bool has = false;
  DSI_RETURN_IF_ERROR(o.get_ints("weight_block_size", &wbs, &has));
  if (!has) {
    return o.err("weight_block_size", "is required");
  }
  if (wbs != std::vector<int64_t>{32, 32}) {
    return o.err("weight_block_size", "must be [32, 32] (V4.1 FP8 tiles; V4 used [128, 128])");
  }
  c->quantized = true;
  return Status::ok_status();
}

Status parse_text(const Obj& t, V41Config* c) {
  // Fixed by the architecture (DeepInfer asserts these).
  DSI_RETURN_IF_ERROR(t.expect_string("hidden_act", "silu"));
  DSI_RETURN_IF_ERROR(t.expect_string("scoring_func", "sqrtsoftplus"));
  DSI_RETURN_IF_ERROR(t.expect_string("topk_method", "noaux_tc"));
  bool b = false;
  DSI_RETURN_IF_ERROR(t.get_bool("attention_bias", &b));
  if (b) {
    return t.err("attention_bias", "must be false");
  }
  bool norm_topk = true;
  DSI_RETURN_IF_ERROR(t.get_bool("norm_topk_prob", &norm_topk));
  if (!norm_topk) {
    return t.err("norm_topk_prob", "must be true");
  }
  bool tie = false;
  DSI_RETURN_IF_ERROR(t.get_bool("tie_word_embeddings", &tie));
  if (tie) {
    return t.err("tie_word_embeddings", "must be false");
  }
  bool shifted = true;
  DSI_RETURN_IF_ERROR(t.get_bool("hc_shifted", &shifted));
  if (!shifted) {
    return t.err("hc_shifted", "= false (two-pass mHC with hc_head) is not a V4.1 checkpoint");
  }
  bool attn_input = true;
  DSI_RETURN_IF_ERROR(t.get_bool("dspark_target_attn_input", &attn_input));
  if (!attn_input) {
    return t.err("dspark_target_attn_input", "must be true");
  }
  int64_t kvh = 1;
  DSI_RETURN_IF_ERROR(t.get_int("num_key_value_heads", &kvh, false, 1, 1));

  DSI_RETURN_IF_ERROR(t.get_int("vocab_size", &c->vocab_size, true, 1, kMaxVocab));
  DSI_RETURN_IF_ERROR(t.get_int("hidden_size", &c->hidden_size, true, 1, kMaxDim));
  DSI_RETURN_IF_ERROR(t.get_int("num_hidden_layers", &c->num_hidden_layers, true, 1, kMaxLayers));
  DSI_RETURN_IF_ERROR(t.get_int("num_attention_heads", &c->num_attention_heads, true, 1, 4096));
  DSI_RETURN_IF_ERROR(t.get_int("head_dim", &c->head_dim, true, 1, kMaxDim));
  DSI_RETURN_IF_ERROR(t.get_int("qk_rope_head_dim", &c->qk_rope_head_dim, true, 2, kMaxDim));
  DSI_RETURN_IF_ERROR(t.get_int("q_lora_rank", &c->q_lora_rank, true, 1, kMaxDim));
  DSI_RETURN_IF_ERROR(t.get_int("o_groups", &c->o_groups, true, 1, 4096));
  DSI_RETURN_IF_ERROR(t.get_int("o_lora_rank", &c->o_lora_rank, true, 1, kMaxDim));
  DSI_RETURN_IF_ERROR(t.get_int("sliding_window", &c->sliding_window, true, 1, kMaxDim));
  c->max_position_embeddings = 1048576;
  DSI_RETURN_IF_ERROR(t.get_int(
      "max_position_embeddings", &c->max_position_embeddings, false, 1, int64_t{1} << 40));
  DSI_RETURN_IF_ERROR(t.get_int("index_n_heads", &c->index_n_heads, true, 1, 4096));
  DSI_RETURN_IF_ERROR(t.get_int("index_head_dim", &c->index_head_dim, true, 1, kMaxDim));
  DSI_RETURN_IF_ERROR(t.get_int("index_topk", &c->index_topk, true, 1, kMaxDim));
  DSI_RETURN_IF_ERROR(
      t.get_int("moe_intermediate_size", &c->moe_intermediate_size, true, 1, kMaxDim));
  DSI_RETURN_IF_ERROR(t.get_int("n_routed_experts", &c->n_routed_experts, true, 1, 65536));
  DSI_RETURN_IF_ERROR(t.get_int("n_shared_experts", &c->n_shared_experts, false, 1, 1));
  DSI_RETURN_IF_ERROR(
      t.get_int("num_experts_per_tok", &c->num_experts_per_tok, true, 1, c->n_routed_experts));
  DSI_RETURN_IF_ERROR(t.get_double("routed_scaling_factor", &c->routed_scaling_factor, false));
  DSI_RETURN_IF_ERROR(t.get_double("gate_temp", &c->gate_temp, false));
  if (!(c->gate_temp > 0)) {
    return t.err("gate_temp", "must be > 0");
  }
  DSI_RETURN_IF_ERROR(t.get_double("swiglu_limit", &c->swiglu_limit, false));
  DSI_RETURN_IF_ERROR(t.get_int("hc_mult", &c->hc_mult, false, 1, 64));
  DSI_RETURN_IF_ERROR(t.get_int("hc_sinkhorn_iters", &c->hc_sinkhorn_iters, false, 1, 1000));
  DSI_RETURN_IF_ERROR(t.get_double("hc_eps", &c->hc_eps, false));
  DSI_RETURN_IF_ERROR(t.get_double("rms_norm_eps", &c->rms_norm_eps, false));
  DSI_RETURN_IF_ERROR(t.get_int("bos_token_id", &c->bos_token_id, false, 0, kMaxVocab));
  DSI_RETURN_IF_ERROR(t.get_int("eos_token_id", &c->eos_token_id, false, 0, kMaxVocab));
  DSI_RETURN_IF_ERROR(t.get_int("pad_token_id", &c->pad_token_id, false, 0, kMaxVocab));
  DSI_RETURN_IF_ERROR(t.get_bool("use_fp4_sparse_kv", &c->use_fp4_sparse_kv));
  DSI_RETURN_IF_ERROR(parse_rope(t, c));

  if (c->head_dim % 32 != 0 || c->head_dim <= c->qk_rope_head_dim) {
    return t.err("head_dim",
                 "= " + std::to_string(c->head_dim) +
                     " must be a multiple of 32 (FP8 window records, FP4 compressed "
                     "records) and larger than qk_rope_head_dim");
  }
  if (c->qk_rope_head_dim % 2 != 0) {
    return t.err("qk_rope_head_dim", "must be even");
  }
  if (c->index_head_dim % 32 != 0 || c->index_head_dim <= c->qk_rope_head_dim) {
    return t.err("index_head_dim",
                 "= " + std::to_string(c->index_head_dim) +
                     " must be a multiple of 32 (FP4 index records) and larger "
                     "than qk_rope_head_dim");
  }
  if (c->num_attention_heads % c->o_groups != 0) {
    return t.err("o_groups", "must divide num_attention_heads");
  }

  // Layer schedule.
  const int64_t n = c->num_hidden_layers;
  DSI_RETURN_IF_ERROR(
      t.get_int("num_nextn_predict_layers", &c->num_nextn_predict_layers, false, 0, 64));
  const bool official = c->form == V41ConfigForm::kOfficial;
  std::vector<int64_t> ratios;
  bool has = false;
  DSI_RETURN_IF_ERROR(t.get_ints("compress_ratios", &ratios, &has));
  if (!has) {
    if (official) {
      return t.err("compress_ratios", "is required");
    }
    // The transformers port's default: the released pattern scaled to n layers.
    const int64_t n_slide = std::min<int64_t>(2, n);
    const int64_t n_enc = std::max<int64_t>(0, (n - n_slide + 1) / 2);
    ratios.assign(static_cast<size_t>(n_slide), 0);
    ratios.insert(ratios.end(), static_cast<size_t>(n_enc), 2);
    ratios.insert(ratios.end(), static_cast<size_t>(std::max<int64_t>(0, n - n_slide - n_enc)), 1);
  }
  const int64_t want = n + c->num_nextn_predict_layers;
  if (official ? static_cast<int64_t>(ratios.size()) != want
               : (static_cast<int64_t>(ratios.size()) < n ||
                  static_cast<int64_t>(ratios.size()) > want)) {
    return t.err("compress_ratios",
                 "has " + std::to_string(ratios.size()) +
                     " entries, expected num_hidden_layers + "
                     "num_nextn_predict_layers = " +
                     std::to_string(want));
  }
  c->compress_ratios.clear();
  for (size_t i = 0; i < ratios.size(); ++i) {
    const int64_t r = ratios[i];
    if (static_cast<int64_t>(i) >= n) {
      if (r != 0) {
        return t.err("compress_ratios",
                     "entry " + std::to_string(i) + " (a DSpark block) must be 0 (window only)");
      }
      continue;
    }
    if (r != 0 && r != 1 && r != 2) {
      return t.err("compress_ratios",
                   "entry " + std::to_string(i) + " = " + std::to_string(r) +
                       "; V4.1 uses 0 (window), 2 (producer CSA2) or 1 "
                       "(consumer, full-resolution global KV)");
    }
    c->compress_ratios.push_back(static_cast<int>(r));
  }

  std::vector<int64_t> raw;
  DSI_RETURN_IF_ERROR(t.get_ints("kv_source_layer_ids", &raw, &has));
  if (has) {
    DSI_RETURN_IF_ERROR(to_layer_ids(t, "kv_source_layer_ids", raw, n, &c->kv_source_layer_ids));
  } else if (official) {
    return t.err("kv_source_layer_ids", "is required");
  } else {
    c->kv_source_layer_ids.clear();
    for (int i = 0; i < n; ++i) {
      const int r = c->compress_ratios[static_cast<size_t>(i)];
      if (r > 0 && (i == 0 || c->compress_ratios[static_cast<size_t>(i - 1)] != r)) {
        c->kv_source_layer_ids.push_back(i);
      }
    }
  }
  DSI_RETURN_IF_ERROR(t.get_ints("index_source_layer_ids", &raw, &has));
  if (has) {
    DSI_RETURN_IF_ERROR(
        to_layer_ids(t, "index_source_layer_ids", raw, n, &c->index_source_layer_ids));
  } else if (official) {
    return t.err("index_source_layer_ids", "is required");
  } else {
    c->index_source_layer_ids = c->kv_source_layer_ids;
  }
  DSI_RETURN_IF_ERROR(t.get_ints("index_k_source_layer_ids", &raw, &has));
  if (has) {
    DSI_RETURN_IF_ERROR(
        to_layer_ids(t, "index_k_source_layer_ids", raw, n, &c->index_k_source_layer_ids));
  } else {
    c->index_k_source_layer_ids = c->kv_source_layer_ids;
  }
  int64_t cand = c->kv_source_layer_ids.empty() ? -1 : c->kv_source_layer_ids.back();
  DSI_RETURN_IF_ERROR(t.get_int("candidate_source_layer_id", &cand, false, -1, n - 1));
  c->candidate_source_layer_id = static_cast<int>(cand);
  c->candidate_topk_blocks = 2048;
  c->candidate_block_size = 8;
  DSI_RETURN_IF_ERROR(
      t.get_int("candidate_topk_blocks", &c->candidate_topk_blocks, false, 1, 4096));
  DSI_RETURN_IF_ERROR(t.get_int("candidate_block_size", &c->candidate_block_size, false, 1, 16));

  // Engram.
  DSI_RETURN_IF_ERROR(t.get_ints("engram_layer_ids", &raw, &has));
  if (has) {
    DSI_RETURN_IF_ERROR(to_layer_ids(t, "engram_layer_ids", raw, n, &c->engram_layer_ids));
  }
  DSI_RETURN_IF_ERROR(
      t.get_int("engram_vocab_size", &c->engram_vocab_size, false, 0, int64_t{1} << 40));
  DSI_RETURN_IF_ERROR(t.get_int("engram_max_ngram_size", &c->engram_max_ngram_size, false, 2, 8));
  DSI_RETURN_IF_ERROR(t.get_int("engram_n_heads", &c->engram_n_heads, false, 1, 64));
  DSI_RETURN_IF_ERROR(t.get_int("engram_head_dim", &c->engram_head_dim, false, 32, kMaxDim));
  // DeepInfer's key is engram_pad_token_id; the transformers port reads engram_pad_id.
  if (t.find({"engram_pad_token_id"}) != nullptr) {
    DSI_RETURN_IF_ERROR(
        t.get_int("engram_pad_token_id", &c->engram_pad_token_id, false, 0, kMaxVocab));
  } else {
    DSI_RETURN_IF_ERROR(t.get_int("engram_pad_id", &c->engram_pad_token_id, false, 0, kMaxVocab));
  }
  DSI_RETURN_IF_ERROR(t.get_int(
      "engram_compressed_vocab_size", &c->engram_compressed_vocab_size, false, 0, kMaxVocab));
  DSI_RETURN_IF_ERROR(t.get_ints("engram_num_embeddings", &c->engram_num_embeddings, &has));
  if (!c->engram_layer_ids.empty()) {
    if (c->engram_head_dim % 32 != 0) {
      return t.err("engram_head_dim", "must be a multiple of 32 (one E8M0 scale per 32 values)");
    }
    if (c->engram_vocab_size < 2) {
      return t.err("engram_vocab_size", "is required (>= 2) when engram_layer_ids is not empty");
    }
    if (c->engram_compressed_vocab_size <= 0) {
      return t.err("engram_compressed_vocab_size",
                   "is required (> 0) when engram_layer_ids is not empty");
    }
  }

  // DSpark.
  DSI_RETURN_IF_ERROR(t.get_int("dspark_block_size", &c->dspark_block_size, false, 1, 32));
  DSI_RETURN_IF_ERROR(
      t.get_int("dspark_noise_token_id", &c->dspark_noise_token_id, false, 0, kMaxVocab));
  DSI_RETURN_IF_ERROR(t.get_int("dspark_markov_rank", &c->dspark_markov_rank, false, 0, kMaxDim));
  DSI_RETURN_IF_ERROR(
      t.get_int("dspark_n_routed_experts", &c->dspark_n_routed_experts, false, 0, 65536));
  DSI_RETURN_IF_ERROR(
      t.get_int("dspark_num_experts_per_tok", &c->dspark_num_experts_per_tok, false, 0, 65536));
  DSI_RETURN_IF_ERROR(t.get_ints("dspark_target_layer_ids", &raw, &has));
  if (has) {
    DSI_RETURN_IF_ERROR(
        to_layer_ids(t, "dspark_target_layer_ids", raw, n, &c->dspark_target_layer_ids));
  }
  return Status::ok_status();
}

// Nearest id of `ids` not later than l; -1 when l precedes every id.
int nearest_at_or_before(const std::vector<int>& ids, int l) {
  int best = -1;
  for (int s : ids) {
    if (s <= l) {
      best = s;
    }
  }
  return best;
}

Status derive_schedule(const std::string& src, V41Config* c) {
  auto bad = [&](const std::string& what) {
    return invalid_argument(src + ": wrong layer schedule: " + what);
  };
  const int n = static_cast<int>(c->num_hidden_layers);
  const auto& ratio = c->compress_ratios;
  // YOCO boundary: the first ratio-1 layer.
  c->yoco_boundary = n;
  for (int l = 0; l < n; ++l) {
    if (ratio[static_cast<size_t>(l)] == 1) {
      c->yoco_boundary = l;
      break;
    }
  }
  const int b = c->yoco_boundary;
  for (int l = b; l < n; ++l) {
    if (ratio[static_cast<size_t>(l)] != 1) {
      return bad("wrong producer/consumer config: layer " + std::to_string(l) +
                 " has compress ratio " + std::to_string(ratio[static_cast<size_t>(l)]) +
                 " after the YOCO boundary (layer " + std::to_string(b) +
                 ", the first ratio-1 layer); every consumer layer must have ratio 1");
    }
  }
  if (b < n && !c->is_kv_owner(b)) {
    return bad("wrong producer/consumer config: the YOCO boundary layer " + std::to_string(b) +
               " must own the global compressed KV (be in kv_source_layer_ids " +
               list_str(c->kv_source_layer_ids) + ")");
  }
  for (int s : c->kv_source_layer_ids) {
    if (ratio[static_cast<size_t>(s)] == 0) {
      return bad("kv_source_layer_ids entry " + std::to_string(s) + " has compress ratio 0");
    }
  }
  for (int s : c->index_source_layer_ids) {
    if (ratio[static_cast<size_t>(s)] == 0) {
      return bad("index_source_layer_ids entry " + std::to_string(s) + " has compress ratio 0");
    }
  }
  for (int s : c->index_k_source_layer_ids) {
    if (!c->is_kv_owner(s)) {
      return bad("index_k_source_layer_ids entry " + std::to_string(s) +
                 " is not a KV source (index keys come from its compressor latent)");
    }
  }
  const bool has_cand = c->candidate_source_layer_id >= 0;
  if (has_cand) {
    const int cs = c->candidate_source_layer_id;
    if (std::find(c->index_source_layer_ids.begin(), c->index_source_layer_ids.end(), cs) ==
        c->index_source_layer_ids.end()) {
      return bad("candidate_source_layer_id " + std::to_string(cs) + " is not an index source " +
                 list_str(c->index_source_layer_ids));
    }
    const int64_t blocks = c->candidate_topk_blocks, bs = c->candidate_block_size;
    if (blocks % 8 != 0 || blocks > 4096) {
      return bad("candidate_topk_blocks " + std::to_string(blocks) +
                 " must be a multiple of 8 and at most 4096");
    }
    if (bs != 8 && bs != 16) {
      return bad("candidate_block_size " + std::to_string(bs) + " must be 8 or 16");
    }
    if (blocks * bs < c->index_topk) {
      return bad("candidate_topk_blocks x candidate_block_size (" + std::to_string(blocks * bs) +
                 ") is below index_topk (" + std::to_string(c->index_topk) + ")");
    }
  }

  c->layers.assign(static_cast<size_t>(n), V41LayerPlan{});
  for (int l = 0; l < n; ++l) {
    V41LayerPlan& p = c->layers[static_cast<size_t>(l)];
    const int r = ratio[static_cast<size_t>(l)];
    p.compress_ratio = r;
    p.producer = l < b;
    p.rope = r == 0 ? model::RopeTable::kMain : model::RopeTable::kCompress;
    if (r == 0) {
      p.role = LayerRole::kWindow;
      continue;
    }
    p.kv_owner = nearest_at_or_before(c->kv_source_layer_ids, l);
    p.topk_source = nearest_at_or_before(c->index_source_layer_ids, l);
    p.index_key_owner = nearest_at_or_before(c->index_k_source_layer_ids, l);
    const std::string L = "layer " + std::to_string(l);
    if (p.kv_owner < 0) {
      return bad(L + " has compress ratio " + std::to_string(r) +
                 " but no kv_source_layer_ids entry at or before it");
    }
    if (p.topk_source < 0 || p.index_key_owner < 0) {
      return bad(L + " has compress ratio " + std::to_string(r) +
                 " but no index source / index-key owner at or before it");
    }
    if (ratio[static_cast<size_t>(p.kv_owner)] != r) {
      return bad(L + " (ratio " + std::to_string(r) + ") reads the KV of layer " +
                 std::to_string(p.kv_owner) + " with a different ratio");
    }
    if (p.producer != (p.kv_owner < b)) {
      return bad("wrong producer/consumer config: " + L + " reads the KV of layer " +
                 std::to_string(p.kv_owner) + " across the YOCO boundary " + std::to_string(b));
    }
    // Nesting: top-k segments inside index-key segments inside KV segments.
    const V41LayerPlan* src_plan =
        p.topk_source == l ? &p : &c->layers[static_cast<size_t>(p.topk_source)];
    if (p.topk_source != l && src_plan->index_key_owner != p.index_key_owner) {
      return bad(L + " reuses the top-k of layer " + std::to_string(p.topk_source) +
                 ", which scores a different index-key owner");
    }
    if (nearest_at_or_before(c->kv_source_layer_ids, p.index_key_owner) != p.kv_owner) {
      return bad(L + ": index-key owner " + std::to_string(p.index_key_owner) +
                 " lies outside its KV segment (owner " + std::to_string(p.kv_owner) + ")");
    }
    const bool index_source = p.topk_source == l;
    if (c->is_kv_owner(l)) {
      if (!index_source) {
        return bad(L + " owns a compressor but is not an index source");
      }
      p.role = LayerRole::kFull;
    } else {
      p.role = index_source ? LayerRole::kReindex : LayerRole::kReuse;
    }
    p.candidate_source = has_cand && l == c->candidate_source_layer_id;
    p.uses_candidates = has_cand && index_source && l > c->candidate_source_layer_id;
  }

  // Engram layers: producers only (their rows are fetched before layer 0; bounded replay skips
  // consumer rows).
  for (size_t i = 0; i < c->engram_layer_ids.size(); ++i) {
    const int l = c->engram_layer_ids[i];
    if (l >= b) {
      return bad("wrong producer/consumer config: Engram layer " + std::to_string(l) +
                 " is not a producer (YOCO boundary " + std::to_string(b) + ")");
    }
    c->layers[static_cast<size_t>(l)].engram = true;
    c->layers[static_cast<size_t>(l)].engram_index = static_cast<int>(i);
  }
  bool below = false, above = false;
  for (int l : c->dspark_target_layer_ids) {
    (l < b ? below : above) = true;
  }
  if (below && above) {
    return bad("wrong producer/consumer config: dspark_target_layer_ids " +
               list_str(c->dspark_target_layer_ids) + " straddle the YOCO boundary " +
               std::to_string(b));
  }
  return Status::ok_status();
}

Status parse_impl(const json& j, const std::string& src, V41Config* c) {
  if (!j.is_object()) {
    return invalid_argument(src + ": top level must be a JSON object");
  }
  Obj top(j, src, "");
  std::string model_type;
  DSI_RETURN_IF_ERROR(top.get_string("model_type", &model_type, true));
  const json* text = &j;
  std::string text_path;
  if (model_type == "deepseek_v41") {
    const json* tc = top.find({"text_config"});
    if (tc == nullptr || !tc->is_object()) {
      return top.err("text_config", "is required (an object) for model_type deepseek_v41");
    }
    text = tc;
    text_path = "text_config";
    // The official config carries DeepInfer's strict top level (dtype, architectures,
    // quantization_config); save_pretrained of the port writes neither `dtype` nor
    // `architectures` checks we need.
    const bool official = top.find({"quantization_config"}) != nullptr;
    c->form = official ? V41ConfigForm::kOfficial : V41ConfigForm::kTransformersComposite;
    std::string tmt;
    Obj t(*tc, src, "text_config");
    DSI_RETURN_IF_ERROR(t.get_string("model_type", &tmt, false));
    if (!tmt.empty() && tmt != "deepseek_v41_text") {
      return t.err("model_type", "= \"" + tmt + "\", expected \"deepseek_v41_text\"");
    }
    if (official) {
      const json* arch = top.find({"architectures"});
      if (arch == nullptr || !arch->is_array() || arch->size() != 1 || !(*arch)[0].is_string() ||
          (*arch)[0].get<std::string>() != "DeepseekV41ForCausalLM") {
        return top.err("architectures", "must be [\"DeepseekV41ForCausalLM\"]");
      }
      std::string dtype;
      DSI_RETURN_IF_ERROR(top.get_string("dtype", &dtype, true));
      if (dtype != "bfloat16") {
        return top.err("dtype", "= \"" + dtype + "\", V4.1 requires \"bfloat16\"");
      }
    }
    DSI_RETURN_IF_ERROR(parse_quantization(top, c));
    DSI_RETURN_IF_ERROR(top.get_int("image_token_id", &c->image_token_id, false, 0, kMaxVocab));
    DSI_RETURN_IF_ERROR(
        top.get_string("tokenizer_compatibility", &c->tokenizer_compatibility, false));
    if (c->tokenizer_compatibility != "release" && c->tokenizer_compatibility != "native") {
      return top.err("tokenizer_compatibility", "must be \"release\" or \"native\"");
    }
    c->has_vision_config = top.find({"vision_config"}) != nullptr;
  } else if (model_type == "deepseek_v41_text") {
    c->form = V41ConfigForm::kTransformersText;
    DSI_RETURN_IF_ERROR(parse_quantization(top, c));
  } else {
    return top.err("model_type",
                   "= \"" + model_type + "\", expected \"deepseek_v41\" or \"deepseek_v41_text\"");
  }
  Obj t(*text, src, text_path);
  DSI_RETURN_IF_ERROR(parse_text(t, c));
  // Top-level token ids of the composite config win over the text config's.
  DSI_RETURN_IF_ERROR(top.get_int("bos_token_id", &c->bos_token_id, false, 0, kMaxVocab));
  DSI_RETURN_IF_ERROR(top.get_int("eos_token_id", &c->eos_token_id, false, 0, kMaxVocab));
  DSI_RETURN_IF_ERROR(top.get_int("pad_token_id", &c->pad_token_id, false, 0, kMaxVocab));
  DSI_RETURN_IF_ERROR(derive_schedule(src, c));

  if (!c->engram_layer_ids.empty()) {
    c->engram_primes = engram_primes(c->engram_vocab_size,
                                     static_cast<int64_t>(c->engram_layer_ids.size()),
                                     c->engram_max_ngram_size,
                                     c->engram_n_heads);
    c->engram_rows.clear();
    for (const auto& ps : c->engram_primes) {
      int64_t s = 0;
      for (int64_t p : ps) s += p;
      c->engram_rows.push_back(s);
    }
    if (!c->engram_num_embeddings.empty() && c->engram_num_embeddings != c->engram_rows) {
      std::string got, want;
      for (size_t i = 0; i < c->engram_rows.size(); ++i) {
        want += (i ? ", " : "") + std::to_string(c->engram_rows[i]);
      }
      for (size_t i = 0; i < c->engram_num_embeddings.size(); ++i) {
        got += (i ? ", " : "") + std::to_string(c->engram_num_embeddings[i]);
      }
      return t.err("engram_num_embeddings",
                   "= [" + got +
                       "] does not match the rows recomputed "
                       "from the bucket primes [" +
                       want + "]");
    }
  }
  return Status::ok_status();
}

}  // namespace

bool is_v41_config_text(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return false;
  }
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) {
    return false;
  }
  const std::string s = mt->get<std::string>();
  return s == "deepseek_v41" || s == "deepseek_v41_text";
}

Result<V41Config> parse_v41_config(const std::string& json_text, const std::string& source) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return invalid_argument(source + ": not valid JSON");
  }
  V41Config c;
  DSI_RETURN_IF_ERROR(parse_impl(j, source, &c));
  return c;
}

Result<V41Config> load_v41_config(const std::string& path) {
  DSI_ASSIGN_OR_RETURN(std::string text, read_text_file(path, uint64_t{1} << 26));
  return parse_v41_config(text, path);
}

}  // namespace dsinfer::model_v41
