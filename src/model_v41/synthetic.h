// Synthetic V4.1 checkpoints: config.json plus safetensors with random weights in either layout
// (official: FP8 32x32 tiles + E8M0, MXFP4 experts, BF16/F32 as spec §8.3; transformers: the
// port's save_pretrained names with F32 tensors). Used by the loader tests; presets for a tiny
// config and the real V4.1-Flash config (config only: its weights are 500 GB).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "model_v41/checkpoint.h"

namespace dsinfer::model_v41 {

// The official config.json of DeepSeek-V4.1-Flash (spec §1).
nlohmann::json v41_flash_config_json();
// A tiny config with every V4.1 mechanism: 8 layers (producers 0-4, consumers 5-7), KV owners
// 2 and 5, a Reindex layer 7 with the candidate pool of 5, Engram at 1 and 3, one DSpark block.
// `official`: the composite official form; otherwise the port's text config.
nlohmann::json v41_tiny_config_json(bool official);

struct V41SyntheticSpec {
  nlohmann::json config;
  V41Layout layout = V41Layout::kOfficial;
  uint64_t seed = 1;
  bool with_dspark = true;   // write mtp.* when the config has DSpark blocks
  bool with_vision = false;  // add a few vision / aligner / image tensors (to be skipped)
};

struct V41TensorSpec {
  std::string name;  // canonical (official) name
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// Every tensor an official-layout checkpoint of `c` holds (scales included), in a stable order.
std::vector<V41TensorSpec> v41_official_tensors(const V41Config& c, bool with_dspark);

Status write_v41_synthetic(const V41SyntheticSpec& spec, const std::string& dir);

// DeepSeek-V4.1-Flash at its real widths with `layers` backbone layers (4..40) that keep both
// YOCO halves: layers 0-1 window-only (Engram at 1), round((layers - 2) * 18 / 38) ratio-2
// producers (KV owners 2, 8, 14 where present, Engram at min(14, last producer)), the rest ratio-1
// consumers (KV owner and candidate source = the boundary, Reindex every 4th layer after it),
// DSpark targets = the last min(3, consumers) layers. 40 gives the published schedule. Engram
// tables are small (bucket primes from `engram_vocab_size`, default 1000: ~24k rows per layer)
// unless real_engram_rows (primes from 16,000,000: 94 GiB per table).
Result<nlohmann::json> v41_flash_preset_config(int layers, bool real_engram_rows);

struct V41StreamStats {
  int files = 0;
  int64_t tensors = 0;
  uint64_t bytes = 0;
};

// Writes an official-layout checkpoint of `config` with random weights streamed to disk: one shard
// per block (globals, each layer, each DSpark block) + model.safetensors.index.json, every
// tensor generated row by row from a counter-based hash (independent of `threads`), FP8 tiles and
// MXFP4 / Engram rows drawn directly as codes with jittered power-of-two scales; and, when the
// config has Engram layers, engram_token_map.json with synthetic_engram_token_map(config, seed)
// (there is no tokenizer to derive it from; the backends need one to open the directory).
Status write_v41_streaming(const nlohmann::json& config,
                           uint64_t seed,
                           int threads,
                           const std::string& dir,
                           V41StreamStats* stats);

}  // namespace dsinfer::model_v41
