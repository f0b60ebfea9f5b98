// CUDA kernels vs the CPU path, bit for bit: FP8 block-128 and MXFP4 dequantisation against
// MatrixRef::dequant_row, 1x128 FP8 activation quantisation against numeric::fp8_block_quantize.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/device.h"
#include "numeric/quant.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {
namespace {

// Device copy of a host vector, freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    if (n_ == 0)
      return;
    DSI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
    DSI_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_)
      DSI_CUDA_CHECK(cudaFree(p_));
  }
  T* get() const { return p_; }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_)
      DSI_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  size_t n_ = 0;
  T* p_ = nullptr;
};

// Guard elements after every output: the kernels must not write past the logical end.
constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xa5;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Bit equality, except that any NaN matches any NaN (GPUs produce the canonical NaN).
bool same_bits(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b);
}

// Compares the device result with the CPU MatrixRef over all rows; the guard must be intact.
void expect_matches_cpu(const MatrixRef& cpu, const std::vector<float>& gpu) {
  std::vector<float> row(static_cast<size_t>(cpu.cols));
  int bad = 0;
  for (int64_t r = 0; r < cpu.rows; ++r) {
    cpu.dequant_row(r, row.data());
    for (int64_t c = 0; c < cpu.cols; ++c) {
      const float g = gpu[static_cast<size_t>(r * cpu.cols + c)];
      if (!same_bits(row[c], g) && bad++ < 5) {
        ADD_FAILURE() << "(" << r << ", " << c << "): cpu " << std::hexfloat << row[c] << " gpu "
                      << g;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  for (size_t i = static_cast<size_t>(cpu.rows * cpu.cols); i < gpu.size(); ++i) {
    ASSERT_EQ(bits_of(gpu[i]), 0x7f7f7f7fu) << "write past the end at " << i;
  }
}

std::vector<float> guarded_output(int64_t n) {
  return std::vector<float>(static_cast<size_t>(n) + kGuard, std::bit_cast<float>(0x7f7f7f7fu));
}

class GpuOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available())
      GTEST_SKIP() << "no CUDA device";
  }
};

const int64_t kSizes[] = {1, 3, 7, 129, 257, 733};

// Random E8M0 scale bytes, mostly moderate, with the edges mixed in: 0 (2^-127, subnormal
// products), 254 (2^127, overflow to inf) and 0xff (NaN).
uint8_t random_scale_byte(std::mt19937& rng) {
  const uint32_t pick = rng() % 64;
  if (pick == 0)
    return 0;
  if (pick == 1)
    return 254;
  if (pick == 2)
    return 0xff;
  if (pick == 3)
    return static_cast<uint8_t>(1 + rng() % 20);
  return static_cast<uint8_t>(110 + rng() % 30);
}

// ---- device query
// --------------------------------------------------------------------------------

TEST(GpuDevice, AvailabilityIsCleanWithoutGpu) {
  const bool avail = cuda_available();  // must not abort on GPU-less machines
  EXPECT_EQ(avail, cuda_device_count() > 0);
  EXPECT_EQ(query_device(-1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(query_device(cuda_device_count()).status().code(), StatusCode::kNotFound);
  if (!avail) {
    EXPECT_EQ(query_device(0).status().code(), StatusCode::kNotFound);
  }
}

TEST_F(GpuOpsTest, QueryDevice) {
  auto info = query_device(0);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_FALSE(info->name.empty());
  EXPECT_GE(info->sm_major, 7);
  EXPECT_GT(info->total_memory, 0);
  EXPECT_GT(info->sm_count, 0);
  std::printf("device 0: %s, sm_%d%d, %d SMs, %.1f GiB\n",
              info->name.c_str(),
              info->sm_major,
              info->sm_minor,
              info->sm_count,
              static_cast<double>(info->total_memory) / (1 << 30));
}

TEST(GpuStatus, CudaStatusMapsErrors) {
  EXPECT_TRUE(cuda_status(cudaSuccess, "x").ok());
  const Status oom = cuda_status(cudaErrorMemoryAllocation, "alloc");
  EXPECT_EQ(oom.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("alloc: cudaErrorMemoryAllocation"), std::string::npos);
  EXPECT_EQ(cuda_status(cudaErrorInvalidValue, "y").code(), StatusCode::kInternal);
}

// ---- FP8 block-128 weights
// -----------------------------------------------------------------------

void run_fp8(int64_t rows, int64_t cols, bool f32_scales, uint32_t seed) {
  SCOPED_TRACE("fp8 " + std::to_string(rows) + "x" + std::to_string(cols) +
               (f32_scales ? " f32 scales" : " e8m0 scales"));
  std::mt19937 rng(seed);
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  for (auto& b : codes) b = static_cast<uint8_t>(rng());  // every code incl. NaN and -0
  const int64_t srows = (rows + 127) / 128;
  const int64_t scols = (cols + 127) / 128;
  std::vector<uint8_t> s8(static_cast<size_t>(srows * scols));
  std::vector<float> s32(s8.size());
  for (auto& b : s8) b = random_scale_byte(rng);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (auto& f : s32) f = std::exp2(u(rng) * 10.0f) * (1.0f + u(rng) / 7.0f);  // not powers of 2

  MatrixRef cpu;
  cpu.format = WeightFormat::kFp8Block128;
  cpu.dtype = DType::kF8E4M3;
  cpu.scale_dtype = f32_scales ? DType::kF32 : DType::kF8E8M0;
  cpu.data = codes.data();
  cpu.scale = f32_scales ? static_cast<const void*>(s32.data()) : s8.data();
  cpu.rows = rows;
  cpu.cols = cols;

  DeviceBuffer<uint8_t> d_codes(codes);
  DeviceBuffer<uint8_t> d_s8(s8);
  DeviceBuffer<float> d_s32(s32);
  DeviceBuffer<float> d_out(guarded_output(rows * cols));
  MatrixRef dev = cpu;
  dev.data = d_codes.get();
  dev.scale = f32_scales ? static_cast<const void*>(d_s32.get()) : d_s8.get();
  const Status st = dequant_matrix(dev, d_out.get(), nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  DSI_CUDA_CHECK(cudaDeviceSynchronize());
  expect_matches_cpu(cpu, d_out.download());
}

TEST_F(GpuOpsTest, Fp8Block128DequantMatchesCpu) {
  uint32_t seed = 1;
  for (int64_t rows : kSizes) {
    for (int64_t cols : kSizes) {
      run_fp8(rows, cols, false, seed++);
      run_fp8(rows, cols, true, seed++);
    }
  }
}

// ---- MXFP4 weights
// -------------------------------------------------------------------------------

void run_mxfp4(int64_t rows, int64_t cols, uint32_t seed) {
  SCOPED_TRACE("mxfp4 " + std::to_string(rows) + "x" + std::to_string(cols));
  std::mt19937 rng(seed);
  std::vector<uint8_t> packed(static_cast<size_t>(rows * cols / 2));
  for (auto& b : packed) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> scales(static_cast<size_t>(rows * cols / 32));
  for (auto& b : scales) b = random_scale_byte(rng);

  MatrixRef cpu;
  cpu.format = WeightFormat::kMxfp4;
  cpu.dtype = DType::kI8;
  cpu.scale_dtype = DType::kF8E8M0;
  cpu.data = packed.data();
  cpu.scale = scales.data();
  cpu.rows = rows;
  cpu.cols = cols;

  DeviceBuffer<uint8_t> d_packed(packed);
  DeviceBuffer<uint8_t> d_scales(scales);
  DeviceBuffer<float> d_out(guarded_output(rows * cols));
  MatrixRef dev = cpu;
  dev.data = d_packed.get();
  dev.scale = d_scales.get();
  const Status st = dequant_matrix(dev, d_out.get(), nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  DSI_CUDA_CHECK(cudaDeviceSynchronize());
  expect_matches_cpu(cpu, d_out.download());
}

TEST_F(GpuOpsTest, Mxfp4DequantMatchesCpu) {
  uint32_t seed = 100;
  for (int64_t rows : kSizes) {
    for (int64_t cols_over_32 : kSizes) run_mxfp4(rows, 32 * cols_over_32, seed++);
  }
}

TEST(GpuOpsArgs, Mxfp4RejectsColsNotMultipleOf32) {
  Mxfp4DequantParams p;
  p.rows = 3;
  p.cols = 48;
  EXPECT_EQ(launch_mxfp4_dequant(p, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(GpuOpsArgs, EmptyShapesLaunchNothing) {
  // Validated before any CUDA call, so these hold on GPU-less machines too.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{0, 0}, {0, 128}, {5, 0}}) {
    Fp8BlockDequantParams f;
    f.rows = rows;
    f.cols = cols;
    EXPECT_TRUE(launch_fp8_block_dequant(f, nullptr).ok());
    Mxfp4DequantParams m;
    m.rows = rows;
    m.cols = cols;
    EXPECT_TRUE(launch_mxfp4_dequant(m, nullptr).ok());
    ActQuantParams a;
    a.rows = rows;
    a.cols = cols;
    EXPECT_TRUE(launch_act_quant_fp8(a, nullptr).ok());
  }
  Fp8BlockDequantParams neg;
  neg.rows = -1;
  neg.cols = 4;
  EXPECT_EQ(launch_fp8_block_dequant(neg, nullptr).code(), StatusCode::kInvalidArgument);
  ActQuantParams nul;
  nul.rows = 2;
  nul.cols = 2;
  EXPECT_EQ(launch_act_quant_fp8(nul, nullptr).code(), StatusCode::kInvalidArgument);
  MatrixRef bf16;
  bf16.format = WeightFormat::kFloat;
  bf16.dtype = DType::kBF16;
  EXPECT_EQ(dequant_matrix(bf16, nullptr, nullptr).code(), StatusCode::kUnimplemented);
}

TEST_F(GpuOpsTest, FloatF32WeightIsCopied) {
  std::vector<float> w(7 * 129);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.25f - 3.0f;
  MatrixRef cpu;
  cpu.data = w.data();
  cpu.rows = 7;
  cpu.cols = 129;
  DeviceBuffer<float> d_w(w);
  DeviceBuffer<float> d_out(guarded_output(7 * 129));
  MatrixRef dev = cpu;
  dev.data = d_w.get();
  ASSERT_TRUE(dequant_matrix(dev, d_out.get(), nullptr).ok());
  DSI_CUDA_CHECK(cudaDeviceSynchronize());
  expect_matches_cpu(cpu, d_out.download());
}

// ---- 1x128 FP8 activation quantisation
// -----------------------------------------------------------

// Rows with very different magnitudes, rows under the 1e-4 floor, zeros of both signs, values
// on exact E4M3 ties, and per-block amax of exactly 448 * 2^k. Finite only: for NaN/inf inputs
// CPU and GPU agree on "NaN code" but not on its sign bit (GPUs make canonical NaNs).
std::vector<float> make_activations(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int kind = static_cast<int>(r % 4);
    const int k = static_cast<int>(rng() % 60) - 30;
    for (int64_t c = 0; c < cols; ++c) {
      float v = std::ldexp(normal(rng), k);
      if (kind == 1)
        v = std::ldexp(normal(rng), -20);  // amax below the floor
      if (kind == 2 && c % 5 == 0)
        v = (c % 2) ? -0.0f : 0.0f;
      if (kind == 3) {
        // s = 2^k when the block's amax is 448 * 2^k; (m + 1/2) * 2^(k-9) are subnormal ties.
        v = c % 128 == 0 ? std::ldexp(448.0f, k)
                         : std::ldexp(static_cast<float>(rng() % 8) + 0.5f, k - 9);
        if (c % 3 == 0)
          v = -v;
      }
      x[static_cast<size_t>(r * cols + c)] = v;
    }
  }
  return x;
}

void run_act_quant(int64_t rows, int64_t cols, uint32_t seed) {
  SCOPED_TRACE("act_quant " + std::to_string(rows) + "x" + std::to_string(cols));
  const int64_t nkb = (cols + 127) / 128;
  const std::vector<float> x = make_activations(rows, cols, seed);
  std::vector<uint8_t> want_codes(static_cast<size_t>(rows * cols));
  std::vector<uint8_t> want_scales(static_cast<size_t>(rows * nkb));
  for (int64_t r = 0; r < rows; ++r) {
    numeric::fp8_block_quantize(
        x.data() + r * cols, cols, 128, want_codes.data() + r * cols, want_scales.data() + r * nkb);
  }
  DeviceBuffer<float> d_x(x);
  DeviceBuffer<uint8_t> d_codes(std::vector<uint8_t>(want_codes.size() + kGuard, kGuardByte));
  DeviceBuffer<uint8_t> d_scales(std::vector<uint8_t>(want_scales.size() + kGuard, kGuardByte));
  ActQuantParams p;
  p.x = d_x.get();
  p.rows = rows;
  p.cols = cols;
  p.codes = d_codes.get();
  p.scale_bytes = d_scales.get();
  const Status st = launch_act_quant_fp8(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  DSI_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> codes = d_codes.download();
  const std::vector<uint8_t> scales = d_scales.download();
  int bad = 0;
  for (size_t i = 0; i < want_codes.size(); ++i) {
    if (codes[i] != want_codes[i] && bad++ < 5) {
      ADD_FAILURE() << "code " << i << ": x " << std::hexfloat << x[i] << " cpu "
                    << int{want_codes[i]} << " gpu " << int{codes[i]};
    }
  }
  for (size_t i = 0; i < want_scales.size(); ++i) {
    if (scales[i] != want_scales[i] && bad++ < 5) {
      ADD_FAILURE() << "scale " << i << ": cpu " << int{want_scales[i]} << " gpu "
                    << int{scales[i]};
    }
  }
  EXPECT_EQ(bad, 0);
  for (size_t i = want_codes.size(); i < codes.size(); ++i) ASSERT_EQ(codes[i], kGuardByte);
  for (size_t i = want_scales.size(); i < scales.size(); ++i) ASSERT_EQ(scales[i], kGuardByte);
}

TEST_F(GpuOpsTest, ActQuantFp8MatchesCpu) {
  uint32_t seed = 1000;
  for (int64_t rows : kSizes) {
    for (int64_t cols : {1, 3, 7, 127, 128, 129, 257, 733}) run_act_quant(rows, cols, seed++);
  }
}

TEST_F(GpuOpsTest, GridStrideLoops) {
  // More (row, block) pairs than the act_quant grid covers (8192 x 8 warps), and more rows than
  // grid.y (65535) for the dequant kernels.
  run_act_quant(4000, 129 * 16 + 5, 4242);
  run_fp8(66000, 129, false, 4243);
  run_mxfp4(66000, 64, 4244);
}

}  // namespace
}  // namespace dsinfer::cuda
