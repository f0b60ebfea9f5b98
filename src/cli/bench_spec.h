// `dsinfer bench --speculative MODES`: decode tokens/s through the engine for each speculative
// mode (off, fixed:K, auto) at each batch size, with the acceptance rate per draft position, the
// mean accepted length and the mean verify length, as JSON and a table on stderr. Same
// checkpoint, same requests (greedy; random token ids, or windows of a text with --prompt-text),
// same run for every mode, so that the
// ratios to `off` are what the run measures; one mode after the other (each engine holds its own
// weights), or with `interleave` every engine at once and the rounds round-robin over the modes.
// Every measurement covers at least 16 different prompts (waves of b requests at batch sizes
// below 16), new ones each round: greedy decoding of one prompt is a single deterministic
// sequence, not a measure of the drafter. tokens/s is timed while all b requests of a wave
// decode (the batch is b); the whole waves' figure, tails included, is reported beside it.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace dsinfer::cli {

struct SpecBenchArgs {
  std::string model_dir;
  std::string device = "cpu";
  std::string cpu_kernels = "fast";
  std::string numerics = "auto";  // resolve_numerics: deepseek on CUDA, reference on the CPU
  int cpu_threads = 0;
  // "off", "fixed:K", "auto"; "all" = off, fixed:1..5, auto.
  std::vector<std::string> modes = {"all"};
  std::vector<int64_t> batch = {1, 16, 64};
  int64_t prompt = 32;  // prompt tokens per request
  // A text file: prompts are windows of `prompt` tokens of it (the model's tokenizer.json) at
  // seeded offsets instead of random token ids (natural text: the drafter's real acceptance).
  std::string prompt_text;
  int64_t generate = 96;                // tokens generated per request
  int64_t repeats = 3;                  // rounds over every (batch, mode)
  int64_t warmup = 3;                   // untimed rounds first, per mode (steady state)
  std::string state_memory = "512MiB";  // per engine (one engine per mode)
  // Every mode's engine alive at once, each round running every mode in turn (a drift of the
  // machine's speed spreads over the modes instead of falling on the last ones); needs the
  // memory for every mode's weights and state.
  bool interleave = false;
  double forced_acceptance = 0;  // EngineConfig::forced_acceptance (0: the drafter's own)
  bool async_scheduling = true;  // EngineConfig::async_scheduling (the command line's default)
  std::string output;
};

// The modes `all` stands for, and the modes a list names (each checked by spec::parse_config).
Result<std::vector<std::string>> expand_spec_modes(const std::vector<std::string>& modes);

int run_spec_bench(const SpecBenchArgs& a);

// The flags of `bench --speculative` that both builds' bench commands take alike (the modes,
// --warmup, --prompt-text, --interleave-modes, --forced-acceptance, --no-async-scheduling):
// registered on `cmd`, read
// into the SpecBenchArgs they configure by apply().
struct SpecBenchFlags {
  std::vector<std::string> modes;
  int64_t warmup = 3;
  std::string prompt_text;
  bool interleave = false;
  double forced_acceptance = 0;
  bool no_async = false;
  CLI::Option* speculative = nullptr;  // --speculative (count() > 0: the speculative bench)

  void add_to(CLI::App* cmd);
  void apply(SpecBenchArgs* s) const;
};

}  // namespace dsinfer::cli
