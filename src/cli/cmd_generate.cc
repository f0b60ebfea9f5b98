// `dsinfer generate`: offline batch generation through the engine. One request from flags
// (--prompt, --prompt-token-ids or --messages; completion printed to stdout) or many from a
// JSONL file (--input/--output, one output line per input line, in input order), with a
// progress bar on a terminal and a closing summary (throughput, TTFT/TPOT percentiles).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/strings.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "frontend/offline.h"
#include "tokenizer/tokenizer.h"
#if DSINFER_HAVE_CUDA_BACKEND
#include "comm/bootstrap.h"
#include "comm/launcher.h"
#endif

namespace dsinfer::cli {

namespace {
using json = nlohmann::ordered_json;

struct GenerateArgs {
  EngineFlags engine;
  std::string prompt;
  std::string prompt_token_ids;
  std::string messages;
  std::string input;
  std::string output;
  int64_t max_tokens = 128;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::string stop_token_ids;
  bool ignore_eos = false;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t logprobs = 0;
  std::string thinking = "off";
  bool no_progress = false;
};

// One input line / flag set, resolved to engine input.
struct Job {
  frontend::OfflineJob job;
  std::vector<frontend::TokenLogprobs> logprobs;  // with job.logprobs > 0
  engine::RequestId id = 0;
  bool other_rank = false;  // served by another expert-parallel rank
};

frontend::OfflineDefaults offline_defaults(const GenerateArgs& a,
                                           const std::vector<int32_t>& stop_token_ids) {
  frontend::OfflineDefaults d;
  d.max_tokens = a.max_tokens;
  d.sampling.temperature = a.temperature;
  d.sampling.top_p = a.top_p;
  d.sampling.top_k = a.top_k;
  d.sampling.min_p = a.min_p;
  d.sampling.seed = a.seed;
  d.sampling.presence_penalty = a.presence_penalty;
  d.sampling.frequency_penalty = a.frequency_penalty;
  d.sampling.repetition_penalty = a.repetition_penalty;
  d.logprobs = a.logprobs;
  d.stop = a.stop;
  d.stop_token_ids = stop_token_ids;
  d.ignore_eos = a.ignore_eos;
  d.thinking = a.thinking == "on";
  return d;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty())
    return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

// This process's place among the expert-parallel ranks (rank 0 of 1 unless started as a rank).
struct RankInfo {
  int rank = 0;
  int size = 1;
  std::string results_dir;
};
constexpr const char* kEnvResultsDir = "DSINFER_EP_RESULTS_DIR";

RankInfo rank_info() {
  RankInfo r;
#if DSINFER_HAVE_CUDA_BACKEND
  if (comm::rank_env_present()) {
    auto boot = comm::bootstrap_from_env();
    if (boot.ok()) {
      r.rank = boot->rank;
      r.size = boot->size;
    }
    if (const char* d = std::getenv(kEnvResultsDir))
      r.results_dir = d;
  }
#endif
  return r;
}

// Prints the results as the single-process run does: text (or ids) per request on stdout, or
// JSONL to --output; then the summary line. Exit code 1 when every request failed.
int emit_results(const GenerateArgs& a,
                 std::vector<json> results,
                 bool have_tokenizer,
                 double wall,
                 int64_t preemptions,
                 const std::string& spec_line = "") {
  std::sort(results.begin(), results.end(), [](const json& x, const json& y) {
    return x["index"].get<int64_t>() < y["index"].get<int64_t>();
  });
  std::vector<double> ttft, tpot;
  int64_t prompt_tokens = 0, gen_tokens = 0, failed = 0;
  std::ofstream out;
  if (!a.output.empty()) {
    out.open(a.output);
    if (!out)
      return fail(io_error("--output: cannot write " + a.output));
  }
  std::string first_error;
  for (const json& o : results) {
    // A request that failed (a bad input line, or an engine error after it started: no memory,
    // a device fault) carries an error.
    if (o.contains("error")) {
      ++failed;
      if (first_error.empty())
        first_error = o["error"].get<std::string>();
    }
    if (!o.contains("output_token_ids")) {
      if (out.is_open())
        out << o.dump() << "\n";
      continue;
    }
    const double t_first = o["ttft_s"].get<double>();
    const double t_total = o["latency_s"].get<double>();
    const int64_t n_out = o["completion_tokens"].get<int64_t>();
    if (t_first >= 0)
      ttft.push_back(t_first);
    if (n_out > 1 && t_first >= 0)
      tpot.push_back((t_total - t_first) / static_cast<double>(n_out - 1));
    prompt_tokens += o["prompt_tokens"].get<int64_t>();
    gen_tokens += n_out;
    if (out.is_open()) {
      out << o.dump() << "\n";
    } else if (have_tokenizer) {
      const std::string text = o["text"].get<std::string>();
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
    } else {
      std::printf("%s\n", o["output_token_ids"].dump().c_str());
    }
  }
  std::fprintf(stderr,
               "[generate] %zu requests (%lld failed) | prompt %lld tok, generated %lld tok | "
               "%.2f s | %.1f generated tok/s | TTFT p50 %.1f ms p90 %.1f ms p99 %.1f ms | "
               "TPOT p50 %.1f ms p90 %.1f ms p99 %.1f ms | preemptions %lld\n",
               results.size(),
               static_cast<long long>(failed),
               static_cast<long long>(prompt_tokens),
               static_cast<long long>(gen_tokens),
               wall,
               static_cast<double>(gen_tokens) / wall,
               1e3 * percentile(ttft, 0.5),
               1e3 * percentile(ttft, 0.9),
               1e3 * percentile(ttft, 0.99),
               1e3 * percentile(tpot, 0.5),
               1e3 * percentile(tpot, 0.9),
               1e3 * percentile(tpot, 0.99),
               static_cast<long long>(preemptions));
  if (!first_error.empty())
    std::fprintf(stderr, "[generate] first error: %s\n", first_error.c_str());
  if (!spec_line.empty())
    std::fprintf(stderr, "[generate] %s\n", spec_line.c_str());
  return failed == static_cast<int64_t>(results.size()) ? 1 : 0;
}

// A rank's share of the results, for the launching process to merge.
int write_rank_results(const std::vector<json>& results, const RankInfo& rank) {
  if (rank.results_dir.empty())
    return fail(invalid_argument(std::string(kEnvResultsDir) + " is not set for this rank"));
  const std::string path = rank.results_dir + "/rank" + std::to_string(rank.rank) + ".jsonl";
  std::ofstream out(path);
  for (const json& o : results) out << o.dump() << "\n";
  out.close();
  if (!out)
    return fail(io_error("cannot write " + path));
  return 0;
}

#if DSINFER_HAVE_CUDA_BACKEND
// `generate --ep N`: one process per GPU running this same command as rank r (requests
// with index % N == r), lockstepped through their MoE exchanges; this process waits for them
// and prints the merged results in input order.
int launch_ranks(const GenerateArgs& a, int n) {
  char tmpl[] = "/tmp/dsinfer-ep-XXXXXX";
  if (mkdtemp(tmpl) == nullptr)
    return fail(io_error("cannot create a results directory under /tmp"));
  const std::string dir = tmpl;
  auto id_file = comm::make_id_file_path();
  if (!id_file.ok())
    return fail(id_file.status());
  setenv(kEnvResultsDir, dir.c_str(), 1);
  std::fprintf(stderr, "[generate] expert parallelism: launching %d ranks (one per GPU)\n", n);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto pids = comm::spawn_ranks(n, program_args(), *id_file);
  if (!pids.ok())
    return fail(pids.status());
  Status st = comm::wait_ranks(*pids);
  (void)comm::remove_id_file(*id_file);
  const double wall = std::chrono::duration<double>(clock::now() - t0).count();
  std::vector<json> results;
  for (int r = 0; r < n && st.ok(); ++r) {
    std::ifstream in(dir + "/rank" + std::to_string(r) + ".jsonl");
    if (!in) {
      st = Status(StatusCode::kInternal, str_format("rank %d wrote no results", r));
      break;
    }
    std::string line;
    while (std::getline(in, line)) results.push_back(json::parse(line));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!st.ok())
    return fail(st);
  return emit_results(a, std::move(results), /*have_tokenizer=*/true, wall, 0);
}
#endif

int run_generate(const GenerateArgs& a) {
  const int sources = static_cast<int>(!a.prompt.empty()) +
                      static_cast<int>(!a.prompt_token_ids.empty()) +
                      static_cast<int>(!a.messages.empty()) + static_cast<int>(!a.input.empty());
  if (sources != 1) {
    return fail(invalid_argument(
        "give exactly one of --prompt, --prompt-token-ids, --messages or --input FILE.jsonl"));
  }
  if (!a.input.empty() && a.output.empty()) {
    return fail(invalid_argument("--input needs --output FILE.jsonl"));
  }
  auto setup = resolve_engine_flags(a.engine);
  if (!setup.ok())
    return fail(setup.status());
  if (a.thinking != "on" && a.thinking != "off") {
    return fail(invalid_argument("--thinking must be `on` or `off`"));
  }
#if DSINFER_HAVE_CUDA_BACKEND
  if (setup->config.expert_parallel > 0 && !comm::rank_env_present())
    return launch_ranks(a, setup->config.expert_parallel);
#endif
  const std::string model_dir = setup->config.model_dir;
  auto eng = engine::Engine::create(setup->config);
  if (!eng.ok())
    return fail(eng.status());
  engine::Engine& e = **eng;
  if (e.speculative().mode == spec::Mode::kAuto) {
    std::fprintf(stderr,
                 "[generate] speculative %s: step-time model (ms per step; verify of 1..%d "
                 "tokens per sequence, drafting of 1..%d steps):\n%s",
                 spec::to_string(e.speculative()).c_str(),
                 e.speculative().k + 1,
                 e.speculative().k,
                 spec::describe(e.step_times()).c_str());
  }

  std::unique_ptr<tokenizer::Tokenizer> tok;
  const std::string tok_path = model_dir + "/tokenizer.json";
  if (FILE* f = std::fopen(tok_path.c_str(), "rb")) {
    std::fclose(f);
    auto t = tokenizer::Tokenizer::load(tok_path);
    if (!t.ok())
      return fail(t.status());
    tok = std::move(t).value();
  }

  // Inputs as JSON objects.
  std::vector<json> lines;
  if (!a.input.empty()) {
    std::ifstream in(a.input);
    if (!in)
      return fail(not_found("--input: cannot open " + a.input));
    std::string text;
    int64_t n = 0;
    while (std::getline(in, text)) {
      ++n;
      if (text.find_first_not_of(" \t\r") == std::string::npos)
        continue;
      json j = json::parse(text, nullptr, false);
      if (j.is_discarded())
        j = json(str_format("line %lld is not valid JSON", static_cast<long long>(n)));
      lines.push_back(std::move(j));
    }
  } else if (!a.prompt.empty()) {
    lines.push_back({{"prompt", a.prompt}});
  } else if (!a.messages.empty()) {
    json m = json::parse(a.messages, nullptr, false);
    if (m.is_discarded())
      return fail(invalid_argument("--messages is not valid JSON"));
    lines.push_back({{"messages", m}});
  } else {
    auto ids = parse_token_ids(a.prompt_token_ids);
    if (!ids.ok())
      return fail(ids.status().with_context("--prompt-token-ids"));
    lines.push_back({{"prompt_token_ids", *ids}});
  }
  std::vector<int32_t> flag_stop_ids;
  if (!a.stop_token_ids.empty()) {
    auto ids = parse_token_ids(a.stop_token_ids);
    if (!ids.ok())
      return fail(ids.status().with_context("--stop-token-ids"));
    flag_stop_ids = *ids;
  }

  // Expert parallelism over several processes: this process is rank r of n and serves the
  // requests with index % n == r (data-parallel attention: whole sequences per rank).
  const RankInfo rank = rank_info();
  frontend::OfflineDefaults defaults = offline_defaults(a, flag_stop_ids);
  // The model's tokenizer policy for text prompts (DeepSeek V4.1's release policy adds BOS).
  defaults.text_prompt_bos = e.model().text_prompt_bos();
  std::vector<Job> jobs(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    Job& j = jobs[i];
    if (static_cast<int>(i % static_cast<size_t>(rank.size)) != rank.rank) {
      j.other_rank = true;
      continue;
    }
    if (lines[i].is_string()) {
      j.job.error = lines[i].get<std::string>();
      continue;
    }
    j.job = frontend::make_offline_job(lines[i], defaults, tok.get(), setup->version);
    if (!j.job.error.empty())
      continue;
    engine::TokenCallback on_token;
    if (j.job.logprobs > 0) {
      on_token = [&j](const engine::TokenEvent& ev) {
        j.logprobs.push_back({ev.token, ev.logprob, ev.top_logprobs});
      };
    }
    auto id = e.submit(std::move(j.job.spec), std::move(on_token));
    if (!id.ok()) {
      j.job.error = id.status().message();
      continue;
    }
    j.id = *id;
  }
  if (lines.size() == 1 && !jobs[0].job.error.empty())
    return fail(invalid_argument(jobs[0].job.error));
  int64_t mine = 0;
  for (const Job& j : jobs) mine += !j.other_rank;

  // Run with a progress bar on a terminal.
  const bool progress = !a.no_progress && isatty(STDERR_FILENO);
  const double t_start = e.now_s();
  int64_t last_draw = -1;
  while (true) {
    const Result<bool> more = e.step_all_ranks();
    if (!more.ok() || !*more)
      break;
    if (!progress)
      continue;
    const auto st = e.stats();
    if (st.steps - last_draw < 4)
      continue;
    last_draw = st.steps;
    int64_t done = 0;
    for (const Job& j : jobs) done += j.id && e.request(j.id)->done();
    (void)mine;
    const double dt = std::max(1e-9, e.now_s() - t_start);
    std::fprintf(stderr,
                 "\r[generate] %lld/%zu done | %lld prompt + %lld generated tokens | %.1f tok/s   ",
                 static_cast<long long>(done),
                 jobs.size(),
                 static_cast<long long>(st.prompt_tokens),
                 static_cast<long long>(st.generated_tokens),
                 static_cast<double>(st.generated_tokens) / dt);
  }
  if (progress)
    std::fprintf(stderr, "\n");
  if (Status h = e.health(); !h.ok())
    return fail(h);  // a device failure: every request failed, nothing to report
  const double wall = std::max(1e-9, e.now_s() - t_start);

  // Results, one object per input line.
  std::vector<json> results;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    if (job.other_rank)
      continue;
    if (!job.job.error.empty() || job.id == 0) {
      results.push_back({{"index", i}, {"error", job.job.error}});
      continue;
    }
    results.push_back(frontend::offline_result(
        static_cast<int64_t>(i), job.job, *e.request(job.id), tok.get(), job.logprobs));
  }
  if (!rank.results_dir.empty())
    return write_rank_results(results, rank);
  const engine::EngineStats st = e.stats();
  std::string spec_line;
  if (st.speculative.mode != spec::Mode::kOff) {
    spec_line = "speculative " + spec::to_string(st.speculative) + ": " + st.spec.summary();
  }
  if (st.async_steps > 0) {
    spec_line += str_format("%sasynchronous scheduling: %lld of %lld steps launched ahead",
                            spec_line.empty() ? "" : " | ",
                            static_cast<long long>(st.async_steps),
                            static_cast<long long>(st.steps));
  }
  return emit_results(a, results, tok != nullptr, wall, st.preemptions, spec_line);
}
}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate completions offline");
  add_engine_flags(cmd, &a->engine);
  cmd->add_option("--prompt", a->prompt, "Prompt text (completion, no chat template)");
  cmd->add_option("--prompt-token-ids", a->prompt_token_ids, "Prompt as comma-separated ids");
  cmd->add_option("--messages",
                  a->messages,
                  "Chat messages as a JSON list ([{\"role\":\"user\",\"content\":\"...\"}])");
  cmd->add_option("--input",
                  a->input,
                  "JSONL requests: prompt | prompt_token_ids | messages, plus per-line sampling "
                  "fields (max_tokens, temperature, top_p, top_k, min_p, seed, stop, ...)");
  cmd->add_option("--output", a->output, "JSONL results, one line per input line, in order");
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens to generate per request (default 128)");
  cmd->add_option("--temperature", a->temperature, "Sampling temperature; 0 = greedy (default 1)");
  cmd->add_option("--top-p", a->top_p, "Nucleus sampling mass (default 1)");
  cmd->add_option("--top-k", a->top_k, "Keep the k most likely tokens (0 = off)");
  cmd->add_option("--min-p", a->min_p, "Drop tokens below min_p * p_max (default 0)");
  cmd->add_option("--seed", a->seed, "Sampling seed (per request)");
  cmd->add_option("--stop", a->stop, "Stop string (repeatable)");
  cmd->add_option("--stop-token-ids", a->stop_token_ids, "Comma-separated stop token ids");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep generating after EOS");
  cmd->add_option("--presence-penalty", a->presence_penalty, "[-2, 2]");
  cmd->add_option("--frequency-penalty", a->frequency_penalty, "[-2, 2]");
  cmd->add_option("--repetition-penalty", a->repetition_penalty, "(0, 10], 1 = off");
  cmd->add_option("--logprobs", a->logprobs, "Top logprobs to compute per token (0..20)");
  cmd->add_option("--thinking", a->thinking, "Chat thinking mode: on | off (default off)");
  cmd->add_flag("--no-progress", a->no_progress, "No progress bar");
  cmd->callback([a, &exit_code] { exit_code = run_generate(*a); });
}

}  // namespace dsinfer::cli
