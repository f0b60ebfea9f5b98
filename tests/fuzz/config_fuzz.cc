// libFuzzer: parse_model_config on arbitrary text; accepted configs must have a consistent plan
// and computable RoPE tables.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto r = dsinfer::model::parse_model_config(text, "fuzz/config.json");
  if (!r.ok()) {
    return 0;
  }
  const dsinfer::model::ModelConfig& c = *r;
  if (static_cast<int64_t>(c.layers.size()) != c.num_hidden_layers) {
    __builtin_trap();
  }
  if (static_cast<int64_t>(c.mtp_layers.size()) != c.num_nextn_predict_layers) {
    __builtin_trap();
  }
  if (c.head_dim <= c.qk_rope_head_dim || c.qk_rope_head_dim % 2 != 0) {
    __builtin_trap();
  }
  for (const auto& p : c.layers) {
    if ((p.attention == dsinfer::model::AttentionType::kSliding) != (p.compress_ratio == 0)) {
      __builtin_trap();
    }
  }
  auto a = dsinfer::model::rope_inv_freq(c.rope_main, c.qk_rope_head_dim);
  auto b = dsinfer::model::rope_inv_freq(c.rope_compress, c.qk_rope_head_dim);
  if (static_cast<int64_t>(a.size() + b.size()) != c.qk_rope_head_dim) {
    __builtin_trap();
  }
  return 0;
}
