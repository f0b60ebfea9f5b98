// Synthetic DeepSeek V4 checkpoints with random weights (official layout, DeepSeek dialect).
#include "model/synthetic.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/strings.h"
#include "numeric/float_formats.h"
#include "numeric/quant.h"
#include "tensor/safetensors.h"

namespace dsinfer::model {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// splitmix64 stream + Box-Muller: deterministic on every platform (std:: distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double t = 2.0 * 3.14159265358979323846 * u2;
    spare_ = static_cast<float>(r * std::sin(t));
    have_spare_ = true;
    return static_cast<float>(r * std::cos(t));
  }

 private:
  uint64_t s_;
  bool have_spare_ = false;
  float spare_ = 0.0f;
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

enum class Storage { kBf16, kF32, kFp8, kMxfp4, kTid2eid };

struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;  // logical shape ([rows, cols] for matrices)
  Storage storage = Storage::kBf16;
  float mean = 0.0f;
  float stddev = 1.0f;
  int64_t id_range = 0;  // kTid2eid: ids are drawn from [0, id_range)
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string scale_name_for(const std::string& weight) {
  return str_ends_with(weight, ".weight") ? weight.substr(0, weight.size() - 7) + ".scale"
                                          : weight + ".scale";
}

// Every tensor of the checkpoint, in a stable order.
class Planner {
 public:
  Planner(const ModelConfig& c, bool quantized) : c_(c), q_(quantized) {}

  std::vector<TensorPlan> plan(bool with_mtp) {
    const int64_t h = c_.hidden_size;
    matrix("embed.weight", c_.vocab_size, h, false, 1.0f);
    matrix("head.weight", c_.vocab_size, h, false);
    norm("norm.weight", h);
    hyper_head("");
    for (size_t l = 0; l < c_.layers.size(); ++l) {
      layer("layers." + std::to_string(l) + ".", c_.layers[l]);
    }
    if (with_mtp) {
      for (size_t i = 0; i < c_.mtp_layers.size(); ++i) {
        const std::string p = "mtp." + std::to_string(i) + ".";
        matrix(p + "e_proj.weight", h, h, q_);
        matrix(p + "h_proj.weight", h, h, q_);
        norm(p + "enorm.weight", h);
        norm(p + "hnorm.weight", h);
        norm(p + "norm.weight", h);
        hyper_head(p);
        layer(p, c_.mtp_layers[i]);
      }
    }
    return std::move(out_);
  }

 private:
  void add(std::string name,
           std::vector<int64_t> shape,
           Storage s,
           float mean,
           float sd,
           int64_t id_range = 0) {
    out_.push_back({std::move(name), std::move(shape), s, mean, sd, id_range});
  }
  // fp8: FP8 when quantizing; stddev defaults to 1/sqrt(fan_in).
  void matrix(const std::string& name, int64_t rows, int64_t cols, bool fp8, float sd = 0.0f) {
    if (sd == 0.0f) {
      sd = 1.0f / std::sqrt(static_cast<float>(cols));
    }
    add(name, {rows, cols}, fp8 ? Storage::kFp8 : Storage::kBf16, 0.0f, sd);
  }
  void norm(const std::string& name, int64_t n) { add(name, {n}, Storage::kBf16, 1.0f, 0.05f); }
  void f32(const std::string& name, std::vector<int64_t> shape, float mean, float sd) {
    add(name, std::move(shape), Storage::kF32, mean, sd);
  }
  void hyper_conn(const std::string& p, const char* which) {
    const int64_t hc = c_.hc_mult;
    f32(p + "hc_" + which + "_fn", {c_.hc_mix_dim(), hc * c_.hidden_size}, 0.0f, 0.01f);
    f32(p + "hc_" + which + "_base", {c_.hc_mix_dim()}, 0.0f, 0.1f);
    f32(p + "hc_" + which + "_scale", {3}, 1.0f, 0.1f);
  }
  void hyper_head(const std::string& p) {
    const int64_t hc = c_.hc_mult;
    f32(p + "hc_head_fn", {hc, hc * c_.hidden_size}, 0.0f, 0.01f);
    f32(p + "hc_head_base", {hc}, 0.0f, 0.1f);
    f32(p + "hc_head_scale", {1}, 1.0f, 0.1f);
  }
  void compressor(const std::string& p, int64_t ratio, int64_t d, bool overlap) {
    const int64_t w = overlap ? 2 * d : d;
    matrix(p + "wkv.weight", w, c_.hidden_size, false);
    matrix(p + "wgate.weight", w, c_.hidden_size, false);
    f32(p + "ape", {ratio, w}, 0.0f, 0.1f);
    norm(p + "norm.weight", d);
  }
  void layer(const std::string& p, const LayerPlan& plan) {
    const int64_t h = c_.hidden_size;
    const int64_t hd = c_.head_dim;
    const int64_t heads = c_.num_attention_heads;
    norm(p + "attn_norm.weight", h);
    norm(p + "ffn_norm.weight", h);
    hyper_conn(p, "attn");
    hyper_conn(p, "ffn");
    const std::string a = p + "attn.";
    matrix(a + "wq_a.weight", c_.q_lora_rank, h, q_);
    norm(a + "q_norm.weight", c_.q_lora_rank);
    matrix(a + "wq_b.weight", heads * hd, c_.q_lora_rank, q_);
    matrix(a + "wkv.weight", hd, h, q_);
    norm(a + "kv_norm.weight", hd);
    matrix(a + "wo_a.weight", c_.o_groups * c_.o_lora_rank, heads * hd / c_.o_groups, q_);
    matrix(a + "wo_b.weight", h, c_.o_groups * c_.o_lora_rank, q_);
    f32(a + "attn_sink", {heads}, 0.0f, 0.5f);
    if (plan.attention == AttentionType::kCsa) {
      compressor(a + "compressor.", plan.compress_ratio, hd, true);
      matrix(a + "indexer.wq_b.weight", c_.index_n_heads * c_.index_head_dim, c_.q_lora_rank, q_);
      matrix(a + "indexer.weights_proj.weight", c_.index_n_heads, h, false);
      compressor(a + "indexer.compressor.", plan.compress_ratio, c_.index_head_dim, true);
    } else if (plan.attention == AttentionType::kHca) {
      compressor(a + "compressor.", plan.compress_ratio, hd, false);
    }
    const std::string f = p + "ffn.";
    matrix(f + "gate.weight", c_.n_routed_experts, h, false);
    if (plan.moe == MoeType::kScore) {
      f32(f + "gate.bias", {c_.n_routed_experts}, 0.0f, 0.01f);
    } else {
      add(f + "gate.tid2eid",
          {c_.vocab_size, c_.num_experts_per_tok},
          Storage::kTid2eid,
          0.0f,
          0.0f,
          c_.n_routed_experts);
    }
    const int64_t inter = c_.moe_intermediate_size;
    for (int64_t e = 0; e < c_.n_routed_experts; ++e) {
      const std::string ep = f + "experts." + std::to_string(e) + ".";
      const Storage s = q_ ? Storage::kMxfp4 : Storage::kBf16;
      add(ep + "w1.weight", {inter, h}, s, 0.0f, 1.0f / std::sqrt(static_cast<float>(h)));
      add(ep + "w2.weight", {h, inter}, s, 0.0f, 1.0f / std::sqrt(static_cast<float>(inter)));
      add(ep + "w3.weight", {inter, h}, s, 0.0f, 1.0f / std::sqrt(static_cast<float>(h)));
    }
    matrix(f + "shared_experts.w1.weight", inter, h, q_);
    matrix(f + "shared_experts.w2.weight", h, inter, q_);
    matrix(f + "shared_experts.w3.weight", inter, h, q_);
  }

  const ModelConfig& c_;
  bool q_;
  std::vector<TensorPlan> out_;
};

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) {
    std::memcpy(b.data(), v.data(), b.size());
  }
  return b;
}

// Generates one planned tensor (plus its scale for quantised formats).
void materialise(const TensorPlan& p,
                 uint64_t seed,
                 std::vector<TensorToWrite>* out,
                 std::map<std::string, std::vector<float>>* values) {
  Rng rng(seed ^ fnv1a(p.name));
  const int64_t n = numel_of(p.shape);
  if (p.storage == Storage::kTid2eid) {
    const int64_t rows = p.shape[0], k = p.shape[1];
    // k distinct expert ids per token (partial Fisher-Yates).
    const int64_t experts = p.id_range;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::vector<int32_t> perm(static_cast<size_t>(experts));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t e = 0; e < experts; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      for (int64_t j = 0; j < k; ++j) {
        const auto pick = j + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(experts - j));
        std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(pick)]);
        ids[static_cast<size_t>(r * k + j)] = perm[static_cast<size_t>(j)];
      }
    }
    out->push_back({p.name, DType::kI32, p.shape, as_bytes(ids)});
    return;
  }
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = p.mean + p.stddev * rng.normal();
  std::vector<float> stored(v.size());
  switch (p.storage) {
    case Storage::kF32:
      out->push_back(f32_tensor(p.name, p.shape, v));
      stored = v;
      break;
    case Storage::kBf16: {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        h[i] = numeric::f32_to_bf16(v[i]);
        stored[i] = numeric::bf16_to_f32(h[i]);
      }
      out->push_back({p.name, DType::kBF16, p.shape, as_bytes(h)});
      break;
    }
    case Storage::kFp8: {
      const int64_t rows = p.shape[0], cols = p.shape[1];
      const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
      std::vector<uint8_t> codes(static_cast<size_t>(n)), scales(static_cast<size_t>(sr * sc));
      fp8_block128_quantize(v.data(), rows, cols, codes.data(), scales.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          stored[i] = numeric::fp8_e4m3_to_f32(codes[i]) *
                      numeric::e8m0_to_f32(scales[static_cast<size_t>((r / 128) * sc + c / 128)]);
        }
      }
      out->push_back({p.name, DType::kF8E4M3, p.shape, std::move(codes)});
      out->push_back({scale_name_for(p.name), DType::kF8E8M0, {sr, sc}, std::move(scales)});
      break;
    }
    case Storage::kMxfp4: {
      const int64_t rows = p.shape[0], cols = p.shape[1];
      std::vector<uint8_t> packed(static_cast<size_t>(rows * cols / 2));
      std::vector<uint8_t> scales(static_cast<size_t>(rows * cols / 32));
      mxfp4_quantize(v.data(), rows, cols, packed.data(), scales.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          stored[static_cast<size_t>(r * cols + c)] =
              numeric::fp4_packed_get(packed.data() + r * (cols / 2), c) *
              numeric::e8m0_to_f32(scales[static_cast<size_t>(r * (cols / 32) + c / 32)]);
        }
      }
      out->push_back({p.name, DType::kI8, {rows, cols / 2}, std::move(packed)});
      out->push_back(
          {scale_name_for(p.name), DType::kF8E8M0, {rows, cols / 32}, std::move(scales)});
      break;
    }
    case Storage::kTid2eid:
      break;
  }
  if (values != nullptr) {
    (*values)[p.name] = std::move(stored);
  }
}

// ---- streaming generator (SyntheticGenerator::kStreaming) ----

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Counter-based streams: value i of stream `key` is splitmix64 evaluated at position i, so any
// row can be generated on its own, by any thread, in any order.
inline uint64_t hash_at(uint64_t key, uint64_t i) {
  return mix64(key + (i + 1) * kGolden);
}
uint64_t tensor_key(uint64_t seed, const std::string& name) {
  return mix64(seed ^ fnv1a(name));
}
inline uint64_t row_key(uint64_t tkey, int64_t row) {
  return mix64(tkey + static_cast<uint64_t>(row) * 0xd1b54a32d192ed03ull);
}

// Approximately N(0, 1) from one hash: the sum of its four 16-bit lanes (Irwin-Hall, n = 4),
// centred and scaled to unit variance; |x| <= 2*sqrt(3).
inline float approx_normal(uint64_t h) {
  const float s = static_cast<float>(h & 0xffffu) + static_cast<float>((h >> 16) & 0xffffu) +
                  static_cast<float>((h >> 32) & 0xffffu) + static_cast<float>(h >> 48);
  return (s - 131070.0f) * (1.7320508075688772f / 65536.0f);
}

// E2M1 magnitude codes (0, 0.5, 1, 1.5, 2, 3, 4, 6) drawn with the probabilities of a normal with
// sigma 2 rounded to that grid, as 128 equally likely entries; their RMS is exactly 2.
constexpr std::array<uint8_t, 128> make_fp4_magnitudes() {
  constexpr int kCounts[8] = {13, 25, 22, 19, 22, 17, 8, 2};
  std::array<uint8_t, 128> t{};
  int k = 0;
  for (int code = 0; code < 8; ++code) {
    for (int i = 0; i < kCounts[code]; ++i) {
      t[static_cast<size_t>(k++)] = static_cast<uint8_t>(code);
    }
  }
  return t;
}
constexpr std::array<uint8_t, 128> kFp4Magnitudes = make_fp4_magnitudes();
constexpr float kFp4CodeRms = 2.0f;
// Block exponents are jittered by {-1, 0, 0, +1}: RMS factor sqrt((1/4 + 1 + 1 + 4) / 4) = 1.25.
constexpr float kFp4JitterRms = 1.25f;

// One planned tensor inside a shard file.
struct StreamTensor {
  const TensorPlan* plan = nullptr;
  uint64_t key = 0;
  size_t weight = 0;  // writer index of the data tensor
  size_t scale = 0;   // writer index of `.scale` (kFp8, kMxfp4)
  int64_t rows = 1;   // generation grid: one random stream per row
  int64_t cols = 1;
  int64_t rows_per_item = 1;
};

struct WorkItem {
  size_t tensor = 0;
  int64_t r0 = 0, r1 = 0;
};

struct Scratch {
  std::vector<float> f;
  std::vector<uint8_t> a, b;
};

void fill_normal_rows(const StreamTensor& t, int64_t r0, int64_t r1, float* out) {
  const TensorPlan& p = *t.plan;
  for (int64_t r = r0; r < r1; ++r) {
    const uint64_t key = row_key(t.key, r);
    float* row = out + (r - r0) * t.cols;
    for (int64_t c = 0; c < t.cols; ++c) {
      row[c] = p.mean + p.stddev * approx_normal(hash_at(key, static_cast<uint64_t>(c)));
    }
  }
}

// Generates rows [r0, r1) of one tensor (and the matching scale rows) and writes them in place.
Status generate_rows(
    const StreamTensor& t, int64_t r0, int64_t r1, Scratch& s, SafetensorsWriter& w) {
  const TensorPlan& p = *t.plan;
  const int64_t n = r1 - r0, cols = t.cols;
  const auto count = static_cast<size_t>(n * cols);
  switch (p.storage) {
    case Storage::kF32: {
      s.f.resize(count);
      fill_normal_rows(t, r0, r1, s.f.data());
      return w.write(t.weight, r0 * cols * 4, s.f.data(), n * cols * 4);
    }
    case Storage::kBf16: {
      s.f.resize(count);
      s.a.resize(count * 2);
      fill_normal_rows(t, r0, r1, s.f.data());
      auto* h = reinterpret_cast<uint16_t*>(s.a.data());
      for (size_t i = 0; i < count; ++i) h[i] = numeric::f32_to_bf16(s.f[i]);
      return w.write(t.weight, r0 * cols * 2, s.a.data(), n * cols * 2);
    }
    case Storage::kFp8: {
      // Items start on a 128-row boundary, so every 128x128 tile is quantised from its full
      // contents whatever the item size.
      const int64_t sc = (cols + 127) / 128, sr = (n + 127) / 128;
      s.f.resize(count);
      s.a.resize(count);
      s.b.resize(static_cast<size_t>(sr * sc));
      fill_normal_rows(t, r0, r1, s.f.data());
      fp8_block128_quantize(s.f.data(), n, cols, s.a.data(), s.b.data());
      DSI_RETURN_IF_ERROR(w.write(t.weight, r0 * cols, s.a.data(), n * cols));
      return w.write(t.scale, (r0 / 128) * sc, s.b.data(), sr * sc);
    }
    case Storage::kMxfp4: {
      const int64_t blocks = cols / 32;
      const int exp0 =
          static_cast<int>(std::lround(std::log2(p.stddev / (kFp4CodeRms * kFp4JitterRms))));
      s.a.resize(count / 2);
      s.b.resize(static_cast<size_t>(n * blocks));
      for (int64_t r = r0; r < r1; ++r) {
        const uint64_t key = row_key(t.key, r);
        uint8_t* packed = s.a.data() + (r - r0) * (cols / 2);
        // Stream positions [0, cols/8): 8 codes per hash (7 bits magnitude, 1 bit sign).
        for (int64_t c = 0; c < cols; c += 8) {
          uint64_t h = hash_at(key, static_cast<uint64_t>(c / 8));
          for (int64_t k = 0; k < 8; k += 2) {
            const auto lo = static_cast<uint8_t>(kFp4Magnitudes[h & 127u] | ((h >> 4) & 8u));
            h >>= 8;
            const auto hi = static_cast<uint8_t>(kFp4Magnitudes[h & 127u] | ((h >> 4) & 8u));
            h >>= 8;
            packed[(c + k) / 2] = static_cast<uint8_t>(lo | (hi << 4));
          }
        }
        // Positions from cols/8 on: 2 bits of exponent jitter per 32-element block.
        uint8_t* scales = s.b.data() + (r - r0) * blocks;
        const auto base = static_cast<uint64_t>(cols / 8);
        for (int64_t b = 0; b < blocks; ++b) {
          const uint64_t h = hash_at(key, base + static_cast<uint64_t>(b / 32));
          static constexpr int kJitter[4] = {-1, 0, 0, 1};
          const int e = exp0 + kJitter[(h >> (2 * (b % 32))) & 3u];
          scales[b] = static_cast<uint8_t>(std::clamp(e + 127, 1, 254));
        }
      }
      DSI_RETURN_IF_ERROR(w.write(t.weight, r0 * cols / 2, s.a.data(), n * cols / 2));
      return w.write(t.scale, r0 * blocks, s.b.data(), n * blocks);
    }
    case Storage::kTid2eid: {
      // k distinct expert ids per token by rejection.
      const auto experts = static_cast<uint64_t>(p.id_range);
      s.a.resize(count * 4);
      auto* ids = reinterpret_cast<int32_t*>(s.a.data());
      for (int64_t r = r0; r < r1; ++r) {
        const uint64_t key = row_key(t.key, r);
        int32_t* row = ids + (r - r0) * cols;
        uint64_t pos = 0;
        for (int64_t j = 0; j < cols;) {
          const uint64_t h = hash_at(key, pos++);
          const auto id = static_cast<int32_t>(((h >> 32) * experts) >> 32);
          if (std::find(row, row + j, id) == row + j) {
            row[j++] = id;
          }
        }
      }
      return w.write(t.weight, r0 * cols * 4, s.a.data(), n * cols * 4);
    }
  }
  return Status::ok_status();
}

// Bytes one row of `p` occupies in the file (scales not counted).
int64_t stored_row_bytes(const TensorPlan& p, int64_t cols) {
  switch (p.storage) {
    case Storage::kF32:
    case Storage::kTid2eid:
      return cols * 4;
    case Storage::kBf16:
      return cols * 2;
    case Storage::kFp8:
      return cols;
    case Storage::kMxfp4:
      return cols / 2;
  }
  return cols;
}

// The stored tensors of `p` (data, then `.scale` for quantised formats).
std::vector<TensorSpec> stored_specs(const TensorPlan& p) {
  switch (p.storage) {
    case Storage::kF32:
      return {{p.name, DType::kF32, p.shape}};
    case Storage::kBf16:
      return {{p.name, DType::kBF16, p.shape}};
    case Storage::kTid2eid:
      return {{p.name, DType::kI32, p.shape}};
    case Storage::kFp8: {
      const int64_t rows = p.shape[0], cols = p.shape[1];
      return {{p.name, DType::kF8E4M3, p.shape},
              {scale_name_for(p.name), DType::kF8E8M0, {(rows + 127) / 128, (cols + 127) / 128}}};
    }
    case Storage::kMxfp4: {
      const int64_t rows = p.shape[0], cols = p.shape[1];
      return {{p.name, DType::kI8, {rows, cols / 2}},
              {scale_name_for(p.name), DType::kF8E8M0, {rows, cols / 32}}};
    }
  }
  return {};
}

int64_t spec_bytes(const TensorSpec& t) {
  return numel_of(t.shape) * static_cast<int64_t>(dtype_size(t.dtype));
}

// "layers.7", "mtp.0" or "" (top-level tensors) for a tensor name.
std::string block_of(const std::string& name) {
  for (const char* prefix : {"layers.", "mtp."}) {
    if (str_starts_with(name, prefix)) {
      const size_t dot = name.find('.', std::strlen(prefix));
      return name.substr(0, dot);
    }
  }
  return "";
}

std::string gib(uint64_t bytes) {
  return str_format("%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

constexpr int64_t kItemBytes = 4 << 20;  // target output bytes per work item

// Writes one shard file with `threads` workers; returns the file size.
Result<uint64_t> write_stream_shard(const std::string& path,
                                    const std::vector<const TensorPlan*>& plans,
                                    uint64_t seed,
                                    int threads) {
  std::vector<TensorSpec> specs;
  std::vector<StreamTensor> tensors;
  for (const TensorPlan* p : plans) {
    StreamTensor t;
    t.plan = p;
    t.key = tensor_key(seed, p->name);
    if (p->shape.size() >= 2) {
      t.rows = p->shape[0];
      t.cols = numel_of(p->shape) / std::max<int64_t>(1, t.rows);
    } else {
      t.rows = 1;
      t.cols = numel_of(p->shape);
    }
    const int64_t row_bytes = std::max<int64_t>(1, stored_row_bytes(*p, t.cols));
    t.rows_per_item = std::clamp<int64_t>(kItemBytes / row_bytes, 1, std::max<int64_t>(1, t.rows));
    if (p->storage == Storage::kFp8) {
      t.rows_per_item = (t.rows_per_item + 127) / 128 * 128;
    }
    std::vector<TensorSpec> st = stored_specs(*p);
    t.weight = specs.size();
    t.scale = specs.size() + 1;
    for (TensorSpec& s : st) specs.push_back(std::move(s));
    tensors.push_back(t);
  }
  DSI_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create(path, specs, {{"format", "pt"}}));
  std::vector<WorkItem> items;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const StreamTensor& t = tensors[i];
    for (int64_t r = 0; r < t.rows; r += t.rows_per_item) {
      items.push_back({i, r, std::min(t.rows, r + t.rows_per_item)});
    }
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first_error;
  auto worker = [&] {
    Scratch scratch;
    for (size_t i = next++; i < items.size() && !failed.load(); i = next++) {
      const WorkItem& it = items[i];
      Status s = generate_rows(tensors[it.tensor], it.r0, it.r1, scratch, *writer);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) {
          first_error = s;
        }
        failed = true;
      }
    }
  };
  const int n_threads = std::max(1, std::min<int>(threads, static_cast<int>(items.size())));
  std::vector<std::thread> pool;
  for (int i = 1; i < n_threads; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& th : pool) th.join();
  if (!first_error.ok()) {
    return first_error;
  }
  DSI_RETURN_IF_ERROR(writer->finish());
  return writer->file_bytes();
}

Status write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return io_error(path + ": cannot create: " + std::strerror(errno));
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int rc = std::fclose(f);
  if (!ok || rc != 0) {
    return io_error(path + ": write failed");
  }
  return Status::ok_status();
}

bool same_plan(const LayerPlan& a, const LayerPlan& b) {
  return a.attention == b.attention && a.compress_ratio == b.compress_ratio && a.rope == b.rope &&
         a.moe == b.moe;
}

}  // namespace

void fp8_block128_quantize(
    const float* w, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scale_bytes) {
  const int64_t sc = (cols + 127) / 128;
  for (int64_t rb = 0; rb < rows; rb += 128) {
    const int64_t re = std::min(rows, rb + 128);
    for (int64_t cb = 0; cb < cols; cb += 128) {
      const int64_t ce = std::min(cols, cb + 128);
      float amax = 0.0f;
      for (int64_t r = rb; r < re; ++r) {
        for (int64_t c = cb; c < ce; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      }
      const float s = numeric::ue8m0_block_scale(amax, numeric::kActAmaxFloor, numeric::kFp8Max);
      scale_bytes[(rb / 128) * sc + cb / 128] = numeric::e8m0_from_pow2(s);
      for (int64_t r = rb; r < re; ++r) {
        for (int64_t c = cb; c < ce; ++c) {
          const float q = std::clamp(w[r * cols + c] / s, -numeric::kFp8Max, numeric::kFp8Max);
          codes[r * cols + c] = numeric::f32_to_fp8_e4m3(q);
        }
      }
    }
  }
}

void mxfp4_quantize(
    const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scale_bytes) {
  DSI_CHECK(cols % 32 == 0, "MXFP4 needs cols %% 32 == 0, got %lld", static_cast<long long>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    uint8_t* prow = packed + r * (cols / 2);
    for (int64_t b = 0; b < cols; b += 32) {
      float amax = 0.0f;
      for (int64_t c = b; c < b + 32; ++c) amax = std::max(amax, std::fabs(row[c]));
      const float s = numeric::ue8m0_block_scale(amax, numeric::kFp4AmaxFloor, numeric::kFp4Max);
      scale_bytes[r * (cols / 32) + b / 32] = numeric::e8m0_from_pow2(s);
      for (int64_t c = b; c < b + 32; c += 2) {
        const uint8_t lo =
            numeric::f32_to_fp4_e2m1(std::clamp(row[c] / s, -numeric::kFp4Max, numeric::kFp4Max));
        const uint8_t hi = numeric::f32_to_fp4_e2m1(
            std::clamp(row[c + 1] / s, -numeric::kFp4Max, numeric::kFp4Max));
        prow[c / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

Result<std::string> deepseek_config_json(const ModelConfig& c, bool fp8_quantized) {
  if (c.rope_main.yarn) {
    return invalid_argument(
        "synthetic config: YaRN on the main RoPE table cannot be written "
        "in the DeepSeek dialect");
  }
  if (static_cast<int64_t>(c.layers.size()) != c.num_hidden_layers) {
    return invalid_argument(str_format("synthetic config: %zu layer plans for %lld layers",
                                       c.layers.size(),
                                       static_cast<long long>(c.num_hidden_layers)));
  }
  json ratios = json::array();
  int64_t n_hash = 0;
  bool hash_prefix = true;
  for (const LayerPlan& p : c.layers) {
    ratios.push_back(p.compress_ratio);
    if (p.moe == MoeType::kHash) {
      if (!hash_prefix) {
        return invalid_argument("synthetic config: hash-routed layers must be a prefix");
      }
      ++n_hash;
    } else {
      hash_prefix = false;
    }
  }
  for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) ratios.push_back(0);

  json j = json::object();
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["sliding_window"] = c.sliding_window;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_main.theta;
  j["compress_rope_theta"] = c.rope_compress.theta;
  if (c.rope_compress.yarn) {
    j["rope_scaling"] = {
        {"type", "yarn"},
        {"factor", c.rope_compress.factor},
        {"original_max_position_embeddings", c.rope_compress.original_max_position},
        {"beta_fast", c.rope_compress.beta_fast},
        {"beta_slow", c.rope_compress.beta_slow}};
  }
  j["compress_ratios"] = ratios;
  j["num_hash_layers"] = n_hash;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["scoring_func"] = scoring_func_name(c.scoring_func);
  j["topk_method"] = "noaux_tc";
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["swiglu_limit"] = c.swiglu_limit;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["tie_word_embeddings"] = false;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "bfloat16";
  if (fp8_quantized) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"scale_fmt", "ue8m0"},
                                {"weight_block_size", {128, 128}}};
  }
  std::string text = j.dump(2) + "\n";

  // The text must reproduce the plan exactly (CSA = smallest ratio, sliding <-> main table, ...).
  auto parsed = parse_model_config(text, "synthetic config.json");
  if (!parsed.ok()) {
    return parsed.status().with_context("synthetic config");
  }
  const ModelConfig& back = parsed.value();
  bool same =
      back.layers.size() == c.layers.size() && back.mtp_layers.size() == c.mtp_layers.size();
  for (size_t i = 0; same && i < c.layers.size(); ++i) {
    same = same_plan(back.layers[i], c.layers[i]);
  }
  for (size_t i = 0; same && i < c.mtp_layers.size(); ++i) {
    same = same_plan(back.mtp_layers[i], c.mtp_layers[i]);
  }
  if (!same) {
    return invalid_argument(
        "synthetic config: the layer plan cannot be expressed in the DeepSeek dialect (CSA must "
        "be the smallest compress ratio, sliding layers use the main table, compressed layers "
        "the compress table, MTP layers are sliding + score)");
  }
  return text;
}

namespace {

// SyntheticGenerator::kStreaming: one shard per block, generated in place on spec.threads.
Status write_streaming(const SyntheticSpec& spec,
                       const std::string& dir,
                       const std::vector<TensorPlan>& plan) {
  if (spec.values_out != nullptr) {
    return invalid_argument("synthetic checkpoint: values_out needs the reference generator");
  }
  const auto report = [&](const std::string& line) {
    if (spec.progress) {
      spec.progress(line);
    }
  };
  const ModelConfig& c = spec.config;
  int threads = spec.threads;
  if (threads <= 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }
  // Consecutive tensors of one block share a shard.
  std::vector<std::pair<std::string, std::vector<const TensorPlan*>>> groups;
  uint64_t planned = 0;
  int64_t stored = 0;
  for (const TensorPlan& p : plan) {
    const std::string block = block_of(p.name);
    if (groups.empty() || groups.back().first != block) {
      groups.push_back({block, {}});
    }
    groups.back().second.push_back(&p);
    for (const TensorSpec& t : stored_specs(p)) {
      planned += static_cast<uint64_t>(spec_bytes(t));
      ++stored;
    }
  }
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (!ec && space.available < planned) {
    return io_error(str_format("%s: not enough disk space: the checkpoint needs %s, %s available",
                               dir.c_str(),
                               gib(planned).c_str(),
                               gib(space.available).c_str()));
  }
  report(str_format("writing %zu shards, %lld tensors, %s with %d threads into %s",
                    groups.size(),
                    static_cast<long long>(stored),
                    gib(planned).c_str(),
                    threads,
                    dir.c_str()));
  json weight_map = json::object();
  uint64_t data_total = 0, file_total = 0;
  const auto t_start = std::chrono::steady_clock::now();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& [block, plans] = groups[g];
    const std::string file = str_format("model-%05zu-of-%05zu.safetensors", g + 1, groups.size());
    const auto t0 = std::chrono::steady_clock::now();
    DSI_ASSIGN_OR_RETURN(uint64_t bytes,
                         write_stream_shard(dir + "/" + file, plans, spec.seed, threads));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const TensorPlan* p : plans) {
      for (const TensorSpec& t : stored_specs(*p)) {
        weight_map[t.name] = file;
        data_total += static_cast<uint64_t>(spec_bytes(t));
      }
    }
    file_total += bytes;
    std::string what = "embed, head, norm, hc_head";
    if (str_starts_with(block, "layers.")) {
      const LayerPlan& lp = c.layers[std::stoul(block.substr(7))];
      what = str_format("%s (%s", block.c_str(), attention_type_name(lp.attention));
      if (lp.compress_ratio > 0) {
        what += str_format(" ratio %d", lp.compress_ratio);
      }
      what += str_format(", %s MoE)", moe_type_name(lp.moe));
    } else if (!block.empty()) {
      what = block + " (MTP: sliding, score MoE)";
    }
    report(str_format("[%zu/%zu] %s: %s in %.1f s (%.0f MiB/s)",
                      g + 1,
                      groups.size(),
                      what.c_str(),
                      gib(bytes).c_str(),
                      secs,
                      static_cast<double>(bytes) / (1024.0 * 1024.0) / std::max(secs, 1e-9)));
  }
  json index = {{"metadata", {{"total_size", data_total}}}, {"weight_map", weight_map}};
  DSI_RETURN_IF_ERROR(write_text(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  const double total_secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  report(str_format("done: %llu bytes (%s) in %zu files, %.1f s",
                    static_cast<unsigned long long>(file_total),
                    gib(file_total).c_str(),
                    groups.size(),
                    total_secs));
  if (spec.stats != nullptr) {
    *spec.stats = {static_cast<int>(groups.size()), stored, file_total};
  }
  return Status::ok_status();
}

}  // namespace

Status write_synthetic_checkpoint(const SyntheticSpec& spec, const std::string& dir) {
  const ModelConfig& c = spec.config;
  if (spec.num_shards < 1) {
    return invalid_argument("synthetic checkpoint: num_shards must be >= 1");
  }
  if (spec.quantized && (c.hidden_size % 32 != 0 || c.moe_intermediate_size % 32 != 0)) {
    return invalid_argument(
        "synthetic checkpoint: MXFP4 experts need hidden_size and moe_intermediate_size to be "
        "multiples of 32");
  }
  DSI_ASSIGN_OR_RETURN(std::string config_text, deepseek_config_json(c, spec.quantized));

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return io_error(dir + ": cannot create directory: " + ec.message());
  }
  // Remove files of an earlier synthetic checkpoint (our own naming only).
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const bool ours = n == "model.safetensors" || n == "model.safetensors.index.json" ||
                      (str_starts_with(n, "model-") && str_ends_with(n, ".safetensors") &&
                       n.find("-of-") != std::string::npos);
    if (ours) {
      stale.push_back(it->path());
    }
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
  DSI_RETURN_IF_ERROR(write_text(dir + "/config.json", config_text));

  Planner planner(c, spec.quantized);
  std::vector<TensorPlan> plan = planner.plan(spec.with_mtp);
  if (spec.generator == SyntheticGenerator::kStreaming) {
    return write_streaming(spec, dir, plan);
  }
  const auto shards = static_cast<size_t>(spec.num_shards);
  if (shards > plan.size()) {
    return invalid_argument(
        str_format("synthetic checkpoint: %zu shards for %zu tensors", shards, plan.size()));
  }
  if (spec.values_out != nullptr) {
    spec.values_out->clear();
  }
  json weight_map = json::object();
  uint64_t total = 0;
  for (size_t s = 0; s < shards; ++s) {
    const size_t b = s * plan.size() / shards, e = (s + 1) * plan.size() / shards;
    const std::string file = shards == 1
                                 ? "model.safetensors"
                                 : str_format("model-%05zu-of-%05zu.safetensors", s + 1, shards);
    std::vector<TensorToWrite> tensors;
    for (size_t i = b; i < e; ++i) materialise(plan[i], spec.seed, &tensors, spec.values_out);
    for (const TensorToWrite& t : tensors) {
      weight_map[t.name] = file;
      total += t.bytes.size();
    }
    DSI_RETURN_IF_ERROR(write_safetensors(dir + "/" + file, tensors, {{"format", "pt"}}));
  }
  if (shards > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    DSI_RETURN_IF_ERROR(write_text(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  }
  if (spec.stats != nullptr) {
    *spec.stats = {static_cast<int>(shards), static_cast<int64_t>(weight_map.size()), 0};
    for (size_t s = 0; s < shards; ++s) {
      const std::string file = shards == 1
                                   ? "model.safetensors"
                                   : str_format("model-%05zu-of-%05zu.safetensors", s + 1, shards);
      spec.stats->bytes += fs::file_size(dir + "/" + file, ec);
    }
  }
  return Status::ok_status();
}

Result<ModelConfig> truncate_layers(const ModelConfig& config, int64_t layers) {
  if (layers < 1 || layers > config.num_hidden_layers) {
    return invalid_argument(str_format("layers must be between 1 and %lld, got %lld",
                                       static_cast<long long>(config.num_hidden_layers),
                                       static_cast<long long>(layers)));
  }
  ModelConfig t = config;
  t.num_hidden_layers = layers;
  t.layers.resize(static_cast<size_t>(layers));
  DSI_ASSIGN_OR_RETURN(std::string text, deepseek_config_json(t, t.fp8_quantized));
  return parse_model_config(text, "truncated config");
}

Result<ModelConfig> v4_flash_preset_config(int layers) {
  if (layers < 1 || layers > kV4FlashLayers) {
    return invalid_argument(str_format(
        "v4-flash preset: layers must be between 1 and %d (the real checkpoint's main layer "
        "count), got %d",
        kV4FlashLayers,
        layers));
  }
  // Spec §1.2: [0, 0, 4, 128, 4, 128, ..., 4] for the 43 main layers, then 0 for the MTP block.
  json ratios = json::array();
  for (int i = 0; i <= kV4FlashLayers; ++i) {
    ratios.push_back(i >= 2 && i < kV4FlashLayers ? (i % 2 == 0 ? 4 : 128) : 0);
  }
  const json j = {{"architectures", {"DeepseekV4ForCausalLM"}},
                  {"model_type", "deepseek_v4"},
                  {"vocab_size", 129280},
                  {"hidden_size", 4096},
                  {"num_hidden_layers", kV4FlashLayers},
                  {"num_attention_heads", 64},
                  {"num_key_value_heads", 1},
                  {"head_dim", 512},
                  {"qk_rope_head_dim", 64},
                  {"q_lora_rank", 1024},
                  {"o_groups", 8},
                  {"o_lora_rank", 1024},
                  {"sliding_window", 128},
                  {"compress_ratios", ratios},
                  {"rope_theta", 10000.0},
                  {"compress_rope_theta", 160000.0},
                  {"rope_scaling",
                   {{"type", "yarn"},
                    {"factor", 16},
                    {"original_max_position_embeddings", 65536},
                    {"beta_fast", 32},
                    {"beta_slow", 1}}},
                  {"max_position_embeddings", 1048576},
                  {"index_n_heads", 64},
                  {"index_head_dim", 128},
                  {"index_topk", 512},
                  {"hc_mult", 4},
                  {"hc_sinkhorn_iters", 20},
                  {"hc_eps", 1e-6},
                  {"rms_norm_eps", 1e-6},
                  {"n_routed_experts", 256},
                  {"n_shared_experts", 1},
                  {"num_experts_per_tok", 6},
                  {"moe_intermediate_size", 2048},
                  {"num_hash_layers", 3},
                  {"scoring_func", "sqrtsoftplus"},
                  {"topk_method", "noaux_tc"},
                  {"norm_topk_prob", true},
                  {"routed_scaling_factor", 1.5},
                  {"swiglu_limit", 10.0},
                  {"hidden_act", "silu"},
                  {"tie_word_embeddings", false},
                  {"num_nextn_predict_layers", 1},
                  {"bos_token_id", 0},
                  {"eos_token_id", 1},
                  {"torch_dtype", "bfloat16"},
                  {"quantization_config",
                   {{"activation_scheme", "dynamic"},
                    {"fmt", "e4m3"},
                    {"quant_method", "fp8"},
                    {"scale_fmt", "ue8m0"},
                    {"weight_block_size", {128, 128}}}}};
  auto full = parse_model_config(j.dump(), "v4-flash preset");
  DSI_CHECK(full.ok(), "v4-flash preset: %s", full.status().to_string().c_str());
  if (layers == kV4FlashLayers) {
    return std::move(full).value();
  }
  auto cut = truncate_layers(*full, layers);
  if (!cut.ok()) {
    return cut.status().with_context("v4-flash preset");
  }
  return cut;
}

ModelConfig tiny_preset_config() {
  static const char* kJson = R"({
    "model_type": "deepseek_v4",
    "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 5,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64,
    "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 32, "sliding_window": 8,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1},
    "compress_ratios": [0, 4, 16, 4, 16, 0], "num_hash_layers": 2,
    "index_n_heads": 2, "index_head_dim": 64, "index_topk": 3,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "scoring_func": "sqrtsoftplus", "norm_topk_prob": true,
    "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "num_nextn_predict_layers": 1,
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false
  })";
  auto c = parse_model_config(kJson, "tiny preset");
  DSI_CHECK(c.ok(), "tiny preset: %s", c.status().to_string().c_str());
  return std::move(c).value();
}

}  // namespace dsinfer::model
