// V41Checkpoint: a DeepSeek V4.1 model directory (config.json + *.safetensors, optionally with
// model.safetensors.index.json) opened, validated tensor by tensor against the config and bound
// into V41Weights. Two layouts (spec deepseek-v41.md §8):
//   official:      no prefix; FP8 E4M3 with one F8_E8M0 `.scale` per 32x32 tile, MXFP4 routed
//                  experts (I8 + E8M0 per 32), BF16 / F32 tensors exactly as §8.3 lists them;
//   transformers:  what the port's save_pretrained writes: `model.` prefix, `lm_head.weight`,
//                  float tensors (or FP8 with `.weight_scale_inv`).
// Vision tensors (`vision.*`, `aligner.*`, `image_*`) are skipped: the text model loads. DSpark
// blocks (`mtp.*`) are bound when present (all or nothing).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/checkpoint.h"
#include "model_v41/config.h"
#include "model_v41/weights.h"
#include "tensor/safetensors.h"

namespace dsinfer::model_v41 {

enum class V41Layout { kOfficial, kTransformers };
const char* v41_layout_name(V41Layout l);

class V41Checkpoint {
 public:
  // Every failure is a Status naming the tensor, the file and what was expected.
  static Result<std::unique_ptr<V41Checkpoint>> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const V41Config& config() const { return config_; }
  const V41Weights& weights() const { return weights_; }
  V41Layout layout() const { return layout_; }
  const std::vector<model::InventoryEntry>& inventory() const { return inventory_; }
  // Tensors present but not part of the text model (vision tower, aligner, image embeddings).
  int64_t skipped_tensors() const { return skipped_tensors_; }
  int64_t skipped_bytes() const { return skipped_bytes_; }

 private:
  V41Checkpoint() = default;
  std::string dir_;
  V41Config config_;
  V41Weights weights_;
  V41Layout layout_ = V41Layout::kOfficial;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<model::InventoryEntry> inventory_;
  int64_t skipped_tensors_ = 0;
  int64_t skipped_bytes_ = 0;
  friend class V41Binder;
};

}  // namespace dsinfer::model_v41
