// Host-only launcher of the ranks of one job on one host: the same binary N times, one process
// per GPU (`dsinfer serve|generate --ep N`). No CUDA, no NCCL.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/status.h"

namespace dsinfer::comm {

// Starts n processes of argv (argv[0]: the binary, a path or a name looked up in PATH) with the
// parent's environment plus DSINFER_EP_RANK=r, DSINFER_EP_SIZE=n, DSINFER_EP_ID_FILE=id_file and
// CUDA_VISIBLE_DEVICES set so that rank r sees exactly one GPU, as device 0: the r-th entry of
// the parent's CUDA_VISIBLE_DEVICES when that is set (it must list at least n devices), else r.
// A stale file at id_file is removed first. posix_spawn (safe in a multi-threaded parent); the
// children stay in the parent's process group (a terminal's Ctrl-C reaches them). When rank r
// cannot be started, the ranks already started are killed and reaped, and the error names r.
// Returns the pids, index = rank.
Result<std::vector<pid_t>> spawn_ranks(int n,
                                       const std::vector<std::string>& argv,
                                       const std::string& id_file);

// Waits for every rank. All exit with status 0: OK. Otherwise returns the first failure seen (a
// non-zero exit code or a signal), naming the rank and pid, after sending SIGTERM to the ranks
// still running, SIGKILL to those still running after grace_ms, and reaping them all. Ranks
// killed that way are not reported. kInternal.
Status wait_ranks(const std::vector<pid_t>& pids, int grace_ms = 10'000);

}  // namespace dsinfer::comm
