// DSpark on the CPU (spec deepseek-v41.md §7): the target forward writes each block's context KV
// from the target layers' features into the sequence state's draft rings, chunking-invariant
// and exact under rollback; the drafter's heads (Markov bigram term from the previous token,
// confidence from the pre-norm hidden) and its sampler hook; clear errors. No public oracle runs
// DSpark (the transformers port ignores mtp.*), so these check the spec's wiring and invariants.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu_v41/backend.h"
#include "backend/cpu_v41/model.h"
#include "engine/engine.h"
#include "kernels/cpu/ops.h"
#include "model_v41/checkpoint.h"
#include "model_v41/synthetic.h"
#include "tensor/safetensors.h"

namespace dsinfer::cpu_v41 {
namespace {

// A tiny V4.1 with three DSpark target layers (5, 6, 7) and two draft blocks, written once.
const std::string& dspark_dir() {
  static const std::string dir = [] {
    const std::string d = (std::filesystem::temp_directory_path() /
                           ("dsinfer-v41-dspark-" + std::to_string(getpid())))
                              .string();
    nlohmann::json cfg = model_v41::v41_tiny_config_json(true);
    auto& t = cfg["text_config"];
    t["num_nextn_predict_layers"] = 2;
    t["compress_ratios"] = {0, 0, 2, 2, 2, 1, 1, 1, 0, 0};
    t["dspark_target_layer_ids"] = {5, 6, 7};
    model_v41::V41SyntheticSpec spec;
    spec.config = cfg;
    spec.seed = 11;
    const Status s = model_v41::write_v41_synthetic(spec, d);
    EXPECT_TRUE(s.ok()) << s.to_string();
    nlohmann::json map = {{"compressed_vocab_size", 96}, {"pad_id", 2}};
    for (int i = 0; i < 96; ++i) map["token_map"].push_back(i);
    std::ofstream(d + "/engram_token_map.json") << map.dump();
    return d;
  }();
  return dir;
}

struct Tiny {
  std::unique_ptr<V41Backend> backend;
  const V41CpuModel& m() const { return backend->v41(); }
  const V41Config& c() const { return backend->checkpoint().config(); }
};

Tiny open_tiny() {
  auto b = V41Backend::open(dspark_dir(), {});
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return Tiny{std::move(b).value()};
}

std::vector<int32_t> prompt(int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(3 + (i * 29 + 7) % 90));
  return p;
}

void prefill(const V41CpuModel& m, V41SequenceState& st, std::span<const int32_t> ids, int chunk) {
  for (size_t b = 0; b < ids.size(); b += static_cast<size_t>(chunk)) {
    std::vector<float> logits;
    const size_t n = std::min(ids.size() - b, static_cast<size_t>(chunk));
    ASSERT_TRUE(m.forward(st, ids.subspan(b, n), &logits).ok());
  }
}

std::vector<float> ring_rows(const state::SequenceState& st, int block, int64_t from, int64_t to) {
  std::vector<float> v;
  const state::LayerState& ls = st.mtp_layers()[static_cast<size_t>(block)];
  for (int64_t p = from; p < to; ++p) v.insert(v.end(), ls.ring_slot(p), ls.ring_slot(p) + 64);
  return v;
}

TEST(V41Dspark, ContextKvAndDraftsDoNotDependOnChunking) {
  const Tiny t = open_tiny();
  ASSERT_TRUE(t.m().has_dspark()) << t.m().dspark_error();
  const auto ids = prompt(45);
  DraftResult want;
  std::vector<float> want_ring;
  for (int chunk : {45, 1, 7}) {
    V41SequenceState st = make_v41_state(t.c());
    prefill(t.m(), st, ids, chunk);
    // The last window of context KV of both blocks (nonzero: written by the forward).
    std::vector<float> ring = ring_rows(*st.seq, 0, 45 - 16, 45);
    const std::vector<float> ring1 = ring_rows(*st.seq, 1, 45 - 16, 45);
    ring.insert(ring.end(), ring1.begin(), ring1.end());
    DraftResult d;
    ASSERT_TRUE(t.m().draft(*st.seq, 17, {}, &d).ok());
    ASSERT_EQ(d.tokens.size(), 5u);
    if (chunk == 45) {
      want = d;
      want_ring = ring;
      EXPECT_GT(std::count_if(ring.begin(), ring.end(), [](float x) { return x != 0.0f; }), 0);
      continue;
    }
    EXPECT_EQ(ring, want_ring) << "chunk " << chunk;
    EXPECT_EQ(d.tokens, want.tokens) << "chunk " << chunk;
    EXPECT_EQ(d.logits, want.logits) << "chunk " << chunk;
    EXPECT_EQ(d.confidence, want.confidence) << "chunk " << chunk;
  }
}

TEST(V41Dspark, HeadsFollowTheSpec) {
  const Tiny t = open_tiny();
  const V41Config& c = t.c();
  const model_v41::DsparkWeights& w = t.backend->checkpoint().weights().dspark;
  V41SequenceState st = make_v41_state(c);
  prefill(t.m(), st, prompt(30), 30);
  // A sampler that records what it saw and picks a fixed token: prev_{k+1} must follow it.
  std::vector<std::vector<float>> seen;
  DraftOptions o;
  o.block = 4;
  o.confidence_temperature = 0.5f;
  o.sample = [&](int64_t k, std::span<const float> l) {
    EXPECT_EQ(k, static_cast<int64_t>(seen.size()));
    seen.emplace_back(l.begin(), l.end());
    return static_cast<int32_t>(40 + k);
  };
  DraftResult d;
  ASSERT_TRUE(t.m().draft(*st.seq, 9, o, &d).ok());
  ASSERT_EQ(d.tokens, (std::vector<int32_t>{40, 41, 42, 43}));
  const int64_t D = c.hidden_size, V = c.vocab_size, R = c.dspark_markov_rank;
  ASSERT_EQ(d.hidden.size(), static_cast<size_t>(4 * D));
  std::vector<float> hn(static_cast<size_t>(D)), head(static_cast<size_t>(V));
  std::vector<float> e(static_cast<size_t>(R)), markov(static_cast<size_t>(V));
  int32_t prev = 9;
  for (int64_t k = 0; k < 4; ++k) {
    const float* h = d.hidden.data() + k * D;
    // l_k = head(RMSNorm_norm(h_k)) + markov_head . markov_embed[prev_k].
    cpu::rms_norm(h, 1, D, w.norm.data(), static_cast<float>(c.rms_norm_eps), hn.data());
    cpu::linear(t.backend->checkpoint().weights().head, hn.data(), 1, head.data(), false);
    w.markov_embed.dequant_row(prev, e.data());
    cpu::linear(w.markov_head, e.data(), 1, markov.data(), false);
    for (int64_t v = 0; v < V; ++v) {
      const float want = head[static_cast<size_t>(v)] + markov[static_cast<size_t>(v)];
      ASSERT_NEAR(d.logits[static_cast<size_t>(k * V + v)], want, 1e-4f * (1 + std::fabs(want)));
      ASSERT_EQ(seen[static_cast<size_t>(k)][static_cast<size_t>(v)],
                d.logits[static_cast<size_t>(k * V + v)]);
    }
    // c_k = sigmoid(clamp(w . [h_k (pre-norm) ; markov_embed[prev_k]] / T, -60, 60)).
    double z = 0;
    for (int64_t i = 0; i < D; ++i) z += static_cast<double>(w.confidence[i]) * h[i];
    for (int64_t i = 0; i < R; ++i) z += static_cast<double>(w.confidence[D + i]) * e[i];
    const double want_c = 1.0 / (1.0 + std::exp(-std::clamp(z / 0.5, -60.0, 60.0)));
    EXPECT_NEAR(d.confidence[static_cast<size_t>(k)], want_c, 1e-5);
    EXPECT_GT(d.confidence[static_cast<size_t>(k)], 0.0f);
    EXPECT_LT(d.confidence[static_cast<size_t>(k)], 1.0f);
    prev = d.tokens[static_cast<size_t>(k)];
  }
  // Greedy: d_k is the argmax of l_k.
  DraftResult g;
  ASSERT_TRUE(t.m().draft(*st.seq, 9, {}, &g).ok());
  for (int64_t k = 0; k < 5; ++k) {
    const float* row = g.logits.data() + k * V;
    EXPECT_EQ(g.tokens[static_cast<size_t>(k)], std::max_element(row, row + V) - row);
  }
  // Non-causal inside the block: the anchor row sees the noise rows, so B changes row 0.
  DraftOptions one;
  one.block = 1;
  DraftResult b1;
  ASSERT_TRUE(t.m().draft(*st.seq, 9, one, &b1).ok());
  EXPECT_NE(std::vector<float>(g.logits.begin(), g.logits.begin() + V), b1.logits);
}

TEST(V41Dspark, RejectedVerifyRowsRollBackExactly) {
  const Tiny t = open_tiny();
  const auto ids = prompt(33);
  V41SequenceState fresh = make_v41_state(t.c());
  prefill(t.m(), fresh, ids, 33);
  DraftResult want;
  ASSERT_TRUE(t.m().draft(*fresh.seq, 21, {}, &want).ok());
  // Verify [anchor, drafts] (6 rows), reject everything, draft again.
  V41SequenceState st = make_v41_state(t.c());
  prefill(t.m(), st, ids, 33);
  std::vector<int32_t> verify = {21};
  verify.insert(verify.end(), want.tokens.begin(), want.tokens.end());
  std::vector<float> logits;
  ASSERT_TRUE(t.m().forward(st, verify, &logits).ok());
  ASSERT_TRUE(rollback_v41_state(t.c(), st, 33).ok());
  DraftResult again;
  ASSERT_TRUE(t.m().draft(*st.seq, 21, {}, &again).ok());
  EXPECT_EQ(again.tokens, want.tokens);
  EXPECT_EQ(again.logits, want.logits);
  EXPECT_EQ(again.confidence, want.confidence);
}

TEST(V41Dspark, ThroughTheEngineBackendAndClearErrors) {
  engine::EngineConfig cfg;
  cfg.model_dir = dspark_dir();
  cfg.state_budget_bytes = int64_t{16} << 20;
  auto e = engine::Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const auto* b = dynamic_cast<const V41Backend*>(&(*e)->model());
  ASSERT_NE(b, nullptr);
  // The engine's sequence states carry the draft rings (one per block).
  state::SequenceState st(*b->state_shape(), const_cast<state::PageArena*>(&(*e)->arena()), 99);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st.mtp_layers().size(), 2u);
  DraftResult d;
  EXPECT_EQ(b->draft(st, 5, {}, &d).code(), StatusCode::kInvalidArgument);  // nothing computed
  backend::ForwardOutputs out;
  backend::ForwardOptions fo;
  fo.last_logits_only = true;
  const auto ids = prompt(20);
  ASSERT_TRUE(const_cast<V41Backend*>(b)->forward(st, ids, fo, &out).ok());
  ASSERT_TRUE(b->draft(st, 5, {}, &d).ok());
  V41SequenceState alone = make_v41_state(b->checkpoint().config());
  prefill(b->v41(), alone, ids, 20);
  DraftResult want;
  ASSERT_TRUE(b->v41().draft(*alone.seq, 5, {}, &want).ok());
  EXPECT_EQ(d.logits, want.logits);
  DraftOptions big;
  big.block = 6;  // needs 7 rows of backtracking
  EXPECT_EQ(b->draft(st, 5, big, &d).code(), StatusCode::kInvalidArgument);
  DraftOptions cold;
  cold.confidence_temperature = 0.0f;
  EXPECT_EQ(b->draft(st, 5, cold, &d).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->draft(st, 96, {}, &d).code(), StatusCode::kInvalidArgument);
  // A checkpoint without DSpark blocks: FailedPrecondition.
  auto nb =
      V41Backend::open(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/v41-tiny-b/official", {});
  ASSERT_TRUE(nb.ok()) << nb.status().to_string();
  EXPECT_FALSE((*nb)->v41().has_dspark());
  V41SequenceState s2 = make_v41_state((*nb)->checkpoint().config());
  prefill((*nb)->v41(), s2, ids, 20);
  EXPECT_EQ((*nb)->draft(*s2.seq, 5, {}, &d).code(), StatusCode::kFailedPrecondition);
}

// The golden fixture (tools/reference/v41: model.py's draft, written from the spec
// independently of this code): after the 100-token prompt, a block of 5 anchored at the
// target's greedy token with confidence temperature 0.75, in both numerics, the prompt prefilled
// whole and in chunks of 7.
TEST(V41Dspark, MatchesTheReferenceFixture) {
  const std::string fx = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/v41-tiny";
  V41BackendOptions ro;
  auto bref = V41Backend::open(fx + "/official", ro);
  ro.numerics = model::Numerics::kDeepSeek;
  auto bds = V41Backend::open(fx + "/official", ro);
  ASSERT_TRUE(bref.ok() && bds.ok()) << bref.status().to_string();
  auto f = SafetensorsFile::open(fx + "/reference.safetensors");
  ASSERT_TRUE(f.ok());
  auto floats = [&](const std::string& name) {
    const TensorInfo* t = (*f)->find(name);
    EXPECT_NE(t, nullptr) << name;
    const auto* p = static_cast<const float*>(t->data);
    return std::vector<float>(p, p + t->numel());
  };
  auto ints = [&](const std::string& name) {
    const TensorInfo* t = (*f)->find(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<int32_t> v;
    for (int64_t i = 0; i < t->numel(); ++i)
      v.push_back(static_cast<int32_t>(static_cast<const int64_t*>(t->data)[i]));
    return v;
  };
  const std::vector<int32_t> ids = ints("input_ids");
  for (const char* numerics : {"reference", "deepseek"}) {
    const V41Backend& b = std::string(numerics) == "reference" ? **bref : **bds;
    ASSERT_TRUE(b.v41().has_dspark()) << b.v41().dspark_error();
    const std::string k = std::string("dspark_") + numerics + "_";
    const int32_t anchor = ints(k + "anchor")[0];
    for (int chunk : {100, 7}) {
      V41SequenceState st = make_v41_state(b.checkpoint().config());
      prefill(b.v41(), st, ids, chunk);
      DraftOptions o;
      o.block = 5;
      o.confidence_temperature = 0.75f;
      DraftResult d;
      ASSERT_TRUE(b.draft(*st.seq, anchor, o, &d).ok());
      EXPECT_EQ(d.tokens, ints(k + "tokens")) << numerics << " chunk " << chunk;
      for (auto [got, name, tol] : {std::tuple{&d.logits, "logits", 2e-3},
                                    std::tuple{&d.confidence, "confidence", 1e-4},
                                    std::tuple{&d.hidden, "hidden", 2e-3}}) {
        const std::vector<float> want = floats(k + name);
        ASSERT_EQ(got->size(), want.size()) << name;
        double worst = 0, mean = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          const double e = std::fabs(static_cast<double>((*got)[i]) - want[i]);
          worst = std::max(worst, e);
          mean += e / static_cast<double>(want.size());
        }
        EXPECT_LE(worst, tol) << numerics << " " << name << " chunk " << chunk;
        std::printf("%s %s chunk %d: max |d| %.2e\n", numerics, name, chunk, worst);
        EXPECT_LE(mean, tol / 10) << numerics << " " << name << " chunk " << chunk;
      }
    }
  }
}

// Removes the synthetic checkpoint after every test ran.
class Cleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dspark_dir(), ec);
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new Cleanup);

}  // namespace
}  // namespace dsinfer::cpu_v41
