// safetensors reader/writers: round trip, the streaming writer and every header corruption.
#include "tensor/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace dsinfer {
namespace {

namespace fs = std::filesystem;

// A fresh per-test directory under the build tree.
std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path p = fs::path(DSI_BINARY_DIR) / "test-tmp" /
               (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// 8-byte little-endian length + header + `data_bytes` bytes of payload.
std::vector<uint8_t> image(const std::string& header,
                           size_t data_bytes,
                           uint64_t len_override = 0,
                           bool use_override = false) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes);
  const uint64_t n = use_override ? len_override : header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  for (size_t i = 0; i < header.size(); ++i) out[8 + i] = static_cast<uint8_t>(header[i]);
  for (size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = static_cast<uint8_t>(i);
  return out;
}

Status parse_status(const std::vector<uint8_t>& img) {
  auto r = SafetensorsFile::parse(img.data(), img.size(), "mem.safetensors");
  return r.status();
}

void expect_error(const std::string& header, size_t data_bytes, const std::string& needle) {
  const Status s = parse_status(image(header, data_bytes));
  EXPECT_FALSE(s.ok()) << header;
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message: " << s.message() << "\nexpected substring: " << needle;
  EXPECT_NE(s.message().find("mem.safetensors"), std::string::npos) << s.message();
}

TEST(Safetensors, RoundTrip) {
  const std::string dir = test_dir();
  const std::string path = dir + "/a.safetensors";
  std::vector<TensorToWrite> ts;
  ts.push_back(f32_tensor("w", {2, 3}, {1, 2, 3, 4, 5, 6}));
  ts.push_back({"b", DType::kBF16, {3}, {1, 2, 3, 4, 5, 6}});
  ts.push_back({"i", DType::kI64, {1}, {7, 0, 0, 0, 0, 0, 0, 0}});
  ts.push_back({"empty", DType::kF32, {0, 4}, {}});
  ts.push_back({"q", DType::kF8E4M3, {1, 1}, {0x38}});
  ASSERT_TRUE(write_safetensors(path, ts, {{"format", "pt"}}).ok());

  // Header is padded so that the data section starts 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  uint8_t len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  EXPECT_EQ(n % 8, 0u);

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const SafetensorsFile& sf = **f;
  EXPECT_EQ(sf.path(), path);
  EXPECT_EQ(sf.tensors().size(), 5u);
  EXPECT_EQ(sf.metadata().at("format"), "pt");
  const TensorInfo* w = sf.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::kF32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->nbytes, 24);
  EXPECT_EQ(w->numel(), 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(load_float(w->data, DType::kF32, i), i + 1.0f);
  const TensorInfo* b = sf.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(std::memcmp(b->data, ts[1].bytes.data(), 6), 0);
  EXPECT_EQ(load_int(sf.find("i")->data, DType::kI64, 0), 7);
  EXPECT_EQ(sf.find("empty")->numel(), 0);
  EXPECT_EQ(sf.find("empty")->nbytes, 0);
  EXPECT_EQ(sf.find("q")->dtype, DType::kF8E4M3);
  EXPECT_EQ(sf.find("nope"), nullptr);
  // Tensors are listed in file order.
  EXPECT_EQ(sf.tensors()[0].name, "w");
}

TEST(Safetensors, ParseMinimalAndPaddedHeader) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<uint8_t> img = image(h + "      ", 8);
  auto f = SafetensorsFile::parse(img.data(), img.size(), "x");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->find("a")->nbytes, 8);
  // Empty header object: no tensors.
  std::vector<uint8_t> img2 = image("{}", 0);
  auto g = SafetensorsFile::parse(img2.data(), img2.size(), "x");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE((*g)->tensors().empty());
}

TEST(Safetensors, HeaderCorruptions) {
  const std::string ok_t = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  expect_error("{", 0, "not valid JSON");
  expect_error("[1,2]", 0, "must be a JSON object");
  expect_error(R"({"a":1})", 8, "'a': entry must be an object");
  expect_error(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8, "'a': missing dtype");
  expect_error(
      R"({"a":{"dtype":3,"shape":[2],"data_offsets":[0,8]}})", 8, "dtype must be a string");
  expect_error(
      R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8, "'a': unknown dtype 'F31'");
  expect_error(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8, "'a': missing shape");
  expect_error(
      R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8, "shape must be an array");
  expect_error(
      R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "non-negative integers");
  expect_error(
      R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, "non-negative integers");
  expect_error(
      R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8, "non-negative integers");
  expect_error(R"({"a":{"dtype":"F32","shape":[2]}})", 8, "'a': missing data_offsets");
  expect_error(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "two non-negative integers");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})",
               8,
               "two non-negative integers");
  expect_error(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-1,8]}})", 8, "two non-negative integers");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "end before begin");
  expect_error(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 16, "needs 12");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
               4,
               "extend past the data section");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               16,
               "overlaps");
  expect_error(R"({"a":)" + ok_t + R"(,"a":)" + ok_t + "}", 8, "'a' appears more than once");
  expect_error(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],)"
               R"("data_offsets":[0,8]}})",
               8,
               "too large");
  expect_error(R"({"a":{"dtype":"F32","shape":[2305843009213693952],"data_offsets":[0,8]}})",
               8,
               "too large");
  expect_error(R"({"":)" + ok_t + "}", 8, "empty name");
  expect_error(R"({"__metadata__":[1]})", 0, "__metadata__ must be an object");
  expect_error(R"({"__metadata__":{"k":1}})", 0, "__metadata__ entry 'k' must be a string");
  expect_error(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],)"
               R"("data_offsets":[0,4]}})",
               4,
               "dimensions");
}

TEST(Safetensors, LengthPrefixCorruptions) {
  // Too short for the length prefix.
  std::vector<uint8_t> tiny = {1, 2, 3};
  Status s = parse_status(tiny);
  EXPECT_NE(s.message().find("too small"), std::string::npos) << s.message();
  // Header length beyond the file.
  const std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  s = parse_status(image(h, 8, h.size() + 100, true));
  EXPECT_NE(s.message().find("exceeds the file size"), std::string::npos) << s.message();
  // Header length above the 100 MB cap (checked before the file size).
  s = parse_status(image(h, 8, 200ull * 1000 * 1000, true));
  EXPECT_NE(s.message().find("100 MB"), std::string::npos) << s.message();
  // Huge length that would overflow naive arithmetic.
  s = parse_status(image(h, 8, ~0ull, true));
  EXPECT_FALSE(s.ok());
}

TEST(Safetensors, ZeroSizedTensorsMayShareOffsets) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<uint8_t> img = image(h, 8);
  auto f = SafetensorsFile::parse(img.data(), img.size(), "x");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->find("a")->numel(), 0);
}

TEST(Safetensors, OpenErrors) {
  const std::string dir = test_dir();
  auto missing = SafetensorsFile::open(dir + "/nope.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.safetensors"), std::string::npos);

  const std::string empty = dir + "/empty.safetensors";
  { std::ofstream(empty, std::ios::binary); }
  auto e = SafetensorsFile::open(empty);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("too small"), std::string::npos);

  auto d = SafetensorsFile::open(dir);
  ASSERT_FALSE(d.ok());

  // Truncated: a valid file with its last bytes cut off.
  const std::string path = dir + "/t.safetensors";
  ASSERT_TRUE(write_safetensors(path, {f32_tensor("w", {4}, {1, 2, 3, 4})}).ok());
  fs::resize_file(path, fs::file_size(path) - 3);
  auto t = SafetensorsFile::open(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("'w'"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("truncated"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find(path), std::string::npos);
}

TEST(Safetensors, WriterRejectsBadInput) {
  const std::string dir = test_dir();
  EXPECT_FALSE(
      write_safetensors(dir + "/a.safetensors", {{"w", DType::kF32, {2}, {1, 2, 3}}}).ok());
  EXPECT_FALSE(write_safetensors(dir + "/a.safetensors",
                                 {f32_tensor("w", {1}, {1}), f32_tensor("w", {1}, {2})})
                   .ok());
  EXPECT_FALSE(write_safetensors(dir + "/a.safetensors", {f32_tensor("", {1}, {1})}).ok());
  EXPECT_FALSE(write_safetensors(dir + "/a.safetensors", {f32_tensor("\xff", {1}, {1})}).ok());
  EXPECT_FALSE(
      write_safetensors(dir + "/no/such/dir/a.safetensors", {f32_tensor("w", {1}, {1})}).ok());
}

TEST(SafetensorsWriter, PiecewiseFromSeveralThreadsMatchesTheInMemoryWriter) {
  const std::string dir = test_dir();
  std::vector<TensorToWrite> ts;
  std::vector<float> big(10000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  ts.push_back(f32_tensor("big", {100, 100}, big));
  ts.push_back({"b", DType::kBF16, {3}, {1, 2, 3, 4, 5, 6}});
  ts.push_back({"empty", DType::kF32, {0}, {}});
  ts.push_back({"i8", DType::kI8, {5}, {9, 8, 7, 6, 5}});
  ASSERT_TRUE(write_safetensors(dir + "/ref.safetensors", ts, {{"format", "pt"}}).ok());

  std::vector<TensorSpec> specs;
  for (const auto& t : ts) specs.push_back({t.name, t.dtype, t.shape});
  auto w = SafetensorsWriter::create(dir + "/s.safetensors", specs, {{"format", "pt"}});
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_EQ((*w)->num_tensors(), 4u);
  EXPECT_EQ((*w)->tensor_bytes(0), 40000);
  // Rows of `big` in reverse order from 4 threads; the small tensors byte by byte.
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&, t] {
      for (int r = 99 - t; r >= 0; r -= 4) {
        ASSERT_TRUE((*w)->write(0, r * 400, ts[0].bytes.data() + r * 400, 400).ok());
      }
    });
  }
  for (auto& th : pool) th.join();
  for (size_t i = 1; i < ts.size(); ++i) {
    for (size_t k = ts[i].bytes.size(); k-- > 0;) {
      ASSERT_TRUE((*w)->write(i, static_cast<int64_t>(k), &ts[i].bytes[k], 1).ok());
    }
  }
  ASSERT_TRUE((*w)->finish().ok());
  std::ifstream a(dir + "/ref.safetensors", std::ios::binary),
      b(dir + "/s.safetensors", std::ios::binary);
  const std::string ra((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
  const std::string rb((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>());
  EXPECT_EQ(ra, rb);
  EXPECT_EQ(fs::file_size(dir + "/s.safetensors"), rb.size());
  auto f = SafetensorsFile::open(dir + "/s.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(static_cast<const float*>(f.value()->find("big")->data)[9999], 4999.5f);
}

TEST(SafetensorsWriter, RejectsOutOfRangeWritesAndIncompleteFiles) {
  const std::string dir = test_dir();
  auto w = SafetensorsWriter::create(dir + "/a.safetensors",
                                     {{"x", DType::kF32, {2}}, {"y", DType::kI8, {3}}});
  ASSERT_TRUE(w.ok());
  const uint8_t buf[16] = {};
  EXPECT_FALSE((*w)->write(0, 4, buf, 8).ok());   // past the end of x
  EXPECT_FALSE((*w)->write(2, 0, buf, 1).ok());   // no tensor 2
  EXPECT_FALSE((*w)->write(1, -1, buf, 1).ok());  // negative offset
  ASSERT_TRUE((*w)->write(0, 0, buf, 8).ok());
  ASSERT_TRUE((*w)->write(1, 0, buf, 2).ok());
  const Status s = (*w)->finish();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'y' got 2 of its 3 bytes"), std::string::npos) << s.message();
  EXPECT_FALSE((*w)->write(1, 2, buf, 1).ok());  // closed

  EXPECT_FALSE(SafetensorsWriter::create(dir + "/b.safetensors", {{"x", DType::kF32, {-1}}}).ok());
  EXPECT_FALSE(SafetensorsWriter::create(dir + "/b.safetensors",
                                         {{"x", DType::kF32, {1}}, {"x", DType::kF32, {1}}})
                   .ok());
  EXPECT_FALSE(SafetensorsWriter::create(dir + "/no/such/b.safetensors", {}).ok());
}

}  // namespace
}  // namespace dsinfer
