// Opt-in timings of the correct-first kernels at DeepSeek-V4-Flash shapes (not a benchmark
// harness: figures for docs/gpu.md and a baseline for the performance issue). Runs only with
// DSINFER_GPU_TEST_TIMINGS=1; each op is timed with CUDA events over a few launches after a
// warm-up.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "device/stream.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/sampling.h"
#include "test_util.h"

namespace dsinfer::cuda::test {
namespace {

double time_ms(const std::function<void()>& launch, int reps = 5) {
  launch();  // warm-up
  auto e0 = device::Event::create(true);
  auto e1 = device::Event::create(true);
  EXPECT_TRUE(e0.ok() && e1.ok());
  EXPECT_TRUE(e0->record(nullptr).ok());
  for (int i = 0; i < reps; ++i) launch();
  EXPECT_TRUE(e1->record(nullptr).ok());
  EXPECT_TRUE(e1->synchronize().ok());
  auto ms = device::Event::elapsed_ms(*e0, *e1);
  EXPECT_TRUE(ms.ok());
  return ms.ok() ? *ms / reps : -1.0;
}

TEST_F(GpuTest, OpTimings) {
  const char* on = std::getenv("DSINFER_GPU_TEST_TIMINGS");
  if (on == nullptr || on[0] != '1')
    GTEST_SKIP() << "set DSINFER_GPU_TEST_TIMINGS=1";
  // Dense FP8 linear 4096 -> 4096 (e.g. e_proj), decode and prefill batches, q8 activations.
  auto w = make_weight(Fmt::kFp8E8M0, 4096, 4096, 1);
  for (int64_t n : {1, 64, 1024}) {
    DevVec<float> x(normal_floats(static_cast<size_t>(n * 4096), 2));
    DevVec<float> y(static_cast<size_t>(n * 4096));
    const double ms = time_ms([&] {
      (void)launch_linear(
          LinearParams{
              .w = w->dev, .x = x.get(), .n = n, .y = y.get(), .quantize_activations = true},
          nullptr);
    });
    std::printf("timing linear fp8 4096x4096 n=%lld: %.3f ms (%.1f GB/s weights, %.2f TFLOP/s)\n",
                static_cast<long long>(n),
                ms,
                4096.0 * 4096 / ms / 1e6,
                2.0 * 4096 * 4096 * n / ms / 1e9);
  }
  // Sink attention, decode: 64 heads x 512, 640 keys (CSA: 128 window + 512 selected), 8 queries.
  {
    const int64_t nq = 8, heads = 64, dim = 512, nk = 640;
    DevVec<float> pool(normal_floats(static_cast<size_t>(nk * dim), 3));
    DevVec<float> q(normal_floats(static_cast<size_t>(nq * heads * dim), 4));
    std::vector<int64_t> begin, refs;
    for (int64_t i = 0; i <= nq; ++i) begin.push_back(i * nk);
    for (int64_t i = 0; i < nq * nk; ++i) refs.push_back((i % nk) * dim);
    DevVec<int64_t> d_begin(begin), d_refs(refs);
    DevVec<float> sinks(static_cast<size_t>(heads)), out(static_cast<size_t>(nq * heads * dim));
    const double ms = time_ms([&] {
      (void)launch_sink_attention(SinkAttentionParams{.q = q.get(),
                                                      .nq = nq,
                                                      .heads = heads,
                                                      .dim = dim,
                                                      .pool = pool.get(),
                                                      .key_begin = d_begin.get(),
                                                      .key_refs = d_refs.get(),
                                                      .sinks = sinks.get(),
                                                      .scale = 0.044f,
                                                      .out = out.get()},
                                  nullptr);
    });
    std::printf("timing sink attention 8 queries x 64 heads x 640 keys x 512: %.3f ms\n", ms);
  }
  // Sink attention, prefill-sized: 2048 queries x 64 heads x 512, 640 keys each gathered from
  // 8192 rows; the fp32-split kernel (reference numerics) and the BF16-operand one (deepseek).
  {
    const int64_t nq = 2048, heads = 64, dim = 512, nk = 640, rows = 8192;
    DevVec<float> pool(normal_floats(static_cast<size_t>(rows * dim), 8));
    DevVec<float> q(normal_floats(static_cast<size_t>(nq * heads * dim), 9));
    std::vector<int64_t> begin, refs;
    for (int64_t i = 0; i <= nq; ++i) begin.push_back(i * nk);
    for (int64_t i = 0; i < nq * nk; ++i) refs.push_back((i * 2654435761ll % rows) * dim);
    DevVec<int64_t> d_begin(begin), d_refs(refs);
    DevVec<float> sinks(static_cast<size_t>(heads)), out(static_cast<size_t>(nq * heads * dim));
    for (bool bf16 : {false, true}) {
      const double ms = time_ms([&] {
        (void)launch_sink_attention(SinkAttentionParams{.q = q.get(),
                                                        .nq = nq,
                                                        .heads = heads,
                                                        .dim = dim,
                                                        .pool = pool.get(),
                                                        .key_begin = d_begin.get(),
                                                        .key_refs = d_refs.get(),
                                                        .sinks = sinks.get(),
                                                        .scale = 0.044f,
                                                        .out = out.get(),
                                                        .exact_dims = bf16 ? 0 : 448,
                                                        .bf16_operands = bf16},
                                    nullptr);
      });
      // One block per query and SM: 132 blocks run 20 tiles of 32 keys at a time.
      std::printf(
          "timing sink attention prefill %s 2048 queries x 64 heads x 640 keys x 512: %.3f ms "
          "(%.2f us per 32-key tile)\n",
          bf16 ? "bf16 operands" : "fp32 split (exact_dims 448)",
          ms,
          ms * 1e3 * 132.0 / static_cast<double>(nq * nk / 32));
    }
  }
  // Indexer scores + top-512 at 1M context (262144 blocks), 64 heads x 128, one query.
  {
    const int64_t heads = 64, dim = 128, nb = 262144, page_floats = 16384;
    const int64_t rpp = page_floats / dim;
    DevVec<float> pool(normal_floats(static_cast<size_t>(nb * dim), 5));
    std::vector<int32_t> pages(static_cast<size_t>(nb / rpp));
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
    DevVec<int32_t> d_pages(pages);
    DevVec<int64_t> pbeg(std::vector<int64_t>{0}), vis(std::vector<int64_t>{nb});
    DevVec<float> q(normal_floats(static_cast<size_t>(heads * dim), 6));
    DevVec<float> hw(normal_floats(static_cast<size_t>(heads), 7));
    DevVec<float> scores(static_cast<size_t>(nb));
    DevVec<int32_t> top(512);
    const double ms_s = time_ms(
        [&] {
          (void)launch_indexer_scores(IndexerScoreParams{.q = q.get(),
                                                         .head_w = hw.get(),
                                                         .w_scale = 0.01f,
                                                         .nq = 1,
                                                         .heads = heads,
                                                         .dim = dim,
                                                         .pool = pool.get(),
                                                         .page_floats = page_floats,
                                                         .rows_per_page = rpp,
                                                         .pages = d_pages.get(),
                                                         .page_begin = pbeg.get(),
                                                         .visible = vis.get(),
                                                         .max_visible = nb,
                                                         .scores = scores.get(),
                                                         .ld = nb},
                                      nullptr);
        },
        3);
    const double ms_k = time_ms([&] {
      (void)launch_top_k(TopKParams{.scores = scores.get(),
                                    .ld = nb,
                                    .n = vis.get(),
                                    .nq = 1,
                                    .k = 512,
                                    .out = top.get()},
                         nullptr);
    });
    std::printf("timing indexer scores 262144 blocks x 64 heads x 128: %.3f ms; top-512: %.3f ms\n",
                ms_s,
                ms_k);
  }
  // Sampling: 64 requests over the full vocabulary, top-p.
  {
    const int64_t n = 64, vocab = 129280;
    DevVec<float> logits(normal_floats(static_cast<size_t>(n * vocab), 8, 3.0f));
    std::vector<SamplingRequest> reqs(static_cast<size_t>(n));
    for (auto& r : reqs) r.top_p = 0.9f;
    std::vector<uint8_t> bytes(reqs.size() * sizeof(SamplingRequest));
    std::memcpy(bytes.data(), reqs.data(), bytes.size());
    DevVec<uint8_t> d_reqs(bytes);
    const size_t ws = sample_workspace_bytes(n, vocab, /*full_sort=*/true);  // enough for both
    DevVec<double> d_ws(ws / 8 + 1);
    DevVec<int32_t> toks(static_cast<size_t>(n));
    for (const bool full_sort : {false, true}) {
      const double ms = time_ms(
          [&] {
            (void)launch_sample(
                SampleParams{.logits = logits.get(),
                             .n = n,
                             .vocab = vocab,
                             .requests = reinterpret_cast<const SamplingRequest*>(d_reqs.get()),
                             .workspace = d_ws.get(),
                             .workspace_bytes = ws,
                             .full_sort = full_sort,
                             .out_tokens = toks.get()},
                nullptr);
          },
          3);
      std::printf("timing sampling 64 requests x 129280 vocab (%s, top-p): %.3f ms\n",
                  full_sort ? "full sort" : "select",
                  ms);
    }
  }
  sync();
}

}  // namespace
}  // namespace dsinfer::cuda::test
