// Checkpoint: a model directory (config.json + one or several *.safetensors, optionally with
// model.safetensors.index.json) opened, validated against the config and bound into
// ModelWeights. Accepts the official DeepSeek layout (no prefix, FP8 128x128 blocks with
// `.scale`, MXFP4 routed experts, bf16/f32 elsewhere) and what transformers' save_pretrained
// writes (`model.` prefix, `embed_tokens`, `hc_head.hc_*`, `attn.norm` for the KV norm, fp32).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/weights.h"
#include "tensor/safetensors.h"

namespace dsinfer::model {

enum class CheckpointLayout { kDeepSeek, kTransformers };
const char* checkpoint_layout_name(CheckpointLayout l);

struct InventoryEntry {
  std::string name;  // name as stored in the file
  std::string file;  // shard file name (relative to the model dir)
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t nbytes = 0;
};

class Checkpoint {
 public:
  // Opens `dir`. Every failure (missing/bad config, missing/unexpected tensor, wrong shape or
  // dtype, truncated file, bad index) is a Status whose message names the field or tensor and
  // the file.
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  CheckpointLayout layout() const { return layout_; }
  bool has_mtp() const { return !weights_.mtp.empty(); }
  // Every tensor of the checkpoint, sorted by name.
  const std::vector<InventoryEntry>& inventory() const { return inventory_; }

 private:
  Checkpoint() = default;
  std::string dir_;
  ModelConfig config_;
  ModelWeights weights_;
  CheckpointLayout layout_ = CheckpointLayout::kDeepSeek;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<InventoryEntry> inventory_;
  friend class CheckpointBinder;
};

// The shards of a checkpoint directory without an index: its regular *.safetensors files, sorted
// by name. Errors: the directory cannot be listed; it holds no such file.
Result<std::vector<std::string>> list_safetensors_shards(const std::string& dir);

}  // namespace dsinfer::model
