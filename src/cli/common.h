// Helpers shared by the subcommands: error printing and flag parsing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/numerics.h"

namespace dsinfer::cli {

// Prints "dsinfer: error: <message>" to stderr and returns the exit code for the status.
int fail(const Status& s);
// "0,17,42" -> ids; errors name the offending item.
Result<std::vector<int32_t>> parse_token_ids(const std::string& csv);
Result<model::Numerics> parse_numerics(const std::string& s);

}  // namespace dsinfer::cli
