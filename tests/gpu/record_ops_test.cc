// The attention-side ops reading and writing the state records (numeric/records.h) against the
// same ops over the fp32 rows those records decode to, bit for bit: sink attention with BF16
// operands on every path (one warp per key, mma.sync with and without key splits, wgmma at
// V4-Flash's 64 x 512 with fp32 and BF16 q), records 8- and only 4-byte aligned, in the pool and
// the chunk-local buffer; the indexer scores over index-key records (one thread per key, one
// query per block, grouped queries); and the compressor writing KV and index-key records.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_record.h"
#include "numeric/float_formats.h"
#include "numeric/records.h"
#include "test_util.h"

namespace dsinfer::cuda::test {
namespace {

// `rows` K=V rows of dim floats packed as KV records into a float buffer at `stride` floats per
// record (>= kv_record_floats), and the fp32 rows they decode to (dim floats each).
struct RecordRows {
  DevVec<float> records;
  DevVec<float> rows;
};
RecordRows make_kv_records(int64_t rows, int64_t dim, int64_t rope, int64_t stride, uint32_t seed) {
  const std::vector<float> x = normal_floats(static_cast<size_t>(rows * dim), seed, 2.0f);
  std::vector<int64_t> off(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) off[r] = r * stride * 4;
  DevVec<float> d_x(x);
  DevVec<int64_t> d_off(off);
  RecordRows out{DevVec<float>(static_cast<size_t>(rows * stride), 0.0f),
                 DevVec<float>(static_cast<size_t>(rows * dim), 0.0f)};
  auto* bytes = reinterpret_cast<uint8_t*>(out.records.get());
  DSI_EXPECT_OK_CONTINUE(launch_kv_record_pack(KvRecordPackParams{.x = d_x.get(),
                                                                  .rows = rows,
                                                                  .dim = dim,
                                                                  .rope_dim = rope,
                                                                  .out = bytes,
                                                                  .out_offsets = d_off.get()},
                                               nullptr));
  DSI_EXPECT_OK_CONTINUE(launch_kv_record_unpack(KvRecordUnpackParams{.records = bytes,
                                                                      .offsets = d_off.get(),
                                                                      .rows = rows,
                                                                      .dim = dim,
                                                                      .rope_dim = rope,
                                                                      .out = out.rows.get()},
                                                 nullptr));
  sync();
  return out;
}

enum class AttnPath { kSimple, kTensor, kTensorSplit };

void run_attention_records(int64_t heads,
                           int64_t dim,
                           int64_t rope,
                           int64_t nq,
                           int64_t keys_per_query,
                           AttnPath path,
                           bool q16,
                           bool aligned8,
                           uint32_t seed) {
  SCOPED_TRACE("attention over records heads " + std::to_string(heads) + " dim " +
               std::to_string(dim) + " nq " + std::to_string(nq) + " path " +
               std::to_string(static_cast<int>(path)) + (q16 ? " q16" : "") +
               (aligned8 ? "" : " 4-byte aligned"));
  const int64_t rec = numeric::kv_record_floats(dim, rope);
  const int64_t stride = aligned8 ? rec : rec + 1;
  const int64_t pool_rows = 700, local_rows = 90;
  RecordRows pool = make_kv_records(pool_rows, dim, rope, stride, seed);
  RecordRows local = make_kv_records(local_rows, dim, rope, stride, seed + 1);
  std::mt19937 rng(seed + 2);
  std::vector<int64_t> begin{0}, refs_rows, refs_recs;
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t nk = keys_per_query + static_cast<int64_t>(rng() % 17);
    for (int64_t j = 0; j < nk; ++j) {
      const uint32_t kind = rng() % 10;
      if (kind == 0) {
        refs_rows.push_back(kKvRefNone);
        refs_recs.push_back(kKvRefNone);
        continue;
      }
      const bool in_local = kind < 4;
      const int64_t row = static_cast<int64_t>(rng() % (in_local ? local_rows : pool_rows));
      refs_rows.push_back(in_local ? kv_ref_local(row * dim) : kv_ref_pool(row * dim));
      refs_recs.push_back(in_local ? kv_ref_local(row * stride) : kv_ref_pool(row * stride));
    }
    begin.push_back(static_cast<int64_t>(refs_rows.size()));
  }
  const std::vector<float> q = normal_floats(static_cast<size_t>(nq * heads * dim), seed + 3, 1.5f);
  std::vector<uint16_t> q_bits;
  for (float v : q) q_bits.push_back(numeric::f32_to_bf16(v));
  const std::vector<float> sinks = normal_floats(static_cast<size_t>(heads), seed + 4, 2.0f);
  DevVec<float> d_q(q), d_sinks(sinks);
  DevVec<uint16_t> d_q16(q_bits);
  DevVec<int64_t> d_begin(begin), d_rows(refs_rows), d_recs(refs_recs);
  const int64_t scratch =
      path == AttnPath::kTensorSplit ? sink_attention_scratch_floats(nq, heads, dim) : 0;
  auto run = [&](bool records) {
    DevVec<float> d_out(static_cast<size_t>(nq * heads * dim), 9.0f);
    DevVec<float> d_scratch(static_cast<size_t>(std::max<int64_t>(scratch, 1)), 0.0f);
    DSI_EXPECT_OK_CONTINUE(launch_sink_attention(
        SinkAttentionParams{.q = q16 ? nullptr : d_q.get(),
                            .nq = nq,
                            .heads = heads,
                            .dim = dim,
                            .pool = records ? pool.records.get() : pool.rows.get(),
                            .local = records ? local.records.get() : local.rows.get(),
                            .key_begin = d_begin.get(),
                            .key_refs = records ? d_recs.get() : d_rows.get(),
                            .sinks = d_sinks.get(),
                            .scale = 1.0f / std::sqrt(static_cast<float>(dim)),
                            .out = d_out.get(),
                            .tensor_cores = path != AttnPath::kSimple,
                            .split_scratch = scratch > 0 ? d_scratch.get() : nullptr,
                            .split_scratch_floats = scratch,
                            .bf16_operands = true,
                            .q_bf16 = q16 ? d_q16.get() : nullptr,
                            .kv_records = records,
                            .record_rope_dim = rope},
        nullptr));
    sync();
    return d_out.download();
  };
  const std::vector<float> want = run(false);
  const std::vector<float> got = run(true);
  expect_same_floats(want, got, "sink attention");
  double mass = 0.0;
  for (float v : want) mass += std::fabs(v);
  EXPECT_GT(mass, 0.0) << "the test attended to nothing";
}

TEST_F(GpuTest, SinkAttentionOverKvRecordsEqualsFp32Rows) {
  uint32_t seed = 10;
  for (bool aligned8 : {true, false}) {
    // One warp per key (small dims and the general shapes), mma.sync BF16 (dims 64..512).
    run_attention_records(4, 128, 64, 3, 40, AttnPath::kSimple, false, aligned8, seed += 10);
    run_attention_records(4, 128, 64, 3, 40, AttnPath::kTensorSplit, false, aligned8, seed += 10);
    run_attention_records(4, 128, 64, 40, 70, AttnPath::kTensor, false, aligned8, seed += 10);
    run_attention_records(16, 64, 0, 5, 33, AttnPath::kTensorSplit, false, aligned8, seed += 10);
    run_attention_records(80, 512, 64, 2, 50, AttnPath::kSimple, false, aligned8, seed += 10);
    // wgmma at V4-Flash's shape: fp32 q and BF16 q, with and without key splits.
    run_attention_records(64, 512, 64, 2, 300, AttnPath::kTensorSplit, false, aligned8, seed += 10);
    run_attention_records(64, 512, 64, 2, 300, AttnPath::kTensorSplit, true, aligned8, seed += 10);
    run_attention_records(64, 512, 64, 150, 40, AttnPath::kTensor, true, aligned8, seed += 10);
    // Blocks walking three queries each, of 0-16 and of 25-41 keys (one and two tiles, some
    // none): each query's last tile loads the next query's first.
    run_attention_records(64, 512, 64, 400, 0, AttnPath::kTensor, true, aligned8, seed += 10);
    run_attention_records(64, 512, 64, 400, 25, AttnPath::kTensor, true, aligned8, seed += 10);
    run_attention_records(61, 512, 64, 7, 130, AttnPath::kTensor, false, aligned8, seed += 10);
  }
}

// ---- indexer ----------------------------------------------------------------------------------

enum class IdxPath { kSimple, kTensor, kGrouped };

void run_indexer_records(int64_t heads, int64_t dim, IdxPath path, uint32_t seed) {
  SCOPED_TRACE("indexer over records heads " + std::to_string(heads) + " dim " +
               std::to_string(dim) + " path " + std::to_string(static_cast<int>(path)));
  const int64_t nq = path == IdxPath::kGrouped ? 90 : 5;
  const int64_t keys = 700;  // one sequence's keys, shared by every query
  const int64_t page_floats = 2048;
  const int64_t rec = numeric::index_key_record_floats(dim);
  const int64_t rpp_f = page_floats / dim, rpp_r = page_floats / rec;
  const int64_t pages_f = (keys + rpp_f - 1) / rpp_f, pages_r = (keys + rpp_r - 1) / rpp_r;
  // Keys: normal values packed as records (the FP4 simulation), unpacked to fp32 rows; both laid
  // out in pages in reverse page order.
  std::vector<int64_t> off_r(static_cast<size_t>(keys)), off_f(static_cast<size_t>(keys));
  std::vector<int32_t> table_f, table_r;
  for (int64_t i = 0; i < pages_f; ++i) table_f.push_back(static_cast<int32_t>(pages_f - 1 - i));
  for (int64_t i = 0; i < pages_r; ++i) table_r.push_back(static_cast<int32_t>(pages_r - 1 - i));
  for (int64_t w = 0; w < keys; ++w) {
    off_r[w] = (table_r[w / rpp_r] * page_floats + (w % rpp_r) * rec) * 4;
    off_f[w] = table_f[w / rpp_f] * page_floats + (w % rpp_f) * dim;
  }
  const std::vector<float> x = normal_floats(static_cast<size_t>(keys * dim), seed, 1.0f);
  DevVec<float> d_x(x), d_dense(x.size(), 0.0f);
  DevVec<float> d_pool_r(static_cast<size_t>(pages_r * page_floats), 0.0f);
  DevVec<int64_t> d_off_r(off_r);
  auto* bytes = reinterpret_cast<uint8_t*>(d_pool_r.get());
  DSI_EXPECT_OK_CONTINUE(launch_index_key_pack(
      IndexKeyPackParams{
          .x = d_x.get(), .rows = keys, .dim = dim, .out = bytes, .out_offsets = d_off_r.get()},
      nullptr));
  DSI_EXPECT_OK_CONTINUE(launch_index_key_unpack(IndexKeyUnpackParams{.records = bytes,
                                                                      .offsets = d_off_r.get(),
                                                                      .rows = keys,
                                                                      .dim = dim,
                                                                      .out = d_dense.get()},
                                                 nullptr));
  sync();
  const std::vector<float> dense = d_dense.download();
  std::vector<float> pool_f(static_cast<size_t>(pages_f * page_floats), 0.0f);
  for (int64_t w = 0; w < keys; ++w)
    std::copy(dense.begin() + w * dim, dense.begin() + (w + 1) * dim, pool_f.begin() + off_f[w]);
  // q on a 0.5 grid (BF16-exact, as the FP4-simulated queries); visible counts vary per query.
  std::mt19937 rng(seed + 1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(nq * heads * dim));
  for (auto& v : q) v = std::round(nd(rng) * 2.0f) / 2.0f;
  std::vector<int64_t> visible, page_begin(static_cast<size_t>(nq), 0);
  for (int64_t qi = 0; qi < nq; ++qi) visible.push_back(1 + static_cast<int64_t>(rng() % keys));
  const std::vector<float> hw = normal_floats(static_cast<size_t>(nq * heads), seed + 2);
  DevVec<float> d_pool_f(pool_f), d_q(q), d_hw(hw);
  DevVec<int32_t> d_table_f(table_f), d_table_r(table_r);
  DevVec<int64_t> d_vis(visible), d_pb(page_begin);
  auto run = [&](bool records) {
    DevVec<float> d_scores(static_cast<size_t>(nq * keys), -3.0f);
    DSI_EXPECT_OK_CONTINUE(launch_indexer_scores(
        IndexerScoreParams{.q = d_q.get(),
                           .head_w = d_hw.get(),
                           .w_scale = 0.02f,
                           .nq = nq,
                           .heads = heads,
                           .dim = dim,
                           .pool = records ? d_pool_r.get() : d_pool_f.get(),
                           .page_floats = page_floats,
                           .rows_per_page = records ? rpp_r : rpp_f,
                           .pages = records ? d_table_r.get() : d_table_f.get(),
                           .page_begin = d_pb.get(),
                           .visible = d_vis.get(),
                           .max_visible = keys,
                           .scores = d_scores.get(),
                           .ld = keys,
                           .tensor_cores = path != IdxPath::kSimple,
                           .bf16_exact = true,
                           .group_queries = path == IdxPath::kGrouped,
                           .key_records = records,
                           .row_floats = records ? rec : 0},
        nullptr));
    sync();
    return d_scores.download();
  };
  const std::vector<float> want = run(false);
  expect_same_floats(want, run(true), "indexer scores");
  int64_t written = 0;
  for (float v : want) written += v != -3.0f ? 1 : 0;
  EXPECT_GT(written, nq);
}

TEST_F(GpuTest, IndexerScoresOverIndexKeyRecordsEqualFp32Rows) {
  uint32_t seed = 400;
  for (int64_t dim : {64, 128}) {
    run_indexer_records(4, dim, IdxPath::kSimple, seed += 10);
    run_indexer_records(64, dim, IdxPath::kTensor, seed += 10);
    run_indexer_records(3, dim, IdxPath::kTensor, seed += 10);
  }
  run_indexer_records(64, 128, IdxPath::kGrouped, seed += 10);
}

TEST(GpuOpsArgs, RecordReadersValidate) {
  // KV records need BF16 operands and a record layout; index-key records bf16_exact and rows of
  // a record's width.
  float dummy = 0.0f;
  int64_t begin[2] = {0, 0};
  const SinkAttentionParams a{.q = &dummy,
                              .nq = 1,
                              .heads = 1,
                              .dim = 128,
                              .key_begin = begin,
                              .sinks = &dummy,
                              .out = &dummy,
                              .kv_records = true,
                              .record_rope_dim = 64};
  EXPECT_EQ(launch_sink_attention(a, nullptr).code(), StatusCode::kInvalidArgument);
  SinkAttentionParams b = a;
  b.bf16_operands = true;
  b.record_rope_dim = 32;  // 96 nope dims
  EXPECT_EQ(launch_sink_attention(b, nullptr).code(), StatusCode::kInvalidArgument);
  int32_t page = 0;
  int64_t zero = 0;
  IndexerScoreParams ip{.q = &dummy,
                        .head_w = &dummy,
                        .nq = 1,
                        .heads = 1,
                        .dim = 128,
                        .pool = &dummy,
                        .page_floats = 1700,
                        .rows_per_page = 100,
                        .pages = &page,
                        .page_begin = &zero,
                        .visible = &zero,
                        .max_visible = 1,
                        .scores = &dummy,
                        .ld = 1,
                        .key_records = true,
                        .row_floats = 17};
  EXPECT_EQ(launch_indexer_scores(ip, nullptr).code(), StatusCode::kInvalidArgument);  // not exact
  ip.bf16_exact = true;
  ip.row_floats = 16;  // narrower than a record
  EXPECT_EQ(launch_indexer_scores(ip, nullptr).code(), StatusCode::kInvalidArgument);
  CompressorPoolParams cp{.n_entries = 1, .ratio = 4, .d = 512, .out = &dummy, .records = true};
  EXPECT_EQ(launch_compressor_pool(cp, nullptr).code(), StatusCode::kInvalidArgument);  // kNone
}

}  // namespace
}  // namespace dsinfer::cuda::test
