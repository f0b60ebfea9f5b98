// The fast CPU path (backend/cpu/fast, kernels/cpu/fast) against the reference CpuModel:
// - the GEMM kernels of every instruction set this CPU has, against a double-precision sum, with
//   k/row/token tails, and bit-identical per token whatever the batch (batch invariance);
// - the exact BF16 copies of FP8 and MXFP4 weights;
// - the bundled model (models/dsv4-mini) on a prompt set: the fast path's greedy tokens equal the
//   reference's, and every logit stays within the budget of docs/performance.md (CPU section);
// - a batched step (prefill chunks and decode rows of several sequences in one forward_batch)
//   gives bit for bit the logits of running each sequence alone;
// - the golden fixtures (both checkpoint layouts, chunked prefill, deepseek numerics) within the
//   same budget of the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "backend/cpu/fast/fast_model.h"
#include "kernels/cpu/fast/gemm.h"
#include "kernels/cpu/fast/packed_weights.h"
#include "kernels/cpu/fast/thread_pool.h"
#include "model/checkpoint.h"
#include "tokenizer/tokenizer.h"

// The replaced global operator new/delete below pair malloc with free; GCC's inliner does not see
// the replacement and reports the pairs of the standard ones as mismatched.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

// Heap allocations while g_count_allocs is set (any thread): the step must make none once its
// shape has been seen.
std::atomic<bool> g_count_allocs{false};
std::atomic<int64_t> g_allocs{0};

void* operator new(std::size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed))
    g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1))
    return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
// The rest of the (unaligned) family, so that every new meets its delete whichever path the
// standard library or a sanitizer's interceptors take (std::stable_sort's buffer is a nothrow
// new freed by a plain delete: under ASan the interceptor's nothrow new met this free).
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (g_count_allocs.load(std::memory_order_relaxed))
    g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void* operator new[](std::size_t n) {
  return operator new(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return operator new(n, std::nothrow);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace dsinfer {
namespace {

using cpu::fast::GemmKernels;
using cpu::fast::WeightElem;
using cpu::fast::WeightView;

// The logit budget of the fast path against the reference (docs/performance.md, CPU section).
// Reference numerics: fp32 sums in another order, so differences are rounding (measured ~1e-5).
// DeepSeek numerics: the same rounding differences sometimes move an activation across an FP8
// E4M3 rounding boundary (one step = 1/16 of the value), so the budget is that of a few such
// flips. The BF16 attention operands (docs/numerics.md point 4) add rounding points 16 times
// finer than FP8 on many more values (every query, every stored RoPE dim), so a 1e-7 difference
// now flips one of them far more often, and a flipped KV dim stays in the window for the later
// positions: measured up to 0.70 max / 0.069 mean (tiny-a's MTP head, AVX2 kernels; the logits
// agree to 1e-6 up to the first flip, then jump), 0.026 mean on the bundled model's MTP head,
// 0.034 max on its main logits (before point 4: 0.27 on tiny-a, 0.04 on the bundled model).
struct Budget {
  double max_abs;
  double mean_abs;
};
Budget budget(model::Numerics n) {
  return n == model::Numerics::kReference ? Budget{2e-3, 2e-4} : Budget{1.5, 0.1};
}

std::vector<GemmKernels> available_kernels() {
  std::vector<GemmKernels> ks = {cpu::fast::gemm_kernels_portable()};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    ks.push_back(cpu::fast::gemm_kernels_avx2());
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    ks.push_back(cpu::fast::gemm_kernels_avx512());
#endif
  return ks;
}

uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return static_cast<uint16_t>(b >> 16);  // truncation: the test's weights are what it keeps
}
float from_bf16(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

TEST(FastGemm, KernelsMatchDoubleSumsWithTails) {
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t shapes[][3] = {{1, 1, 1}, {5, 17, 3}, {8, 128, 1}, {13, 259, 7}, {64, 256, 9}};
  for (const GemmKernels& k : available_kernels()) {
    for (const auto& s : shapes) {
      const int64_t rows = s[0], cols = s[1], n = s[2];
      const int64_t ldw = cols + 3, ldx = cols + 5, ldy = rows + 2;
      std::vector<float> w(static_cast<size_t>(rows * ldw));
      std::vector<uint16_t> wb(w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        wb[i] = to_bf16(u(g));
        w[i] = from_bf16(wb[i]);  // the same values in both layouts
      }
      std::vector<float> x(static_cast<size_t>(n * ldx));
      for (float& v : x) v = u(g);
      std::vector<float> y32(static_cast<size_t>(n * ldy), NAN);
      std::vector<float> y16(static_cast<size_t>(n * ldy), NAN);
      k.f32(w.data(), ldw, rows, cols, x.data(), ldx, n, y32.data(), ldy);
      k.bf16(wb.data(), ldw, rows, cols, x.data(), ldx, n, y16.data(), ldy);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < cols; ++c) {
            ref += static_cast<double>(w[r * ldw + c]) * x[t * ldx + c];
            mag += std::fabs(static_cast<double>(w[r * ldw + c]) * x[t * ldx + c]);
          }
          const double tol = 1e-6 * mag + 1e-7;
          ASSERT_NEAR(y32[t * ldy + r], ref, tol) << rows << "x" << cols << " n " << n;
          ASSERT_EQ(y16[t * ldy + r], y32[t * ldy + r]) << "bf16 and f32 kernels differ";
        }
      }
      // Batch invariance: each token alone gives the same bits as in the batch.
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> one(static_cast<size_t>(rows));
        k.bf16(wb.data(), ldw, rows, cols, x.data() + t * ldx, ldx, 1, one.data(), rows);
        for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(one[r], y16[t * ldy + r]);
      }
    }
  }
}

TEST(FastGemm, AttentionKernelsMatchDoubleSums) {
  std::mt19937 g(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<GemmKernels> ks = {cpu::fast::active_kernels()};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    ks.push_back(cpu::fast::gemm_kernels_avx512());
#endif
  for (const GemmKernels& k : ks) {
    for (int64_t heads : {1, 3, 4, 5}) {
      for (int64_t dim : {8, 72, 128}) {
        const int64_t nk = 37;
        std::vector<float> q(static_cast<size_t>(heads * dim)), p(static_cast<size_t>(heads * nk));
        std::vector<std::vector<float>> kv(static_cast<size_t>(nk), std::vector<float>(dim));
        std::vector<const float*> keys;
        for (auto& row : kv) {
          for (float& v : row) v = u(g);
          keys.push_back(row.data());
        }
        for (float& v : q) v = u(g);
        for (float& v : p) v = u(g);
        std::vector<float> s(static_cast<size_t>(heads * nk), NAN);
        k.qk(q.data(), heads, keys.data(), nk, dim, s.data(), nk);
        std::vector<float> out(static_cast<size_t>(heads * dim), 0.5f);
        k.pv(p.data(), nk, heads, keys.data(), nk, dim, out.data());
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t j = 0; j < nk; ++j) {
            double ref = 0;
            for (int64_t d = 0; d < dim; ++d) ref += static_cast<double>(q[h * dim + d]) * kv[j][d];
            ASSERT_NEAR(s[h * nk + j], ref, 1e-4) << "qk h " << h << " j " << j << " dim " << dim;
          }
          for (int64_t d = 0; d < dim; ++d) {
            double ref = 0.5;
            for (int64_t j = 0; j < nk; ++j) ref += static_cast<double>(p[h * nk + j]) * kv[j][d];
            ASSERT_NEAR(out[h * dim + d], ref, 1e-4)
                << "pv h " << h << " d " << d << " dim " << dim;
          }
        }
      }
    }
  }
}

TEST(FastGemm, SwigluMatchesTheReferenceFormula) {
  std::vector<GemmKernels> ks = {cpu::fast::active_kernels()};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    ks.push_back(cpu::fast::gemm_kernels_avx512());
#endif
  std::vector<float> a0, u0;
  for (int i = 0; i < 403; ++i) {  // -100 .. 100, and a tail of 403 % 16
    a0.push_back(-100.0f + 0.4975f * static_cast<float>(i));
    u0.push_back(std::sin(static_cast<float>(i)) * 20.0f);
  }
  for (const GemmKernels& k : ks) {
    for (float limit : {0.0f, 10.0f}) {
      std::vector<float> a = a0;
      k.swiglu(a.data(), u0.data(), static_cast<int64_t>(a.size()), 1.5f, limit);
      for (size_t i = 0; i < a.size(); ++i) {
        double g = a0[i], v = u0[i];
        if (limit > 0) {
          g = std::min<double>(g, limit);
          v = std::clamp<double>(v, -limit, limit);
        }
        const double want = g / (1.0 + std::exp(-g)) * v * 1.5;
        ASSERT_NEAR(a[i], want, 2e-6 * std::fabs(want) + 1e-30) << "a " << a0[i] << " u " << u0[i];
      }
    }
  }
}

TEST(FastGemm, ThreadedEqualsSingleThreaded) {
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t rows = 300, cols = 256, n = 37;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& v : w) v = u(g);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = u(g);
  WeightView view{WeightElem::kF32, w.data(), rows, cols, cols};
  std::vector<float> a(static_cast<size_t>(n * rows)), b(a.size());
  cpu::fast::ThreadPool pool(3);
  cpu::fast::gemm(view, x.data(), cols, n, a.data(), rows, nullptr);
  cpu::fast::gemm(view, x.data(), cols, n, b.data(), rows, &pool);
  EXPECT_EQ(a, b);
}

std::string bundled_model() {
  return std::string(DSI_SOURCE_DIR) + "/models/dsv4-mini";
}

TEST(FastWeights, QuantisedWeightsConvertExactly) {
  auto ckpt = model::Checkpoint::open(bundled_model());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const model::ModelWeights& w = (*ckpt)->weights();
  cpu::fast::PackedWeights packed;
  int formats_seen = 0;
  for (const MatrixRef* m : {&w.layers[0].attn.wq_a,
                             &w.layers[3].ffn.experts[0].w1,
                             &w.layers[3].ffn.experts[5].w2,
                             &w.head}) {
    const WeightView v = packed.get(*m);
    ASSERT_EQ(v.rows, m->rows);
    ASSERT_EQ(v.cols, m->cols);
    if (m->format != WeightFormat::kFloat) {
      ++formats_seen;
      EXPECT_EQ(v.elem, WeightElem::kBF16) << weight_format_name(m->format);
    }
    std::vector<float> row(static_cast<size_t>(m->cols));
    for (int64_t r = 0; r < m->rows; r += 7) {
      m->dequant_row(r, row.data());
      for (int64_t c = 0; c < m->cols; ++c) {
        const float got = v.elem == WeightElem::kBF16
                              ? from_bf16(static_cast<const uint16_t*>(v.data)[r * v.ld + c])
                              : static_cast<const float*>(v.data)[r * v.ld + c];
        ASSERT_EQ(got, row[static_cast<size_t>(c)]) << "row " << r << " col " << c;
      }
    }
  }
  EXPECT_EQ(formats_seen, 3);  // FP8, MXFP4, MXFP4 (the head is BF16, used in place)
  EXPECT_GT(packed.converted_bytes(), 0);
}

struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // every step's last-row logits, concatenated
};

// Prefill `prompt`, then `steps` greedy tokens, one forward per token. With `follow`, each step
// feeds follow[i] instead of its own pick (the picks are still recorded): the other model's
// sequence, so that both are compared on the same contexts.
Greedy greedy(backend::Model& m,
              const model::ModelConfig& cfg,
              const std::vector<int32_t>& prompt,
              int steps,
              const std::vector<int32_t>* follow = nullptr) {
  auto arena = state::PageArena::growable(state::default_page_bytes(cfg));
  state::SequenceState st(cfg, arena.get(), 0, 0);
  backend::ForwardOptions last;
  last.last_logits_only = true;
  backend::ForwardOutputs out;
  Greedy g;
  std::vector<int32_t> in = prompt;
  for (int i = 0; i < steps; ++i) {
    Status s = m.forward(st, in, last, &out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok())
      return g;
    g.logits.insert(g.logits.end(), out.logits.begin(), out.logits.end());
    const int32_t next = static_cast<int32_t>(
        std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin());
    g.tokens.push_back(next);
    in = {follow != nullptr ? (*follow)[static_cast<size_t>(i)] : next};
  }
  return g;
}

const char* const kPrompts[] = {
    "def fibonacci(n):\n",
    "import os\n\n\ndef list_python_files(root):\n",
    "class Stack:\n    def __init__(self):\n",
    "# Read a CSV file and print the sum of the second column.\nimport csv\n",
    "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n",
    "for i in range(10):\n",
    "<｜User｜>How do I read a file line by line in Python?<｜Assistant｜></think>",
    "import numpy as np\n\nx = np.",
};

std::vector<std::vector<int32_t>> prompt_ids() {
  auto tok = tokenizer::Tokenizer::load(bundled_model() + "/tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  std::vector<std::vector<int32_t>> ids;
  if (!tok.ok())
    return ids;
  for (const char* p : kPrompts) {
    auto e = (*tok)->encode(p, true);
    EXPECT_TRUE(e.ok());
    std::vector<int32_t> v = {0};  // BOS
    v.insert(v.end(), e->begin(), e->end());
    ids.push_back(v);
  }
  return ids;
}

struct LogitDiff {
  double max_abs = 0;
  double mean_abs = 0;
};
LogitDiff logit_diff(const std::vector<float>& a, const std::vector<float>& b) {
  LogitDiff d;
  EXPECT_EQ(a.size(), b.size());
  const size_t n = std::min(a.size(), b.size());
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
    d.max_abs = std::isnan(e) ? INFINITY : std::max(d.max_abs, e);
    sum += e;
  }
  d.mean_abs = n ? sum / static_cast<double>(n) : 0;
  return d;
}

void check_prompt_set(model::Numerics numerics, int steps, size_t prompts) {
  auto ckpt = model::Checkpoint::open(bundled_model());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const model::ModelConfig& cfg = (*ckpt)->config();
  cpu::CpuModel ref(cfg, (*ckpt)->weights(), numerics);
  cpu::fast::ThreadPool pool(2);
  cpu::fast::FastCpuModel fast(cfg, (*ckpt)->weights(), numerics, &pool);
  const auto ids = prompt_ids();
  ASSERT_EQ(ids.size(), std::size(kPrompts));
  double worst = 0;
  for (size_t p = 0; p < std::min(prompts, ids.size()); ++p) {
    // The fast model follows the reference's tokens: every step compares the same context.
    const Greedy r = greedy(ref, cfg, ids[p], steps);
    const Greedy f = greedy(fast, cfg, ids[p], steps, &r.tokens);
    ASSERT_EQ(f.tokens.size(), r.tokens.size());
    // The same pick at every step, except where the reference's own logits put the two picks
    // within the logit budget of each other (a near-tie that the kernels' summation order, and in
    // deepseek numerics a rounding point, may break either way).
    const size_t vocab = static_cast<size_t>(cfg.vocab_size);
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      if (f.tokens[i] == r.tokens[i])
        continue;
      const float* lr = r.logits.data() + i * vocab;
      EXPECT_LE(lr[r.tokens[i]] - lr[f.tokens[i]], budget(numerics).max_abs)
          << "prompt " << p << " step " << i << ": greedy picks differ beyond a near-tie";
    }
    const LogitDiff d = logit_diff(f.logits, r.logits);
    EXPECT_LE(d.max_abs, budget(numerics).max_abs) << "prompt " << p;
    EXPECT_LE(d.mean_abs, budget(numerics).mean_abs) << "prompt " << p;
    worst = std::max(worst, d.max_abs);
  }
  std::printf("[cpu fast] %s numerics: %zu prompts x %d tokens, max|dlogit| %.3g\n",
              model::numerics_name(numerics),
              std::min(prompts, ids.size()),
              steps,
              worst);
}

TEST(FastModel, GreedyTokensEqualReferenceOnBundledPrompts) {
  check_prompt_set(model::Numerics::kReference, 24, std::size(kPrompts));
}

TEST(FastModel, GreedyTokensEqualReferenceDeepseekNumerics) {
  check_prompt_set(model::Numerics::kDeepSeek, 12, 3);
}

// All prompts in one step stream (chunked prefill of some, decode rows of others, in one
// forward_batch) gives the bits of running each alone.
TEST(FastModel, BatchedStepsEqualSingleSequences) {
  auto ckpt = model::Checkpoint::open(bundled_model());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const model::ModelConfig& cfg = (*ckpt)->config();
  cpu::fast::ThreadPool pool(2);
  cpu::fast::FastCpuModel fast(cfg, (*ckpt)->weights(), model::Numerics::kReference, &pool);
  const auto ids = prompt_ids();
  const size_t P = ids.size();
  const int steps = 10;
  std::vector<Greedy> alone;
  for (size_t p = 0; p < P; ++p) alone.push_back(greedy(fast, cfg, ids[p], steps));

  auto arena = state::PageArena::growable(state::default_page_bytes(cfg));
  std::vector<std::unique_ptr<state::SequenceState>> st;
  for (size_t p = 0; p < P; ++p) {
    st.push_back(std::make_unique<state::SequenceState>(cfg, arena.get(), p, 0));
  }
  // Sequence p starts at step p % 3 (staggered) and prefills in chunks of 5 tokens.
  std::vector<std::vector<int32_t>> pending(P);
  std::vector<size_t> prefilled(P, 0);
  std::vector<Greedy> batched(P);
  std::vector<backend::ForwardOutputs> outs(P);
  for (int round = 0; round < 200; ++round) {
    std::vector<backend::ForwardItem> items;
    std::vector<size_t> which;
    std::vector<std::vector<int32_t>> chunks(P);
    for (size_t p = 0; p < P; ++p) {
      if (round < static_cast<int>(p % 3) || static_cast<int>(batched[p].tokens.size()) >= steps)
        continue;
      if (prefilled[p] < ids[p].size()) {
        const size_t n = std::min<size_t>(5, ids[p].size() - prefilled[p]);
        chunks[p].assign(ids[p].begin() + prefilled[p], ids[p].begin() + prefilled[p] + n);
        prefilled[p] += n;
      } else {
        chunks[p] = {batched[p].tokens.back()};
      }
      backend::ForwardItem it;
      it.state = st[p].get();
      it.tokens = chunks[p];
      it.options.last_logits_only = true;
      it.out = &outs[p];
      items.push_back(it);
      which.push_back(p);
    }
    if (items.empty())
      break;
    ASSERT_TRUE(fast.forward_batch(items).ok());
    for (size_t i = 0; i < items.size(); ++i) {
      ASSERT_TRUE(items[i].status.ok()) << items[i].status.to_string();
      const size_t p = which[i];
      if (prefilled[p] < ids[p].size())
        continue;  // mid-prompt chunk: no token yet
      const auto& l = outs[p].logits;
      batched[p].logits.insert(batched[p].logits.end(), l.begin(), l.end());
      batched[p].tokens.push_back(
          static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
    }
  }
  for (size_t p = 0; p < P; ++p) {
    EXPECT_EQ(batched[p].tokens, alone[p].tokens) << "prompt " << p;
    EXPECT_TRUE(batched[p].logits == alone[p].logits) << "prompt " << p << ": logits not bitwise";
  }
}

// A decode step over several sequences allocates nothing once that shape has been seen (the
// scratch is the model's and is reused; the state's pages come from a preallocated arena).
TEST(FastModel, DecodeStepDoesNotAllocate) {
  auto ckpt = model::Checkpoint::open(bundled_model());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const model::ModelConfig& cfg = (*ckpt)->config();
  cpu::fast::ThreadPool pool(2);
  cpu::fast::FastCpuModel fast(cfg, (*ckpt)->weights(), model::Numerics::kReference, &pool);
  const int64_t page = state::default_page_bytes(cfg);
  const int64_t pages = state::SequenceState::pages_for(cfg, page, 64, 0) * 12 + 16;
  auto arena = state::PageArena::with_budget(page * pages, page);
  const int B = 12;  // > 8 rows: the attention rows run on the pool too
  std::vector<std::unique_ptr<state::SequenceState>> st;
  std::vector<backend::ForwardOutputs> outs(B);
  std::vector<backend::ForwardItem> items(B);
  std::vector<std::vector<int32_t>> toks(B);
  for (int i = 0; i < B; ++i) {
    st.push_back(std::make_unique<state::SequenceState>(cfg, arena.get(), i, 0));
    std::vector<int32_t> prompt;
    for (int j = 0; j < 20 + i; ++j) prompt.push_back((j * 31 + i * 7 + 3) % 8000);
    backend::ForwardOptions last;
    last.last_logits_only = true;
    ASSERT_TRUE(fast.forward(*st[i], prompt, last, &outs[i]).ok());
  }
  auto step = [&](int k) {
    for (int i = 0; i < B; ++i) {
      toks[i].assign(1, (k * 13 + i) % 8000);
      items[i] = backend::ForwardItem();
      items[i].state = st[i].get();
      items[i].tokens = toks[i];
      items[i].options.last_logits_only = true;
      items[i].out = &outs[i];
    }
    return fast.forward_batch(items);
  };
  {  // the counter sees allocations (so the check below can fail)
    g_allocs = 0;
    g_count_allocs = true;
    auto probe = std::make_unique<std::vector<float>>(16);
    g_count_allocs = false;
    ASSERT_EQ(g_allocs.load(), 2);
  }
  ASSERT_TRUE(step(0).ok());  // the shape's first step sizes the scratch
  for (int k = 1; k <= 3; ++k) {
    g_allocs = 0;
    g_count_allocs = true;
    const Status s = step(k);
    g_count_allocs = false;
    ASSERT_TRUE(s.ok());
    for (const auto& it : items) ASSERT_TRUE(it.status.ok());
    EXPECT_EQ(g_allocs.load(), 0) << "heap allocations in decode step " << k;
  }
}

// A bad token id fails its item only; the others proceed (the reference's contract).
TEST(FastModel, PerItemErrors) {
  auto ckpt = model::Checkpoint::open(bundled_model());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const model::ModelConfig& cfg = (*ckpt)->config();
  cpu::fast::FastCpuModel fast(cfg, (*ckpt)->weights(), model::Numerics::kReference, nullptr);
  auto arena = state::PageArena::growable(state::default_page_bytes(cfg));
  state::SequenceState a(cfg, arena.get(), 0, 0), b(cfg, arena.get(), 1, 0);
  const std::vector<int32_t> good = {0, 5, 6}, bad = {0, static_cast<int32_t>(cfg.vocab_size)};
  backend::ForwardOutputs oa, ob;
  backend::ForwardItem items[2];
  items[0].state = &a;
  items[0].tokens = good;
  items[0].out = &oa;
  items[1].state = &b;
  items[1].tokens = bad;
  items[1].out = &ob;
  ASSERT_TRUE(fast.forward_batch(items).ok());
  EXPECT_TRUE(items[0].status.ok());
  EXPECT_EQ(items[1].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.num_tokens(), 3);
  EXPECT_EQ(b.num_tokens(), 0);
  EXPECT_EQ(oa.logits.size(), static_cast<size_t>(3 * cfg.vocab_size));
}

// The golden fixtures (both checkpoint layouts), full forward and chunked prefill, both
// numerics, MTP through the reference: all logits within the budget of the reference.
TEST(FastModel, FixturesWithinBudget) {
  for (const char* fx : {"tiny-a/official", "tiny-a/hf", "tiny-b/official"}) {
    auto ckpt = model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/" + fx);
    ASSERT_TRUE(ckpt.ok()) << fx << ": " << ckpt.status().to_string();
    const model::ModelConfig& cfg = (*ckpt)->config();
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 11) % static_cast<int>(cfg.vocab_size));
    for (model::Numerics num : {model::Numerics::kReference, model::Numerics::kDeepSeek}) {
      for (int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{7}}) {
        cpu::CpuModel ref(cfg, (*ckpt)->weights(), num);
        cpu::fast::ThreadPool pool(2);
        cpu::fast::FastCpuModel fast(cfg, (*ckpt)->weights(), num, &pool);
        std::vector<float> lr, lf;
        for (backend::Model* m :
             {static_cast<backend::Model*>(&ref), static_cast<backend::Model*>(&fast)}) {
          auto arena = state::PageArena::growable(state::default_page_bytes(cfg));
          state::SequenceState st(cfg, arena.get(), 0, 0);
          std::vector<float>& dst = m == &ref ? lr : lf;
          const int64_t total = static_cast<int64_t>(ids.size());
          const int64_t step = chunk == 0 ? total : chunk;
          backend::ForwardOutputs out;
          for (int64_t b = 0; b < total; b += step) {
            const int64_t n = std::min(step, total - b);
            Status s = m->forward(st, std::span<const int32_t>(ids.data() + b, n), {}, &out);
            ASSERT_TRUE(s.ok()) << s.to_string();
            dst.insert(dst.end(), out.logits.begin(), out.logits.end());
          }
        }
        const LogitDiff d = logit_diff(lf, lr);
        std::printf("[cpu fast] %-16s %-9s chunk %2lld: max|dlogit| %.3g mean %.3g\n",
                    fx,
                    model::numerics_name(num),
                    static_cast<long long>(chunk),
                    d.max_abs,
                    d.mean_abs);
        EXPECT_LE(d.max_abs, budget(num).max_abs) << fx << " chunk " << chunk;
        EXPECT_LE(d.mean_abs, budget(num).mean_abs) << fx << " chunk " << chunk;
      }
    }
  }
}

// The MTP block on the fast path (forward with run_mtp in chunks, and recurrent drafting for
// speculative decoding) against the reference: draft logits within the same budget, the same
// drafts and nearly the same draft probabilities.
TEST(FastModel, MtpAndDraftsMatchTheReference) {
  for (const std::string& dir :
       {std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official", bundled_model()}) {
    auto ckpt = model::Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.ok()) << dir << ": " << ckpt.status().to_string();
    const model::ModelConfig& cfg = (*ckpt)->config();
    std::vector<int32_t> ids;
    for (int i = 0; i < 30; ++i) ids.push_back((i * 37 + 11) % static_cast<int>(cfg.vocab_size));
    for (model::Numerics num : {model::Numerics::kReference, model::Numerics::kDeepSeek}) {
      for (int64_t chunk : {int64_t{0}, int64_t{7}}) {
        cpu::CpuModel ref(cfg, (*ckpt)->weights(), num);
        cpu::fast::ThreadPool pool(2);
        cpu::fast::FastCpuModel fast(cfg, (*ckpt)->weights(), num, &pool);
        std::vector<float> lr, lf;
        std::vector<int32_t> dr(4), df(4);
        std::vector<float> pr(4), pf(4);
        auto arena = state::PageArena::growable(state::default_page_bytes(cfg));
        for (backend::Model* m :
             {static_cast<backend::Model*>(&ref), static_cast<backend::Model*>(&fast)}) {
          state::SequenceState st(cfg, arena.get(), 0, 4);
          const bool is_ref = m == &ref;
          std::vector<float>& dst = is_ref ? lr : lf;
          const int64_t total = static_cast<int64_t>(ids.size());
          const int64_t step = chunk == 0 ? total : chunk;
          backend::ForwardOptions o;
          o.run_mtp = true;
          backend::ForwardOutputs out;
          for (int64_t b = 0; b < total; b += step) {
            const int64_t n = std::min(step, total - b);
            Status s = m->forward(st, std::span<const int32_t>(ids.data() + b, n), o, &out);
            ASSERT_TRUE(s.ok()) << s.to_string();
            dst.insert(dst.end(), out.mtp_logits.begin(), out.mtp_logits.end());
          }
          backend::DraftItem it;
          it.state = &st;
          it.next_token = 5;
          it.num_steps = 4;
          it.tokens = (is_ref ? dr : df).data();
          it.probs = (is_ref ? pr : pf).data();
          ASSERT_TRUE(m->mtp_draft_batch(std::span<backend::DraftItem>(&it, 1)).ok());
          ASSERT_TRUE(it.status.ok()) << it.status.to_string();
          EXPECT_EQ(st.mtp_num_tokens(), total);
        }
        ASSERT_EQ(lr.size(), static_cast<size_t>((ids.size() - 1) * cfg.vocab_size));
        const LogitDiff d = logit_diff(lf, lr);
        EXPECT_LE(d.max_abs, budget(num).max_abs) << dir << " chunk " << chunk;
        EXPECT_LE(d.mean_abs, budget(num).mean_abs) << dir << " chunk " << chunk;
        EXPECT_EQ(df, dr) << dir << " chunk " << chunk;
        // DeepSeek numerics round q to BF16: a last-bit difference of an fp32 query value from
        // the other summation order flips its BF16 value (2^-8 relative) about once per row,
        // and on the random-weight tiny-a the four recurrent draft steps carry such flips
        // across FP8 boundaries (measured: 0.068 on one probability, drafts unchanged).
        const double ptol = num == model::Numerics::kReference ? 2e-2 : 0.1;
        for (size_t i = 0; i < pr.size(); ++i) EXPECT_NEAR(pf[i], pr[i], ptol) << dir;
      }
    }
  }
}

// A MTP block that fell behind (forwards without run_mtp) resumes from the kept final streams:
// SequenceState::resume_mtp moves it to the oldest of the kept positions and floors its window
// there, so the ring rows it never wrote (NaN here) are not attended. The catch-up and drafts
// then run on both paths with finite probabilities and the same drafts.
TEST(FastModel, MtpResumesFromTheKeptFinalStreams) {
  auto ckpt = model::Checkpoint::open(bundled_model());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const model::ModelConfig& cfg = (*ckpt)->config();
  std::vector<int32_t> ids;
  for (int i = 0; i < 30; ++i) ids.push_back((i * 37 + 11) % static_cast<int>(cfg.vocab_size));
  const int64_t total = static_cast<int64_t>(ids.size());
  const int64_t rollback = 4;
  cpu::CpuModel ref(cfg, (*ckpt)->weights(), model::Numerics::kReference);
  cpu::fast::ThreadPool pool(2);
  cpu::fast::FastCpuModel fast(cfg, (*ckpt)->weights(), model::Numerics::kReference, &pool);
  EXPECT_TRUE(ref.can_resume_drafting());
  EXPECT_TRUE(fast.can_resume_drafting());
  auto arena = state::PageArena::growable(state::default_page_bytes(cfg));
  std::vector<int32_t> dr(3), df(3);
  std::vector<float> pr(3), pf(3);
  for (backend::Model* m :
       {static_cast<backend::Model*>(&ref), static_cast<backend::Model*>(&fast)}) {
    const bool is_ref = m == &ref;
    state::SequenceState st(cfg, arena.get(), 0, rollback);
    backend::ForwardOutputs out;
    ASSERT_TRUE(m->forward(st, ids, {}, &out).ok());  // without the MTP block
    EXPECT_EQ(st.mtp_num_tokens(), 0);
    state::LayerState& ls = st.mtp_layers()[0];
    for (int64_t r = 0; r < ls.ring.capacity(); ++r)
      std::fill(ls.ring.row(r), ls.ring.row(r) + ls.ring.width(), std::nanf(""));
    ASSERT_TRUE(st.resume_mtp());
    const int64_t from = total - (rollback + 1);
    EXPECT_EQ(st.mtp_num_tokens(), from);
    EXPECT_EQ(ls.window_floor, from);
    st.check_integrity();
    backend::DraftItem it;
    it.state = &st;
    it.next_token = 5;
    it.num_steps = 3;
    it.catch_up = std::span<const int32_t>(ids.data() + from + 1, total - 1 - from);
    it.tokens = (is_ref ? dr : df).data();
    it.probs = (is_ref ? pr : pf).data();
    ASSERT_TRUE(m->mtp_draft_batch(std::span<backend::DraftItem>(&it, 1)).ok());
    ASSERT_TRUE(it.status.ok()) << it.status.to_string();
    EXPECT_EQ(st.mtp_num_tokens(), total);
    for (float p : is_ref ? pr : pf) EXPECT_TRUE(std::isfinite(p) && p > 0.0f) << p;
  }
  EXPECT_EQ(df, dr);
  // Nothing to resume from: no final streams of the last position (a fresh sequence).
  state::SequenceState empty(cfg, arena.get(), 1, rollback);
  EXPECT_FALSE(empty.resume_mtp());
}

}  // namespace
}  // namespace dsinfer
