// V4.1 checkpoint: opens a model directory, canonicalises the stored names to the official ones,
// validates every tensor's presence, dtype, shape and scale tiles against the config and binds
// it into V41Weights.
#include "model_v41/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/file.h"
#include "base/strings.h"
#include "numeric/float_formats.h"

namespace dsinfer::model_v41 {

const char* v41_layout_name(V41Layout l) {
  switch (l) {
    case V41Layout::kOfficial:
      return "official";
    case V41Layout::kTransformers:
      return "transformers";
  }
  return "?";
}

void EngramTable::row(int64_t r, float* out) const {
  if (fp8) {
    const auto* q = static_cast<const uint8_t*>(data) + r * dim;
    const auto* s = static_cast<const uint8_t*>(scale) + r * (dim / 32);
    for (int64_t c = 0; c < dim; ++c) {
      out[c] = numeric::fp8_e4m3_to_f32(q[c]) * numeric::e8m0_to_f32(s[c / 32]);
    }
    return;
  }
  for (int64_t c = 0; c < dim; ++c)
    out[c] = load_float(data, static_cast<DType>(data_dtype), r * dim + c);
}

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kIndexName = "model.safetensors.index.json";

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

bool is_skipped(const std::string& canon) {
  return str_starts_with(canon, "vision.") || str_starts_with(canon, "aligner.") ||
         canon == "image_start" || canon == "image_end" || canon == "image_newline";
}

// Official name of a stored name (transformers: strip `model.`, `lm_head` -> `head`,
// `.weight_scale_inv` -> `.scale`).
std::string canonical(const std::string& stored) {
  std::string n = str_starts_with(stored, "model.") ? stored.substr(6) : stored;
  if (n == "lm_head.weight") {
    return "head.weight";
  }
  const std::string inv = ".weight_scale_inv";
  if (str_ends_with(n, inv)) {
    n = n.substr(0, n.size() - inv.size()) + ".scale";
  }
  return n;
}

std::string stored_name(const std::string& canon, V41Layout layout) {
  if (layout == V41Layout::kOfficial) {
    return canon;
  }
  if (canon == "head.weight") {
    return "lm_head.weight";
  }
  std::string n = canon;
  if (str_ends_with(n, ".scale") && !str_ends_with(n, "embed.scale")) {
    n = n.substr(0, n.size() - 6) + ".weight_scale_inv";
  }
  return str_starts_with(n, "mtp.") ? n : "model." + n;
}

// The role a canonical tensor plays, for "unexpected tensor" messages.
std::string why_unexpected(const std::string& canon, const V41Config& c) {
  if (canon.find(".compressor.") != std::string::npos) {
    return " (the config's kv_source_layer_ids are " + [&] {
      std::string s = "[";
      for (size_t i = 0; i < c.kv_source_layer_ids.size(); ++i) {
        s += (i ? ", " : "") + std::to_string(c.kv_source_layer_ids[i]);
      }
      return s + "]";
    }() + "; checkpoint and config disagree on the producer/consumer schedule)";
  }
  if (canon.find(".indexer.") != std::string::npos) {
    return " (not an index source / index-key owner in the config's schedule)";
  }
  if (canon.find(".engram.") != std::string::npos) {
    return " (not an Engram layer in the config's engram_layer_ids)";
  }
  if (str_starts_with(canon, "hc_head") || canon.find("hc_attn_norm") != std::string::npos ||
      canon.find("hc_ffn_norm") != std::string::npos) {
    return " (V4.1 uses single-pass mHC with the norm folded into hc_*_fn; a checkpoint with "
           "hc_head or separate hc norm tensors is not V4.1)";
  }
  if (canon.find("tid2eid") != std::string::npos) {
    return " (V4.1 has no hash-routed layers)";
  }
  return "";
}

}  // namespace

class V41Binder {
  struct Entry {
    std::string stored;
    std::string file;
    const TensorInfo* info = nullptr;
    bool consumed = false;
  };
  // Which dtypes a tensor may have (official layout: exactly one).
  enum class Kind { kFp8, kBf16, kF32, kMxfp4 };

 public:
  explicit V41Binder(V41Checkpoint* ck) : ck_(ck), c_(ck->config_) {}

  Status load_files();
  Status index();
  Status bind();

 private:
  std::string path_of(const std::string& f) const { return ck_->dir_ + "/" + f; }
  std::string what(const Entry& e) const { return "tensor " + e.stored + " in " + path_of(e.file); }
  Entry* take(const std::string& canon, const std::string& role = "");
  Status check_shape(const Entry& e, const std::vector<int64_t>& want) const;
  Status vec(const std::string& n,
             const std::vector<int64_t>& shape,
             Kind k,
             std::vector<float>* out);
  Status mat(const std::string& n, int64_t rows, int64_t cols, Kind k, MatrixRef* out);
  Status hc_site(const std::string& p, const std::string& which, HcSite* out);
  Status layer(const std::string& p, int l, bool dspark, LayerWeights* out);
  Status engram(const std::string& p, int l, int idx, EngramWeights* out);
  Status dspark();
  bool official() const { return ck_->layout_ == V41Layout::kOfficial; }

  V41Checkpoint* ck_;
  const V41Config& c_;
  std::map<std::string, const SafetensorsFile*> by_file_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> missing_;
};

Status V41Binder::load_files() {
  const std::string& dir = ck_->dir_;
  auto open_shard = [&](const std::string& name) -> Status {
    auto f = SafetensorsFile::open(dir + "/" + name);
    if (!f.ok()) {
      return f.status();
    }
    by_file_[name] = f.value().get();
    ck_->files_.push_back(std::move(f).value());
    return Status::ok_status();
  };
  std::error_code ec;
  const std::string index_path = dir + "/" + kIndexName;
  if (fs::exists(index_path, ec)) {
    DSI_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path, uint64_t{1} << 30));
    json idx = json::parse(text, nullptr, false);
    if (idx.is_discarded() || !idx.is_object() || !idx.contains("weight_map") ||
        !idx["weight_map"].is_object()) {
      return data_loss(index_path + ": not a JSON object with an object 'weight_map'");
    }
    std::map<std::string, std::set<std::string>> per_file;
    bool prefixed = false, plain = false;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it->is_string()) {
        return data_loss(index_path + ": weight_map entry for '" + it.key() + "' is not a string");
      }
      const std::string file = it->get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "..") {
        return data_loss(index_path + ": weight_map entry for '" + it.key() +
                         "' has an invalid shard name '" + file + "'");
      }
      (str_starts_with(it.key(), "model.") ? prefixed : plain) |=
          !str_starts_with(it.key(), "mtp.") && it.key() != "lm_head.weight";
      per_file[file].insert(it.key());
    }
    if (prefixed && plain) {
      return data_loss(index_path +
                       ": the weight_map mixes `model.`-prefixed and unprefixed tensor names");
    }
    for (const auto& [file, names] : per_file) {
      if (!fs::is_regular_file(dir + "/" + file, ec)) {
        return not_found(index_path + ": shard '" + file + "' (listed for '" + *names.begin() +
                         "') does not exist");
      }
      DSI_RETURN_IF_ERROR(open_shard(file));
      for (const std::string& n : names) {
        if (by_file_[file]->find(n) == nullptr) {
          return not_found(index_path + ": tensor '" + n + "' is mapped to '" + file +
                           "', which does not contain it");
        }
      }
    }
    return Status::ok_status();
  }
  DSI_ASSIGN_OR_RETURN(std::vector<std::string> names, model::list_safetensors_shards(dir));
  for (const std::string& n : names) DSI_RETURN_IF_ERROR(open_shard(n));
  return Status::ok_status();
}

Status V41Binder::index() {
  bool prefixed = false, plain = false;
  for (const auto& [file, sf] : by_file_) {
    for (const TensorInfo& t : sf->tensors()) {
      if (str_starts_with(t.name, "mtp.") || t.name == "lm_head.weight" ||
          is_skipped(canonical(t.name))) {
        continue;
      }
      (str_starts_with(t.name, "model.") ? prefixed : plain) = true;
    }
  }
  if (prefixed && plain) {
    return data_loss(ck_->dir_ + ": tensors mix `model.`-prefixed and unprefixed names");
  }
  ck_->layout_ = prefixed ? V41Layout::kTransformers : V41Layout::kOfficial;
  std::map<std::string, std::string> seen;
  for (const auto& [file, sf] : by_file_) {
    for (const TensorInfo& t : sf->tensors()) {
      auto [it, fresh] = seen.emplace(t.name, file);
      if (!fresh) {
        return data_loss("tensor '" + t.name + "' appears in both " + path_of(it->second) +
                         " and " + path_of(file));
      }
      ck_->inventory_.push_back({t.name, file, t.dtype, t.shape, t.nbytes});
      const std::string canon = canonical(t.name);
      if (is_skipped(canon)) {
        ++ck_->skipped_tensors_;
        ck_->skipped_bytes_ += t.nbytes;
        continue;
      }
      auto [e, ok] = entries_.emplace(canon, Entry{t.name, file, &t, false});
      if (!ok) {
        return data_loss("tensors '" + e->second.stored + "' and '" + t.name + "' both name " +
                         canon);
      }
    }
  }
  std::sort(ck_->inventory_.begin(), ck_->inventory_.end(), [](const auto& a, const auto& b) {
    return a.name < b.name;
  });
  return Status::ok_status();
}

V41Binder::Entry* V41Binder::take(const std::string& canon, const std::string& role) {
  auto it = entries_.find(canon);
  if (it == entries_.end()) {
    missing_.push_back(stored_name(canon, ck_->layout_) + role);
    return nullptr;
  }
  it->second.consumed = true;
  return &it->second;
}

Status V41Binder::check_shape(const Entry& e, const std::vector<int64_t>& want) const {
  if (e.info->shape != want) {
    return invalid_argument(what(e) + " has shape " + shape_str(e.info->shape) + ", expected " +
                            shape_str(want));
  }
  return Status::ok_status();
}

Status V41Binder::vec(const std::string& n,
                      const std::vector<int64_t>& shape,
                      Kind k,
                      std::vector<float>* out) {
  Entry* e = take(n);
  if (e == nullptr) {
    return Status::ok_status();
  }
  const DType want = k == Kind::kF32 ? DType::kF32 : DType::kBF16;
  if (official() ? e->info->dtype != want : !is_float(e->info->dtype)) {
    return invalid_argument(what(*e) + " has dtype " + dtype_name(e->info->dtype) + ", expected " +
                            (official() ? dtype_name(want) : "a float dtype"));
  }
  DSI_RETURN_IF_ERROR(check_shape(*e, shape));
  const int64_t cnt = e->info->numel();
  out->resize(static_cast<size_t>(cnt));
  for (int64_t i = 0; i < cnt; ++i)
    (*out)[static_cast<size_t>(i)] = load_float(e->info->data, e->info->dtype, i);
  return Status::ok_status();
}

Status V41Binder::mat(const std::string& n, int64_t rows, int64_t cols, Kind k, MatrixRef* out) {
  Entry* e = take(n);
  if (e == nullptr) {
    return Status::ok_status();
  }
  const TensorInfo& t = *e->info;
  const std::string base = str_ends_with(n, ".weight") ? n.substr(0, n.size() - 7) : n;
  const std::string scale_name = base + ".scale";
  out->rows = rows;
  out->cols = cols;
  out->data = t.data;
  out->dtype = t.dtype;
  out->scale = nullptr;
  const bool fp8 = t.dtype == DType::kF8E4M3;
  const bool fp4 = t.dtype == DType::kI8;
  if (official()) {
    const char* want = k == Kind::kFp8     ? "F8_E4M3 (+ F8_E8M0 .scale per 32x32 tile)"
                       : k == Kind::kMxfp4 ? "I8 packed MXFP4 (+ F8_E8M0 .scale per 32)"
                       : k == Kind::kBf16  ? "BF16"
                                           : "F32";
    const bool ok = (k == Kind::kFp8 && fp8) || (k == Kind::kMxfp4 && fp4) ||
                    (k == Kind::kBf16 && t.dtype == DType::kBF16) ||
                    (k == Kind::kF32 && t.dtype == DType::kF32);
    if (!ok) {
      return invalid_argument(what(*e) + " has dtype " + dtype_name(t.dtype) + ", expected " +
                              want);
    }
  } else if (!is_float(t.dtype) && !fp8 && !(fp4 && k == Kind::kMxfp4)) {
    return invalid_argument(what(*e) + " has dtype " + dtype_name(t.dtype) +
                            ", expected a float dtype or F8_E4M3 (+ weight_scale_inv)");
  }
  if (is_float(t.dtype)) {
    DSI_RETURN_IF_ERROR(check_shape(*e, {rows, cols}));
    out->format = WeightFormat::kFloat;
    return Status::ok_status();
  }
  auto s = entries_.find(scale_name);
  if (s == entries_.end()) {
    return not_found(std::string(fp8 ? "FP8 " : "MXFP4 ") + what(*e) + " has no scale tensor " +
                     stored_name(scale_name, ck_->layout_));
  }
  s->second.consumed = true;
  const TensorInfo& st = *s->second.info;
  const std::string swhat = "scale tensor " + s->second.stored + " in " + path_of(s->second.file);
  if (fp8) {
    DSI_RETURN_IF_ERROR(check_shape(*e, {rows, cols}));
    const bool scale_ok = st.dtype == DType::kF8E8M0 || (!official() && st.dtype == DType::kF32);
    if (!scale_ok) {
      return invalid_argument(swhat + " has dtype " + dtype_name(st.dtype) + ", expected F8_E8M0");
    }
    const std::vector<int64_t> tiles = {ceil_div(rows, 32), ceil_div(cols, 32)};
    if (st.shape != tiles) {
      return invalid_argument("wrong scale tile: " + swhat + " has shape " + shape_str(st.shape) +
                              ", expected " + shape_str(tiles) + " (one scale per 32x32 tile of " +
                              shape_str({rows, cols}) + "; V4's 128x128 grid is not V4.1)");
    }
    out->format = WeightFormat::kFp8Block32;
    out->scale = st.data;
    out->scale_dtype = st.dtype;
    return Status::ok_status();
  }
  if (cols % 32 != 0) {
    return invalid_argument("MXFP4 " + what(*e) + ": input width " + std::to_string(cols) +
                            " is not a multiple of 32");
  }
  DSI_RETURN_IF_ERROR(check_shape(*e, {rows, cols / 2}));
  if (st.dtype != DType::kF8E8M0) {
    return invalid_argument(swhat + " has dtype " + dtype_name(st.dtype) + ", expected F8_E8M0");
  }
  if (st.shape != std::vector<int64_t>{rows, cols / 32}) {
    return invalid_argument("wrong scale tile: " + swhat + " has shape " + shape_str(st.shape) +
                            ", expected " + shape_str({rows, cols / 32}) +
                            " (one E8M0 scale per 32 inputs)");
  }
  out->format = WeightFormat::kMxfp4;
  out->scale = st.data;
  out->scale_dtype = DType::kF8E8M0;
  return Status::ok_status();
}

Status V41Binder::hc_site(const std::string& p, const std::string& which, HcSite* out) {
  const int64_t hc = c_.hc_mult;
  DSI_RETURN_IF_ERROR(
      vec(p + "hc_" + which + "_fn", {c_.hc_mix_dim(), hc * c_.hidden_size}, Kind::kF32, &out->fn));
  DSI_RETURN_IF_ERROR(vec(p + "hc_" + which + "_base", {c_.hc_mix_dim()}, Kind::kF32, &out->base));
  DSI_RETURN_IF_ERROR(vec(p + "hc_" + which + "_scale", {3}, Kind::kF32, &out->scale));
  return Status::ok_status();
}

Status V41Binder::engram(const std::string& p, int l, int idx, EngramWeights* out) {
  const int64_t rows = c_.engram_rows[static_cast<size_t>(idx)];
  const int64_t dim = c_.engram_head_dim;
  const std::string tname = p + "engram.embed.weight";
  auto it = entries_.find(tname);
  if (it == entries_.end()) {
    return not_found("missing Engram table " + stored_name(tname, ck_->layout_) +
                     " for Engram layer " + std::to_string(l) + " (" + std::to_string(rows) +
                     " rows x " + std::to_string(dim) + ", engram_layer_ids lists it)");
  }
  Entry& e = it->second;
  e.consumed = true;
  const TensorInfo& t = *e.info;
  if (t.shape != std::vector<int64_t>{rows, dim}) {
    return invalid_argument("Engram table " + what(e) + " has shape " + shape_str(t.shape) +
                            ", expected " + shape_str({rows, dim}) +
                            " (rows = the sum of the layer's bucket primes)");
  }
  EngramTable& tab = out->table;
  tab.data = t.data;
  tab.rows = rows;
  tab.dim = dim;
  tab.data_dtype = static_cast<int>(t.dtype);
  if (t.dtype == DType::kF8E4M3) {
    const std::string sname = p + "engram.embed.scale";
    auto s = entries_.find(sname);
    if (s == entries_.end()) {
      return not_found("Engram table " + what(e) + " has no scale tensor " +
                       stored_name(sname, ck_->layout_));
    }
    s->second.consumed = true;
    const TensorInfo& st = *s->second.info;
    const std::string swhat = "scale tensor " + s->second.stored + " in " + path_of(s->second.file);
    if (st.dtype != DType::kF8E8M0) {
      return invalid_argument(swhat + " has dtype " + dtype_name(st.dtype) + ", expected F8_E8M0");
    }
    if (st.shape != std::vector<int64_t>{rows, dim / 32}) {
      return invalid_argument("wrong scale tile: " + swhat + " has shape " + shape_str(st.shape) +
                              ", expected " + shape_str({rows, dim / 32}) +
                              " (one E8M0 per 32 values of each row)");
    }
    if (s->second.file != e.file) {
      return invalid_argument("Engram table " + what(e) + " and its scale " + s->second.stored +
                              " must sit in the same shard (found in " + s->second.file + ")");
    }
    tab.fp8 = true;
    tab.scale = st.data;
  } else if (official() || !is_float(t.dtype)) {
    return invalid_argument("Engram table " + what(e) + " has dtype " + dtype_name(t.dtype) +
                            ", expected F8_E4M3 (+ F8_E8M0 .scale per 32)");
  } else {
    // The port saves its (unused) per-row scale parameter next to a float table.
    auto s = entries_.find(p + "engram.embed.scale");
    if (s != entries_.end()) {
      s->second.consumed = true;
    }
  }
  const int64_t h = c_.hidden_size, hc = c_.hc_mult;
  DSI_RETURN_IF_ERROR(mat(
      p + "engram.wkv.weight", h * (hc + 1), c_.engram_hash_cols() * dim, Kind::kFp8, &out->wkv));
  DSI_RETURN_IF_ERROR(vec(p + "engram.q_weight", {hc, h}, Kind::kBf16, &out->q_weight));
  DSI_RETURN_IF_ERROR(vec(p + "engram.k_weight", {hc, h}, Kind::kBf16, &out->k_weight));
  return Status::ok_status();
}

Status V41Binder::layer(const std::string& p, int l, bool dspark, LayerWeights* out) {
  const int64_t h = c_.hidden_size, hd = c_.head_dim;
  DSI_RETURN_IF_ERROR(vec(p + "attn_norm.weight", {h}, Kind::kBf16, &out->attn_norm));
  DSI_RETURN_IF_ERROR(vec(p + "ffn_norm.weight", {h}, Kind::kBf16, &out->ffn_norm));
  DSI_RETURN_IF_ERROR(hc_site(p, "attn", &out->hc_attn));
  DSI_RETURN_IF_ERROR(hc_site(p, "ffn", &out->hc_ffn));
  AttentionWeights& a = out->attn;
  const std::string ap = p + "attn.";
  DSI_RETURN_IF_ERROR(mat(ap + "wq_a.weight", c_.q_lora_rank, h, Kind::kFp8, &a.wq_a));
  DSI_RETURN_IF_ERROR(vec(ap + "q_norm.weight", {c_.q_lora_rank}, Kind::kBf16, &a.q_norm));
  DSI_RETURN_IF_ERROR(
      mat(ap + "wq_b.weight", c_.num_attention_heads * hd, c_.q_lora_rank, Kind::kFp8, &a.wq_b));
  DSI_RETURN_IF_ERROR(mat(ap + "wkv.weight", hd, h, Kind::kFp8, &a.wkv));
  DSI_RETURN_IF_ERROR(vec(ap + "kv_norm.weight", {hd}, Kind::kBf16, &a.kv_norm));
  DSI_RETURN_IF_ERROR(mat(ap + "wo_a.weight",
                          c_.o_groups * c_.o_lora_rank,
                          c_.num_attention_heads * hd / c_.o_groups,
                          Kind::kFp8,
                          &a.wo_a));
  DSI_RETURN_IF_ERROR(
      mat(ap + "wo_b.weight", h, c_.o_groups * c_.o_lora_rank, Kind::kFp8, &a.wo_b));
  DSI_RETURN_IF_ERROR(vec(ap + "attn_sink", {c_.num_attention_heads}, Kind::kF32, &a.attn_sink));
  if (!dspark) {
    const V41LayerPlan& plan = c_.layers[static_cast<size_t>(l)];
    if (c_.is_kv_owner(l)) {
      DSI_RETURN_IF_ERROR(mat(ap + "compressor.wkv.weight", hd, h, Kind::kBf16, &a.compressor.wkv));
      if (plan.compress_ratio > 1) {
        DSI_RETURN_IF_ERROR(
            mat(ap + "compressor.wgate.weight", hd, h, Kind::kBf16, &a.compressor.wgate));
      }
      DSI_RETURN_IF_ERROR(
          vec(ap + "compressor.norm.weight", {hd}, Kind::kBf16, &a.compressor.norm));
    }
    if (plan.compress_ratio > 0 && plan.topk_source == l) {
      const int64_t ih = c_.index_n_heads, id = c_.index_head_dim;
      DSI_RETURN_IF_ERROR(
          mat(ap + "indexer.wq_b.weight", ih * id, c_.q_lora_rank, Kind::kFp8, &a.indexer.wq_b));
      DSI_RETURN_IF_ERROR(
          mat(ap + "indexer.weights_proj.weight", ih, h, Kind::kBf16, &a.indexer.weights_proj));
      if (std::find(c_.index_k_source_layer_ids.begin(), c_.index_k_source_layer_ids.end(), l) !=
          c_.index_k_source_layer_ids.end()) {
        DSI_RETURN_IF_ERROR(mat(ap + "indexer.wk.weight", id, hd, Kind::kBf16, &a.indexer.wk));
        DSI_RETURN_IF_ERROR(
            vec(ap + "indexer.k_norm.weight", {id}, Kind::kBf16, &a.indexer.k_norm));
      }
    }
    if (plan.engram) {
      out->has_engram = true;
      DSI_RETURN_IF_ERROR(engram(p, l, plan.engram_index, &out->engram));
    }
  }
  MoeWeights& m = out->ffn;
  const int64_t ne = dspark ? c_.dspark_n_routed_experts : c_.n_routed_experts;
  const int64_t inter = c_.moe_intermediate_size;
  const std::string fp = p + "ffn.";
  DSI_RETURN_IF_ERROR(mat(fp + "gate.weight", ne, h, Kind::kBf16, &m.gate));
  DSI_RETURN_IF_ERROR(vec(fp + "gate.bias", {ne}, Kind::kF32, &m.bias));
  DSI_RETURN_IF_ERROR(vec(fp + "gate.bias_vl", {ne}, Kind::kF32, &m.bias_vl));
  m.experts.resize(static_cast<size_t>(ne));
  for (int64_t e = 0; e < ne; ++e) {
    const std::string ep = fp + "experts." + std::to_string(e) + ".";
    ExpertWeights& x = m.experts[static_cast<size_t>(e)];
    DSI_RETURN_IF_ERROR(mat(ep + "w1.weight", inter, h, Kind::kMxfp4, &x.w1));
    DSI_RETURN_IF_ERROR(mat(ep + "w3.weight", inter, h, Kind::kMxfp4, &x.w3));
    DSI_RETURN_IF_ERROR(mat(ep + "w2.weight", h, inter, Kind::kMxfp4, &x.w2));
  }
  const std::string sp = fp + "shared_experts.";
  DSI_RETURN_IF_ERROR(mat(sp + "w1.weight", inter, h, Kind::kFp8, &m.shared.w1));
  DSI_RETURN_IF_ERROR(mat(sp + "w3.weight", inter, h, Kind::kFp8, &m.shared.w3));
  DSI_RETURN_IF_ERROR(mat(sp + "w2.weight", h, inter, Kind::kFp8, &m.shared.w2));
  return Status::ok_status();
}

Status V41Binder::dspark() {
  const int64_t nb = c_.num_nextn_predict_layers;
  const int64_t h = c_.hidden_size;
  DsparkWeights& d = ck_->weights_.dspark;
  d.blocks.resize(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    DSI_RETURN_IF_ERROR(
        layer("mtp." + std::to_string(b) + ".", -1, true, &d.blocks[static_cast<size_t>(b)].layer));
  }
  // The features of every target layer, concatenated (3 x hidden at the real config).
  const int64_t feats = static_cast<int64_t>(c_.dspark_target_layer_ids.size()) * h;
  DSI_RETURN_IF_ERROR(mat("mtp.0.main_proj.weight", h, feats, Kind::kFp8, &d.main_proj));
  DSI_RETURN_IF_ERROR(vec("mtp.0.main_norm.weight", {h}, Kind::kBf16, &d.main_norm));
  const std::string last = "mtp." + std::to_string(nb - 1) + ".";
  DSI_RETURN_IF_ERROR(vec(last + "norm.weight", {h}, Kind::kBf16, &d.norm));
  DSI_RETURN_IF_ERROR(mat(last + "markov_head.embed.weight",
                          c_.vocab_size,
                          c_.dspark_markov_rank,
                          Kind::kBf16,
                          &d.markov_embed));
  DSI_RETURN_IF_ERROR(mat(last + "markov_head.head.weight",
                          c_.vocab_size,
                          c_.dspark_markov_rank,
                          Kind::kBf16,
                          &d.markov_head));
  DSI_RETURN_IF_ERROR(vec(last + "confidence_head.proj.weight",
                          {1, h + c_.dspark_markov_rank},
                          Kind::kBf16,
                          &d.confidence));
  return Status::ok_status();
}

Status V41Binder::bind() {
  V41Weights& w = ck_->weights_;
  const int64_t h = c_.hidden_size;
  DSI_RETURN_IF_ERROR(mat("embed.weight", c_.vocab_size, h, Kind::kBf16, &w.embed));
  DSI_RETURN_IF_ERROR(mat("head.weight", c_.vocab_size, h, Kind::kBf16, &w.head));
  DSI_RETURN_IF_ERROR(vec("norm.weight", {h}, Kind::kBf16, &w.norm));
  w.layers.resize(static_cast<size_t>(c_.num_hidden_layers));
  for (int l = 0; l < c_.num_hidden_layers; ++l) {
    DSI_RETURN_IF_ERROR(
        layer("layers." + std::to_string(l) + ".", l, false, &w.layers[static_cast<size_t>(l)]));
  }
  // DSpark: all or nothing.
  bool any_mtp = false;
  for (const auto& [canon, e] : entries_) any_mtp |= str_starts_with(canon, "mtp.");
  if (any_mtp && c_.num_nextn_predict_layers > 0) {
    w.has_dspark = true;
    DSI_RETURN_IF_ERROR(dspark());
  }
  if (!missing_.empty()) {
    std::string list;
    for (size_t i = 0; i < missing_.size() && i < 8; ++i) list += (i ? ", " : "") + missing_[i];
    if (missing_.size() > 8) {
      list += ", ... (" + std::to_string(missing_.size()) + " in all)";
    }
    return not_found(ck_->dir_ + ": missing tensor(s) " + list);
  }
  for (const auto& [canon, e] : entries_) {
    if (!e.consumed) {
      if (str_starts_with(canon, "mtp.") && !w.has_dspark) {
        return invalid_argument("unexpected tensor " + e.stored + " in " + path_of(e.file) +
                                ": the config has num_nextn_predict_layers = 0");
      }
      return invalid_argument("unexpected tensor " + e.stored + " in " + path_of(e.file) +
                              why_unexpected(canon, c_));
    }
  }
  return Status::ok_status();
}

Result<std::unique_ptr<V41Checkpoint>> V41Checkpoint::open(const std::string& dir) {
  std::unique_ptr<V41Checkpoint> ck(new V41Checkpoint());
  ck->dir_ = dir;
  DSI_ASSIGN_OR_RETURN(ck->config_, load_v41_config(dir + "/config.json"));
  V41Binder b(ck.get());
  DSI_RETURN_IF_ERROR(b.load_files());
  DSI_RETURN_IF_ERROR(b.index());
  DSI_RETURN_IF_ERROR(b.bind());
  return ck;
}

}  // namespace dsinfer::model_v41
