// Shared CLI helpers.
#include "cli/common.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "backend/cpu_v41/backend.h"
#include "base/strings.h"

namespace dsinfer::cli {

int fail(const Status& s) {
  std::fprintf(stderr, "dsinfer: error: %s\n", s.message().c_str());
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kFailedPrecondition:
      return 2;
    default:
      return 1;
  }
}

int write_output(const std::string& text, const std::string& path, const char* tag) {
  if (path.empty()) {
    std::printf("%s\n", text.c_str());
    return 0;
  }
  std::ofstream f(path);
  if (!f)
    return fail(io_error("--output: cannot write " + path));
  f << text << "\n";
  std::fprintf(stderr, "[%s] wrote %s\n", tag, path.c_str());
  return 0;
}

Result<std::vector<int32_t>> parse_token_ids(const std::string& csv) {
  std::vector<int32_t> ids;
  const std::vector<std::string> parts = str_split(csv, ',');
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string p = parts[i];
    while (!p.empty() && p.front() == ' ') p.erase(p.begin());
    while (!p.empty() && p.back() == ' ') p.pop_back();
    if (p.empty() && parts.size() == 1)
      break;
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(p.c_str(), &end, 10);
    if (p.empty() || *end != '\0' || errno != 0 || v < 0 || v > 2147483647LL) {
      return invalid_argument(
          str_format("--input-ids: item %zu (\"%s\") is not a token id", i + 1, p.c_str()));
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty())
    return invalid_argument("--input-ids: no token ids given");
  return ids;
}

Result<model::Numerics> parse_numerics(const std::string& s) {
  if (s == "reference")
    return model::Numerics::kReference;
  if (s == "deepseek")
    return model::Numerics::kDeepSeek;
  return invalid_argument("--numerics must be `reference` or `deepseek`, got `" + s + "`");
}

Result<model::Numerics> resolve_numerics(const std::string& s, engine::Device device) {
  if (s.empty() || s == "auto")
    return device == engine::Device::kCuda ? model::Numerics::kDeepSeek
                                           : model::Numerics::kReference;
  auto n = parse_numerics(s);
  if (!n.ok())
    return invalid_argument("--numerics must be `auto`, `reference` or `deepseek`, got `" + s +
                            "`");
  return n;
}

Result<int64_t> parse_bytes(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string unit(end);
  double mul = 0;
  if (unit.empty() || unit == "B") {
    mul = 1;
  } else if (unit == "K" || unit == "KB" || unit == "KiB") {
    mul = 1024.0;
  } else if (unit == "M" || unit == "MB" || unit == "MiB") {
    mul = 1024.0 * 1024;
  } else if (unit == "G" || unit == "GB" || unit == "GiB") {
    mul = 1024.0 * 1024 * 1024;
  }
  if (mul == 0 || !(v > 0)) {
    return invalid_argument(flag + ": cannot parse size `" + s + "` (e.g. 512KiB, 8MiB, 2GiB)");
  }
  return static_cast<int64_t>(v * mul);
}

Result<recipe::ModelVersion> parse_model_version(const std::string& s) {
  if (s == "v4")
    return recipe::ModelVersion::kV4;
  if (s == "v4-0731")
    return recipe::ModelVersion::kV40731;
  if (s == "v4.1")
    return recipe::ModelVersion::kV41;
  return invalid_argument("--model-version must be v4, v4-0731 or v4.1, got `" + s + "`");
}

std::string resolve_model_dir(const std::string& flag) {
  if (!flag.empty())
    return flag;
  if (const char* env = std::getenv("DSINFER_MODEL"); env && *env)
    return env;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(fs::path(kBundledModel) / "config.json", ec))
    return kBundledModel;
  // build/bin/dsinfer -> <repo>/models/...
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path candidate = exe.parent_path().parent_path().parent_path() / kBundledModel;
    if (fs::exists(candidate / "config.json", ec))
      return candidate.string();
  }
  return kBundledModel;
}

void add_engine_flags(CLI::App* cmd, EngineFlags* f) {
  cmd->add_option(
      "--model", f->model_dir, "Model directory (default: $DSINFER_MODEL or the bundled model)");
  cmd->add_option("--numerics",
                  f->numerics,
                  "auto (default: deepseek on --device cuda, reference on cpu) | reference | "
                  "deepseek");
  cmd->add_option("--state-memory", f->state_memory, "Sequence-state memory budget (default 1GiB)");
  cmd->add_option("--max-num-seqs", f->max_num_seqs, "Sequences running at once (default 64)");
  cmd->add_option("--max-tokens-per-step",
                  f->max_tokens_per_step,
                  "Token budget of one engine step (default 256)");
  cmd->add_option("--max-model-len",
                  f->max_model_len,
                  "Context limit, prompt + output tokens (default: the model's)");
  cmd->add_option("--model-version",
                  f->model_version,
                  "Prompt format: auto (default: v4.1 for a V4.1 checkpoint, else v4) | v4 | "
                  "v4-0731 | v4.1");
  cmd->add_option("--prefill-keep-rows",
                  f->prefill_keep_rows,
                  "DeepSeek V4.1: prefill early exit, the consumer half on the last K prompt rows "
                  "(>= window + 6, e.g. 140; default 0 = exact prefill)");
  cmd->add_option("--engram-placement",
                  f->engram_placement,
                  "DeepSeek V4.1: where the Engram tables live: auto (default: host memory while "
                  "they fit, else the checkpoint's memory map) | host | mapped | device (GPU "
                  "memory, rows gathered on the GPU; --device cuda)");
  cmd->add_option("--device", f->device, "cpu | cuda | cuda:N (the CUDA backend needs a GPU)");
  cmd->add_option("--cpu-kernels",
                  f->cpu_kernels,
                  "--device cpu: fast (default; batched vectorised GEMMs, threads) | reference");
  cmd->add_option("--cpu-threads",
                  f->cpu_threads,
                  "--device cpu: threads of the fast path (default $DSINFER_CPU_THREADS or all)");
  cmd->add_flag("--no-cuda-graphs",
                f->no_cuda_graphs,
                "Launch decode steps eagerly instead of replaying CUDA graphs");
  cmd->add_flag("--async-scheduling,!--no-async-scheduling",
                f->async_scheduling,
                "CUDA: launch each step before the previous one's tokens are back (the host "
                "prepares step N+1 while the GPU runs step N; steps without speculation, "
                "penalties, structured outputs or top_logprobs). Default on; "
                "--no-async-scheduling waits for every step's tokens");
  cmd->add_flag("--batch-invariant",
                f->batch_invariant,
                "CUDA: a request's logits do not depend on the rest of the batch (every linear "
                "on the fixed-order kernels; slower prefill)");
  cmd->add_option("--speculative",
                  f->speculative,
                  "Speculative decoding with the checkpoint's MTP block: off | fixed:K (K drafts "
                  "per step) | auto (default where the checkpoint has MTP weights; per step and "
                  "request the drafts that maximise expected tokens per second) | auto:K");
  cmd->add_option("--ep",
                  f->ep,
                  "Expert parallelism: N processes, one per GPU (routed experts sharded, requests "
                  "split across ranks); 1 runs the same path on one GPU");
}

namespace {
std::vector<std::string>& args_storage() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void set_program_args(int argc, char** argv) {
  args_storage().assign(argv, argv + argc);
}

const std::vector<std::string>& program_args() {
  return args_storage();
}

Result<engine::CpuKernels> parse_cpu_kernels(const std::string& s) {
  if (s == "fast")
    return engine::CpuKernels::kFast;
  if (s == "reference")
    return engine::CpuKernels::kReference;
  return invalid_argument("--cpu-kernels must be `fast` or `reference`, got `" + s + "`");
}

Status parse_device(const std::string& s, engine::EngineConfig* config) {
  if (s == "cpu") {
    config->device = engine::Device::kCpu;
    return Status();
  }
  if (s == "cuda") {
    config->device = engine::Device::kCuda;
    config->device_ordinal = 0;
    return Status();
  }
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() < 9 &&
      s.find_first_not_of("0123456789", 5) == std::string::npos) {
    config->device = engine::Device::kCuda;
    config->device_ordinal = std::stoi(s.substr(5));
    return Status();
  }
  return invalid_argument("--device: `" + s + "` is not one of cpu, cuda, cuda:N");
}

Status parse_speculative(const std::string& flag, engine::EngineConfig* config) {
  if (flag.empty()) {
    config->speculative = *spec::parse_config("auto");
    config->speculative.defaulted = true;
    return Status();
  }
  DSI_ASSIGN_OR_RETURN(config->speculative, spec::parse_config(flag));
  return Status();
}

Result<cpu_v41::EngramPlacement> parse_engram_placement_flag(const std::string& s,
                                                             engine::Device device) {
  auto p = cpu_v41::parse_engram_placement(s);
  if (!p.ok())
    return p.status().with_context("--engram-placement");
  if (*p == cpu_v41::EngramPlacement::kDevice && device != engine::Device::kCuda) {
    return invalid_argument(
        "--engram-placement device needs --device cuda (the CPU backend keeps the tables in host "
        "memory or reads them from the checkpoint's memory map: host, mapped, auto)");
  }
  return *p;
}

Result<EngineSetup> resolve_engine_flags(const EngineFlags& f) {
  EngineSetup s;
  DSI_ASSIGN_OR_RETURN(s.config.state_budget_bytes, parse_bytes("--state-memory", f.state_memory));
  DSI_RETURN_IF_ERROR(parse_device(f.device, &s.config));
  DSI_ASSIGN_OR_RETURN(s.config.numerics, resolve_numerics(f.numerics, s.config.device));
  DSI_ASSIGN_OR_RETURN(s.config.cpu_kernels, parse_cpu_kernels(f.cpu_kernels));
  if (f.cpu_threads < 0)
    return invalid_argument("--cpu-threads must be >= 0");
  s.config.cpu_threads = f.cpu_threads;
  s.config.cuda_graphs = !f.no_cuda_graphs;
  s.config.batch_invariant = f.batch_invariant;
  s.config.async_scheduling = f.async_scheduling;
  if (f.ep < 0)
    return invalid_argument("--ep must be >= 0");
  if (f.ep > 0 && s.config.device != engine::Device::kCuda)
    return invalid_argument("--ep: expert parallelism needs --device cuda");
  s.config.expert_parallel = f.ep;
  if (f.max_model_len < 0)
    return invalid_argument("--max-model-len must be >= 0");
  s.config.model_dir = resolve_model_dir(f.model_dir);
  if (f.model_version == "auto") {
    s.version = cpu_v41::is_v41_model_dir(s.config.model_dir) ? recipe::ModelVersion::kV41
                                                              : recipe::ModelVersion::kV4;
  } else {
    DSI_ASSIGN_OR_RETURN(s.version, parse_model_version(f.model_version));
  }
  if (f.prefill_keep_rows < 0)
    return invalid_argument("--prefill-keep-rows must be >= 0 (0 = exact prefill)");
  s.config.prefill_keep_rows = f.prefill_keep_rows;
  DSI_ASSIGN_OR_RETURN(s.config.engram_placement,
                       parse_engram_placement_flag(f.engram_placement, s.config.device));
  s.config.max_model_len = f.max_model_len;
  s.config.scheduler.max_running = f.max_num_seqs;
  s.config.scheduler.max_tokens_per_step = f.max_tokens_per_step;
  DSI_RETURN_IF_ERROR(parse_speculative(f.speculative, &s.config));
  return s;
}

}  // namespace dsinfer::cli
