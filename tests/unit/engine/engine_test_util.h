// Helpers shared by the CPU engine tests and the CUDA engine test: the golden fixture model and a
// token mask (engine::TokenMask).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "backend/forward_as_batch.h"
#include "engine/engine.h"
#include "engine/request.h"
#include "model/checkpoint.h"
#include "spec/verify_length.h"
#include "state/page_arena.h"
#include "state/sequence_state.h"

namespace dsinfer::engine::test_support {

// tests/fixtures/tiny-a (official layout), opened once.
inline std::shared_ptr<const model::Checkpoint> tiny_fixture() {
  static std::shared_ptr<const model::Checkpoint> ckpt = [] {
    auto r =
        model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::shared_ptr<const model::Checkpoint>(std::move(r).value());
  }();
  return ckpt;
}

// The bundled model (models/dsv4-mini), opened once; null (with a test failure) when it cannot be.
inline std::shared_ptr<const model::Checkpoint> bundled_model() {
  static std::shared_ptr<const model::Checkpoint> ckpt =
      []() -> std::shared_ptr<const model::Checkpoint> {
    auto r = model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/models/dsv4-mini");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok())
      return nullptr;
    return std::shared_ptr<const model::Checkpoint>(std::move(r).value());
  }();
  return ckpt;
}

// A test backend whose single-sequence forward is its forward_batch of one item.
class BatchedTestModel : public backend::Model {
 public:
  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const backend::ForwardOptions& options,
                 backend::ForwardOutputs* out) override {
    return backend::forward_as_batch(*this, st, tokens, options, out);
  }
};

// The CPU reference forward behind backend::Model, for test backends that change one part of a
// backend's behaviour (in-backend sampling, background page reads, ...) and override it.
class CpuBackedModel : public BatchedTestModel {
 public:
  explicit CpuBackedModel(const model::Checkpoint& ckpt)
      : cpu_(ckpt.config(), ckpt.weights(), model::Numerics::kReference) {}
  Status forward_batch(std::span<backend::ForwardItem> items) override {
    for (backend::ForwardItem& it : items)
      it.status = cpu_.forward(*it.state, it.tokens, it.options, it.out);
    return Status();
  }
  const model::ModelConfig& config() const override { return cpu_.config(); }
  model::Numerics numerics() const override { return cpu_.numerics(); }

 protected:
  cpu::CpuModel cpu_;
};

// One finished request of a conversation test (the prefix cache): its output, logprobs and the
// prompt tokens it restored from the cache.
struct Turn {
  std::vector<int32_t> output;
  std::vector<float> logprobs;
  int64_t cached = 0;
};

// A request of the engine tests: a prompt and how many tokens to generate.
struct Case {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
};

// n cases of random prompts: lengths 1..max_prompt, ids first_id .. first_id + id_span - 1,
// 1..max_out tokens to generate.
inline std::vector<Case> random_cases(
    int n, uint32_t seed, int max_prompt, int32_t first_id, int32_t id_span, int max_out) {
  std::mt19937 g(seed);
  std::vector<Case> out;
  for (int i = 0; i < n; ++i) {
    Case c;
    const int len = 1 + static_cast<int>(g() % static_cast<uint32_t>(max_prompt));
    for (int j = 0; j < len; ++j)
      c.prompt.push_back(static_cast<int32_t>(first_id + g() % static_cast<uint32_t>(id_span)));
    c.max_tokens = 1 + static_cast<int64_t>(g() % static_cast<uint32_t>(max_out));
    out.push_back(c);
  }
  return out;
}

// Greedy, ignoring EOS (every case generates exactly max_tokens).
inline RequestSpec greedy(const Case& c) {
  RequestSpec s;
  s.prompt = c.prompt;
  s.max_tokens = c.max_tokens;
  s.sampling.temperature = 0.0f;
  s.ignore_eos = true;
  return s;
}

// Sampled with every filter and penalty, seeded (the settings vary with the seed).
inline RequestSpec sampled(const Case& c, uint64_t seed) {
  RequestSpec s = greedy(c);
  s.sampling.temperature = 0.8f + 0.1f * static_cast<float>(seed % 5);
  s.sampling.top_k = static_cast<int32_t>(seed % 3 == 0 ? 0 : 20 + seed % 40);
  s.sampling.top_p = seed % 2 ? 0.9f : 1.0f;
  s.sampling.min_p = seed % 4 == 1 ? 0.05f : 0.0f;
  s.sampling.presence_penalty = seed % 5 == 2 ? 0.5f : 0.0f;
  s.sampling.frequency_penalty = seed % 5 == 3 ? 0.3f : 0.0f;
  s.sampling.repetition_penalty = seed % 7 == 4 ? 1.2f : 1.0f;
  s.sampling.seed = seed;
  return s;
}

// Top-p / top-k sampling at temperature 0.9 with a seed (the determinism tests).
inline RequestSpec seeded(const Case& c, uint64_t seed) {
  RequestSpec s = greedy(c);
  s.sampling.temperature = 0.9f;
  s.sampling.top_p = 0.95f;
  s.sampling.top_k = 40;
  s.sampling.seed = seed;
  return s;
}

inline std::vector<RequestSpec> greedy_specs(const std::vector<Case>& cases) {
  std::vector<RequestSpec> v;
  for (const Case& c : cases) v.push_back(greedy(c));
  return v;
}

// sampled() for each case, seeds first_seed, first_seed + 1, ...
inline std::vector<RequestSpec> sampled_specs(const std::vector<Case>& cases, uint64_t first_seed) {
  std::vector<RequestSpec> v;
  for (size_t i = 0; i < cases.size(); ++i) v.push_back(sampled(cases[i], first_seed + i));
  return v;
}

// Submits every spec, steps the engine to the end (checking its integrity after each step) and
// returns each request's output; every request must finish.
inline std::vector<std::vector<int32_t>> run_all(Engine& e, std::vector<RequestSpec> specs) {
  std::vector<RequestId> ids;
  for (auto& s : specs) {
    auto id = e.submit(std::move(s));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  while (e.step()) e.check_integrity();
  e.check_integrity();
  std::vector<std::vector<int32_t>> out;
  for (RequestId id : ids) {
    const Request* r = e.request(id);
    EXPECT_EQ(r->state, RequestState::kFinished) << r->error;
    out.push_back(r->output);
  }
  return out;
}

// Submits one greedy request (temperature 0, EOS not stopping it) for prompt and steps the engine
// until it is done, checking the engine's integrity after each step; returns its id (the request
// is not released).
inline RequestId run_greedy(Engine& e, const std::vector<int32_t>& prompt, int64_t max_tokens) {
  RequestSpec s;
  s.prompt = prompt;
  s.max_tokens = max_tokens;
  s.sampling.temperature = 0.0f;
  s.ignore_eos = true;
  auto id = e.submit(std::move(s));
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  while (!e.request(*id)->done()) {
    e.step();
    e.check_integrity();
  }
  return *id;
}

// State-image page transfers for host-storage arenas (state::capture_state / restore_state).
inline state::PageReader host_page_reader(const state::PageArena& a) {
  return [&a](std::span<const int32_t> pages, float* dst) {
    const size_t n = static_cast<size_t>(a.page_floats());
    for (size_t i = 0; i < pages.size(); ++i) std::memcpy(dst + i * n, a.page(pages[i]), n * 4);
    return Status();
  };
}
// The image as the engine's background captures build it: planned from the state, its pages
// copied out (here at once), then assembled from the copy alone (state::plan_image,
// state::assemble_image). It must equal capture_state's byte for byte.
inline Result<std::string> planned_image(const state::SequenceState& st,
                                         const state::ImageOptions& options = {}) {
  DSI_ASSIGN_OR_RETURN(state::ImagePlan plan, state::plan_image(st, options));
  std::vector<float> copy(plan.pages.size() * static_cast<size_t>(plan.page_floats));
  DSI_RETURN_IF_ERROR(host_page_reader(*st.arena())(plan.pages, copy.data()));
  return state::assemble_image(plan, copy);
}
inline state::PageWriter host_page_writer(state::PageArena& a) {
  return [&a](std::span<const int32_t> pages, const float* src) {
    const size_t n = static_cast<size_t>(a.page_floats());
    for (size_t i = 0; i < pages.size(); ++i) std::memcpy(a.page(pages[i]), src + i * n, n * 4);
    return Status();
  };
}

// A mask whose allowed set depends on how many tokens it has accepted (the n-th token must be
// n mod 3, mod 3), as a grammar's does: a mask asked at the wrong time, asked twice for one
// token, or not told about one, shows in the output.
class PositionalMask : public TokenMask {
 public:
  bool fill(std::span<uint32_t> bits) override {
    for (size_t t = 0; t < bits.size() * 32; ++t) {
      if (static_cast<int64_t>(t % 3) == accepted_ % 3)
        bits[t / 32] |= 1u << (t % 32);
    }
    return true;
  }
  void accept(int32_t) override { ++accepted_; }

 private:
  int64_t accepted_ = 0;
};

// A step-time model (spec/verify_length.h) in which drafting up to k tokens pays for a request
// decoding alone and never at batch 2 or more (verification costly there), for the tests of a
// request that stops speculating and resumes once its batch shrinks; and those tests' two
// prompts (24 and 33 tokens).
inline spec::StepTimes pays_only_alone_times(int32_t k) {
  spec::StepTimes t;
  for (int64_t b : {1, 2, 64}) {
    t.batch.push_back(b);
    t.off_s.push_back(static_cast<double>(b));
    t.verify_s.emplace_back();
    for (int32_t l = 1; l <= k + 1; ++l)
      t.verify_s.back().push_back(b == 1 ? 1.0 + 0.01 * l : static_cast<double>(b) + 10.0 * l);
    t.draft_s.emplace_back();
    for (int32_t d = 1; d <= k; ++d) t.draft_s.back().push_back(b == 1 ? 0.02 * d : 1.0 * d);
  }
  return t;
}

inline std::vector<std::vector<int32_t>> resume_test_prompts() {
  std::mt19937 g(71);
  std::vector<std::vector<int32_t>> prompts(2);
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int j = 0; j < 24 + 9 * static_cast<int>(i); ++j)
      prompts[i].push_back(static_cast<int32_t>(100 + g() % 3000));
  }
  return prompts;
}

// n random requests of the asynchronous-scheduling tests (seeded): prompts of 1..40 ids in
// 2..501 and 1..12 tokens out (within max_len when > 0), EOS stopping half of them, greedy or
// seeded at temperature 0.9, logprobs in half, stop ids in a third; one in eight with a
// repetition penalty, one in eight with a token mask, and where `top_logprobs`, one in eight
// with top_logprobs.
inline std::vector<RequestSpec> random_requests(uint32_t seed,
                                                int n,
                                                int64_t max_len,
                                                bool top_logprobs) {
  std::mt19937 h(seed);
  std::vector<RequestSpec> v;
  for (int i = 0; i < n; ++i) {
    RequestSpec s;
    const int len = 1 + static_cast<int>(h() % 40);
    for (int j = 0; j < len; ++j) s.prompt.push_back(static_cast<int32_t>(2 + h() % 500));
    s.max_tokens = 1 + static_cast<int64_t>(h() % 12);
    if (max_len > 0) {
      s.prompt.resize(std::min<size_t>(s.prompt.size(), static_cast<size_t>(max_len - 1)));
      s.max_tokens = std::min(s.max_tokens, max_len - static_cast<int64_t>(s.prompt.size()));
    }
    s.ignore_eos = h() % 2 == 0;
    s.sampling.seed = h();
    s.sampling.temperature = h() % 3 == 0 ? 0.0f : 0.9f;
    s.sampling.logprobs = h() % 2 == 0;
    if (h() % 3 == 0)
      s.stop_token_ids = {17, 101, 250, 333, 404, static_cast<int32_t>(2 + h() % 500)};
    const uint32_t kind = h() % 8;
    if (kind == 0)
      s.sampling.repetition_penalty = 1.2f;
    if (kind == 1)
      s.token_mask = std::make_unique<PositionalMask>();
    if (kind == 2 && top_logprobs)
      s.sampling.top_logprobs = 1;
    v.push_back(std::move(s));
  }
  return v;
}

}  // namespace dsinfer::engine::test_support
