// A dense GEMM through cuBLASLt (cublasLtMatmul), the vendor's peak: the honest ceiling the
// engine's own GEMMs are reported against. FP8 E4M3 or BF16 inputs, fp32 accumulation
// (CUBLAS_COMPUTE_32F), BF16 or FP32 output.
//
// Layout (row-major view; what cuBLASLt's column-major "TN" GEMM computes, the only layout its
// FP8 kernels take on sm_90):
//   a: [m, k] row-major (lda = k), b: [n, k] row-major (ldb = k), d: [n, m] row-major (ldd = m),
//   d[j, i] = sum_p a[i, p] * b[j, p].
// For a linear layer y = x W^T: a = W ([out, in]), b = x ([tokens, in]), d = y ([tokens, out]).
//
// Not thread-safe (run() updates the operation descriptor); one LtGemm per thread/stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace dsinfer::perf {

enum class GemmInput { kFp8E4M3, kBf16 };
enum class GemmOutput { kBf16, kF32 };

const char* gemm_input_name(GemmInput t);    // "fp8_e4m3", "bf16"
const char* gemm_output_name(GemmOutput t);  // "bf16", "f32"
int64_t gemm_input_bytes(GemmInput t);       // bytes per element: 1 or 2
int64_t gemm_output_bytes(GemmOutput t);     // 2 or 4

struct GemmSpec {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  GemmInput input = GemmInput::kFp8E4M3;
  GemmOutput output = GemmOutput::kBf16;
  // FP8 only: no periodic promotion of the tensor-core partial sums (faster, less accurate).
  bool fp8_fast_accum = false;
  // Workspace cuBLASLt may use (split-K and friends); allocated by create().
  int64_t workspace_bytes = int64_t{32} << 20;
  // How many of the heuristic's algorithms to keep (best first); callers may time them all.
  int max_algos = 1;
};

// kInvalidArgument unless the spec is usable: m, n, k >= 1 and < 2^31, workspace >= 0,
// max_algos in [1, 32]; FP8 additionally needs m, n, k multiples of 16 (16-byte leading
// dimensions and tensor-core shapes, as torch._scaled_mm requires). Makes no CUDA call.
Status check_gemm_spec(const GemmSpec& spec);

// "fp8_e4m3 8192x8192x8192 -> bf16"
std::string describe(const GemmSpec& spec);

class LtGemm {
 public:
  // Validates the spec (check_gemm_spec), creates the cuBLASLt handle and descriptors on the
  // current device, allocates the workspace and asks the heuristic for up to spec.max_algos
  // algorithms. Errors: kInvalidArgument (spec), kUnimplemented (FP8 on a device below sm_89, or
  // no algorithm for the shape), kResourceExhausted (workspace), kInternal (cuBLASLt/CUDA, with
  // the status name).
  static Result<LtGemm> create(const GemmSpec& spec);

  LtGemm();
  LtGemm(LtGemm&&) noexcept;
  LtGemm& operator=(LtGemm&&) noexcept;
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  ~LtGemm();

  const GemmSpec& spec() const;
  // Algorithms the heuristic returned (1 <= num_algos() <= spec.max_algos), best estimate first.
  int num_algos() const;
  int selected_algo() const;
  // Later run()s use algorithm i (0 <= i < num_algos()); 0 after create().
  Status select_algo(int i);

  // Enqueues d = a . b^T (layout above) on `stream`, unscaled (scale pointers on an FP8
  // descriptor made cublasLtMatmul report NOT_SUPPORTED on the H200 with CUDA 13.0, and the
  // ceiling needs none). Device pointers must be 16-byte aligned (cudaMalloc'd pointers are).
  // Asynchronous: a kernel fault shows up at the next synchronisation (device::sync_stream).
  Status run(const void* a, const void* b, void* d, cudaStream_t stream);

 private:
  struct Impl;
  explicit LtGemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsinfer::perf
