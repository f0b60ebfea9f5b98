// `dsinfer inspect`: parsed config, per-layer plan and tensor inventory of a checkpoint.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/checkpoint.h"
#include "model/inspect.h"

namespace dsinfer::cli {

void add_inspect_command(CLI::App& app, int& exit_code) {
  struct Args {
    std::string model_dir;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("inspect", "Print a checkpoint's config, layer plan and tensors");
  cmd->add_option("--model", args->model_dir, "Model directory")->required();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->callback([args, &exit_code] {
    auto ckpt = model::Checkpoint::open(args->model_dir);
    if (!ckpt.ok()) {
      exit_code = fail(ckpt.status());
      return;
    }
    Status s = model::print_inspect(**ckpt, stdout, args->json);
    exit_code = s.ok() ? 0 : fail(s);
  });
}

}  // namespace dsinfer::cli
