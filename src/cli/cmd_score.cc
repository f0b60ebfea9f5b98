// `dsinfer score`: logits at every position of a token sequence, written as safetensors.
// The stable external checking interface (other checks depend on its flags and output).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/strings.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/checkpoint.h"
#include "tensor/safetensors.h"

namespace dsinfer::cli {

namespace {
struct ScoreArgs {
  std::string model_dir;
  std::string input_ids;
  std::string output;
  int64_t chunk = 0;
  std::string numerics = "reference";
  std::string device = "cpu";
  std::string cpu_kernels = "reference";
  bool mtp = false;
};

int run_score(const ScoreArgs& args) {
  auto ids = parse_token_ids(args.input_ids);
  if (!ids.ok())
    return fail(ids.status());
  auto numerics = parse_numerics(args.numerics);
  if (!numerics.ok())
    return fail(numerics.status());
  engine::EngineConfig ec;
  ec.numerics = *numerics;
  if (Status s = parse_device(args.device, &ec); !s.ok())
    return fail(s);
  auto kernels = parse_cpu_kernels(args.cpu_kernels);
  if (!kernels.ok())
    return fail(kernels.status());
  ec.cpu_kernels = *kernels;
  if (args.chunk < 0)
    return fail(invalid_argument("--chunk must be >= 1"));
  auto ckpt = model::Checkpoint::open(args.model_dir);
  if (!ckpt.ok())
    return fail(ckpt.status());
  const model::ModelConfig& cfg = (*ckpt)->config();
  if (args.mtp && !(*ckpt)->has_mtp()) {
    return fail(
        failed_precondition("--mtp: the checkpoint in " + args.model_dir + " has no MTP weights"));
  }
  auto model = engine::create_model(ec, cfg, (*ckpt)->weights());
  if (!model.ok())
    return fail(model.status());
  auto arena =
      state::PageArena::growable(state::default_page_bytes(cfg), (*model)->state_storage());
  state::SequenceState st(cfg, arena.get(), 0, 0);
  const int64_t total = static_cast<int64_t>(ids->size());
  const int64_t chunk = args.chunk == 0 ? total : args.chunk;
  std::vector<float> logits;
  std::vector<float> mtp_logits;
  logits.reserve(static_cast<size_t>(total * cfg.vocab_size));
  backend::ForwardOptions opts;
  opts.run_mtp = args.mtp;
  backend::ForwardOutputs out;
  for (int64_t begin = 0; begin < total; begin += chunk) {
    const int64_t n = std::min(chunk, total - begin);
    std::span<const int32_t> span(ids->data() + begin, static_cast<size_t>(n));
    Status s = (*model)->forward(st, span, opts, &out);
    if (!s.ok())
      return fail(s);
    logits.insert(logits.end(), out.logits.begin(), out.logits.end());
    mtp_logits.insert(mtp_logits.end(), out.mtp_logits.begin(), out.mtp_logits.end());
  }
  std::vector<TensorToWrite> tensors;
  tensors.push_back(f32_tensor("logits", {total, cfg.vocab_size}, logits));
  if (args.mtp) {
    tensors.push_back(
        f32_tensor("mtp_logits", {std::max<int64_t>(0, total - 1), cfg.vocab_size}, mtp_logits));
  }
  Status s = write_safetensors(args.output,
                               tensors,
                               {{"numerics", model::numerics_name(*numerics)},
                                {"chunk", std::to_string(chunk)},
                                {"device", args.device}});
  if (!s.ok())
    return fail(s);
  std::fprintf(stderr,
               "dsinfer score: %lld tokens, %s numerics, %s, chunk %lld -> %s\n",
               static_cast<long long>(total),
               model::numerics_name(*numerics),
               (*model)->name(),
               static_cast<long long>(chunk),
               args.output.c_str());
  return 0;
}
}  // namespace

void add_score_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ScoreArgs>();
  CLI::App* cmd = app.add_subcommand("score", "Write the logits at every position of a sequence");
  cmd->add_option("--model", args->model_dir, "Model directory")->required();
  cmd->add_option("--input-ids", args->input_ids, "Comma-separated token ids, e.g. 0,17,42")
      ->required();
  cmd->add_option("--output", args->output, "Output .safetensors (tensor `logits` [T, vocab])")
      ->required();
  cmd->add_option("--chunk",
                  args->chunk,
                  "Feed the prompt N tokens at a time through the incremental path (1 = token by "
                  "token); default: one full forward");
  cmd->add_option("--numerics", args->numerics, "reference | deepseek");
  cmd->add_option(
      "--cpu-kernels", args->cpu_kernels, "--device cpu: reference (default: the oracle) | fast");
  cmd->add_option("--device", args->device, "cpu | cuda | cuda:N");
  cmd->add_flag("--mtp",
                args->mtp,
                "Also write `mtp_logits` [T-1, vocab]: the MTP block's prediction of token i+2");
  cmd->callback([args, &exit_code] { exit_code = run_score(*args); });
}

}  // namespace dsinfer::cli
