// `dsinfer bench --speculative`: speculative decoding speed through the engine.
#include "cli/bench_spec.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "base/strings.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "spec/config.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {
namespace {

using json = nlohmann::ordered_json;

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// What one (mode, batch) run measured.
struct Run {
  double tokens_per_s = 0;       // while all b requests of a wave decode (the batch is b)
  double wave_tokens_per_s = 0;  // over each wave's whole decode, its tail included
  // Waves in which a request finished before the last one started (the state memory or the
  // scheduler never ran all b at once): no step of them is a batch of b, and tokens_per_s is the
  // whole waves' figure instead.
  int64_t short_waves = 0;
  spec::Stats spec;  // this run's share of the engine's counters
  // The device's idle share of the window's decode steps (drafting calls included; the host's
  // part of a step: planning, synchronisations): Model::decode_timing. < 0: not measured.
  double gpu_idle_fraction = -1;
  // Milliseconds per step of the engine's phases over the same window (EngineStats::StepPhases:
  // schedule, draft, prepare, forward, finish); all 0 where no step ran at batch b.
  std::array<double, 5> phase_ms{};
  // Milliseconds per step of the backend's host phases in its decode-shaped calls over the same
  // window (Model::DeviceTiming: before the device starts, enqueueing, waiting, after); all 0
  // where not measured (CPU).
  std::array<double, 6> host_ms{};
  // Steps that ran a shape for the first times during the run's waves (Model::shape_warmups:
  // CUDA's graph captures and eager first runs), one-time costs inside the timed rounds.
  int64_t shape_warmups = 0;
};

constexpr const auto& kPhaseNames = engine::EngineStats::StepPhases::kNames;
using Timing = backend::Model::DeviceTiming;
constexpr const auto& kHostPhaseNames = Timing::kHostPhaseNames;

spec::Stats minus(const spec::Stats& a, const spec::Stats& b) {
  spec::Stats d = a;
  for (size_t i = 0; i < d.verified.size() && i < b.verified.size(); ++i) {
    d.verified[i] -= b.verified[i];
    d.accepted[i] -= b.accepted[i];
  }
  for (size_t i = 0; i < d.verify_len.size() && i < b.verify_len.size(); ++i)
    d.verify_len[i] -= b.verify_len[i];
  d.spec_steps -= b.spec_steps;
  d.spec_tokens -= b.spec_tokens;
  d.drafted -= b.drafted;
  return d;
}

void add(spec::Stats& a, const spec::Stats& b) {
  if (a.verified.size() < b.verified.size() || a.verify_len.size() < b.verify_len.size())
    a.resize(static_cast<int32_t>(b.verified.size()));
  for (size_t i = 0; i < b.verified.size(); ++i) {
    a.verified[i] += b.verified[i];
    a.accepted[i] += b.accepted[i];
  }
  for (size_t i = 0; i < b.verify_len.size(); ++i) a.verify_len[i] += b.verify_len[i];
  a.spec_steps += b.spec_steps;
  a.spec_tokens += b.spec_tokens;
  a.drafted += b.drafted;
}

// Requests measured per (batch size, mode, round): at batch sizes below this, several waves of b
// requests run one after the other. A greedy continuation is deterministic, and the bundled model
// often falls into a short cycle whose drafts fail at the same depth every time (batch 1's single
// prompt did: a 7-token cycle in which the MTP chain never got past depth 3, so the table showed
// acceptance 0.00 at depths 4 and 5 however many rounds ran); a batch of one request measured a
// single sequence, not the drafter.
constexpr int64_t kMinRequests = 16;

// Where the prompts come from: random token ids, or windows of a tokenized text.
struct PromptSource {
  int64_t vocab = 0;
  std::vector<int32_t> text;  // empty: random ids
};

// The prompt of request i of wave w at batch size b in round `round` (-1: the warm-up): random
// tokens (or a window of the text at a random offset), the same in every mode, different in
// every round, wave and request.
std::vector<int32_t> bench_prompt(
    const PromptSource& src, int64_t len, int64_t b, int64_t round, int64_t w, int64_t i) {
  std::seed_seq seq{static_cast<uint32_t>(b),
                    static_cast<uint32_t>(round + 1),
                    static_cast<uint32_t>(w),
                    static_cast<uint32_t>(i)};
  std::mt19937 g(seq);  // (the random ids are those of earlier tables)
  if (!src.text.empty()) {
    const uint64_t starts = static_cast<uint64_t>(src.text.size()) - static_cast<uint64_t>(len) + 1;
    const uint64_t r = (static_cast<uint64_t>(g()) << 32) | g();
    const auto at = src.text.begin() + static_cast<int64_t>(r % starts);
    return std::vector<int32_t>(at, at + len);
  }
  std::vector<int32_t> p;
  for (int64_t t = 0; t < len; ++t)
    p.push_back(static_cast<int32_t>(3 + g() % static_cast<uint32_t>(src.vocab - 3)));
  return p;
}

// --prompt-text: the file tokenized with the model's tokenizer.json (no special tokens).
Result<std::vector<int32_t>> load_prompt_text(const std::string& path,
                                              const std::string& model_dir,
                                              int64_t prompt_len) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return not_found("--prompt-text: cannot open " + path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto tok = tokenizer::Tokenizer::load(model_dir + "/tokenizer.json");
  if (!tok.ok())
    return tok.status().with_context("--prompt-text needs the model's tokenizer.json");
  auto ids = (*tok)->encode(text, false);
  if (!ids.ok())
    return ids.status().with_context("--prompt-text " + path);
  if (static_cast<int64_t>(ids->size()) < prompt_len)
    return invalid_argument(str_format("--prompt-text %s: %zu tokens, fewer than a prompt (%lld)",
                                       path.c_str(),
                                       ids->size(),
                                       static_cast<long long>(prompt_len)));
  return std::move(ids).value();
}

// Waves of b greedy requests (bench_prompt; at least kMinRequests requests in all), decode tokens
// per second over two windows of each wave, both from the step after its last prefill: up to the
// step in which its first request finishes (every step a batch of b: the figure at batch b, as a
// serving engine kept at b requests runs it) and up to its end. The second includes the wave's
// tail, steps of fewer and fewer requests whose length depends on how the acceptance spreads the
// requests' finishing steps (~half of a 48-token wave at batch 64 on the bundled model,
// seventeenth session): a property of waves, not of the batch size.
Result<Run> run_once(
    engine::Engine& e, const SpecBenchArgs& a, const PromptSource& src, int64_t b, int64_t round) {
  const int64_t waves = (kMinRequests + b - 1) / b;
  const spec::Stats before = e.stats().spec;
  const int64_t warmups0 = e.model().shape_warmups();
  int64_t tokens = 0, full_tokens = 0, short_waves = 0, full_steps = 0;
  double dt = 0, full_dt = 0, busy_ms = 0, idle_ms = 0;
  std::array<double, 5> phase_s{};
  std::array<double, 6> host_total{};
  for (int64_t w = 0; w < waves; ++w) {
    std::vector<engine::RequestId> ids;
    for (int64_t i = 0; i < b; ++i) {
      engine::RequestSpec s;
      s.prompt = bench_prompt(src, a.prompt, b, round, w, i);
      s.max_tokens = a.generate;
      s.sampling.temperature = 0.0f;
      s.ignore_eos = true;
      auto id = e.submit(std::move(s));
      if (!id.ok())
        return id.status();
      ids.push_back(*id);
    }
    // Prefill: until every request has its first token.
    auto all_started = [&] {
      for (engine::RequestId id : ids) {
        const engine::Request* r = e.request(id);
        if (r->output.empty() && !r->done())
          return false;
      }
      return true;
    };
    auto any_done = [&] {
      for (engine::RequestId id : ids) {
        if (e.request(id)->done())
          return true;
      }
      return false;
    };
    while (!all_started() && e.step()) {
    }
    const int64_t g0 = e.stats().generated_tokens;
    const double t0 = now_s();
    const backend::Model::DeviceTiming d0 = e.model().decode_timing();
    const int64_t steps0 = e.stats().steps;
    const std::array<double, 5> p0 = e.stats().phases.seconds();
    bool full = !any_done();
    if (!full)
      ++short_waves;
    auto close_window = [&] {
      full = false;
      full_dt += now_s() - t0;
      full_tokens += e.stats().generated_tokens - g0;
      const backend::Model::DeviceTiming d1 = e.model().decode_timing();
      busy_ms += d1.busy_ms - d0.busy_ms;
      idle_ms += d1.idle_ms - d0.idle_ms;
      const std::array<double, 6> h0 = d0.host_phase_ms(), h1 = d1.host_phase_ms();
      for (size_t i = 0; i < h1.size(); ++i) host_total[i] += h1[i] - h0[i];
      full_steps += e.stats().steps - steps0;
      const std::array<double, 5> p1 = e.stats().phases.seconds();
      for (size_t i = 0; i < p1.size(); ++i) phase_s[i] += p1[i] - p0[i];
    };
    while (e.step()) {
      if (full && any_done())
        close_window();
    }
    dt += now_s() - t0;
    tokens += e.stats().generated_tokens - g0;
    if (full)  // (e.step() returned false in the step that finished the wave)
      close_window();
    for (engine::RequestId id : ids) {
      const engine::Request* r = e.request(id);
      if (r->state != engine::RequestState::kFinished || !r->error.empty())
        return Status(StatusCode::kInternal, "bench request failed: " + r->error);
    }
  }
  Run run;
  run.wave_tokens_per_s = dt > 0 ? static_cast<double>(tokens) / dt : 0;
  run.short_waves = short_waves;
  run.tokens_per_s = short_waves > 0 || full_dt <= 0 ? run.wave_tokens_per_s
                                                     : static_cast<double>(full_tokens) / full_dt;
  run.spec = minus(e.stats().spec, before);
  run.shape_warmups = e.model().shape_warmups() - warmups0;
  if (busy_ms + idle_ms > 0)
    run.gpu_idle_fraction = idle_ms / (busy_ms + idle_ms);
  for (size_t i = 0; i < phase_s.size() && full_steps > 0; ++i)
    run.phase_ms[i] = 1e3 * phase_s[i] / static_cast<double>(full_steps);
  for (size_t i = 0; i < host_total.size() && full_steps > 0; ++i)
    run.host_ms[i] = host_total[i] / static_cast<double>(full_steps);
  return run;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

Result<std::vector<std::string>> expand_spec_modes(const std::vector<std::string>& modes) {
  std::vector<std::string> out;
  for (const std::string& m : modes) {
    if (m == "all") {
      for (const char* x : {"off", "fixed:1", "fixed:2", "fixed:3", "fixed:4", "fixed:5", "auto"})
        out.push_back(x);
      continue;
    }
    auto c = spec::parse_config(m);
    if (!c.ok())
      return c.status().with_context("bench --speculative");
    out.push_back(m);
  }
  if (out.empty())
    return invalid_argument("bench --speculative: no modes");
  return out;
}

void SpecBenchFlags::add_to(CLI::App* cmd) {
  speculative =
      cmd->add_option("--speculative",
                      modes,
                      "Speculative decoding speed through the engine instead: the modes to "
                      "compare (off, fixed:K, auto; `all` = off,fixed:1..5,auto), decode tokens/s "
                      "per batch size (default 1,16,64) with acceptance by draft position")
          ->delimiter(',');
  cmd->add_option("--warmup",
                  warmup,
                  "With --speculative: untimed rounds per mode before the timed ones (default 3: "
                  "every shape's CUDA graphs captured and auto's exploration done, as in a "
                  "serving engine's steady state)");
  cmd->add_option("--prompt-text",
                  prompt_text,
                  "With --speculative: prompts are windows of this text file (tokenized with the "
                  "model's tokenizer.json) instead of random token ids, for the drafter's "
                  "acceptance on natural text")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--interleave-modes",
                interleave,
                "With --speculative: keep every mode's engine (its own copy of the weights) alive "
                "and run the rounds round-robin over the modes, so that a drift of the machine's "
                "speed spreads over them instead of falling on the last modes");
  cmd->add_option("--forced-acceptance",
                  forced_acceptance,
                  "With --speculative: accept each verified draft with this probability whatever "
                  "the target says (a trained-like acceptance for random-weight checkpoints whose "
                  "drafter accepts nothing; step costs are real, tokens are not the model's)");
  cmd->add_flag("--no-async-scheduling",
                no_async,
                "With --speculative: every engine waits for each step's tokens (by default, as "
                "`generate` and `serve`, a step of plain decodes is launched while the one before "
                "it runs: `off`, and auto's steps without speculation)");
}

void SpecBenchFlags::apply(SpecBenchArgs* s) const {
  s->modes = modes;
  s->warmup = warmup;
  s->prompt_text = prompt_text;
  s->interleave = interleave;
  s->forced_acceptance = forced_acceptance;
  s->async_scheduling = !no_async;
}

int run_spec_bench(const SpecBenchArgs& a) {
  auto modes = expand_spec_modes(a.modes);
  if (!modes.ok())
    return fail(modes.status());
  if (a.batch.empty())
    return fail(invalid_argument("bench --speculative: no batch sizes"));
  for (int64_t b : a.batch) {
    if (b < 1)
      return fail(invalid_argument("--decode-batch sizes must be >= 1"));
  }
  if (a.prompt < 1 || a.generate < 2 || a.repeats < 1 || a.warmup < 1)
    return fail(invalid_argument(
        "bench --speculative: prompt >= 1, generated tokens (--decode-steps) >= 2, --repeats >= "
        "1, --warmup >= 1"));
  engine::EngineConfig base;
  base.model_dir = resolve_model_dir(a.model_dir);
  if (Status s = parse_device(a.device, &base); !s.ok())
    return fail(s);
  auto numerics = resolve_numerics(a.numerics, base.device);
  if (!numerics.ok())
    return fail(numerics.status());
  base.numerics = *numerics;
  auto kernels = parse_cpu_kernels(a.cpu_kernels);
  if (!kernels.ok())
    return fail(kernels.status());
  base.cpu_kernels = *kernels;
  base.cpu_threads = a.cpu_threads;
  auto budget = parse_bytes("--state-memory", a.state_memory);
  if (!budget.ok())
    return fail(budget.status());
  base.state_budget_bytes = *budget;
  if (a.forced_acceptance < 0 || a.forced_acceptance > 1)
    return fail(invalid_argument("--forced-acceptance must be in [0, 1]"));
  base.forced_acceptance = a.forced_acceptance;
  base.async_scheduling = a.async_scheduling;
  PromptSource prompts;
  if (!a.prompt_text.empty()) {
    auto text = load_prompt_text(a.prompt_text, base.model_dir, a.prompt);
    if (!text.ok())
      return fail(text.status());
    prompts.text = std::move(text).value();
    std::fprintf(stderr,
                 "[bench speculative] prompts: windows of %lld tokens of %s (%zu tokens)\n",
                 static_cast<long long>(a.prompt),
                 a.prompt_text.c_str(),
                 prompts.text.size());
  }
  const int64_t max_b = *std::max_element(a.batch.begin(), a.batch.end());
  base.scheduler.max_running = max_b;
  base.scheduler.max_tokens_per_step = std::max<int64_t>(256, max_b * 8);
  // One engine at a time (each holds its own copy of the weights: a multi-GiB checkpoint does not
  // fit several times), every batch size and round on it, then the next mode; with --interleave-
  // modes every engine at once and the rounds round-robin over the modes, so that a drift of the
  // machine's speed spreads over them instead of falling on the last modes.
  const size_t nb = a.batch.size(), nm = modes->size();
  // [batch][mode]: each round's tokens/s and the summed speculation counters.
  std::vector<std::vector<std::vector<double>>> tps(nb, std::vector<std::vector<double>>(nm));
  auto wave_tps = tps;
  auto idle = tps;     // each round's GPU idle fraction, where measured
  auto warmups = tps;  // each round's shape warm-ups
  // [batch][mode][phase]: each round's milliseconds per step of the engine's phases.
  std::vector<std::vector<std::array<std::vector<double>, kPhaseNames.size()>>> phases(
      nb, std::vector<std::array<std::vector<double>, kPhaseNames.size()>>(nm));
  // [batch][mode][phase]: each round's backend host milliseconds per step (Run::host_ms).
  std::vector<std::vector<std::array<std::vector<double>, kHostPhaseNames.size()>>> host_phases(
      nb, std::vector<std::array<std::vector<double>, kHostPhaseNames.size()>>(nm));
  std::vector<std::vector<bool>> short_runs(nb, std::vector<bool>(nm, false));
  std::vector<std::vector<spec::Stats>> stats(nb, std::vector<spec::Stats>(nm));
  std::vector<spec::Mode> kinds(nm, spec::Mode::kOff);
  std::string backend_name;
  // Mode mi's engine, warmed up: every batch size --warmup times, untimed.
  auto start_mode = [&](size_t mi) -> Result<std::unique_ptr<engine::Engine>> {
    const std::string& m = (*modes)[mi];
    engine::EngineConfig cfg = base;
    cfg.speculative = *spec::parse_config(m);
    std::fprintf(stderr, "[bench speculative] %s: starting the engine...\n", m.c_str());
    auto e = engine::Engine::create(cfg);
    if (!e.ok())
      return e.status().with_context("--speculative " + m);
    engine::Engine& eng = **e;
    kinds[mi] = eng.speculative().mode;
    prompts.vocab = eng.model().config().vocab_size;
    backend_name = eng.model().name();
    if (kinds[mi] == spec::Mode::kAuto)
      std::fprintf(stderr,
                   "[bench speculative] auto's step-time model (ms):\n%s",
                   spec::describe(eng.step_times()).c_str());
    // Warm-up rounds at every batch size: every weight used once, the fast path's conversions
    // done, the workspace grown and each shape's CUDA graphs captured before anything is timed,
    // and auto's exploration of the depths next to its pick done: the steady state of a serving
    // engine, where each shape is captured once per process. (With one warm-up round auto met
    // shapes for the first time in the timed rounds, each run eagerly and then captured, and
    // lost to every fixed mode at batch 16 and 64 by that alone.)
    for (int64_t w = 0; w < a.warmup; ++w) {
      for (int64_t b : a.batch) {
        auto run = run_once(eng, a, prompts, b, -1 - 1000 * w);
        if (!run.ok())
          return run.status();
      }
    }
    return std::move(e).value();
  };
  // Round r of mode mi: every batch size once, recorded.
  auto measure = [&](size_t mi, engine::Engine& eng, int64_t r) -> Status {
    const std::string& m = (*modes)[mi];
    for (size_t bi = 0; bi < nb; ++bi) {
      auto run = run_once(eng, a, prompts, a.batch[bi], r);
      if (!run.ok())
        return run.status().with_context("--speculative " + m);
      tps[bi][mi].push_back(run->tokens_per_s);
      wave_tps[bi][mi].push_back(run->wave_tokens_per_s);
      if (run->gpu_idle_fraction >= 0)
        idle[bi][mi].push_back(run->gpu_idle_fraction);
      warmups[bi][mi].push_back(static_cast<double>(run->shape_warmups));
      for (size_t p = 0; p < kPhaseNames.size(); ++p) phases[bi][mi][p].push_back(run->phase_ms[p]);
      for (size_t p = 0; p < kHostPhaseNames.size(); ++p)
        host_phases[bi][mi][p].push_back(run->host_ms[p]);
      if (run->short_waves > 0) {
        std::fprintf(stderr,
                     "[bench speculative] batch %lld %s: %lld wave(s) never ran all %lld "
                     "requests at once (state memory: --state-memory); tokens/s is the whole "
                     "waves' figure\n",
                     static_cast<long long>(a.batch[bi]),
                     m.c_str(),
                     static_cast<long long>(run->short_waves),
                     static_cast<long long>(a.batch[bi]));
        short_runs[bi][mi] = true;
      }
      add(stats[bi][mi], run->spec);
      std::fprintf(stderr,
                   "[bench speculative] round %lld batch %lld %s: %.1f tokens/s (whole "
                   "waves %.1f)%s%s; ms per step: schedule %.3f, draft %.3f, prepare %.3f, "
                   "forward %.3f, finish %.3f%s\n",
                   static_cast<long long>(r + 1),
                   static_cast<long long>(a.batch[bi]),
                   m.c_str(),
                   run->tokens_per_s,
                   run->wave_tokens_per_s,
                   run->gpu_idle_fraction >= 0
                       ? str_format("; GPU idle %.1f%%", 100.0 * run->gpu_idle_fraction).c_str()
                       : "",
                   run->shape_warmups > 0 ? str_format("; %lld shape warm-ups",
                                                       static_cast<long long>(run->shape_warmups))
                                                .c_str()
                                          : "",
                   run->phase_ms[0],
                   run->phase_ms[1],
                   run->phase_ms[2],
                   run->phase_ms[3],
                   run->phase_ms[4],
                   run->host_ms[0] + run->host_ms[1] + run->host_ms[2] + run->host_ms[3] > 0
                       ? str_format("; backend host: before %.3f (checks %.3f, plan %.3f), "
                                    "launch %.3f, wait %.3f, after %.3f",
                                    run->host_ms[0],
                                    run->host_ms[4],
                                    run->host_ms[5],
                                    run->host_ms[1],
                                    run->host_ms[2],
                                    run->host_ms[3])
                             .c_str()
                       : "");
    }
    return Status();
  };
  if (a.interleave) {
    std::vector<std::unique_ptr<engine::Engine>> engines(nm);
    for (size_t mi = 0; mi < nm; ++mi) {
      auto e = start_mode(mi);
      if (!e.ok())
        return fail(e.status());
      engines[mi] = std::move(e).value();
    }
    for (int64_t r = 0; r < a.repeats; ++r) {
      for (size_t mi = 0; mi < nm; ++mi) {
        if (Status s = measure(mi, *engines[mi], r); !s.ok())
          return fail(s);
      }
    }
  } else {
    for (size_t mi = 0; mi < nm; ++mi) {
      auto e = start_mode(mi);
      if (!e.ok())
        return fail(e.status());
      for (int64_t r = 0; r < a.repeats; ++r) {
        if (Status s = measure(mi, **e, r); !s.ok())
          return fail(s);
      }
    }  // the engine and its weights go here, before the next mode's
  }
  json out;
  out["device"] = a.device;
  out["model"] = base.model_dir;
  out["backend"] = backend_name;
  out["numerics"] = model::numerics_name(base.numerics);
  out["hardware_threads"] = std::thread::hardware_concurrency();
  out["prompt_tokens"] = a.prompt;
  out["generated_tokens"] = a.generate;
  out["repeats"] = a.repeats;
  out["warmup_rounds"] = a.warmup;
  out["interleaved"] = a.interleave;
  out["min_requests_per_run"] = kMinRequests;
  // Forced: the drafts' acceptance is injected (step costs real, tokens not the model's).
  out["forced_acceptance"] = a.forced_acceptance;
  out["async_scheduling"] = a.async_scheduling;
  json rows = json::array();
  std::string table = str_format("%6s %-8s %10s %7s %13s %10s %7s %s\n",
                                 "batch",
                                 "mode",
                                 "tok/s",
                                 "x off",
                                 "range",
                                 "waves",
                                 "x off",
                                 "accept by position | mean accepted length | mean verify len");
  for (size_t bi = 0; bi < nb; ++bi) {
    // The ratio to `off` of this batch size, when off was measured.
    double off = 0, wave_off = 0;
    for (size_t mi = 0; mi < nm; ++mi) {
      if (kinds[mi] == spec::Mode::kOff) {
        off = median(tps[bi][mi]);
        wave_off = median(wave_tps[bi][mi]);
      }
    }
    for (size_t mi = 0; mi < nm; ++mi) {
      const double med = median(tps[bi][mi]);
      const double wave_med = median(wave_tps[bi][mi]);
      const auto [lo, hi] = std::minmax_element(tps[bi][mi].begin(), tps[bi][mi].end());
      const spec::Stats& st = stats[bi][mi];
      json row;
      row["batch"] = a.batch[bi];
      row["mode"] = (*modes)[mi];
      row["tokens_per_s"] = med;
      row["tokens_per_s_runs"] = tps[bi][mi];
      if (off > 0)
        row["ratio_to_off"] = med / off;
      // false: some wave never had all b requests decoding at once (tokens_per_s is then the
      // whole waves' figure for those rounds).
      row["full_batch"] = !short_runs[bi][mi];
      row["wave_tokens_per_s"] = wave_med;
      row["wave_tokens_per_s_runs"] = wave_tps[bi][mi];
      // The device idle between the window's decode launches (forwards and drafting calls), as a
      // fraction of their time: the host's share of a step (null where not measured: CPU).
      row["gpu_idle_fraction"] = idle[bi][mi].empty() ? json(nullptr) : json(median(idle[bi][mi]));
      // Steps of each round's waves that ran a shape for the first times (0 where the backend
      // prepares nothing): the one-time costs the timed rounds still met.
      row["shape_warmups_runs"] = warmups[bi][mi];
      // Milliseconds per step of the engine's phases (medians over the rounds): the drafter's
      // and the forward's calls whole, the engine's own host work beside them.
      json ph;
      for (size_t p = 0; p < kPhaseNames.size(); ++p)
        ph[kPhaseNames[p]] = median(phases[bi][mi][p]);
      row["step_phase_ms"] = ph;
      // Milliseconds per step of the backend's host phases in its decode-shaped calls (medians
      // over the rounds): with the engine's phases, where the device's idle time goes (null
      // where the backend does not measure them: CPU).
      json hp;
      double host_sum = 0;
      for (size_t p = 0; p < kHostPhaseNames.size(); ++p) {
        const double v = median(host_phases[bi][mi][p]);
        hp[kHostPhaseNames[p]] = v;
        host_sum += p < Timing::kHostPhases ? v : 0.0;
      }
      row["backend_host_ms"] = host_sum > 0 ? hp : json(nullptr);
      if (wave_off > 0)
        row["wave_ratio_to_off"] = wave_med / wave_off;
      json acc = json::array();
      std::string accs;
      for (size_t i = 0; i < st.verified.size(); ++i) {
        acc.push_back(st.acceptance(i));
        accs += str_format(" %.2f", st.acceptance(i));
      }
      row["acceptance_by_position"] = acc;
      row["verified_by_position"] = st.verified;
      row["mean_accepted_length"] = st.mean_accepted_length();
      row["mean_verify_length"] = st.mean_verify_len();
      // Drafts made per decode request-step (more than the verify length when auto drafted and
      // then verified fewer).
      int64_t steps = 0;
      for (int64_t v : st.verify_len) steps += v;
      row["drafts_per_step"] =
          steps > 0 ? static_cast<double>(st.drafted) / static_cast<double>(steps) : 0.0;
      rows.push_back(row);
      table += str_format("%6lld %-8s %10.1f %7s %6.1f-%-6.1f %10.1f %7s%s | %.2f | %.2f\n",
                          static_cast<long long>(a.batch[bi]),
                          (*modes)[mi].c_str(),
                          med,
                          off > 0 ? str_format("%.2f", med / off).c_str() : "-",
                          *lo,
                          *hi,
                          wave_med,
                          wave_off > 0 ? str_format("%.2f", wave_med / wave_off).c_str() : "-",
                          accs.empty() ? " -" : accs.c_str(),
                          st.mean_accepted_length(),
                          st.mean_verify_len());
    }
  }
  out["speculative"] = rows;
  // Auto against the best of the other modes measured (off and the fixed depths) at each batch
  // size: the ratio of the medians, and whether the rounds' ranges overlap (within the run's
  // spread), the check issue 16's acceptance asks for.
  json verdicts = json::array();
  for (size_t bi = 0; bi < nb; ++bi) {
    int best = -1, autom = -1;
    for (size_t mi = 0; mi < nm; ++mi) {
      if (tps[bi][mi].empty())
        continue;
      if (kinds[mi] == spec::Mode::kAuto) {
        autom = autom < 0 ? static_cast<int>(mi) : autom;
      } else if (best < 0 || median(tps[bi][mi]) > median(tps[bi][static_cast<size_t>(best)])) {
        best = static_cast<int>(mi);
      }
    }
    if (best < 0 || autom < 0)
      continue;
    const std::vector<double>& a_runs = tps[bi][static_cast<size_t>(autom)];
    const std::vector<double>& b_runs = tps[bi][static_cast<size_t>(best)];
    const double ratio = median(a_runs) / median(b_runs);
    const bool overlap = *std::max_element(a_runs.begin(), a_runs.end()) >=
                         *std::min_element(b_runs.begin(), b_runs.end());
    json v;
    v["batch"] = a.batch[bi];
    v["best_mode"] = (*modes)[static_cast<size_t>(best)];
    v["ratio"] = ratio;
    v["ranges_overlap"] = overlap;
    verdicts.push_back(v);
    table += str_format("batch %lld: auto %.2fx the best other mode (%s)%s\n",
                        static_cast<long long>(a.batch[bi]),
                        ratio,
                        (*modes)[static_cast<size_t>(best)].c_str(),
                        ratio >= 1.0 ? ""
                        : overlap    ? ", within the rounds' spread"
                                     : ", outside the rounds' spread");
  }
  if (!verdicts.empty())
    out["auto_vs_best"] = verdicts;
  std::fprintf(stderr, "%s", table.c_str());
  return write_output(out.dump(2), a.output, "bench speculative");
}

}  // namespace dsinfer::cli
