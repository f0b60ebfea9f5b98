// Grouped wgmma experts (moe_sm90.h). Per launch: a setup kernel writes each expert's problem
// shape, operand pointers, strides and scale layouts (the grouped GEMM reads them on the device,
// so the host never waits for the routing), a gather kernel copies the pairs' FP8 activation rows
// into expert order with their scales in the GEMM's M-major layout, then GEMM 1 (W1 and W3 in one
// [2 x inter] weight), SwiGLU + quantisation, GEMM 2 (the GEMMs: moe_sm90_grouped.h). Only
// compiled with CUTLASS.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "base/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/moe_sm90.h"
#include "kernels/cuda/moe_sm90_grouped.h"
#include "kernels/cuda/moe_w4a8_k_order.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "numeric/float_formats.h"

namespace dsinfer::cuda {
namespace {

using moe_sm90_detail::Buffers;
using moe_sm90_detail::Grouped;

// The scratch of one launch, in order: the GEMMs' buffers and the bytes in all.
struct Scratch : Buffers {
  int64_t bytes;
};

// The larger of the two instantiations' sizes (one scratch layout for both).
size_t group_arrays_bytes(int64_t ne) {
  return std::max(Grouped<1>::arrays_bytes(ne), Grouped<128>::arrays_bytes(ne));
}

Scratch carve_scratch(void* base, int64_t ne, int64_t pairs, int64_t hidden, int64_t inter) {
  auto* p = static_cast<uint8_t*>(base);
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    uint8_t* q = p ? p + off : nullptr;
    off += (std::max<int64_t>(bytes, 1) + 255) / 256 * 256;
    return q;
  };
  Scratch s;
  s.a1 = take(pairs * hidden);
  s.sfa1 = reinterpret_cast<float*>(take(pairs * (hidden / 128) * 4));
  s.d1 = reinterpret_cast<float*>(take(pairs * 2 * inter * 4));
  s.hq = take(pairs * inter);
  s.sfa2 = reinterpret_cast<float*>(take(pairs * (inter / 128) * 4));
  s.g1 = take(static_cast<int64_t>(group_arrays_bytes(ne)));
  s.g2 = take(static_cast<int64_t>(group_arrays_bytes(ne)));
  const size_t ws = std::max(Grouped<1>::workspace_bytes(ne), Grouped<128>::workspace_bytes(ne));
  s.ws = take(static_cast<int64_t>(ws));
  s.bytes = off;
  return s;
}

// expert_begin[e], or with a null table one expert over all pairs.
__device__ __forceinline__ int64_t begin_of(const MoeSm90Params& p, int64_t e) {
  return p.expert_begin ? p.expert_begin[e] : (e == 0 ? 0 : p.num_pairs);
}
__device__ __forceinline__ int64_t pair_of(const MoeSm90Params& p, int64_t g) {
  return p.pair_src ? p.pair_src[g] : g;
}

__device__ __forceinline__ int64_t expert_of(const int64_t* begin, int64_t ne, int64_t g) {
  return begin == nullptr ? 0 : last_at_most(begin, ne, g);
}

// One block per grouped row: the token's FP8 row (16-byte copies; in the W4A8 GEMM's K order
// with w4a8_order) and its scales, transposed into the expert's [hidden / 128][m_e] block.
__global__ void gather_kernel(MoeSm90Params p, Scratch s, bool w4a8_order) {
  const int64_t H = p.w.hidden;
  const int64_t kb = H / 128;
  for (int64_t g = blockIdx.x; g < p.num_pairs; g += gridDim.x) {
    const int64_t e = expert_of(p.expert_begin, p.w.n_experts, g);
    const int64_t b = begin_of(p, e);
    const int64_t m = begin_of(p, e + 1) - b;
    const int64_t tok = pair_of(p, g) / p.k;
    const uint4* src = reinterpret_cast<const uint4*>(p.x.codes + tok * p.x.ld);
    uint4* dst = reinterpret_cast<uint4*>(s.a1 + g * H);
    if (w4a8_order) {
      for (int64_t i = threadIdx.x; i < H / 32; i += blockDim.x)
        w4a8_order_32(src[2 * i], src[2 * i + 1], dst + 2 * i);
    } else {
      for (int64_t i = threadIdx.x; i < H / 16; i += blockDim.x) dst[i] = src[i];
    }
    const float* xs = p.x.scales + tok * (p.x.ld / 128);
    for (int64_t i = threadIdx.x; i < kb; i += blockDim.x) {
      s.sfa1[b * kb + i * m + (g - b)] = xs[i];
    }
  }
}

// h = silu(min(g, limit)) * clamp(u, +-limit) * gate (the fused kernel's operations, in its
// order), quantised per 128 values exactly as launch_quantize_fp8 does (stored in the W4A8
// GEMM's K order with w4a8_order); one warp per block.
__global__ void swiglu_quant_kernel(MoeSm90Params p, Scratch s, bool w4a8_order) {
  const int64_t I = p.w.inter;
  const int64_t kb = I / 128;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const float lim = p.swiglu_limit;
  for (int64_t g = blockIdx.x; g < p.num_pairs; g += gridDim.x) {
    const int64_t e = expert_of(p.expert_begin, p.w.n_experts, g);
    const int64_t b = begin_of(p, e);
    const int64_t m = begin_of(p, e + 1) - b;
    const float gate = p.gates ? p.gates[pair_of(p, g)] : 1.0f;
    const float* row = s.d1 + g * 2 * I;
    for (int64_t blk = warp; blk < kb; blk += nwarps) {
      const int64_t c0 = blk * 128 + lane * 4;
      const float4 gv4 = *reinterpret_cast<const float4*>(row + c0);
      const float4 uv4 = *reinterpret_cast<const float4*>(row + I + c0);
      float h[4] = {gv4.x, gv4.y, gv4.z, gv4.w};
      const float u[4] = {uv4.x, uv4.y, uv4.z, uv4.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = swiglu_gated(h[i], u[i], lim, gate);
      uint32_t packed = 0;
      const float sc = act_quant_warp_block(h, &packed);
      const int64_t at = w4a8_order ? blk * 128 + 4 * w4a8_group_position(lane) : c0;
      *reinterpret_cast<uint32_t*>(s.hq + g * I + at) = packed;
      if (lane == 0)
        s.sfa2[b * kb + blk * m + (g - b)] = sc;
    }
  }
}

// ---- re-encoding ----------------------------------------------------------------------------

// The matrices of one re-encoding pass: W1, W3 (rows [0, I) and [I, 2I) of W13) or W2.
struct ReencodePart {
  const MatrixRef* mats;
  int64_t rows, cols;
  int64_t row_offset;  // rows of this matrix within the output
  int64_t out_rows;    // rows per expert in the output
  uint8_t* codes;
  float* scales;  // [n_experts][cols / 128][out_rows / scale_rows]
};

// The largest biased exponent of the nonzero 32-blocks of MXFP4 row r's 128-wide K block blk,
// and the smallest (smax < smin: all zero).
__device__ __forceinline__ void mxfp4_exponents(
    const MatrixRef& w, int64_t r, int64_t blk, int64_t cols, int* smax, int* smin) {
  const uint8_t* packed = static_cast<const uint8_t*>(w.data) + r * (cols / 2) + blk * 64;
  const uint8_t* sub = static_cast<const uint8_t*>(w.scale) + r * (cols / 32) + blk * 4;
  *smax = -1000;
  *smin = 1000;
  for (int j = 0; j < 4; ++j) {
    bool nz = false;
    for (int q = 0; q < 16; ++q) nz |= (packed[j * 16 + q] & 0x77) != 0;
    if (nz) {
      *smax = max(*smax, static_cast<int>(sub[j]));
      *smin = min(*smin, static_cast<int>(sub[j]));
    }
  }
}

// Block scales (scale_rows 128), pass 1: the largest exponent over each 128 x 128 block, as an
// int in the block's scale slot (preset to -1). One thread per (expert, row, K block).
__global__ void block_exponent_kernel(ReencodePart pt, int64_t n_experts) {
  const int64_t kb = pt.cols / 128;
  const int64_t total = n_experts * pt.rows * kb;
  int* slots = reinterpret_cast<int*>(pt.scales);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t blk = i % kb;
    const int64_t r = (i / kb) % pt.rows;
    const int64_t e = i / (kb * pt.rows);
    int smax = 0;
    int smin = 0;
    mxfp4_exponents(pt.mats[e], r, blk, pt.cols, &smax, &smin);
    if (smax >= smin)
      atomicMax(slots + (e * kb + blk) * (pt.out_rows / 128) + (pt.row_offset + r) / 128, smax);
  }
}

// The E4M3 re-encoding, one thread per (expert, row, K block). MXFP4: the scale is
// S = 2^(max nonzero 32-block exponent - 6) over the row's block (scale_rows 1) or over the
// 128 x 128 block (scale_rows 128: the exponent from block_exponent_kernel, the float written by
// block_scale_kernel afterwards), each value e2m1 x 2^(s - S) in E4M3; values that E4M3 cannot
// hold exactly (exponents more than 14 binades below the maximum) are counted in *inexact.
__global__ void reencode_kernel(
    ReencodePart pt, WeightFormat format, int64_t n_experts, int scale_rows, int* inexact) {
  const int64_t kb = pt.cols / 128;
  const int64_t total = n_experts * pt.rows * kb;
  const int64_t srows = pt.out_rows / scale_rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t blk = i % kb;
    const int64_t r = (i / kb) % pt.rows;
    const int64_t e = i / (kb * pt.rows);
    const MatrixRef w = pt.mats[e];
    uint8_t* out = pt.codes + (e * pt.out_rows + pt.row_offset + r) * pt.cols + blk * 128;
    float* sc = pt.scales + (e * kb + blk) * srows + (pt.row_offset + r) / scale_rows;
    if (format == WeightFormat::kFp8Block128) {
      // The checkpoint's 128 x 128 blocks: W3's rows start at I, a multiple of 128, so the
      // output's 128-row blocks are the checkpoint's.
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * pt.cols + blk * 128;
      for (int j = 0; j < 128; j += 16)
        *reinterpret_cast<uint4*>(out + j) = *reinterpret_cast<const uint4*>(src + j);
      if (scale_rows == 1 || r % 128 == 0) {
        const int64_t si = (r / 128) * ((pt.cols + 127) / 128) + blk;
        *sc = w.scale_dtype == DType::kF32
                  ? static_cast<const float*>(w.scale)[si]
                  : numeric::e8m0_to_f32(static_cast<const uint8_t*>(w.scale)[si]);
      }
      continue;
    }
    const uint8_t* packed = static_cast<const uint8_t*>(w.data) + r * (pt.cols / 2) + blk * 64;
    const uint8_t* sub = static_cast<const uint8_t*>(w.scale) + r * (pt.cols / 32) + blk * 4;
    int smax = 0;
    int smin = 0;
    mxfp4_exponents(w, r, blk, pt.cols, &smax, &smin);
    if (smax < smin) {  // all zero
      for (int j = 0; j < 128; j += 16) *reinterpret_cast<uint4*>(out + j) = make_uint4(0, 0, 0, 0);
      if (scale_rows == 1)
        *sc = 1.0f;
      continue;
    }
    if (scale_rows != 1)
      smax = *reinterpret_cast<const int*>(sc);  // the block's (>= this row's)
    if (smax - smin > 14 || smax < 6)
      atomicAdd(inexact, 1);
    const int big = smax - 6;  // biased E8M0 exponent of S
    if (scale_rows == 1)
      *sc = numeric::e8m0_to_f32(static_cast<uint8_t>(max(big, 0)));
    for (int j = 0; j < 4; ++j) {
      const int shift = static_cast<int>(sub[j]) - max(big, 0);
      for (int q = 0; q < 16; ++q) {
        const uint8_t two = packed[j * 16 + q];
        uint8_t c[2];
        for (int h = 0; h < 2; ++h) {
          const float v = ldexpf(numeric::fp4_e2m1_to_f32((two >> (4 * h)) & 0xf), shift);
          c[h] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
        }
        out[j * 32 + 2 * q] = c[0];
        out[j * 32 + 2 * q + 1] = c[1];
      }
    }
  }
}

// Block scales, last pass: each block's exponent slot -> its float scale (an all-zero block: 1).
__global__ void block_scale_kernel(float* scales, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int smax = reinterpret_cast<const int*>(scales)[i];
    scales[i] = smax < 0 ? 1.0f : numeric::e8m0_to_f32(static_cast<uint8_t>(max(smax - 6, 0)));
  }
}

// The tile configuration of one launch: 64-row ping-pong tiles while the experts average at
// most 384 rows (the routed experts of a prefill: a 128-row tile would run half empty on the
// remainder of ~190 rows, and the epilogue's fp32 rows stall a cooperative tile), 128-row
// cooperative tiles above (the shared expert). DSINFER_MOE_SM90_TILE=64 or 128 forces one (for
// measuring one against the other).
bool use_ping64(const MoeSm90Params& p) {
  static const int forced = [] {
    const char* v = std::getenv("DSINFER_MOE_SM90_TILE");
    return v == nullptr ? 0 : std::atoi(v);
  }();
  if (forced == 64 || forced == 128)
    return forced == 64;
  return p.num_pairs <= 384 * std::max<int64_t>(p.w.n_experts, 1);
}

}  // namespace

bool moe_sm90_supports(int64_t hidden, int64_t inter) {
  return hidden > 0 && inter > 0 && hidden % 128 == 0 && inter % 128 == 0;
}

namespace {

bool valid_scale_rows(int scale_rows) {
  return scale_rows == 1 || scale_rows == 128;
}

// Carves the four arrays from base (null: sizes only); returns the bytes.
int64_t carve_weights(void* base,
                      int64_t n_experts,
                      int64_t hidden,
                      int64_t inter,
                      int scale_rows,
                      MoeFp8Weights* w) {
  auto* p = static_cast<uint8_t*>(base);
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    uint8_t* q = p ? p + off : nullptr;
    off += (bytes + 255) / 256 * 256;
    return q;
  };
  w->n_experts = n_experts;
  w->hidden = hidden;
  w->inter = inter;
  w->scale_rows = scale_rows;
  w->w13 = take(n_experts * 2 * inter * hidden);
  w->s13 =
      reinterpret_cast<float*>(take(n_experts * (hidden / 128) * (2 * inter / scale_rows) * 4));
  w->w2 = take(n_experts * hidden * inter);
  w->s2 = reinterpret_cast<float*>(take(n_experts * (inter / 128) * (hidden / scale_rows) * 4));
  return off;
}

}  // namespace

int64_t moe_fp8_weights_bytes(int64_t n_experts, int64_t hidden, int64_t inter, int scale_rows) {
  DSI_CHECK(valid_scale_rows(scale_rows), "moe_fp8_weights: scale_rows %d", scale_rows);
  MoeFp8Weights w;
  return carve_weights(nullptr, n_experts, hidden, inter, scale_rows, &w);
}

MoeFp8Weights moe_fp8_weights_carve(
    void* base, int64_t n_experts, int64_t hidden, int64_t inter, int scale_rows) {
  DSI_CHECK(valid_scale_rows(scale_rows), "moe_fp8_weights: scale_rows %d", scale_rows);
  MoeFp8Weights w;
  carve_weights(base, n_experts, hidden, inter, scale_rows, &w);
  return w;
}

Status launch_moe_fp8_reencode(const MatrixRef* w1,
                               const MatrixRef* w3,
                               const MatrixRef* w2,
                               WeightFormat format,
                               const MoeFp8Weights& out,
                               int* inexact,
                               cudaStream_t stream) {
  if (!moe_sm90_supports(out.hidden, out.inter))
    return invalid_argument("moe_fp8_reencode: hidden and inter must be multiples of 128");
  if (format != WeightFormat::kMxfp4 && format != WeightFormat::kFp8Block128)
    return invalid_argument("moe_fp8_reencode: experts must be MXFP4 or FP8 block-128");
  if (!valid_scale_rows(out.scale_rows))
    return invalid_argument("moe_fp8_reencode: scale_rows must be 1 or 128");
  const int64_t ne = out.n_experts;
  const int64_t H = out.hidden;
  const int64_t I = out.inter;
  const ReencodePart parts[] = {{w1, I, H, 0, 2 * I, out.w13, out.s13},
                                {w3, I, H, I, 2 * I, out.w13, out.s13},
                                {w2, H, I, 0, H, out.w2, out.s2}};
  auto grid_for = [](int64_t total) {
    return static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 1 << 16));
  };
  const bool blocks = out.scale_rows == 128 && format == WeightFormat::kMxfp4;
  const int64_t n13 = ne * (H / 128) * (2 * I / 128);
  const int64_t n2 = ne * (I / 128) * (H / 128);
  if (blocks) {
    cudaMemsetAsync(out.s13, 0xff, static_cast<size_t>(n13) * 4, stream);
    cudaMemsetAsync(out.s2, 0xff, static_cast<size_t>(n2) * 4, stream);
    DSI_RETURN_IF_ERROR(launched("moe_fp8_reencode memset"));
    for (const ReencodePart& pt : parts) {
      block_exponent_kernel<<<grid_for(ne * pt.rows * (pt.cols / 128)), 256, 0, stream>>>(pt, ne);
      DSI_RETURN_IF_ERROR(launched("moe_fp8_reencode exponents"));
    }
  }
  for (const ReencodePart& pt : parts) {
    reencode_kernel<<<grid_for(ne * pt.rows * (pt.cols / 128)), 256, 0, stream>>>(
        pt, format, ne, out.scale_rows, inexact);
    DSI_RETURN_IF_ERROR(launched("moe_fp8_reencode launch"));
  }
  if (blocks) {
    block_scale_kernel<<<grid_for(n13), 256, 0, stream>>>(out.s13, n13);
    block_scale_kernel<<<grid_for(n2), 256, 0, stream>>>(out.s2, n2);
    DSI_RETURN_IF_ERROR(launched("moe_fp8_reencode scales"));
  }
  return Status();
}

int64_t moe_sm90_scratch_bytes(int64_t n_experts,
                               int64_t num_pairs,
                               int64_t hidden,
                               int64_t inter) {
  return carve_scratch(nullptr, n_experts, num_pairs, hidden, inter).bytes;
}

Status launch_moe_sm90(const MoeSm90Params& p_in, cudaStream_t stream) {
  const bool w4 = p_in.w4.n_experts > 0;
  MoeSm90Params p = p_in;
  if (w4) {  // the kernels below read the dimensions from w
    p.w = MoeFp8Weights{};
    p.w.n_experts = p.w4.n_experts;
    p.w.hidden = p.w4.hidden;
    p.w.inter = p.w4.inter;
  }
  const int64_t ne = p.w.n_experts;
  const int64_t H = p.w.hidden;
  const int64_t I = p.w.inter;
  if (!moe_sm90_supports(H, I))
    return invalid_argument("moe_sm90: hidden and inter must be multiples of 128");
  if (!valid_scale_rows(p.w.scale_rows))
    return invalid_argument("moe_sm90: scale_rows must be 1 or 128");
  if (p.num_pairs == 0)
    return Status();
  if ((ne > 1 && !p.expert_begin) || !p.x.codes || !p.x.scales || !p.y || !p.scratch)
    return null_pointer("moe_sm90");
  if (p.num_pairs > 0x7fffffff || 2 * I * H > 0x7fffffff)
    return invalid_argument("moe_sm90: sizes exceed 32-bit extents");
  const Scratch s = carve_scratch(p.scratch, ne, p.num_pairs, H, I);
  if (p.scratch_bytes < s.bytes)
    return invalid_argument("moe_sm90: scratch too small");
  const bool blocks = p.w.scale_rows == 128;
  if (!w4) {
    if (blocks)
      Grouped<128>::setup(p, s, stream);
    else
      Grouped<1>::setup(p, s, stream);
    DSI_RETURN_IF_ERROR(launched("moe_sm90 setup"));
  } else if (!p.expert_begin) {
    return null_pointer("moe_sm90: W4A8 experts need expert_begin");
  }
  const unsigned rows = static_cast<unsigned>(std::min<int64_t>(p.num_pairs, 1 << 20));
  gather_kernel<<<rows, 128, 0, stream>>>(p, s, w4);
  DSI_RETURN_IF_ERROR(launched("moe_sm90 gather"));
  const bool ping = use_ping64(p);
  for (int pass = 0; pass < 2; ++pass) {
    if (w4) {
      DSI_RETURN_IF_ERROR(launch_moe_w4a8_gemm(MoeW4a8GemmParams{.w = p.w4,
                                                                 .pass = pass,
                                                                 .expert_begin = p.expert_begin,
                                                                 .a = pass == 0 ? s.a1 : s.hq,
                                                                 .sa = pass == 0 ? s.sfa1 : s.sfa2,
                                                                 .num_pairs = p.num_pairs,
                                                                 .d = pass == 0 ? s.d1 : p.y},
                                               stream));
    } else {
      DSI_RETURN_IF_ERROR(blocks ? Grouped<128>::run(pass, ping, ne, s, stream)
                                 : Grouped<1>::run(pass, ping, ne, s, stream));
    }
    if (pass == 0) {
      swiglu_quant_kernel<<<rows, 128, 0, stream>>>(p, s, w4);
      DSI_RETURN_IF_ERROR(launched("moe_sm90 swiglu"));
    }
  }
  return Status();
}

}  // namespace dsinfer::cuda
