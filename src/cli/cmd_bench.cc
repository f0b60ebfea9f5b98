// `dsinfer bench`: prefill and decode speed of the CUDA backend on a checkpoint (typically a
// real-width synthetic one from `make-checkpoint --preset v4-flash`), per layer, as JSON — with
// the device's copy bandwidth and FP8/BF16 GEMM peaks measured in the same run, so that every
// figure is also reported as a fraction of a limit. `--device cpu` measures the CPU backend
// instead, fast path vs reference (cli/bench_cpu.h).
#include <cuda_profiler_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu_v41/backend.h"
#include "backend/cuda/cuda_model.h"
#include "base/strings.h"
#include "cli/bench_cpu.h"
#include "cli/bench_ops.h"
#include "cli/bench_spec.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/checkpoint.h"
#include "model/cost.h"
#include "perf/ceilings.h"
#include "perf/kernel_trace.h"

namespace dsinfer::cli {
namespace {

using json = nlohmann::ordered_json;

// Decode steps: how the next tokens are chosen (the timed runs of each decode batch).
// kDeviceGreedyAsync: greedy on the device, each step launched before the previous one's picks
// are known and fed by them on the device (the engine's asynchronous scheduling).
enum class SampleMode {
  kDeviceGreedy,
  kDeviceSampled,
  kLogitsToHost,
  kHostSampled,
  kDeviceGreedyAsync
};
constexpr int64_t kDecodeRuns = 6;  // decode runs per batch (one per mode, and warm-ups)

struct BenchArgs {
  std::string model_dir;
  std::string device = "cuda";
  std::string numerics = "deepseek";
  std::vector<int64_t> prefill = {1024, 8192};
  std::vector<int64_t> decode_batch = {1, 64};
  int64_t context = 8192;
  int64_t long_context = 0;  // > 0: also batch 1 at this context, and its step's ratio
  int64_t decode_steps = 32;
  int64_t repeats = 2;
  std::string output;
  bool no_ceilings = false;
  bool no_cuda_graphs = false;
  bool batch_invariant = false;
  bool ops = false;
  std::string profile_range;  // "prefill" | "decode": cudaProfilerStart/Stop around those runs
  std::vector<int64_t> op_tokens = {1, 16, 64, 256, 1024, 8192};
  SpecBenchFlags spec;                // --speculative and its flags (cli/bench_spec.h)
  std::string state_memory = "1GiB";  // the budget the state footprint's context is given for
  // --device cpu (cli/bench_cpu.h): the CPU run's own defaults unless the flags were given.
  CpuBenchArgs cpu;
  bool numerics_set = false;
  bool prefill_set = false;
  bool decode_batch_set = false;
  bool context_set = false;
  bool decode_steps_set = false;
  bool repeats_set = false;
};

int run_cpu_bench_from(const BenchArgs& a) {
  CpuBenchArgs c = a.cpu;
  c.model_dir = a.model_dir;
  c.output = a.output;
  c.state_memory = a.state_memory;
  if (a.numerics_set)
    c.numerics = a.numerics;
  if (a.prefill_set)
    c.prefill = a.prefill;
  if (a.decode_batch_set)
    c.decode_batch = a.decode_batch;
  if (a.context_set)
    c.context = a.context;
  if (a.decode_steps_set)
    c.decode_steps = a.decode_steps;
  if (a.repeats_set)
    c.repeats = a.repeats;
  return run_cpu_bench(c);
}

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return t;
}

json per_layer(const model::ModelConfig& c, const std::vector<float>& ms) {
  json a = json::array();
  if (ms.size() != c.layers.size() + 3)
    return a;
  a.push_back({{"part", "embed"}, {"ms", ms[0]}});
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const auto& p = c.layers[l];
    a.push_back({{"part", "layer " + std::to_string(l)},
                 {"attention", model::attention_type_name(p.attention)},
                 {"moe", model::moe_type_name(p.moe)},
                 {"ms", ms[1 + l]}});
  }
  a.push_back({{"part", "head"}, {"ms", ms[c.layers.size() + 2]}});
  return a;
}

// Prints the JSON on stdout, or writes it to `path`; the process exit code.
int write_json(const json& out, const std::string& path) {
  return write_output(out.dump(2), path, "bench");
}

int run_bench(const BenchArgs& a) {
  engine::EngineConfig ec;
  if (Status s = parse_device(a.device, &ec); !s.ok())
    return fail(s);
  if (a.long_context > 0 && (ec.device == engine::Device::kCpu ||
                             cpu_v41::is_v41_model_dir(resolve_model_dir(a.model_dir)))) {
    return fail(invalid_argument("--long-context: the V4 CUDA bench only"));
  }
  if (ec.device == engine::Device::kCpu)
    return run_cpu_bench_from(a);
  auto numerics = parse_numerics(a.numerics);
  if (!numerics.ok())
    return fail(numerics.status());
  for (int64_t v : a.prefill) {
    if (v < 1)
      return fail(invalid_argument("--prefill lengths must be >= 1"));
  }
  for (int64_t v : a.decode_batch) {
    if (v < 1)
      return fail(invalid_argument("--decode-batch sizes must be >= 1"));
  }
  if (a.context < 1 || a.decode_steps < 1 || a.repeats < 1 || a.long_context < 0)
    return fail(invalid_argument(
        "--context, --decode-steps and --repeats must be >= 1, --long-context >= 0"));
  const std::string model_dir = resolve_model_dir(a.model_dir);
  if (cpu_v41::is_v41_model_dir(model_dir)) {
    // DeepSeek V4.1: the V4.1 bench (bench_cpu_v41.cc) on the CUDA V4.1 backend, with this
    // command's GPU defaults unless the flags were given.
    CpuBenchArgs c = a.cpu;
    c.model_dir = model_dir;
    c.output = a.output;
    c.state_memory = a.state_memory;
    c.numerics = a.numerics;
    c.prefill = a.prefill;
    c.decode_batch = a.decode_batch;
    c.context = a.context;
    c.decode_steps = a.decode_steps;
    c.repeats = a.repeats;
    c.cuda_device = ec.device_ordinal;
    return run_cpu_bench_v41(c, model_dir);
  }
  json out;
  // Ceilings first, before the model takes the memory.
  if (!a.no_ceilings) {
    std::fprintf(stderr, "[bench] measuring ceilings (copy, FP8 and BF16 GEMM 8192^3)...\n");
    perf::CeilingOptions co;
    co.device = ec.device_ordinal;
    auto ce = perf::measure_ceilings(co);
    if (!ce.ok())
      return fail(ce.status());
    std::fprintf(stderr, "[bench] %s\n", perf::describe(*ce).c_str());
    out["device"] = ce->device_name;
    out["ceilings"] = {{"copy_bytes_per_s", ce->copy_bytes_per_s},
                       {"copy_buffer_bytes", ce->copy_buffer_bytes},
                       {"fp8_gemm_flops", ce->fp8_gemm_flops},
                       {"bf16_gemm_flops", ce->bf16_gemm_flops},
                       {"gemm_mnk", {ce->gemm_m, ce->gemm_n, ce->gemm_k}}};
  }
  const double copy_bw = a.no_ceilings ? 0.0 : out["ceilings"]["copy_bytes_per_s"].get<double>();
  const double fp8_peak = a.no_ceilings ? 0.0 : out["ceilings"]["fp8_gemm_flops"].get<double>();
  if (a.ops) {
    // The op table alone (no checkpoint): tensor-core linears and the routed experts.
    OpBenchOptions oo;
    oo.device = ec.device_ordinal;
    oo.tokens = a.op_tokens;
    oo.copy_bytes_per_s = copy_bw;
    oo.fp8_flops = fp8_peak;
    oo.batch_invariant = a.batch_invariant;
    std::fprintf(stderr, "[bench] ops at V4-Flash shapes...\n");
    auto ops = bench_ops(oo);
    if (!ops.ok())
      return fail(ops.status());
    out["ops"] = *ops;
    return write_json(out, a.output);
  }

  std::fprintf(stderr, "[bench] loading %s...\n", model_dir.c_str());
  auto ckpt = model::Checkpoint::open(model_dir);
  if (!ckpt.ok())
    return fail(ckpt.status());
  const model::ModelConfig& cfg = (*ckpt)->config();
  const double t_up = now_s();
  gpu::CudaModelOptions mo;
  mo.device = ec.device_ordinal;
  mo.cuda_graphs = !a.no_cuda_graphs;
  mo.batch_invariant = a.batch_invariant;
  mo.max_graph_batch = 1024;
  auto gm = gpu::CudaModel::create(cfg, (*ckpt)->weights(), *numerics, mo);
  if (!gm.ok())
    return fail(gm.status());
  gpu::CudaModel& m = **gm;
  json layers = json::array();
  for (const auto& p : cfg.layers) {
    layers.push_back(std::string(model::attention_type_name(p.attention)) + "/" +
                     model::moe_type_name(p.moe));
  }
  out["model"] = {{"dir", model_dir},
                  {"layers", static_cast<int64_t>(cfg.layers.size())},
                  {"schedule", layers},
                  {"hidden", cfg.hidden_size},
                  {"routed_experts", cfg.n_routed_experts},
                  {"numerics", model::numerics_name(*numerics)},
                  {"weight_bytes_on_device", m.stats().weight_bytes},
                  {"moe_fp8_layers", m.stats().moe_fp8_layers},
                  {"moe_w4a8_layers", m.stats().moe_w4a8_layers},
                  {"moe_gemv_layers", m.stats().moe_gemv_layers},
                  {"batch_invariant", a.batch_invariant},
                  {"upload_s", now_s() - t_up}};
  const int64_t page_bytes = state::default_page_bytes(cfg);
  const int64_t max_tokens = std::max(*std::max_element(a.prefill.begin(), a.prefill.end()),
                                      a.context + kDecodeRuns * a.decode_steps + 16);
  const int64_t max_batch = *std::max_element(a.decode_batch.begin(), a.decode_batch.end());
  // The long-context run is one sequence (batch 1): room for it once, beside the batches'.
  const int64_t long_pages =
      a.long_context > 0
          ? state::SequenceState::pages_for(cfg,
                                            page_bytes,
                                            a.long_context + kDecodeRuns * a.decode_steps + 16,
                                            0,
                                            m.row_format())
          : 0;
  const int64_t pages =
      state::SequenceState::pages_for(cfg, page_bytes, max_tokens, 0, m.row_format()) *
          (max_batch + 1) +
      long_pages + 64;
  auto arena = state::PageArena::with_budget(pages * page_bytes, page_bytes, m.state_storage());
  out["state_bytes_reserved"] = pages * page_bytes;
  {
    auto st = state_footprint_json(m, page_bytes, a.state_memory);
    if (!st.ok())
      return fail(st.status());
    out["state"] = *st;
  }
  if (cfg.max_position_embeddings < std::max(max_tokens, a.long_context)) {
    return fail(
        invalid_argument(str_format("the model's context (%lld) is below %lld tokens",
                                    static_cast<long long>(cfg.max_position_embeddings),
                                    static_cast<long long>(std::max(max_tokens, a.long_context)))));
  }

  // Prefill: one sequence from an empty state, one forward, logits of the last token.
  json prefill = json::array();
  backend::ForwardOptions last;
  last.last_logits_only = true;
  backend::ForwardOutputs fo;
  for (int64_t len : a.prefill) {
    const auto toks = random_tokens(len, cfg.vocab_size, static_cast<uint32_t>(len));
    double best = 1e30;
    double best_plan = 0.0;  // host planning within the best run
    std::vector<float> prof;
    for (int64_t r = 0; r <= a.repeats; ++r) {  // run 0: warm-up (workspace, autotuning)
      state::SequenceState st(cfg, arena.get(), 1000 + r, 0, m.row_format());
      m.set_profile(r == a.repeats);  // the last run is profiled per layer (events only)
      const bool captured = a.profile_range == "prefill" && r == 1;  // the first timed run
      if (captured) {
        cudaProfilerStart();
        if (Status t = perf::kernel_trace_begin(); !t.ok())
          return fail(t);
      }
      const int64_t plan0 = m.stats().host_plan_ns;
      const double t0 = now_s();
      Status s = m.forward(st, toks, last, &fo);
      const double dt = now_s() - t0;
      const double plan_s = static_cast<double>(m.stats().host_plan_ns - plan0) * 1e-9;
      if (captured) {
        cudaDeviceSynchronize();
        cudaProfilerStop();
        if (Status t = perf::kernel_trace_end(); !t.ok())
          return fail(t);
      }
      if (!s.ok())
        return fail(s);
      if (r > 0 && r < a.repeats && dt < best) {
        best = dt;
        best_plan = plan_s;
      }
      if (r == a.repeats) {
        prof = m.last_profile_ms();
        if (a.repeats == 1) {
          best = dt;
          best_plan = plan_s;
        }
      }
    }
    m.set_profile(false);
    const model::ForwardCost cost = model::prefill_cost(cfg, (*ckpt)->weights(), len);
    json row = {{"tokens", len},
                {"seconds", best},
                {"tokens_per_s", static_cast<double>(len) / best},
                {"model_flops", cost.flops()},
                {"achieved_flops", cost.flops() / best},
                {"host_plan_seconds", best_plan},
                {"per_layer", per_layer(cfg, prof)}};
    if (fp8_peak > 0)
      row["fraction_of_fp8_peak"] = cost.flops() / best / fp8_peak;
    std::fprintf(stderr,
                 "[bench] prefill %lld tokens: %.3f s, %.0f tok/s (host planning %.1f ms)\n",
                 static_cast<long long>(len),
                 best,
                 static_cast<double>(len) / best,
                 best_plan * 1e3);
    prefill.push_back(row);
  }
  out["prefill"] = prefill;

  // Decode: one sequence prefilled to the context, forked into the batch (identical prefixes;
  // decode cost does not depend on the content), then timed steps of one token per sequence.
  json decode = json::array();
  // (batch, context) runs: every batch size at --context, then batch 1 at --long-context.
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t b : a.decode_batch) runs.emplace_back(b, a.context);
  if (a.long_context > 0)
    runs.emplace_back(1, a.long_context);
  for (const auto& [batch, context] : runs) {
    std::vector<std::unique_ptr<state::SequenceState>> seqs;
    seqs.push_back(std::make_unique<state::SequenceState>(cfg, arena.get(), 0, 0, m.row_format()));
    const auto ctx_toks = random_tokens(context, cfg.vocab_size, 17);
    std::fprintf(stderr,
                 "[bench] decode batch %lld: prefilling %lld tokens...\n",
                 static_cast<long long>(batch),
                 static_cast<long long>(context));
    // In chunks, as the engine's chunked prefill does: one forward over a 128k context would
    // size the forward workspace (activations, scores) for all its tokens at once.
    constexpr int64_t kContextChunk = 8192;
    for (int64_t at = 0; at < context; at += kContextChunk) {
      const int64_t n = std::min(kContextChunk, context - at);
      const std::span<const int32_t> chunk(ctx_toks.data() + at, static_cast<size_t>(n));
      if (Status s = m.forward(*seqs[0], chunk, last, &fo); !s.ok())
        return fail(s);
    }
    std::vector<std::pair<int32_t, int32_t>> pairs;
    for (int64_t i = 1; i < batch; ++i) {
      seqs.push_back(
          std::make_unique<state::SequenceState>(cfg, arena.get(), i, 0, m.row_format()));
      if (Status s = seqs.back()->fork_from(*seqs[0], &pairs); !s.ok())
        return fail(s);
    }
    if (Status s = m.copy_pages(*arena, pairs); !s.ok())
      return fail(s);
    std::vector<backend::ForwardOutputs> outs(static_cast<size_t>(batch));
    std::vector<std::vector<int32_t>> step_tokens(static_cast<size_t>(batch));
    // How a step's next tokens are chosen: on the device (what the engine does: greedy, or
    // seeded sampling with top-p), or the logits copied to the host (and sampled there).
    sampling::SamplingConfig greedy_cfg, sampled_cfg;
    greedy_cfg.temperature = 0.0f;
    sampled_cfg.temperature = 1.0f;
    sampled_cfg.top_p = 0.95f;
    sampled_cfg.seed = 7;
    const sampling::PenaltyState no_penalties;
    std::vector<backend::SampleRequest> sreq(static_cast<size_t>(batch));
    sampling::SamplerScratch scratch;
    int64_t pos = 0;  // tokens decoded so far (the RNG counter)
    // Asynchronous steps: the outputs alternate (the previous step's picks are written into
    // theirs during the next call), and whether the previous step left its picks on the device.
    std::vector<backend::ForwardOutputs> async_outs[2] = {
        std::vector<backend::ForwardOutputs>(static_cast<size_t>(batch)),
        std::vector<backend::ForwardOutputs>(static_cast<size_t>(batch))};
    int parity = 0;
    bool primed = false;
    auto step = [&](SampleMode mode) -> Status {
      const int64_t k = pos++;
      const bool async = mode == SampleMode::kDeviceGreedyAsync;
      std::vector<backend::ForwardOutputs>& o = async ? async_outs[parity] : outs;
      std::vector<backend::ForwardItem> items(static_cast<size_t>(batch));
      for (int64_t i = 0; i < batch; ++i) {
        step_tokens[i] = {static_cast<int32_t>((k * 7919 + i * 104729) % cfg.vocab_size)};
        items[i].state = seqs[i].get();
        items[i].tokens = step_tokens[i];
        items[i].options = last;
        if (mode != SampleMode::kLogitsToHost && mode != SampleMode::kHostSampled) {
          sreq[i].config = mode == SampleMode::kDeviceSampled ? &sampled_cfg : &greedy_cfg;
          sreq[i].penalties = &no_penalties;
          sreq[i].step = static_cast<uint64_t>(k);
          items[i].options.sample = &sreq[i];
        }
        items[i].options.may_defer = async;
        items[i].options.device_token = async && primed;
        items[i].out = &o[static_cast<size_t>(i)];
      }
      DSI_RETURN_IF_ERROR(m.forward_batch(items));
      for (const auto& it : items) DSI_RETURN_IF_ERROR(it.status);
      if (async) {
        primed = o[0].deferred;
        parity ^= 1;
      }
      if (mode == SampleMode::kHostSampled) {
        for (auto& o : outs) {
          (void)sampling::sample(
              o.logits, sampled_cfg, no_penalties, static_cast<uint64_t>(k), scratch);
        }
      }
      return Status();
    };
    auto time_steps = [&](SampleMode mode, int64_t steps) -> Result<double> {
      const double t = now_s();
      for (int64_t j = 0; j < steps; ++j) DSI_RETURN_IF_ERROR(step(mode));
      DSI_RETURN_IF_ERROR(m.complete_deferred_samples());  // (the last asynchronous step's)
      primed = false;
      return (now_s() - t) / static_cast<double>(steps);
    };
    // The GPU's idle time between decode steps over a run (CudaModelStats::decode_idle_ms).
    auto idle_fraction = [](const gpu::CudaModelStats& b, const gpu::CudaModelStats& e) {
      const double busy = e.decode_gpu_ms - b.decode_gpu_ms;
      const double idle = e.decode_idle_ms - b.decode_idle_ms;
      return busy + idle > 0 ? idle / (busy + idle) : 0.0;
    };
    const int64_t warm = 3;
    for (int64_t k = 0; k < warm; ++k) {
      if (Status s = step(SampleMode::kDeviceGreedy); !s.ok())
        return fail(s);
    }
    const gpu::CudaModelStats before = m.stats();
    const std::array<double, 6> host0 = m.decode_timing().host_phase_ms();
    if (a.profile_range == "decode") {
      cudaProfilerStart();
      if (Status t = perf::kernel_trace_begin(); !t.ok())
        return fail(t);
    }
    Result<double> timed = time_steps(SampleMode::kDeviceGreedy, a.decode_steps);
    if (!timed.ok())
      return fail(timed.status());
    const double step_s = *timed;
    if (a.profile_range == "decode") {
      cudaDeviceSynchronize();
      cudaProfilerStop();
      if (Status t = perf::kernel_trace_end(); !t.ok())
        return fail(t);
    }
    const gpu::CudaModelStats after = m.stats();
    const double steps_d = static_cast<double>(std::max<int64_t>(a.decode_steps, 1));
    // The backend's host time per timed step by phase (backend::Model::DeviceTiming).
    const std::array<double, 6> host1 = m.decode_timing().host_phase_ms();
    json host_phases_json;
    for (size_t p = 0; p < host1.size(); ++p)
      host_phases_json[backend::Model::DeviceTiming::kHostPhaseNames[p]] =
          (host1[p] - host0[p]) / steps_d;
    // The other ways of choosing the tokens, for the ratios (the host sampler sorts the whole
    // vocabulary per row: a few steps are enough).
    json sampling_ms;
    for (const auto& [mode, name, steps] :
         {std::tuple{SampleMode::kDeviceSampled, "device_top_p", a.decode_steps},
          std::tuple{SampleMode::kLogitsToHost, "logits_to_host", a.decode_steps},
          std::tuple{SampleMode::kHostSampled,
                     "logits_to_host_top_p",
                     std::min<int64_t>(a.decode_steps, 4)}}) {
      Result<double> t = time_steps(mode, steps);
      if (!t.ok())
        return fail(t.status());
      sampling_ms[name] = *t * 1e3;
    }
    sampling_ms["device_greedy"] = step_s * 1e3;
    // Asynchronous scheduling's steps (each launched before the previous one's picks are home),
    // after two untimed ones (the shapes with device tokens captured; and the gap after the host
    // sampler's steps above is not one of the timed run's).
    if (Result<double> w = time_steps(SampleMode::kDeviceGreedyAsync, 2); !w.ok())
      return fail(w.status());
    const gpu::CudaModelStats async0 = m.stats();
    Result<double> async_s = time_steps(SampleMode::kDeviceGreedyAsync, a.decode_steps);
    if (!async_s.ok())
      return fail(async_s.status());
    const gpu::CudaModelStats async1 = m.stats();
    sampling_ms["device_greedy_async"] = *async_s * 1e3;
    // One more step, eager and profiled, for the per-layer split.
    m.set_cuda_graphs(false);
    m.set_profile(true);
    if (Status s = step(SampleMode::kDeviceGreedy); !s.ok())
      return fail(s);
    const std::vector<float> prof = m.last_profile_ms();
    m.set_profile(false);
    m.set_cuda_graphs(!a.no_cuda_graphs);
    // The state bytes as this backend stores them (records in deepseek numerics).
    const model::ForwardCost cost =
        model::decode_cost(cfg,
                           (*ckpt)->weights(),
                           batch,
                           context + warm,
                           4.0 * static_cast<double>(state::kv_row_floats(cfg, m.row_format())),
                           4.0 * static_cast<double>(state::index_row_floats(cfg, m.row_format())));
    json row = {{"batch", batch},
                {"context", context},
                {"steps", a.decode_steps},
                {"step_ms", step_s * 1e3},
                {"tokens_per_s", static_cast<double>(batch) / step_s},
                {"cuda_graph_replays", after.graph_replays - before.graph_replays},
                // The GPU's idle time between the timed steps (CudaModelStats::decode_idle_ms).
                {"gpu_idle_ms_per_step",
                 after.decode_gaps > before.decode_gaps
                     ? (after.decode_idle_ms - before.decode_idle_ms) /
                           static_cast<double>(after.decode_gaps - before.decode_gaps)
                     : 0.0},
                {"gpu_idle_fraction", idle_fraction(before, after)},
                {"async_gpu_idle_fraction", idle_fraction(async0, async1)},
                {"backend_host_ms", host_phases_json},
                {"step_ms_by_sampling", sampling_ms},
                {"bytes_per_step", cost.bytes()},
                {"achieved_bytes_per_s", cost.bytes() / step_s},
                {"flops_per_step", cost.flops()},
                {"per_layer_eager", per_layer(cfg, prof)}};
    // The engine's decode step with asynchronous scheduling (its default on CUDA).
    row["async_step_ms"] = *async_s * 1e3;
    if (copy_bw > 0) {
      row["fraction_of_copy_bandwidth"] = cost.bytes() / step_s / copy_bw;
      row["async_fraction_of_copy_bandwidth"] = cost.bytes() / *async_s / copy_bw;
    }
    if (fp8_peak > 0)
      row["fraction_of_fp8_peak"] = cost.flops() / step_s / fp8_peak;
    std::fprintf(stderr,
                 "[bench] decode batch %lld at %lld context: %.3f ms/step, %.1f tok/s (tokens "
                 "chosen on the device; top-p on the device %.3f ms, logits to the host %.3f "
                 "ms, top-p on the host %.3f ms; GPU idle between steps %.1f%%; launched "
                 "ahead %.3f ms/step, GPU idle %.1f%%)\n",
                 static_cast<long long>(batch),
                 static_cast<long long>(context),
                 step_s * 1e3,
                 static_cast<double>(batch) / step_s,
                 sampling_ms["device_top_p"].get<double>(),
                 sampling_ms["logits_to_host"].get<double>(),
                 sampling_ms["logits_to_host_top_p"].get<double>(),
                 100.0 * row["gpu_idle_fraction"].get<double>(),
                 sampling_ms["device_greedy_async"].get<double>(),
                 100.0 * row["async_gpu_idle_fraction"].get<double>());
    decode.push_back(row);
  }
  out["decode"] = decode;
  if (a.long_context > 0) {
    // Issue 13's long-context target: the batch-1 step at --long-context against --context's,
    // timed in this run (the last row is the long one; a batch-1 row at --context if any).
    const json& lr = decode.back();
    double base = 0;
    for (const json& r : decode) {
      if (r["batch"] == 1 && r["context"] == a.context)
        base = r["step_ms"].get<double>();
    }
    json lc = {{"context", a.long_context}, {"step_ms", lr["step_ms"]}};
    if (base > 0) {
      lc["ratio_to_context_step"] = lr["step_ms"].get<double>() / base;
      std::fprintf(stderr,
                   "[bench] batch 1 at %lld context: %.3f ms/step = %.3fx the step at %lld\n",
                   static_cast<long long>(a.long_context),
                   lr["step_ms"].get<double>(),
                   lr["step_ms"].get<double>() / base,
                   static_cast<long long>(a.context));
    }
    out["long_context"] = lc;
  }
  out["notes"] =
      "fractions: prefill FLOPs (weights applied per token x2, attention q.k+p.v, indexer) / "
      "FP8 GEMM peak; decode bytes (dense weights once, routed experts as the expected distinct "
      "experts of the batch under uniform routing, state read at 4 bytes per value) / copy "
      "bandwidth. Decode sequences share one prefilled prefix (forked state).";
  return write_json(out, a.output);
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure prefill and decode speed on the GPU (JSON, with device ceilings)");
  cmd->add_option("--model", a->model_dir, "Model directory (default: $DSINFER_MODEL or bundled)");
  cmd->add_option(
      "--device", a->device, "cuda | cuda:N | cpu (fast path vs reference; see `--cpu-kernels`)");
  CLI::Option* o_numerics =
      cmd->add_option("--numerics", a->numerics, "deepseek (default; cpu: reference) | reference");
  CLI::Option* o_prefill =
      cmd->add_option(
             "--prefill", a->prefill, "Prompt lengths to prefill (default 1024 8192; cpu 64,512)")
          ->delimiter(',');
  CLI::Option* o_batch =
      cmd->add_option(
             "--decode-batch", a->decode_batch, "Decode batch sizes (default 1 64; cpu 1,8,64)")
          ->delimiter(',');
  CLI::Option* o_context = cmd->add_option(
      "--context", a->context, "Context length of the decode runs (default 8192; cpu 128)");
  cmd->add_option("--long-context",
                  a->long_context,
                  "Also decode batch 1 at this context and report its step against --context's "
                  "batch-1 step (e.g. 131072)");
  CLI::Option* o_steps =
      cmd->add_option("--decode-steps", a->decode_steps, "Timed decode steps (default 32; cpu 8)");
  CLI::Option* o_repeats =
      cmd->add_option("--repeats", a->repeats, "Timed prefill runs after a warm-up (default 2)");
  cmd->add_option("--cpu-kernels",
                  a->cpu.kernels,
                  "--device cpu: kernels to compare (default fast,reference)")
      ->delimiter(',');
  cmd->add_option("--cpu-threads", a->cpu.threads, "--device cpu: fast-path threads (default all)");
  cmd->add_option("--prefill-keep-rows",
                  a->cpu.prefill_keep_rows,
                  "DeepSeek V4.1: also time the prefill early exit with the last K rows");
  cmd->add_option("--engram-placement",
                  a->cpu.engram_placement,
                  "DeepSeek V4.1: where the Engram tables live: auto (default: host memory while "
                  "they fit, else mapped; rows gathered on the host) | host | mapped | device "
                  "(GPU memory, rows gathered on the GPU)");
  cmd->add_flag("--engram-compare",
                a->cpu.engram_compare,
                "DeepSeek V4.1 on CUDA: time each decode batch with the Engram rows gathered on "
                "the host, then from tables on the device (both in one process), and print the "
                "host/device step-time ratio (issue 15: within 5%)");
  cmd->add_option("--output", a->output, "Write the JSON here instead of stdout");
  auto* o_state = cmd->add_option("--state-memory",
                                  a->state_memory,
                                  "Report how many tokens of context one sequence's state fits "
                                  "in this budget (default 1GiB); with --speculative, each "
                                  "engine's state memory (default 512MiB)");
  cmd->add_flag("--no-ceilings", a->no_ceilings, "Skip the copy/GEMM ceiling measurements");
  cmd->add_flag("--no-cuda-graphs", a->no_cuda_graphs, "Decode eagerly");
  cmd->add_flag("--batch-invariant",
                a->batch_invariant,
                "Only the fixed-order GEMM kernels (no wgmma): measures batch invariance's cost");
  cmd->add_option("--profile-range",
                  a->profile_range,
                  "prefill | decode: bracket the first timed prefill run or the timed decode "
                  "steps with cudaProfilerStart/Stop (nsys --capture-range=cudaProfilerApi); "
                  "with DSINFER_KERNEL_TRACE=FILE also record the kernels' timeline there "
                  "(CUPTI; tools/bench/kernel_trace.py)")
      ->check(CLI::IsMember({"prefill", "decode"}));
  cmd->add_flag("--ops",
                a->ops,
                "Per-op figures instead of the model: FP8 linears and the MoE experts at "
                "V4-Flash shapes on random weights (no --model needed)");
  cmd->add_option(
         "--op-tokens", a->op_tokens, "Token counts of --ops (default 1,16,64,256,1024,8192)")
      ->delimiter(',');
  a->spec.add_to(cmd);
  cmd->callback([=, &exit_code] {
    if (a->spec.speculative->count() > 0) {
      SpecBenchArgs s;
      s.model_dir = a->model_dir;
      s.device = a->device;
      if (a->device == "cpu" && !a->cpu.kernels.empty())
        s.cpu_kernels = a->cpu.kernels.front();
      s.cpu_threads = a->cpu.threads;
      a->spec.apply(&s);
      if (o_numerics->count() > 0)
        s.numerics = a->numerics;
      if (o_batch->count() > 0)
        s.batch = a->decode_batch;
      if (o_steps->count() > 0)
        s.generate = a->decode_steps;
      if (o_repeats->count() > 0)
        s.repeats = a->repeats;
      if (o_state->count() > 0)
        s.state_memory = a->state_memory;
      s.output = a->output;
      exit_code = run_spec_bench(s);
      return;
    }
    a->numerics_set = o_numerics->count() > 0;
    a->prefill_set = o_prefill->count() > 0;
    a->decode_batch_set = o_batch->count() > 0;
    a->context_set = o_context->count() > 0;
    a->decode_steps_set = o_steps->count() > 0;
    a->repeats_set = o_repeats->count() > 0;
    exit_code = run_bench(*a);
  });
}

}  // namespace dsinfer::cli
