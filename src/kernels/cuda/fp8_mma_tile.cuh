// The block tile behind fp8_gemm.h: a BM (weight rows) x BN (tokens) output tile of a "TN" GEMM
// whose operands are both K-contiguous, computed with mma.sync: m16n8k32 E4M3 x E4M3 -> fp32 for
// FP8 activations (AMode::kE4m3), or m16n8k16 BF16 x BF16 -> fp32 twice, against the high and the
// low BF16 halves of fp32 activations (AMode::kBf16x2: x = hi + lo to 2^-17, so the plain-fp32
// linears keep fp32-level accuracy on BF16 tensor cores). A chunk is 128 bytes of K per row in
// both modes: 128 E4M3 values or 64 BF16 values.
//
// Warps form a WM x WN x WK grid: WM x WN split the tile, WK split K (each stage holds WK chunks
// of 128 K values, one per K-warp; the K-warps' partial tiles are summed in shared memory in a
// fixed order, so results are deterministic). Decode shapes use WK = 8 (a few weight rows per
// block, K spread over the warps, many blocks in flight); prefill shapes WK = 1 with 128 x 128
// tiles. Stages are filled with cp.async (16-byte copies, zero-filled past the K and row ends),
// STAGES deep; each 128-byte smem row is XOR-swizzled in 16-byte units so ldmatrix is
// conflict-free. MXFP4 weights arrive packed and are converted to E4M3 codes (exact: every E2M1
// value is an E4M3 value) in a separate smem buffer after the stage lands.
//
// Every 32-wide K step is one MMA from zero; its fp32 result times (weight scale x activation
// scale), both powers of two for E8M0 scales, is added to the fp32 accumulators.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/mma_sync.cuh"
#include "numeric/float_formats.h"

namespace dsinfer::cuda::mma {

inline constexpr int kChunk = 128;  // bytes of K per row and chunk (one FP8 activation block)

enum class WFmt { kFp8, kFp4, kBf16 };  // weight storage
enum class AMode { kE4m3, kBf16x2 };    // activations / MMA kind

// K values per chunk, and whether the weight arrives packed (64 bytes per row and chunk: MXFP4
// for E4M3, FP8 for BF16) and is converted in shared memory.
template <AMode A>
inline constexpr int kChunkK = A == AMode::kE4m3 ? 128 : 64;
template <WFmt F, AMode A>
inline constexpr bool kConvert = (F == WFmt::kFp4) || (F == WFmt::kFp8 && A == AMode::kBf16x2);

template <int BM_, int BN_, int WM_, int WN_, int WK_, int STAGES_>
struct Cfg {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, WK = WK_, STAGES = STAGES_;
  static constexpr int kWarps = WM * WN * WK;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int TM = BM / WM;  // warp rows
  static constexpr int TN = BN / WN;  // warp tokens
  static constexpr int MT = TM / 16;  // m16 tiles per warp
  static constexpr int NT = TN / 8;   // n8 tiles per warp
  static_assert(TM % 16 == 0 && TN % 8 == 0, "warp tile");
  static constexpr int kWBytes = BM * WK * kChunk;  // MMA-ready weight tile of one stage
  static constexpr int kRawBytes = BM * WK * kChunk / 2;
  static constexpr int kXBytes = BN * WK * kChunk;  // one activation tile (two for kBf16x2)
  template <WFmt F, AMode A>
  __host__ __device__ static constexpr int w_stage_bytes() {
    return kConvert<F, A> ? kRawBytes : kWBytes;
  }
  template <WFmt F, AMode A>
  __host__ __device__ static constexpr int stage_bytes() {
    return w_stage_bytes<F, A>() + (A == AMode::kBf16x2 ? 2 : 1) * kXBytes;
  }
  // K-split tiles keep the running sum and the K-warps' chunk partials in shared memory.
  static constexpr int kSumBytes = WK > 1 ? (WK + 1) * BM* BN * 4 : 0;
  template <WFmt F, AMode A>
  __host__ __device__ static constexpr int pipe_bytes() {
    return STAGES * stage_bytes<F, A>() + (kConvert<F, A> ? kWBytes : 0);
  }
  template <WFmt F, AMode A>
  __host__ __device__ static constexpr int smem_bytes() {
    const int red = BM * BN * 4;  // WK == 1: the final tile, over the pipeline buffers
    return (pipe_bytes<F, A>() > red ? pipe_bytes<F, A>() : red) + kSumBytes;
  }
};

// Where the tile's weight rows and token rows come from, and where its outputs go.
struct TileIo {
  // Weight rows: tile row i < BM/2 reads wa row ra0 + i, else wb row rb0 + i - BM/2 (wb == wa and
  // rb0 == ra0 + BM/2 for a plain tile). Rows >= the row limits are zero.
  MatrixRef wa, wb;
  int64_t ra0 = 0, ra_end = 0, rb0 = 0, rb_end = 0;
  bool paired = false;  // SwiGLU: rows [0, BM/2) from wa, [BM/2, BM) from wb
  // Token rows: x row of tile token j is x_row[j] (>= 0) or padding (-1).
  const int32_t* x_row = nullptr;  // shared memory [BN]
  // kE4m3: xa = FP8 codes, xs = their 1x128 scales (x_row_bytes / 128 per row). kBf16x2: xa / xb =
  // the high / low BF16 halves. Rows are x_row_bytes apart (a multiple of 128, zero-padded).
  const uint8_t* xa = nullptr;
  const uint8_t* xb = nullptr;
  const float* xs = nullptr;
  int64_t x_row_bytes = 0;
  int64_t k = 0;  // K in values (of this slice)
  // A K slice (split-K): the tile covers K values [kc0 * kChunkK, + k) of rows `w_cols` long;
  // kc0 = 0 and w_cols = 0 (= k) for the whole row.
  int64_t kc0 = 0;
  int64_t w_cols = 0;
};

// Byte offset of 16-byte unit c (0..7) of row r in a [rows][128] swizzled chunk.
__device__ __forceinline__ int swz(int r, int c) {
  return r * 128 + ((c ^ (r & 7)) << 4);
}

// Two E4M3 codes (bits 0..15, lower first) -> two FP16 values, exactly (E4M3 is a subset of FP16).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(static_cast<uint16_t>(v)));
  return r;
}

__device__ __forceinline__ void mma_f16(float (&c)[4],
                                        const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c = the E4M3 product of the m16n8k32 fragments a (ldmatrix of a 16 x 32-byte tile) and b (8 x 32
// bytes), from zero. Hopper has no native E4M3 mma.sync (it emulates it through FP16), so this
// converts the codes to FP16 (exact) and runs two FP16 m16n8k16 MMAs. K is permuted identically in
// both operands: MMA 1 takes physical K 0..15 (slot pairs = bytes {0,1} / {2,3} of each thread's
// word), MMA 2 K 16..31. Products are exact and accumulate in fp32.
__device__ __forceinline__ void mma_e4m3(float (&c)[4],
                                         const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  c[0] = c[1] = c[2] = c[3] = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // physical K half: registers a[2h], a[2h + 1], b[h]
    const uint32_t a16[4] = {e4m3x2_to_f16x2(a[2 * h]),
                             e4m3x2_to_f16x2(a[2 * h + 1]),
                             e4m3x2_to_f16x2(a[2 * h] >> 16),
                             e4m3x2_to_f16x2(a[2 * h + 1] >> 16)};
    const uint32_t b16[2] = {e4m3x2_to_f16x2(b[h]), e4m3x2_to_f16x2(b[h] >> 16)};
    mma_f16(c, a16, b16);
  }
}

// Four packed E2M1 nibbles (bits 0..15, lowest = first) -> four E4M3 codes (byte i = nibble i).
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3x4(uint32_t v) {
  // |E2M1| 0, 0.5, 1, 1.5 / 2, 3, 4, 6 as E4M3 codes.
  constexpr uint32_t kLo = 0x3C383000u, kHi = 0x4C484440u;
  const uint32_t mag = __byte_perm(kLo, kHi, v & 0x7777u);
  const uint32_t s = v & 0x8888u;
  const uint32_t sign =
      ((s & 0x8u) << 4) | ((s & 0x80u) << 8) | ((s & 0x800u) << 12) | ((s & 0x8000u) << 16);
  return mag | sign;
}

// Scale of the weight at (row, K position kpos) given the row's scale base (scale_row_base);
// 1 for BF16 weights.
template <WFmt F>
__device__ __forceinline__ float weight_scale(const uint8_t* srow, bool f32, int64_t kpos) {
  if (srow == nullptr)
    return 0.0f;
  if constexpr (F == WFmt::kFp4) {
    return numeric::e8m0_to_f32(srow[kpos / 32]);
  } else if constexpr (F == WFmt::kFp8) {
    const int64_t b = kpos / 128;
    return f32 ? reinterpret_cast<const float*>(srow)[b] : numeric::e8m0_to_f32(srow[b]);
  } else {
    return 1.0f;
  }
}

// First scale of weight row r: MXFP4 [rows, cols / 32] E8M0; FP8 [ceil(rows / 128), ceil(cols /
// 128)] E8M0 or F32.
template <WFmt F>
__device__ __forceinline__ const uint8_t* scale_row_base(const MatrixRef& w, int64_t r) {
  const uint8_t* s = static_cast<const uint8_t*>(w.scale);
  if constexpr (F == WFmt::kBf16) {
    return reinterpret_cast<const uint8_t*>(&w);  // any non-null pointer: scale 1
  } else if constexpr (F == WFmt::kFp4) {
    return s + r * (w.cols / 32);
  } else {
    const int64_t i = (r / 128) * ((w.cols + 127) / 128);
    return s + i * (w.scale_dtype == DType::kF32 ? 4 : 1);
  }
}

// Loads stage `it` (K chunks [it * WK, +WK)) into smem stage buffer `st`.
template <class C, WFmt F, AMode A>
__device__ __forceinline__ void load_stage(const TileIo& io, uint8_t* st, int it) {
  const int tid = threadIdx.x;
  // Weights: per row and chunk, 8 (128 bytes) or 4 (packed, 64 bytes) 16-byte units.
  constexpr bool kPacked = kConvert<F, A>;
  constexpr int kUnits = kPacked ? 4 : 8;
  auto wbytes = [](int64_t k) { return F == WFmt::kFp4 ? k / 2 : (F == WFmt::kBf16 ? k * 2 : k); };
  const int64_t row_stride = wbytes(io.w_cols > 0 ? io.w_cols : io.k);
  const int64_t row_bytes = wbytes(io.k);  // of the slice
  const int64_t w_skip = wbytes(io.kc0 * kChunkK<A>);
  for (int idx = tid; idx < C::BM * C::WK * kUnits; idx += C::kThreads) {
    const int u = idx % kUnits;
    const int wk = (idx / kUnits) % C::WK;
    const int r = idx / (kUnits * C::WK);
    const bool second = io.paired && r >= C::BM / 2;
    const MatrixRef& w = second ? io.wb : io.wa;
    const int64_t gr = second ? io.rb0 + (r - C::BM / 2) : io.ra0 + r;
    const int64_t gend = second ? io.rb_end : io.ra_end;
    const int64_t kb = (static_cast<int64_t>(it) * C::WK + wk) * (kUnits * 16) + u * 16;
    int bytes = 0;
    const uint8_t* src = static_cast<const uint8_t*>(io.wa.data);
    if (gr < gend && kb < row_bytes) {
      bytes = row_bytes - kb < 16 ? static_cast<int>(row_bytes - kb) : 16;
      src = static_cast<const uint8_t*>(w.data) + gr * row_stride + w_skip + kb;
    }
    uint8_t* dst = kPacked ? st + (wk * C::BM + r) * (kChunk / 2) + u * 16
                           : st + wk * C::BM * kChunk + swz(r, u);
    cp_async16(dst, src, bytes);
  }
  uint8_t* xt = st + C::template w_stage_bytes<F, A>();
  // kBf16x2 with io.xb null: BF16-exact activations, the high halves only (no low tile).
  const int kTiles = A == AMode::kBf16x2 && io.xb != nullptr ? 2 : 1;
  // Only the chunks that hold K (a row may continue with other columns, e.g. the next wo_a group).
  const int64_t x_skip = io.kc0 * kChunk;
  const int64_t x_end = min(io.x_row_bytes - x_skip, (io.k + kChunkK<A> - 1) / kChunkK<A> * kChunk);
  for (int idx = tid; idx < kTiles * C::BN * C::WK * 8; idx += C::kThreads) {
    const int u = idx % 8;
    const int wk = (idx / 8) % C::WK;
    const int j = (idx / (8 * C::WK)) % C::BN;
    const int tile = idx / (8 * C::WK * C::BN);
    const int32_t xr = io.x_row[j];
    const int64_t kb = (static_cast<int64_t>(it) * C::WK + wk) * kChunk + u * 16;
    const uint8_t* base = tile == 0 ? io.xa : io.xb;
    int bytes = 0;
    const uint8_t* src = io.xa;
    if (xr >= 0 && kb < x_end) {
      bytes = 16;
      src = base + static_cast<int64_t>(xr) * io.x_row_bytes + x_skip + kb;
    }
    cp_async16(xt + tile * C::kXBytes + wk * C::BN * kChunk + swz(j, u), src, bytes);
  }
}

// FP8 -> BF16 for 16 codes: 8 packed words (two BF16 per word, lower K first).
__device__ __forceinline__ void e4m3x16_to_bf16(const uint4& v, uint32_t (&o)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t lo = numeric::f32_to_bf16(numeric::fp8_e4m3_to_f32((w[i] >> (16 * h)) & 0xff));
      const uint32_t hi =
          numeric::f32_to_bf16(numeric::fp8_e4m3_to_f32((w[i] >> (16 * h + 8)) & 0xff));
      o[2 * i + h] = lo | (hi << 16);
    }
  }
}

// Packed stage rows [WK][BM][64 bytes] -> MMA-ready rows [WK][BM][128 bytes] (swizzled) in
// `conv`: MXFP4 -> E4M3 codes, or FP8 -> BF16 values (both exact).
template <class C, WFmt F>
__device__ __forceinline__ void convert_stage(const uint8_t* raw, uint8_t* conv) {
  for (int idx = threadIdx.x; idx < C::WK * C::BM * 4; idx += C::kThreads) {
    const int u = idx % 4;    // 16 packed bytes -> two 16-byte units
    const int row = idx / 4;  // wk * BM + r
    const int r = row % C::BM;
    const uint4 v = *reinterpret_cast<const uint4*>(raw + row * 64 + u * 16);
    uint32_t o[8];
    if constexpr (F == WFmt::kFp4) {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        o[2 * i] = e2m1x4_to_e4m3x4(w[i] & 0xffffu);
        o[2 * i + 1] = e2m1x4_to_e4m3x4(w[i] >> 16);
      }
    } else {
      e4m3x16_to_bf16(v, o);
    }
    uint8_t* base = conv + (row / C::BM) * C::BM * kChunk;
    *reinterpret_cast<uint4*>(base + swz(r, 2 * u)) = make_uint4(o[0], o[1], o[2], o[3]);
    *reinterpret_cast<uint4*>(base + swz(r, 2 * u + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

// The whole tile. Returns the fp32 result in shared memory as out[j * BM + i] (token j, tile row
// i), valid after the function returns (it ends with __syncthreads()).
//
// Summation order, identical for every tile shape (so a token's outputs do not depend on the batch
// it runs in): per 128-byte K chunk c, P_c = fma(step result, scale, P_c) over the chunk's four MMA
// steps from P_c = 0; then y = ((0 + P_0) + P_1) + ... over the chunks in K order. WK == 1 keeps y
// in registers; WK > 1 sums each stage's WK partials into a shared-memory y in chunk order.
template <class C, WFmt F, AMode A>
__device__ float* tile_mma(const TileIo& io, uint8_t* smem) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int wn = warp % C::WN;
  const int wm = (warp / C::WN) % C::WM;
  const int wk = warp / (C::WN * C::WM);
  constexpr int kStage = C::template stage_bytes<F, A>();
  constexpr int kCk = kChunkK<A>;  // K values per chunk
  constexpr int kStepK = kCk / 4;  // K values per MMA step (32 bytes of a row)
  uint8_t* conv = smem + C::STAGES * kStage;
  const int iters = static_cast<int>((io.k + C::WK * kCk - 1) / (C::WK * kCk));

  constexpr int kTile = C::BM * C::BN;
  float* ysum = reinterpret_cast<float*>(smem + C::template smem_bytes<F, A>() - C::kSumBytes);
  float* parts = ysum + kTile;  // [WK][BN][BM]
  if constexpr (C::WK > 1) {
    for (int idx = threadIdx.x; idx < kTile; idx += C::kThreads) ysum[idx] = 0.0f;
  }
  float tot[C::WK == 1 ? C::MT : 1][C::WK == 1 ? C::NT : 1][4];
#pragma unroll
  for (int i = 0; i < (C::WK == 1 ? C::MT : 1); ++i)
#pragma unroll
    for (int j = 0; j < (C::WK == 1 ? C::NT : 1); ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) tot[i][j][e] = 0.0f;
  float acc[C::MT][C::NT][4];
#pragma unroll
  for (int i = 0; i < C::MT; ++i)
#pragma unroll
    for (int j = 0; j < C::NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  // This thread's rows (two per m-tile) and tokens (two per n-tile) for the scales.
  const bool s_f32 = io.wa.scale_dtype == DType::kF32;
  const uint8_t* srow[C::MT][2];
#pragma unroll
  for (int i = 0; i < C::MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * C::TM + i * 16 + (lane >> 2) + h * 8;
      const bool second = io.paired && r >= C::BM / 2;
      const int64_t gr = second ? io.rb0 + (r - C::BM / 2) : io.ra0 + r;
      const bool valid = gr < (second ? io.rb_end : io.ra_end);
      srow[i][h] = valid ? scale_row_base<F>(second ? io.wb : io.wa, gr) : nullptr;
    }
  int32_t xrow[C::NT][2];
#pragma unroll
  for (int j = 0; j < C::NT; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) xrow[j][h] = io.x_row[wn * C::TN + j * 8 + (lane & 3) * 2 + h];

#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < iters)
      load_stage<C, F, A>(io, smem + s * kStage, s);
    cp_async_commit();
  }
  const int64_t sblocks = io.x_row_bytes / kChunk;
  for (int it = 0; it < iters; ++it) {
    cp_async_wait<C::STAGES - 2>();
    __syncthreads();
    const int nxt = it + C::STAGES - 1;
    if (nxt < iters)
      load_stage<C, F, A>(io, smem + (nxt % C::STAGES) * kStage, nxt);
    cp_async_commit();
    uint8_t* st = smem + (it % C::STAGES) * kStage;
    const uint8_t* wt = st;
    if constexpr (kConvert<F, A>) {
      convert_stage<C, F>(st, conv);
      __syncthreads();
      wt = conv;
    }
    const uint8_t* xt = st + C::template w_stage_bytes<F, A>();
    const int64_t chunk = static_cast<int64_t>(it) * C::WK + wk;
#pragma unroll
    for (int i = 0; i < C::MT; ++i)
#pragma unroll
      for (int j = 0; j < C::NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    if (chunk * kCk < io.k) {
      const uint8_t* wc = wt + wk * C::BM * kChunk;
      const uint8_t* xc = xt + wk * C::BN * kChunk;
      // Activation scales of this chunk for the thread's tokens (1 for BF16 halves).
      float sx[C::NT][2];
#pragma unroll
      for (int j = 0; j < C::NT; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (A == AMode::kE4m3)
            sx[j][h] = xrow[j][h] >= 0 ? io.xs[xrow[j][h] * sblocks + io.kc0 + chunk] : 0.0f;
          else
            sx[j][h] = 1.0f;
        }
      float sw[C::MT][2];
      if constexpr (F != WFmt::kFp4) {  // one weight scale per chunk
#pragma unroll
        for (int i = 0; i < C::MT; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            sw[i][h] = weight_scale<F>(srow[i][h], s_f32, (io.kc0 + chunk) * kCk);
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const int64_t kpos = chunk * kCk + ks * kStepK;
        if (kpos >= io.k)
          break;
        uint32_t a[C::MT][4];
#pragma unroll
        for (int i = 0; i < C::MT; ++i) {
          const int r = wm * C::TM + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          ldmatrix_x4(a[i], wc + swz(r, ks * 2 + (lane >> 4)));
        }
        uint32_t b[C::NT][2];
        uint32_t b2[C::NT][2];
#pragma unroll
        for (int j = 0; j < C::NT; ++j) {
          const int t = wn * C::TN + j * 8 + (lane & 7);
          ldmatrix_x2(b[j], xc + swz(t, ks * 2 + ((lane >> 3) & 1)));
          if constexpr (A == AMode::kBf16x2) {
            if (io.xb != nullptr)
              ldmatrix_x2(b2[j], xc + C::kXBytes + swz(t, ks * 2 + ((lane >> 3) & 1)));
          }
        }
        if constexpr (F == WFmt::kFp4) {
#pragma unroll
          for (int i = 0; i < C::MT; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              sw[i][h] = weight_scale<F>(srow[i][h], s_f32, io.kc0 * kCk + kpos);
        }
#pragma unroll
        for (int i = 0; i < C::MT; ++i)
#pragma unroll
          for (int j = 0; j < C::NT; ++j) {
            float part[4];
            if constexpr (A == AMode::kE4m3) {
              mma_e4m3(part, a[i], b[j]);
            } else {
              part[0] = part[1] = part[2] = part[3] = 0.0f;
              mma_bf16(part, a[i], b[j]);
              if (io.xb != nullptr)
                mma_bf16(part, a[i], b2[j]);
            }
            acc[i][j][0] = fmaf(part[0], sw[i][0] * sx[j][0], acc[i][j][0]);
            acc[i][j][1] = fmaf(part[1], sw[i][0] * sx[j][1], acc[i][j][1]);
            acc[i][j][2] = fmaf(part[2], sw[i][1] * sx[j][0], acc[i][j][2]);
            acc[i][j][3] = fmaf(part[3], sw[i][1] * sx[j][1], acc[i][j][3]);
          }
      }
    }
    // Fold this stage's chunk partials into y, in chunk order.
    if constexpr (C::WK == 1) {
      if (chunk * kCk < io.k) {
#pragma unroll
        for (int i = 0; i < C::MT; ++i)
#pragma unroll
          for (int j = 0; j < C::NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) tot[i][j][e] += acc[i][j][e];
      }
      if constexpr (kConvert<F, A>)
        __syncthreads();  // conv is rewritten by the next stage
    } else {
#pragma unroll
      for (int i = 0; i < C::MT; ++i)
#pragma unroll
        for (int j = 0; j < C::NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = wm * C::TM + i * 16 + (lane >> 2) + (e >> 1) * 8;
            const int t = wn * C::TN + j * 8 + (lane & 3) * 2 + (e & 1);
            parts[(wk * C::BN + t) * C::BM + r] = acc[i][j][e];
          }
      __syncthreads();
      for (int idx = threadIdx.x; idx < kTile; idx += C::kThreads) {
        float v = ysum[idx];
#pragma unroll
        for (int w = 0; w < C::WK; ++w) {
          if ((static_cast<int64_t>(it) * C::WK + w) * kCk < io.k)
            v += parts[w * kTile + idx];
        }
        ysum[idx] = v;
      }
      // The next stage's barrier orders these reads before parts is rewritten.
    }
  }
  cp_async_wait<0>();
  if constexpr (C::WK > 1) {
    __syncthreads();
    return ysum;
  }
  __syncthreads();  // every warp is done with the pipeline: the result may alias it
  float* out = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < (C::WK == 1 ? C::MT : 1); ++i)
#pragma unroll
    for (int j = 0; j < (C::WK == 1 ? C::NT : 1); ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = wm * C::TM + i * 16 + (lane >> 2) + (e >> 1) * 8;
        const int t = wn * C::TN + j * 8 + (lane & 3) * 2 + (e & 1);
        out[t * C::BM + r] = tot[i][j][e];
      }
  __syncthreads();
  return out;
}

}  // namespace dsinfer::cuda::mma
