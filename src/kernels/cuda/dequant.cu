// (De)quantisation kernels: FP8 block-128 and MXFP4 weights to fp32, and 1x128 UE8M0 FP8
// activation quantisation. Thin launchers validate params and pick grid sizes; all arithmetic is
// in dequant.cuh / numeric/float_formats.h.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/launch_util.h"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridX = 1 << 16;  // grid-stride beyond this
constexpr int64_t kMaxGridY = 65535;

// Rows over grid.y, columns over grid.x * threads, both grid-strided.
dim3 row_col_grid(int64_t rows, int64_t cols_work) {
  return dim3(static_cast<unsigned>(std::min(ceil_div(cols_work, kThreads), kMaxGridX)),
              static_cast<unsigned>(std::min(rows, kMaxGridY)));
}

__global__ void fp8_block_dequant_kernel(Fp8BlockDequantParams p) {
  const int64_t scale_cols = (p.cols + 127) / 128;
  const int64_t cstride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const uint8_t* q = p.codes + r * p.cols;
    float* o = p.out + r * p.cols;
    const int64_t srow = (r / 128) * scale_cols;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < p.cols;
         c += cstride) {
      o[c] =
          numeric::fp8_e4m3_to_f32(q[c]) * fp8_block_scale(p.scales, p.scales_f32, srow + c / 128);
    }
  }
}

// The same values as BF16 bit patterns (exact: 4 significant bits times a power of two).
__global__ void fp8_block_to_bf16_kernel(Fp8BlockDequantParams p, uint16_t* out) {
  const int64_t scale_cols = (p.cols + 127) / 128;
  const int64_t cstride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const uint8_t* q = p.codes + r * p.cols;
    uint16_t* o = out + r * p.cols;
    const int64_t srow = (r / 128) * scale_cols;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < p.cols;
         c += cstride) {
      const float v =
          numeric::fp8_e4m3_to_f32(q[c]) * fp8_block_scale(p.scales, p.scales_f32, srow + c / 128);
      o[c] = static_cast<uint16_t>(__float_as_uint(v) >> 16);  // exact: low half is zero
    }
  }
}

// One thread per packed byte: columns 2k (low nibble) and 2k+1 (high nibble) share a scale.
__global__ void mxfp4_dequant_kernel(Mxfp4DequantParams p) {
  const int64_t half = p.cols / 2;
  const int64_t kstride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const uint8_t* q = p.packed + r * half;
    const uint8_t* s = p.scales + r * (p.cols / 32);
    float2* o = reinterpret_cast<float2*>(p.out + r * p.cols);  // cols even: 8-byte aligned
    for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < half;
         k += kstride) {
      const float scale = numeric::e8m0_to_f32(s[k / 16]);
      o[k] = make_float2(numeric::fp4_packed_get(q, 2 * k) * scale,
                         numeric::fp4_packed_get(q, 2 * k + 1) * scale);
    }
  }
}

// One warp per (row, 128-column block); lane l handles columns l, l+32, l+64, l+96.
__global__ void act_quant_fp8_kernel(ActQuantParams p) {
  constexpr int kPer = kActQuantBlock / 32;
  const int64_t nkb = (p.cols + kActQuantBlock - 1) / kActQuantBlock;
  const int64_t nwork = p.rows * nkb;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       w < nwork;
       w += warps) {
    const int64_t r = w / nkb;
    const int64_t c0 = (w % nkb) * kActQuantBlock;
    const int64_t len = p.cols - c0 < kActQuantBlock ? p.cols - c0 : kActQuantBlock;
    const float* x = p.x + r * p.cols + c0;
    float v[kPer];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t c = lane + 32 * j;
      v[j] = c < len ? x[c] : 0.0f;
      amax = fmaxf(amax, fabsf(v[j]));  // fmaxf drops NaN like std::max(amax, nan) does
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    }
    const float s = act_block_scale(amax);
    uint8_t* codes = p.codes + r * p.cols + c0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t c = lane + 32 * j;
      if (c < len)
        codes[c] = act_quant_code(v[j], s);
    }
    if (lane == 0)
      p.scale_bytes[w] = numeric::e8m0_from_pow2(s);  // w = r * nkb + kb
  }
}

}  // namespace

Status launch_fp8_block_dequant(const Fp8BlockDequantParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_shape(p.rows, p.cols, "fp8_block_dequant"));
  if (p.rows == 0 || p.cols == 0)
    return Status();
  if (!p.codes || !p.scales || !p.out)
    return null_pointer("fp8_block_dequant");
  fp8_block_dequant_kernel<<<row_col_grid(p.rows, p.cols), kThreads, 0, stream>>>(p);
  return launched("fp8_block_dequant launch");
}

Status launch_mxfp4_dequant(const Mxfp4DequantParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_shape(p.rows, p.cols, "mxfp4_dequant"));
  if (p.cols % 32 != 0) {
    return invalid_argument("mxfp4_dequant: cols " + std::to_string(p.cols) +
                            " is not a multiple of 32");
  }
  if (p.rows == 0 || p.cols == 0)
    return Status();
  if (!p.packed || !p.scales || !p.out)
    return null_pointer("mxfp4_dequant");
  if (reinterpret_cast<uintptr_t>(p.out) % alignof(float2) != 0) {
    return invalid_argument("mxfp4_dequant: out must be 8-byte aligned");
  }
  mxfp4_dequant_kernel<<<row_col_grid(p.rows, p.cols / 2), kThreads, 0, stream>>>(p);
  return launched("mxfp4_dequant launch");
}

Status launch_act_quant_fp8(const ActQuantParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_shape(p.rows, p.cols, "act_quant_fp8"));
  if (p.rows == 0 || p.cols == 0)
    return Status();
  if (!p.x || !p.codes || !p.scale_bytes)
    return null_pointer("act_quant_fp8");
  const int64_t nwork = p.rows * ceil_div(p.cols, kActQuantBlock);
  // 8192 blocks of 8 warps is several waves on any current GPU; more work is grid-strided.
  const int64_t blocks = std::min(ceil_div(nwork, kThreads / 32), int64_t{8192});
  act_quant_fp8_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return launched("act_quant_fp8 launch");
}

Status fp8_block_to_bf16(const MatrixRef& w, uint16_t* out, cudaStream_t stream) {
  if (w.format != WeightFormat::kFp8Block128 || w.dtype != DType::kF8E4M3 ||
      (w.scale_dtype != DType::kF8E8M0 && w.scale_dtype != DType::kF32)) {
    return invalid_argument("fp8_block_to_bf16: not an FP8 block-128 weight");
  }
  if (w.rows == 0 || w.cols == 0)
    return Status();
  if (!w.data || !w.scale || !out)
    return null_pointer("fp8_block_to_bf16");
  Fp8BlockDequantParams p;
  p.codes = static_cast<const uint8_t*>(w.data);
  p.scales = w.scale;
  p.scales_f32 = w.scale_dtype == DType::kF32;
  p.rows = w.rows;
  p.cols = w.cols;
  fp8_block_to_bf16_kernel<<<row_col_grid(w.rows, w.cols), kThreads, 0, stream>>>(p, out);
  return launched("fp8_block_to_bf16 launch");
}

Status dequant_matrix(const MatrixRef& w, float* out, cudaStream_t stream) {
  switch (w.format) {
    case WeightFormat::kFp8Block128: {
      if (w.dtype != DType::kF8E4M3 ||
          (w.scale_dtype != DType::kF8E8M0 && w.scale_dtype != DType::kF32)) {
        return invalid_argument(
            "dequant_matrix: fp8-block128 needs F8_E4M3 data and E8M0/F32 "
            "scales");
      }
      Fp8BlockDequantParams p;
      p.codes = static_cast<const uint8_t*>(w.data);
      p.scales = w.scale;
      p.scales_f32 = w.scale_dtype == DType::kF32;
      p.rows = w.rows;
      p.cols = w.cols;
      p.out = out;
      return launch_fp8_block_dequant(p, stream);
    }
    case WeightFormat::kFp8Block32:
      return unimplemented("dequant_matrix: fp8-block32 (V4.1) weights have no CUDA path yet");
    case WeightFormat::kMxfp4: {
      Mxfp4DequantParams p;
      p.packed = static_cast<const uint8_t*>(w.data);
      p.scales = static_cast<const uint8_t*>(w.scale);
      p.rows = w.rows;
      p.cols = w.cols;
      p.out = out;
      return launch_mxfp4_dequant(p, stream);
    }
    case WeightFormat::kFloat: {
      if (w.dtype != DType::kF32) {
        return unimplemented(std::string("dequant_matrix: float weights of dtype ") +
                             dtype_name(w.dtype));
      }
      DSI_RETURN_IF_ERROR(check_shape(w.rows, w.cols, "dequant_matrix"));
      const size_t bytes = static_cast<size_t>(w.rows * w.cols) * sizeof(float);
      if (bytes == 0)
        return Status();
      return cuda_status(cudaMemcpyAsync(out, w.data, bytes, cudaMemcpyDeviceToDevice, stream),
                         "dequant_matrix copy");
    }
  }
  return invalid_argument("dequant_matrix: unknown weight format");
}

}  // namespace dsinfer::cuda
