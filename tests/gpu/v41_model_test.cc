// The CUDA V4.1 backend end to end against the CPU V4.1 backend (the oracle, itself checked against
// the golden fixtures): both fixtures, both checkpoint layouts, both numerics; the whole prompt,
// chunks of 64, 7 and 1 (prefill then token-by-token decode), prefill early exit with decode
// steps after it, and a rollback; and the engine on CUDA against the engine on the CPU. Needs a
// GPU (skips otherwise); fixtures from the source tree ($DSINFER_SOURCE_DIR when the binary runs
// elsewhere).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu_v41/backend.h"
#include "backend/cuda_v41/backend.h"
#include "engine/engine.h"
#include "model_test_util.h"
#include "state/sequence_state.h"
#include "tensor/safetensors.h"
#include "unit/engine/engine_test_util.h"

namespace dsinfer {
namespace {

namespace fs = std::filesystem;

using gpu_test::compare;
using gpu_test::source_path;

// The fixture's prompt (input_ids of reference.safetensors).
std::vector<int32_t> fixture_ids(const std::string& fixture) {
  auto f = SafetensorsFile::open(source_path(fixture) + "/reference.safetensors");
  EXPECT_TRUE(f.ok());
  std::vector<int32_t> ids;
  if (!f.ok())
    return ids;
  const TensorInfo* t = (*f)->find("input_ids");
  EXPECT_NE(t, nullptr);
  if (t == nullptr)
    return ids;
  for (int64_t i = 0; i < t->numel(); ++i)
    ids.push_back(static_cast<int32_t>(static_cast<const int64_t*>(t->data)[i]));
  return ids;
}

struct Seq {
  std::unique_ptr<state::PageArena> arena;
  std::unique_ptr<state::SequenceState> st;
};

Seq make_seq(backend::Model& m) {
  Seq s;
  const state::StateShape& shape = *m.state_shape();
  s.arena = state::PageArena::growable(state::default_page_bytes(shape), m.state_storage());
  s.st = std::make_unique<state::SequenceState>(shape, s.arena.get(), 0);
  EXPECT_TRUE(s.st->ok());
  return s;
}

// Feeds ids[begin, end) in chunks of `chunk` (0 = one forward); appends every row's logits (or
// the last row's with prefill_end > 0: early-exit chunks).
void feed(backend::Model& m,
          Seq& s,
          const std::vector<int32_t>& ids,
          int64_t begin,
          int64_t end,
          int64_t chunk,
          int64_t prefill_end,
          std::vector<float>* logits) {
  const int64_t step = chunk == 0 ? end - begin : chunk;
  for (int64_t b = begin; b < end; b += step) {
    const int64_t n = std::min(step, end - b);
    backend::ForwardOptions o;
    o.prefill_end = prefill_end;
    o.last_logits_only = prefill_end > 0;
    backend::ForwardOutputs out;
    const Status st =
        m.forward(*s.st, std::span<const int32_t>(ids.data() + b, static_cast<size_t>(n)), o, &out);
    ASSERT_TRUE(st.ok()) << m.name() << ": " << st.to_string();
    logits->insert(logits->end(), out.logits.begin(), out.logits.end());
  }
}

// The budget (docs/gpu.md, "DeepSeek V4.1"). Both V4.1 numerics store the window KV in FP8 and
// the compressed KV, index keys and index queries in FP4 (the model's own quantisation points,
// in `reference` too), and the GPU sums its linears, mHC mixes, Engram gate and attention in
// another order than the CPU: usually that leaves ulp-level differences (the V4 reference budget,
// 2e-3 max / 2e-4 mean), but a value within an ulp of an FP8/FP4 rounding boundary can round
// the other way and move by a whole quantisation step, which then propagates. So, as for V4's
// `deepseek` numerics: a bound on the mean, no blow-up, greedy agreement on clear-margin rows.
constexpr double kMaxTol = 4.0;
constexpr double kMeanTol = 0.1;
constexpr double kArgmaxAgreement = 0.98;
constexpr double kMargin = 0.05;

void expect_close(const gpu_test::Agreement& a, const std::string& what) {
  std::printf("[cuda-v41-vs-cpu] %s: max|d| %.3g mean|d| %.3g argmax %lld/%lld\n",
              what.c_str(),
              a.max_abs,
              a.mean_abs,
              static_cast<long long>(a.argmax_equal),
              static_cast<long long>(a.argmax_checked));
  EXPECT_LE(a.max_abs, kMaxTol) << what;
  EXPECT_LE(a.mean_abs, kMeanTol) << what;
  // At least 98% greedy agreement, one disagreement allowed on short runs (as model_test.cu).
  EXPECT_GE(a.argmax_equal + gpu_test::allowed_disagreements(a, kArgmaxAgreement), a.argmax_checked)
      << what;
}

struct V41Case {
  const char* fixture;  // folder with reference.safetensors
  const char* layout;   // checkpoint subfolder
};

// Both backends over one checkpoint with the same options (null where opening failed).
struct Backends {
  std::unique_ptr<cpu_v41::V41Backend> cpu;
  std::unique_ptr<gpu_v41::CudaV41Backend> gpu;
  int64_t vocab = 0;
  bool ok() const { return cpu && gpu; }
};

Backends open_both(const std::string& dir,
                   model::Numerics nm = model::Numerics::kReference,
                   int64_t prefill_keep_rows = 0) {
  cpu_v41::V41BackendOptions o;
  o.numerics = nm;
  o.prefill_keep_rows = prefill_keep_rows;
  Backends b;
  auto cpu = cpu_v41::V41Backend::open(dir, o);
  EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
  if (!cpu.ok())
    return b;
  auto gpu = gpu_v41::CudaV41Backend::open(dir, o);
  EXPECT_TRUE(gpu.ok()) << gpu.status().to_string();
  if (!gpu.ok())
    return b;
  b.cpu = std::move(cpu).value();
  b.gpu = std::move(gpu).value();
  b.vocab = b.cpu->config().vocab_size;
  return b;
}

// Skips without a GPU or without the case's checkpoint; else its folder and prompt.
class CudaV41ModelTest : public ::testing::TestWithParam<V41Case> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    vc_ = GetParam();
    dir_ = source_path(std::string(vc_.fixture) + "/" + vc_.layout);
    if (!fs::exists(dir_))
      GTEST_SKIP() << dir_ << " missing";
    ids_ = fixture_ids(vc_.fixture);
    ASSERT_FALSE(ids_.empty());
  }
  V41Case vc_{};
  std::string dir_;
  std::vector<int32_t> ids_;
};

TEST_P(CudaV41ModelTest, LogitsMatchCpuV41InBothNumerics) {
  const int64_t T = static_cast<int64_t>(ids_.size());
  for (model::Numerics nm : {model::Numerics::kReference, model::Numerics::kDeepSeek}) {
    const Backends be = open_both(dir_, nm);
    ASSERT_TRUE(be.ok());
    const int64_t V = be.vocab;
    std::vector<float> ref;
    {
      Seq s = make_seq(*be.cpu);
      feed(*be.cpu, s, ids_, 0, T, 0, 0, &ref);
    }
    for (int64_t chunk : {int64_t{0}, int64_t{64}, int64_t{7}, int64_t{1}}) {
      std::vector<float> got;
      Seq s = make_seq(*be.gpu);
      feed(*be.gpu, s, ids_, 0, T, chunk, 0, &got);
      s.st->check_integrity();
      expect_close(compare(ref, got, V, kMargin),
                   std::string(vc_.fixture) + "/" + vc_.layout + " " + model::numerics_name(nm) +
                       " chunk " + std::to_string(chunk));
    }
    // Prefill in chunks of 7, then token-by-token decode (the chunk-1 run above covers decode
    // from the start); the last 8 rows are decode steps after a chunked prefill.
    {
      const int64_t P = T - 8;
      std::vector<float> got;
      Seq s = make_seq(*be.gpu);
      feed(*be.gpu, s, ids_, 0, P, 7, 0, &got);
      feed(*be.gpu, s, ids_, P, T, 1, 0, &got);
      expect_close(
          compare(ref, got, V, kMargin),
          std::string(vc_.fixture) + " " + model::numerics_name(nm) + " prefill 7 + decode");
    }
  }
}

// The prefix cache on the GPU for V4.1 (issue 19): a whole-state image (exact prefill) captured
// from the CUDA backend's device pool and restored into a fresh sequence in another arena
// (CudaV41Backend::read_state_pages / write_state_pages under state::capture_state /
// restore_state) continues bit for bit like the sequence it came from, decode step by decode
// step, in both numerics; captures after 1 token, inside and at the end of compression groups,
// after half the prompt and one token before its end.
TEST_P(CudaV41ModelTest, StateImageRestoredFromTheDevicePoolContinuesBitForBit) {
  const int64_t T = static_cast<int64_t>(ids_.size());
  for (model::Numerics nm : {model::Numerics::kReference, model::Numerics::kDeepSeek}) {
    const Backends be = open_both(dir_, nm);
    ASSERT_TRUE(be.ok());
    gpu_v41::CudaV41Backend& m = *be.gpu;
    for (const int64_t split : {int64_t{1}, int64_t{7}, int64_t{8}, T / 2, T - 1}) {
      if (split < 1 || split >= T)
        continue;
      SCOPED_TRACE(std::string(model::numerics_name(nm)) + " capture after " +
                   std::to_string(split) + " tokens");
      Seq a = make_seq(m);
      std::vector<float> scratch;
      feed(m, a, ids_, 0, split, 7, 0, &scratch);
      auto image = state::capture_state(*a.st, [&](std::span<const int32_t> pages, float* dst) {
        return m.read_state_pages(*a.arena, pages, dst);
      });
      ASSERT_TRUE(image.ok()) << image.status().to_string();
      Seq b = make_seq(m);
      ASSERT_TRUE(state::restore_state(*image,
                                       *b.st,
                                       [&](std::span<const int32_t> pages, const float* src) {
                                         return m.write_state_pages(*b.arena, pages, src);
                                       })
                      .ok());
      b.st->check_integrity();
      ASSERT_EQ(b.st->num_tokens(), split);
      std::vector<float> want, got;
      feed(m, a, ids_, split, T, 1, 0, &want);
      feed(m, b, ids_, split, T, 1, 0, &got);
      ASSERT_EQ(want.size(), got.size());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
    }
  }
}

TEST_P(CudaV41ModelTest, PrefillEarlyExitMatchesCpu) {
  const int64_t T = static_cast<int64_t>(ids_.size()), P = T - 6;
  for (model::Numerics nm : {model::Numerics::kReference, model::Numerics::kDeepSeek}) {
    cpu_v41::V41BackendOptions o;
    o.numerics = nm;
    auto probe = cpu_v41::V41Backend::open(dir_, o);
    ASSERT_TRUE(probe.ok()) << probe.status().to_string();
    // The smallest K the backend accepts (window + max backtracking): most of the prompt is
    // outside the kept tail.
    const Backends be = open_both(dir_, nm, (*probe)->state_shape()->ring_capacity);
    ASSERT_TRUE(be.ok());
    const int64_t V = be.vocab;
    for (int64_t chunk : {int64_t{0}, int64_t{7}, int64_t{64}}) {
      std::vector<float> ref, got;
      Seq a = make_seq(*be.cpu);
      Seq b = make_seq(*be.gpu);
      feed(*be.cpu, a, ids_, 0, P, chunk, P, &ref);
      feed(*be.gpu, b, ids_, 0, P, chunk, P, &got);
      // Only the last chunk's row is a prediction; decode steps after the early exit.
      ref.erase(ref.begin(), ref.end() - V);
      got.erase(got.begin(), got.end() - V);
      feed(*be.cpu, a, ids_, P, T, 1, 0, &ref);
      feed(*be.gpu, b, ids_, P, T, 1, 0, &got);
      expect_close(compare(ref, got, V, kMargin),
                   std::string(vc_.fixture) + " " + model::numerics_name(nm) +
                       " early exit chunk " + std::to_string(chunk));
    }
  }
}

TEST_P(CudaV41ModelTest, RollbackThenContinueMatchesCpu) {
  ASSERT_GE(ids_.size(), 40u);
  const Backends be = open_both(dir_);
  ASSERT_TRUE(be.ok());
  const int64_t V = be.vocab;
  std::vector<float> ref, got, scratch;
  Seq a = make_seq(*be.cpu);
  Seq b = make_seq(*be.gpu);
  // 30 tokens, then 5 wrong ones rolled back, then the true continuation.
  std::vector<int32_t> wrong(ids_.begin(), ids_.end());
  for (int i = 30; i < 35; ++i)
    wrong[static_cast<size_t>(i)] = (ids_[static_cast<size_t>(i)] + 1) % V;
  feed(*be.cpu, a, ids_, 0, 30, 7, 0, &scratch);
  feed(*be.gpu, b, ids_, 0, 30, 7, 0, &scratch);
  feed(*be.gpu, b, wrong, 30, 35, 5, 0, &scratch);
  ASSERT_TRUE(b.st->rollback(5).ok());
  feed(*be.cpu, a, ids_, 30, 40, 1, 0, &ref);
  feed(*be.gpu, b, ids_, 30, 40, 1, 0, &got);
  b.st->check_integrity();
  expect_close(compare(ref, got, V, kMargin), std::string(vc_.fixture) + " rollback");
}

// Several sequences in one forward_batch (their rows side by side in every kernel): prompts of
// different lengths prefilled together, then decode steps together; each sequence's logits
// against the CPU V4.1 backend running it alone.
TEST_P(CudaV41ModelTest, BatchedForwardMatchesCpuAlone) {
  ASSERT_GE(ids_.size(), 60u);
  for (model::Numerics nm : {model::Numerics::kReference, model::Numerics::kDeepSeek}) {
    const Backends be = open_both(dir_, nm);
    ASSERT_TRUE(be.ok());
    const int64_t V = be.vocab;
    // Sequence i: prompt ids_[i .. i + len_i), then 6 decode tokens ids_[i + len_i ...].
    const std::vector<int64_t> lens = {37, 5, 50, 1};
    const int64_t steps = 6;
    const state::StateShape& shape = *be.gpu->state_shape();
    auto arena =
        state::PageArena::growable(state::default_page_bytes(shape), be.gpu->state_storage());
    std::vector<std::unique_ptr<state::SequenceState>> seqs;
    std::vector<std::vector<float>> got(lens.size()), ref(lens.size());
    for (size_t i = 0; i < lens.size(); ++i)
      seqs.push_back(
          std::make_unique<state::SequenceState>(shape, arena.get(), static_cast<int64_t>(i)));
    for (int64_t step = 0; step <= steps; ++step) {
      std::vector<backend::ForwardItem> items(lens.size());
      std::vector<backend::ForwardOutputs> outs(lens.size());
      for (size_t i = 0; i < lens.size(); ++i) {
        const int64_t b =
            step == 0 ? static_cast<int64_t>(i) : static_cast<int64_t>(i) + lens[i] + step - 1;
        const int64_t n = step == 0 ? lens[i] : 1;
        items[i].state = seqs[i].get();
        items[i].tokens = std::span<const int32_t>(ids_.data() + b, static_cast<size_t>(n));
        items[i].out = &outs[i];
      }
      ASSERT_TRUE(be.gpu->forward_batch(items).ok());
      for (size_t i = 0; i < lens.size(); ++i) {
        ASSERT_TRUE(items[i].status.ok()) << items[i].status.to_string();
        got[i].insert(got[i].end(), outs[i].logits.begin(), outs[i].logits.end());
      }
    }
    for (size_t i = 0; i < lens.size(); ++i) {
      Seq a = make_seq(*be.cpu);
      const int64_t b = static_cast<int64_t>(i);
      feed(*be.cpu, a, ids_, b, b + lens[i], 0, 0, &ref[i]);
      feed(*be.cpu, a, ids_, b + lens[i], b + lens[i] + steps, 1, 0, &ref[i]);
      seqs[i]->check_integrity();
      expect_close(compare(ref[i], got[i], V, kMargin),
                   std::string(vc_.fixture) + " " + model::numerics_name(nm) + " batched seq " +
                       std::to_string(i));
    }
  }
}

// DSpark drafting on the device against the CPU's drafter after the same prefill: greedy drafts
// equal while the CPU's draft logits have a clear margin (a later draft depends on the earlier
// ones through the Markov term), confidences close.
TEST_P(CudaV41ModelTest, DsparkDraftsMatchCpu) {
  ASSERT_GE(ids_.size(), 50u);
  const Backends be = open_both(dir_);
  ASSERT_TRUE(be.ok());
  const int32_t block = be.gpu->block_draft_size();
  ASSERT_EQ(block, be.cpu->block_draft_size());
  if (block == 0)
    GTEST_SKIP() << "no DSpark blocks in " << dir_;
  const int64_t V = be.vocab;
  int checked = 0, equal = 0;
  for (int64_t len : {int64_t{9}, int64_t{30}, int64_t{49}}) {
    std::vector<float> scratch;
    Seq a = make_seq(*be.cpu);
    Seq b = make_seq(*be.gpu);
    feed(*be.cpu, a, ids_, 0, len, 7, 0, &scratch);
    feed(*be.gpu, b, ids_, 0, len, 7, 0, &scratch);
    const int32_t anchor = ids_[static_cast<size_t>(len)];
    cpu_v41::DraftOptions dopt;
    dopt.block = block;
    cpu_v41::DraftResult want;
    ASSERT_TRUE(be.cpu->draft(*a.st, anchor, dopt, &want).ok());
    std::vector<int32_t> toks(static_cast<size_t>(block));
    std::vector<float> conf(static_cast<size_t>(block));
    backend::BlockDraftItem it;
    it.state = b.st.get();
    it.anchor = anchor;
    it.tokens = toks.data();
    it.confidence = conf.data();
    ASSERT_TRUE(be.gpu->block_draft_batch(std::span<backend::BlockDraftItem>(&it, 1), block).ok());
    ASSERT_TRUE(it.status.ok()) << it.status.to_string();
    for (int32_t k = 0; k < block; ++k) {
      float margin = 0;
      gpu_test::top_with_margin(want.logits.data() + k * V, V, &margin);
      if (margin <= kMargin)
        break;  // a near tie: later drafts may legitimately differ
      ++checked;
      EXPECT_NEAR(conf[static_cast<size_t>(k)], want.confidence[static_cast<size_t>(k)], 2e-2)
          << "len " << len << " draft " << k;
      if (toks[static_cast<size_t>(k)] != want.tokens[static_cast<size_t>(k)])
        break;
      ++equal;
    }
  }
  std::printf("[cuda-v41-draft] %s/%s: %d/%d clear-margin drafts equal\n",
              vc_.fixture,
              vc_.layout,
              equal,
              checked);
  EXPECT_GE(equal * 10, checked * 9);
}

// The engine on CUDA (continuous batching, chunked prefill, decode) over V4.1's state layout in a
// device-mirrored arena: every request finishes, and greedy tokens agree with the engine on the
// CPU (the first token of every request where both backends' arithmetic agrees to the budget;
// random-weight fixtures have near ties, so agreement is counted, not required everywhere).
TEST(CudaV41Engine, GreedyGenerationAgreesWithTheCpuEngine) {
  SKIP_WITHOUT_GPU();
  const std::string dir = source_path("tests/fixtures/v41-tiny/official");
  if (!fs::exists(dir))
    GTEST_SKIP() << dir << " missing";
  auto outputs = [&](engine::Device device) {
    engine::EngineConfig cfg;
    cfg.model_dir = dir;
    cfg.device = device;
    cfg.state_budget_bytes = int64_t{256} << 20;
    cfg.scheduler.max_tokens_per_step = 24;
    cfg.scheduler.prefill_chunk = 7;
    auto e = engine::Engine::create(cfg);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    std::vector<std::vector<int32_t>> out;
    if (!e.ok())
      return out;
    EXPECT_STREQ((*e)->model().name(), device == engine::Device::kCuda ? "cuda-v41" : "cpu-v41");
    std::vector<engine::RequestSpec> specs;
    for (const auto& c : engine::test_support::random_cases(12, 5, 48, 3, 90, 8))
      specs.push_back(engine::test_support::greedy(c));
    return engine::test_support::run_all(**e, std::move(specs));
  };
  const auto cpu = outputs(engine::Device::kCpu);
  const auto gpu = outputs(engine::Device::kCuda);
  ASSERT_EQ(cpu.size(), gpu.size());
  int first_equal = 0, all_equal = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i].size(), gpu[i].size()) << "request " << i;
    first_equal += !cpu[i].empty() && cpu[i][0] == gpu[i][0];
    all_equal += cpu[i] == gpu[i];
  }
  std::printf("[cuda-v41-engine] first tokens equal %d/%zu, whole outputs equal %d/%zu\n",
              first_equal,
              cpu.size(),
              all_equal,
              cpu.size());
  EXPECT_GE(first_equal * 4, static_cast<int>(cpu.size()) * 3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures,
                         CudaV41ModelTest,
                         ::testing::Values(V41Case{"tests/fixtures/v41-tiny", "official"},
                                           V41Case{"tests/fixtures/v41-tiny", "hf"},
                                           V41Case{"tests/fixtures/v41-tiny-b", "official"}),
                         [](const ::testing::TestParamInfo<V41Case>& info) {
                           std::string name = fs::path(info.param.fixture).filename().string() +
                                              "_" + info.param.layout;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch)))
                               ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace dsinfer
