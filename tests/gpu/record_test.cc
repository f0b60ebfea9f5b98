// State records (kv_record.h) against numeric/quant.h, bit for bit: the 584 B FP8 KV record
// (codes and scales = fp8_block_quantize over 64-dim blocks, rope dims = bf16 RNE) and the 68 B
// MXFP4 index-key record (= fp4_block_simulate over 32-dim blocks), packed to scattered page
// offsets and unpacked again.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/kv_record.h"
#include "numeric/float_formats.h"
#include "numeric/quant.h"
#include "test_util.h"

namespace dsinfer::cuda::test {
namespace {

std::vector<float> spread_rows(int64_t rows, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    const int k = static_cast<int>(rng() % 40) - 20;
    for (int64_t i = 0; i < dim; ++i) {
      x[r * dim + i] = std::ldexp(nd(rng), r % 4 == 3 ? -30 : k);  // some rows under the floors
    }
  }
  return x;
}

TEST_F(GpuTest, KvRecordIsBitExact) {
  uint32_t seed = 1;
  for (auto [dim, rope] : {std::pair<int64_t, int64_t>{512, 64}, {128, 64}, {64, 0}, {200, 8}}) {
    const int64_t rec = kv_record_bytes(dim, rope);
    const int64_t nope = dim - rope;
    for (int64_t rows : {0, 1, 3, 7, 129}) {
      SCOPED_TRACE("kv record dim " + std::to_string(dim) + " rope " + std::to_string(rope) +
                   " rows " + std::to_string(rows));
      const std::vector<float> x = spread_rows(rows, dim, seed++);
      // Records at scattered 8-byte-aligned offsets (as in pages), pool pre-filled with 0xee.
      std::vector<int64_t> off(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) off[r] = (rows - 1 - r) * (rec + 8);
      const size_t pool_bytes = static_cast<size_t>(std::max<int64_t>(rows, 1) * (rec + 8));
      std::vector<uint8_t> want_pool(pool_bytes, 0xee);
      std::vector<float> want_rows(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        const float* v = x.data() + r * dim;
        uint8_t* o = want_pool.data() + off[r];
        numeric::fp8_block_quantize(v, nope, 64, o, o + nope + 2 * rope);
        for (int64_t i = 0; i < rope; ++i) {
          const uint16_t h = numeric::f32_to_bf16(v[nope + i]);
          std::memcpy(o + nope + 2 * i, &h, 2);
        }
        for (int64_t i = nope + 2 * rope + nope / 64; i < rec; ++i) o[i] = 0;
        float* w = want_rows.data() + r * dim;
        std::copy(v, v + dim, w);
        numeric::fp8_block_simulate(w, nope, 64);
        for (int64_t i = nope; i < dim; ++i) w[i] = numeric::round_to_bf16(w[i]);
      }
      DevVec<float> d_x(x);
      DevVec<uint8_t> d_pool(pool_bytes, 0xee);
      DevVec<int64_t> d_off(off);
      DevVec<float> d_rows(x.size());
      DSI_EXPECT_OK(launch_kv_record_pack(KvRecordPackParams{.x = d_x.get(),
                                                             .rows = rows,
                                                             .dim = dim,
                                                             .rope_dim = rope,
                                                             .out = d_pool.get(),
                                                             .out_offsets = d_off.get()},
                                          nullptr));
      DSI_EXPECT_OK(launch_kv_record_unpack(KvRecordUnpackParams{.records = d_pool.get(),
                                                                 .offsets = d_off.get(),
                                                                 .rows = rows,
                                                                 .dim = dim,
                                                                 .rope_dim = rope,
                                                                 .out = d_rows.get()},
                                            nullptr));
      sync();
      EXPECT_EQ(d_pool.download(), want_pool) << "record bytes (incl. untouched gaps)";
      expect_same_floats(want_rows, d_rows.download(), "unpacked kv");
    }
  }
}

TEST_F(GpuTest, IndexKeyRecordIsBitExact) {
  uint32_t seed = 100;
  for (int64_t dim : {128, 32, 96}) {
    const int64_t rec = index_key_record_bytes(dim);
    for (int64_t rows : {0, 1, 3, 7, 129, 4096}) {
      SCOPED_TRACE("index key dim " + std::to_string(dim) + " rows " + std::to_string(rows));
      std::vector<float> x = spread_rows(rows, dim, seed++);
      if (dim == 128) {
        for (int64_t r = 0; r < rows; ++r) numeric::hadamard_transform(x.data() + r * dim, dim);
      }
      std::vector<float> want = x;
      for (int64_t r = 0; r < rows; ++r)
        numeric::fp4_block_simulate(want.data() + r * dim, dim, 32);
      DevVec<float> d_x(x);
      DevVec<uint8_t> d_rec(static_cast<size_t>(rows * rec) + 1, 0xee);
      DevVec<float> d_out(x.size());
      DSI_EXPECT_OK(launch_index_key_pack(
          IndexKeyPackParams{.x = d_x.get(), .rows = rows, .dim = dim, .out = d_rec.get()},
          nullptr));
      DSI_EXPECT_OK(launch_index_key_unpack(
          IndexKeyUnpackParams{
              .records = d_rec.get(), .rows = rows, .dim = dim, .out = d_out.get()},
          nullptr));
      // Re-packing the simulated values gives the same values again (a stored key round-trips).
      DevVec<float> d_sim(want);
      DevVec<uint8_t> d_rec2(static_cast<size_t>(rows * rec) + 1, 0xee);
      DevVec<float> d_out2(x.size());
      DSI_EXPECT_OK(launch_index_key_pack(
          IndexKeyPackParams{.x = d_sim.get(), .rows = rows, .dim = dim, .out = d_rec2.get()},
          nullptr));
      DSI_EXPECT_OK(launch_index_key_unpack(
          IndexKeyUnpackParams{
              .records = d_rec2.get(), .rows = rows, .dim = dim, .out = d_out2.get()},
          nullptr));
      sync();
      expect_same_floats(want, d_out.download(), "unpacked index key");
      expect_same_floats(want, d_out2.download(), "re-packed index key");
      EXPECT_EQ(d_rec.download().back(), 0xee) << "write past the end";
    }
  }
}

TEST(GpuOpsArgs, RecordsValidate) {
  EXPECT_EQ(launch_kv_record_pack(KvRecordPackParams{.rows = 1, .dim = 100, .rope_dim = 4}, nullptr)
                .code(),
            StatusCode::kInvalidArgument);  // 96 nope dims: not a multiple of 64
  EXPECT_EQ(launch_index_key_pack(IndexKeyPackParams{.rows = 1, .dim = 100}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(launch_kv_record_pack(KvRecordPackParams{.rows = 0}, nullptr).ok());
}

}  // namespace
}  // namespace dsinfer::cuda::test
