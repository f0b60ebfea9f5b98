// The `device` Engram placement of the CUDA V4.1 backend: the device gather
// (launch_v41_engram_gather) gives the CPU store's rows bit for bit (the fixture's tables at
// random row ids; synthetic tables with every E4M3 code, every E8M0 scale including the NaN ones,
// and the unscaled dtypes), and a V4.1 forward with the tables on the device gives the same
// logits bit for bit as with the rows gathered on the host (both fixtures, both layouts, both
// numerics; whole prompt, chunks of 7 then decode steps; one backend switched per forward as
// `bench --engram-compare` does). Needs a GPU (skips otherwise).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu_v41/backend.h"
#include "backend/cpu_v41/engram_store.h"
#include "backend/cuda_v41/backend.h"
#include "kernels/cuda/v41.h"
#include "model_test_util.h"
#include "model_v41/checkpoint.h"
#include "numeric/float_formats.h"
#include "state/sequence_state.h"
#include "tensor/dtype.h"
#include "tensor/safetensors.h"
#include "test_util.h"

namespace dsinfer {
namespace {

namespace fs = std::filesystem;

using cpu_v41::EngramPlacement;
using cuda::test::DevVec;
using gpu_test::source_path;

// Bitwise float comparison (NaN payloads included); the first difference in the message.
void expect_same_bits(const std::vector<float>& want,
                      const std::vector<float>& got,
                      const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    if (numeric::f32_bits(want[i]) != numeric::f32_bits(got[i])) {
      ADD_FAILURE() << what << ": value " << i << " is " << got[i] << " (0x" << std::hex
                    << numeric::f32_bits(got[i]) << "), the CPU's " << want[i] << " (0x"
                    << numeric::f32_bits(want[i]) << ")";
      return;
    }
  }
}

// The device gather of `rows` from a table whose bytes are `data` / `scale` on the host.
std::vector<float> device_gather(const model_v41::EngramTable& t,
                                 const std::vector<uint8_t>& data,
                                 const std::vector<uint8_t>& scale,
                                 const std::vector<int64_t>& rows) {
  DevVec<uint8_t> ddata(data), dscale(scale);
  DevVec<int64_t> drows(rows);
  DevVec<float> out(rows.size() * static_cast<size_t>(t.dim));
  cuda::V41EngramGatherParams p;
  p.data = ddata.get();
  p.scale = dscale.get();
  p.fp8 = t.fp8;
  p.dtype = t.data_dtype;
  p.table_rows = t.rows;
  p.dim = t.dim;
  p.rows = drows.get();
  p.n = static_cast<int64_t>(rows.size());
  p.out = out.get();
  const Status s = cuda::launch_v41_engram_gather(p, nullptr);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.download();
}

// The host's rows (model_v41::EngramTable::row, what the CPU store's gather calls).
std::vector<float> host_rows(const model_v41::EngramTable& t, const std::vector<int64_t>& rows) {
  std::vector<float> out(rows.size() * static_cast<size_t>(t.dim));
  for (size_t i = 0; i < rows.size(); ++i) t.row(rows[i], out.data() + i * t.dim);
  return out;
}

TEST(CudaV41Engram, DeviceGatherEqualsTheCpuStoreOnTheFixtureTables) {
  SKIP_WITHOUT_GPU();
  for (const char* layout : {"official", "hf"}) {
    const std::string dir = source_path(std::string("tests/fixtures/v41-tiny/") + layout);
    if (!fs::exists(dir))
      GTEST_SKIP() << dir << " missing";
    auto ck = model_v41::V41Checkpoint::open(dir);
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    const model_v41::V41Config& c = (*ck)->config();
    ASSERT_FALSE(c.engram_layer_ids.empty());
    auto store = cpu_v41::EngramStore::create(c, (*ck)->weights(), {EngramPlacement::kHost, 0});
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    std::mt19937_64 g(11);
    for (int t = 0; t < (*store)->num_tables(); ++t) {
      const model_v41::EngramTable& tab =
          (*ck)->weights().layers[static_cast<size_t>(c.engram_layer_ids[t])].engram.table;
      const int64_t elem = tab.fp8 ? 1 : dtype_size(static_cast<DType>(tab.data_dtype));
      const auto* d = static_cast<const uint8_t*>(tab.data);
      std::vector<uint8_t> data(d, d + tab.rows * tab.dim * elem), scale;
      if (tab.fp8) {
        const auto* s = static_cast<const uint8_t*>(tab.scale);
        scale.assign(s, s + tab.rows * (tab.dim / 32));
      }
      // Random rows with repeats, and both ends of the table.
      std::vector<int64_t> rows = {0, tab.rows - 1};
      for (int i = 0; i < 300; ++i) rows.push_back(static_cast<int64_t>(g() % tab.rows));
      std::vector<float> want(rows.size() * static_cast<size_t>((*store)->dim()));
      (*store)->gather(t, rows, want.data());
      expect_same_bits(want,
                       device_gather(tab, data, scale, rows),
                       std::string(layout) + " table " + std::to_string(t));
    }
  }
}

TEST(CudaV41Engram, DeviceGatherEqualsTheHostDequantisationForEveryCode) {
  SKIP_WITHOUT_GPU();
  // Scaled FP8: row r holds every E4M3 code (NaN 0x7f / 0xff included) under scales that run
  // through every E8M0 byte (0 = 2^-127 subnormal, 0xff = NaN); the last row pairs both NaN
  // codes with NaN, finite and subnormal scales (which NaN's bits come out).
  const int64_t dim = 256, nrows = 65;
  std::vector<uint8_t> data(static_cast<size_t>(nrows * dim)), scale(nrows * dim / 32);
  for (int64_t r = 0; r < nrows; ++r) {
    for (int64_t c = 0; c < dim; ++c) {
      data[static_cast<size_t>(r * dim + c)] =
          r == nrows - 1 ? (c % 2 ? 0xff : 0x7f) : static_cast<uint8_t>((c + 37 * r) & 255);
    }
  }
  for (size_t i = 0; i < scale.size(); ++i) scale[i] = static_cast<uint8_t>((i * 7) & 255);
  const uint8_t last_scales[8] = {0xff, 0x7f, 0xff, 0x00, 0xff, 0x7f, 0xff, 0x00};
  std::memcpy(scale.data() + (nrows - 1) * (dim / 32), last_scales, 8);
  model_v41::EngramTable t;
  t.data = data.data();
  t.scale = scale.data();
  t.rows = nrows;
  t.dim = dim;
  t.fp8 = true;
  t.data_dtype = static_cast<int>(DType::kF8E4M3);
  std::vector<int64_t> rows;
  for (int64_t r = nrows - 1; r >= 0; --r) rows.push_back(r);
  rows.push_back(5);
  expect_same_bits(host_rows(t, rows), device_gather(t, data, scale, rows), "fp8 every code");
  // Unscaled tables (a transformers checkpoint saved without quantisation).
  std::mt19937 g(5);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3}) {
    const int64_t elem = dtype_size(dt);
    std::vector<uint8_t> raw(static_cast<size_t>(nrows * dim * elem));
    for (auto& b : raw) b = static_cast<uint8_t>(g());
    model_v41::EngramTable u;
    u.data = raw.data();
    u.rows = nrows;
    u.dim = dim;
    u.fp8 = false;
    u.data_dtype = static_cast<int>(dt);
    expect_same_bits(host_rows(u, rows),
                     device_gather(u, raw, {}, rows),
                     std::string("unscaled ") + dtype_name(dt));
  }
  // Launcher checks: a dtype the kernel does not read, FP8 rows not a multiple of 32.
  cuda::V41EngramGatherParams bad;
  bad.dtype = static_cast<int>(DType::kI32);
  bad.n = 1;
  bad.dim = 32;
  EXPECT_EQ(cuda::launch_v41_engram_gather(bad, nullptr).code(), StatusCode::kUnimplemented);
  bad.fp8 = true;
  bad.dim = 48;
  EXPECT_EQ(cuda::launch_v41_engram_gather(bad, nullptr).code(), StatusCode::kInvalidArgument);
}

// Every row's logits of `ids` fed in chunks of `chunk` (0 = one forward) through a fresh state.
std::vector<float> run(backend::Model& m, const std::vector<int32_t>& ids, int64_t chunk) {
  const state::StateShape& shape = *m.state_shape();
  auto arena = state::PageArena::growable(state::default_page_bytes(shape), m.state_storage());
  state::SequenceState st(shape, arena.get(), 0);
  std::vector<float> logits;
  const int64_t T = static_cast<int64_t>(ids.size());
  const int64_t step = chunk == 0 ? T : chunk;
  for (int64_t b = 0; b < T; b += step) {
    const int64_t n = std::min(step, T - b);
    backend::ForwardOptions o;
    backend::ForwardOutputs out;
    const Status s =
        m.forward(st, std::span<const int32_t>(ids.data() + b, static_cast<size_t>(n)), o, &out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok())
      return {};
    logits.insert(logits.end(), out.logits.begin(), out.logits.end());
  }
  return logits;
}

// The fixture's prompt (input_ids of <fixture>/reference.safetensors).
std::vector<int32_t> fixture_ids(const std::string& fixture) {
  std::vector<int32_t> ids;
  auto f = SafetensorsFile::open(source_path(fixture) + "/reference.safetensors");
  EXPECT_TRUE(f.ok());
  if (!f.ok())
    return ids;
  const TensorInfo* t = (*f)->find("input_ids");
  EXPECT_NE(t, nullptr);
  if (t == nullptr)
    return ids;
  for (int64_t i = 0; i < t->numel(); ++i)
    ids.push_back(static_cast<int32_t>(static_cast<const int64_t*>(t->data)[i]));
  return ids;
}

TEST(CudaV41Engram, DevicePlacementGivesBitIdenticalLogits) {
  SKIP_WITHOUT_GPU();
  for (const auto& [fixture, layout] : {std::pair{"tests/fixtures/v41-tiny", "official"},
                                        std::pair{"tests/fixtures/v41-tiny", "hf"},
                                        std::pair{"tests/fixtures/v41-tiny-b", "official"}}) {
    const std::string dir = source_path(std::string(fixture) + "/" + layout);
    if (!fs::exists(dir)) {
      std::printf("[engram] %s missing, skipped\n", dir.c_str());
      continue;
    }
    for (model::Numerics nm : {model::Numerics::kReference, model::Numerics::kDeepSeek}) {
      const std::string what = std::string(fixture) + "/" + layout + " " + model::numerics_name(nm);
      cpu_v41::V41BackendOptions o;
      o.numerics = nm;
      o.engram.placement = EngramPlacement::kHost;
      auto host = gpu_v41::CudaV41Backend::open(dir, o);
      ASSERT_TRUE(host.ok()) << host.status().to_string();
      o.engram.placement = EngramPlacement::kDevice;
      auto dev = gpu_v41::CudaV41Backend::open(dir, o);
      ASSERT_TRUE(dev.ok()) << dev.status().to_string();
      EXPECT_FALSE((*host)->engram_on_device());
      EXPECT_TRUE((*dev)->engram_on_device());
      EXPECT_EQ((*host)->engram_device_bytes(), 0);
      // The device placement keeps no host copy: its store is the checkpoint's map.
      EXPECT_EQ((*dev)->cpu().v41().engram_store().host_bytes(), 0);
      if (!(*dev)->cpu().v41().config().engram_layer_ids.empty()) {
        EXPECT_GT((*dev)->engram_device_bytes(), 0);
        // Without the tables uploaded, the switch is refused.
        EXPECT_EQ((*host)->set_engram_on_device(true).code(), StatusCode::kFailedPrecondition);
      } else {  // v41-tiny-b has no Engram layer: nothing to upload, nothing to refuse
        EXPECT_EQ((*dev)->engram_device_bytes(), 0);
      }
      const std::vector<int32_t> ids = fixture_ids(fixture);
      ASSERT_FALSE(ids.empty());
      for (int64_t chunk : {int64_t{0}, int64_t{7}, int64_t{1}}) {
        const std::vector<float> a = run(**host, ids, chunk);
        const std::vector<float> again = run(**host, ids, chunk);
        ASSERT_FALSE(a.empty()) << what;
        // The forward must repeat itself bit for bit for the comparison below to mean anything.
        ASSERT_EQ(a, again) << what << ": the host placement's forward is not reproducible";
        const std::vector<float> b = run(**dev, ids, chunk);
        EXPECT_EQ(a, b) << what << " chunk " << chunk << ": device placement logits differ";
      }
    }
  }
}

TEST(CudaV41Engram, OneBackendSwitchedPerForward) {
  SKIP_WITHOUT_GPU();
  const std::string dir = source_path("tests/fixtures/v41-tiny/official");
  if (!fs::exists(dir))
    GTEST_SKIP() << dir << " missing";
  cpu_v41::V41BackendOptions o;
  o.numerics = model::Numerics::kDeepSeek;
  gpu_v41::CudaV41Options co;
  co.engram_both = true;  // what `bench --engram-compare` opens
  auto m = gpu_v41::CudaV41Backend::open(dir, o, co);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_FALSE((*m)->engram_on_device());  // auto: rows from the host store
  EXPECT_GT((*m)->cpu().v41().engram_store().host_bytes(), 0);
  const std::vector<int32_t> ids = fixture_ids("tests/fixtures/v41-tiny");
  ASSERT_FALSE(ids.empty());
  const std::vector<float> host = run(**m, ids, 5);
  ASSERT_TRUE((*m)->set_engram_on_device(true).ok());
  const std::vector<float> dev = run(**m, ids, 5);
  ASSERT_TRUE((*m)->set_engram_on_device(false).ok());
  const std::vector<float> host_again = run(**m, ids, 5);
  ASSERT_FALSE(host.empty());
  EXPECT_EQ(host, dev);
  EXPECT_EQ(host, host_again);
}

}  // namespace
}  // namespace dsinfer
