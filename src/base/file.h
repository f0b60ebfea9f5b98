// Whole-file reads with clear errors (missing file, unreadable, too large).
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace dsinfer {

// Reads `path` into memory. not_found for a missing file, io_error for other failures,
// invalid_argument when the file is larger than max_bytes.
Result<std::string> read_text_file(const std::string& path, uint64_t max_bytes);

}  // namespace dsinfer
