// Row-wise kernels: embedding gather, RMSNorm, RoPE, quantisation simulations, Hadamard. Thin
// launchers; the arithmetic mirrors kernels/cpu/ops.cc and numeric/quant.cc operation by
// operation (explicit __fmul_rn/__fadd_rn where the CPU's order must be kept without FMA
// contraction).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;
// rms_norm_warp_kernel: two rows per warp from this many blocks' worth of rows on.
constexpr int kRmsPairsFromBlocks = 4096;
// rms_norm_split_kernel (one block per row) up to this many rows: decode steps (batch x the q
// norm's heads) rather than prefill chunks.
constexpr int64_t kRmsSplitMaxRows = 512;

// DSINFER_RMS_SPLIT=0: the one-warp-per-row kernel for every row count (an A/B switch).
bool rms_split_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("DSINFER_RMS_SPLIT");
    return e == nullptr || std::string(e) != "0";
  }();
  return on;
}

unsigned grid_1d(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>(work, 1, kMaxBlocks));
}

__global__ void embed_kernel(EmbedParams p) {
  pdl_begin();
  const int64_t cols = p.table.cols;
  for (int64_t t = blockIdx.y; t < p.n; t += gridDim.y) {
    const int32_t tok = p.tokens[t];
    const bool valid = tok >= 0 && tok < p.table.rows;
    float* o = p.out + t * p.copies * cols;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const float v = valid ? load_weight(p.table, tok, c) : __int_as_float(0x7fc00000);
      for (int64_t j = 0; j < p.copies; ++j) o[j * cols + c] = v;
    }
  }
}

__global__ void rms_norm_kernel(RmsNormParams p) {
  pdl_begin();
  __shared__ double scratch[32];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float* x = p.x + r * p.dim;
    double ss = 0.0;
    // Unrolled so that the loads of one row are in flight together (a decode row is one block:
    // latency-bound otherwise); the sum's order is unchanged.
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
      ss += static_cast<double>(x[i]) * x[i];
    }
    ss = block_sum(ss, scratch);
    const float rinv = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(p.dim)) + p.eps);
    float* o = p.out + r * p.dim;
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
      const float v = __fmul_rn(x[i], rinv);
      o[i] = p.weight ? __fmul_rn(p.weight[i], v) : v;
    }
  }
}

// One warp per row of V * 128 dims (float4 j of lane l at column 128 j + 4 l), the row in
// registers: sum of squares in double (the lane's values in column order, then the butterfly),
// the CPU's two roundings per value, then the RoPE pairs of the rotated slice as rope_kernel, then
// (store_fp8_block) the record rounding as quant_sim's kFp8 and kBf16 passes. The weight and the
// RoPE frequencies are loaded before the PDL wait (constants: they arrive during the previous
// kernel's tail instead of costing a round trip after the sum). R rows per warp at a time (R = 2
// for many rows: the second row's loads in flight with the first's, and each block works twice as
// long), each row's arithmetic the same.
//
// Slice j of row r (float4 j of every lane, columns 128 j ..) after the sum: scaled by rinv and
// the weight, rotated, rounded as a record, stored, and quantised as activation block j. The
// one-warp-per-row kernel runs it for j = 0 .. V - 1, the split kernel's warp j for its own j.
__device__ __forceinline__ void rms_norm_slice(const RmsNormParams& p,
                                               int64_t r,
                                               int j,
                                               float4 x,
                                               const float (&w)[4],
                                               const float (&f)[2],
                                               float rinv,
                                               float pos,
                                               int64_t c_rope,
                                               int sim_lanes) {
  const int lane = threadIdx.x & 31;
  const int64_t c = 128 * j + 4 * lane;
  float e[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    e[i] = __fmul_rn(e[i], rinv);
    if (p.weight)
      e[i] = __fmul_rn(w[i], e[i]);
  }
  if (p.rope_half > 0 && c >= c_rope) {
#pragma unroll
    for (int h = 0; h < 2; ++h) rope_rotate(e[2 * h], e[2 * h + 1], pos, f[h]);
  }
  if (sim_lanes > 0) {  // warp-uniform: every lane reaches the shuffles
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(e[i]));
    for (int m = 1; m < sim_lanes; m <<= 1)
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const bool fp8 = c < c_rope;  // the RoPE dims are stored as BF16
    const float sc = fp8 ? quant_scale(amax, QuantSim::kFp8) : 1.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      e[i] = quant_value(e[i], sc, fp8 ? QuantSim::kFp8 : QuantSim::kBf16);
  }
  if (p.out_bf16 != nullptr) {
    *reinterpret_cast<uint2*>(p.out_bf16 + r * p.dim + c) =
        make_uint2(mma::pack_bf16(e[0], e[1]), mma::pack_bf16(e[2], e[3]));
  } else {
    *reinterpret_cast<float4*>(p.out + r * p.dim + c) = make_float4(e[0], e[1], e[2], e[3]);
  }
  if (p.act_codes != nullptr) {  // warp-uniform; activation block j is this warp's e values
    uint32_t packed = 0;
    const float s = act_quant_warp_block(e, &packed);
    *reinterpret_cast<uint32_t*>(p.act_codes + r * p.dim + c) = packed;
    if (lane == 0)
      p.act_scales[r * (p.dim / 128) + j] = s;
  }
}

// 1 / sqrt(mean square + eps) from the row's sum of squares (every lane after the butterfly).
__device__ __forceinline__ float rms_rinv(double ss, const RmsNormParams& p) {
  return 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(p.dim)) + p.eps);
}

__device__ __forceinline__ float rms_rope_pos(const RmsNormParams& p, int64_t r) {
  return p.rope_half > 0 ? static_cast<float>(p.rope_positions[r / p.rope_rows_per_token]) : 0.0f;
}

// The weight and RoPE frequency of this lane's columns in slice j (constants).
__device__ __forceinline__ void rms_slice_constants(
    const RmsNormParams& p, int j, int64_t c_rope, float (&w)[4], float (&f)[2]) {
  const int64_t c = 128 * j + 4 * (threadIdx.x & 31);
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = p.weight ? __ldg(p.weight + c + i) : 1.0f;
  const bool rot = p.rope_half > 0 && c >= c_rope;
#pragma unroll
  for (int h = 0; h < 2; ++h) f[h] = rot ? __ldg(p.rope_inv_freq + (c - c_rope) / 2 + h) : 0;
}

template <int V>
__device__ __forceinline__ void rms_norm_warp_row(const RmsNormParams& p,
                                                  int64_t r,
                                                  const float4 (&v)[V],
                                                  const float (&wv)[V][4],
                                                  const float (&fq)[V][2],
                                                  int64_t c_rope,
                                                  int sim_lanes) {
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    ss += static_cast<double>(v[j].x) * v[j].x;
    ss += static_cast<double>(v[j].y) * v[j].y;
    ss += static_cast<double>(v[j].z) * v[j].z;
    ss += static_cast<double>(v[j].w) * v[j].w;
  }
  ss = warp_sum(ss);
  const float rinv = rms_rinv(ss, p);
  const float pos = rms_rope_pos(p, r);
#pragma unroll
  for (int j = 0; j < V; ++j)
    rms_norm_slice(p, r, j, v[j], wv[j], fq[j], rinv, pos, c_rope, sim_lanes);
}

// Few rows (decode): one block of V warps per row, warp j holding slice j, so that the slices'
// scaling, RoPE, record rounding and activation quantisation run side by side instead of one
// after another in one warp (and each warp executes one slice's code, not V unrolled copies).
// Measured (H100, 4 V4-Flash layers, 38th session): decode batch 1 -2.8%, batch 64 -0.6%.
// The sum keeps the one-warp kernel's order, hence its bits: warp 0 adds each lane's squares in
// column order from shared memory (slice 0's four values, then slice 1's, ...), then the same
// butterfly; the double products of floats are exact, so fused or not they add the same values.
template <int V>
__global__ void __launch_bounds__(32 * V) rms_norm_split_kernel(RmsNormParams p) {
  __shared__ float4 sx[V][32];
  __shared__ float s_rinv;
  const int lane = threadIdx.x & 31;
  const int j = threadIdx.x >> 5;
  const int64_t c_rope = p.dim - 2 * p.rope_half;
  float w[4];
  float f[2];
  pdl_begin_after([&] { rms_slice_constants(p, j, c_rope, w, f); });
  const int sim_lanes = static_cast<int>(p.store_fp8_block / 4);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float4 x = *reinterpret_cast<const float4*>(p.x + r * p.dim + 128 * j + 4 * lane);
    sx[j][lane] = x;
    __syncthreads();
    if (j == 0) {
      double ss = 0.0;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float4 v = sx[k][lane];
        ss += static_cast<double>(v.x) * v.x;
        ss += static_cast<double>(v.y) * v.y;
        ss += static_cast<double>(v.z) * v.z;
        ss += static_cast<double>(v.w) * v.w;
      }
      ss = warp_sum(ss);
      if (lane == 0)
        s_rinv = rms_rinv(ss, p);
    }
    __syncthreads();
    rms_norm_slice(p, r, j, x, w, f, s_rinv, rms_rope_pos(p, r), c_rope, sim_lanes);
    __syncthreads();  // sx and s_rinv are rewritten by the next row
  }
}

template <int V, int R>
__global__ void __launch_bounds__(kThreads, R == 2 && V <= 4 ? 3 : 1)
    rms_norm_warp_kernel(RmsNormParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t per_block = blockDim.x >> 5;
  const int64_t c_rope = p.dim - 2 * p.rope_half;
  float wv[V][4];
  float fq[V][2];
  pdl_begin_after([&] {
#pragma unroll
    for (int j = 0; j < V; ++j) rms_slice_constants(p, j, c_rope, wv[j], fq[j]);
  });
  const int sim_lanes = static_cast<int>(p.store_fp8_block / 4);  // lanes per FP8 block
  const int64_t stride = static_cast<int64_t>(gridDim.x) * per_block;
  for (int64_t r0 = blockIdx.x * per_block + (threadIdx.x >> 5); r0 < p.rows; r0 += R * stride) {
    float4 v[R][V];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int64_t r = r0 + k * stride;
      if (r < p.rows) {
        const float* x = p.x + r * p.dim;
#pragma unroll
        for (int j = 0; j < V; ++j)
          v[k][j] = *reinterpret_cast<const float4*>(x + 128 * j + 4 * lane);
      }
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int64_t r = r0 + k * stride;
      if (r < p.rows)  // warp-uniform
        rms_norm_warp_row<V>(p, r, v[k], wv, fq, c_rope, sim_lanes);
    }
  }
}

__global__ void rope_kernel(RopeParams p) {
  pdl_begin();
  const int64_t rows = p.tokens * p.heads;
  const int64_t work = rows * p.half;
  const int64_t ld = p.ld > 0 ? p.ld : p.dim;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < work;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = w / p.half;
    const int64_t i = w % p.half;
    float* r = p.x + row * ld + (p.dim - 2 * p.half);
    const float pos = static_cast<float>(p.positions[row / p.heads]);
    rope_rotate(r[2 * i], r[2 * i + 1], pos, p.inv_freq[i], p.inverse);
  }
}

constexpr int64_t kMaxHadamard = 4096;

__global__ void quant_sim_kernel(QuantSimParams p) {
  pdl_begin();
  extern __shared__ float sh[];
  const int64_t ld = p.ld > 0 ? p.ld : p.len;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    float* x = p.x + r * ld;
    float* v = x;
    if (p.hadamard) {
      for (int64_t i = threadIdx.x; i < p.len; i += blockDim.x) sh[i] = x[i];
      hadamard_block(sh, p.len);
      v = sh;
    }
    quant_row_block(v, p.len, p.block, p.kind);
    if (p.hadamard) {
      for (int64_t i = threadIdx.x; i < p.len; i += blockDim.x) x[i] = sh[i];
      __syncthreads();
    }
  }
}

// kBf16 without the Hadamard: every value rounded on its own, so rows of any length spread over
// the whole grid (the attention output at decode is one row of heads * head_dim values, which one
// block of quant_sim_kernel walked alone).
__global__ void quant_bf16_kernel(QuantSimParams p) {
  pdl_begin();
  const int64_t ld = p.ld > 0 ? p.ld : p.len;
  const int64_t total = p.rows * p.len;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float* x = p.x + (i / p.len) * ld + i % p.len;
    *x = quant_value(*x, 1.0f, QuantSim::kBf16);
  }
}

// Rows of 32 * V values, one warp per row, lane l holding values [V l, V l + V) in registers: the
// Hadamard butterflies of hadamard_block in the same order (stride 1, 2, 4, ...; a + b below, a - b
// above; strides >= V between lanes by shuffles), its final scale, then each block of `block`
// values (block / V lanes) rounded as quant_block_warp: the same bits, without the block-wide
// barriers of one row per block.
template <int V>
__global__ void quant_sim_warp_kernel(QuantSimParams p) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int64_t ld = p.ld > 0 ? p.ld : p.len;
  const int64_t per_block = blockDim.x >> 5;
  const int lanes_per_block = static_cast<int>(p.block / V);
  auto process = [&](float(&v)[V]) {
    if (p.hadamard) {
#pragma unroll
      for (int h = 1; h < V; h <<= 1) {
#pragma unroll
        for (int i = 0; i < V; ++i) {
          if ((i & h) == 0) {
            const float a = v[i];
            const float b = v[i + h];
            v[i] = a + b;
            v[i + h] = a - b;
          }
        }
      }
      for (int m = 1; m < 32; m <<= 1) {  // element stride V * m
        const bool upper = (lane & m) != 0;
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const float other = __shfl_xor_sync(0xffffffffu, v[i], m);
          v[i] = upper ? other - v[i] : v[i] + other;
        }
      }
      const float scale = 1.0f / sqrtf(static_cast<float>(p.len));
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = v[i] * scale;
    }
    if (p.kind == QuantSim::kBf16) {
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = quant_value(v[i], 1.0f, p.kind);
    } else if (p.kind != QuantSim::kNone) {
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < V; ++i) amax = fmaxf(amax, fabsf(v[i]));
      for (int m = 1; m < lanes_per_block; m <<= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
      const float s = quant_scale(amax, p.kind);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = quant_value(v[i], s, p.kind);
    }
  };
  // Two rows per warp step, both rows' loads issued before either is processed (one row at a
  // time waited for each row's load: the indexer's q at prefill ran at 0.9 TB/s).
  const int64_t step = static_cast<int64_t>(gridDim.x) * per_block;
  for (int64_t r = blockIdx.x * per_block + (threadIdx.x >> 5); r < p.rows; r += 2 * step) {
    const bool second = r + step < p.rows;
    float* x0 = p.x + r * ld + V * lane;
    float* x1 = p.x + (r + step) * ld + V * lane;
    float v0[V], v1[V];
#pragma unroll
    for (int i = 0; i < V; ++i) v0[i] = x0[i];
    if (second) {
#pragma unroll
      for (int i = 0; i < V; ++i) v1[i] = x1[i];
    }
    process(v0);
#pragma unroll
    for (int i = 0; i < V; ++i) x0[i] = v0[i];
    if (second) {
      process(v1);
#pragma unroll
      for (int i = 0; i < V; ++i) x1[i] = v1[i];
    }
  }
}

}  // namespace

Status launch_embed(const EmbedParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("embed", {p.n, p.copies}));
  DSI_RETURN_IF_ERROR(check_weight(p.table, "embed table"));
  if (p.n == 0 || p.copies == 0 || p.table.cols == 0)
    return Status();
  if (!p.tokens || !p.out)
    return null_pointer("embed");
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(p.table.cols, kThreads), 1024)),
                  static_cast<unsigned>(std::min<int64_t>(p.n, kMaxBlocks)));
  launch_pdl(embed_kernel, grid, kThreads, 0, stream, p);
  return launched("embed launch");
}

bool rms_norm_writes_bf16(int64_t dim, int64_t rope_half) {
  const int64_t v = dim / 128;
  return dim % 128 == 0 && (v == 1 || v == 2 || v == 4 || v == 8) && (dim - 2 * rope_half) % 4 == 0;
}

bool rms_norm_stores_records(int64_t dim, int64_t rope_half, int64_t fp8_block) {
  const int64_t lanes = fp8_block / 4;
  return rms_norm_writes_bf16(dim, rope_half) && fp8_block % 4 == 0 && lanes >= 1 && lanes <= 32 &&
         (lanes & (lanes - 1)) == 0 && (dim - 2 * rope_half) % fp8_block == 0;
}

Status launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_shape(p.rows, p.dim, "rms_norm"));
  if (p.rows == 0 || p.dim == 0)
    return Status();
  if (!p.x || (!p.out && !p.out_bf16))
    return null_pointer("rms_norm");
  const bool rope = p.rope_half > 0;
  if (rope) {
    DSI_RETURN_IF_ERROR(require(2 * p.rope_half <= p.dim && p.rope_rows_per_token > 0 &&
                                    p.rows % p.rope_rows_per_token == 0,
                                "rms_norm",
                                "the RoPE slice exceeds the row, or rows are not whole tokens"));
    if (!p.rope_positions || !p.rope_inv_freq)
      return null_pointer("rms_norm rope");
  }
  const auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  const int64_t v = p.dim / 128;  // float4 per lane in the one-warp-per-row kernel
  const bool warp_path = rms_norm_writes_bf16(p.dim, rope ? p.rope_half : 0) && aligned(p.x) &&
                         (p.out_bf16 ? aligned(p.out_bf16) : aligned(p.out));
  if (p.out_bf16 != nullptr && !warp_path)
    return invalid_argument(
        "rms_norm: BF16 output needs dim a multiple of 128 (<= 1024), 16-byte "
        "aligned rows and a RoPE slice starting at a multiple of 4");
  DSI_RETURN_IF_ERROR(require(p.store_fp8_block >= 0, "rms_norm", "store_fp8_block < 0"));
  // Few rows: one block per row, a warp per 128-column slice (rms_norm_split_kernel).
  const bool split = warp_path && v >= 2 && p.rows <= kRmsSplitMaxRows && rms_split_enabled();
  if (p.act_codes != nullptr || p.act_scales != nullptr) {
    if (!p.act_codes || !p.act_scales || !p.out || p.out_bf16)
      return invalid_argument(
          "rms_norm: FP8 activations need codes, scales and the fp32 output (not BF16)");
    // In the one-warp-per-row kernel only for rows of up to 256 dims: its one warp per row then
    // quantises one or two blocks (the bundled model's q norm and MTP norms: +2% tokens/s at
    // batch 1 on the H200); at V4's 1024-dim q norm the eight blocks in one warp made the batch-1
    // step 4% slower than the separate pass (nineteenth session, A/B on one machine). The split
    // kernel quantises each block in its own warp: the q norm with its activations 4.5 us per
    // layer at batch 1 against 10.2 + 3.2 us for the norm and the pass (ncu, H100, 38th session).
    if (!warp_path || (v > 2 && !split) || p.store_fp8_block > 0) {  // the norm, then the pass
      RmsNormParams q = p;
      q.act_codes = nullptr;
      q.act_scales = nullptr;
      DSI_RETURN_IF_ERROR(launch_rms_norm(q, stream));
      return launch_quantize_fp8(
          QuantizeFp8Params{
              .x = p.out, .n = p.rows, .k = p.dim, .codes = p.act_codes, .scales = p.act_scales},
          stream);
    }
  }
  if (p.store_fp8_block > 0 &&
      !(warp_path && rms_norm_stores_records(p.dim, rope ? p.rope_half : 0, p.store_fp8_block))) {
    // The record rounding as passes of their own after the norm (and its RoPE).
    if (p.out_bf16 != nullptr)
      return invalid_argument(
          "rms_norm: the record rounding with BF16 output needs "
          "rms_norm_stores_records");
    RmsNormParams q = p;
    q.store_fp8_block = 0;
    DSI_RETURN_IF_ERROR(launch_rms_norm(q, stream));
    QuantSimParams qs;
    qs.x = p.out;
    qs.rows = p.rows;
    qs.ld = p.dim;
    qs.len = p.dim - 2 * (rope ? p.rope_half : 0);
    qs.block = p.store_fp8_block;
    qs.kind = QuantSim::kFp8;
    DSI_RETURN_IF_ERROR(launch_quant_sim(qs, stream));
    qs.x = p.out + qs.len;
    qs.len = p.dim - qs.len;
    qs.kind = QuantSim::kBf16;
    return launch_quant_sim(qs, stream);
  }
  if (split) {
    auto* k = v == 2   ? rms_norm_split_kernel<2>
              : v == 4 ? rms_norm_split_kernel<4>
                       : rms_norm_split_kernel<8>;
    launch_pdl(k, static_cast<unsigned>(p.rows), static_cast<unsigned>(32 * v), 0, stream, p);
    return launched("rms_norm launch");
  }
  if (warp_path) {
    // Two rows per warp at a time once there are more rows than one row per warp of a full
    // grid would take (prefill: the per-head q norm's 64 rows per token).
    const int64_t warps = kThreads / 32;
    const bool pairs = p.rows > warps * int64_t{kRmsPairsFromBlocks};
    const unsigned grid = grid_1d(ceil_div(p.rows, warps * (pairs ? 2 : 1)));
    auto* k = v == 1   ? (pairs ? rms_norm_warp_kernel<1, 2> : rms_norm_warp_kernel<1, 1>)
              : v == 2 ? (pairs ? rms_norm_warp_kernel<2, 2> : rms_norm_warp_kernel<2, 1>)
              : v == 4 ? (pairs ? rms_norm_warp_kernel<4, 2> : rms_norm_warp_kernel<4, 1>)
                       : (pairs ? rms_norm_warp_kernel<8, 2> : rms_norm_warp_kernel<8, 1>);
    launch_pdl(k, grid, kThreads, 0, stream, p);
    return launched("rms_norm launch");
  }
  launch_pdl(rms_norm_kernel, grid_1d(p.rows), kThreads, 0, stream, p);
  DSI_RETURN_IF_ERROR(launched("rms_norm launch"));
  if (!rope)
    return Status();
  RopeParams q;
  q.x = p.out;
  q.tokens = p.rows / p.rope_rows_per_token;
  q.heads = p.rope_rows_per_token;
  q.dim = p.dim;
  q.positions = p.rope_positions;
  q.inv_freq = p.rope_inv_freq;
  q.half = p.rope_half;
  return launch_rope(q, stream);
}

Status launch_rope(const RopeParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("rope", {p.tokens, p.heads, p.dim, p.half, p.ld}));
  DSI_RETURN_IF_ERROR(require(2 * p.half <= p.dim, "rope", "2*half exceeds dim"));
  DSI_RETURN_IF_ERROR(require(p.ld == 0 || p.ld >= p.dim, "rope", "ld < dim"));
  if (p.tokens == 0 || p.heads == 0 || p.half == 0)
    return Status();
  if (!p.x || !p.positions || !p.inv_freq)
    return null_pointer("rope");
  launch_pdl(rope_kernel,
             grid_1d(ceil_div(p.tokens * p.heads * p.half, kThreads)),
             kThreads,
             0,
             stream,
             p);
  return launched("rope launch");
}

Status launch_quant_sim(const QuantSimParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("quant_sim", {p.rows, p.len, p.ld}));
  DSI_RETURN_IF_ERROR(require(p.block > 0, "quant_sim", "block must be positive"));
  DSI_RETURN_IF_ERROR(require(p.ld == 0 || p.ld >= p.len, "quant_sim", "ld < len"));
  if (p.hadamard) {
    DSI_RETURN_IF_ERROR(
        require(p.len > 0 && (p.len & (p.len - 1)) == 0 && p.len <= kMaxHadamard,
                "quant_sim",
                "Hadamard length must be a power of two <= 4096, got " + std::to_string(p.len)));
  }
  if (p.rows == 0 || p.len == 0 || (p.kind == QuantSim::kNone && !p.hadamard))
    return Status();
  if (!p.x)
    return null_pointer("quant_sim");
  if (p.kind == QuantSim::kBf16 && !p.hadamard) {
    launch_pdl(
        quant_bf16_kernel, grid_1d(ceil_div(p.rows * p.len, kThreads)), kThreads, 0, stream, p);
    return launched("quant_sim bf16 launch");
  }
  // One warp per row where a row is 32, 64, 128 or 256 values whose blocks span whole lanes.
  const int64_t v = p.len / 32;
  if (p.len % 32 == 0 && (v == 1 || v == 2 || v == 4 || v == 8) &&
      (p.kind == QuantSim::kNone || p.kind == QuantSim::kBf16 ||
       (p.block % v == 0 && p.block / v <= 32 && ((p.block / v) & (p.block / v - 1)) == 0 &&
        p.len % p.block == 0))) {
    const unsigned grid = grid_1d(ceil_div(p.rows, 2 * (kThreads / 32)));  // two rows per warp
    if (v == 1) {
      launch_pdl(quant_sim_warp_kernel<1>, grid, kThreads, 0, stream, p);
    } else if (v == 2) {
      launch_pdl(quant_sim_warp_kernel<2>, grid, kThreads, 0, stream, p);
    } else if (v == 4) {
      launch_pdl(quant_sim_warp_kernel<4>, grid, kThreads, 0, stream, p);
    } else {
      launch_pdl(quant_sim_warp_kernel<8>, grid, kThreads, 0, stream, p);
    }
    return launched("quant_sim launch");
  }
  const size_t smem = p.hadamard ? static_cast<size_t>(p.len) * sizeof(float) : 0;
  launch_pdl(quant_sim_kernel, grid_1d(p.rows), kThreads, smem, stream, p);
  return launched("quant_sim launch");
}

}  // namespace dsinfer::cuda
