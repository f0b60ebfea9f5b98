// Dense FP8 linears on Hopper's wgmma for many rows (fp8_gemm_sm90.cu, CUTLASS): the path
// launch_fp8_linear takes for n >= kFp8Sm90MinRows when the build has CUTLASS and the caller
// passes scratch. Same contract as launch_fp8_linear; the sum runs per 128-wide K block (one
// wgmma chain from zero, then times both scales, added in K order) instead of per 32-wide step,
// so results differ from the mma.sync kernels in fp32 rounding only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/fp8_gemm.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

struct Fp8GemmSm90Args {
  MatrixRef w;
  int64_t row_begin = 0;
  int64_t rows = 0;
  Fp8Acts x;
  int64_t n = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;
  float* scratch = nullptr;  // the scales in the kernel's layouts, then split-K's workspace
  int64_t scratch_floats = 0;
};

// w FP8 block-128 with K % 128 == 0, the row range on 128-row blocks, rows % 16 == 0,
// ldy % 4 == 0, data 16-byte aligned.
bool fp8_gemm_sm90_supports(const MatrixRef& w, int64_t row_begin, int64_t rows, int64_t ldy);
// Scratch floats: the scales in the kernel's layouts (the least the launch takes), and with the
// split-K workspace of this shape (what a caller should give; with less, whole-K tiles run).
int64_t fp8_gemm_sm90_min_scratch_floats(int64_t n, int64_t k, int64_t rows);
int64_t fp8_gemm_sm90_scratch_floats(int64_t n, int64_t k, int64_t rows);
Status launch_fp8_gemm_sm90(const Fp8GemmSm90Args& a, cudaStream_t stream);

}  // namespace dsinfer::cuda
