// How the ranks of one job agree on the NCCL unique id (host only, no CUDA, no NCCL).
//
// One host, one process per GPU: the launcher (`dsinfer ... --ep N`, spawn_ranks in
// comm/launcher.h) picks a fresh file path and passes it to every rank in DSINFER_EP_ID_FILE,
// with DSINFER_EP_RANK and DSINFER_EP_SIZE. Rank 0 creates the id and publishes it atomically
// (write a temporary file, then rename it over the path); the other ranks poll for the file
// until a timeout. The file holds the 128 id bytes, nothing else.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "base/status.h"

namespace dsinfer::comm {

// Environment of a rank (set by spawn_ranks).
inline constexpr const char* kEnvRank = "DSINFER_EP_RANK";          // 0 .. size-1
inline constexpr const char* kEnvSize = "DSINFER_EP_SIZE";          // 1 .. kMaxRanks
inline constexpr const char* kEnvIdFile = "DSINFER_EP_ID_FILE";     // path of the id file
inline constexpr const char* kEnvTimeout = "DSINFER_EP_TIMEOUT_S";  // optional, seconds
inline constexpr int kMaxRanks = 1024;
inline constexpr int64_t kDefaultTimeoutMs = 300'000;

// NCCL_UNIQUE_ID_BYTES (checked against nccl.h where NCCL is used).
inline constexpr size_t kUniqueIdBytes = 128;
using UniqueId = std::array<char, kUniqueIdBytes>;

struct Bootstrap {
  int rank = 0;
  int size = 1;
  std::string id_file;                     // where rank 0 publishes the id
  int64_t timeout_ms = kDefaultTimeoutMs;  // how long ranks wait for the id and for NCCL init
};

// True when the process was started as a rank (DSINFER_EP_RANK is set).
bool rank_env_present();

// Reads and validates DSINFER_EP_RANK, DSINFER_EP_SIZE, DSINFER_EP_ID_FILE and the optional
// DSINFER_EP_TIMEOUT_S. Errors (kInvalidArgument) name the variable: missing, not an integer,
// out of range, empty path.
Result<Bootstrap> bootstrap_from_env();

// Writes `id` to `path` atomically: `path`.tmp.<pid>, then rename(2) over `path` (readers see
// the whole id or no file).
Status publish_unique_id(const std::string& path, const UniqueId& id);

// Polls for `path` (every few milliseconds) until it exists, then reads the id. kNotFound after
// timeout_ms without the file; kDataLoss when it does not hold exactly kUniqueIdBytes bytes.
Result<UniqueId> await_unique_id(const std::string& path, int64_t timeout_ms);

// A fresh id file path for a launcher: "<$TMPDIR or /tmp>/dsinfer-ep-XXXXXX/nccl_id" (the
// directory is created, the file is not).
Result<std::string> make_id_file_path();

// Removes the id file, temporary files left next to it, and its directory when it was made by
// make_id_file_path (named dsinfer-ep-*). A missing file is not an error.
Status remove_id_file(const std::string& path);

}  // namespace dsinfer::comm
