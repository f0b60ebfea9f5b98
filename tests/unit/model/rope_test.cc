// rope_inv_freq against transformers (fp32, bit for bit) and the spec's check values (§3.4).
#include <gtest/gtest.h>

#include <cmath>

#include "model/config.h"

namespace dsinfer::model {
namespace {

RopeParams flash_compress() {
  RopeParams p;
  p.theta = 160000.0;
  p.yarn = true;
  p.factor = 16.0;
  p.original_max_position = 65536;
  p.beta_fast = 32.0;
  p.beta_slow = 1.0;
  return p;
}

TEST(Rope, SpecCheckValues) {
  const std::vector<float> c = rope_inv_freq(flash_compress(), 64);
  ASSERT_EQ(c.size(), 32u);
  auto near = [](float got, double want) { return std::fabs(got - want) <= 1e-5 * want; };
  EXPECT_EQ(c[0], 1.0f);
  EXPECT_TRUE(near(c[15], 3.63554e-3)) << c[15];
  EXPECT_TRUE(near(c[16], 2.26563e-3)) << c[16];
  EXPECT_TRUE(near(c[20], 2.96978e-4)) << c[20];
  EXPECT_TRUE(near(c[24], 1.95312e-5)) << c[24];
  EXPECT_TRUE(near(c[25], 5.37231e-6)) << c[25];
  EXPECT_TRUE(near(c[31], 5.68053e-7)) << c[31];
  RopeParams main;
  main.theta = 10000.0;
  const std::vector<float> m = rope_inv_freq(main, 64);
  EXPECT_TRUE(near(m[1], 0.749894)) << m[1];
  EXPECT_TRUE(near(m[31], 1.33352e-4)) << m[31];
}

// torch 2.x fp32 values from transformers' _compute_default_rope_parameters /
// _compute_yarn_parameters (printed with float.hex()).
TEST(Rope, MatchesTransformersBitForBit) {
  const float compress[32] = {
      0x1.0000000000000p+0f,  0x1.6014740000000p-1f,  0x1.e4383e0000000p-2f,
      0x1.4cfa020000000p-2f,  0x1.c9f25c0000000p-3f,  0x1.3ae8ea0000000p-3f,
      0x1.b119680000000p-4f,  0x1.29d2c60000000p-4f,  0x1.99999a0000000p-5f,
      0x1.19a9f60000000p-5f,  0x1.8360320000000p-6f,  0x1.0a619c0000000p-6f,
      0x1.6e5b7e0000000p-7f,  0x1.f7db100000000p-8f,  0x1.5a7abc0000000p-8f,
      0x1.dc846e0000000p-9f,  0x1.28f5c20000000p-9f,  0x1.6e29c00000000p-10f,
      0x1.bd7b6c0000000p-11f, 0x1.0a619c0000000p-11f, 0x1.37675e0000000p-12f,
      0x1.60b2f00000000p-13f, 0x1.7d209a0000000p-14f, 0x1.7d36be0000000p-15f,
      0x1.47ae180000000p-16f, 0x1.6887a00000000p-18f, 0x1.efd74c0000000p-19f,
      0x1.54f7d00000000p-19f, 0x1.d4effe0000000p-20f, 0x1.4277b80000000p-20f,
      0x1.bb7e600000000p-21f, 0x1.30f89a0000000p-21f};
  const float main[32] = {0x1.0000000000000p+0f,  0x1.7ff2220000000p-1f,  0x1.1feb340000000p-1f,
                          0x1.afd1360000000p-2f,  0x1.43d1360000000p-2f,  0x1.e5a8460000000p-3f,
                          0x1.6c310e0000000p-3f,  0x1.111aee0000000p-3f,  0x1.99999a0000000p-4f,
                          0x1.33281a0000000p-4f,  0x1.ccab840000000p-5f,  0x1.59742a0000000p-5f,
                          0x1.030dc60000000p-5f,  0x1.84869e0000000p-6f,  0x1.235a720000000p-6f,
                          0x1.b4f7e40000000p-7f,  0x1.47ae140000000p-7f,  0x1.eb73600000000p-8f,
                          0x1.7089380000000p-8f,  0x1.145cee0000000p-8f,  0x1.9e7c700000000p-9f,
                          0x1.36d21a0000000p-9f,  0x1.d22a500000000p-10f, 0x1.5d931c0000000p-10f,
                          0x1.0624de0000000p-10f, 0x1.8929180000000p-11f, 0x1.26d42c0000000p-11f,
                          0x1.ba2e4a0000000p-12f, 0x1.4b96c00000000p-12f, 0x1.f1502a0000000p-13f,
                          0x1.74eea60000000p-13f, 0x1.17a8e40000000p-13f};
  // Tiny preset: original context 64 -> low 0, high 7.
  const float tiny[32] = {0x1.0000000000000p+0f,  0x1.30ed260000000p-1f,  0x1.62849c0000000p-2f,
                          0x1.8e61f80000000p-3f,  0x1.a93c780000000p-4f,  0x1.a0217c0000000p-5f,
                          0x1.544ad00000000p-6f,  0x1.29d2c60000000p-8f,  0x1.99999a0000000p-9f,
                          0x1.19a9f60000000p-9f,  0x1.8360320000000p-10f, 0x1.0a619c0000000p-10f,
                          0x1.6e5b7e0000000p-11f, 0x1.f7db100000000p-12f, 0x1.5a7abc0000000p-12f,
                          0x1.dc846e0000000p-13f, 0x1.47ae140000000p-13f, 0x1.c2a98a0000000p-14f,
                          0x1.35e68e0000000p-14f, 0x1.aa35c60000000p-15f, 0x1.2515fe0000000p-15f,
                          0x1.9315a60000000p-16f, 0x1.152efc0000000p-16f, 0x1.7d36c00000000p-17f,
                          0x1.0624de0000000p-17f, 0x1.6887a00000000p-18f, 0x1.efd74c0000000p-19f,
                          0x1.54f7d00000000p-19f, 0x1.d4effe0000000p-20f, 0x1.4277b80000000p-20f,
                          0x1.bb7e600000000p-21f, 0x1.30f89a0000000p-21f};
  RopeParams mp;
  mp.theta = 10000.0;
  RopeParams tp = flash_compress();
  tp.original_max_position = 64;
  const std::vector<float> c = rope_inv_freq(flash_compress(), 64);
  const std::vector<float> m = rope_inv_freq(mp, 64);
  const std::vector<float> t = rope_inv_freq(tp, 64);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(c[i], compress[i]) << "compress " << i;
    EXPECT_EQ(m[i], main[i]) << "main " << i;
    EXPECT_EQ(t[i], tiny[i]) << "tiny " << i;
  }
}

TEST(Rope, DegenerateRampAndSmallDims) {
  RopeParams p = flash_compress();
  p.original_max_position = 1;  // low = high = 0 -> high += 0.001
  const std::vector<float> v = rope_inv_freq(p, 8);
  ASSERT_EQ(v.size(), 4u);
  // transformers: pair 0 extrapolated (unscaled), the rest interpolated (divided by 16).
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 0x1.99999ap-9f);
  EXPECT_EQ(v[2], 0x1.47ae14p-13f);
  EXPECT_EQ(v[3], 0x1.0624dep-17f);
  EXPECT_TRUE(rope_inv_freq(p, 0).empty());
}

}  // namespace
}  // namespace dsinfer::model
