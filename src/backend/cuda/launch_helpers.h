// Short forms of the launchers the CUDA model calls most (dense rows, in-place norms), shared by
// the layer chain and the MTP/head code of backend/cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/workspace.h"
#include "base/status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"

namespace dsinfer::gpu {

// Room in ws for the FP8 activations of n rows of k columns (codes and 1x128 scales, fp8_gemm.h),
// not yet written.
struct Fp8ActsRoom {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  int64_t ld = 0;
  cuda::Fp8Acts acts() const { return cuda::Fp8Acts{codes, scales, ld}; }
};
inline Status fp8_acts_room(Workspace* ws, int64_t n, int64_t k, Fp8ActsRoom* out) {
  out->ld = cuda::fp8_acts_ld(k);
  DSI_RETURN_IF_ERROR(ws->get(&out->codes, n * out->ld));
  return ws->get(&out->scales, n * (out->ld / 128));
}

// x [n, k] quantised into FP8 codes and 1x128 scales taken from ws.
inline Status quantize_fp8(
    Workspace* ws, const float* x, int64_t n, int64_t k, cudaStream_t s, cuda::Fp8Acts* out) {
  Fp8ActsRoom room;
  DSI_RETURN_IF_ERROR(fp8_acts_room(ws, n, k, &room));
  DSI_RETURN_IF_ERROR(cuda::launch_quantize_fp8(
      cuda::QuantizeFp8Params{.x = x, .n = n, .k = k, .codes = room.codes, .scales = room.scales},
      s));
  *out = room.acts();
  return Status();
}

// x [n, k] (rows ldx apart; 0: k) split into BF16 halves taken from ws (fp8_gemm.h), the low
// halves' rows right after the high halves' (the wgmma path reads both as one 2n-row operand).
inline Status split_bf16(Workspace* ws,
                         const float* x,
                         int64_t n,
                         int64_t k,
                         int64_t ldx,
                         cudaStream_t s,
                         cuda::Bf16SplitActs* out,
                         bool hi_only = false) {  // x rounded to BF16: no low halves
  const int64_t ld = cuda::bf16_split_ld(k);
  uint16_t* hi = nullptr;
  uint16_t* lo = nullptr;
  DSI_RETURN_IF_ERROR(ws->get(&hi, (hi_only ? 1 : 2) * n * ld));
  if (!hi_only)
    lo = hi + n * ld;
  cuda::SplitBf16Params q;
  q.x = x;
  q.ldx = ldx;
  q.n = n;
  q.k = k;
  q.hi = hi;
  q.lo = lo;
  DSI_RETURN_IF_ERROR(cuda::launch_split_bf16(q, s));
  *out = cuda::Bf16SplitActs{hi, lo, ld};
  return Status();
}

// Where linear() takes its scratch from, and whether many-row FP8 linears may use the wgmma
// kernels (fp8_gemm.h: faster, but their summation order differs from the small-batch kernels';
// off = batch invariant).
struct LinearCtx {
  Workspace* ws = nullptr;
  bool wgmma = true;
};

// y = W x over n rows of x: with FP8 activations (q8) and an FP8 block weight, on the tensor cores
// (activations quantised once into ws); fp32 activations over BF16 or FP8 weights on the BF16
// tensor cores (split into BF16 halves); otherwise (MXFP4 or F32 weights unquantised, odd K) the
// reference tile of gemm.h.
// Whether linear() runs w on FP8 activations (its first branch).
inline bool fp8_linear_path(const MatrixRef& w, bool q8) {
  return q8 && w.format == WeightFormat::kFp8Block128 && cuda::fp8_gemm_supports(w);
}

// Whether linear() runs w on BF16 halves of fp32 activations (its third branch).
inline bool bf16x2_linear_path(const LinearCtx& ctx, const MatrixRef& w, int64_t n, bool q8) {
  if (n <= 0 || fp8_linear_path(w, q8))
    return false;
  if (!q8 && ctx.wgmma && n <= cuda::kGemvMaxTokens && cuda::gemv_supports(w))
    return false;
  return !q8 && cuda::bf16x2_gemm_supports(w);
}

// xq / xs (optional): x already quantised by quantize_fp8, or split by split_bf16, over w.cols
// columns (several linears on the same activations convert them once).
inline Status linear(const LinearCtx& ctx,
                     const MatrixRef& w,
                     const float* x,
                     int64_t n,
                     float* y,
                     bool q8,
                     cudaStream_t s,
                     bool accumulate = false,
                     const cuda::Fp8Acts* xq = nullptr,
                     const cuda::Bf16SplitActs* xs = nullptr) {
  Workspace* ws = ctx.ws;
  if (n > 0 && fp8_linear_path(w, q8)) {
    cuda::Fp8LinearParams p;
    p.w = w;
    if (xq != nullptr) {
      p.x = *xq;
    } else {
      DSI_RETURN_IF_ERROR(quantize_fp8(ws, x, n, w.cols, s, &p.x));
    }
    p.n = n;
    p.y = y;
    p.accumulate = accumulate;
    p.wgmma = ctx.wgmma;
    p.scratch_floats = ctx.wgmma ? cuda::fp8_linear_scratch_floats(w, -1, n) : 0;
    if (p.scratch_floats > 0)
      DSI_RETURN_IF_ERROR(ws->get(&p.scratch, p.scratch_floats));
    return cuda::launch_fp8_linear(p, s);
  }
  if (!q8 && ctx.wgmma && n > 0 && n <= cuda::kGemvMaxTokens && cuda::gemv_supports(w)) {
    // Few tokens over BF16 weights: the bandwidth-bound GEMV (fp32 FMAs on the exact weights).
    cuda::GemvParams p;
    p.w = w;
    p.x = x;
    p.n = n;
    p.y = y;
    p.accumulate = accumulate;
    return cuda::launch_gemv_bf16(p, s);
  }
  if (!q8 && n > 0 && cuda::bf16x2_gemm_supports(w)) {
    cuda::Bf16x2LinearParams p;
    p.w = w;
    if (xs != nullptr) {
      p.x = *xs;
    } else {
      DSI_RETURN_IF_ERROR(split_bf16(ws, x, n, w.cols, 0, s, &p.x));
    }
    p.n = n;
    p.y = y;
    p.accumulate = accumulate;
    p.wgmma = ctx.wgmma;
    p.scratch_floats = ctx.wgmma ? cuda::bf16x2_linear_scratch_floats(w, w.rows, n, 1) : 0;
    if (p.scratch_floats > 0)
      DSI_RETURN_IF_ERROR(ws->get(&p.scratch, p.scratch_floats));
    return cuda::launch_bf16x2_linear(p, s);
  }
  cuda::LinearParams p;
  p.w = w;
  p.x = x;
  p.n = n;
  p.y = y;
  p.quantize_activations = q8;
  p.accumulate = accumulate;
  return cuda::launch_linear(p, s);
}

inline Status linear(const MatrixRef& w,
                     const float* x,
                     int64_t n,
                     float* y,
                     bool q8,
                     cudaStream_t s,
                     bool accumulate = false) {
  cuda::LinearParams p;
  p.w = w;
  p.x = x;
  p.n = n;
  p.y = y;
  p.quantize_activations = q8;
  p.accumulate = accumulate;
  return cuda::launch_linear(p, s);
}

// The grouped low-rank attention output on the reference tile: for each of `groups` groups g,
// y[:, g * rows ..] = rows [g * rows, (g + 1) * rows) of w times x[:, g * group_in ..] (x rows ldx
// apart, y rows groups * rows apart).
inline Status grouped_linear(const MatrixRef& w,
                             int64_t groups,
                             int64_t rows,
                             const float* x,
                             int64_t ldx,
                             int64_t group_in,
                             int64_t n,
                             float* y,
                             cudaStream_t s) {
  for (int64_t g = 0; g < groups; ++g) {
    cuda::LinearParams p;
    p.w = w;
    p.row_begin = g * rows;
    p.rows = rows;
    p.x = x + g * group_in;
    p.ldx = ldx;
    p.n = n;
    p.y = y + g * rows;
    p.ldy = groups * rows;
    DSI_RETURN_IF_ERROR(cuda::launch_linear(p, s));
  }
  return Status();
}

// rms_norm in place, then (half > 0) the RoPE of each row's last 2 * half dims (rows_per_token
// rows per position), in one pass where the kernel can (elementwise.h); with out_bf16 the rows go
// there as BF16 instead (cuda::rms_norm_writes_bf16).
inline Status rms_norm_rope(float* x,
                            int64_t rows,
                            int64_t dim,
                            const float* w,
                            float eps,
                            int64_t rows_per_token,
                            const int64_t* positions,
                            const float* inv_freq,
                            int64_t half,
                            cudaStream_t s,
                            uint16_t* out_bf16 = nullptr,
                            int64_t store_fp8_block = 0) {
  cuda::RmsNormParams p;
  p.x = x;
  p.rows = rows;
  p.dim = dim;
  p.weight = w;
  p.eps = eps;
  p.out = out_bf16 ? nullptr : x;
  p.out_bf16 = out_bf16;
  p.rope_positions = positions;
  p.rope_inv_freq = inv_freq;
  p.rope_half = half;
  p.rope_rows_per_token = rows_per_token;
  p.store_fp8_block = store_fp8_block;
  return cuda::launch_rms_norm(p, s);
}

inline Status rms_norm(
    float* x, int64_t rows, int64_t dim, const float* w, float eps, cudaStream_t s) {
  return rms_norm_rope(x, rows, dim, w, eps, 1, nullptr, nullptr, 0, s);
}

// rms_norm in place, the result also quantised as FP8 activations for the linears it feeds
// (codes and scales taken from ws; the bits of quantize_fp8): by the norm kernel itself where
// that is faster (short rows: one launch less on a decode step's chain), else by a quantisation
// pass after it (cuda::RmsNormParams::act_codes).
inline Status rms_norm_fp8(Workspace* ws,
                           float* x,
                           int64_t rows,
                           int64_t dim,
                           const float* w,
                           float eps,
                           cudaStream_t s,
                           cuda::Fp8Acts* out) {
  Fp8ActsRoom room;
  DSI_RETURN_IF_ERROR(fp8_acts_room(ws, rows, dim, &room));
  cuda::RmsNormParams p{.x = x, .rows = rows, .dim = dim, .weight = w, .eps = eps, .out = x};
  p.act_codes = room.codes;
  p.act_scales = room.scales;
  DSI_RETURN_IF_ERROR(cuda::launch_rms_norm(p, s));
  *out = room.acts();
  return Status();
}

// rms_norm in place before the linear `proj` reads x: with FP8 activations written for it where
// proj takes them (rms_norm_fp8; *acts receives them and the result points at it), else plain
// (null). The caller passes the result to linear() as its quantised x.
inline Result<const cuda::Fp8Acts*> rms_norm_for(Workspace* ws,
                                                 const MatrixRef& proj,
                                                 bool q8,
                                                 float* x,
                                                 int64_t rows,
                                                 int64_t dim,
                                                 const float* w,
                                                 float eps,
                                                 cudaStream_t s,
                                                 cuda::Fp8Acts* acts) {
  if (rows > 0 && fp8_linear_path(proj, q8) && proj.cols == dim) {
    DSI_RETURN_IF_ERROR(rms_norm_fp8(ws, x, rows, dim, w, eps, s, acts));
    return static_cast<const cuda::Fp8Acts*>(acts);
  }
  DSI_RETURN_IF_ERROR(rms_norm(x, rows, dim, w, eps, s));
  return static_cast<const cuda::Fp8Acts*>(nullptr);
}

inline Status rope(float* x,
                   int64_t tokens,
                   int64_t heads,
                   int64_t dim,
                   const int64_t* positions,
                   const float* inv_freq,
                   int64_t half,
                   bool inverse,
                   cudaStream_t s) {
  cuda::RopeParams p;
  p.x = x;
  p.tokens = tokens;
  p.heads = heads;
  p.dim = dim;
  p.positions = positions;
  p.inv_freq = inv_freq;
  p.half = half;
  p.inverse = inverse;
  return cuda::launch_rope(p, s);
}

}  // namespace dsinfer::gpu
