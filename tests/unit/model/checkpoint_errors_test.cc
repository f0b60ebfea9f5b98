// Corrupted or mismatched checkpoints: each is rejected with a message naming the problem.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/checkpoint.h"
#include "model/synthetic.h"
#include "test_support.h"

namespace dsinfer::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::find_tensor;
using testing::rewrite;
using testing::test_dir;

std::string make(bool quantized, bool with_mtp = false, int shards = 1) {
  const std::string dir = test_dir();
  SyntheticSpec spec;
  spec.config = tiny_preset_config();
  spec.seed = 3;
  spec.quantized = quantized;
  spec.with_mtp = with_mtp;
  spec.num_shards = shards;
  const Status s = write_synthetic_checkpoint(spec, dir);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return dir;
}

// Opens `dir` expecting failure; every needle must appear in the message.
void expect_rejected(const std::string& dir, std::initializer_list<const char*> needles) {
  auto ck = Checkpoint::open(dir);
  ASSERT_FALSE(ck.ok()) << "checkpoint unexpectedly opened";
  if (std::getenv("DSI_TEST_VERBOSE")) {
    std::fprintf(stderr, "%s\n", ck.status().to_string().c_str());
  }
  for (const char* n : needles) {
    EXPECT_NE(ck.status().message().find(n), std::string::npos)
        << "message: " << ck.status().message() << "\nmissing: " << n;
  }
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

void edit_config(const std::string& dir, const std::function<void(json&)>& f) {
  json j = json::parse(read(dir + "/config.json"));
  f(j);
  write(dir + "/config.json", j.dump(2));
}

// Replaces the JSON header of a safetensors file, keeping its data section.
void edit_header(const std::string& path, const std::function<void(json&)>& f) {
  const std::string bytes = read(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  json h = json::parse(bytes.substr(8, n));
  f(h);
  std::string text = h.dump();
  while (text.size() % 8) text += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(text.size() >> (8 * i));
  write(path, out + text + bytes.substr(8 + n));
}

TEST(CheckpointErrors, MissingTensor) {
  const std::string dir = make(false);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    ts.erase(std::remove_if(
                 ts.begin(),
                 ts.end(),
                 [](const TensorToWrite& t) { return t.name == "layers.1.attn.wq_a.weight"; }),
             ts.end());
  });
  expect_rejected(dir, {"missing tensor layers.1.attn.wq_a.weight", "expected in", dir.c_str()});
}

TEST(CheckpointErrors, UnexpectedTensor) {
  const std::string dir = make(false);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    ts.push_back(f32_tensor("layers.0.attn.bogus", {1}, {0.0f}));
  });
  expect_rejected(dir, {"unexpected tensor layers.0.attn.bogus in ", "/model.safetensors"});
}

TEST(CheckpointErrors, UnexpectedMtpBeyondConfig) {
  const std::string dir = make(false, true);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    ts.push_back(f32_tensor("mtp.1.norm.weight", {64}, std::vector<float>(64, 1.0f)));
  });
  expect_rejected(dir, {"unexpected tensor mtp.1.norm.weight"});
}

TEST(CheckpointErrors, WrongShape) {
  const std::string dir = make(false);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    TensorToWrite* t = find_tensor(ts, "norm.weight");
    t->shape = {32};
    t->bytes.resize(64);
  });
  expect_rejected(dir,
                  {"tensor norm.weight in ", "/model.safetensors has shape [32], expected [64]"});
}

TEST(CheckpointErrors, WrongMatrixShape) {
  const std::string dir = make(false);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    find_tensor(ts, "layers.2.attn.compressor.wkv.weight")->shape = {64, 128};
  });
  expect_rejected(
      dir, {"layers.2.attn.compressor.wkv.weight", "has shape [64, 128], expected [128, 64]"});
}

TEST(CheckpointErrors, WrongDtypeForFloatOnlyMatrix) {
  const std::string dir = make(false);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    TensorToWrite* t = find_tensor(ts, "layers.1.attn.compressor.wgate.weight");
    t->dtype = DType::kF8E4M3;
    t->bytes.resize(t->bytes.size() / 2);
  });
  expect_rejected(
      dir, {"layers.1.attn.compressor.wgate.weight", "has dtype F8_E4M3", "expected F32/BF16/F16"});
}

TEST(CheckpointErrors, WrongDtypeForVector) {
  const std::string dir = make(false);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    TensorToWrite* t = find_tensor(ts, "layers.0.attn_norm.weight");
    t->dtype = DType::kI16;
  });
  expect_rejected(dir, {"layers.0.attn_norm.weight", "has dtype I16", "expected a float dtype"});
}

TEST(CheckpointErrors, TruncatedSafetensors) {
  const std::string dir = make(false);
  const std::string path = dir + "/model.safetensors";
  fs::resize_file(path, fs::file_size(path) - 100);
  expect_rejected(dir, {"model.safetensors", "extend past the data section", "truncated"});
}

TEST(CheckpointErrors, HeaderLengthBeyondFile) {
  const std::string dir = make(false);
  const std::string path = dir + "/model.safetensors";
  std::string bytes = read(path);
  const uint64_t n = bytes.size();  // header length = whole file -> beyond it
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  write(path, bytes);
  expect_rejected(dir, {"model.safetensors", "header length", "exceeds the file size"});
}

TEST(CheckpointErrors, BadJsonHeader) {
  const std::string dir = make(false);
  const std::string path = dir + "/model.safetensors";
  std::string bytes = read(path);
  bytes[8] = '[';
  bytes[9] = '}';
  write(path, bytes);
  expect_rejected(dir, {"model.safetensors", "header is not valid JSON"});
}

TEST(CheckpointErrors, OverlappingOffsets) {
  const std::string dir = make(false);
  edit_header(dir + "/model.safetensors", [](json& h) {
    h["layers.0.ffn_norm.weight"]["data_offsets"] = h["layers.0.attn_norm.weight"]["data_offsets"];
  });
  expect_rejected(dir, {"model.safetensors", "overlaps", "layers.0."});
}

TEST(CheckpointErrors, UnknownSafetensorsDtype) {
  const std::string dir = make(false);
  edit_header(dir + "/model.safetensors", [](json& h) { h["norm.weight"]["dtype"] = "F4_E2M1"; });
  expect_rejected(dir, {"model.safetensors", "tensor 'norm.weight': unknown dtype 'F4_E2M1'"});
}

TEST(CheckpointErrors, BadConfigJson) {
  const std::string dir = make(false);
  write(dir + "/config.json", "{\"vocab_size\": 512,,}");
  expect_rejected(dir, {"config.json: not valid JSON"});
}

TEST(CheckpointErrors, MissingConfig) {
  const std::string dir = make(false);
  fs::remove(dir + "/config.json");
  expect_rejected(dir, {"config.json", "no such file"});
}

TEST(CheckpointErrors, MissingConfigField) {
  const std::string dir = make(false);
  edit_config(dir, [](json& j) { j.erase("vocab_size"); });
  expect_rejected(dir, {"config.json", "missing required field 'vocab_size'"});
}

TEST(CheckpointErrors, UnknownLayerType) {
  const std::string dir = make(false);
  edit_config(dir, [](json& j) {
    j["layer_types"] = {"sliding_attention",
                        "compressed_sparse_attention",
                        "linear_attention",
                        "compressed_sparse_attention",
                        "heavily_compressed_attention"};
  });
  expect_rejected(dir,
                  {"config.json", "'layer_types[2]'", "unknown layer type 'linear_attention'"});
}

TEST(CheckpointErrors, CompressRatiosLengthMismatch) {
  const std::string dir = make(false);
  edit_config(dir, [](json& j) { j["compress_ratios"] = {0, 4, 16, 4}; });
  expect_rejected(dir, {"config.json", "'compress_ratios' has 4 entries", "num_hidden_layers (5)"});
}

TEST(CheckpointErrors, ConfigDisagreesWithTensors) {
  // A config whose layer 0 is CSA: the checkpoint lacks the compressor tensors.
  const std::string dir = make(false);
  edit_config(dir, [](json& j) { j["compress_ratios"][0] = 4; });
  expect_rejected(dir, {"missing tensor layers.0.attn.compressor.wkv.weight"});
}

TEST(CheckpointErrors, IndexPointsToMissingShard) {
  const std::string dir = make(false, false, 3);
  fs::remove(dir + "/model-00002-of-00003.safetensors");
  expect_rejected(dir,
                  {"model.safetensors.index.json",
                   "shard 'model-00002-of-00003.safetensors'",
                   "does not exist"});
}

TEST(CheckpointErrors, IndexEntryNotInShard) {
  const std::string dir = make(false, false, 3);
  const std::string path = dir + "/model.safetensors.index.json";
  json idx = json::parse(read(path));
  idx["weight_map"]["layers.0.attn.extra.weight"] = "model-00001-of-00003.safetensors";
  write(path, idx.dump());
  expect_rejected(dir,
                  {"tensor 'layers.0.attn.extra.weight' is mapped to shard "
                   "'model-00001-of-00003.safetensors'",
                   "does not contain it"});
}

TEST(CheckpointErrors, IndexMapsTensorToWrongShard) {
  const std::string dir = make(false, false, 2);
  const std::string path = dir + "/model.safetensors.index.json";
  json idx = json::parse(read(path));
  idx["weight_map"]["embed.weight"] = "model-00002-of-00002.safetensors";
  write(path, idx.dump());
  expect_rejected(dir, {"embed.weight", "model-0000"});
}

TEST(CheckpointErrors, ShardTensorNotInIndex) {
  const std::string dir = make(false, false, 2);
  const std::string path = dir + "/model.safetensors.index.json";
  json idx = json::parse(read(path));
  idx["weight_map"].erase("norm.weight");
  write(path, idx.dump());
  expect_rejected(dir, {"tensor 'norm.weight'", "is not listed in the weight_map"});
}

TEST(CheckpointErrors, BadIndexJson) {
  const std::string dir = make(false, false, 2);
  write(dir + "/model.safetensors.index.json", "{\"weight_map\": ");
  expect_rejected(dir, {"model.safetensors.index.json: not valid JSON"});
  write(dir + "/model.safetensors.index.json", "{\"weight_map\": {\"a\": 3}}");
  expect_rejected(dir, {"weight_map entry for 'a'"});
  write(dir + "/model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
  expect_rejected(dir, {"invalid shard name"});
}

TEST(CheckpointErrors, DuplicateTensorAcrossShards) {
  const std::string dir = make(false, false, 2);
  fs::remove(dir + "/model.safetensors.index.json");
  rewrite(dir + "/model-00002-of-00002.safetensors", [](std::vector<TensorToWrite>& ts) {
    ts.push_back(f32_tensor("norm.weight", {64}, std::vector<float>(64, 1.0f)));
  });
  expect_rejected(dir, {"tensor 'norm.weight' appears in both"});
}

TEST(CheckpointErrors, Tid2eidOutOfRange) {
  const std::string dir = make(false);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    TensorToWrite* t = find_tensor(ts, "layers.1.ffn.gate.tid2eid");
    const int32_t bad = 4;
    std::memcpy(t->bytes.data() + 4 * 7, &bad, 4);  // token 3, slot 1
  });
  expect_rejected(dir,
                  {"layers.1.ffn.gate.tid2eid", "value 4 at [3, 1]", "not an expert id in [0, 4)"});
}

TEST(CheckpointErrors, Tid2eidFloatDtype) {
  const std::string dir = make(false);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    find_tensor(ts, "layers.0.ffn.gate.tid2eid")->dtype = DType::kF32;
  });
  expect_rejected(dir, {"layers.0.ffn.gate.tid2eid", "expected an integer dtype"});
}

TEST(CheckpointErrors, Fp8WeightMissingScale) {
  const std::string dir = make(true);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    ts.erase(
        std::remove_if(ts.begin(),
                       ts.end(),
                       [](const TensorToWrite& t) { return t.name == "layers.0.attn.wq_a.scale"; }),
        ts.end());
  });
  expect_rejected(dir,
                  {"FP8 tensor layers.0.attn.wq_a.weight",
                   "has no scale tensor "
                   "layers.0.attn.wq_a.scale"});
}

TEST(CheckpointErrors, ScaleWithWrongShape) {
  const std::string dir = make(true);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    TensorToWrite* t = find_tensor(ts, "layers.0.attn.wq_b.scale");  // [4, 1] for 512 x 32
    t->shape = {2, 2};
  });
  expect_rejected(dir, {"layers.0.attn.wq_b.scale", "has shape [2, 2], expected [4, 1]"});
}

TEST(CheckpointErrors, Mxfp4ScaleWrongDtype) {
  const std::string dir = make(true);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    TensorToWrite* t = find_tensor(ts, "layers.2.ffn.experts.1.w2.scale");
    t->dtype = DType::kU8;
  });
  expect_rejected(dir, {"layers.2.ffn.experts.1.w2.scale", "has dtype U8", "expected F8_E8M0"});
}

TEST(CheckpointErrors, Mxfp4NotAllowedOutsideRoutedExperts) {
  const std::string dir = make(true);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    TensorToWrite* t = find_tensor(ts, "layers.0.ffn.shared_experts.w1.weight");
    t->dtype = DType::kI8;
    t->shape = {32, 32};
    t->bytes.resize(32 * 32);
  });
  expect_rejected(dir, {"layers.0.ffn.shared_experts.w1.weight", "has dtype I8"});
}

TEST(CheckpointErrors, IncompleteMtp) {
  const std::string dir = make(true, true);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    ts.erase(std::remove_if(ts.begin(),
                            ts.end(),
                            [](const TensorToWrite& t) {
                              return t.name == "mtp.0.enorm.weight" ||
                                     t.name == "mtp.0.attn.wkv.weight" ||
                                     t.name == "mtp.0.attn.wkv.scale";
                            }),
             ts.end());
  });
  expect_rejected(dir, {"incomplete MTP weights", "mtp.0.enorm.weight", "mtp.0.attn.wkv.weight"});
}

TEST(CheckpointErrors, MtpDuplicateEmbedAndHeadAreIgnored) {
  const std::string dir = make(false, true);
  rewrite(dir + "/model.safetensors", [](std::vector<TensorToWrite>& ts) {
    ts.push_back(f32_tensor("mtp.0.emb.tok_emb.weight", {2}, {1, 2}));
    ts.push_back(f32_tensor("mtp.0.head.weight", {2}, {1, 2}));
  });
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_TRUE((*ck)->has_mtp());
  bool listed = false;
  for (const auto& e : (*ck)->inventory()) listed |= e.name == "mtp.0.head.weight";
  EXPECT_TRUE(listed);
}

TEST(CheckpointErrors, NoSafetensorsFiles) {
  const std::string dir = make(false);
  fs::remove(dir + "/model.safetensors");
  expect_rejected(dir, {"no *.safetensors files"});
}

TEST(CheckpointErrors, NotADirectory) {
  expect_rejected("/nonexistent/model/dir", {"/nonexistent/model/dir", "not a directory"});
}

TEST(CheckpointErrors, QuantizationConfigUnsupported) {
  const std::string dir = make(true);
  edit_config(dir, [](json& j) { j["quantization_config"]["quant_method"] = "awq"; });
  auto ck = Checkpoint::open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(ck.status().message().find("quant_method"), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::model
