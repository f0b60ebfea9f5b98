// Synthetic checkpoints: a DeepSeek-dialect config.json plus official-layout safetensors with
// random weights for any valid ModelConfig. Used by the loader tests, `dsinfer make-checkpoint`
// and the default model. Also the presets (tiny, real-width V4-Flash), layer truncation, and the
// 2-D FP8 128x128 and MXFP4 weight quantisers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"

namespace dsinfer::model {

enum class SyntheticGenerator {
  // splitmix64 + Box-Muller per tensor, whole shards built in memory, one thread; supports
  // values_out and num_shards. For small models (tests, the tiny preset).
  kReference,
  // For real-width models: a counter-based hash per (seed, tensor, row), so the output does not
  // depend on the thread count; row ranges are generated on `threads` threads and written in
  // place (SafetensorsWriter), so memory stays at a few MB per thread. Approximately normal
  // values (sum of four uniforms) for float tensors; MXFP4 experts are drawn directly as E2M1
  // codes (a discretised normal) with UE8M0 block scales jittered by one binade. Always shards by
  // block: one file for embed/head/norm/hc_head, one per layer, one per MTP block (+ index.json).
  kStreaming,
};

struct SyntheticWriteStats {
  int files = 0;        // safetensors files
  int64_t tensors = 0;  // stored tensors (scales included)
  uint64_t bytes = 0;   // total size of the safetensors files
};

struct SyntheticSpec {
  ModelConfig
      config;  // must be expressible in the DeepSeek dialect (see write_synthetic_checkpoint)
  uint64_t seed = 0;
  // true: FP8 E4M3 128x128 blocks (UE8M0 scales) for the FP8-capable matrices and MXFP4 routed
  // experts, like the official release; false: bf16 for every matrix.
  bool quantized = false;
  bool with_mtp = false;  // write mtp.N.* tensors (config.num_nextn_predict_layers blocks)
  // kReference only: > 1 writes model-0000i-of-0000N.safetensors + index.json.
  int num_shards = 1;
  // kReference only (must be null for kStreaming): receives, for every float-valued tensor
  // written (matrices, norms, mHC, ...), the exact fp32 values the stored tensor represents
  // (after bf16 rounding / dequantisation), keyed by tensor name (the matrix name for quantised
  // weights, not `.scale`).
  std::map<std::string, std::vector<float>>* values_out = nullptr;
  SyntheticGenerator generator = SyntheticGenerator::kReference;
  int threads = 0;  // kStreaming: worker threads; 0 = all hardware threads
  // kStreaming: optional, called with one line (no newline) before writing and per shard done.
  std::function<void(const std::string&)> progress;
  SyntheticWriteStats* stats = nullptr;  // optional: filled on success
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

// Main decoder layers of the real DeepSeek-V4-Flash checkpoint (spec §1.1).
inline constexpr int kV4FlashLayers = 43;

// DeepSeek-V4-Flash at its real widths (spec §1.1: hidden 4096, 64 heads x 512 (rope 64),
// q_lora 1024, o_groups 8 x 1024, window 128, 256 experts top-6 inter 2048 + 1 shared, indexer
// 64 x 128 top-512, vocab 129280, hc 4, YaRN x16 on the compress table, FP8 quantization_config,
// 1 MTP block) keeping the first `layers` main layers of the real schedule (§1.2: sliding,
// sliding, CSA 4, then HCA 128 / CSA 4 alternating; num_hash_layers = min(3, layers)).
// invalid_argument unless 1 <= layers <= kV4FlashLayers.
Result<ModelConfig> v4_flash_preset_config(int layers = kV4FlashLayers);

// The first `layers` main decoder layers of `config` (compress_ratios and hash layers truncated
// consistently, MTP blocks kept), re-parsed from its DeepSeek-dialect config.json so the result
// passes the usual validation. invalid_argument unless 1 <= layers <= num_hidden_layers.
Result<ModelConfig> truncate_layers(const ModelConfig& config, int64_t layers);

// FP8 E4M3 with one UE8M0 scale per 128x128 tile of a row-major [rows, cols] matrix:
// codes [rows*cols], scale bytes [ceil(rows/128) * ceil(cols/128)].
void fp8_block128_quantize(
    const float* w, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scale_bytes);
// MXFP4: packed E2M1 pairs [rows, cols/2] (low nibble = even column) and one UE8M0 scale per 32
// inputs [rows, cols/32]; cols must be a multiple of 32.
void mxfp4_quantize(
    const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scale_bytes);

}  // namespace dsinfer::model
