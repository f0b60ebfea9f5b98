// Attention-side ops against the CPU: sink attention over CSR key lists (pool / chunk-local /
// empty refs, 0 .. 8320 keys), the compressor (row append bit-exact; pooling with and without
// overlap, RMSNorm, RoPE at the block start, FP8 / Hadamard+FP4 storage simulation), the
// Lightning indexer scores over paged keys (bit-exact, up to 262144 blocks) and the per-query
// top-k (exact, ties, k > n, all invalid).
//
// Tolerances. Sink attention: the output is a convex combination of key rows; CUDA's expf and
// the online-softmax order move each weight by a few ulps, so |gpu - cpu| <= 2e-5 * max|k|.
// With BF16 operands (deepseek numerics) against cpu::attention_with_sink_bf16: the same, plus
// one BF16 step for each probability close enough to a rounding midpoint to land on the other
// side (bf16_flip_allowance).
// Compressor without simulation: the CPU's softmax and sums in the CPU's order, differing by
// expf / sinf / cosf ulps: 1e-5 relative to the entry's RMS. With FP8/FP4 simulation a ulp can
// move a value across a rounding boundary: at most 2% of the values may differ by up to one grid
// step (<= 2/3 of the block's amax for FP4 (4 -> 6 at scale amax/3), 1/8 for FP8), the rest as
// without simulation.
// Indexer scores and top-k: bit-exact (same serial fp32 operations; exact selection).
#include "kernels/cuda/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/kv_record.h"
#include "kernels/cuda/launch_util.h"
#include "numeric/quant.h"
#include "numeric/records.h"
#include "test_util.h"

namespace dsinfer::cuda::test {
namespace {

// ---- sink attention ----------------------------------------------------------------------------

// BF16 operands: the GPU rounds the same probabilities e_j = 2^(u_j - M) to BF16 as
// cpu::attention_with_sink_bf16, but its u_j differ in the last bits (fp32 sums in another order,
// exp2f ulps), so a probability within ~1e-5 relative of a BF16 rounding midpoint may land on the
// other neighbour: one BF16 step, <= 2^-7 e_j, i.e. 2^-7 e_j / l |k_j| on the output. Adds that
// for every probability within 2^-12 relative of a midpoint (generous) to tol[h * dim + d].
void bf16_flip_allowance(const float* q,
                         int64_t heads,
                         int64_t dim,
                         const std::vector<const float*>& keys,
                         const std::vector<float>& sinks,
                         float scale,
                         double* tol) {
  const double log2e = 1.4426950408889634;
  std::vector<double> e(keys.size());
  for (int64_t h = 0; h < heads; ++h) {
    const double us = sinks[h] * log2e;
    double umax = us;
    for (size_t j = 0; j < keys.size(); ++j) {
      double dd = 0.0;
      for (int64_t d = 0; d < dim; ++d)
        dd += static_cast<double>(numeric::round_to_bf16(q[h * dim + d])) * keys[j][d];
      e[j] = dd * scale * log2e;
      umax = std::max(umax, e[j]);
    }
    const double m = std::ceil(umax);
    double l = std::exp2(us - m);
    for (double& v : e) {
      v = std::exp2(v - m);
      l += v;
    }
    for (size_t j = 0; j < keys.size(); ++j) {
      const float lo = static_cast<float>(e[j] * (1.0 - 0x1p-12));
      const float hi = static_cast<float>(e[j] * (1.0 + 0x1p-12));
      if (numeric::round_to_bf16(lo) == numeric::round_to_bf16(hi))
        continue;
      for (int64_t d = 0; d < dim; ++d)
        tol[h * dim + d] += 0x1p-7 * e[j] / l * std::fabs(keys[j][d]);
    }
  }
}

// Paths of launch_sink_attention: the one-warp-per-key kernel, the tensor-core kernel with one
// block per query, and the tensor-core kernel with split key lists (decode-sized nq).
enum class AttnPath { kSimple, kMma, kMmaSplit };

void run_sink_attention(int64_t heads,
                        int64_t dim,
                        const std::vector<int64_t>& key_counts,
                        uint32_t seed,
                        AttnPath path = AttnPath::kMmaSplit,
                        int64_t exact_dims = 0,
                        bool bf16 = false,
                        bool q16 = false) {
  SCOPED_TRACE("sink attention heads " + std::to_string(heads) + " dim " + std::to_string(dim) +
               " path " + std::to_string(static_cast<int>(path)) + (bf16 ? " bf16" : "") +
               (q16 ? " q16" : ""));
  if (bf16)
    exact_dims = dim;  // deepseek KV rows: every value BF16-exact
  std::mt19937 rng(seed);
  const int64_t nq = static_cast<int64_t>(key_counts.size());
  const int64_t pool_rows = 9000;
  const int64_t local_rows = 300;
  // Rows need not be packed; with q16 (the model's layout) they are, and 16-byte aligned.
  const int64_t row_stride = q16 ? dim : dim + 3;
  std::vector<float> pool = normal_floats(static_cast<size_t>(pool_rows * row_stride), seed + 1);
  std::vector<float> local = normal_floats(static_cast<size_t>(local_rows * row_stride), seed + 2);
  // Keys whose first exact_dims dims are BF16 values (as FP8-simulated ones are).
  auto to_bf16 = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&v, &u, 4);
    return v;
  };
  for (auto* rows : {&pool, &local}) {
    for (size_t i = 0; i < rows->size(); ++i) {
      if (static_cast<int64_t>(i % static_cast<size_t>(row_stride)) < exact_dims)
        (*rows)[i] = to_bf16((*rows)[i]);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  std::vector<float> q = normal_floats(static_cast<size_t>(nq * heads * dim), seed + 3, 1.5f);
  std::vector<float> sinks = normal_floats(static_cast<size_t>(heads), seed + 4, 2.0f);
  std::vector<int64_t> begin{0};
  std::vector<int64_t> refs;
  std::vector<float> want(static_cast<size_t>(nq * heads * dim));
  std::vector<double> tol(want.size());
  for (int64_t qi = 0; qi < nq; ++qi) {
    std::vector<const float*> keys;
    double kmax = 0.0;
    for (int64_t j = 0; j < key_counts[qi]; ++j) {
      const uint32_t kind = rng() % 10;
      if (kind == 0) {
        refs.push_back(kKvRefNone);  // an empty slot
        continue;
      }
      const bool in_local = kind < 4;
      const int64_t row = static_cast<int64_t>(rng() % (in_local ? local_rows : pool_rows));
      refs.push_back(in_local ? kv_ref_local(row * row_stride) : kv_ref_pool(row * row_stride));
      const float* k = (in_local ? local.data() : pool.data()) + row * row_stride;
      keys.push_back(k);
      for (int64_t d = 0; d < dim; ++d) kmax = std::max<double>(kmax, std::fabs(k[d]));
    }
    begin.push_back(static_cast<int64_t>(refs.size()));
    (bf16 ? cpu::attention_with_sink_bf16 : cpu::attention_with_sink)(
        q.data() + qi * heads * dim,
        heads,
        dim,
        keys,
        sinks.data(),
        scale,
        want.data() + qi * heads * dim);
    // Tensor cores: q, k and p in BF16 high + low halves, ~2^-17 relative per product, over
    // up to 512-term dots of |q| ~ 1.5 sigma values: 5e-5 of the largest key value. BF16
    // operands: the products are exact on both sides, only fp32 sums and exp2f differ (2e-5),
    // plus bf16_flip_allowance for the probabilities that such a difference can round to the
    // other BF16 neighbour.
    const double rel = path == AttnPath::kSimple || bf16 ? 2e-5 : 5e-5;
    for (int64_t i = 0; i < heads * dim; ++i) tol[qi * heads * dim + i] = rel * kmax + 1e-30;
    if (bf16) {
      bf16_flip_allowance(q.data() + qi * heads * dim,
                          heads,
                          dim,
                          keys,
                          sinks,
                          scale,
                          tol.data() + qi * heads * dim);
    }
  }
  if (refs.empty())
    refs.push_back(kKvRefNone);
  DevVec<float> d_pool(pool), d_local(local), d_q(q), d_sinks(sinks), d_out(want.size() + 1, 3.0f);
  DevVec<int64_t> d_begin(begin), d_refs(refs);
  // q16: q handed over as BF16 bits (what the kernel rounds it to anyway).
  std::vector<uint16_t> q_bits;
  for (float v : q) {
    const float r = numeric::round_to_bf16(v);
    uint32_t u;
    std::memcpy(&u, &r, 4);
    q_bits.push_back(static_cast<uint16_t>(u >> 16));
  }
  DevVec<uint16_t> d_q16(q16 ? q_bits : std::vector<uint16_t>{0});
  const int64_t scratch_floats =
      path == AttnPath::kMmaSplit ? sink_attention_scratch_floats(nq, heads, dim) : 0;
  DevVec<float> d_scratch(static_cast<size_t>(std::max<int64_t>(scratch_floats, 1)), 0.0f);
  DSI_EXPECT_OK(launch_sink_attention(SinkAttentionParams{.q = q16 ? nullptr : d_q.get(),
                                                          .nq = nq,
                                                          .heads = heads,
                                                          .dim = dim,
                                                          .pool = d_pool.get(),
                                                          .local = d_local.get(),
                                                          .key_begin = d_begin.get(),
                                                          .key_refs = d_refs.get(),
                                                          .sinks = d_sinks.get(),
                                                          .scale = scale,
                                                          .out = d_out.get(),
                                                          .tensor_cores = path != AttnPath::kSimple,
                                                          .split_scratch = d_scratch.get(),
                                                          .split_scratch_floats = scratch_floats,
                                                          .exact_dims = exact_dims,
                                                          .bf16_operands = bf16,
                                                          .q_bf16 = q16 ? d_q16.get() : nullptr},
                                      nullptr));
  sync();
  const std::vector<float> got = d_out.download();
  expect_within(want, got, tol, bf16 ? "sink attention (bf16 operands)" : "sink attention");
  EXPECT_EQ(got.back(), 3.0f) << "write past the end";
}

TEST_F(GpuTest, SinkAttentionMatchesCpu) {
  uint32_t seed = 1;
  for (AttnPath path : {AttnPath::kSimple, AttnPath::kMma, AttnPath::kMmaSplit}) {
    for (int64_t dim : {512, 64, 7, 129, 128}) {
      for (int64_t heads : {1, 3, 8, 17}) {
        run_sink_attention(heads, dim, {0, 1, 3, 7, 129, 640, 733}, seed += 10, path);
      }
    }
    run_sink_attention(64, 512, {128, 640, 1}, seed += 10, path);  // decode-like, all 64 heads
    run_sink_attention(64, 512, {31, 33, 0, 64, 65}, seed += 10, path);  // tile edges
    // deepseek numerics' keys: the 448 no-RoPE dims exact in BF16, their low-half MMAs skipped.
    run_sink_attention(64, 512, {128, 640, 1, 700}, seed += 10, path, 448);
    // BF16 operands (deepseek numerics, cpu::attention_with_sink_bf16): small shapes, the
    // unsupported dims of the simple kernel, real heads and width with masked keys, tile edges
    // and splits (decode-sized nq), and prefill-sized nq without splits.
    for (int64_t dim : {64, 128, 7, 512}) {
      for (int64_t heads : {1, 3, 17}) {
        run_sink_attention(heads, dim, {0, 1, 3, 7, 129, 640, 733}, seed += 10, path, 0, true);
      }
    }
    run_sink_attention(
        64, 512, {1, 31, 32, 33, 0, 64, 65, 128, 640, 700}, seed += 10, path, 0, true);
    // BF16 q (the model's deepseek path where the wgmma kernel runs): decode-sized with splits,
    // and more queries than SMs (each block walks several, the next q copied in meanwhile).
    SinkAttentionParams probe{.heads = 64, .dim = 512, .bf16_operands = true};
    if (path != AttnPath::kSimple && sink_attention_reads_q_bf16(probe)) {
      run_sink_attention(
          64, 512, {1, 31, 32, 33, 0, 64, 65, 128, 640, 700}, seed += 10, path, 0, true, true);
      std::vector<int64_t> many(300);
      for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i * 13 % 160);
      run_sink_attention(64, 512, many, seed += 10, path, 0, true, true);
      run_sink_attention(17, 512, many, seed += 10, path, 0, true, true);
    }
    if (!small_mode()) {
      run_sink_attention(2, 512, {8320, 4096}, seed += 10, path, 0, true);
      std::vector<int64_t> many(300);
      for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(1 + i * 7 % 700);
      run_sink_attention(64, 512, many, seed += 10, path, 0, true);
    }
    if (!small_mode()) {
      run_sink_attention(2, 512, {8320, 4096}, seed += 10, path);  // HCA at 1M: 128 + 8192 keys
      // Prefill-sized: more queries than the split threshold, real heads and width.
      std::vector<int64_t> many(300);
      for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i * 7 % 700);
      run_sink_attention(64, 512, many, seed += 10, path);
    }
  }
}

// A decode-width attention case with RoPE (dim 512, 32 rotated pairs): BF16-exact pool rows (the
// deepseek KV rows), q (and its BF16 bits), sinks, the RoPE table, positions up to 128k and each
// query's key list (a ninth of the keys masked), on the device.
struct RopeAttnCase {
  static constexpr int64_t kDim = 512;
  static constexpr int64_t kRopeHalf = 32;
  int64_t heads = 0;
  int64_t nq = 0;
  DevVec<float> pool, q, sinks, freq;
  DevVec<uint16_t> q16;
  DevVec<int64_t> begin, refs, pos;

  RopeAttnCase(int64_t h, const std::vector<int64_t>& key_counts, uint32_t seed)
      : heads(h), nq(static_cast<int64_t>(key_counts.size())) {
    std::mt19937 rng(seed);
    const int64_t pool_rows = 4000;
    std::vector<float> p = normal_floats(static_cast<size_t>(pool_rows * kDim), seed + 1);
    for (float& v : p) v = numeric::round_to_bf16(v);
    const std::vector<float> qh =
        normal_floats(static_cast<size_t>(nq * heads * kDim), seed + 3, 1.5f);
    std::vector<uint16_t> q_bits;
    for (float v : qh) q_bits.push_back(numeric::f32_to_bf16(v));
    std::vector<float> inv_freq(kRopeHalf);
    for (int64_t i = 0; i < kRopeHalf; ++i)
      inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / (2 * kRopeHalf));
    std::vector<int64_t> positions(static_cast<size_t>(nq));
    for (int64_t qi = 0; qi < nq; ++qi) positions[qi] = static_cast<int64_t>(rng() % 131072);
    std::vector<int64_t> b{0};
    std::vector<int64_t> r;
    for (int64_t qi = 0; qi < nq; ++qi) {
      for (int64_t j = 0; j < key_counts[qi]; ++j) {
        r.push_back(rng() % 9 == 0 ? kKvRefNone
                                   : kv_ref_pool(static_cast<int64_t>(rng() % pool_rows) * kDim));
      }
      b.push_back(static_cast<int64_t>(r.size()));
    }
    if (r.empty())
      r.push_back(kKvRefNone);
    pool = DevVec<float>(p);
    q = DevVec<float>(qh);
    q16 = DevVec<uint16_t>(q_bits);
    sinks = DevVec<float>(normal_floats(static_cast<size_t>(heads), seed + 4, 2.0f));
    freq = DevVec<float>(inv_freq);
    begin = DevVec<int64_t>(b);
    refs = DevVec<int64_t>(r);
    pos = DevVec<int64_t>(positions);
  }

  SinkAttentionParams params(float* out, bool bf16_ops) const {
    return SinkAttentionParams{.q = q.get(),
                               .nq = nq,
                               .heads = heads,
                               .dim = kDim,
                               .pool = pool.get(),
                               .key_begin = begin.get(),
                               .key_refs = refs.get(),
                               .sinks = sinks.get(),
                               .scale = 1.0f / std::sqrt(static_cast<float>(kDim)),
                               .out = out,
                               .bf16_operands = bf16_ops};
  }

  // What the deepseek path does to fp32 attention output without the fused forms: launch_rope's
  // inverse, then every value rounded to BF16.
  void unrotate_and_round(float* out) const {
    DSI_EXPECT_OK(launch_rope(RopeParams{.x = out,
                                         .tokens = nq,
                                         .heads = heads,
                                         .dim = kDim,
                                         .positions = pos.get(),
                                         .inv_freq = freq.get(),
                                         .half = kRopeHalf,
                                         .inverse = true},
                              nullptr));
    DSI_EXPECT_OK(launch_quant_sim(
        QuantSimParams{.x = out, .rows = nq, .len = heads * kDim, .kind = QuantSim::kBf16},
        nullptr));
  }
};

// The BF16 output of the wgmma kernel (out_bf16: the deepseek path's wo_a input) equals, bit for
// bit, its fp32 output turned back by launch_rope (inverse) and rounded by launch_quant_sim
// (kBf16): the unfused path the model takes where the fused one does not apply. Real heads and
// width, keys masked and at tile edges, positions up to 128k (cosf / sinf's slow reduction), a
// padded output row (out_bf16_ld > heads * dim), BF16 q or fp32 q.
void run_sink_attention_bf16_out(int64_t heads,
                                 const std::vector<int64_t>& key_counts,
                                 uint32_t seed,
                                 bool q16) {
  SCOPED_TRACE("sink attention bf16 out heads " + std::to_string(heads) + (q16 ? " q16" : ""));
  const RopeAttnCase c(heads, key_counts, seed);
  const int64_t nq = c.nq;
  const int64_t width = heads * RopeAttnCase::kDim;
  const int64_t ld = width + 64;
  DevVec<float> d_out(static_cast<size_t>(nq * width), 0.0f);
  DevVec<uint16_t> d_out16(static_cast<size_t>(nq * ld + 2), uint16_t{0x7fc1});
  SinkAttentionParams sp = c.params(d_out.get(), true);
  if (q16) {
    sp.q = nullptr;
    sp.q_bf16 = c.q16.get();
  }
  DSI_EXPECT_OK(launch_sink_attention(sp, nullptr));
  c.unrotate_and_round(d_out.get());
  sp.out = nullptr;
  sp.out_bf16 = d_out16.get();
  sp.out_bf16_ld = ld;
  sp.positions = c.pos.get();
  sp.inv_freq = c.freq.get();
  sp.rope_half = RopeAttnCase::kRopeHalf;
  ASSERT_TRUE(sink_attention_writes_bf16(sp));
  DSI_EXPECT_OK(launch_sink_attention(sp, nullptr));
  sync();
  const std::vector<float> want = d_out.download();
  const std::vector<uint16_t> got = d_out16.download();
  for (int64_t qi = 0; qi < nq; ++qi) {
    for (int64_t i = 0; i < width; ++i) {
      const uint16_t w = numeric::f32_to_bf16(want[qi * width + i]);
      ASSERT_EQ(got[qi * ld + i], w) << "query " << qi << " value " << i;
    }
    for (int64_t i = width; i < ld; ++i)
      ASSERT_EQ(got[qi * ld + i], 0x7fc1) << "query " << qi << " wrote into the row's padding";
  }
}

TEST_F(GpuTest, SinkAttentionBf16OutputEqualsRopeAndRounding) {
  SinkAttentionParams probe{.nq = 300,
                            .heads = 64,
                            .dim = 512,
                            .bf16_operands = true,
                            .out_bf16_ld = 64 * 512,
                            .positions = reinterpret_cast<const int64_t*>(16),
                            .inv_freq = reinterpret_cast<const float*>(16),
                            .rope_half = 32};
  if (!sink_attention_writes_bf16(probe))
    GTEST_SKIP() << "no wgmma attention in this build";
  std::vector<int64_t> many(300);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i * 13 % 700);
  run_sink_attention_bf16_out(64, many, 71, true);
  run_sink_attention_bf16_out(64, many, 72, false);
  run_sink_attention_bf16_out(17, {1, 31, 32, 33, 0, 64, 65, 128, 640, 700}, 73, true);
}

// finish_out (decode, key splits): the merge's fp32 output turned back by RoPE and rounded to BF16
// equals, bit for bit, the same attention without it followed by launch_rope (inverse) and a
// BF16 launch_quant_sim. Few queries (so that the keys are split), real heads and width, keys
// masked, positions up to 128k, both operand modes (the merge's two weightings).
void run_sink_attention_finish(int64_t heads,
                               const std::vector<int64_t>& key_counts,
                               uint32_t seed,
                               bool bf16_ops) {
  SCOPED_TRACE("sink attention finish_out heads " + std::to_string(heads) + " nq " +
               std::to_string(key_counts.size()) + (bf16_ops ? " bf16" : " fp32"));
  const RopeAttnCase c(heads, key_counts, seed);
  const int64_t nq = c.nq;
  const int64_t dim = RopeAttnCase::kDim;
  const int64_t width = heads * dim;
  const int64_t scratch_floats = sink_attention_scratch_floats(nq, heads, dim);
  ASSERT_GT(scratch_floats, 0) << "no key splits at " << nq << " queries";
  DevVec<float> d_scratch(static_cast<size_t>(scratch_floats), 0.0f);
  DevVec<float> d_want(static_cast<size_t>(nq * width), 0.0f);
  DevVec<float> d_got(static_cast<size_t>(nq * width + 1), 0.0f);
  SinkAttentionParams sp = c.params(d_want.get(), bf16_ops);
  sp.split_scratch = d_scratch.get();
  sp.split_scratch_floats = scratch_floats;
  DSI_EXPECT_OK(launch_sink_attention(sp, nullptr));
  c.unrotate_and_round(d_want.get());
  sp.out = d_got.get();
  sp.positions = c.pos.get();
  sp.inv_freq = c.freq.get();
  sp.rope_half = RopeAttnCase::kRopeHalf;
  sp.finish_out = true;
  ASSERT_TRUE(sink_attention_finishes_out(sp));
  DSI_EXPECT_OK(launch_sink_attention(sp, nullptr));
  sync();
  const std::vector<float> want = d_want.download();
  const std::vector<float> got = d_got.download();
  for (int64_t i = 0; i < nq * width; ++i) {
    uint32_t a, b;
    std::memcpy(&a, &want[i], 4);
    std::memcpy(&b, &got[i], 4);
    ASSERT_EQ(a, b) << "value " << i << ": " << got[i] << " vs " << want[i];
  }
  EXPECT_EQ(got.back(), 0.0f) << "write past the end";
}

TEST_F(GpuTest, SinkAttentionFinishedOutputEqualsRopeAndRounding) {
  for (bool bf16_ops : {true, false}) {
    run_sink_attention_finish(64, {700}, 81, bf16_ops);
    run_sink_attention_finish(64, {1, 640, 65, 0}, 82, bf16_ops);
    run_sink_attention_finish(
        17, {33, 128, 5, 300, 64, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 83, bf16_ops);
  }
  // Not taken without key splits (one block per query) or without the RoPE tables.
  SinkAttentionParams p{.nq = 1,
                        .heads = 64,
                        .dim = 512,
                        .out = reinterpret_cast<float*>(16),
                        .rope_half = 32,
                        .finish_out = true};
  EXPECT_FALSE(sink_attention_finishes_out(p));
  EXPECT_FALSE(launch_sink_attention(p, nullptr).ok());
}

// ---- compressor --------------------------------------------------------------------------------

// CPU pooling of one entry, transcribed from the CPU forward's compress_chunk: candidates'
// (score, value) per channel, softmax, weighted sum, RMSNorm, RoPE at w*m, simulation.
std::vector<float> cpu_pool_entry(const std::vector<const float*>& prev,
                                  const std::vector<const float*>& own,
                                  int64_t d,
                                  bool overlap,
                                  const std::vector<float>& norm_w,
                                  float eps,
                                  const std::vector<float>& inv_freq,
                                  int64_t block,
                                  int64_t m,
                                  CompressorPost post) {
  const int64_t width = (overlap ? 2 : 1) * d;
  std::vector<float> e(static_cast<size_t>(d));
  std::vector<float> logit, value;
  for (int64_t c = 0; c < d; ++c) {
    logit.clear();
    value.clear();
    for (const float* r : prev) {
      logit.push_back(r[width + c]);
      value.push_back(r[c]);
    }
    const int64_t off = overlap ? d : 0;
    for (const float* r : own) {
      logit.push_back(r[width + off + c]);
      value.push_back(r[off + c]);
    }
    cpu::softmax(logit.data(), static_cast<int64_t>(logit.size()));
    float acc = 0.0f;
    for (size_t i = 0; i < logit.size(); ++i) acc += logit[i] * value[i];
    e[c] = acc;
  }
  cpu::rms_norm(e.data(), 1, d, norm_w.data(), eps, e.data());
  cpu::rope_apply(e.data(), d, inv_freq, block * m, false);
  if (post == CompressorPost::kKvFp8) {
    const int64_t rope = 2 * static_cast<int64_t>(inv_freq.size());
    numeric::fp8_block_simulate(e.data(), d - rope, 64);
    numeric::bf16_simulate(e.data() + d - rope, rope);
  } else if (post == CompressorPost::kIndexFp4) {
    numeric::hadamard_transform(e.data(), d);
    numeric::fp4_block_simulate(e.data(), d, 32);
  }
  return e;
}

void run_compressor(int64_t m,
                    int64_t d,
                    bool overlap,
                    int64_t rope_half,
                    CompressorPost post,
                    int64_t n_blocks,
                    uint32_t seed) {
  SCOPED_TRACE("compressor m " + std::to_string(m) + " d " + std::to_string(d) +
               (overlap ? " overlap" : "") + " post " + std::to_string(static_cast<int>(post)) +
               " blocks " + std::to_string(n_blocks));
  std::mt19937 rng(seed);
  const int64_t width = (overlap ? 2 : 1) * d;
  const int64_t row = 2 * width;
  const int64_t tokens = n_blocks * m;
  // 1. Append: token rows go to scattered pool rows (a ring in pages).
  const std::vector<float> kv = normal_floats(static_cast<size_t>(tokens * width), seed + 1);
  const std::vector<float> score =
      normal_floats(static_cast<size_t>(tokens * width), seed + 2, 2.0f);
  const std::vector<float> ape = normal_floats(static_cast<size_t>(m * width), seed + 3);
  const int64_t first_pos = 0;
  std::vector<int64_t> positions(static_cast<size_t>(tokens));
  std::iota(positions.begin(), positions.end(), first_pos);
  std::vector<int64_t> slot(static_cast<size_t>(tokens));
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng);
  std::vector<int64_t> dest(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) dest[t] = kv_ref_pool(slot[t] * row);
  std::vector<float> want_rows(static_cast<size_t>(std::max<int64_t>(tokens, 1) * row), 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    float* r = want_rows.data() + slot[t] * row;
    for (int64_t i = 0; i < width; ++i) {
      r[i] = kv[t * width + i];
      r[width + i] = score[t * width + i] + ape[(positions[t] % m) * width + i];
    }
  }
  DevVec<float> d_pool(want_rows.size(), 0.0f);
  DevVec<float> d_kv(kv), d_score(score), d_ape(ape);
  DevVec<int64_t> d_pos(positions), d_dest(dest);
  DSI_EXPECT_OK(launch_compressor_append(CompressorAppendParams{.kv = d_kv.get(),
                                                                .score = d_score.get(),
                                                                .ape = d_ape.get(),
                                                                .positions = d_pos.get(),
                                                                .n = tokens,
                                                                .width = width,
                                                                .ratio = m,
                                                                .pool = d_pool.get(),
                                                                .dest_refs = d_dest.get()},
                                         nullptr));
  sync();
  expect_rel(want_rows, d_pool.download(), 0.0, 0.0, "compressor rows");

  // 2. Pool every block.
  std::vector<int64_t> token_refs;
  std::vector<int64_t> blocks;
  std::vector<float> norm_w = normal_floats(static_cast<size_t>(d), seed + 4, 0.5f);
  for (auto& v : norm_w) v += 1.0f;
  std::vector<float> inv(static_cast<size_t>(rope_half));
  for (int64_t i = 0; i < rope_half; ++i)
    inv[i] = std::pow(160000.0f, -2.0f * i / (2.0f * rope_half));
  std::vector<float> want;
  for (int64_t w = 0; w < n_blocks; ++w) {
    std::vector<const float*> prev, own;
    if (overlap) {
      for (int64_t i = 0; i < m; ++i) {
        const int64_t t = (w - 1) * m + i;
        token_refs.push_back(w > 0 ? dest[t] : kKvRefNone);
        if (w > 0)
          prev.push_back(want_rows.data() + slot[t] * row);
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = w * m + i;
      token_refs.push_back(dest[t]);
      own.push_back(want_rows.data() + slot[t] * row);
    }
    blocks.push_back(w);
    const std::vector<float> e =
        cpu_pool_entry(prev, own, d, overlap, norm_w, 1e-6f, inv, w, m, post);
    want.insert(want.end(), e.begin(), e.end());
  }
  // Entries land at scattered page offsets of an output pool.
  std::vector<int64_t> out_off(static_cast<size_t>(n_blocks));
  for (int64_t w = 0; w < n_blocks; ++w) out_off[w] = (n_blocks - 1 - w) * (d + 1);
  DevVec<int64_t> d_refs(token_refs), d_blocks(blocks), d_off(out_off);
  DevVec<float> d_norm(norm_w), d_inv(inv.empty() ? std::vector<float>{0.0f} : inv);
  DevVec<float> d_out(static_cast<size_t>(n_blocks * (d + 1)), 5.0f);
  DSI_EXPECT_OK(launch_compressor_pool(CompressorPoolParams{.n_entries = n_blocks,
                                                            .ratio = m,
                                                            .d = d,
                                                            .overlap = overlap,
                                                            .pool = d_pool.get(),
                                                            .token_refs = d_refs.get(),
                                                            .block = d_blocks.get(),
                                                            .norm_weight = d_norm.get(),
                                                            .eps = 1e-6f,
                                                            .inv_freq = d_inv.get(),
                                                            .rope_half = rope_half,
                                                            .post = post,
                                                            .out = d_out.get(),
                                                            .out_offsets = d_off.get()},
                                       nullptr));
  sync();
  const std::vector<float> all = d_out.download();
  int64_t flips = 0;
  int64_t bad = 0;
  for (int64_t w = 0; w < n_blocks; ++w) {
    const float* g = all.data() + out_off[w];
    const float* e = want.data() + w * d;
    EXPECT_EQ(g[d], 5.0f) << "entry " << w << " wrote past its end";
    double ss = 0.0, amax = 0.0;
    for (int64_t c = 0; c < d; ++c) {
      ss += static_cast<double>(e[c]) * e[c];
      amax = std::max<double>(amax, std::fabs(e[c]));
    }
    const double rms = std::sqrt(ss / static_cast<double>(d));
    for (int64_t c = 0; c < d; ++c) {
      const double err = std::fabs(static_cast<double>(g[c]) - e[c]);
      if (err <= 1e-5 * rms + 1e-30)
        continue;
      const double step = post == CompressorPost::kIndexFp4 ? 0.7 * amax : 0.125 * amax;
      if (post != CompressorPost::kNone && err <= step * 1.0001) {
        ++flips;
        continue;
      }
      if (bad++ < 5)
        ADD_FAILURE() << "entry " << w << " channel " << c << ": cpu " << e[c] << " gpu " << g[c];
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_LE(flips, std::max<int64_t>(2, n_blocks * d / 50)) << "too many rounding flips";
  // Written as records instead (the CUDA state's row format in deepseek numerics): they decode to
  // the fp32 entries above, bit for bit.
  const bool kv_rec = post == CompressorPost::kKvFp8;
  if (post == CompressorPost::kNone ||
      !(kv_rec ? numeric::kv_record_fits(d, 2 * rope_half) : numeric::index_key_record_fits(d)))
    return;
  const int64_t rec =
      kv_rec ? numeric::kv_record_floats(d, 2 * rope_half) : numeric::index_key_record_floats(d);
  std::vector<int64_t> rec_off(static_cast<size_t>(n_blocks)), byte_off(rec_off.size());
  for (int64_t w = 0; w < n_blocks; ++w) {
    rec_off[w] = (n_blocks - 1 - w) * rec;
    byte_off[w] = rec_off[w] * 4;
  }
  DevVec<int64_t> d_rec_off(rec_off), d_byte_off(byte_off);
  DevVec<float> d_recs(static_cast<size_t>(n_blocks * rec), 5.0f), d_dec(want.size(), 0.0f);
  DSI_EXPECT_OK(launch_compressor_pool(CompressorPoolParams{.n_entries = n_blocks,
                                                            .ratio = m,
                                                            .d = d,
                                                            .overlap = overlap,
                                                            .pool = d_pool.get(),
                                                            .token_refs = d_refs.get(),
                                                            .block = d_blocks.get(),
                                                            .norm_weight = d_norm.get(),
                                                            .eps = 1e-6f,
                                                            .inv_freq = d_inv.get(),
                                                            .rope_half = rope_half,
                                                            .post = post,
                                                            .out = d_recs.get(),
                                                            .out_offsets = d_rec_off.get(),
                                                            .records = true},
                                       nullptr));
  auto* bytes = reinterpret_cast<const uint8_t*>(d_recs.get());
  if (kv_rec) {
    DSI_EXPECT_OK(launch_kv_record_unpack(KvRecordUnpackParams{.records = bytes,
                                                               .offsets = d_byte_off.get(),
                                                               .rows = n_blocks,
                                                               .dim = d,
                                                               .rope_dim = 2 * rope_half,
                                                               .out = d_dec.get()},
                                          nullptr));
  } else {
    DSI_EXPECT_OK(launch_index_key_unpack(IndexKeyUnpackParams{.records = bytes,
                                                               .offsets = d_byte_off.get(),
                                                               .rows = n_blocks,
                                                               .dim = d,
                                                               .out = d_dec.get()},
                                          nullptr));
  }
  sync();
  const std::vector<float> dec = d_dec.download();
  int64_t differ = 0;
  for (int64_t w = 0; w < n_blocks; ++w)
    differ += std::memcmp(all.data() + out_off[w], dec.data() + w * d, d * sizeof(float)) != 0;
  EXPECT_EQ(differ, 0) << "entries whose records decode to other values than the fp32 entries";
}

TEST_F(GpuTest, CompressorMatchesCpu) {
  uint32_t seed = 100;
  for (int64_t blocks : {1, 3, 7}) {
    run_compressor(4, 512, true, 32, CompressorPost::kKvFp8, blocks, seed += 10);     // CSA main
    run_compressor(4, 128, true, 32, CompressorPost::kIndexFp4, blocks, seed += 10);  // indexer
    run_compressor(128, 512, false, 32, CompressorPost::kKvFp8, blocks, seed += 10);  // HCA
    run_compressor(4, 512, true, 32, CompressorPost::kNone, blocks, seed += 10);
    run_compressor(8, 7, false, 2, CompressorPost::kNone, blocks, seed += 10);
    run_compressor(3, 129, true, 0, CompressorPost::kNone, blocks, seed += 10);
  }
  run_compressor(4, 512, true, 32, CompressorPost::kKvFp8, 33, seed += 10);
}

// ---- indexer scores + top-k -------------------------------------------------------------------

struct PagedKeys {
  std::vector<float> pool;
  std::vector<int32_t> pages;  // concatenated page tables
  std::vector<int64_t> page_begin;
  int64_t page_floats = 0;
  int64_t rows_per_page = 0;
};

// Paths of launch_indexer_scores: the one-thread-per-key kernel, the tensor-core kernel on
// BF16 high + low halves, and the tensor-core kernel told its inputs are BF16 values.
enum class IdxPath { kSimple, kMmaSplit, kMmaExact };

// grid_values: q and keys on a 0.5 grid (FP4-simulated-like: every product and partial sum is
// exact, so every path is bit-exact and the top-k is checked exactly, ties included); otherwise
// normal fp32 values, scores within the split's error bound and no top-k check.
void run_indexer(int64_t heads,
                 int64_t dim,
                 const std::vector<int64_t>& visible,
                 uint32_t seed,
                 IdxPath path = IdxPath::kMmaExact,
                 bool grid_values = true) {
  SCOPED_TRACE("indexer heads " + std::to_string(heads) + " dim " + std::to_string(dim) + " path " +
               std::to_string(static_cast<int>(path)) + (grid_values ? " grid" : " fp32"));
  std::mt19937 rng(seed);
  const int64_t nq = static_cast<int64_t>(visible.size());
  PagedKeys pk;
  pk.page_floats = 16384;  // 64 KiB pages, as the engine's default
  pk.rows_per_page = pk.page_floats / dim;
  // Each query gets its own sequence; pages of all sequences interleave in the pool.
  int64_t total_pages = 0;
  std::vector<int64_t> npages(static_cast<size_t>(nq));
  for (int64_t qi = 0; qi < nq; ++qi) {
    npages[qi] = (visible[qi] + pk.rows_per_page - 1) / pk.rows_per_page;
    total_pages += npages[qi];
  }
  std::vector<int32_t> perm(static_cast<size_t>(total_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  pk.pool.resize(static_cast<size_t>(std::max<int64_t>(total_pages, 1) * pk.page_floats));
  // FP4-simulated keys take few distinct values: scores tie often, exercising the tie rule.
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : pk.pool) v = grid_values ? std::round(nd(rng) * 2.0f) / 2.0f : nd(rng);
  int64_t next = 0;
  for (int64_t qi = 0; qi < nq; ++qi) {
    pk.page_begin.push_back(static_cast<int64_t>(pk.pages.size()));
    for (int64_t i = 0; i < npages[qi]; ++i) pk.pages.push_back(perm[next++]);
  }
  if (pk.pages.empty())
    pk.pages.push_back(0);
  std::vector<float> q(static_cast<size_t>(nq * heads * dim));
  for (auto& v : q) v = grid_values ? std::round(nd(rng) * 2.0f) / 2.0f : nd(rng);
  const std::vector<float> hw = normal_floats(static_cast<size_t>(nq * heads), seed + 1);
  const float w_scale =
      1.0f / std::sqrt(static_cast<float>(dim)) / std::sqrt(static_cast<float>(heads));
  const int64_t max_visible = *std::max_element(visible.begin(), visible.end());
  const int64_t ld = max_visible + 3;
  // CPU: the forward's loops.
  std::vector<float> want(static_cast<size_t>(nq * ld), -7.0f);
  std::vector<double> tol(want.size(), 0.0);
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int32_t* pages = pk.pages.data() + pk.page_begin[qi];
    for (int64_t w = 0; w < visible[qi]; ++w) {
      const float* key = pk.pool.data() +
                         static_cast<int64_t>(pages[w / pk.rows_per_page]) * pk.page_floats +
                         (w % pk.rows_per_page) * dim;
      float s = 0.0f;
      double bound = 0.0;  // sum_h |w_h| sum_i |q_i k_i|
      for (int64_t h = 0; h < heads; ++h) {
        const float* v = q.data() + (qi * heads + h) * dim;
        float dotv = 0.0f;
        double mag = 0.0;
        for (int64_t i = 0; i < dim; ++i) {
          dotv += v[i] * key[i];
          mag += std::fabs(static_cast<double>(v[i]) * key[i]);
        }
        s += hw[qi * heads + h] * w_scale * std::max(0.0f, dotv);
        bound += std::fabs(hw[qi * heads + h] * w_scale) * mag;
      }
      want[qi * ld + w] = s;
      // Off the grid: the dots' summation order and the split (2^-17 per product), then the
      // serial head sum's own rounding (heads ulps of the largest partial).
      tol[qi * ld + w] = grid_values ? 0.0 : 3e-5 * bound + 1e-30;
    }
  }
  DevVec<float> d_pool(pk.pool), d_q(q), d_hw(hw), d_scores(want.size(), -7.0f);
  DevVec<int32_t> d_pages(pk.pages);
  DevVec<int64_t> d_pbeg(pk.page_begin), d_vis(visible);
  DSI_EXPECT_OK(launch_indexer_scores(IndexerScoreParams{.q = d_q.get(),
                                                         .head_w = d_hw.get(),
                                                         .w_scale = w_scale,
                                                         .nq = nq,
                                                         .heads = heads,
                                                         .dim = dim,
                                                         .pool = d_pool.get(),
                                                         .page_floats = pk.page_floats,
                                                         .rows_per_page = pk.rows_per_page,
                                                         .pages = d_pages.get(),
                                                         .page_begin = d_pbeg.get(),
                                                         .visible = d_vis.get(),
                                                         .max_visible = max_visible,
                                                         .scores = d_scores.get(),
                                                         .ld = ld,
                                                         .tensor_cores = path != IdxPath::kSimple,
                                                         .bf16_exact = path == IdxPath::kMmaExact},
                                      nullptr));
  sync();
  expect_within(want, d_scores.download(), tol, "indexer scores");  // bit-exact on the grid
  if (!grid_values)
    return;

  // Top-k of those scores (index_topk 512), exactly cpu::top_k_indices.
  const int64_t k = 512;
  DevVec<int32_t> d_top(static_cast<size_t>(nq * k), 99);
  DSI_EXPECT_OK(launch_top_k(TopKParams{.scores = d_scores.get(),
                                        .ld = ld,
                                        .n = d_vis.get(),
                                        .nq = nq,
                                        .k = k,
                                        .out = d_top.get()},
                             nullptr));
  sync();
  const std::vector<int32_t> got = d_top.download();
  for (int64_t qi = 0; qi < nq; ++qi) {
    std::vector<int32_t> ref =
        cpu::top_k_indices(want.data() + qi * ld, visible[qi], std::min(k, visible[qi]));
    ref.resize(static_cast<size_t>(k), -1);
    const std::vector<int32_t> g(got.begin() + qi * k, got.begin() + (qi + 1) * k);
    EXPECT_EQ(g, ref) << "top-k of query " << qi << " (visible " << visible[qi] << ")";
  }
}

// Prefill's grouped indexer kernel (several queries of one sequence per block sharing each key
// tile) gives the one-query kernel's scores bit for bit: three sequences of 70, 1 and 29 queries
// (groups straddling their boundaries take the queries one at a time), visible counts growing
// with the position across tile edges, fp32 keys off any grid.
TEST_F(GpuTest, IndexerScoresGroupedQueriesEqualOneQueryPerBlock) {
  const int64_t heads = 64, dim = 128, rows_per_page = 128, page_floats = rows_per_page * dim;
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<int32_t> pages;
  std::vector<int64_t> page_begin, visible;
  int32_t next_page = 0;
  for (int64_t len : {70, 1, 29}) {
    const int64_t first = static_cast<int64_t>(pages.size());
    const int64_t last_visible = (len * 13 + 5) / 4;
    for (int64_t i = 0; i < (last_visible + rows_per_page - 1) / rows_per_page + 1; ++i)
      pages.push_back(next_page++);
    for (int64_t t = 0; t < len; ++t) {
      page_begin.push_back(first);
      visible.push_back((t * 13 + 5) / 4);
    }
  }
  const int64_t nq = static_cast<int64_t>(visible.size());
  std::vector<float> pool(static_cast<size_t>(next_page * page_floats));
  for (auto& v : pool) v = nd(rng);
  std::vector<float> q(static_cast<size_t>(nq * heads * dim));
  for (auto& v : q) v = nd(rng);
  const std::vector<float> hw = normal_floats(static_cast<size_t>(nq * heads), 5);
  const int64_t max_visible = *std::max_element(visible.begin(), visible.end());
  const int64_t ld = max_visible + 1;
  DevVec<float> d_pool(pool), d_q(q), d_hw(hw);
  DevVec<int32_t> d_pages(pages);
  DevVec<int64_t> d_pbeg(page_begin), d_vis(visible);
  auto run = [&](bool grouped, std::vector<float>* out) {
    DevVec<float> d_scores(static_cast<size_t>(nq * ld), -7.0f);
    DSI_EXPECT_OK(launch_indexer_scores(IndexerScoreParams{.q = d_q.get(),
                                                           .head_w = d_hw.get(),
                                                           .w_scale = 0.01f,
                                                           .nq = nq,
                                                           .heads = heads,
                                                           .dim = dim,
                                                           .pool = d_pool.get(),
                                                           .page_floats = page_floats,
                                                           .rows_per_page = rows_per_page,
                                                           .pages = d_pages.get(),
                                                           .page_begin = d_pbeg.get(),
                                                           .visible = d_vis.get(),
                                                           .max_visible = max_visible,
                                                           .scores = d_scores.get(),
                                                           .ld = ld,
                                                           .bf16_exact = true,
                                                           .group_queries = grouped},
                                        nullptr));
    sync();
    *out = d_scores.download();
  };
  ASSERT_GE(nq, kIndexerGroupMinQueries);
  std::vector<float> one, grouped;
  run(false, &one);
  run(true, &grouped);
  ASSERT_EQ(one.size(), grouped.size());
  EXPECT_EQ(0, std::memcmp(one.data(), grouped.data(), one.size() * sizeof(float)));
  int64_t written = 0;
  for (float v : grouped) written += v != -7.0f ? 1 : 0;
  EXPECT_GT(written, nq * 10);
}

TEST_F(GpuTest, IndexerScoresAndTopKMatchCpu) {
  for (IdxPath path : {IdxPath::kSimple, IdxPath::kMmaSplit, IdxPath::kMmaExact}) {
    run_indexer(64, 128, {0, 1, 3, 7, 129, 733}, 1, path);  // the real shape, short contexts
    run_indexer(3, 7, {5, 0, 2000}, 2, path);               // awkward head count and width
    run_indexer(20, 64, {63, 64, 65, 1000}, 4, path);       // tile edges, 2 head warps
    if (!small_mode()) {
      run_indexer(8, 128, {262144, 4}, 3, path);  // longest context: 1M tokens / ratio 4
      std::vector<int64_t> many(100);             // prefill-sized: 4 tiles per block
      for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i * 37 % 2048);
      run_indexer(64, 128, many, 5, path);
    }
  }
  // fp32 values (`reference` numerics): the split path within its bound.
  run_indexer(64, 128, {1, 129, 2048}, 6, IdxPath::kMmaSplit, false);
  run_indexer(64, 128, {1, 129, 2048}, 7, IdxPath::kSimple, false);
}

// copies > 1: the three queries repeated, enough of them (>= 4 per SM) for the launcher's
// many-queries block size.
void run_top_k(int64_t n, int64_t k, int kind, uint32_t seed, int64_t copies = 1) {
  SCOPED_TRACE("top_k n " + std::to_string(n) + " k " + std::to_string(k) + " kind " +
               std::to_string(kind) + " copies " + std::to_string(copies));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> s(static_cast<size_t>(std::max<int64_t>(n, 1)));
  for (auto& v : s) {
    switch (kind) {
      case 0:
        v = nd(rng);
        break;
      case 1:
        v = static_cast<float>(rng() % 5);  // heavy ties
        break;
      case 2:
        v = (rng() % 2) ? 0.0f : -0.0f;  // all equal (signed zeros compare equal)
        break;
      default:
        v = (rng() % 3 == 0) ? -INFINITY : -std::ldexp(1.0f, -static_cast<int>(rng() % 100));
    }
  }
  std::vector<int64_t> ns;
  for (int64_t c = 0; c < copies; ++c) ns.insert(ns.end(), {n, std::min<int64_t>(n, 3), 0});
  const int64_t nq = static_cast<int64_t>(ns.size());
  std::vector<float> scores;
  for (int64_t qi = 0; qi < nq; ++qi) scores.insert(scores.end(), s.begin(), s.end());
  const int64_t ld = static_cast<int64_t>(s.size());
  DevVec<float> d_s(scores);
  DevVec<int64_t> d_n(ns);
  DevVec<int32_t> d_out(static_cast<size_t>(nq * k) + 1, 99);
  DSI_EXPECT_OK(launch_top_k(
      TopKParams{
          .scores = d_s.get(), .ld = ld, .n = d_n.get(), .nq = nq, .k = k, .out = d_out.get()},
      nullptr));
  sync();
  const std::vector<int32_t> got = d_out.download();
  for (int64_t qi = 0; qi < nq; ++qi) {
    std::vector<int32_t> ref = cpu::top_k_indices(s.data(), ns[qi], std::min(k, ns[qi]));
    ref.resize(static_cast<size_t>(k), -1);  // all-invalid slots
    const std::vector<int32_t> g(got.begin() + qi * k, got.begin() + (qi + 1) * k);
    EXPECT_EQ(g, ref) << "query " << qi << " n " << ns[qi];
  }
  EXPECT_EQ(got.back(), 99) << "write past the end";
}

TEST_F(GpuTest, TopKMatchesCpu) {
  uint32_t seed = 1;
  for (int64_t n : {1, 3, 7, 129, 733, 5000}) {
    for (int64_t k : {1, 7, 512, 2048}) {
      for (int kind = 0; kind < 4; ++kind) run_top_k(n, k, kind, seed++);
    }
  }
  // Many queries (a prefill's indexer): the launcher's smaller blocks.
  const int64_t copies = 4 * sm_count() / 3 + 1;
  for (int64_t k : {512, 2048}) {
    for (int kind = 0; kind < 4; ++kind) run_top_k(5000, k, kind, seed++, copies);
  }
  if (!small_mode()) {
    for (int kind = 0; kind < 4; ++kind) run_top_k(262144, 512, kind, seed++);
  }
}

TEST(GpuOpsArgs, AttentionValidates) {
  EXPECT_EQ(
      launch_sink_attention(SinkAttentionParams{.nq = 1, .heads = 1, .dim = 513}, nullptr).code(),
      StatusCode::kInvalidArgument);
  // BF16 q outside the wgmma path's shape (dim 128) is refused, not read as something else.
  const float* some = reinterpret_cast<const float*>(uintptr_t{256});
  const int64_t* idx = reinterpret_cast<const int64_t*>(uintptr_t{256});
  EXPECT_EQ(launch_sink_attention(
                SinkAttentionParams{.nq = 1,
                                    .heads = 4,
                                    .dim = 128,
                                    .key_begin = idx,
                                    .sinks = some,
                                    .out = const_cast<float*>(some),
                                    .bf16_operands = true,
                                    .q_bf16 = reinterpret_cast<const uint16_t*>(uintptr_t{256})},
                nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  // BF16 output where the wgmma kernel does not run (dim 128), with a row shorter than the
  // heads' values, or with RoPE dims but no tables: refused.
  auto* out16 = reinterpret_cast<uint16_t*>(uintptr_t{256});
  SinkAttentionParams bf{.q = some,
                         .nq = 300,
                         .heads = 64,
                         .dim = 512,
                         .key_begin = idx,
                         .sinks = some,
                         .bf16_operands = true,
                         .out_bf16 = out16,
                         .out_bf16_ld = 64 * 512,
                         .positions = idx,
                         .inv_freq = some,
                         .rope_half = 32};
  for (int bad = 0; bad < 3; ++bad) {
    SinkAttentionParams p = bf;
    if (bad == 0)
      p.dim = 128;
    if (bad == 1)
      p.out_bf16_ld = 64 * 512 - 2;
    if (bad == 2)
      p.inv_freq = nullptr;
    EXPECT_EQ(launch_sink_attention(p, nullptr).code(), StatusCode::kInvalidArgument) << bad;
  }
  // finish_out: only with key splits (scratch given, few queries), fp32 out and the RoPE tables.
  SinkAttentionParams fin = bf;
  fin.nq = 1;
  fin.out_bf16 = nullptr;
  fin.out = const_cast<float*>(some);
  fin.split_scratch = const_cast<float*>(some);
  fin.split_scratch_floats = sink_attention_scratch_floats(1, 64, 512);
  fin.finish_out = true;
  EXPECT_TRUE(sink_attention_finishes_out(fin));
  for (int bad = 0; bad < 3; ++bad) {
    SinkAttentionParams p = fin;
    if (bad == 0)
      p.split_scratch = nullptr;  // one block per query: no merge to finish in
    if (bad == 1)
      p.inv_freq = nullptr;
    if (bad == 2)
      p.nq = 4096;  // prefill-sized: no key splits
    EXPECT_FALSE(sink_attention_finishes_out(p)) << bad;
    EXPECT_EQ(launch_sink_attention(p, nullptr).code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(launch_top_k(TopKParams{.nq = 1, .k = 4096}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(launch_top_k(TopKParams{.nq = 0, .k = 8}, nullptr).ok());
  EXPECT_EQ(launch_compressor_pool(
                CompressorPoolParams{
                    .n_entries = 1, .ratio = 4, .d = 96, .post = CompressorPost::kIndexFp4},
                nullptr)
                .code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsinfer::cuda::test
