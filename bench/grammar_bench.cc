// Structured outputs: the per-token cost of a grammar mask (src/grammar) on the engine's step
// loop: fill the matcher's mask, apply it to a logits row (sampling::apply_token_mask) and accept
// the chosen token. Random walks under a JSON schema (a token drawn from the allowed ones; EOS
// once allowed, half the time). Vocabularies: the bundled model's (8192 tokens) and, when
// $DSINFER_V4_TOKENIZER names it, DeepSeek V4's (129280). Results: docs/server.md.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace dsinfer;

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 16},
  "age": {"type": "integer", "minimum": 0, "maximum": 120},
  "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "maxItems": 4},
  "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                              "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
              "required": ["city", "zip"]}},
  "required": ["name", "age", "tags", "address"]})";

void mask_step(benchmark::State& state, const std::string& tokenizer_path) {
  auto tok = tokenizer::Tokenizer::load(tokenizer_path);
  if (!tok.ok()) {
    state.SkipWithError(tok.status().to_string().c_str());
    return;
  }
  const int32_t vocab = (*tok)->vocab_size();
  const int32_t eos = *(*tok)->added_token_id("<｜end▁of▁sentence｜>");
  auto compiler = grammar::Compiler::create(**tok, vocab, {eos});
  if (!compiler.ok()) {
    state.SkipWithError(compiler.status().to_string().c_str());
    return;
  }
  auto g = (*compiler)->compile({grammar::Kind::kJsonSchema, kSchema});
  if (!g.ok()) {
    state.SkipWithError(g.status().to_string().c_str());
    return;
  }
  std::mt19937 rng(1);
  std::vector<uint32_t> bits(grammar::mask_words(vocab));
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<int32_t> allowed;
  auto m = std::move(grammar::Matcher::create(*g)).value();
  for (auto _ : state) {
    if (m->terminated()) {
      state.PauseTiming();
      m = std::move(grammar::Matcher::create(*g)).value();
      state.ResumeTiming();
    }
    std::fill(logits.begin(), logits.end(), 0.5f);
    bits.assign(bits.size(), 0u);
    if (m->fill_mask(bits))
      sampling::apply_token_mask(logits, bits);
    // Stand-in for the sampler's choice (not timed as mask overhead would be: kept small).
    state.PauseTiming();
    allowed.clear();
    for (int32_t t = 0; t < vocab; ++t) {
      if (grammar::mask_allows(bits, t))
        allowed.push_back(t);
    }
    int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    if (grammar::mask_allows(bits, eos) && (rng() & 1))
      t = eos;
    state.ResumeTiming();
    benchmark::DoNotOptimize(m->accept(t).ok());
  }
}

void BM_MaskStepMini(benchmark::State& state) {
  mask_step(state, std::string(DSI_SOURCE_DIR) + "/models/dsv4-mini/tokenizer.json");
}
BENCHMARK(BM_MaskStepMini)->Unit(benchmark::kMicrosecond);

void BM_MaskStepV4(benchmark::State& state) {
  const char* p = std::getenv("DSINFER_V4_TOKENIZER");
  if (p == nullptr || *p == '\0') {
    state.SkipWithError("DSINFER_V4_TOKENIZER not set");
    return;
  }
  mask_step(state, p);
}
BENCHMARK(BM_MaskStepV4)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
