// `dsinfer inspect`: a human-readable (or JSON) dump of an opened checkpoint: the parsed
// config, the per-layer plan (incl. MTP blocks) and the tensor inventory with per-dtype totals.
#pragma once

#include <cstdio>

#include "base/status.h"
#include "model/checkpoint.h"

namespace dsinfer::model {

// Prints to `out`; json=true writes one JSON object (nlohmann) instead of text.
Status print_inspect(const Checkpoint& ck, std::FILE* out, bool json);

}  // namespace dsinfer::model
