// Synthetic checkpoints: a DeepSeek-dialect config.json plus official-layout safetensors with
// random weights for any valid ModelConfig. Used by the loader tests, `dsinfer make-checkpoint`
// and the default model. Also the 2-D FP8 128x128 and MXFP4 weight quantisers it uses.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"

namespace dsinfer::model {

struct SyntheticSpec {
  ModelConfig
      config;  // must be expressible in the DeepSeek dialect (see write_synthetic_checkpoint)
  uint64_t seed = 0;
  // true: FP8 E4M3 128x128 blocks (UE8M0 scales) for the FP8-capable matrices and MXFP4 routed
  // experts, like the official release; false: bf16 for every matrix.
  bool quantized = false;
  bool with_mtp = false;  // write mtp.N.* tensors (config.num_nextn_predict_layers blocks)
  int num_shards = 1;     // > 1 writes model-0000i-of-0000N.safetensors + index.json
  // Optional: receives, for every float-valued tensor written (matrices, norms, mHC, ...), the
  // exact fp32 values the stored tensor represents (after bf16 rounding / dequantisation),
  // keyed by tensor name (the matrix name for quantised weights, not `.scale`).
  std::map<std::string, std::vector<float>>* values_out = nullptr;
};

// Writes config.json and the safetensors files into `dir` (created if needed). Fails with
// invalid_argument when the config cannot be written in the DeepSeek dialect (e.g. YaRN on the
// main table, hash layers that are not a prefix, CSA ratio not the smallest compress ratio).
Status write_synthetic_checkpoint(const SyntheticSpec& spec, const std::string& dir);

// The DeepSeek-dialect config.json text for `config` (what write_synthetic_checkpoint writes).
Result<std::string> deepseek_config_json(const ModelConfig& config, bool fp8_quantized);

// A small valid V4 config: hidden 64, 4 heads x 128 (rope 64), q_lora 32, o_groups 2 x 32,
// window 8, layers [sliding, CSA(4), HCA(16), CSA(4), HCA(16)], 2 hash layers, 4 experts top-2,
// inter 32, indexer 2 heads x 64 top-3, vocab 512, hc 4, YaRN on the compress table, 1 MTP block.
ModelConfig tiny_preset_config();

// FP8 E4M3 with one UE8M0 scale per 128x128 tile of a row-major [rows, cols] matrix:
// codes [rows*cols], scale bytes [ceil(rows/128) * ceil(cols/128)].
void fp8_block128_quantize(
    const float* w, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scale_bytes);
// MXFP4: packed E2M1 pairs [rows, cols/2] (low nibble = even column) and one UE8M0 scale per 32
// inputs [rows, cols/32]; cols must be a multiple of 32.
void mxfp4_quantize(
    const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scale_bytes);

}  // namespace dsinfer::model
