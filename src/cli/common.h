// Helpers shared by the subcommands: error printing and flag parsing.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu_v41/engram_store.h"
#include "base/status.h"
#include "engine/engine.h"
#include "model/numerics.h"
#include "recipe/types.h"

namespace dsinfer::cli {

// The process's command line (set once by main): ranks of `--ep N` re-run it.
void set_program_args(int argc, char** argv);
const std::vector<std::string>& program_args();

// Prints "dsinfer: error: <message>" to stderr and returns the exit code for the status.
int fail(const Status& s);
// A command's JSON (or other text) result: on stdout when `path` is empty, else written to
// `path` (an --output flag; "[<tag>] wrote <path>" on stderr). The process exit code.
int write_output(const std::string& text, const std::string& path, const char* tag);
// "0,17,42" -> ids; errors name the offending item.
Result<std::vector<int32_t>> parse_token_ids(const std::string& csv);
Result<model::Numerics> parse_numerics(const std::string& s);
// --numerics of the engine commands: "auto" (or empty) is deepseek on CUDA (the production
// FP8/FP4 path the GPU kernels are built for) and reference on the CPU; else parse_numerics.
Result<model::Numerics> resolve_numerics(const std::string& s, engine::Device device);
// "512MiB", "2GiB", "8MB", "4096" -> bytes; errors name `flag`.
Result<int64_t> parse_bytes(const std::string& flag, const std::string& s);
// "cpu" | "cuda" | "cuda:N" -> the engine's device and ordinal.
Status parse_device(const std::string& s, engine::EngineConfig* config);
// "v4" | "v4-0731" | "v4.1".
Result<recipe::ModelVersion> parse_model_version(const std::string& s);
// --model value, else $DSINFER_MODEL, else the bundled model (models/<name> under the current
// directory or next to the executable's build tree).
std::string resolve_model_dir(const std::string& flag);
inline constexpr const char* kBundledModel = "models/dsv4-mini";

// The model and engine flags that `generate` and `serve` share.
struct EngineFlags {
  std::string model_dir;
  std::string numerics = "auto";  // resolve_numerics: deepseek on CUDA, reference on the CPU
  std::string state_memory = "1GiB";
  int64_t max_num_seqs = 64;
  int64_t max_tokens_per_step = 256;
  int64_t max_model_len = 0;              // 0 = the model's
  std::string model_version = "auto";     // auto: v4.1 for a V4.1 checkpoint, else v4
  int64_t prefill_keep_rows = 0;          // V4.1 prefill early exit (0 = exact)
  std::string engram_placement = "auto";  // V4.1: auto | host | mapped | device
  std::string device = "cpu";
  std::string cpu_kernels = "fast";
  int cpu_threads = 0;
  bool no_cuda_graphs = false;
  bool batch_invariant = false;
  bool async_scheduling = true;  // --no-async-scheduling
  int ep = 0;
  std::string speculative;  // empty: auto where the checkpoint has a drafter
};
void add_engine_flags(CLI::App* cmd, EngineFlags* f);
// --speculative (empty: auto where the checkpoint has a drafter, off elsewhere).
Status parse_speculative(const std::string& flag, engine::EngineConfig* config);
// --engram-placement: auto | host | mapped | device (device only with a CUDA device); errors
// name the flag.
Result<cpu_v41::EngramPlacement> parse_engram_placement_flag(const std::string& s,
                                                             engine::Device device);
// "reference" | "fast" (--cpu-kernels).
Result<engine::CpuKernels> parse_cpu_kernels(const std::string& s);

struct EngineSetup {
  engine::EngineConfig config;  // model_dir resolved (flag, $DSINFER_MODEL, bundled model)
  recipe::ModelVersion version = recipe::ModelVersion::kV4;
};
// Validates the flags; errors name the flag.
Result<EngineSetup> resolve_engine_flags(const EngineFlags& f);

}  // namespace dsinfer::cli
