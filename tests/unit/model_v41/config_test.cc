// V4.1 config parsing, the derived schedule at the real V4.1-Flash config, the Engram primes and
// the state byte figures of spec deepseek-v41.md §4.1 and §6.
#include "model_v41/config.h"

#include <gtest/gtest.h>

#include "model_v41/engram.h"
#include "model_v41/state_layout.h"
#include "model_v41/synthetic.h"

namespace dsinfer::model_v41 {
namespace {

using json = nlohmann::json;

V41Config parse_ok(const json& j) {
  auto c = parse_v41_config(j.dump(), "config.json");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : V41Config{};
}

std::string parse_err(const json& j) {
  auto c = parse_v41_config(j.dump(), "config.json");
  EXPECT_FALSE(c.ok());
  return c.ok() ? "" : c.status().to_string();
}

TEST(V41Config, FlashScheduleMatchesSpec) {
  const V41Config c = parse_ok(v41_flash_config_json());
  EXPECT_EQ(c.form, V41ConfigForm::kOfficial);
  EXPECT_TRUE(c.quantized);
  EXPECT_EQ(c.yoco_boundary, 20);
  ASSERT_EQ(c.layers.size(), 40u);
  for (int l = 0; l < 40; ++l) {
    const V41LayerPlan& p = c.layers[static_cast<size_t>(l)];
    EXPECT_EQ(p.producer, l < 20) << l;
    if (l < 2) {
      EXPECT_EQ(p.role, LayerRole::kWindow);
      EXPECT_EQ(p.kv_owner, -1);
      continue;
    }
    const int kv = l < 8 ? 2 : l < 14 ? 8 : l < 20 ? 14 : 20;
    EXPECT_EQ(p.kv_owner, kv) << l;
    EXPECT_EQ(p.index_key_owner, kv) << l;
    const int topk = l < 20 ? kv : (l < 24 ? 20 : l - (l % 4));
    EXPECT_EQ(p.topk_source, topk) << l;
    EXPECT_EQ(p.compress_ratio, l < 20 ? 2 : 1);
  }
  EXPECT_EQ(c.layers[2].role, LayerRole::kFull);
  EXPECT_EQ(c.layers[20].role, LayerRole::kFull);
  EXPECT_TRUE(c.layers[20].candidate_source);
  for (int l : {24, 28, 32, 36}) {
    EXPECT_EQ(c.layers[static_cast<size_t>(l)].role, LayerRole::kReindex);
    EXPECT_TRUE(c.layers[static_cast<size_t>(l)].uses_candidates);
  }
  EXPECT_EQ(c.layers[21].role, LayerRole::kReuse);
  EXPECT_FALSE(c.layers[21].uses_candidates);
  EXPECT_TRUE(c.layers[1].engram);
  EXPECT_TRUE(c.layers[14].engram);
}

TEST(V41Config, FlashEngramPrimesAndRows) {
  const V41Config c = parse_ok(v41_flash_config_json());
  ASSERT_EQ(c.engram_primes.size(), 2u);
  ASSERT_EQ(c.engram_primes[0].size(), 24u);
  EXPECT_EQ(c.engram_primes[0][0], 16000057);
  EXPECT_EQ(c.engram_primes[0][1], 16000079);
  EXPECT_EQ(c.engram_primes[0][2], 16000081);
  EXPECT_EQ(c.engram_primes[1].back(), 16000889);
  EXPECT_EQ(c.engram_rows, (std::vector<int64_t>{384006168, 384016682}));
  // Both tables with their per-32 scales: 188.8 GiB.
  const double bytes = static_cast<double>(c.engram_rows[0] + c.engram_rows[1]) * (256 + 8);
  EXPECT_NEAR(bytes / (1ull << 30), 188.8, 0.05);
}

TEST(V41Config, FlashStateBytesMatchSpec) {
  const V41Config c = parse_ok(v41_flash_config_json());
  const StateLayout s = compute_state_layout(c);
  EXPECT_EQ(s.window_record, 528);
  EXPECT_EQ(s.compressed_record, 288);
  EXPECT_EQ(s.index_record, 68);
  ASSERT_EQ(s.owners.size(), 4u);
  EXPECT_EQ(s.owners[0].index_bytes, 4352);
  EXPECT_EQ(s.owners[0].main_bytes, 18432);
  EXPECT_EQ(s.owners[3].index_bytes, 8704);
  EXPECT_EQ(s.owners[3].main_bytes, 36864);
  EXPECT_EQ(s.block_raw_bytes, 113920);
  EXPECT_EQ(s.block_stride, 114048);
  EXPECT_DOUBLE_EQ(s.bytes_per_token_raw, 890.0);
  EXPECT_DOUBLE_EQ(s.bytes_per_token, 891.0);
  EXPECT_EQ(s.ring_slots, 134);
  EXPECT_EQ(s.n_rings, 43);
  EXPECT_EQ(s.ring_bytes, 70752);
  EXPECT_EQ(s.n_rings * s.ring_bytes, 3042336);
  EXPECT_EQ(s.compressor_ring_slots, 7);
  EXPECT_EQ(s.compressor_ring_bytes, 28672);
  EXPECT_EQ(s.n_compressor_rings, 3);
  EXPECT_EQ(s.producer_ring_bytes, 1415040);
  EXPECT_EQ(s.state_bytes, 3128928);
}

TEST(V41Config, FlashFp8SparseKvBytes) {
  json j = v41_flash_config_json();
  j["text_config"]["use_fp4_sparse_kv"] = false;
  const StateLayout s = compute_state_layout(parse_ok(j));
  EXPECT_EQ(s.block_raw_bytes, 190720);
  EXPECT_DOUBLE_EQ(s.bytes_per_token_raw, 1490.0);
  EXPECT_DOUBLE_EQ(s.bytes_per_token, 1518.0);
}

TEST(V41Config, TransformersFormsParseAlike) {
  const V41Config a = parse_ok(v41_tiny_config_json(true));
  const V41Config b = parse_ok(v41_tiny_config_json(false));
  json comp = {{"model_type", "deepseek_v41"}, {"text_config", v41_tiny_config_json(false)}};
  const V41Config d = parse_ok(comp);
  EXPECT_EQ(a.form, V41ConfigForm::kOfficial);
  EXPECT_EQ(b.form, V41ConfigForm::kTransformersText);
  EXPECT_EQ(d.form, V41ConfigForm::kTransformersComposite);
  for (const V41Config* c : {&a, &b, &d}) {
    EXPECT_EQ(c->yoco_boundary, 5);
    EXPECT_EQ(c->layers[7].role, LayerRole::kReindex);
    EXPECT_EQ(c->layers[6].topk_source, 5);
    EXPECT_EQ(c->layers[4].kv_owner, 2);
    EXPECT_TRUE(c->rope_compress.yarn);
    EXPECT_EQ(c->engram_rows.size(), 2u);
  }
}

TEST(V41Config, PortDefaultsForMissingSchedule) {
  json t = v41_tiny_config_json(false);
  t.erase("kv_source_layer_ids");
  t.erase("index_source_layer_ids");
  t.erase("candidate_source_layer_id");
  const V41Config c = parse_ok(t);
  EXPECT_EQ(c.kv_source_layer_ids, (std::vector<int>{2, 5}));
  EXPECT_EQ(c.index_source_layer_ids, (std::vector<int>{2, 5}));
  EXPECT_EQ(c.candidate_source_layer_id, 5);
}

TEST(V41Config, PortRopeParametersForm) {
  json t = v41_tiny_config_json(false);
  t.erase("rope_scaling");
  t["rope_parameters"] = {{"main", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
                          {"compress",
                           {{"rope_type", "yarn"},
                            {"rope_theta", 160000.0},
                            {"factor", 4.0},
                            {"original_max_position_embeddings", 64},
                            {"attention_factor", 1.0}}}};
  const V41Config c = parse_ok(t);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_DOUBLE_EQ(c.rope_compress.factor, 4.0);
}

TEST(V41Config, NamedErrors) {
  json j = v41_flash_config_json();
  j["text_config"]["kv_source_layer_ids"] = {2, 8, 14, 21};
  EXPECT_NE(parse_err(j).find("wrong producer/consumer config"), std::string::npos);

  j = v41_flash_config_json();
  j["text_config"]["compress_ratios"][25] = 2;
  EXPECT_NE(parse_err(j).find("after the YOCO boundary"), std::string::npos);

  j = v41_flash_config_json();
  j["text_config"]["engram_layer_ids"] = {1, 24};
  EXPECT_NE(parse_err(j).find("Engram layer 24 is not a producer"), std::string::npos);

  j = v41_flash_config_json();
  j["text_config"]["engram_num_embeddings"] = {384006168, 384016683};
  EXPECT_NE(parse_err(j).find("engram_num_embeddings"), std::string::npos);

  j = v41_flash_config_json();
  j["text_config"]["rope_scaling"].erase("rope_type");
  EXPECT_NE(parse_err(j).find("rope_type"), std::string::npos);

  j = v41_flash_config_json();
  j["quantization_config"]["weight_block_size"] = {128, 128};
  EXPECT_NE(parse_err(j).find("weight_block_size"), std::string::npos);

  j = v41_flash_config_json();
  j["text_config"]["candidate_source_layer_id"] = 22;
  EXPECT_NE(parse_err(j).find("candidate_source_layer_id 22"), std::string::npos);

  j = v41_flash_config_json();
  j["text_config"]["dspark_target_layer_ids"] = {19, 38, 39};
  EXPECT_NE(parse_err(j).find("straddle the YOCO boundary"), std::string::npos);

  j = v41_flash_config_json();
  j["text_config"]["hc_shifted"] = false;
  EXPECT_NE(parse_err(j).find("hc_shifted"), std::string::npos);

  j = v41_flash_config_json();
  j["text_config"]["compress_ratios"].erase(42);
  EXPECT_NE(parse_err(j).find("compress_ratios"), std::string::npos);

  j = v41_flash_config_json();
  j["dtype"] = "float16";
  EXPECT_NE(parse_err(j).find("'dtype'"), std::string::npos);
}

TEST(V41Config, PrimeTest) {
  EXPECT_TRUE(is_prime_u64(2));
  EXPECT_TRUE(is_prime_u64(16000057));
  EXPECT_FALSE(is_prime_u64(16000059));
  EXPECT_TRUE(is_prime_u64(18446744073709551557ull));
  EXPECT_FALSE(is_prime_u64(1));
  EXPECT_FALSE(is_prime_u64(3215031751ull));  // strong pseudoprime to bases 2, 3, 5, 7
}

}  // namespace
}  // namespace dsinfer::model_v41

namespace dsinfer::model_v41 {
namespace {

TEST(V41Engram, FlashMultipliersMatchSpecTable) {
  auto c = parse_v41_config(v41_flash_config_json().dump(), "config.json");
  ASSERT_TRUE(c.ok());
  const auto m = engram_multipliers(*c);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0],
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(m[1],
            (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
}

TEST(V41Engram, NumpyPcg64Stream) {
  // numpy.random.default_rng(10007).integers(0, 2**62, 3, dtype=np.int64) and
  // default_rng(140098).integers(0, 2**40, 3, dtype=np.int64), numpy 2.4.
  NumpyPcg64 g(10007);
  EXPECT_EQ(g.bounded(uint64_t{1} << 62), 3796813830707316620ull);
  EXPECT_EQ(g.bounded(uint64_t{1} << 62), 239796500919311629ull);
  EXPECT_EQ(g.bounded(uint64_t{1} << 62), 1781657924734481866ull);
  NumpyPcg64 h(140098);
  EXPECT_EQ(h.bounded(uint64_t{1} << 40), 799917484495ull);
  EXPECT_EQ(h.bounded(uint64_t{1} << 40), 608481033744ull);
  EXPECT_EQ(h.bounded(uint64_t{1} << 40), 365264193655ull);
}

}  // namespace
}  // namespace dsinfer::model_v41
