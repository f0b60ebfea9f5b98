// Shared helpers of the GPU op tests: device vectors, the skip-without-GPU fixture, random data,
// weights in every checkpoint format (host MatrixRef + device copy), and tolerance checks.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "numeric/float_formats.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda::test {

// Device copy of a host vector, freed on destruction (plain cudaMalloc: the tests must not depend
// on the allocator they also test).
template <typename T>
class DevVec {
 public:
  DevVec() = default;
  explicit DevVec(const std::vector<T>& host) : n_(host.size()) {
    if (n_ == 0)
      return;
    DSI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
    DSI_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit DevVec(size_t n, T fill = T()) : DevVec(std::vector<T>(n, fill)) {}
  DevVec(DevVec&& o) noexcept : n_(o.n_), p_(o.p_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  DevVec& operator=(DevVec&& o) noexcept {
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
    return *this;
  }
  DevVec(const DevVec&) = delete;
  DevVec& operator=(const DevVec&) = delete;
  ~DevVec() {
    if (p_)
      DSI_CUDA_CHECK(cudaFree(p_));
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
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

inline void sync() {
  DSI_CUDA_CHECK(cudaDeviceSynchronize());
}

// DSINFER_GPU_TEST_SMALL=1 trims the largest shapes (for compute-sanitizer runs).
inline bool small_mode() {
  const char* v = std::getenv("DSINFER_GPU_TEST_SMALL");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available())
      GTEST_SKIP() << "no CUDA device";
  }
};

#define DSI_EXPECT_OK(expr)                           \
  do {                                                \
    const ::dsinfer::Status dsi_st_ = (expr);         \
    ASSERT_TRUE(dsi_st_.ok()) << dsi_st_.to_string(); \
  } while (0)

// A non-asserting DSI_EXPECT_OK, for helpers that return values.
#define DSI_EXPECT_OK_CONTINUE(expr)                  \
  do {                                                \
    const ::dsinfer::Status dsi_st_ = (expr);         \
    EXPECT_TRUE(dsi_st_.ok()) << dsi_st_.to_string(); \
  } while (0)

// want and got hold the same bits (NaN payloads included); reports the first few differences.
inline void expect_same_floats(const std::vector<float>& want,
                               const std::vector<float>& got,
                               const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], 4) != 0 && bad++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: want " << want[i] << " got " << got[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

inline std::vector<float> normal_floats(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// |got - want| <= tol[i] for every i; reports the first few failures. NaN matches NaN.
inline void expect_within(const std::vector<float>& want,
                          const std::vector<float>& got,
                          const std::vector<double>& tol,
                          const std::string& what) {
  ASSERT_GE(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i]))
      continue;
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= tol[i])) {
      if (bad < 5) {
        ADD_FAILURE() << what << " [" << i << "]: cpu " << want[i] << " gpu " << got[i] << " err "
                      << err << " tol " << tol[i];
      }
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " values out of tolerance";
}

// Relative-to-magnitude check: |got - want| <= rel * max(|want|, floor).
inline void expect_rel(const std::vector<float>& want,
                       const std::vector<float>& got,
                       double rel,
                       double floor,
                       const std::string& what) {
  std::vector<double> tol(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    tol[i] = rel * std::max<double>(std::fabs(want[i]), floor);
  }
  expect_within(want, got, tol, what);
}

// A weight in one checkpoint format: host bytes (for the CPU reference) and a device copy.
struct TestWeight {
  std::vector<uint8_t> data;
  std::vector<uint8_t> scale;
  MatrixRef host;
  DevVec<uint8_t> d_data;
  DevVec<uint8_t> d_scale;
  MatrixRef dev;
};

enum class Fmt { kF32, kBF16, kF16, kFp8E8M0, kFp8F32, kMxfp4 };

inline const char* fmt_name(Fmt f) {
  switch (f) {
    case Fmt::kF32:
      return "f32";
    case Fmt::kBF16:
      return "bf16";
    case Fmt::kF16:
      return "f16";
    case Fmt::kFp8E8M0:
      return "fp8/e8m0";
    case Fmt::kFp8F32:
      return "fp8/f32";
    case Fmt::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

// Random finite weights of moderate magnitude (|w| ~ 0.1) in format f.
inline std::unique_ptr<TestWeight> make_weight(Fmt f, int64_t rows, int64_t cols, uint32_t seed) {
  auto w = std::make_unique<TestWeight>();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  const auto n = static_cast<size_t>(rows * cols);
  MatrixRef& m = w->host;
  m.rows = rows;
  m.cols = cols;
  switch (f) {
    case Fmt::kF32: {
      w->data.resize(n * 4);
      for (size_t i = 0; i < n; ++i) {
        const float v = nd(rng);
        std::memcpy(w->data.data() + 4 * i, &v, 4);
      }
      m.format = WeightFormat::kFloat;
      m.dtype = DType::kF32;
      break;
    }
    case Fmt::kBF16:
    case Fmt::kF16: {
      w->data.resize(n * 2);
      for (size_t i = 0; i < n; ++i) {
        const float v = nd(rng);
        const uint16_t h = f == Fmt::kBF16 ? numeric::f32_to_bf16(v) : numeric::f32_to_f16(v);
        std::memcpy(w->data.data() + 2 * i, &h, 2);
      }
      m.format = WeightFormat::kFloat;
      m.dtype = f == Fmt::kBF16 ? DType::kBF16 : DType::kF16;
      break;
    }
    case Fmt::kFp8E8M0:
    case Fmt::kFp8F32: {
      w->data.resize(n);
      for (auto& b : w->data) {
        b = static_cast<uint8_t>(rng());
        if ((b & 0x7f) == 0x7f)
          b &= 0xfe;  // no NaN codes
      }
      const int64_t nscale = ((rows + 127) / 128) * ((cols + 127) / 128);
      if (f == Fmt::kFp8E8M0) {
        w->scale.resize(static_cast<size_t>(nscale));
        for (auto& b : w->scale) b = static_cast<uint8_t>(117 + rng() % 4);  // 2^-10 .. 2^-7
        m.scale_dtype = DType::kF8E8M0;
      } else {
        w->scale.resize(static_cast<size_t>(nscale) * 4);
        std::uniform_real_distribution<float> u(0.0005f, 0.005f);
        for (int64_t i = 0; i < nscale; ++i) {
          const float v = u(rng);
          std::memcpy(w->scale.data() + 4 * i, &v, 4);
        }
        m.scale_dtype = DType::kF32;
      }
      m.format = WeightFormat::kFp8Block128;
      m.dtype = DType::kF8E4M3;
      break;
    }
    case Fmt::kMxfp4: {
      w->data.resize(n / 2);
      for (auto& b : w->data) b = static_cast<uint8_t>(rng());
      w->scale.resize(static_cast<size_t>(rows * (cols / 32)));
      for (auto& b : w->scale) b = static_cast<uint8_t>(121 + rng() % 3);  // 2^-6 .. 2^-4
      m.format = WeightFormat::kMxfp4;
      m.dtype = DType::kI8;
      m.scale_dtype = DType::kF8E8M0;
      break;
    }
  }
  m.data = w->data.data();
  m.scale = w->scale.empty() ? nullptr : w->scale.data();
  w->d_data = DevVec<uint8_t>(w->data);
  w->d_scale = DevVec<uint8_t>(w->scale);
  w->dev = m;
  w->dev.data = w->d_data.get();
  w->dev.scale = w->scale.empty() ? nullptr : w->d_scale.get();
  return w;
}

// Test-only kernels (test_kernels.cu).
void launch_illegal_write(cudaStream_t stream);
void launch_uniform_from(
    const uint64_t* seeds, const uint64_t* counters, double* out, int n, cudaStream_t stream);
// Counts of every fp32 input where the hardware FP8 rounding of quant.cuh differs from the
// software one (bad[3], first[3]: see test_kernels.cu); first[] must start at 0xffffffff.
void launch_fp8_rounding_check(float s,
                               unsigned long long* bad,
                               uint32_t* first,
                               cudaStream_t stream);

}  // namespace dsinfer::cuda::test
