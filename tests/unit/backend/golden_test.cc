// Golden tests: the CPU reference against transformers' DeepseekV4ForCausalLM (fp32) on the
// committed fixtures (tools/reference/make_fixtures.py), for the full forward and for chunked
// prefill (chunks 1, 7, 64); both checkpoint layouts; the MTP block against our PyTorch MTP
// reference; determinism and measured deviation of the `deepseek` numerics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "model/checkpoint.h"
#include "tensor/safetensors.h"

namespace dsinfer {
namespace {

namespace fs = std::filesystem;

struct Reference {
  std::vector<int32_t> ids;
  std::vector<float> logits;      // [T, vocab]
  std::vector<float> mtp_logits;  // [T-1, vocab] or empty
};

std::string fixture_dir(const std::string& name) {
  return std::string(DSI_SOURCE_DIR) + "/tests/fixtures/" + name;
}

Reference load_reference(const std::string& name) {
  Reference r;
  auto f = SafetensorsFile::open(fixture_dir(name) + "/reference.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (!f.ok())
    return r;
  const TensorInfo* ids = (*f)->find("input_ids");
  const TensorInfo* logits = (*f)->find("logits");
  EXPECT_TRUE(ids && logits);
  if (!ids || !logits)
    return r;
  for (int64_t i = 0; i < ids->numel(); ++i) {
    r.ids.push_back(static_cast<int32_t>(load_int(ids->data, ids->dtype, i)));
  }
  r.logits.resize(static_cast<size_t>(logits->numel()));
  for (int64_t i = 0; i < logits->numel(); ++i)
    r.logits[i] = load_float(logits->data, logits->dtype, i);
  if (const TensorInfo* mtp = (*f)->find("mtp_logits")) {
    r.mtp_logits.resize(static_cast<size_t>(mtp->numel()));
    for (int64_t i = 0; i < mtp->numel(); ++i)
      r.mtp_logits[i] = load_float(mtp->data, mtp->dtype, i);
  }
  return r;
}

struct RunResult {
  std::vector<float> logits;
  std::vector<float> mtp_logits;
};

// Runs `ids` through a fresh state in chunks of `chunk` (0 = one full forward).
RunResult run(const model::Checkpoint& ckpt,
              const std::vector<int32_t>& ids,
              int64_t chunk,
              model::Numerics numerics,
              bool mtp) {
  cpu::CpuModel m(ckpt.config(), ckpt.weights(), numerics);
  auto arena = state::PageArena::growable(state::default_page_bytes(ckpt.config()));
  state::SequenceState st(ckpt.config(), arena.get(), 0, 0);
  cpu::ForwardOptions opts;
  opts.run_mtp = mtp;
  RunResult r;
  const int64_t total = static_cast<int64_t>(ids.size());
  const int64_t step = chunk == 0 ? total : chunk;
  cpu::ForwardOutputs out;
  for (int64_t b = 0; b < total; b += step) {
    const int64_t n = std::min(step, total - b);
    Status s = m.forward(st, std::span<const int32_t>(ids.data() + b, n), opts, &out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    st.check_integrity();
    arena->check_integrity();
    r.logits.insert(r.logits.end(), out.logits.begin(), out.logits.end());
    r.mtp_logits.insert(r.mtp_logits.end(), out.mtp_logits.begin(), out.mtp_logits.end());
  }
  return r;
}

struct Diff {
  double max_abs = 0;
  double mean_abs = 0;
  int64_t argmax_mismatch = 0;  // among rows whose reference top-1 margin exceeds 1e-2
  int64_t rows_checked = 0;
};

Diff compare(const std::vector<float>& got, const std::vector<float>& ref, int64_t vocab) {
  Diff d;
  EXPECT_EQ(got.size(), ref.size());
  if (got.size() != ref.size() || ref.empty())
    return d;
  double sum = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(e <= d.max_abs))
      d.max_abs = std::isnan(e) ? INFINITY : e;
    sum += e;
  }
  d.mean_abs = sum / static_cast<double>(ref.size());
  const int64_t rows = static_cast<int64_t>(ref.size()) / vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const float* rr = ref.data() + r * vocab;
    const float* gr = got.data() + r * vocab;
    const int64_t top = std::max_element(rr, rr + vocab) - rr;
    float second = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) {
      if (v != top)
        second = std::max(second, rr[v]);
    }
    if (rr[top] - second <= 1e-2f)
      continue;
    ++d.rows_checked;
    if (std::max_element(gr, gr + vocab) - gr != top)
      ++d.argmax_mismatch;
  }
  return d;
}

void expect_close(const Diff& d, const std::string& what) {
  EXPECT_LE(d.max_abs, 2e-3) << what;
  EXPECT_LE(d.mean_abs, 2e-4) << what;
  EXPECT_EQ(d.argmax_mismatch, 0) << what << " (" << d.rows_checked << " rows checked)";
  EXPECT_GT(d.rows_checked, 0) << what;
  std::printf("[golden] %-40s max|d| %.3g  mean|d| %.3g  argmax ok on %lld rows\n",
              what.c_str(),
              d.max_abs,
              d.mean_abs,
              static_cast<long long>(d.rows_checked));
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, ReferenceModeMatchesTransformers) {
  const std::string name = GetParam();
  if (!fs::exists(fixture_dir(name)))
    GTEST_SKIP() << "fixture " << name << " missing";
  const Reference ref = load_reference(name);
  ASSERT_FALSE(ref.ids.empty());
  for (const char* layout : {"hf", "official"}) {
    auto ckpt = model::Checkpoint::open(fixture_dir(name) + "/" + layout);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    const int64_t vocab = (*ckpt)->config().vocab_size;
    const bool mtp = !ref.mtp_logits.empty() && (*ckpt)->has_mtp();
    for (int64_t chunk : {0, 1, 7, 64}) {
      const RunResult r = run(**ckpt, ref.ids, chunk, model::Numerics::kReference, mtp);
      const std::string tag = name + "/" + layout + " chunk " + std::to_string(chunk);
      expect_close(compare(r.logits, ref.logits, vocab), tag);
      if (mtp)
        expect_close(compare(r.mtp_logits, ref.mtp_logits, vocab), tag + " MTP");
    }
  }
}

TEST_P(GoldenTest, DeepSeekModeIsDeterministicAndMeasured) {
  const std::string name = GetParam();
  if (!fs::exists(fixture_dir(name)))
    GTEST_SKIP() << "fixture " << name << " missing";
  const Reference ref = load_reference(name);
  auto ckpt = model::Checkpoint::open(fixture_dir(name) + "/official");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const int64_t vocab = (*ckpt)->config().vocab_size;
  const RunResult a = run(**ckpt, ref.ids, 0, model::Numerics::kDeepSeek, false);
  const RunResult b = run(**ckpt, ref.ids, 0, model::Numerics::kDeepSeek, false);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)));
  // Chunking does not change what the deepseek quantisation points see.
  const RunResult c = run(**ckpt, ref.ids, 1, model::Numerics::kDeepSeek, false);
  const Diff dc = compare(c.logits, a.logits, vocab);
  EXPECT_LE(dc.max_abs, 2e-3);
  const Diff d = compare(a.logits, ref.logits, vocab);
  std::printf("[deepseek-vs-reference] %s: max|d| %.4g mean|d| %.4g argmax mismatches %lld/%lld\n",
              name.c_str(),
              d.max_abs,
              d.mean_abs,
              static_cast<long long>(d.argmax_mismatch),
              static_cast<long long>(d.rows_checked));
  EXPECT_GT(d.max_abs, 0.0) << "deepseek numerics should differ from the reference";
}

TEST_P(GoldenTest, RollbackRestoresStateExactly) {
  const std::string name = GetParam();
  if (!fs::exists(fixture_dir(name)))
    GTEST_SKIP() << "fixture " << name << " missing";
  const Reference ref = load_reference(name);
  auto ckpt = model::Checkpoint::open(fixture_dir(name) + "/official");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const auto& cfg = (*ckpt)->config();
  cpu::CpuModel m(cfg, (*ckpt)->weights(), model::Numerics::kReference);
  const int64_t k = 6;
  // A small page size so that rollback crosses page boundaries of the entry arrays.
  auto arena = state::PageArena::growable(state::min_page_bytes(cfg));
  state::SequenceState st(cfg, arena.get(), 0, k);
  cpu::ForwardOptions opts;
  opts.run_mtp = (*ckpt)->has_mtp();
  cpu::ForwardOutputs out;
  const int64_t prefix = static_cast<int64_t>(ref.ids.size()) - 2 * k;
  ASSERT_TRUE(m.forward(st, std::span<const int32_t>(ref.ids.data(), prefix), opts, &out).ok());
  // Decode k tokens one by one, remember their logits.
  std::vector<std::vector<float>> first;
  for (int64_t i = 0; i < k; ++i) {
    ASSERT_TRUE(
        m.forward(st, std::span<const int32_t>(ref.ids.data() + prefix + i, 1), opts, &out).ok());
    first.push_back(out.logits);
  }
  // Decode k other tokens, roll them back, decode the original ones again.
  ASSERT_TRUE(st.rollback(k).ok());
  st.check_integrity();
  for (int64_t i = 0; i < k; ++i) {
    const int32_t other = static_cast<int32_t>((ref.ids[prefix + i] + 1 + i) % cfg.vocab_size);
    ASSERT_TRUE(m.forward(st, std::span<const int32_t>(&other, 1), opts, &out).ok());
  }
  ASSERT_TRUE(st.rollback(k).ok());
  for (int64_t i = 0; i < k; ++i) {
    ASSERT_TRUE(
        m.forward(st, std::span<const int32_t>(ref.ids.data() + prefix + i, 1), opts, &out).ok());
    st.check_integrity();
    ASSERT_EQ(out.logits.size(), first[i].size());
    EXPECT_EQ(0, std::memcmp(out.logits.data(), first[i].data(), out.logits.size() * sizeof(float)))
        << "step " << i;
  }
  EXPECT_FALSE(st.rollback(k + 1).ok());
  arena->check_integrity();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::Values("tiny-a", "tiny-b"));

}  // namespace
}  // namespace dsinfer
