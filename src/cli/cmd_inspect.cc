// `dsinfer inspect`: parsed config, per-layer plan and tensor inventory of a checkpoint.
#include <cstdio>
#include <memory>
#include <string>

#include "base/file.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/checkpoint.h"
#include "model/inspect.h"
#include "model_v41/checkpoint.h"
#include "model_v41/inspect.h"

namespace dsinfer::cli {

void add_inspect_command(CLI::App& app, int& exit_code) {
  struct Args {
    std::string model_dir;
    bool json = false;
    bool config_only = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("inspect", "Print a checkpoint's config, layer plan and tensors");
  cmd->add_option("--model", args->model_dir, "Model directory")->required();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->add_flag("--config-only",
                args->config_only,
                "V4.1: print the config-derived plan and state sizes without opening the tensors");
  cmd->callback([args, &exit_code] {
    // DeepSeek V4.1 checkpoints (model_type deepseek_v41 / deepseek_v41_text).
    auto text = read_text_file(args->model_dir + "/config.json", uint64_t{1} << 26);
    if (text.ok() && model_v41::is_v41_config_text(*text)) {
      if (args->config_only) {
        auto cfg = model_v41::parse_v41_config(*text, args->model_dir + "/config.json");
        if (!cfg.ok()) {
          exit_code = fail(cfg.status());
          return;
        }
        Status s = model_v41::print_v41_inspect(*cfg, nullptr, stdout, args->json);
        exit_code = s.ok() ? 0 : fail(s);
        return;
      }
      auto ck = model_v41::V41Checkpoint::open(args->model_dir);
      if (!ck.ok()) {
        exit_code = fail(ck.status());
        return;
      }
      Status s = model_v41::print_v41_inspect((*ck)->config(), ck->get(), stdout, args->json);
      exit_code = s.ok() ? 0 : fail(s);
      return;
    }
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
