// `dsinfer score`: logits at every position of a token sequence, written as safetensors.
// The stable external checking interface (other checks depend on its flags and output).
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu_v41/backend.h"
#include "backend/cpu_v41/model.h"
#if DSINFER_HAVE_CUDA_BACKEND
#include "backend/cuda_v41/backend.h"
#endif
#include "base/file.h"
#include "base/strings.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/checkpoint.h"
#include "model_v41/checkpoint.h"
#include "model_v41/engram.h"
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
  int64_t keep_rows = 0;
  std::string engram_token_map;
};

// DeepSeek V4.1 on the CPU (cpu_v41::V41CpuModel) or, with --device cuda, on the CUDA V4.1
// backend: whole prompt, chunks, or prefill early exit.
int run_score_v41(const ScoreArgs& args,
                  const std::vector<int32_t>& ids,
                  model::Numerics numerics,
                  const engine::EngineConfig& ec) {
  const bool gpu = ec.device == engine::Device::kCuda;
#if !DSINFER_HAVE_CUDA_BACKEND
  if (gpu)
    return fail(unimplemented("--device cuda: this build has no CUDA backend"));
#endif
  if (args.mtp)
    return fail(unimplemented("--mtp: V4.1 has DSpark blocks, not an MTP head"));
  if (args.chunk < 0 || args.keep_rows < 0)
    return fail(invalid_argument("--chunk and --keep-rows must be >= 1"));
  auto ck = model_v41::V41Checkpoint::open(args.model_dir);
  if (!ck.ok())
    return fail(ck.status());
  const model_v41::V41Config& cfg = (*ck)->config();
  std::vector<int32_t> phi;
  if (!cfg.engram_layer_ids.empty()) {
    const std::string path = args.engram_token_map.empty()
                                 ? args.model_dir + "/engram_token_map.json"
                                 : args.engram_token_map;
    auto m = model_v41::load_engram_token_map(path, cfg);
    if (!m.ok()) {
      return fail(m.status().with_context(
          "the Engram token map (write it with tools/reference/v41/engram_token_map.py)"));
    }
    phi = std::move(m).value();
  }
  auto hash = cpu_v41::EngramHashParams::from_config(cfg, std::move(phi));
  if (!hash.ok())
    return fail(hash.status());
  std::function<Status(
      std::span<const int32_t>, const cpu_v41::PrefillExit*, cpu_v41::ForwardResult*)>
      step;
  std::unique_ptr<cpu_v41::V41CpuModel> model;
  cpu_v41::V41SequenceState st;
#if DSINFER_HAVE_CUDA_BACKEND
  std::unique_ptr<gpu_v41::CudaV41Backend> g;
  std::unique_ptr<state::PageArena> garena;
  std::unique_ptr<state::SequenceState> gst;
  if (gpu) {
    cpu_v41::V41BackendOptions o;
    o.numerics = numerics;
    o.engram_token_map = args.engram_token_map;
    gpu_v41::CudaV41Options co;
    co.device = ec.device_ordinal;
    auto opened = gpu_v41::CudaV41Backend::open(args.model_dir, o, co);
    if (!opened.ok())
      return fail(opened.status());
    g = std::move(opened).value();
    const state::StateShape& shape = *g->state_shape();
    garena = state::PageArena::growable(state::default_page_bytes(shape), g->state_storage());
    gst = std::make_unique<state::SequenceState>(shape, garena.get(), 0);
    step = [&](std::span<const int32_t> t,
               const cpu_v41::PrefillExit* e,
               cpu_v41::ForwardResult* r) { return g->forward_v41(*gst, t, e, r, false); };
  }
#endif
  if (!gpu) {
    model = std::make_unique<cpu_v41::V41CpuModel>(
        cfg, (*ck)->weights(), std::move(hash).value(), numerics);
    st = cpu_v41::make_v41_state(cfg);
    step = [&](std::span<const int32_t> t,
               const cpu_v41::PrefillExit* e,
               cpu_v41::ForwardResult* r) { return model->forward(st, t, e, r); };
  }
  const int64_t total = static_cast<int64_t>(ids.size());
  const int64_t chunk = args.chunk == 0 ? total : args.chunk;
  cpu_v41::PrefillExit exit{total, args.keep_rows};
  std::vector<float> logits;
  int64_t first_row = -1;
  for (int64_t begin = 0; begin < total; begin += chunk) {
    const int64_t n = std::min(chunk, total - begin);
    cpu_v41::ForwardResult r;
    Status s = step(std::span(ids).subspan(static_cast<size_t>(begin), static_cast<size_t>(n)),
                    args.keep_rows > 0 ? &exit : nullptr,
                    &r);
    if (!s.ok())
      return fail(s);
    if (r.placeholder)
      continue;
    if (first_row < 0)
      first_row = begin + r.first_row;
    logits.insert(logits.end(), r.logits.begin(), r.logits.end());
  }
  const int64_t rows = static_cast<int64_t>(logits.size()) / cfg.vocab_size;
  Status s = write_safetensors(args.output,
                               {f32_tensor("logits", {rows, cfg.vocab_size}, logits)},
                               {{"numerics", model::numerics_name(numerics)},
                                {"chunk", std::to_string(chunk)},
                                {"device", gpu ? "cuda" : "cpu"},
                                {"first_position", std::to_string(first_row)},
                                {"keep_rows", std::to_string(args.keep_rows)}});
  if (!s.ok())
    return fail(s);
  std::fprintf(stderr,
               "dsinfer score: %lld tokens, V4.1, %s numerics, %s, chunk %lld%s -> %s (logits of "
               "positions %lld..%lld)\n",
               static_cast<long long>(total),
               model::numerics_name(numerics),
               gpu ? "cuda" : "cpu",
               static_cast<long long>(chunk),
               args.keep_rows > 0 ? ", prefill early exit" : "",
               args.output.c_str(),
               static_cast<long long>(first_row),
               static_cast<long long>(first_row + rows - 1));
  return 0;
}

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
  if (auto text = read_text_file(args.model_dir + "/config.json", uint64_t{1} << 26);
      text.ok() && model_v41::is_v41_config_text(*text)) {
    return run_score_v41(args, *ids, *numerics, ec);
  }
  if (args.keep_rows > 0 || !args.engram_token_map.empty())
    return fail(invalid_argument("--keep-rows and --engram-token-map apply to V4.1 checkpoints"));
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
  state::SequenceState st(cfg, arena.get(), 0, 0, (*model)->row_format());
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
  cmd->add_option("--keep-rows",
                  args->keep_rows,
                  "V4.1: prefill early exit, the consumer half on the last K prompt rows only "
                  "(K >= window + 6; DeepSeek uses 140); `logits` then holds those rows only "
                  "(prompt logprobs are unavailable in that mode)");
  cmd->add_option("--engram-token-map",
                  args->engram_token_map,
                  "V4.1: the Engram compressed token map JSON (default: "
                  "<model>/engram_token_map.json; tools/reference/v41/engram_token_map.py)");
  cmd->callback([args, &exit_code] { exit_code = run_score(*args); });
}

}  // namespace dsinfer::cli
