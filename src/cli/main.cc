// dsinfer: command-line entry point (vLLM-like subcommands).
#include <cstdio>

#include "cli/bench_cpu.h"
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
  dsinfer::cli::add_cpu_bench_command(app, exit_code);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
