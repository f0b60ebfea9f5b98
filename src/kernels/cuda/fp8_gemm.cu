// Tensor-core linear layers and grouped experts over FP8 activations (fp8_gemm.h); the block tile
// is in fp8_mma_tile.cuh. Tile shapes, picked by tokens per weight: decode (16 rows x 8 tokens, K
// over 8 warps; 64 x 8 with K over 2 warps for the experts), medium (32 x 32, K over 4 warps) and
// prefill (128 x 64). All sum in the same order (fp8_mma_tile.cuh), so results do not depend on it.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/fp8_gemm.h"
#if DSINFER_HAVE_CUTLASS
#include "kernels/cuda/bf16_gemm_sm90.h"
#include "kernels/cuda/fp8_gemm_sm90.h"
#endif
#include "kernels/cuda/fp8_gemm_decode.h"
#include "kernels/cuda/fp8_mma_tile.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace dsinfer::cuda {
namespace {

using mma::AMode;
using mma::WFmt;
using CfgDecode = mma::Cfg<16, 8, 1, 1, 8, 3>;
// Decode-sized experts (<= 8 pairs per expert): 64 weight rows per block, so that a batch-1 layer
// is one wave of blocks that each stream 64 rows, instead of several waves of 16-row blocks.
using CfgDecodeExperts = mma::Cfg<64, 8, 4, 1, 2, 4>;
using CfgMedium = mma::Cfg<32, 32, 2, 1, 4, 3>;
using CfgPrefill = mma::Cfg<128, 64, 4, 2, 1, 4>;

constexpr int64_t kMaxGridY = 65535;

// ---- activation quantisation: one warp per 1x128 block ----------------------------------------

__global__ void quantize_fp8_kernel(QuantizeFp8Params p, int64_t ld, int64_t blocks_per_row) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int64_t total = p.n * blocks_per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       b < total;
       b += warps) {
    const int64_t t = b / blocks_per_row;
    const int64_t c0 = (b % blocks_per_row) * 128 + lane * 4;
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = c0 + i < p.k ? p.x[t * p.ldx + c0 + i] : 0.0f;
    uint32_t packed = 0;  // the columns past k are zeros: code 0
    const float s = act_quant_warp_block(v, &packed);
    *reinterpret_cast<uint32_t*>(p.codes + t * ld + c0) = packed;
    if (lane == 0)
      p.scales[b] = s;
  }
}

// ---- dense linear ----------------------------------------------------------------------------

// The dense kernels' arguments, either activation mode (fp8_mma_tile.cuh TileIo).
struct DenseArgs {
  MatrixRef w;
  int64_t row_begin = 0;
  int64_t rows = 0;
  const uint8_t* xa = nullptr;
  const uint8_t* xb = nullptr;
  const float* xs = nullptr;
  int64_t x_row_bytes = 0;
  int64_t n = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;
  // Independent groups (blockIdx.z): group g uses weight rows row_begin + g * rows, x from byte
  // g * group_x_bytes of each row, y from column g * group_y of each row.
  int64_t group_x_bytes = 0;
  int64_t group_y = 0;
  // Split-K: blockIdx.z = group * splits + split; split s covers K chunks [s * split_chunks, +
  // split_chunks) and writes its partial to part[s][token][group * rows + row], which
  // dense_split_reduce_kernel sums in split order into y.
  int splits = 1;
  int64_t split_chunks = 0;
  float* part = nullptr;
};

template <class C, WFmt F, AMode A>
__global__ void __launch_bounds__(C::kThreads) dense_kernel(DenseArgs p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int32_t xrow[C::BN];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * C::BM;
  const int64_t ldy = p.ldy > 0 ? p.ldy : p.rows;
  const int64_t g = blockIdx.z / p.splits;
  const int64_t split = blockIdx.z % p.splits;
  const int64_t row_begin = p.row_begin + g * p.rows;
  float* const y_base = p.y + g * p.group_y;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * C::BN; t0 < p.n;
       t0 += static_cast<int64_t>(gridDim.y) * C::BN) {
    for (int j = threadIdx.x; j < C::BN; j += C::kThreads)
      xrow[j] = t0 + j < p.n ? static_cast<int32_t>(t0 + j) : -1;
    __syncthreads();
    mma::TileIo io;
    io.wa = p.w;
    io.wb = p.w;
    io.ra0 = row_begin + r0;
    io.ra_end = row_begin + p.rows;
    io.rb0 = io.ra0 + C::BM / 2;
    io.rb_end = io.ra_end;
    io.x_row = xrow;
    io.xa = p.xa + g * p.group_x_bytes;
    io.xb = p.xb ? p.xb + g * p.group_x_bytes : nullptr;
    io.xs = p.xs ? p.xs + g * p.group_x_bytes / 128 : nullptr;
    io.x_row_bytes = p.x_row_bytes;
    io.k = p.w.cols;
    if (p.splits > 1) {
      io.kc0 = split * p.split_chunks;
      io.w_cols = p.w.cols;
      io.k = min(p.split_chunks * mma::kChunkK<A>, p.w.cols - io.kc0 * mma::kChunkK<A>);
    }
    const float* red = mma::tile_mma<C, F, A>(io, smem);
    for (int idx = threadIdx.x; idx < C::BM * C::BN; idx += C::kThreads) {
      const int j = idx / C::BM;
      const int i = idx % C::BM;
      const int64_t t = t0 + j;
      const int64_t r = r0 + i;
      if (t < p.n && r < p.rows) {
        const float v = red[j * C::BM + i];
        if (p.splits > 1) {
          const int64_t width = gridDim.z / p.splits * p.rows;
          p.part[(split * p.n + t) * width + g * p.rows + r] = v;
        } else {
          float* y = y_base + t * ldy + r;
          *y = p.accumulate ? *y + v : v;
        }
      }
    }
    __syncthreads();
  }
}

// y[t, g * group_y + r] (+)= the splits' partials of (t, g, r) summed in split order.
__global__ void dense_split_reduce_kernel(DenseArgs p, int64_t groups) {
  const int64_t width = groups * p.rows;
  const int64_t total = p.n * width;
  const int64_t ldy = p.ldy > 0 ? p.ldy : p.rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / width;
    const int64_t g = (i % width) / p.rows;
    const int64_t r = i % p.rows;
    float v = p.part[i];
    for (int s = 1; s < p.splits; ++s) v += p.part[s * total + i];
    float* y = p.y + g * p.group_y + t * ldy + r;
    *y = p.accumulate ? *y + v : v;
  }
}

// ---- fp32 -> BF16 high + low halves ------------------------------------------------------------

// Block (column chunk, row): each thread splits 4 consecutive columns of a row (one 16-byte load
// where the row allows it, 8-byte stores), the padding columns [k, ld) zero.
__device__ __forceinline__ void split_one(float v, uint16_t* hi, uint16_t* lo) {
  *hi = numeric::f32_to_bf16(v);
  *lo = numeric::f32_to_bf16(v - numeric::bf16_to_f32(*hi));  // v - hi is exact
}

__global__ void split_bf16_kernel(SplitBf16Params p, int64_t ld, bool vec) {
  pdl_begin();
  for (int64_t t = blockIdx.y; t < p.n; t += gridDim.y) {
    const float* x = p.x + t * p.ldx;
    for (int64_t c = 4 * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x); c < ld;
         c += 4 * static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float v[4];
      if (vec && c + 4 <= p.k) {
        const float4 f = *reinterpret_cast<const float4*>(x + c);
        v[0] = f.x;
        v[1] = f.y;
        v[2] = f.z;
        v[3] = f.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = c + i < p.k ? x[c + i] : 0.0f;
      }
      uint16_t h[4], l[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) split_one(v[i], &h[i], &l[i]);
      const int64_t o = t * ld + c;  // ld is a multiple of 64: 8-byte aligned stores
      *reinterpret_cast<uint2*>(p.hi + o) =
          make_uint2(h[0] | (uint32_t{h[1]} << 16), h[2] | (uint32_t{h[3]} << 16));
      if (p.lo != nullptr) {
        *reinterpret_cast<uint2*>(p.lo + o) =
            make_uint2(l[0] | (uint32_t{l[1]} << 16), l[2] | (uint32_t{l[3]} << 16));
      }
    }
  }
}

// ---- grouped experts ----------------------------------------------------------------------------

// Tile ty of the grouped pairs (expert e's pairs [begin_e, end_e) cut into BN-token tiles, experts
// in order): warp 0 scans the experts 32 at a time. Returns false past the last tile.
template <int BN>
__device__ bool expert_tile(
    const Fp8ExpertFfnParams& p, int64_t ty, int64_t* e_out, int64_t* g0, int64_t* g_end) {
  __shared__ int64_t found[3];
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    if (lane == 0)
      found[0] = -1;
    __syncwarp();  // the reset is ordered before the found lane's write (racecheck)
    if (p.expert_begin == nullptr) {
      if (lane == 0 && ty * BN < p.num_pairs) {
        found[0] = 0;
        found[1] = ty * BN;
        found[2] = p.num_pairs;
      }
    } else {
      int64_t base = 0;  // tiles of the experts before this group of 32
      for (int64_t e0 = 0; e0 < p.n_experts; e0 += 32) {
        const int64_t e = e0 + lane;
        int64_t b = 0, end = 0, tiles = 0;
        if (e < p.n_experts) {
          b = p.expert_begin[e];
          end = p.expert_begin[e + 1];
          tiles = (end - b + BN - 1) / BN;
        }
        int64_t incl = tiles;  // inclusive prefix over the lanes
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const int64_t o = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off)
            incl += o;
        }
        const int64_t excl = base + incl - tiles;
        if (ty >= excl && ty < excl + tiles) {
          found[0] = e;
          found[1] = b + (ty - excl) * BN;
          found[2] = end;
        }
        base += __shfl_sync(0xffffffffu, incl, 31);
        if (base > ty)
          break;
      }
    }
  }
  __syncthreads();
  *e_out = found[0];
  *g0 = found[1];
  *g_end = found[2];
  const bool ok = found[0] >= 0;
  __syncthreads();
  return ok;
}

template <class C, WFmt F>
__global__ void __launch_bounds__(C::kThreads) fp8_gate_up_kernel(Fp8ExpertFfnParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int32_t xrow[C::BN];
  int64_t e, g0, g_end;
  if (!expert_tile<C::BN>(p, blockIdx.y, &e, &g0, &g_end))
    return;  // block-uniform
  for (int j = threadIdx.x; j < C::BN; j += C::kThreads) {
    const int64_t g = g0 + j;
    xrow[j] = g < g_end ? static_cast<int32_t>((p.pair_src ? p.pair_src[g] : g) / p.k) : -1;
  }
  __syncthreads();
  constexpr int kHalf = C::BM / 2;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kHalf;
  mma::TileIo io;
  io.wa = p.w1[e];
  io.wb = p.w3[e];
  io.paired = true;
  io.ra0 = r0;
  io.rb0 = r0;
  io.ra_end = p.inter;
  io.rb_end = p.inter;
  io.x_row = xrow;
  io.xa = p.x.codes;
  io.xs = p.x.scales;
  io.x_row_bytes = p.x.ld;
  io.k = p.hidden;
  const float* red = mma::tile_mma<C, F, AMode::kE4m3>(io, smem);
  const float lim = p.swiglu_limit;
  for (int idx = threadIdx.x; idx < kHalf * C::BN; idx += C::kThreads) {
    const int j = idx / kHalf;
    const int i = idx % kHalf;
    const int64_t g = g0 + j;
    const int64_t r = r0 + i;
    if (g >= g_end || r >= p.inter)
      continue;
    const float gate = p.gates ? p.gates[p.pair_src ? p.pair_src[g] : g] : 1.0f;
    p.h[g * p.inter + r] = swiglu_gated(red[j * C::BM + i], red[j * C::BM + i + kHalf], lim, gate);
  }
}

template <class C, WFmt F>
__global__ void __launch_bounds__(C::kThreads) fp8_down_kernel(Fp8ExpertFfnParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int32_t xrow[C::BN];
  int64_t e, g0, g_end;
  if (!expert_tile<C::BN>(p, blockIdx.y, &e, &g0, &g_end))
    return;
  for (int j = threadIdx.x; j < C::BN; j += C::kThreads) {
    const int64_t g = g0 + j;
    xrow[j] = g < g_end ? static_cast<int32_t>(g) : -1;
  }
  __syncthreads();
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * C::BM;
  mma::TileIo io;
  io.wa = p.w2[e];
  io.wb = io.wa;
  io.ra0 = r0;
  io.ra_end = p.hidden;
  io.rb0 = r0 + C::BM / 2;
  io.rb_end = p.hidden;
  io.x_row = xrow;
  io.xa = p.h_codes;
  io.xs = p.h_scales;
  io.x_row_bytes = (p.inter + 127) / 128 * 128;  // fp8_acts_ld
  io.k = p.inter;
  const float* red = mma::tile_mma<C, F, AMode::kE4m3>(io, smem);
  for (int idx = threadIdx.x; idx < C::BM * C::BN; idx += C::kThreads) {
    const int j = idx / C::BM;
    const int i = idx % C::BM;
    const int64_t g = g0 + j;
    const int64_t r = r0 + i;
    if (g < g_end && r < p.hidden)
      p.y[g * p.hidden + r] = red[j * C::BM + i];
  }
}

// ---- launchers ----------------------------------------------------------------------------------

// Raises the kernel's dynamic shared-memory limit once per kernel (a static per instantiation).
template <auto Kernel, int Smem>
Status prepare() {
  static const cudaError_t err =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem);
  if (err != cudaSuccess) {
    return failed_precondition(std::string("fp8 gemm: cannot raise shared memory: ") +
                               cudaGetErrorString(err));
  }
  return Status();
}

template <class C, WFmt F, AMode A>
Status launch_dense(const DenseArgs& p, int64_t groups, cudaStream_t s) {
  constexpr auto kernel = dense_kernel<C, F, A>;
  constexpr int kSmem = C::template smem_bytes<F, A>();
  DSI_RETURN_IF_ERROR((prepare<kernel, kSmem>()));
  const dim3 grid(static_cast<unsigned>(ceil_div(p.rows, C::BM)),
                  static_cast<unsigned>(std::min(ceil_div(p.n, C::BN), kMaxGridY)),
                  static_cast<unsigned>(groups * p.splits));
  kernel<<<grid, C::kThreads, kSmem, s>>>(p);
  DSI_RETURN_IF_ERROR(launched("tensor-core linear launch"));
  if (p.splits > 1) {
    const int64_t total = p.n * groups * p.rows;
    dense_split_reduce_kernel<<<static_cast<unsigned>(
                                    std::min<int64_t>(ceil_div(total, 256), 4096)),
                                256,
                                0,
                                s>>>(p, groups);
    DSI_RETURN_IF_ERROR(launched("tensor-core linear split reduce launch"));
  }
  return Status();
}

// Split-K plan of a dense launch on tile C: when its tiles cannot fill the GPU (small weights at
// decode batches: the router, the compressors, wo_a), K is cut into splits of at least 4 chunks
// so that about two waves of blocks run. Returns the splits (1: none) and their chunk count.
template <class C, AMode A>
int dense_split_plan(int64_t rows, int64_t n, int64_t groups, int64_t k, int64_t* split_chunks) {
  const int64_t sms = sm_count();
  const int64_t blocks = ceil_div(rows, C::BM) * ceil_div(n, C::BN) * groups;
  const int64_t chunks = ceil_div(k, mma::kChunkK<A>);
  const int64_t want = std::min(ceil_div(2 * sms, std::max<int64_t>(blocks, 1)), chunks / 4);
  *split_chunks = chunks;
  if (want < 2)
    return 1;
  *split_chunks = ceil_div(chunks, want);
  return static_cast<int>(ceil_div(chunks, *split_chunks));
}

// Calls f.template operator()<C>() with the tile config launch_dense_shape uses for n tokens.
template <class Fn>
auto with_dense_cfg(int64_t n, Fn&& f) {
  if (n <= CfgDecode::BN)
    return f.template operator()<CfgDecode>();
  if (n <= CfgMedium::BN)
    return f.template operator()<CfgMedium>();
  return f.template operator()<CfgPrefill>();
}

// Scratch floats the split plan of (rows, n, groups, k) needs (0: no split).
template <AMode A>
int64_t dense_split_floats(int64_t rows, int64_t n, int64_t groups, int64_t k) {
  return with_dense_cfg(n, [&]<class C>() {
    int64_t chunks = 0;
    const int splits = dense_split_plan<C, A>(rows, n, groups, k, &chunks);
    return splits > 1 ? splits * n * groups * rows : int64_t{0};
  });
}

// With scratch (split_floats > 0 allowed), launches split-K where the plan asks for it and the
// scratch holds it.
template <WFmt F, AMode A>
Status launch_dense_shape(const DenseArgs& p,
                          cudaStream_t s,
                          int64_t groups = 1,
                          float* scratch = nullptr,
                          int64_t scratch_floats = 0) {
  return with_dense_cfg(p.n, [&]<class C>() {
    DenseArgs q = p;
    if (scratch != nullptr) {
      int64_t chunks = 0;
      const int splits = dense_split_plan<C, A>(p.rows, p.n, groups, p.w.cols, &chunks);
      if (splits > 1 && splits * p.n * groups * p.rows <= scratch_floats) {
        q.splits = splits;
        q.split_chunks = chunks;
        q.part = scratch;
      }
    }
    return launch_dense<C, F, A>(q, groups, s);
  });
}

template <class C, WFmt F>
Status launch_experts(const Fp8ExpertFfnParams& p, cudaStream_t s) {
  const int64_t experts = p.expert_begin ? p.n_experts : 1;
  const int64_t tiles = p.num_pairs / C::BN + std::min(experts, p.num_pairs);
  if (tiles > kMaxGridY)
    return invalid_argument("fp8_expert_ffn: too many pairs for one launch");
  constexpr auto up = fp8_gate_up_kernel<C, F>;
  constexpr int kSmem = C::template smem_bytes<F, AMode::kE4m3>();
  DSI_RETURN_IF_ERROR((prepare<up, kSmem>()));
  const dim3 g1(static_cast<unsigned>(ceil_div(p.inter, C::BM / 2)), static_cast<unsigned>(tiles));
  up<<<g1, C::kThreads, kSmem, s>>>(p);
  DSI_RETURN_IF_ERROR(launched("fp8_expert gate/up launch"));
  DSI_RETURN_IF_ERROR(launch_quantize_expert_h(p, s));
  constexpr auto down = fp8_down_kernel<C, F>;
  DSI_RETURN_IF_ERROR((prepare<down, kSmem>()));
  const dim3 g2(static_cast<unsigned>(ceil_div(p.hidden, C::BM)), static_cast<unsigned>(tiles));
  down<<<g2, C::kThreads, kSmem, s>>>(p);
  return launched("fp8_expert down launch");
}

template <WFmt F>
Status launch_experts_fmt(const Fp8ExpertFfnParams& p, cudaStream_t s) {
  const int64_t experts = p.expert_begin ? p.n_experts : 1;
  const int64_t per_expert = ceil_div(p.num_pairs, experts);
  if (per_expert <= 8)
    return launch_experts<CfgDecodeExperts, F>(p, s);
  if (per_expert <= 48)
    return launch_experts<CfgMedium, F>(p, s);
  return launch_experts<CfgPrefill, F>(p, s);
}

}  // namespace

bool fp8_gemm_supports(const MatrixRef& w) {
  const bool aligned = (reinterpret_cast<uintptr_t>(w.data) & 15u) == 0;
  if (w.format == WeightFormat::kFp8Block128) {
    return w.dtype == DType::kF8E4M3 &&
           (w.scale_dtype == DType::kF8E8M0 || w.scale_dtype == DType::kF32) && w.cols % 16 == 0 &&
           aligned;
  }
  if (w.format == WeightFormat::kMxfp4)
    return w.scale_dtype == DType::kF8E8M0 && w.cols % 32 == 0 && aligned;
  return false;
}

Status launch_quantize_fp8(const QuantizeFp8Params& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("quantize_fp8", {p.n, p.k, p.ldx}));
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.k;
  DSI_RETURN_IF_ERROR(require(ldx >= p.k, "quantize_fp8", "ldx < k"));
  if (p.n == 0 || p.k == 0)
    return Status();
  if (!p.x || !p.codes || !p.scales)
    return null_pointer("quantize_fp8");
  QuantizeFp8Params q = p;
  q.ldx = ldx;
  const int64_t ld = fp8_acts_ld(p.k);
  const int64_t blocks = ld / 128;
  const int64_t grid = std::min<int64_t>(ceil_div(p.n * blocks, 8), 65535);
  launch_pdl(quantize_fp8_kernel, static_cast<unsigned>(grid), 256, 0, stream, q, ld, blocks);
  return launched("quantize_fp8 launch");
}

Status launch_quantize_expert_h(const Fp8ExpertFfnParams& p, cudaStream_t stream) {
  QuantizeFp8Params q;
  q.x = p.h;
  q.ldx = p.inter;
  q.n = p.num_pairs;
  q.k = p.inter;
  q.codes = p.h_codes;
  q.scales = p.h_scales;
  return launch_quantize_fp8(q, stream);
}

Status launch_fp8_linear(const Fp8LinearParams& p, cudaStream_t stream) {
  Fp8LinearParams q = p;
  if (q.rows < 0)
    q.rows = q.w.rows - q.row_begin;
  DSI_RETURN_IF_ERROR(check_nonneg("fp8_linear", {q.n, q.ldy, q.row_begin, q.rows}));
  DSI_RETURN_IF_ERROR(
      require(q.row_begin + q.rows <= q.w.rows, "fp8_linear", "row range exceeds the weight"));
  DSI_RETURN_IF_ERROR(require(q.ldy == 0 || q.ldy >= q.rows, "fp8_linear", "ldy < rows"));
  DSI_RETURN_IF_ERROR(require(q.w.format == WeightFormat::kFp8Block128 && fp8_gemm_supports(q.w),
                              "fp8_linear",
                              "weight is not FP8 block-128 with K % 16 == 0"));
  DSI_RETURN_IF_ERROR(require(q.x.ld >= fp8_acts_ld(q.w.cols) && q.x.ld % 128 == 0,
                              "fp8_linear",
                              "activation rows are too short"));
  if (q.n == 0 || q.rows == 0)
    return Status();
  if (!q.y || !q.x.codes || !q.x.scales)
    return null_pointer("fp8_linear");
  const Fp8LinearPath path = fp8_linear_path(q);
  if (path == Fp8LinearPath::kGemv) {
    Fp8GemvParams g;
    g.w = q.w;
    g.row_begin = q.row_begin;
    g.rows = q.rows;
    g.x_codes = q.x.codes;
    g.x_scales = q.x.scales;
    g.x_ld = q.x.ld;
    g.n = q.n;
    g.y = q.y;
    g.ldy = q.ldy;
    g.accumulate = q.accumulate;
    g.scratch = q.scratch;
    g.scratch_floats = q.scratch_floats;
    return launch_fp8_gemv(g, stream);
  }
  if (path == Fp8LinearPath::kDecode)
    return launch_fp8_gemm_decode(q, stream);
#if DSINFER_HAVE_CUTLASS
  if (path == Fp8LinearPath::kWgmma) {
    const int64_t ldy = q.ldy == 0 ? q.rows : q.ldy;
    Fp8GemmSm90Args a;
    a.w = q.w;
    a.row_begin = q.row_begin;
    a.rows = q.rows;
    a.x = q.x;
    a.n = q.n;
    a.y = q.y;
    a.ldy = ldy;
    a.accumulate = q.accumulate;
    a.scratch = q.scratch;
    a.scratch_floats = q.scratch_floats;
    return launch_fp8_gemm_sm90(a, stream);
  }
#endif
  DenseArgs d;
  d.w = q.w;
  d.row_begin = q.row_begin;
  d.rows = q.rows;
  d.xa = q.x.codes;
  d.xs = q.x.scales;
  d.x_row_bytes = q.x.ld;
  d.n = q.n;
  d.y = q.y;
  d.ldy = q.ldy;
  d.accumulate = q.accumulate;
  return launch_dense_shape<WFmt::kFp8, AMode::kE4m3>(d, stream);
}

Fp8LinearPath fp8_linear_path(const Fp8LinearParams& p) {
  if (!p.wgmma)
    return Fp8LinearPath::kTile;
  const int64_t rows = p.rows < 0 ? p.w.rows - p.row_begin : p.rows;
  const bool decode = fp8_gemm_decode_takes(p.w, p.n);
  if (p.n <= kGemvMaxTokens && !decode && fp8_gemv_supports(p.w, p.row_begin, rows) &&
      (p.scratch != nullptr || fp8_gemv_scratch_floats(rows, p.w.cols, p.n) == 0) &&
      p.scratch_floats >= fp8_gemv_scratch_floats(rows, p.w.cols, p.n)) {
    return Fp8LinearPath::kGemv;
  }
  if (decode)
    return Fp8LinearPath::kDecode;
#if DSINFER_HAVE_CUTLASS
  const int64_t ldy = p.ldy == 0 ? rows : p.ldy;
  if (p.n >= kFp8Sm90MinRows && p.scratch != nullptr &&
      fp8_gemm_sm90_supports(p.w, p.row_begin, rows, ldy) &&
      p.scratch_floats >= fp8_gemm_sm90_min_scratch_floats(p.n, p.w.cols, rows)) {
    return Fp8LinearPath::kWgmma;
  }
#endif
  return Fp8LinearPath::kTile;
}

int64_t fp8_linear_scratch_floats(const MatrixRef& w, int64_t rows, int64_t n) {
  if (rows < 0)
    rows = w.rows;
  if (fp8_gemm_decode_takes(w, n))
    return 0;
  if (n <= kGemvMaxTokens && fp8_gemv_supports(w, 0, rows))
    return fp8_gemv_scratch_floats(rows, w.cols, n);
#if DSINFER_HAVE_CUTLASS
  if (n >= kFp8Sm90MinRows && fp8_gemm_sm90_supports(w, 0, rows, rows))
    return fp8_gemm_sm90_scratch_floats(n, w.cols, rows);
#else
  (void)w;
  (void)rows;
  (void)n;
#endif
  return 0;
}

bool bf16x2_gemm_supports(const MatrixRef& w) {
  const bool aligned = (reinterpret_cast<uintptr_t>(w.data) & 15u) == 0;
  if (w.format == WeightFormat::kFp8Block128) {
    return w.dtype == DType::kF8E4M3 &&
           (w.scale_dtype == DType::kF8E8M0 || w.scale_dtype == DType::kF32) && w.cols % 16 == 0 &&
           aligned;
  }
  return w.format == WeightFormat::kFloat && w.dtype == DType::kBF16 && w.cols % 8 == 0 && aligned;
}

Status launch_split_bf16(const SplitBf16Params& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_nonneg("split_bf16", {p.n, p.k, p.ldx}));
  SplitBf16Params q = p;
  if (q.ldx == 0)
    q.ldx = q.k;
  DSI_RETURN_IF_ERROR(require(q.ldx >= q.k, "split_bf16", "ldx < k"));
  if (q.n == 0 || q.k == 0)
    return Status();
  if (!q.x || !q.hi)
    return null_pointer("split_bf16");
  const int64_t ld = bf16_split_ld(q.k);
  const bool vec = (reinterpret_cast<uintptr_t>(q.x) & 15u) == 0 && q.ldx % 4 == 0;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(ld, 4 * 256), 64)),
                  static_cast<unsigned>(std::min<int64_t>(q.n, 65535)));
  launch_pdl(split_bf16_kernel, grid, 256, 0, stream, q, ld, vec);
  return launched("split_bf16 launch");
}

#if DSINFER_HAVE_CUTLASS
namespace {
// Whether n token rows over `groups` x `rows` weight rows are worth the wgmma path.
bool bf16_sm90_shape(int64_t rows, int64_t n, int64_t groups) {
  return n >= kBf16Sm90MinRows ||
         (n >= kBf16Sm90WideMinRows && rows * groups >= kBf16Sm90WideMinWeightRows);
}

Bf16GemmSm90Args bf16_sm90_args(const Bf16x2LinearParams& q) {
  const int64_t rows = q.rows < 0 ? q.w.rows - q.row_begin : q.rows;
  Bf16GemmSm90Args a;
  a.w = static_cast<const uint16_t*>(q.w.data) + q.row_begin * q.w.cols;
  a.w_ld = q.w.cols;
  a.rows = rows;
  a.k = q.w.cols;
  a.x_hi = q.x.hi;
  a.x_lo = q.x.lo;
  a.x_ld = q.x.ld;
  a.n = q.n;
  a.y = q.y;
  a.ldy = q.ldy == 0 ? rows : q.ldy;
  a.accumulate = q.accumulate;
  a.groups = q.groups;
  a.group_x = q.group_x;
  a.group_y = q.group_y;
  // Paired halves (one GEMM over hi and lo's rows) where the caller's scratch holds them.
  if (q.scratch != nullptr && q.scratch_floats >= bf16_gemm_sm90_pair_floats(q.n, rows, q.groups))
    a.pair_scratch = q.scratch;
  return a;
}
}  // namespace
#endif

bool bf16x2_linear_uses_wgmma(const Bf16x2LinearParams& p) {
#if DSINFER_HAVE_CUTLASS
  // From kBf16Sm90MinRows rows; from kBf16Sm90WideMinRows when the weight alone gives the
  // 128-row tiles enough blocks (the LM head at decode batches: all groups in one launch, e.g.
  // wo_a's 8 x 1024 rows).
  const int64_t rows = p.rows < 0 ? p.w.rows - p.row_begin : p.rows;
  return p.wgmma && bf16_sm90_shape(rows, p.n, p.groups) && p.w.format == WeightFormat::kFloat &&
         p.w.dtype == DType::kBF16 && bf16_gemm_sm90_supports(bf16_sm90_args(p));
#else
  (void)p;
  return false;
#endif
}

int64_t bf16x2_linear_scratch_floats(const MatrixRef& w, int64_t rows, int64_t n, int64_t groups) {
  if (n <= 0 || rows <= 0 || groups <= 0)
    return 0;
  const int64_t split = dense_split_floats<AMode::kBf16x2>(rows, n, groups, w.cols);
#if DSINFER_HAVE_CUTLASS
  // The wgmma path's paired halves (bf16_gemm_sm90.h), where its shape rule would take it.
  if (w.format == WeightFormat::kFloat && w.dtype == DType::kBF16 &&
      bf16_sm90_shape(rows, n, groups))
    return std::max(split, bf16_gemm_sm90_pair_floats(n, rows, groups));
#endif
  return split;
}

Status launch_bf16x2_linear(const Bf16x2LinearParams& p, cudaStream_t stream) {
  Bf16x2LinearParams q = p;
  if (q.rows < 0)
    q.rows = q.w.rows - q.row_begin;
  DSI_RETURN_IF_ERROR(
      check_nonneg("bf16x2_linear", {q.n, q.ldy, q.row_begin, q.rows, q.group_x, q.group_y}));
  DSI_RETURN_IF_ERROR(
      require(q.groups >= 1 && q.groups <= 65535, "bf16x2_linear", "groups must be in [1, 65535]"));
  DSI_RETURN_IF_ERROR(require(q.row_begin + q.groups * q.rows <= q.w.rows,
                              "bf16x2_linear",
                              "row range exceeds the weight"));
  DSI_RETURN_IF_ERROR(require(q.group_x % 8 == 0,
                              "bf16x2_linear",
                              "group_x must keep 16-byte alignment (a multiple of 8)"));
  DSI_RETURN_IF_ERROR(require(q.ldy == 0 || q.ldy >= q.rows, "bf16x2_linear", "ldy < rows"));
  DSI_RETURN_IF_ERROR(
      require(bf16x2_gemm_supports(q.w),
              "bf16x2_linear",
              "weight is neither FP8 block-128 (K % 16 == 0) nor BF16 (K % 8 == 0)"));
  DSI_RETURN_IF_ERROR(require(q.x.ld >= bf16_split_ld(q.w.cols) && q.x.ld % 64 == 0,
                              "bf16x2_linear",
                              "activation rows are too short"));
  if (q.n == 0 || q.rows == 0)
    return Status();
  if (!q.y || !q.x.hi)
    return null_pointer("bf16x2_linear");
#if DSINFER_HAVE_CUTLASS
  if (bf16x2_linear_uses_wgmma(q))
    return launch_bf16_gemm_sm90(bf16_sm90_args(q), stream);
#endif
  DenseArgs d;
  d.w = q.w;
  d.row_begin = q.row_begin;
  d.rows = q.rows;
  d.xa = reinterpret_cast<const uint8_t*>(q.x.hi);
  d.xb = reinterpret_cast<const uint8_t*>(q.x.lo);
  d.x_row_bytes = q.x.ld * 2;
  d.n = q.n;
  d.y = q.y;
  d.ldy = q.ldy;
  d.accumulate = q.accumulate;
  d.group_x_bytes = q.group_x * 2;
  d.group_y = q.group_y;
  float* scratch = q.wgmma ? q.scratch : nullptr;  // split-K changes the order: not invariant
  if (q.w.format == WeightFormat::kFp8Block128) {
    return launch_dense_shape<WFmt::kFp8, AMode::kBf16x2>(
        d, stream, q.groups, scratch, q.scratch_floats);
  }
  return launch_dense_shape<WFmt::kBf16, AMode::kBf16x2>(
      d, stream, q.groups, scratch, q.scratch_floats);
}

Status launch_fp8_expert_ffn(const Fp8ExpertFfnParams& p, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(
      check_nonneg("fp8_expert_ffn", {p.n_experts, p.hidden, p.inter, p.num_pairs}));
  DSI_RETURN_IF_ERROR(require(p.k >= 1, "fp8_expert_ffn", "k < 1"));
  DSI_RETURN_IF_ERROR(require(p.x.ld >= fp8_acts_ld(p.hidden) && p.x.ld % 128 == 0,
                              "fp8_expert_ffn",
                              "activation rows are too short"));
  DSI_RETURN_IF_ERROR(
      require(p.num_pairs < (int64_t{1} << 31), "fp8_expert_ffn", "too many pairs"));
  if (p.num_pairs == 0 || p.hidden == 0 || p.inter == 0)
    return Status();
  if (!p.w1 || !p.w3 || !p.w2 || !p.h || !p.h_codes || !p.h_scales || !p.y || !p.x.codes ||
      !p.x.scales)
    return null_pointer("fp8_expert_ffn");
  if (p.gemv && expert_gemv_supports(p.hidden, p.inter) &&
      (p.expert_begin ? ceil_div(p.num_pairs, p.n_experts) <= kExpertGemvTokens
                      : p.num_pairs <= kExpertGemvSingleMaxPairs))
    return launch_expert_gemv(p, stream);
  if (p.format == WeightFormat::kMxfp4)
    return launch_experts_fmt<WFmt::kFp4>(p, stream);
  DSI_RETURN_IF_ERROR(require(p.format == WeightFormat::kFp8Block128,
                              "fp8_expert_ffn",
                              "experts are neither MXFP4 nor FP8 block-128"));
  return launch_experts_fmt<WFmt::kFp8>(p, stream);
}

}  // namespace dsinfer::cuda
