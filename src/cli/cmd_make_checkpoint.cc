// `dsinfer make-checkpoint`: random-weight checkpoints in the official DeepSeek format.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/synthetic.h"

namespace dsinfer::cli {

void add_make_checkpoint_command(CLI::App& app, int& exit_code) {
  struct Args {
    std::string preset = "tiny";
    std::string out;
    uint64_t seed = 0;
    bool bf16 = false;
    bool no_mtp = false;
    int shards = 1;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "make-checkpoint", "Write a random-weight V4 checkpoint (official FP8/MXFP4 layout)");
  cmd->add_option("--preset", args->preset, "tiny (a small V4 with every layer type)");
  cmd->add_option("--out", args->out, "Output directory")->required();
  cmd->add_option("--seed", args->seed, "Random seed");
  cmd->add_flag("--bf16", args->bf16, "Store matrices in bf16 instead of FP8/MXFP4");
  cmd->add_flag("--no-mtp", args->no_mtp, "Leave out the MTP block");
  cmd->add_option("--shards", args->shards, "Number of safetensors shards (index json when > 1)");
  cmd->callback([args, &exit_code] {
    if (args->preset != "tiny") {
      exit_code = fail(
          invalid_argument("--preset: unknown preset `" + args->preset + "` (available: tiny)"));
      return;
    }
    if (args->shards < 1) {
      exit_code = fail(invalid_argument("--shards must be >= 1"));
      return;
    }
    model::SyntheticSpec spec;
    spec.config = model::tiny_preset_config();
    spec.seed = args->seed;
    spec.quantized = !args->bf16;
    spec.with_mtp = !args->no_mtp;
    spec.num_shards = args->shards;
    Status s = model::write_synthetic_checkpoint(spec, args->out);
    if (!s.ok()) {
      exit_code = fail(s);
      return;
    }
    std::fprintf(stderr,
                 "dsinfer make-checkpoint: wrote %s (preset %s, seed %llu)\n",
                 args->out.c_str(),
                 args->preset.c_str(),
                 static_cast<unsigned long long>(args->seed));
    exit_code = 0;
  });
}

}  // namespace dsinfer::cli
