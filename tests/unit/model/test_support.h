// Shared helpers for the model tests: per-test temp dirs, walking every bound weight by its
// canonical name, and rewriting safetensors files.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "tensor/safetensors.h"

namespace dsinfer::model::testing {

inline std::string test_dir(const std::string& suffix = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path p = std::filesystem::path(DSI_BINARY_DIR) / "test-tmp" /
                            (std::string(info->test_suite_name()) + "." + info->name() + suffix);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

using MatFn = std::function<void(const std::string&, const MatrixRef&)>;
using VecFn = std::function<void(const std::string&, const std::vector<float>&)>;

inline void walk_compressor(const std::string& p,
                            const CompressorWeights& c,
                            const MatFn& m,
                            const VecFn& v) {
  m(p + "wkv.weight", c.wkv);
  m(p + "wgate.weight", c.wgate);
  v(p + "ape", c.ape);
  v(p + "norm.weight", c.norm);
}

inline void walk_layer(const std::string& p,
                       const LayerPlan& plan,
                       const LayerWeights& l,
                       const MatFn& m,
                       const VecFn& v) {
  v(p + "attn_norm.weight", l.attn_norm);
  v(p + "ffn_norm.weight", l.ffn_norm);
  for (auto [which, hc] :
       {std::pair<const char*, const HyperConnWeights*>{"attn", &l.hc_attn}, {"ffn", &l.hc_ffn}}) {
    v(p + "hc_" + which + "_fn", hc->fn);
    v(p + "hc_" + which + "_base", hc->base);
    v(p + "hc_" + which + "_scale", hc->scale);
  }
  const std::string a = p + "attn.";
  m(a + "wq_a.weight", l.attn.wq_a);
  v(a + "q_norm.weight", l.attn.q_norm);
  m(a + "wq_b.weight", l.attn.wq_b);
  m(a + "wkv.weight", l.attn.wkv);
  v(a + "kv_norm.weight", l.attn.kv_norm);
  m(a + "wo_a.weight", l.attn.wo_a);
  m(a + "wo_b.weight", l.attn.wo_b);
  v(a + "attn_sink", l.attn.attn_sink);
  if (plan.attention != AttentionType::kSliding) {
    walk_compressor(a + "compressor.", l.attn.compressor, m, v);
  }
  if (plan.attention == AttentionType::kCsa) {
    m(a + "indexer.wq_b.weight", l.attn.indexer_wq_b);
    m(a + "indexer.weights_proj.weight", l.attn.indexer_weights_proj);
    walk_compressor(a + "indexer.compressor.", l.attn.indexer_compressor, m, v);
  }
  const std::string f = p + "ffn.";
  m(f + "gate.weight", l.ffn.gate);
  if (plan.moe == MoeType::kScore) {
    v(f + "gate.bias", l.ffn.bias);
  }
  for (size_t e = 0; e < l.ffn.experts.size(); ++e) {
    const std::string ep = f + "experts." + std::to_string(e) + ".";
    m(ep + "w1.weight", l.ffn.experts[e].w1);
    m(ep + "w2.weight", l.ffn.experts[e].w2);
    m(ep + "w3.weight", l.ffn.experts[e].w3);
  }
  m(f + "shared_experts.w1.weight", l.ffn.shared.w1);
  m(f + "shared_experts.w2.weight", l.ffn.shared.w2);
  m(f + "shared_experts.w3.weight", l.ffn.shared.w3);
}

// Calls m/v for every bound matrix/vector with its canonical (DeepSeek) tensor name.
inline void walk_weights(const ModelConfig& c,
                         const ModelWeights& w,
                         const MatFn& m,
                         const VecFn& v) {
  m("embed.weight", w.embed);
  m("head.weight", w.head);
  v("norm.weight", w.norm);
  v("hc_head_fn", w.hc_head.fn);
  v("hc_head_base", w.hc_head.base);
  v("hc_head_scale", w.hc_head.scale);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    walk_layer("layers." + std::to_string(l) + ".", c.layers[l], w.layers[l], m, v);
  }
  for (size_t i = 0; i < w.mtp.size(); ++i) {
    const std::string p = "mtp." + std::to_string(i) + ".";
    const MtpWeights& t = w.mtp[i];
    m(p + "e_proj.weight", t.e_proj);
    m(p + "h_proj.weight", t.h_proj);
    v(p + "enorm.weight", t.enorm);
    v(p + "hnorm.weight", t.hnorm);
    v(p + "norm.weight", t.norm);
    v(p + "hc_head_fn", t.hc_head.fn);
    v(p + "hc_head_base", t.hc_head.base);
    v(p + "hc_head_scale", t.hc_head.scale);
    walk_layer(p, c.mtp_layers[i], t.layer, m, v);
  }
}

// Reads every tensor of a safetensors file into writable form.
inline std::vector<TensorToWrite> read_all(const std::string& path) {
  std::vector<TensorToWrite> out;
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (!f.ok()) {
    return out;
  }
  for (const TensorInfo& t : (*f)->tensors()) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    out.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(p, p + t.nbytes)});
  }
  return out;
}

inline TensorToWrite* find_tensor(std::vector<TensorToWrite>& ts, const std::string& name) {
  for (TensorToWrite& t : ts) {
    if (t.name == name) {
      return &t;
    }
  }
  return nullptr;
}

// Loads `path`, applies `edit`, writes it back.
inline void rewrite(const std::string& path,
                    const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  std::vector<TensorToWrite> ts = read_all(path);
  edit(ts);
  const Status s = write_safetensors(path, ts);
  ASSERT_TRUE(s.ok()) << s.to_string();
}

}  // namespace dsinfer::model::testing
