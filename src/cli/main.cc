// dsinfer: command-line entry point (vLLM-like subcommands).
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"

int main(int argc, char** argv) {
  CLI::App app{"dsinfer: inference engine for DeepSeek V4 models"};
  app.require_subcommand(1);
  dsinfer::cli::set_program_args(argc, argv);
  int exit_code = 0;
  dsinfer::cli::add_inspect_command(app, exit_code);
  dsinfer::cli::add_score_command(app, exit_code);
  dsinfer::cli::add_make_checkpoint_command(app, exit_code);
  dsinfer::cli::add_tokenize_command(app, exit_code);
  dsinfer::cli::add_detokenize_command(app, exit_code);
  dsinfer::cli::add_generate_command(app, exit_code);
  dsinfer::cli::add_recipe_command(app, exit_code);
#ifdef DSINFER_HAVE_SERVER
  dsinfer::cli::add_serve_command(app, exit_code);
#endif
#ifdef DSINFER_HAVE_BENCH
  dsinfer::cli::add_bench_command(app, exit_code);
#else
  app.add_subcommand("bench", "Measure GPU speed (needs a CUDA build)")
      ->allow_extras()
      ->callback([&exit_code] {
        exit_code = dsinfer::cli::fail(dsinfer::Status(
            dsinfer::StatusCode::kUnimplemented,
            "bench: this build has no CUDA backend (configure with -DDSINFER_CUDA=ON)"));
      });
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
