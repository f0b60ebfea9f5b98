// `dsinfer bench --device cpu`: the CPU backend's speed, fast path vs reference in one run.
#include "cli/bench_cpu.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "backend/cpu_v41/backend.h"
#include "base/strings.h"
#include "cli/bench_spec.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "kernels/cpu/fast/gemm.h"
#include "model/checkpoint.h"

namespace dsinfer::cli {

Result<nlohmann::ordered_json> state_footprint_json(const backend::Model& m,
                                                    int64_t page_bytes,
                                                    const std::string& state_memory) {
  DSI_ASSIGN_OR_RETURN(const int64_t budget, parse_bytes("--state-memory", state_memory));
  const model::ModelConfig& cfg = m.config();
  const engine::Footprint f =
      engine::state_footprint(m, page_bytes, 0, budget / page_bytes, cfg.max_position_embeddings);
  std::fprintf(stderr,
               "[bench] sequence state: %lld B fixed + %.1f B per token of context (pages of %lld "
               "B); %s holds %lld tokens of one sequence's context\n",
               static_cast<long long>(f.fixed_bytes),
               f.bytes_per_token,
               static_cast<long long>(page_bytes),
               state_memory.c_str(),
               static_cast<long long>(f.max_context_tokens));
  return nlohmann::ordered_json{{"page_bytes", page_bytes},
                                {"fixed_bytes_per_sequence", f.fixed_bytes},
                                {"bytes_per_token", f.bytes_per_token},
                                {"state_memory_bytes", budget},
                                {"max_context_tokens_in_state_memory", f.max_context_tokens}};
}
namespace {

using json = nlohmann::ordered_json;

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// CPU time of the whole process (all threads): on a shared machine wall time depends on what
// else runs; CPU seconds per token do much less.
double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return t;
}

// One backend's prefill and decode figures.
Result<json> bench_one(const CpuBenchArgs& a,
                       const model::Checkpoint& ckpt,
                       engine::CpuKernels kernels,
                       model::Numerics numerics) {
  const model::ModelConfig& cfg = ckpt.config();
  engine::EngineConfig ec;
  ec.device = engine::Device::kCpu;
  ec.numerics = numerics;
  ec.cpu_kernels = kernels;
  ec.cpu_threads = a.threads;
  DSI_ASSIGN_OR_RETURN(auto model, engine::create_model(ec, cfg, ckpt.weights()));
  backend::Model& m = *model;
  auto arena = state::PageArena::growable(state::default_page_bytes(cfg), m.state_storage());
  backend::ForwardOptions last;
  last.last_logits_only = true;
  backend::ForwardOutputs fo;
  json out;
  out["kernels"] = engine::cpu_kernels_name(kernels);
  out["backend"] = m.name();
  DSI_ASSIGN_OR_RETURN(out["state"],
                       state_footprint_json(m, state::default_page_bytes(cfg), a.state_memory));

  json prefill = json::array();
  for (int64_t len : a.prefill) {
    const auto toks = random_tokens(len, cfg.vocab_size, static_cast<uint32_t>(len));
    double best = 1e30;
    double best_cpu = 1e30;
    for (int64_t r = 0; r <= a.repeats; ++r) {  // run 0: warm-up (weight conversion, scratch)
      state::SequenceState st(cfg, arena.get(), 1000 + r, 0);
      const double t0 = now_s();
      const double c0 = cpu_s();
      DSI_RETURN_IF_ERROR(m.forward(st, toks, last, &fo));
      const double dt = now_s() - t0;
      const double dc = cpu_s() - c0;
      if (r > 0) {
        best = std::min(best, dt);
        best_cpu = std::min(best_cpu, dc);
      }
    }
    std::fprintf(stderr,
                 "[bench cpu %s] prefill %lld tokens: %.3f s, %.1f tok/s (%.1f tok per CPU-s)\n",
                 engine::cpu_kernels_name(kernels),
                 static_cast<long long>(len),
                 best,
                 static_cast<double>(len) / best,
                 static_cast<double>(len) / best_cpu);
    prefill.push_back({{"tokens", len},
                       {"seconds", best},
                       {"tokens_per_s", static_cast<double>(len) / best},
                       {"cpu_seconds", best_cpu},
                       {"tokens_per_cpu_s", static_cast<double>(len) / best_cpu}});
  }
  out["prefill"] = prefill;

  json decode = json::array();
  const auto ctx_toks = random_tokens(a.context, cfg.vocab_size, 17);
  for (int64_t batch : a.decode_batch) {
    std::vector<std::unique_ptr<state::SequenceState>> seqs;
    seqs.push_back(std::make_unique<state::SequenceState>(cfg, arena.get(), 0, 0));
    DSI_RETURN_IF_ERROR(m.forward(*seqs[0], ctx_toks, last, &fo));
    std::vector<std::pair<int32_t, int32_t>> pairs;
    for (int64_t i = 1; i < batch; ++i) {
      seqs.push_back(std::make_unique<state::SequenceState>(cfg, arena.get(), i, 0));
      DSI_RETURN_IF_ERROR(seqs.back()->fork_from(*seqs[0], &pairs));
    }
    std::vector<backend::ForwardOutputs> outs(static_cast<size_t>(batch));
    std::vector<std::vector<int32_t>> step_tokens(static_cast<size_t>(batch));
    std::vector<backend::ForwardItem> items(static_cast<size_t>(batch));
    auto step = [&](int64_t k) -> Status {
      for (int64_t i = 0; i < batch; ++i) {
        step_tokens[i] = {static_cast<int32_t>((k * 7919 + i * 104729) % cfg.vocab_size)};
        items[i] = backend::ForwardItem();
        items[i].state = seqs[i].get();
        items[i].tokens = step_tokens[i];
        items[i].options = last;
        items[i].out = &outs[i];
      }
      DSI_RETURN_IF_ERROR(m.forward_batch(items));
      for (const auto& it : items) DSI_RETURN_IF_ERROR(it.status);
      return Status();
    };
    DSI_RETURN_IF_ERROR(step(0));  // warm-up
    const double t0 = now_s();
    const double c0 = cpu_s();
    for (int64_t k = 0; k < a.decode_steps; ++k) DSI_RETURN_IF_ERROR(step(1 + k));
    const double step_s = (now_s() - t0) / static_cast<double>(a.decode_steps);
    const double step_cpu_s = (cpu_s() - c0) / static_cast<double>(a.decode_steps);
    std::fprintf(stderr,
                 "[bench cpu %s] decode batch %lld at %lld context: %.2f ms/step, %.1f tok/s "
                 "(%.1f tok per CPU-s)\n",
                 engine::cpu_kernels_name(kernels),
                 static_cast<long long>(batch),
                 static_cast<long long>(a.context),
                 step_s * 1e3,
                 static_cast<double>(batch) / step_s,
                 static_cast<double>(batch) / step_cpu_s);
    decode.push_back({{"batch", batch},
                      {"context", a.context},
                      {"steps", a.decode_steps},
                      {"step_ms", step_s * 1e3},
                      {"tokens_per_s", static_cast<double>(batch) / step_s},
                      {"cpu_ms_per_step", step_cpu_s * 1e3},
                      {"tokens_per_cpu_s", static_cast<double>(batch) / step_cpu_s}});
  }
  out["decode"] = decode;
  return out;
}

}  // namespace

int run_cpu_bench(const CpuBenchArgs& a) {
  auto numerics = parse_numerics(a.numerics);
  if (!numerics.ok())
    return fail(numerics.status());
  std::vector<engine::CpuKernels> kernels;
  for (const std::string& k : a.kernels) {
    auto p = parse_cpu_kernels(k);
    if (!p.ok())
      return fail(p.status());
    kernels.push_back(*p);
  }
  if (kernels.empty())
    return fail(invalid_argument("--cpu-kernels: name at least one of fast, reference"));
  for (int64_t v : a.prefill) {
    if (v < 1)
      return fail(invalid_argument("--prefill lengths must be >= 1"));
  }
  for (int64_t v : a.decode_batch) {
    if (v < 1)
      return fail(invalid_argument("--decode-batch sizes must be >= 1"));
  }
  if (a.context < 1 || a.decode_steps < 1 || a.repeats < 1 || a.threads < 0) {
    return fail(invalid_argument(
        "--context, --decode-steps and --repeats must be >= 1, --cpu-threads >= 0"));
  }
  const std::string model_dir = resolve_model_dir(a.model_dir);
  std::fprintf(stderr, "[bench cpu] loading %s...\n", model_dir.c_str());
  if (cpu_v41::is_v41_model_dir(model_dir))
    return run_cpu_bench_v41(a, model_dir);
  if (a.prefill_keep_rows != 0)
    return fail(invalid_argument("--prefill-keep-rows applies to DeepSeek V4.1 checkpoints only"));
  if (a.engram_placement != "auto" || a.engram_compare) {
    return fail(invalid_argument(
        "--engram-placement and --engram-compare apply to DeepSeek V4.1 checkpoints only"));
  }
  auto ckpt = model::Checkpoint::open(model_dir);
  if (!ckpt.ok())
    return fail(ckpt.status());
  const model::ModelConfig& cfg = (*ckpt)->config();
  const int64_t longest = std::max(*std::max_element(a.prefill.begin(), a.prefill.end()),
                                   a.context + a.decode_steps + 1);
  if (cfg.max_position_embeddings < longest) {
    return fail(invalid_argument(str_format("the model's context (%lld) is below %lld tokens",
                                            static_cast<long long>(cfg.max_position_embeddings),
                                            static_cast<long long>(longest))));
  }
  json out;
  out["device"] = "cpu";
  out["hardware_threads"] = std::thread::hardware_concurrency();
  out["gemm_isa"] = cpu::fast::gemm_isa();
  out["model"] = {{"dir", model_dir},
                  {"layers", static_cast<int64_t>(cfg.layers.size())},
                  {"hidden", cfg.hidden_size},
                  {"vocab", cfg.vocab_size},
                  {"numerics", model::numerics_name(*numerics)}};
  json runs = json::array();
  for (engine::CpuKernels k : kernels) {
    auto r = bench_one(a, **ckpt, k, *numerics);
    if (!r.ok())
      return fail(r.status());
    runs.push_back(*r);
  }
  out["runs"] = runs;
  // Speed-ups of the first kernels over the others, row by row.
  if (runs.size() >= 2) {
    json ratios = json::array();
    for (size_t j = 1; j < runs.size(); ++j) {
      json r;
      r["of"] = runs[0]["kernels"];
      r["over"] = runs[j]["kernels"];
      json p = json::array();
      for (size_t i = 0; i < runs[0]["prefill"].size(); ++i) {
        p.push_back({{"tokens", runs[0]["prefill"][i]["tokens"]},
                     {"speedup",
                      runs[0]["prefill"][i]["tokens_per_s"].get<double>() /
                          runs[j]["prefill"][i]["tokens_per_s"].get<double>()},
                     {"speedup_per_cpu_s",
                      runs[0]["prefill"][i]["tokens_per_cpu_s"].get<double>() /
                          runs[j]["prefill"][i]["tokens_per_cpu_s"].get<double>()}});
      }
      json d = json::array();
      for (size_t i = 0; i < runs[0]["decode"].size(); ++i) {
        d.push_back({{"batch", runs[0]["decode"][i]["batch"]},
                     {"speedup",
                      runs[0]["decode"][i]["tokens_per_s"].get<double>() /
                          runs[j]["decode"][i]["tokens_per_s"].get<double>()},
                     {"speedup_per_cpu_s",
                      runs[0]["decode"][i]["tokens_per_cpu_s"].get<double>() /
                          runs[j]["decode"][i]["tokens_per_cpu_s"].get<double>()}});
      }
      r["prefill"] = p;
      r["decode"] = d;
      ratios.push_back(r);
    }
    out["speedups"] = ratios;
  }
  return write_output(out.dump(2), a.output, "bench cpu");
}

void add_cpu_bench_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<CpuBenchArgs>();
  auto device = std::make_shared<std::string>("cuda");  // as the CUDA build's bench
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure CPU prefill/decode speed, fast path vs reference (JSON)");
  cmd->add_option("--model", a->model_dir, "Model directory (default: $DSINFER_MODEL or bundled)");
  cmd->add_option("--device", *device, "cpu (this build has no CUDA backend)");
  // The CUDA bench's own flags parse here too, so that using them says why they cannot run.
  auto cuda_only = std::make_shared<std::vector<CLI::Option*>>();
  const std::string only = "(CUDA build only)";
  cuda_only->push_back(cmd->add_flag("--no-ceilings", only));
  cuda_only->push_back(cmd->add_flag("--no-cuda-graphs", only));
  cuda_only->push_back(cmd->add_flag("--ops", only));
  cuda_only->push_back(cmd->add_option("--profile-range", only));
  cuda_only->push_back(cmd->add_option("--op-tokens", only));
  CLI::Option* o_numerics =
      cmd->add_option("--numerics", a->numerics, "reference (default) | deepseek");
  CLI::Option* o_kernels =
      cmd->add_option("--cpu-kernels", a->kernels, "Kernels to compare (default fast,reference)")
          ->delimiter(',');
  cmd->add_option("--cpu-threads", a->threads, "Threads of the fast path (default all)");
  cmd->add_option("--prefill", a->prefill, "Prompt lengths to prefill (default 64,512)")
      ->delimiter(',');
  CLI::Option* o_batch =
      cmd->add_option("--decode-batch",
                      a->decode_batch,
                      "Decode batch sizes (default 1,8,64; with --speculative 1,16,64)")
          ->delimiter(',');
  cmd->add_option("--context", a->context, "Context length of the decode runs (default 128)");
  CLI::Option* o_steps = cmd->add_option(
      "--decode-steps",
      a->decode_steps,
      "Timed decode steps (default 8; with --speculative: tokens generated per request, 48)");
  CLI::Option* o_repeats = cmd->add_option(
      "--repeats",
      a->repeats,
      "Timed prefill runs after a warm-up (default 2; with --speculative: rounds, 3)");
  auto spec = std::make_shared<SpecBenchFlags>();
  spec->add_to(cmd);
  cmd->add_option("--prefill-keep-rows",
                  a->prefill_keep_rows,
                  "DeepSeek V4.1: also time the prefill early exit with the last K rows");
  cmd->add_option("--engram-placement",
                  a->engram_placement,
                  "DeepSeek V4.1: where the Engram tables live: auto (default) | host | mapped "
                  "(device: --device cuda)");
  cuda_only->push_back(cmd->add_flag("--engram-compare", only));
  cuda_only->push_back(cmd->add_option("--long-context", only));
  cuda_only->push_back(cmd->add_flag("--batch-invariant", only));
  cmd->add_option("--output", a->output, "Write the JSON here instead of stdout");
  CLI::Option* o_state = cmd->add_option("--state-memory",
                                         a->state_memory,
                                         "Report how many tokens of context one sequence's state "
                                         "fits in this budget (default 1GiB); with "
                                         "--speculative, each engine's state memory (default "
                                         "512MiB)");
  cmd->callback([=, &exit_code] {
    if (*device != "cpu") {
      exit_code = fail(Status(StatusCode::kUnimplemented,
                              "bench --device " + *device +
                                  ": this build has no CUDA backend (configure with "
                                  "-DDSINFER_CUDA=ON); --device cpu measures the CPU backend"));
      return;
    }
    for (const CLI::Option* o : *cuda_only) {
      if (o->count() > 0) {
        exit_code = fail(Status(StatusCode::kUnimplemented,
                                "bench " + o->get_name() +
                                    ": this build has no CUDA backend (configure with "
                                    "-DDSINFER_CUDA=ON)"));
        return;
      }
    }
    if (spec->speculative->count() > 0) {
      SpecBenchArgs s;
      s.model_dir = a->model_dir;
      s.device = "cpu";
      s.cpu_kernels = o_kernels->count() > 0 ? a->kernels.front() : "fast";
      s.cpu_threads = a->threads;
      spec->apply(&s);
      if (o_numerics->count() > 0)
        s.numerics = a->numerics;
      if (o_state->count() > 0)
        s.state_memory = a->state_memory;
      if (o_batch->count() > 0)
        s.batch = a->decode_batch;
      if (o_steps->count() > 0)
        s.generate = a->decode_steps;
      if (o_repeats->count() > 0)
        s.repeats = a->repeats;
      s.output = a->output;
      exit_code = run_spec_bench(s);
      return;
    }
    exit_code = run_cpu_bench(*a);
  });
}

}  // namespace dsinfer::cli
