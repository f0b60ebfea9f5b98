// The CUTLASS kernels behind launch_fp8_gemm_sm90 (fp8_gemm_sm90.cu), one tile scheduler per
// translation unit so that they compile in parallel: persistent tiles (fp8_gemm_sm90.cu) and
// split-K (fp8_gemm_sm90_splitk.cu), for decode-sized token counts whose few output tiles would
// each walk all of K on one SM (a 512 x 4096 weight at 64 tokens: 4 tiles, 32 K blocks each).
// Split-K sums the K ranges' partials in range order (CUTLASS's deterministic turnstile), so a
// shape's result does not vary between runs; it differs from the unsplit sum in fp32 rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace dsinfer::cuda::fp8_sm90_detail {

// D[m, n] (+)= sum_k A[m, k] B[n, k] sfa[k / 128][m] sfb[k / 128][n / 128].
struct Problem {
  const uint8_t* a = nullptr;  // [m][lda] E4M3
  int64_t lda = 0;
  const uint8_t* b = nullptr;  // [n][k] E4M3
  const float* sfa = nullptr;  // [k / 128][sfa_ld]
  int64_t sfa_ld = 0;
  const float* sfb = nullptr;  // [k / 128][ceil(n / 128)]
  int m = 0, n = 0, k = 0;
  float* d = nullptr;
  int64_t ldd = 0;
  bool accumulate = false;
  int splits = 1;             // run_split: K ranges per output tile (>= 2)
  void* workspace = nullptr;  // run_split: split_workspace_bytes, 256-byte aligned
};

Status run_persistent(const Problem& p, cudaStream_t stream);
Status run_split(const Problem& p, cudaStream_t stream);
size_t split_workspace_bytes(int m, int n, int k, int splits);

}  // namespace dsinfer::cuda::fp8_sm90_detail
