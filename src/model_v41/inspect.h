// `dsinfer inspect` for V4.1: the parsed config, the YOCO producer/consumer split, the per-layer
// roles with their KV, top-k and index-key owners, the Engram layers and tables, the state bytes
// per token and per sequence (spec deepseek-v41.md §2, §4.1, §6) and, with a checkpoint, the
// tensor inventory.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/status.h"
#include "model_v41/checkpoint.h"
#include "model_v41/config.h"
#include "model_v41/state_layout.h"

namespace dsinfer::model_v41 {

// The config-derived part (no tensors) as JSON.
nlohmann::json v41_plan_json(const V41Config& c, const StateLayout& s);
// `ck` may be null (config only). json=true writes one JSON object.
Status print_v41_inspect(const V41Config& c, const V41Checkpoint* ck, std::FILE* out, bool json);

}  // namespace dsinfer::model_v41
