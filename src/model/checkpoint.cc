// Checkpoint: opens a model directory, validates every tensor against the config and binds it
// into ModelWeights. Both the official DeepSeek layout and transformers' save_pretrained layout
// are canonicalised to the DeepSeek names first (spec §5).
#include "model/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "base/file.h"
#include "base/strings.h"

namespace dsinfer::model {

const char* checkpoint_layout_name(CheckpointLayout l) {
  switch (l) {
    case CheckpointLayout::kDeepSeek:
      return "deepseek";
    case CheckpointLayout::kTransformers:
      return "transformers";
  }
  return "?";
}

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kIndexName = "model.safetensors.index.json";

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) {
      s += ", ";
    }
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

bool is_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

// Splits "mtp.N.rest" into ("mtp.N.", "rest"); false for other names.
bool split_mtp(const std::string& name, std::string* prefix, std::string* rest) {
  if (!str_starts_with(name, "mtp.")) {
    return false;
  }
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos || !is_digits(name.substr(4, dot - 4))) {
    return false;
  }
  *prefix = name.substr(0, dot + 1);
  *rest = name.substr(dot + 1);
  return true;
}

// Aliases inside one block ("layers.L." or "mtp.N." already stripped).
std::string canonical_block_name(const std::string& rest) {
  if (rest == "attn.norm.weight") {
    return "attn.kv_norm.weight";  // transformers' KV norm
  }
  return rest;
}

// Top-level / MTP-head aliases.
std::string canonical_head_name(const std::string& rest) {
  if (rest == "embed_tokens.weight") {
    return "embed.weight";
  }
  if (rest == "lm_head.weight") {
    return "head.weight";
  }
  if (rest == "hc_head.hc_fn") {
    return "hc_head_fn";
  }
  if (rest == "hc_head.hc_base") {
    return "hc_head_base";
  }
  if (rest == "hc_head.hc_scale") {
    return "hc_head_scale";
  }
  return rest;
}

// Canonical (DeepSeek) name of a stored tensor name. `ignored` is set for the duplicate MTP
// embedding/head tensors that DeepSeek's converter drops.
std::string canonical_name(const std::string& stored, bool* ignored) {
  *ignored = false;
  std::string n = str_starts_with(stored, "model.") ? stored.substr(6) : stored;
  std::string prefix, rest;
  if (split_mtp(n, &prefix, &rest)) {
    if (n.find("emb") != std::string::npos || str_ends_with(n, "head.weight")) {
      *ignored = true;
      return n;
    }
    return prefix + canonical_block_name(canonical_head_name(rest));
  }
  if (str_starts_with(n, "layers.")) {
    const size_t dot = n.find('.', 7);
    if (dot != std::string::npos && is_digits(n.substr(7, dot - 7))) {
      return n.substr(0, dot + 1) + canonical_block_name(n.substr(dot + 1));
    }
    return n;
  }
  return canonical_head_name(n);
}

// The name a canonical tensor would have in `layout` (for "missing tensor" messages).
std::string stored_name(const std::string& canonical, CheckpointLayout layout) {
  if (layout == CheckpointLayout::kDeepSeek) {
    return canonical;
  }
  if (canonical == "head.weight") {
    return "head.weight";
  }
  if (canonical == "embed.weight") {
    return "model.embed_tokens.weight";
  }
  if (canonical == "hc_head_fn") {
    return "model.hc_head.hc_fn";
  }
  if (canonical == "hc_head_base") {
    return "model.hc_head.hc_base";
  }
  if (canonical == "hc_head_scale") {
    return "model.hc_head.hc_scale";
  }
  const std::string suffix = ".attn.kv_norm.weight";
  if (str_ends_with(canonical, suffix)) {
    return "model." + canonical.substr(0, canonical.size() - suffix.size()) + ".attn.norm.weight";
  }
  return "model." + canonical;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool is_float_matrix_dtype(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

enum MatrixAllow : unsigned {
  kFloatOnly = 0,
  kAllowFp8 = 1,
  kAllowMxfp4 = 2,
};

}  // namespace

class CheckpointBinder {
  // One tensor of the checkpoint, keyed by its canonical name.
  struct CkEntry {
    std::string stored;  // name in the file
    std::string file;    // shard file name
    const TensorInfo* info = nullptr;
    bool consumed = false;
  };

 public:
  explicit CheckpointBinder(Checkpoint* ck) : ck_(ck), cfg_(ck->config_) {}

  Status load_files();
  Status index_tensors();
  Status bind();

 private:
  Status open_shard(const std::string& file_name);
  // Finds a canonical tensor; null when absent (after recording it as missing).
  CkEntry* take(const std::string& canonical);
  Status check_shape(const CkEntry& e, const std::vector<int64_t>& expected);
  Status vec(const std::string& name, const std::vector<int64_t>& shape, std::vector<float>* out);
  Status mat(const std::string& name, int64_t rows, int64_t cols, unsigned allow, MatrixRef* out);
  Status compressor(
      const std::string& prefix, int64_t ratio, int64_t d, bool overlap, CompressorWeights* out);
  Status hyper_conn(const std::string& prefix, const std::string& which, HyperConnWeights* out);
  Status hyper_head(const std::string& prefix, HyperHeadWeights* out);
  Status layer(const std::string& prefix, const LayerPlan& plan, LayerWeights* out);
  Status tid2eid(const std::string& name, std::vector<int32_t>* out);
  std::string where() const { return ck_->dir_; }
  // Full path of a shard, for messages.
  std::string path_of(const std::string& file) const { return ck_->dir_ + "/" + file; }

  Checkpoint* ck_;
  const ModelConfig& cfg_;
  std::map<std::string, const SafetensorsFile*> by_file_;  // shard name -> file
  std::map<std::string, CkEntry> entries_;                 // canonical name -> entry
  std::vector<std::string> ignored_;                       // stored names of ignored tensors
  std::vector<std::string> missing_;                       // stored-style names
};

Status CheckpointBinder::open_shard(const std::string& file_name) {
  auto f = SafetensorsFile::open(ck_->dir_ + "/" + file_name);
  if (!f.ok()) {
    return f.status();
  }
  by_file_[file_name] = f.value().get();
  ck_->files_.push_back(std::move(f).value());
  return Status::ok_status();
}

Status CheckpointBinder::load_files() {
  const std::string& dir = ck_->dir_;
  const std::string index_path = dir + "/" + kIndexName;
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    DSI_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path, uint64_t{1} << 30));
    json idx = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (idx.is_discarded()) {
      return data_loss(index_path + ": not valid JSON");
    }
    if (!idx.is_object()) {
      return data_loss(index_path + ": top level must be a JSON object");
    }
    auto wm = idx.find("weight_map");
    if (wm == idx.end()) {
      return data_loss(index_path + ": missing field 'weight_map'");
    }
    if (!wm->is_object()) {
      return data_loss(index_path + ": field 'weight_map' must be an object");
    }
    std::map<std::string, std::set<std::string>> per_file;  // shard -> tensor names
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) {
        return data_loss(index_path + ": weight_map entry for '" + it.key() +
                         "' must be a file name string");
      }
      const std::string file = it->get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
        return data_loss(index_path + ": weight_map entry for '" + it.key() +
                         "' has an invalid shard name '" + file + "'");
      }
      per_file[file].insert(it.key());
    }
    if (per_file.empty()) {
      return data_loss(index_path + ": weight_map is empty");
    }
    for (const auto& [file, names] : per_file) {
      if (!fs::is_regular_file(dir + "/" + file, ec)) {
        return not_found(index_path + ": shard '" + file + "' (listed for tensor '" +
                         *names.begin() + "') does not exist in " + dir);
      }
      DSI_RETURN_IF_ERROR(open_shard(file));
      const SafetensorsFile* sf = by_file_[file];
      for (const std::string& n : names) {
        if (sf->find(n) == nullptr) {
          return not_found(index_path + ": tensor '" + n + "' is mapped to shard '" + file +
                           "', but " + file + " does not contain it");
        }
      }
      for (const TensorInfo& t : sf->tensors()) {
        if (names.count(t.name) == 0) {
          auto m = wm->find(t.name);
          if (m == wm->end()) {
            return data_loss(index_path + ": tensor '" + t.name + "' in shard '" + file +
                             "' is not listed in the weight_map");
          }
          return data_loss(index_path + ": tensor '" + t.name + "' in shard '" + file +
                           "' is mapped to a different shard");
        }
      }
    }
    return Status::ok_status();
  }
  DSI_ASSIGN_OR_RETURN(std::vector<std::string> names, list_safetensors_shards(dir));
  for (const std::string& n : names) DSI_RETURN_IF_ERROR(open_shard(n));
  return Status::ok_status();
}

Result<std::vector<std::string>> list_safetensors_shards(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  fs::directory_iterator it(dir, ec), end;
  if (ec) {
    return not_found(dir + ": cannot list directory: " + ec.message());
  }
  for (; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    std::error_code fec;
    if (str_ends_with(n, ".safetensors") && it->is_regular_file(fec)) {
      names.push_back(n);
    }
  }
  if (ec) {
    return io_error(dir + ": cannot list directory: " + ec.message());
  }
  if (names.empty()) {
    return not_found(dir + ": no *.safetensors files (and no " + kIndexName + ")");
  }
  std::sort(names.begin(), names.end());
  return names;
}

Status CheckpointBinder::index_tensors() {
  // Layout: transformers' save_pretrained prefixes the decoder with "model.".
  bool transformers = false;
  for (const auto& [file, sf] : by_file_) {
    for (const TensorInfo& t : sf->tensors()) transformers |= str_starts_with(t.name, "model.");
  }
  ck_->layout_ = transformers ? CheckpointLayout::kTransformers : CheckpointLayout::kDeepSeek;

  std::map<std::string, std::string> stored_seen;  // stored name -> file
  for (const auto& [file, sf] : by_file_) {
    for (const TensorInfo& t : sf->tensors()) {
      auto [it, inserted] = stored_seen.emplace(t.name, file);
      if (!inserted) {
        return data_loss("tensor '" + t.name + "' appears in both " + path_of(it->second) +
                         " and " + path_of(file));
      }
      ck_->inventory_.push_back({t.name, file, t.dtype, t.shape, t.nbytes});
      bool ignored = false;
      const std::string canon = canonical_name(t.name, &ignored);
      if (ignored) {
        ignored_.push_back(t.name);
        continue;
      }
      auto [e, fresh] = entries_.emplace(canon, CkEntry{t.name, file, &t, false});
      if (!fresh) {
        return data_loss("tensors '" + e->second.stored + "' (" + path_of(e->second.file) +
                         ") and '" + t.name + "' (" + path_of(file) + ") both name " + canon);
      }
    }
  }
  std::sort(ck_->inventory_.begin(),
            ck_->inventory_.end(),
            [](const InventoryEntry& a, const InventoryEntry& b) { return a.name < b.name; });
  return Status::ok_status();
}

CheckpointBinder::CkEntry* CheckpointBinder::take(const std::string& canonical) {
  auto it = entries_.find(canonical);
  if (it == entries_.end()) {
    missing_.push_back(stored_name(canonical, ck_->layout_));
    return nullptr;
  }
  it->second.consumed = true;
  return &it->second;
}

Status CheckpointBinder::check_shape(const CkEntry& e, const std::vector<int64_t>& expected) {
  if (e.info->shape != expected) {
    return invalid_argument("tensor " + e.stored + " in " + path_of(e.file) + " has shape " +
                            shape_str(e.info->shape) + ", expected " + shape_str(expected));
  }
  return Status::ok_status();
}

Status CheckpointBinder::vec(const std::string& name,
                             const std::vector<int64_t>& shape,
                             std::vector<float>* out) {
  CkEntry* e = take(name);
  if (e == nullptr) {
    return Status::ok_status();
  }
  if (!dtype_is_float(e->info->dtype)) {
    return invalid_argument("tensor " + e->stored + " in " + path_of(e->file) + " has dtype " +
                            dtype_name(e->info->dtype) +
                            ", expected a float dtype (F32/BF16/F16/F64)");
  }
  DSI_RETURN_IF_ERROR(check_shape(*e, shape));
  const int64_t n = e->info->numel();
  out->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    (*out)[static_cast<size_t>(i)] = load_float(e->info->data, e->info->dtype, i);
  }
  return Status::ok_status();
}

Status CheckpointBinder::mat(
    const std::string& name, int64_t rows, int64_t cols, unsigned allow, MatrixRef* out) {
  CkEntry* e = take(name);
  if (e == nullptr) {
    return Status::ok_status();
  }
  const TensorInfo& t = *e->info;
  const std::string base = str_ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : name;
  const std::string scale_name = base + ".scale";
  const std::string what = "tensor " + e->stored + " in " + path_of(e->file);
  out->rows = rows;
  out->cols = cols;
  out->data = t.data;
  out->dtype = t.dtype;
  if (is_float_matrix_dtype(t.dtype)) {
    DSI_RETURN_IF_ERROR(check_shape(*e, {rows, cols}));
    out->format = WeightFormat::kFloat;
    out->scale = nullptr;
    return Status::ok_status();
  }
  auto allowed_list = [&]() {
    std::string s = "F32/BF16/F16";
    if (allow & kAllowFp8) {
      s += " or F8_E4M3 (+ .scale)";
    }
    if (allow & kAllowMxfp4) {
      s += " or I8 MXFP4 (+ .scale)";
    }
    return s;
  };
  if (t.dtype == DType::kF8E4M3 && (allow & kAllowFp8)) {
    DSI_RETURN_IF_ERROR(check_shape(*e, {rows, cols}));
    auto s = entries_.find(scale_name);
    if (s == entries_.end()) {
      return not_found("FP8 " + what + " has no scale tensor " +
                       stored_name(scale_name, ck_->layout_));
    }
    s->second.consumed = true;
    const TensorInfo& st = *s->second.info;
    if (st.dtype != DType::kF8E8M0 && st.dtype != DType::kF32) {
      return invalid_argument("scale tensor " + s->second.stored + " in " +
                              path_of(s->second.file) + " has dtype " + dtype_name(st.dtype) +
                              ", expected F8_E8M0 or F32");
    }
    DSI_RETURN_IF_ERROR(check_shape(s->second, {ceil_div(rows, 128), ceil_div(cols, 128)}));
    out->format = WeightFormat::kFp8Block128;
    out->scale = st.data;
    out->scale_dtype = st.dtype;
    return Status::ok_status();
  }
  if (t.dtype == DType::kI8 && (allow & kAllowMxfp4)) {
    if (cols % 32 != 0) {
      return invalid_argument(str_format("MXFP4 %s: %lld input columns are not a multiple of 32",
                                         what.c_str(),
                                         static_cast<long long>(cols)));
    }
    DSI_RETURN_IF_ERROR(check_shape(*e, {rows, cols / 2}));
    auto s = entries_.find(scale_name);
    if (s == entries_.end()) {
      return not_found("MXFP4 " + what + " has no scale tensor " +
                       stored_name(scale_name, ck_->layout_));
    }
    s->second.consumed = true;
    const TensorInfo& st = *s->second.info;
    if (st.dtype != DType::kF8E8M0) {
      return invalid_argument("scale tensor " + s->second.stored + " in " +
                              path_of(s->second.file) + " has dtype " + dtype_name(st.dtype) +
                              ", expected F8_E8M0");
    }
    DSI_RETURN_IF_ERROR(check_shape(s->second, {rows, cols / 32}));
    out->format = WeightFormat::kMxfp4;
    out->scale = st.data;
    out->scale_dtype = DType::kF8E8M0;
    return Status::ok_status();
  }
  return invalid_argument(what + " has dtype " + dtype_name(t.dtype) + ", expected " +
                          allowed_list());
}

Status CheckpointBinder::tid2eid(const std::string& name, std::vector<int32_t>* out) {
  CkEntry* e = take(name);
  if (e == nullptr) {
    return Status::ok_status();
  }
  const TensorInfo& t = *e->info;
  if (!dtype_is_integer(t.dtype)) {
    return invalid_argument("tensor " + e->stored + " in " + path_of(e->file) + " has dtype " +
                            dtype_name(t.dtype) + ", expected an integer dtype");
  }
  DSI_RETURN_IF_ERROR(check_shape(*e, {cfg_.vocab_size, cfg_.num_experts_per_tok}));
  const int64_t n = t.numel();
  out->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = load_int(t.data, t.dtype, i);
    if (v < 0 || v >= cfg_.n_routed_experts) {
      return invalid_argument(
          str_format("tensor %s in %s: value %lld at [%lld, %lld] is not an expert id in [0, %lld)",
                     e->stored.c_str(),
                     path_of(e->file).c_str(),
                     static_cast<long long>(v),
                     static_cast<long long>(i / cfg_.num_experts_per_tok),
                     static_cast<long long>(i % cfg_.num_experts_per_tok),
                     static_cast<long long>(cfg_.n_routed_experts)));
    }
    (*out)[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return Status::ok_status();
}

Status CheckpointBinder::compressor(
    const std::string& prefix, int64_t ratio, int64_t d, bool overlap, CompressorWeights* out) {
  const int64_t w = overlap ? 2 * d : d;
  const int64_t hidden = cfg_.hidden_size;
  DSI_RETURN_IF_ERROR(mat(prefix + "wkv.weight", w, hidden, kFloatOnly, &out->wkv));
  DSI_RETURN_IF_ERROR(mat(prefix + "wgate.weight", w, hidden, kFloatOnly, &out->wgate));
  DSI_RETURN_IF_ERROR(vec(prefix + "ape", {ratio, w}, &out->ape));
  DSI_RETURN_IF_ERROR(vec(prefix + "norm.weight", {d}, &out->norm));
  return Status::ok_status();
}

Status CheckpointBinder::hyper_conn(const std::string& prefix,
                                    const std::string& which,
                                    HyperConnWeights* out) {
  const int64_t hc = cfg_.hc_mult;
  DSI_RETURN_IF_ERROR(
      vec(prefix + "hc_" + which + "_fn", {cfg_.hc_mix_dim(), hc * cfg_.hidden_size}, &out->fn));
  DSI_RETURN_IF_ERROR(vec(prefix + "hc_" + which + "_base", {cfg_.hc_mix_dim()}, &out->base));
  DSI_RETURN_IF_ERROR(vec(prefix + "hc_" + which + "_scale", {3}, &out->scale));
  return Status::ok_status();
}

Status CheckpointBinder::hyper_head(const std::string& prefix, HyperHeadWeights* out) {
  const int64_t hc = cfg_.hc_mult;
  DSI_RETURN_IF_ERROR(vec(prefix + "hc_head_fn", {hc, hc * cfg_.hidden_size}, &out->fn));
  DSI_RETURN_IF_ERROR(vec(prefix + "hc_head_base", {hc}, &out->base));
  DSI_RETURN_IF_ERROR(vec(prefix + "hc_head_scale", {1}, &out->scale));
  return Status::ok_status();
}

Status CheckpointBinder::layer(const std::string& p, const LayerPlan& plan, LayerWeights* out) {
  const ModelConfig& c = cfg_;
  const int64_t h = c.hidden_size;
  const int64_t hd = c.head_dim;
  DSI_RETURN_IF_ERROR(vec(p + "attn_norm.weight", {h}, &out->attn_norm));
  DSI_RETURN_IF_ERROR(vec(p + "ffn_norm.weight", {h}, &out->ffn_norm));
  DSI_RETURN_IF_ERROR(hyper_conn(p, "attn", &out->hc_attn));
  DSI_RETURN_IF_ERROR(hyper_conn(p, "ffn", &out->hc_ffn));

  AttentionWeights& a = out->attn;
  const std::string ap = p + "attn.";
  DSI_RETURN_IF_ERROR(mat(ap + "wq_a.weight", c.q_lora_rank, h, kAllowFp8, &a.wq_a));
  DSI_RETURN_IF_ERROR(vec(ap + "q_norm.weight", {c.q_lora_rank}, &a.q_norm));
  DSI_RETURN_IF_ERROR(
      mat(ap + "wq_b.weight", c.num_attention_heads * hd, c.q_lora_rank, kAllowFp8, &a.wq_b));
  DSI_RETURN_IF_ERROR(mat(ap + "wkv.weight", hd, h, kAllowFp8, &a.wkv));
  DSI_RETURN_IF_ERROR(vec(ap + "kv_norm.weight", {hd}, &a.kv_norm));
  DSI_RETURN_IF_ERROR(mat(ap + "wo_a.weight",
                          c.o_groups * c.o_lora_rank,
                          c.num_attention_heads * hd / c.o_groups,
                          kAllowFp8,
                          &a.wo_a));
  DSI_RETURN_IF_ERROR(mat(ap + "wo_b.weight", h, c.o_groups * c.o_lora_rank, kAllowFp8, &a.wo_b));
  DSI_RETURN_IF_ERROR(vec(ap + "attn_sink", {c.num_attention_heads}, &a.attn_sink));
  if (plan.attention == AttentionType::kCsa) {
    DSI_RETURN_IF_ERROR(
        compressor(ap + "compressor.", plan.compress_ratio, hd, true, &a.compressor));
    DSI_RETURN_IF_ERROR(mat(ap + "indexer.wq_b.weight",
                            c.index_n_heads * c.index_head_dim,
                            c.q_lora_rank,
                            kAllowFp8,
                            &a.indexer_wq_b));
    DSI_RETURN_IF_ERROR(mat(ap + "indexer.weights_proj.weight",
                            c.index_n_heads,
                            h,
                            kFloatOnly,
                            &a.indexer_weights_proj));
    DSI_RETURN_IF_ERROR(compressor(ap + "indexer.compressor.",
                                   plan.compress_ratio,
                                   c.index_head_dim,
                                   true,
                                   &a.indexer_compressor));
  } else if (plan.attention == AttentionType::kHca) {
    DSI_RETURN_IF_ERROR(
        compressor(ap + "compressor.", plan.compress_ratio, hd, false, &a.compressor));
  }

  MoeWeights& m = out->ffn;
  const std::string fp = p + "ffn.";
  DSI_RETURN_IF_ERROR(mat(fp + "gate.weight", c.n_routed_experts, h, kFloatOnly, &m.gate));
  if (plan.moe == MoeType::kScore) {
    DSI_RETURN_IF_ERROR(vec(fp + "gate.bias", {c.n_routed_experts}, &m.bias));
  } else {
    DSI_RETURN_IF_ERROR(tid2eid(fp + "gate.tid2eid", &m.tid2eid));
  }
  const int64_t inter = c.moe_intermediate_size;
  m.experts.resize(static_cast<size_t>(c.n_routed_experts));
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    const std::string ep = fp + "experts." + std::to_string(e) + ".";
    ExpertWeights& x = m.experts[static_cast<size_t>(e)];
    const unsigned allow = kAllowFp8 | kAllowMxfp4;
    DSI_RETURN_IF_ERROR(mat(ep + "w1.weight", inter, h, allow, &x.w1));
    DSI_RETURN_IF_ERROR(mat(ep + "w3.weight", inter, h, allow, &x.w3));
    DSI_RETURN_IF_ERROR(mat(ep + "w2.weight", h, inter, allow, &x.w2));
  }
  const std::string sp = fp + "shared_experts.";
  DSI_RETURN_IF_ERROR(mat(sp + "w1.weight", inter, h, kAllowFp8, &m.shared.w1));
  DSI_RETURN_IF_ERROR(mat(sp + "w3.weight", inter, h, kAllowFp8, &m.shared.w3));
  DSI_RETURN_IF_ERROR(mat(sp + "w2.weight", h, inter, kAllowFp8, &m.shared.w2));
  return Status::ok_status();
}

Status CheckpointBinder::bind() {
  const ModelConfig& c = cfg_;
  ModelWeights& w = ck_->weights_;
  const int64_t h = c.hidden_size;
  DSI_RETURN_IF_ERROR(mat("embed.weight", c.vocab_size, h, kFloatOnly, &w.embed));
  DSI_RETURN_IF_ERROR(mat("head.weight", c.vocab_size, h, kFloatOnly, &w.head));
  DSI_RETURN_IF_ERROR(vec("norm.weight", {h}, &w.norm));
  DSI_RETURN_IF_ERROR(hyper_head("", &w.hc_head));
  w.layers.resize(c.layers.size());
  for (size_t l = 0; l < c.layers.size(); ++l) {
    DSI_RETURN_IF_ERROR(layer("layers." + std::to_string(l) + ".", c.layers[l], &w.layers[l]));
  }
  if (!missing_.empty()) {
    std::string msg = "missing tensor " + missing_.front() + " (expected in " + where() + ")";
    if (missing_.size() > 1) {
      msg += str_format(" and %zu more missing", missing_.size() - 1);
    }
    return not_found(msg);
  }

  // MTP: optional as a whole; when any mtp.* tensor is present, all of them must be.
  bool any_mtp = false;
  for (const auto& [name, e] : entries_) any_mtp |= str_starts_with(name, "mtp.");
  if (any_mtp && c.num_nextn_predict_layers > 0) {
    w.mtp.resize(c.mtp_layers.size());
    for (size_t i = 0; i < c.mtp_layers.size(); ++i) {
      const std::string p = "mtp." + std::to_string(i) + ".";
      MtpWeights& m = w.mtp[i];
      DSI_RETURN_IF_ERROR(mat(p + "e_proj.weight", h, h, kAllowFp8, &m.e_proj));
      DSI_RETURN_IF_ERROR(mat(p + "h_proj.weight", h, h, kAllowFp8, &m.h_proj));
      DSI_RETURN_IF_ERROR(vec(p + "enorm.weight", {h}, &m.enorm));
      DSI_RETURN_IF_ERROR(vec(p + "hnorm.weight", {h}, &m.hnorm));
      DSI_RETURN_IF_ERROR(vec(p + "norm.weight", {h}, &m.norm));
      DSI_RETURN_IF_ERROR(hyper_head(p, &m.hc_head));
      DSI_RETURN_IF_ERROR(layer(p, c.mtp_layers[i], &m.layer));
    }
    if (!missing_.empty()) {
      std::string msg = str_format(
          "incomplete MTP weights in %s: missing %zu tensors: ", where().c_str(), missing_.size());
      for (size_t i = 0; i < missing_.size() && i < 8; ++i) msg += (i ? ", " : "") + missing_[i];
      if (missing_.size() > 8) {
        msg += ", ...";
      }
      return not_found(msg);
    }
  }

  // Everything must have been consumed.
  std::vector<const CkEntry*> unexpected;
  for (const auto& [name, e] : entries_) {
    if (!e.consumed) {
      unexpected.push_back(&e);
    }
  }
  if (!unexpected.empty()) {
    std::string msg = "unexpected tensor " + unexpected.front()->stored + " in " +
                      path_of(unexpected.front()->file);
    if (unexpected.size() > 1) {
      msg += str_format(" (and %zu more)", unexpected.size() - 1);
    }
    return invalid_argument(msg);
  }
  return Status::ok_status();
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir_in) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return not_found(dir + ": not a directory");
  }
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  DSI_ASSIGN_OR_RETURN(ck->config_, load_model_config(dir + "/config.json"));
  CheckpointBinder binder(ck.get());
  DSI_RETURN_IF_ERROR(binder.load_files());
  DSI_RETURN_IF_ERROR(binder.index_tensors());
  DSI_RETURN_IF_ERROR(binder.bind());
  return ck;
}

}  // namespace dsinfer::model
