// The dsinfer subcommands. Each registers its flags on a CLI11 app and returns the callback's
// exit code through `exit_code`.
#pragma once

#include <CLI/CLI.hpp>

namespace dsinfer::cli {

void add_inspect_command(CLI::App& app, int& exit_code);
void add_score_command(CLI::App& app, int& exit_code);
void add_make_checkpoint_command(CLI::App& app, int& exit_code);
void add_tokenize_command(CLI::App& app, int& exit_code);
void add_detokenize_command(CLI::App& app, int& exit_code);
void add_generate_command(CLI::App& app, int& exit_code);
void add_recipe_command(CLI::App& app, int& exit_code);
void add_serve_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);

}  // namespace dsinfer::cli
