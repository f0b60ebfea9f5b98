// Helpers shared by the subcommands: error printing and flag parsing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/numerics.h"
#include "recipe/types.h"

namespace dsinfer::cli {

// Prints "dsinfer: error: <message>" to stderr and returns the exit code for the status.
int fail(const Status& s);
// "0,17,42" -> ids; errors name the offending item.
Result<std::vector<int32_t>> parse_token_ids(const std::string& csv);
Result<model::Numerics> parse_numerics(const std::string& s);
// "512MiB", "2GiB", "8MB", "4096" -> bytes; errors name `flag`.
Result<int64_t> parse_bytes(const std::string& flag, const std::string& s);
// "v4" | "v4-0731" | "v4.1".
Result<recipe::ModelVersion> parse_model_version(const std::string& s);
// --model value, else $DSINFER_MODEL, else the bundled model (models/<name> under the current
// directory or next to the executable's build tree).
std::string resolve_model_dir(const std::string& flag);
inline constexpr const char* kBundledModel = "models/dsv4-mini";

}  // namespace dsinfer::cli
