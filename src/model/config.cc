// config.json parsing for both dialects (official DeepSeek and transformers' save_pretrained),
// validation, the derived per-layer plan and the RoPE inverse-frequency tables.
#include "model/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>

#include "base/file.h"
#include "base/strings.h"

namespace dsinfer::model {

const char* attention_type_name(AttentionType t) {
  switch (t) {
    case AttentionType::kSliding:
      return "sliding";
    case AttentionType::kCsa:
      return "csa";
    case AttentionType::kHca:
      return "hca";
  }
  return "?";
}

const char* moe_type_name(MoeType t) {
  switch (t) {
    case MoeType::kHash:
      return "hash";
    case MoeType::kScore:
      return "score";
  }
  return "?";
}

const char* rope_table_name(RopeTable t) {
  switch (t) {
    case RopeTable::kMain:
      return "main";
    case RopeTable::kCompress:
      return "compress";
  }
  return "?";
}

const char* scoring_func_name(ScoringFunc f) {
  switch (f) {
    case ScoringFunc::kSqrtSoftplus:
      return "sqrtsoftplus";
    case ScoringFunc::kSigmoid:
      return "sigmoid";
    case ScoringFunc::kSoftmax:
      return "softmax";
  }
  return "?";
}

namespace {

using json = nlohmann::json;

// Upper bounds that keep every derived size (heads*head_dim, (2+hc)*hc*hc*hidden, ...) far
// from int64 overflow; real models are orders of magnitude below them.
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxExperts = int64_t{1} << 16;
constexpr int64_t kMaxMtp = 64;
constexpr int64_t kMaxHcMult = 64;
constexpr int64_t kMaxSinkhorn = 1000;
constexpr int64_t kMaxPositions = int64_t{1} << 40;

const char* type_of(const json& j) {
  return j.type_name();
}

// Typed, non-throwing access to the fields of one JSON object; every error names the source file
// and the field (with its path for nested objects).
class Fields {
 public:
  Fields(const json& obj, const std::string& source, std::string path = "")
      : obj_(obj), source_(source), path_(std::move(path)) {}

  // The first of `names` present (and not null) in the object, or null. `used` gets its name.
  const json* find(std::initializer_list<const char*> names, std::string* used = nullptr) const {
    for (const char* n : names) {
      auto it = obj_.find(n);
      if (it != obj_.end() && !it->is_null()) {
        if (used) {
          *used = n;
        }
        return &*it;
      }
    }
    return nullptr;
  }
  bool has(std::initializer_list<const char*> names) const { return find(names) != nullptr; }

  std::string qualified(const std::string& name) const {
    return path_.empty() ? name : path_ + "." + name;
  }
  Status error(const std::string& name, const std::string& what) const {
    return invalid_argument(source_ + ": field '" + qualified(name) + "' " + what);
  }
  Status missing(std::initializer_list<const char*> names) const {
    std::string alts;
    size_t i = 0;
    for (const char* n : names) {
      if (i++ == 0) {
        continue;
      }
      alts += alts.empty() ? " (or '" : "', '";
      alts += qualified(n);
    }
    if (!alts.empty()) {
      alts += "')";
    }
    return not_found(source_ + ": missing required field '" + qualified(*names.begin()) + "'" +
                     alts);
  }

  // Integer field (an integral JSON float is accepted too). Leaves *out unchanged when absent
  // and not required.
  Status get_int(std::initializer_list<const char*> names, int64_t* out, bool required) const {
    std::string used;
    const json* j = find(names, &used);
    if (j == nullptr) {
      return required ? missing(names) : Status::ok_status();
    }
    return to_int(*j, used, out);
  }
  Status to_int(const json& j, const std::string& name, int64_t* out) const {
    if (j.is_number_unsigned()) {
      const uint64_t v = j.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return error(name, "is out of range");
      }
      *out = static_cast<int64_t>(v);
      return Status::ok_status();
    }
    if (j.is_number_integer()) {
      *out = j.get<int64_t>();
      return Status::ok_status();
    }
    if (j.is_number_float()) {
      const double d = j.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
        *out = static_cast<int64_t>(d);
        return Status::ok_status();
      }
      return error(name, str_format("must be an integer, got %g", d));
    }
    return error(name, std::string("must be an integer, got ") + type_of(j));
  }
  Status get_double(std::initializer_list<const char*> names, double* out, bool required) const {
    std::string used;
    const json* j = find(names, &used);
    if (j == nullptr) {
      return required ? missing(names) : Status::ok_status();
    }
    if (!j->is_number()) {
      return error(used, std::string("must be a number, got ") + type_of(*j));
    }
    const double d = j->get<double>();
    if (!std::isfinite(d)) {
      return error(used, "must be finite");
    }
    *out = d;
    return Status::ok_status();
  }
  Status get_bool(std::initializer_list<const char*> names, bool* out, bool required) const {
    std::string used;
    const json* j = find(names, &used);
    if (j == nullptr) {
      return required ? missing(names) : Status::ok_status();
    }
    if (!j->is_boolean()) {
      return error(used, std::string("must be a boolean, got ") + type_of(*j));
    }
    *out = j->get<bool>();
    return Status::ok_status();
  }
  Status get_string(std::initializer_list<const char*> names,
                    std::string* out,
                    bool required) const {
    std::string used;
    const json* j = find(names, &used);
    if (j == nullptr) {
      return required ? missing(names) : Status::ok_status();
    }
    if (!j->is_string()) {
      return error(used, std::string("must be a string, got ") + type_of(*j));
    }
    *out = j->get<std::string>();
    return Status::ok_status();
  }

  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  const std::string& source_;
  std::string path_;
};

// Checks lo <= v <= hi for a parsed field.
Status check_range(const Fields& f, const char* name, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return f.error(name,
                   str_format("= %lld is out of range [%lld, %lld]",
                              static_cast<long long>(v),
                              static_cast<long long>(lo),
                              static_cast<long long>(hi)));
  }
  return Status::ok_status();
}

// Parses one RoPE parameter object: {"rope_type"/"type": "default"|"yarn", "rope_theta", factor,
// original_max_position_embeddings, beta_fast, beta_slow, attention_factor, partial_rotary_factor}.
// `theta_required` is false when the caller supplies theta separately (DeepSeek rope_scaling).
Status parse_rope_object(const json& obj,
                         const std::string& source,
                         const std::string& path,
                         bool theta_required,
                         RopeParams* out,
                         double* partial_rotary_factor) {
  if (!obj.is_object()) {
    return invalid_argument(source + ": field '" + path + "' must be an object, got " +
                            type_of(obj));
  }
  Fields f(obj, source, path);
  std::string type = "default";
  DSI_RETURN_IF_ERROR(f.get_string({"rope_type", "type"}, &type, false));
  if (theta_required) {
    DSI_RETURN_IF_ERROR(f.get_double({"rope_theta"}, &out->theta, true));
  }
  if (partial_rotary_factor) {
    DSI_RETURN_IF_ERROR(f.get_double({"partial_rotary_factor"}, partial_rotary_factor, false));
  }
  if (type == "default") {
    out->yarn = false;
    return Status::ok_status();
  }
  if (type != "yarn") {
    return unimplemented(source + ": field '" + path + ".rope_type' = '" + type +
                         "' is not supported (only 'default' and 'yarn')");
  }
  out->yarn = true;
  DSI_RETURN_IF_ERROR(f.get_double({"factor"}, &out->factor, true));
  DSI_RETURN_IF_ERROR(
      f.get_int({"original_max_position_embeddings"}, &out->original_max_position, true));
  // transformers: `rope_parameters.get("beta_fast") or 32`.
  double bf = 0.0, bs = 0.0;
  DSI_RETURN_IF_ERROR(f.get_double({"beta_fast"}, &bf, false));
  DSI_RETURN_IF_ERROR(f.get_double({"beta_slow"}, &bs, false));
  out->beta_fast = bf != 0.0 ? bf : 32.0;
  out->beta_slow = bs != 0.0 ? bs : 1.0;
  double attention_factor = 1.0;
  DSI_RETURN_IF_ERROR(f.get_double({"attention_factor"}, &attention_factor, false));
  if (attention_factor != 1.0) {
    return unimplemented(source + ": field '" + path +
                         ".attention_factor' != 1 is not supported (V4 uses no YaRN mscale)");
  }
  bool truncate = true;
  DSI_RETURN_IF_ERROR(f.get_bool({"truncate"}, &truncate, false));
  if (!truncate) {
    return unimplemented(source + ": field '" + path + ".truncate' = false is not supported");
  }
  return Status::ok_status();
}

Status validate_rope(const std::string& source, const std::string& path, const RopeParams& p) {
  auto bad = [&](const char* field, const char* what) {
    return invalid_argument(source + ": RoPE parameters (" + path + "): " + field + " " + what);
  };
  if (!(p.theta > 1.0)) {
    return bad("rope_theta", "must be > 1");
  }
  if (!p.yarn) {
    return Status::ok_status();
  }
  if (!(p.factor > 0.0)) {
    return bad("factor", "must be > 0");
  }
  if (p.original_max_position <= 0 || p.original_max_position > kMaxPositions) {
    return bad("original_max_position_embeddings", "must be a positive integer");
  }
  if (!(p.beta_fast > 0.0)) {
    return bad("beta_fast", "must be > 0");
  }
  if (!(p.beta_slow > 0.0)) {
    return bad("beta_slow", "must be > 0");
  }
  return Status::ok_status();
}

// Reads an integer list field; every element must be an integer.
Status get_int_list(const Fields& f, const json& j, const char* name, std::vector<int64_t>* out) {
  if (!j.is_array()) {
    return f.error(name, std::string("must be a list, got ") + type_of(j));
  }
  out->clear();
  for (size_t i = 0; i < j.size(); ++i) {
    int64_t v = 0;
    DSI_RETURN_IF_ERROR(f.to_int(j[i], str_format("%s[%zu]", name, i), &v));
    out->push_back(v);
  }
  return Status::ok_status();
}

Status get_string_list(const Fields& f,
                       const json& j,
                       const char* name,
                       std::vector<std::string>* out) {
  if (!j.is_array()) {
    return f.error(name, std::string("must be a list, got ") + type_of(j));
  }
  out->clear();
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string()) {
      return f.error(str_format("%s[%zu]", name, i),
                     std::string("must be a string, got ") + type_of(j[i]));
    }
    out->push_back(j[i].get<std::string>());
  }
  return Status::ok_status();
}

// quantization_config (either dialect) and the inference config's "dtype".
Status parse_quantization(const Fields& top, ModelConfig* c) {
  const std::string& src = top.source();
  if (const json* q = top.find({"quantization_config"})) {
    if (!q->is_object()) {
      return top.error("quantization_config", std::string("must be an object, got ") + type_of(*q));
    }
    Fields f(*q, src, "quantization_config");
    std::string method;
    DSI_RETURN_IF_ERROR(f.get_string({"quant_method"}, &method, true));
    if (method != "fp8") {
      return unimplemented(src + ": field 'quantization_config.quant_method' = '" + method +
                           "' is not supported (only fp8 with 128x128 blocks)");
    }
    std::string fmt = "e4m3";
    DSI_RETURN_IF_ERROR(f.get_string({"fmt"}, &fmt, false));
    if (fmt != "e4m3") {
      return unimplemented(src + ": field 'quantization_config.fmt' = '" + fmt +
                           "' is not supported (only e4m3)");
    }
    if (const json* b = f.find({"weight_block_size"})) {
      std::vector<int64_t> block;
      DSI_RETURN_IF_ERROR(get_int_list(f, *b, "weight_block_size", &block));
      if (block != std::vector<int64_t>{128, 128}) {
        return unimplemented(src +
                             ": field 'quantization_config.weight_block_size' is not supported "
                             "(only [128, 128])");
      }
    }
    std::string scale_fmt = "ue8m0";
    DSI_RETURN_IF_ERROR(f.get_string({"scale_fmt"}, &scale_fmt, false));
    if (scale_fmt != "ue8m0") {
      return unimplemented(src + ": field 'quantization_config.scale_fmt' = '" + scale_fmt +
                           "' is not supported (only ue8m0)");
    }
    std::string act = "dynamic";
    DSI_RETURN_IF_ERROR(f.get_string({"activation_scheme"}, &act, false));
    if (act != "dynamic") {
      return unimplemented(src + ": field 'quantization_config.activation_scheme' = '" + act +
                           "' is not supported (only dynamic)");
    }
    c->fp8_quantized = true;
  } else if (const json* d = top.find({"dtype"})) {
    // DeepSeek inference/config.json: "dtype": "fp8" | "bf16".
    if (d->is_string()) {
      c->fp8_quantized = d->get<std::string>() == "fp8";
    }
  }
  return Status::ok_status();
}

// Per-layer plan from the DeepSeek dialect's compress_ratios.
Status plan_from_compress_ratios(const Fields& f, const json& j, const char* name, ModelConfig* c) {
  std::vector<int64_t> ratios;
  DSI_RETURN_IF_ERROR(get_int_list(f, j, name, &ratios));
  const auto n = static_cast<size_t>(c->num_hidden_layers);
  const auto nm = static_cast<size_t>(c->num_hidden_layers + c->num_nextn_predict_layers);
  if (ratios.size() != n && ratios.size() != nm) {
    return f.error(name,
                   str_format("has %zu entries; expected num_hidden_layers (%zu)%s",
                              ratios.size(),
                              n,
                              nm != n ? str_format(" or num_hidden_layers + "
                                                   "num_nextn_predict_layers (%zu)",
                                                   nm)
                                            .c_str()
                                      : ""));
  }
  int64_t csa_ratio = 0;
  for (size_t i = 0; i < ratios.size(); ++i) {
    const int64_t r = ratios[i];
    if (r < 0 || r > kMaxPositions) {
      return f.error(
          str_format("%s[%zu]", name, i),
          str_format("= %lld must be 0 (sliding) or a positive ratio", static_cast<long long>(r)));
    }
    if (i >= n && r != 0) {
      return unimplemented(
          str_format("%s: field '%s[%zu]' = %lld: MTP layers must be sliding-only (ratio 0)",
                     f.source().c_str(),
                     name,
                     i,
                     static_cast<long long>(r)));
    }
    if (i < n && r > 0 && r > kMaxDim) {
      return f.error(str_format("%s[%zu]", name, i), "is too large");
    }
  }
  // Two distinct non-zero ratios: the smaller is CSA (overlapping compressor + indexer), the larger
  // HCA. A single one follows DeepSeek's reference, where only ratio 4 has overlap and indexer.
  std::vector<int64_t> distinct;
  for (size_t i = 0; i < n; ++i) {
    if (ratios[i] > 0 && std::find(distinct.begin(), distinct.end(), ratios[i]) == distinct.end()) {
      distinct.push_back(ratios[i]);
    }
  }
  if (distinct.size() > 2) {
    return f.error(name,
                   "has more than two distinct non-zero ratios (expected one CSA and one HCA)");
  }
  if (distinct.size() == 2) {
    csa_ratio = std::min(distinct[0], distinct[1]);
  } else if (distinct.size() == 1 && distinct[0] == 4) {
    csa_ratio = 4;
  }
  c->layers.assign(n, LayerPlan{});
  for (size_t i = 0; i < n; ++i) {
    LayerPlan& p = c->layers[i];
    p.compress_ratio = static_cast<int>(ratios[i]);
    if (ratios[i] == 0) {
      p.attention = AttentionType::kSliding;
      p.rope = RopeTable::kMain;
    } else {
      p.attention = ratios[i] == csa_ratio ? AttentionType::kCsa : AttentionType::kHca;
      p.rope = RopeTable::kCompress;
    }
  }
  return Status::ok_status();
}

// Per-layer plan from the transformers dialect's layer_types + compress_rates.
Status plan_from_layer_types(const Fields& f, const json& j, ModelConfig* c) {
  std::vector<std::string> types;
  DSI_RETURN_IF_ERROR(get_string_list(f, j, "layer_types", &types));
  if (static_cast<int64_t>(types.size()) != c->num_hidden_layers) {
    return f.error("layer_types",
                   str_format("has %zu entries but num_hidden_layers is %lld",
                              types.size(),
                              static_cast<long long>(c->num_hidden_layers)));
  }
  int64_t csa = 4, hca = 128;
  if (const json* rates = f.find({"compress_rates"})) {
    if (!rates->is_object()) {
      return f.error("compress_rates", std::string("must be an object, got ") + type_of(*rates));
    }
    Fields r(*rates, f.source(), "compress_rates");
    DSI_RETURN_IF_ERROR(r.get_int({"compressed_sparse_attention"}, &csa, false));
    DSI_RETURN_IF_ERROR(r.get_int({"heavily_compressed_attention"}, &hca, false));
    DSI_RETURN_IF_ERROR(check_range(r, "compressed_sparse_attention", csa, 1, kMaxDim));
    DSI_RETURN_IF_ERROR(check_range(r, "heavily_compressed_attention", hca, 1, kMaxDim));
  }
  // Legacy scalar overrides (transformers folds them in the same way).
  DSI_RETURN_IF_ERROR(f.get_int({"compress_rate_csa"}, &csa, false));
  DSI_RETURN_IF_ERROR(f.get_int({"compress_rate_hca"}, &hca, false));
  DSI_RETURN_IF_ERROR(check_range(f, "compress_rate_csa", csa, 1, kMaxDim));
  DSI_RETURN_IF_ERROR(check_range(f, "compress_rate_hca", hca, 1, kMaxDim));
  c->layers.assign(types.size(), LayerPlan{});
  for (size_t i = 0; i < types.size(); ++i) {
    LayerPlan& p = c->layers[i];
    if (types[i] == "sliding_attention") {
      p.attention = AttentionType::kSliding;
      p.compress_ratio = 0;
      p.rope = RopeTable::kMain;
    } else if (types[i] == "compressed_sparse_attention") {
      p.attention = AttentionType::kCsa;
      p.compress_ratio = static_cast<int>(csa);
      p.rope = RopeTable::kCompress;
    } else if (types[i] == "heavily_compressed_attention") {
      p.attention = AttentionType::kHca;
      p.compress_ratio = static_cast<int>(hca);
      p.rope = RopeTable::kCompress;
    } else {
      return f.error(str_format("layer_types[%zu]", i),
                     "has unknown layer type '" + types[i] +
                         "' (expected sliding_attention, compressed_sparse_attention or "
                         "heavily_compressed_attention)");
    }
  }
  return Status::ok_status();
}

Status parse_impl(const json& j, const std::string& src, ModelConfig* c) {
  Fields f(j, src);

  std::string model_type;
  DSI_RETURN_IF_ERROR(f.get_string({"model_type"}, &model_type, false));
  if (model_type == "deepseek_v41" || model_type == "deepseek_v41_text") {
    return unimplemented(src + ": a DeepSeek V4.1 checkpoint (model_type '" + model_type +
                         "'): this command runs V4 only so far; `dsinfer inspect` reads V4.1");
  }
  if (!model_type.empty() && model_type != "deepseek_v4") {
    return invalid_argument(src + ": field 'model_type' = '" + model_type +
                            "' is not supported (expected deepseek_v4)");
  }
  const bool transformers = f.has({"layer_types"}) || f.has({"rope_parameters"}) ||
                            f.has({"mlp_layer_types"}) || f.has({"compress_rates"});
  c->dialect = transformers ? ConfigDialect::kTransformers : ConfigDialect::kDeepSeek;

  // ---- dimensions ----
  DSI_RETURN_IF_ERROR(f.get_int({"vocab_size"}, &c->vocab_size, true));
  DSI_RETURN_IF_ERROR(f.get_int({"hidden_size", "dim"}, &c->hidden_size, true));
  DSI_RETURN_IF_ERROR(f.get_int({"num_hidden_layers", "n_layers"}, &c->num_hidden_layers, true));
  DSI_RETURN_IF_ERROR(f.get_int({"num_attention_heads", "n_heads"}, &c->num_attention_heads, true));
  DSI_RETURN_IF_ERROR(f.get_int({"num_key_value_heads"}, &c->num_key_value_heads, false));
  DSI_RETURN_IF_ERROR(f.get_int({"head_dim"}, &c->head_dim, true));
  DSI_RETURN_IF_ERROR(f.get_int({"q_lora_rank"}, &c->q_lora_rank, true));
  DSI_RETURN_IF_ERROR(f.get_int({"o_groups"}, &c->o_groups, true));
  DSI_RETURN_IF_ERROR(f.get_int({"o_lora_rank"}, &c->o_lora_rank, true));
  DSI_RETURN_IF_ERROR(f.get_int({"sliding_window", "window_size"}, &c->sliding_window, true));
  DSI_RETURN_IF_ERROR(
      f.get_int({"max_position_embeddings", "max_seq_len"}, &c->max_position_embeddings, false));
  DSI_RETURN_IF_ERROR(f.get_int({"index_n_heads"}, &c->index_n_heads, true));
  DSI_RETURN_IF_ERROR(f.get_int({"index_head_dim"}, &c->index_head_dim, true));
  DSI_RETURN_IF_ERROR(f.get_int({"index_topk"}, &c->index_topk, true));
  DSI_RETURN_IF_ERROR(f.get_int({"hc_mult"}, &c->hc_mult, false));
  DSI_RETURN_IF_ERROR(f.get_int({"hc_sinkhorn_iters"}, &c->hc_sinkhorn_iters, false));
  DSI_RETURN_IF_ERROR(f.get_double({"hc_eps"}, &c->hc_eps, false));
  DSI_RETURN_IF_ERROR(f.get_double({"rms_norm_eps", "norm_eps"}, &c->rms_norm_eps, false));
  DSI_RETURN_IF_ERROR(f.get_int({"n_routed_experts"}, &c->n_routed_experts, true));
  DSI_RETURN_IF_ERROR(f.get_int({"n_shared_experts"}, &c->n_shared_experts, false));
  DSI_RETURN_IF_ERROR(
      f.get_int({"num_experts_per_tok", "n_activated_experts"}, &c->num_experts_per_tok, true));
  DSI_RETURN_IF_ERROR(
      f.get_int({"moe_intermediate_size", "moe_inter_dim"}, &c->moe_intermediate_size, true));
  DSI_RETURN_IF_ERROR(f.get_bool({"norm_topk_prob"}, &c->norm_topk_prob, false));
  DSI_RETURN_IF_ERROR(
      f.get_double({"routed_scaling_factor", "route_scale"}, &c->routed_scaling_factor, false));
  DSI_RETURN_IF_ERROR(f.get_double({"swiglu_limit"}, &c->swiglu_limit, false));
  DSI_RETURN_IF_ERROR(
      f.get_int({"num_nextn_predict_layers", "n_mtp_layers"}, &c->num_nextn_predict_layers, false));
  DSI_RETURN_IF_ERROR(f.get_int({"bos_token_id"}, &c->bos_token_id, false));
  if (const json* eos = f.find({"eos_token_id"})) {
    if (eos->is_array()) {
      if (eos->empty()) {
        return f.error("eos_token_id", "must not be an empty list");
      }
      DSI_RETURN_IF_ERROR(f.to_int((*eos)[0], "eos_token_id[0]", &c->eos_token_id));
    } else {
      DSI_RETURN_IF_ERROR(f.to_int(*eos, "eos_token_id", &c->eos_token_id));
    }
  }

  std::string scoring = "sqrtsoftplus";
  DSI_RETURN_IF_ERROR(f.get_string({"scoring_func", "score_func"}, &scoring, false));
  if (scoring == "sqrtsoftplus") {
    c->scoring_func = ScoringFunc::kSqrtSoftplus;
  } else if (scoring == "sigmoid") {
    c->scoring_func = ScoringFunc::kSigmoid;
  } else if (scoring == "softmax") {
    c->scoring_func = ScoringFunc::kSoftmax;
  } else {
    return invalid_argument(src + ": field 'scoring_func' has unknown value '" + scoring +
                            "' (expected sqrtsoftplus, sigmoid or softmax)");
  }
  std::string act = "silu";
  DSI_RETURN_IF_ERROR(f.get_string({"hidden_act"}, &act, false));
  if (act != "silu") {
    return unimplemented(src + ": field 'hidden_act' = '" + act + "' is not supported (silu)");
  }
  bool tie = false;
  DSI_RETURN_IF_ERROR(f.get_bool({"tie_word_embeddings"}, &tie, false));
  if (tie) {
    return unimplemented(src +
                         ": field 'tie_word_embeddings' = true is not supported (V4 has a "
                         "separate head)");
  }

  // ---- range checks ----
  struct Range {
    const char* name;
    int64_t v, lo, hi;
  };
  const Range ranges[] = {
      {"vocab_size", c->vocab_size, 1, kMaxVocab},
      {"hidden_size", c->hidden_size, 1, kMaxDim},
      {"num_hidden_layers", c->num_hidden_layers, 1, kMaxLayers},
      {"num_attention_heads", c->num_attention_heads, 1, kMaxDim},
      {"head_dim", c->head_dim, 1, kMaxDim},
      {"q_lora_rank", c->q_lora_rank, 1, kMaxDim},
      {"o_groups", c->o_groups, 1, kMaxDim},
      {"o_lora_rank", c->o_lora_rank, 1, kMaxDim},
      {"sliding_window", c->sliding_window, 1, kMaxPositions},
      {"max_position_embeddings", c->max_position_embeddings, 0, kMaxPositions},
      {"index_n_heads", c->index_n_heads, 1, kMaxDim},
      {"index_head_dim", c->index_head_dim, 1, kMaxDim},
      {"index_topk", c->index_topk, 1, kMaxPositions},
      {"hc_mult", c->hc_mult, 1, kMaxHcMult},
      {"hc_sinkhorn_iters", c->hc_sinkhorn_iters, 1, kMaxSinkhorn},
      {"n_routed_experts", c->n_routed_experts, 1, kMaxExperts},
      {"num_experts_per_tok", c->num_experts_per_tok, 1, kMaxExperts},
      {"moe_intermediate_size", c->moe_intermediate_size, 1, kMaxDim},
      {"num_nextn_predict_layers", c->num_nextn_predict_layers, 0, kMaxMtp},
      {"bos_token_id", c->bos_token_id, -1, kMaxVocab},
      {"eos_token_id", c->eos_token_id, -1, kMaxVocab},
  };
  for (const Range& r : ranges) DSI_RETURN_IF_ERROR(check_range(f, r.name, r.v, r.lo, r.hi));
  if (!(c->hc_eps > 0.0)) {
    return f.error("hc_eps", "must be > 0");
  }
  if (!(c->rms_norm_eps > 0.0)) {
    return f.error("rms_norm_eps", "must be > 0");
  }
  if (!(c->routed_scaling_factor > 0.0)) {
    return f.error("routed_scaling_factor", "must be > 0");
  }
  if (c->swiglu_limit < 0.0) {
    return f.error("swiglu_limit", "must be >= 0");
  }
  if (c->num_key_value_heads != 1) {
    return unimplemented(
        str_format("%s: field 'num_key_value_heads' = %lld is not supported "
                   "(V4 uses a single shared KV head)",
                   src.c_str(),
                   static_cast<long long>(c->num_key_value_heads)));
  }
  if (c->n_shared_experts != 1) {
    return unimplemented(
        str_format("%s: field 'n_shared_experts' = %lld is not supported (exactly 1)",
                   src.c_str(),
                   static_cast<long long>(c->n_shared_experts)));
  }
  if (c->n_routed_experts < c->num_experts_per_tok) {
    return f.error("num_experts_per_tok",
                   str_format("= %lld exceeds n_routed_experts (%lld)",
                              static_cast<long long>(c->num_experts_per_tok),
                              static_cast<long long>(c->n_routed_experts)));
  }
  if (c->num_attention_heads % c->o_groups != 0) {
    return f.error("o_groups",
                   str_format("= %lld does not divide num_attention_heads (%lld)",
                              static_cast<long long>(c->o_groups),
                              static_cast<long long>(c->num_attention_heads)));
  }

  // ---- RoPE dims ----
  double prf = 0.0;
  const bool have_prf = f.has({"partial_rotary_factor"});
  DSI_RETURN_IF_ERROR(f.get_double({"partial_rotary_factor"}, &prf, false));
  if (f.has({"qk_rope_head_dim", "rope_head_dim"})) {
    DSI_RETURN_IF_ERROR(
        f.get_int({"qk_rope_head_dim", "rope_head_dim"}, &c->qk_rope_head_dim, true));
  } else if (have_prf) {
    c->qk_rope_head_dim = static_cast<int64_t>(static_cast<double>(c->head_dim) * prf);
  } else {
    return f.missing({"qk_rope_head_dim", "partial_rotary_factor", "rope_head_dim"});
  }
  DSI_RETURN_IF_ERROR(check_range(f, "qk_rope_head_dim", c->qk_rope_head_dim, 1, kMaxDim));
  if (have_prf &&
      static_cast<int64_t>(static_cast<double>(c->head_dim) * prf) != c->qk_rope_head_dim) {
    return f.error("partial_rotary_factor",
                   str_format("= %g does not match qk_rope_head_dim / head_dim (%lld / %lld)",
                              prf,
                              static_cast<long long>(c->qk_rope_head_dim),
                              static_cast<long long>(c->head_dim)));
  }
  if (c->qk_rope_head_dim % 2 != 0) {
    return f.error("qk_rope_head_dim",
                   str_format("= %lld must be even", static_cast<long long>(c->qk_rope_head_dim)));
  }
  if (c->head_dim <= c->qk_rope_head_dim) {
    return f.error("head_dim",
                   str_format("= %lld must be greater than qk_rope_head_dim (%lld)",
                              static_cast<long long>(c->head_dim),
                              static_cast<long long>(c->qk_rope_head_dim)));
  }
  if (c->index_head_dim < c->qk_rope_head_dim) {
    return f.error("index_head_dim",
                   str_format("= %lld must be at least qk_rope_head_dim (%lld)",
                              static_cast<long long>(c->index_head_dim),
                              static_cast<long long>(c->qk_rope_head_dim)));
  }
  if ((c->index_head_dim & (c->index_head_dim - 1)) != 0) {
    return f.error("index_head_dim",
                   str_format("= %lld must be a power of two (Hadamard rotation)",
                              static_cast<long long>(c->index_head_dim)));
  }

  // ---- RoPE tables ----
  const json* rp = f.find({"rope_parameters"});
  if (rp != nullptr && rp->is_object() && rp->contains("main") && rp->contains("compress")) {
    double main_prf = 0.0, comp_prf = 0.0;
    DSI_RETURN_IF_ERROR(parse_rope_object(
        (*rp)["main"], src, "rope_parameters.main", true, &c->rope_main, &main_prf));
    DSI_RETURN_IF_ERROR(parse_rope_object(
        (*rp)["compress"], src, "rope_parameters.compress", true, &c->rope_compress, &comp_prf));
    for (auto [name, v] :
         {std::pair<const char*, double>{"main", main_prf}, {"compress", comp_prf}}) {
      if (v != 0.0 &&
          static_cast<int64_t>(static_cast<double>(c->head_dim) * v) != c->qk_rope_head_dim) {
        return invalid_argument(
            str_format("%s: field 'rope_parameters.%s.partial_rotary_factor' = %g does not match "
                       "qk_rope_head_dim / head_dim (%lld / %lld)",
                       src.c_str(),
                       name,
                       v,
                       static_cast<long long>(c->qk_rope_head_dim),
                       static_cast<long long>(c->head_dim)));
      }
    }
  } else {
    // DeepSeek dialect (and transformers configs in the legacy flat form).
    DSI_RETURN_IF_ERROR(f.get_double({"rope_theta"}, &c->rope_main.theta, false));
    c->rope_compress.theta = 160000.0;
    DSI_RETURN_IF_ERROR(f.get_double({"compress_rope_theta"}, &c->rope_compress.theta, false));
    std::string scaling_name;
    const json* scaling = f.find({"rope_scaling"}, &scaling_name);
    if (scaling == nullptr && rp != nullptr) {
      scaling = rp;
      scaling_name = "rope_parameters";
    }
    if (scaling != nullptr) {
      DSI_RETURN_IF_ERROR(
          parse_rope_object(*scaling, src, scaling_name, false, &c->rope_compress, nullptr));
    } else if (f.has({"original_seq_len"})) {
      // inference/config.json: rope_factor / original_seq_len / beta_fast / beta_slow.
      int64_t orig = 0;
      DSI_RETURN_IF_ERROR(f.get_int({"original_seq_len"}, &orig, true));
      if (orig > 0) {
        c->rope_compress.yarn = true;
        c->rope_compress.original_max_position = orig;
        DSI_RETURN_IF_ERROR(f.get_double({"rope_factor"}, &c->rope_compress.factor, true));
        DSI_RETURN_IF_ERROR(f.get_double({"beta_fast"}, &c->rope_compress.beta_fast, false));
        DSI_RETURN_IF_ERROR(f.get_double({"beta_slow"}, &c->rope_compress.beta_slow, false));
      }
    }
  }
  const bool nested = rp != nullptr && rp->is_object() && rp->contains("main");
  DSI_RETURN_IF_ERROR(
      validate_rope(src, nested ? "rope_parameters.main" : "rope_theta", c->rope_main));
  DSI_RETURN_IF_ERROR(
      validate_rope(src,
                    nested ? "rope_parameters.compress" : "compress_rope_theta / rope_scaling",
                    c->rope_compress));

  // ---- layer schedule ----
  std::string ratios_name;
  const json* ratios = f.find({"compress_ratios"}, &ratios_name);
  if (const json* lt = f.find({"layer_types"})) {
    DSI_RETURN_IF_ERROR(plan_from_layer_types(f, *lt, c));
  } else if (ratios != nullptr) {
    // inference/config.json may omit the MTP count; its compress_ratios carry one trailing entry
    // per MTP block.
    if (!f.has({"num_nextn_predict_layers", "n_mtp_layers"}) && ratios->is_array() &&
        static_cast<int64_t>(ratios->size()) > c->num_hidden_layers &&
        static_cast<int64_t>(ratios->size()) - c->num_hidden_layers <= kMaxMtp) {
      c->num_nextn_predict_layers = static_cast<int64_t>(ratios->size()) - c->num_hidden_layers;
    }
    DSI_RETURN_IF_ERROR(plan_from_compress_ratios(f, *ratios, "compress_ratios", c));
  } else {
    return f.missing({"compress_ratios", "layer_types"});
  }
  if (const json* mt = f.find({"mlp_layer_types"})) {
    std::vector<std::string> types;
    DSI_RETURN_IF_ERROR(get_string_list(f, *mt, "mlp_layer_types", &types));
    if (static_cast<int64_t>(types.size()) != c->num_hidden_layers) {
      return f.error("mlp_layer_types",
                     str_format("has %zu entries but num_hidden_layers is %lld",
                                types.size(),
                                static_cast<long long>(c->num_hidden_layers)));
    }
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] == "hash_moe") {
        c->layers[i].moe = MoeType::kHash;
      } else if (types[i] == "moe") {
        c->layers[i].moe = MoeType::kScore;
      } else {
        return f.error(str_format("mlp_layer_types[%zu]", i),
                       "has unknown MoE type '" + types[i] + "' (expected hash_moe or moe)");
      }
    }
  } else {
    // transformers defaults to 3 hash layers when neither field is present; the DeepSeek
    // dialect has none unless num_hash_layers says so.
    int64_t n_hash = transformers ? 3 : 0;
    DSI_RETURN_IF_ERROR(f.get_int({"num_hash_layers", "n_hash_layers"}, &n_hash, false));
    DSI_RETURN_IF_ERROR(check_range(f, "num_hash_layers", n_hash, 0, kMaxLayers));
    if (!transformers && n_hash > c->num_hidden_layers) {
      return f.error("num_hash_layers",
                     str_format("= %lld exceeds num_hidden_layers (%lld)",
                                static_cast<long long>(n_hash),
                                static_cast<long long>(c->num_hidden_layers)));
    }
    for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
      c->layers[static_cast<size_t>(i)].moe = i < n_hash ? MoeType::kHash : MoeType::kScore;
    }
  }
  c->mtp_layers.assign(static_cast<size_t>(c->num_nextn_predict_layers),
                       LayerPlan{AttentionType::kSliding, 0, RopeTable::kMain, MoeType::kScore});

  DSI_RETURN_IF_ERROR(parse_quantization(f, c));
  return Status::ok_status();
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return invalid_argument(source + ": not valid JSON");
  }
  if (!j.is_object()) {
    return invalid_argument(source + ": top level must be a JSON object, got " + type_of(j));
  }
  ModelConfig c;
  DSI_RETURN_IF_ERROR(parse_impl(j, source, &c));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  DSI_ASSIGN_OR_RETURN(std::string text, read_text_file(path, uint64_t{64} << 20));
  return parse_model_config(text, path);
}

std::vector<float> rope_inv_freq(const RopeParams& p, int64_t rope_dim) {
  const int64_t half = rope_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half > 0 ? half : 0));
  const auto base = static_cast<float>(p.theta);
  const auto dimf = static_cast<float>(rope_dim);
  // torch: base ** (arange(0, dim, 2, float32) / dim), all in fp32.
  std::vector<float> pos(inv.size());
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / dimf;
    pos[static_cast<size_t>(i)] = std::pow(base, expo);
  }
  if (!p.yarn) {
    for (int64_t i = 0; i < half; ++i) {
      inv[static_cast<size_t>(i)] = 1.0f / pos[static_cast<size_t>(i)];
    }
    return inv;
  }
  // transformers' _compute_yarn_parameters with truncate=True (correction range in double).
  const double dim = static_cast<double>(rope_dim);
  const double orig = static_cast<double>(p.original_max_position);
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2.0 * std::numbers::pi))) /
           (2.0 * std::log(p.theta));
  };
  double low = std::floor(correction_dim(p.beta_fast));
  double high = std::ceil(correction_dim(p.beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) {
    high += 0.001;
  }
  const auto lowf = static_cast<float>(low);
  const auto spanf = static_cast<float>(high - low);
  const auto factor = static_cast<float>(p.factor);
  for (int64_t i = 0; i < half; ++i) {
    const float pf = pos[static_cast<size_t>(i)];
    const float extrapolation = 1.0f / pf;
    const float interpolation = 1.0f / (factor * pf);
    float ramp = (static_cast<float>(i) - lowf) / spanf;
    ramp = std::min(std::max(ramp, 0.0f), 1.0f);
    const float ef = 1.0f - ramp;
    inv[static_cast<size_t>(i)] = interpolation * (1.0f - ef) + extrapolation * ef;
  }
  return inv;
}

}  // namespace dsinfer::model
