// MatrixRef dequantisation of the checkpoint formats.
#include "tensor/matrix_ref.h"

#include <gtest/gtest.h>

#include <vector>

#include "numeric/float_formats.h"

namespace dsinfer {
namespace {

TEST(MatrixRef, FloatBf16) {
  std::vector<uint16_t> data = {numeric::f32_to_bf16(1.5f),
                                numeric::f32_to_bf16(-2.0f),
                                numeric::f32_to_bf16(0.25f),
                                numeric::f32_to_bf16(3.0f)};
  MatrixRef m{WeightFormat::kFloat, DType::kBF16, DType::kF8E8M0, data.data(), nullptr, 2, 2};
  EXPECT_EQ(m.at(0, 1), -2.0f);
  float row[2];
  m.dequant_row(1, row);
  EXPECT_EQ(row[0], 0.25f);
  EXPECT_EQ(row[1], 3.0f);
  EXPECT_EQ(m.nbytes(), 8);
}

TEST(MatrixRef, Fp8Block128) {
  // 130 x 3: two row blocks, one column block.
  std::vector<uint8_t> q(130 * 3, numeric::f32_to_fp8_e4m3(1.5f));
  std::vector<uint8_t> s = {127 + 2, 127 - 1};  // 4, 0.5
  MatrixRef m{
      WeightFormat::kFp8Block128, DType::kF8E4M3, DType::kF8E8M0, q.data(), s.data(), 130, 3};
  EXPECT_EQ(m.at(0, 0), 6.0f);
  EXPECT_EQ(m.at(127, 2), 6.0f);
  EXPECT_EQ(m.at(128, 1), 0.75f);
  float row[3];
  m.dequant_row(129, row);
  EXPECT_EQ(row[2], 0.75f);
  EXPECT_EQ(m.nbytes(), 130 * 3 + 2);
}

TEST(MatrixRef, Fp8Block32) {
  // 40 x 70: tiles of 32 x 32, a 2 x 3 scale grid (V4.1).
  std::vector<uint8_t> q(40 * 70, numeric::f32_to_fp8_e4m3(1.5f));
  std::vector<uint8_t> s = {127, 128, 129, 126, 125, 130};  // 1 2 4 / 0.5 0.25 8
  MatrixRef m{
      WeightFormat::kFp8Block32, DType::kF8E4M3, DType::kF8E8M0, q.data(), s.data(), 40, 70};
  EXPECT_EQ(m.at(0, 0), 1.5f);
  EXPECT_EQ(m.at(31, 63), 3.0f);
  EXPECT_EQ(m.at(31, 64), 6.0f);
  EXPECT_EQ(m.at(32, 31), 0.75f);
  EXPECT_EQ(m.at(39, 69), 12.0f);
  float row[70];
  m.dequant_row(35, row);
  EXPECT_EQ(row[33], 0.375f);
  EXPECT_EQ(row[69], 12.0f);
  EXPECT_EQ(m.nbytes(), 40 * 70 + 6);
  EXPECT_EQ(fp8_block_edge(WeightFormat::kFp8Block32), 32);
  EXPECT_STREQ(weight_format_name(WeightFormat::kFp8Block32), "fp8-block32");
}

TEST(MatrixRef, Mxfp4) {
  // 1 x 64: nibble codes 0..15 repeated, scales 2 and 0.25.
  std::vector<uint8_t> packed(32);
  for (int k = 0; k < 32; ++k) {
    const uint8_t lo = static_cast<uint8_t>((2 * k) & 15),
                  hi = static_cast<uint8_t>((2 * k + 1) & 15);
    packed[k] = static_cast<uint8_t>(lo | (hi << 4));
  }
  std::vector<uint8_t> s = {128, 125};
  MatrixRef m{WeightFormat::kMxfp4, DType::kI8, DType::kF8E8M0, packed.data(), s.data(), 1, 64};
  for (int c = 0; c < 64; ++c) {
    const float expect =
        numeric::fp4_e2m1_to_f32(static_cast<uint8_t>(c & 15)) * (c < 32 ? 2.0f : 0.25f);
    EXPECT_EQ(m.at(0, c), expect) << c;
  }
  EXPECT_EQ(m.nbytes(), 32 + 2);
}

}  // namespace
}  // namespace dsinfer
