// `dsinfer bench --device cpu`: prefill and decode speed of the CPU backend, the fast path and
// the reference side by side in one run (same checkpoint, same machine, same inputs), as JSON.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/model.h"
#include "base/status.h"

namespace dsinfer::cli {

struct CpuBenchArgs {
  std::string model_dir;
  std::string numerics = "reference";
  std::vector<std::string> kernels = {"fast", "reference"};
  std::vector<int64_t> prefill = {64, 512};
  std::vector<int64_t> decode_batch = {1, 8, 64};
  int64_t context = 128;
  int64_t decode_steps = 8;
  int64_t repeats = 2;
  int threads = 0;
  int64_t prefill_keep_rows = 0;  // DeepSeek V4.1: also time the prefill early exit
  int cuda_device = -1;  // DeepSeek V4.1: >= 0 runs the CUDA V4.1 backend on that GPU instead
  // DeepSeek V4.1: the Engram placement (auto | host | mapped | device), and with engram_compare
  // (CUDA) each decode batch timed twice in one process, rows gathered on the host then on the
  // device, with the step-time ratio.
  std::string engram_placement = "auto";
  bool engram_compare = false;
  std::string state_memory = "1GiB";  // the budget the state footprint's context is given for
  std::string output;
};

int run_cpu_bench(const CpuBenchArgs& a);

// The sequence-state footprint of m's model (engine::state_footprint) in pages of page_bytes, and
// the context one sequence fits in `state_memory` (a --state-memory size), as the "state" object
// of `bench`'s JSON; also printed on stderr.
Result<nlohmann::ordered_json> state_footprint_json(const backend::Model& m,
                                                    int64_t page_bytes,
                                                    const std::string& state_memory);
// The same on a DeepSeek V4.1 checkpoint (bench_cpu_v41.cc); run_cpu_bench calls it, and `bench
// --device cuda` on a V4.1 checkpoint (a.cuda_device >= 0: the CUDA V4.1 backend).
int run_cpu_bench_v41(const CpuBenchArgs& a, const std::string& model_dir);

// The `bench` subcommand of a build without CUDA (CPU only).
void add_cpu_bench_command(CLI::App& app, int& exit_code);

}  // namespace dsinfer::cli
