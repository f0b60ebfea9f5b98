// The V4.1 CPU forward against the golden fixtures of tools/reference/v41 (spec-derived PyTorch
// reference, itself checked against the transformers port): both checkpoint layouts, both
// numerics, the whole prompt and chunks of 1, 7 and 64 (max |dlogit| <= 2e-3, mean <= 2e-4).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/cpu_v41/model.h"
#include "model_v41/checkpoint.h"
#include "model_v41/engram.h"
#include "model_v41/state_layout.h"
#include "model_v41/synthetic.h"
#include "tensor/safetensors.h"

namespace dsinfer::cpu_v41 {
namespace {

using json = nlohmann::json;

const std::string kFixtures = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/";
const std::string kFixture = kFixtures + "v41-tiny";

json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

EngramHashParams hash_params(const std::string& fixture = kFixture) {
  const json meta = read_json(fixture + "/meta.json");
  EngramHashParams h;
  for (const auto& v : meta["engram_token_map"]) h.token_map.push_back(v.get<int32_t>());
  for (const auto& row : meta["engram_multipliers"]) {
    std::vector<int64_t> r;
    for (const auto& v : row) r.push_back(std::stoll(v.get<std::string>()));
    h.multipliers.push_back(r);
  }
  return h;
}

struct Golden {
  std::vector<int32_t> ids;
  std::vector<float> reference, deepseek;
};

Golden golden(const std::string& fixture = kFixture) {
  auto f = SafetensorsFile::open(fixture + "/reference.safetensors");
  EXPECT_TRUE(f.ok());
  Golden g;
  const TensorInfo* ids = (*f)->find("input_ids");
  for (int64_t i = 0; i < ids->numel(); ++i)
    g.ids.push_back(static_cast<int32_t>(static_cast<const int64_t*>(ids->data)[i]));
  for (auto [name, out] :
       {std::pair{"logits_reference", &g.reference}, {"logits_deepseek", &g.deepseek}}) {
    const TensorInfo* t = (*f)->find(name);
    const auto* p = static_cast<const float*>(t->data);
    out->assign(p, p + t->numel());
  }
  return g;
}

std::vector<float> fixture_tensor(const std::string& name) {
  auto f = SafetensorsFile::open(kFixture + "/reference.safetensors");
  EXPECT_TRUE(f.ok());
  const TensorInfo* t = (*f)->find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) {
    return {};
  }
  const auto* p = static_cast<const float*>(t->data);
  return std::vector<float>(p, p + t->numel());
}

struct Diff {
  double max = 0, mean = 0;
};

Diff compare(const std::vector<float>& a, const std::vector<float>& b) {
  Diff d;
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
    d.max = std::max(d.max, e);
    d.mean += e;
  }
  d.mean /= static_cast<double>(a.size());
  return d;
}

class V41Golden
    : public ::testing::TestWithParam<std::tuple<const char*, const char*, model::Numerics>> {};

TEST_P(V41Golden, MatchesFixtureWholeAndChunked) {
  const auto [fixture_name, layout, numerics] = GetParam();
  const std::string fixture = kFixtures + fixture_name;
  auto ck = model_v41::V41Checkpoint::open(fixture + "/" + layout);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const Golden g = golden(fixture);
  const auto& want = numerics == model::Numerics::kReference ? g.reference : g.deepseek;
  V41CpuModel m((*ck)->config(), (*ck)->weights(), hash_params(fixture), numerics);
  std::vector<float> first;
  for (int chunk : {0, 1, 7, 64}) {
    V41SequenceState st = make_v41_state((*ck)->config());
    std::vector<float> all, part;
    const size_t T = g.ids.size();
    const size_t step = chunk == 0 ? T : static_cast<size_t>(chunk);
    for (size_t s = 0; s < T; s += step) {
      const size_t e = std::min(T, s + step);
      ASSERT_TRUE(m.forward(st, std::span(g.ids).subspan(s, e - s), &part).ok());
      all.insert(all.end(), part.begin(), part.end());
    }
    const Diff d = compare(all, want);
    std::printf("%s %s %s chunk %d: max |d| %.3e mean %.3e\n",
                fixture_name,
                layout,
                model::numerics_name(numerics),
                chunk,
                d.max,
                d.mean);
    EXPECT_LE(d.max, 2e-3) << "chunk " << chunk;
    EXPECT_LE(d.mean, 2e-4) << "chunk " << chunk;
    // Every token's arithmetic is independent of the chunking: bitwise equal.
    if (chunk == 0) {
      first = all;
    } else {
      EXPECT_EQ(all, first) << "chunk " << chunk;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures,
                         V41Golden,
                         ::testing::Combine(::testing::Values("v41-tiny", "v41-tiny-b"),
                                            ::testing::Values("official", "hf"),
                                            ::testing::Values(model::Numerics::kReference,
                                                              model::Numerics::kDeepSeek)),
                         [](const auto& info) {
                           std::string fixture = std::get<0>(info.param);
                           for (char& ch : fixture) ch = ch == '-' ? '_' : ch;
                           return fixture + "_" + std::get<1>(info.param) + "_" +
                                  model::numerics_name(std::get<2>(info.param));
                         });

TEST(V41Golden, ImagePlaceholderIsAClearError) {
  auto ck = model_v41::V41Checkpoint::open(kFixture + "/official");
  ASSERT_TRUE(ck.ok());
  model_v41::V41Config cfg = (*ck)->config();
  cfg.image_token_id = 50;  // inside this tiny vocabulary
  V41CpuModel m(cfg, (*ck)->weights(), hash_params(), model::Numerics::kReference);
  V41SequenceState st = make_v41_state(cfg);
  std::vector<float> logits;
  const std::vector<int32_t> ids = {0, 7, 50, 9};
  const Status s = m.forward(st, ids, &logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.to_string().find("image"), std::string::npos) << s.to_string();
  EXPECT_EQ(st.length(), 0);
}

TEST(V41Golden, HashParamsFromConfig) {
  auto ck = model_v41::V41Checkpoint::open(kFixture + "/official");
  ASSERT_TRUE(ck.ok());
  const EngramHashParams want = hash_params();
  auto h = EngramHashParams::from_config((*ck)->config(), want.token_map);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->multipliers, want.multipliers);
  EXPECT_FALSE(EngramHashParams::from_config((*ck)->config(), {1, 2, 3}).ok());
}

TEST(V41Golden, EngramTokenMapFile) {
  auto ck = model_v41::V41Checkpoint::open(kFixture + "/official");
  ASSERT_TRUE(ck.ok());
  const EngramHashParams want = hash_params();
  const std::string path = std::string(DSI_BINARY_DIR) + "/v41_token_map.json";
  std::ofstream(path) << json{{"compressed_vocab_size", 80}, {"token_map", want.token_map}}.dump();
  auto phi = model_v41::load_engram_token_map(path, (*ck)->config());
  ASSERT_TRUE(phi.ok()) << phi.status().to_string();
  EXPECT_EQ(*phi, want.token_map);
  std::vector<int32_t> bad = want.token_map;
  bad.back() = 79;  // still in range, but then not every id is used in first-occurrence order
  bad[0] = 5;
  std::ofstream(path) << json{{"token_map", bad}}.dump();
  EXPECT_FALSE(model_v41::load_engram_token_map(path, (*ck)->config()).ok());
}

// Speculative rollback: decode 6 tokens, roll them back, decode 6 others: the logits equal a
// fresh run over the prompt and the other 6 (bitwise: the forward is chunk-invariant).
TEST(V41Golden, RollbackOfSixTokensIsExact) {
  auto ck = model_v41::V41Checkpoint::open(kFixture + "/official");
  ASSERT_TRUE(ck.ok());
  const auto& cfg = (*ck)->config();
  const Golden g = golden();
  V41CpuModel m(cfg, (*ck)->weights(), hash_params(), model::Numerics::kDeepSeek);
  for (size_t prompt : {size_t{49}, size_t{70}}) {  // odd and even: a ratio-2 group open or closed
    const std::vector<int32_t> head(g.ids.begin(), g.ids.begin() + static_cast<long>(prompt));
    const std::vector<int32_t> draft = {11, 12, 13, 14, 15, 16}, other = {21, 22, 23, 24, 25, 26};
    V41SequenceState st = make_v41_state(cfg);
    std::vector<float> logits, got, want;
    ASSERT_TRUE(m.forward(st, head, &logits).ok());
    for (int32_t t : draft) ASSERT_TRUE(m.forward(st, std::span(&t, 1), &logits).ok());
    ASSERT_TRUE(rollback_v41_state(cfg, st, static_cast<int64_t>(prompt)).ok());
    for (int32_t t : other) {
      ASSERT_TRUE(m.forward(st, std::span(&t, 1), &logits).ok());
      got.insert(got.end(), logits.begin(), logits.end());
    }
    V41SequenceState fresh = make_v41_state(cfg);
    ASSERT_TRUE(m.forward(fresh, head, &logits).ok());
    for (int32_t t : other) {
      ASSERT_TRUE(m.forward(fresh, std::span(&t, 1), &logits).ok());
      want.insert(want.end(), logits.begin(), logits.end());
    }
    EXPECT_EQ(got, want) << "prompt " << prompt;
  }
  V41SequenceState st = make_v41_state(cfg);
  std::vector<float> logits;
  ASSERT_TRUE(m.forward(st, std::span(g.ids).subspan(0, 20), &logits).ok());
  EXPECT_FALSE(rollback_v41_state(cfg, st, 13).ok());  // 7 > max backtracking
  EXPECT_TRUE(rollback_v41_state(cfg, st, 14).ok());
}

TEST(V41Golden, NumericsDiffer) {
  // gate_temp is 1.25 in the fixture: the two numerics must not coincide.
  const Golden g = golden();
  EXPECT_GT(compare(g.reference, g.deepseek).max, 1e-2);
}

TEST(V41Engram, RowIdsMatchFixturePrimes) {
  auto ck = model_v41::V41Checkpoint::open(kFixture + "/official");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const json meta = read_json(kFixture + "/meta.json");
  const auto& c = (*ck)->config();
  ASSERT_EQ(c.engram_primes.size(), meta["engram_primes"].size());
  for (size_t i = 0; i < c.engram_primes.size(); ++i) {
    for (size_t j = 0; j < c.engram_primes[i].size(); ++j) {
      EXPECT_EQ(c.engram_primes[i][j], meta["engram_primes"][i][j].get<int64_t>());
    }
  }
  EngramHashParams h = hash_params();
  ASSERT_TRUE(h.validate(c).ok());
  // The C++ NumPy PCG64 reproduces the fixture's multipliers (|phi| = 80, layers 1 and 3).
  EXPECT_EQ(model_v41::engram_multipliers(c), h.multipliers);
  h.multipliers[0][1] = 4;  // even: not 2 r + 1
  EXPECT_FALSE(h.validate(c).ok());
}

TEST(V41Quant, Fp4AndFp8Points) {
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = 0.1f * static_cast<float>(i - 16);
  fp4_index_quant(x, 32);
  // amax 1.6 -> scale 2^ceil(log2(1.6/6)) = 0.5; values snap to the E2M1 grid times 0.5.
  EXPECT_FLOAT_EQ(x[16 + 5], 0.5f);   // 0.5 / 0.5 = 1.0
  EXPECT_FLOAT_EQ(x[16 + 3], 0.25f);  // 0.3 / 0.5 = 0.6 -> 0.5
  EXPECT_FLOAT_EQ(x[16 + 15], 1.5f);  // 1.5 / 0.5 = 3.0
  float y[16];
  for (int i = 0; i < 16; ++i) y[i] = 4000.0f;
  fp4_compressed_quant(y, 16, /*clamp_scale=*/true);
  EXPECT_FLOAT_EQ(y[0], 448.0f * 6.0f);  // scale clamped at 448
  // Unclamped, the scale 4000 / 6 > 464 rounds to E4M3's NaN and the whole block is that NaN
  // (the canonical quiet NaN, whatever the hardware does with NaN payloads).
  for (int i = 0; i < 16; ++i) y[i] = i == 3 ? -4000.0f : 1.0f;
  fp4_compressed_quant(y, 16, /*clamp_scale=*/false);
  for (int i = 0; i < 16; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &y[i], sizeof(bits));
    EXPECT_EQ(bits, 0x7fc00000u) << i;
  }
  float z[32] = {};
  z[0] = 1.0f;
  z[1] = 0.0137f;
  fp8_window_quant(z, 32);
  EXPECT_FLOAT_EQ(z[0], 1.0f);
}

}  // namespace
}  // namespace dsinfer::cpu_v41

namespace dsinfer::cpu_v41 {
namespace {

// Prefill early exit: the kept rows' logits do not depend on the chunking (bitwise), the last row
// stays close to the exact prefill, and the option is validated.
TEST(V41EarlyExit, KeptRowsIndependentOfChunkingAndCloseToExact) {
  auto ck = model_v41::V41Checkpoint::open(kFixture + "/official");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const Golden g = golden();
  const auto& cfg = (*ck)->config();
  const int64_t T = static_cast<int64_t>(g.ids.size());
  const int64_t V = cfg.vocab_size;
  V41CpuModel m(cfg, (*ck)->weights(), hash_params(), model::Numerics::kReference);
  for (int64_t K : {int64_t{22}, int64_t{40}}) {
    PrefillExit ex{T, K};
    std::vector<float> whole;
    for (int chunk : {0, 1, 7, 64}) {
      V41SequenceState st = make_v41_state(cfg);
      std::vector<float> kept;
      const int64_t step = chunk == 0 ? T : chunk;
      for (int64_t s = 0; s < T; s += step) {
        const int64_t e = std::min(T, s + step);
        ForwardResult r;
        ASSERT_TRUE(m.forward(st, std::span(g.ids).subspan(s, e - s), &ex, &r).ok());
        if (r.placeholder) {
          EXPECT_EQ(r.logits.size(), static_cast<size_t>(V));
          EXPECT_LT(e, T - K + 1);
          continue;
        }
        EXPECT_EQ(s + r.first_row, std::max(s, T - K));
        kept.insert(kept.end(), r.logits.begin(), r.logits.end());
      }
      ASSERT_EQ(kept.size(), static_cast<size_t>(K * V)) << "chunk " << chunk;
      if (chunk == 0) {
        whole = kept;
      } else {
        EXPECT_EQ(kept, whole) << "K " << K << " chunk " << chunk;
      }
    }
    // Against the spec-derived PyTorch reference's early exit (tools/reference/v41/model.py).
    const Diff ref = compare(whole, fixture_tensor("logits_early_exit_k" + std::to_string(K)));
    std::printf("early exit K=%lld vs the PyTorch reference: max |d| %.3e mean %.3e\n",
                static_cast<long long>(K),
                ref.max,
                ref.mean);
    EXPECT_LE(ref.max, 2e-3);
    EXPECT_LE(ref.mean, 2e-4);
    // Against the exact prefill: the last row (the one that is sampled) and all kept rows.
    const std::vector<float>& exact = g.reference;
    double last = 0, all = 0;
    for (int64_t r = 0; r < K; ++r) {
      for (int64_t v = 0; v < V; ++v) {
        const double d = std::fabs(whole[static_cast<size_t>(r * V + v)] -
                                   exact[static_cast<size_t>((T - K + r) * V + v)]);
        all = std::max(all, d);
        if (r == K - 1) {
          last = std::max(last, d);
        }
      }
    }
    std::printf("early exit K=%lld: last row max |d| %.3e, kept rows max |d| %.3e\n",
                static_cast<long long>(K),
                last,
                all);
    // Documented in docs/numerics.md; a wrong boundary or window would be O(1).
    EXPECT_LE(last, K == 22 ? 0.05 : 2e-3);
    // The first kept rows see a narrowed window by design: if they did not differ, the consumer
    // window would not be narrowed.
    EXPECT_GT(all, 0.1);
  }
}

TEST(V41EarlyExit, Validation) {
  auto ck = model_v41::V41Checkpoint::open(kFixture + "/official");
  ASSERT_TRUE(ck.ok());
  const Golden g = golden();
  V41CpuModel m((*ck)->config(), (*ck)->weights(), hash_params(), model::Numerics::kReference);
  V41SequenceState st = make_v41_state((*ck)->config());
  ForwardResult r;
  PrefillExit small{static_cast<int64_t>(g.ids.size()), 21};
  const Status s = m.forward(st, g.ids, &small, &r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.to_string().find("below window + max backtracking = 22"), std::string::npos);
  PrefillExit shorter{10, 22};
  EXPECT_FALSE(m.forward(st, g.ids, &shorter, &r).ok());
}

}  // namespace
}  // namespace dsinfer::cpu_v41

namespace dsinfer::cpu_v41 {
namespace {

// The CPU state uses the slot counts of the state layout (spec §6.3) that inspect reports.
TEST(V41State, SlotsMatchTheLayout) {
  for (const auto& j :
       {model_v41::v41_flash_config_json(), model_v41::v41_tiny_config_json(true)}) {
    auto c = model_v41::parse_v41_config(j.dump(), "config.json");
    ASSERT_TRUE(c.ok());
    const model_v41::StateLayout s = model_v41::compute_state_layout(*c);
    const V41SequenceState st = make_v41_state(*c);
    const auto& layers = st.seq->layers();
    EXPECT_EQ(layers[0].ring_capacity, s.ring_slots);
    EXPECT_EQ(st.seq->max_rollback(), 6);
    int rings = 0;
    for (const auto& l : layers) {
      if (l.comp_rows.enabled()) {
        ++rings;
        EXPECT_EQ(l.comp_rows.capacity(), s.compressor_ring_slots);
      }
    }
    EXPECT_EQ(rings, s.n_compressor_rings);
    EXPECT_EQ(static_cast<int64_t>(layers.size() + st.seq->mtp_layers().size()), s.n_rings);
  }
}

}  // namespace
}  // namespace dsinfer::cpu_v41

namespace dsinfer::cpu_v41 {
namespace {

// v41-tiny-b has 3 consumer layers and window 8: the sampled row depends on rows back to T - 21
// only, so with K = 22 the early exit is exact for it (PyTorch reference: 0 as well).
TEST(V41EarlyExit, TinyBMatchesReferenceAndIsExactForTheLastRow) {
  const std::string fixture = kFixtures + "v41-tiny-b";
  auto ck = model_v41::V41Checkpoint::open(fixture + "/official");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const Golden g = golden(fixture);
  const auto& cfg = (*ck)->config();
  const int64_t T = static_cast<int64_t>(g.ids.size()), V = cfg.vocab_size;
  V41CpuModel m(cfg, (*ck)->weights(), hash_params(fixture), model::Numerics::kReference);
  for (int64_t K : {int64_t{22}, int64_t{40}}) {
    PrefillExit ex{T, K};
    V41SequenceState st = make_v41_state(cfg);
    ForwardResult r;
    ASSERT_TRUE(m.forward(st, g.ids, &ex, &r).ok());
    ASSERT_EQ(r.first_row, T - K);
    auto f = SafetensorsFile::open(fixture + "/reference.safetensors");
    ASSERT_TRUE(f.ok());
    const TensorInfo* t = (*f)->find("logits_early_exit_k" + std::to_string(K));
    ASSERT_NE(t, nullptr);
    const auto* p = static_cast<const float*>(t->data);
    const Diff d = compare(r.logits, std::vector<float>(p, p + t->numel()));
    EXPECT_LE(d.max, 2e-3);
    EXPECT_LE(d.mean, 2e-4);
    double last = 0;
    for (int64_t v = 0; v < V; ++v) {
      last =
          std::max(last,
                   std::fabs(static_cast<double>(r.logits[static_cast<size_t>((K - 1) * V + v)]) -
                             g.reference[static_cast<size_t>((T - 1) * V + v)]));
    }
    EXPECT_LE(last, 1e-5) << "K " << K;
  }
}

}  // namespace
}  // namespace dsinfer::cpu_v41

namespace dsinfer::cpu_v41 {
namespace {

// use_fp4_sparse_kv = false stores the compressed entries as FP8 main records (1x32 E4M3 with
// UE8M0 scales) instead of FP4: the entries are then fixed points of the FP8 quantiser, not of
// the FP4 one, and the logits move.
TEST(V41State, Fp8SparseKvOption) {
  auto ck = model_v41::V41Checkpoint::open(kFixture + "/official");
  ASSERT_TRUE(ck.ok());
  const Golden g = golden();
  model_v41::V41Config fp8 = (*ck)->config();
  fp8.use_fp4_sparse_kv = false;
  V41CpuModel m8(fp8, (*ck)->weights(), hash_params(), model::Numerics::kReference);
  V41SequenceState st = make_v41_state(fp8);
  std::vector<float> logits;
  ASSERT_TRUE(m8.forward(st, g.ids, &logits).ok());
  const state::LayerState& owner = st.seq->layers()[5];
  ASSERT_GT(owner.num_entries, 0);
  std::vector<float> entries;
  for (int64_t g = 0; g < owner.num_entries; ++g)
    entries.insert(entries.end(), owner.entry(g), owner.entry(g) + owner.head_dim);
  std::vector<float> again = entries;
  fp8_window_quant(again.data(), static_cast<int64_t>(again.size()));
  EXPECT_EQ(again, entries);
  std::vector<float> fp4 = entries;
  fp4_compressed_quant(fp4.data(), static_cast<int64_t>(fp4.size()), false);
  EXPECT_NE(fp4, entries);
  EXPECT_GT(compare(logits, g.reference).max, 1e-3);
}

}  // namespace
}  // namespace dsinfer::cpu_v41
