// Grouped W4A8 expert GEMMs on FP8 wgmma, the MXFP4 weights as the MMAs' A operand in registers
// (moe_w4a8_sm90.h).
//
// A persistent block of a loader warpgroup and W MMA warpgroups walks tiles of 64 W weight rows x
// BN grouped rows (BN = 32, 64 or 128 by the mean grouped rows per expert; W = 4 at BN = 32 where
// the weight tiles fit the matrices, else 2), ordered expert by expert, then weight tile, then row
// tile (the blocks running at once share an expert's activations and weight tiles in L2), as one
// stream of 128-wide K steps:
//   - the loader copies each step's activation tile (grouped rows, K in moe_w4a8_k_order.cuh's
//     order, 128-byte swizzle), raw MXFP4 weight rows, 32-block exponents, block exponents and
//     activation scales into a ring of stages by cp.async; the copies themselves arrive on the
//     stage's full mbarrier as they land, so the loader runs as far ahead as the ring allows,
//     waiting only for a stage's empty mbarrier before refilling it;
//   - each MMA warpgroup takes 64 weight rows as the A operand of m64nBNk32 wgmmas straight from
//     registers: lane (g, t) of warp w reads word t of each 32-wide K step of rows 16 w + g and
//     + 8 (eight E2M1 codes, K 8 t .. 8 t + 7) and turns it into its fragment's two E4M3
//     registers (a byte permute of the 32-block's table of e2m1 x 2^(s - S), the row block's
//     scale exponent S; the signs from a second permute), which the activations' K order
//     matches. Step s + 1's fragments are made while step s's MMAs run; then s's sums (a fresh
//     accumulator per step) times the activation and weight scales go into the tile's sums (the
//     FP8 copy's promotion: every scale a power of two, so the results are the copy's bit for
//     bit).
// Every converted weight serves BN grouped rows and never passes through shared memory.
//
// Speed (H200, twenty-second session, bench --ops, V4-Flash's routed experts, both GEMMs with the
// gather and SwiGLU): 1.42 / 1.61-1.71 / 6.2 ms at 128 / 1,024 / 8,192 tokens, against the FP8
// copy's 1.54 / 1.71 / 4.1-4.2 and the previous kernel's (weights converted into a shared-memory
// E4M3 tile of 256 rows x 64 grouped rows) 2.26-2.33 / 2.53-2.60 / 8.5. ncu at 1,024 tokens
// (first GEMM): issue slots 57% busy, the permutes and logic ops of the conversion the largest
// shares of the instructions; at BN = 128 the promotion's FMUL + FFMA per sum are 29%.
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/moe_w4a8_sm90.h"
#include "kernels/cuda/wgmma_fp8.cuh"
#include "numeric/float_formats.h"

namespace dsinfer::cuda {
namespace {

constexpr int kBK = 128;  // K per step
constexpr int kMaxExperts = 1024;

using cp_async::smem_u32;

// Eight E2M1 codes (nibble i = K i) -> eight E4M3 bytes in K order: the magnitudes through the
// table (lo, hi) of the block, the signs from the codes' top bits (a permute in its sign-replicate
// mode: byte j of w << 4 ends in code 2j's sign bit, byte j of w in code 2j + 1's).
__device__ __forceinline__ uint2 e2m1x8_to_e4m3(uint32_t w, uint32_t lo, uint32_t hi) {
  const uint32_t sel = w & 0x77777777u;  // the magnitudes (a permute reads a selector's low half)
  const uint32_t m0 = prmt(lo, hi, sel);
  const uint32_t m1 = prmt(lo, hi, sel >> 16);
  const uint32_t sh = w << 4;
  const uint32_t s0 = prmt(sh, w, 0xD9C8u);
  const uint32_t s1 = prmt(sh, w, 0xFBEAu);
  return make_uint2(m0 | (s0 & 0x80808080u), m1 | (s1 & 0x80808080u));
}

struct Tile {
  int e = 0;
  int64_t row0 = 0;  // first grouped row
  int64_t m_e = 0;   // the expert's grouped rows
  int m = 0;         // grouped rows in the tile (<= the tile's rows)
  int nt = 0;        // weight tile
  int mt = 0;        // row tile within the expert
};

// Tile t of the walk (tiles of `rows` grouped rows): its expert, weight tile and row tile.
__device__ __forceinline__ Tile
decode_tile(const int* tiles, int ne, const int64_t* begin, int t, int rows) {
  const int lo = last_at_most(tiles, ne, t);  // the expert
  Tile r;
  r.e = lo;
  const int64_t b = begin[lo];
  r.m_e = begin[lo + 1] - b;
  const int mtiles = static_cast<int>((r.m_e + rows - 1) / rows);
  const int local = t - tiles[lo];
  r.nt = local / mtiles;
  r.mt = local % mtiles;
  r.row0 = b + static_cast<int64_t>(r.mt) * rows;
  const int64_t left = r.m_e - static_cast<int64_t>(r.mt) * rows;
  r.m = static_cast<int>(left < rows ? left : rows);
  return r;
}

// The conversion tables, indexed by a byte (s - S + 8) mod 256: entry i holds the eight E2M1
// magnitudes times 2^(i - 8) in E4M3 for i < kLutExact (a nonzero 32-block's exponent s lies 8
// below to 6 above its row block's scale exponent S in the experts this path takes:
// launch_moe_mxfp4_scales); the entries past those all zeros (the 32-blocks that index them are
// all zero).
constexpr int kLutExact = 15;
constexpr int kLutEntries = 256;

// Each expert's first tile into tiles[0 .. ne] (warp 0: a running sum over chunks of 32 experts
// of ceil(m_e / rows) x n_tiles tiles each) and the conversion tables into lut; then a
// __syncthreads.
__device__ void tiles_and_lut(
    const int64_t* begin, int ne, int rows, int n_tiles, int* tiles, uint8_t* lut) {
  if (threadIdx.x < 32) {
    int carry = 0;
    for (int e0 = 0; e0 < ne; e0 += 32) {
      const int e = e0 + static_cast<int>(threadIdx.x);
      int v = 0;
      if (e < ne) {
        const int64_t m_e = begin[e + 1] - begin[e];
        v = static_cast<int>((m_e + rows - 1) / rows) * n_tiles;
      }
      int incl = v;
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, o);
        if (static_cast<int>(threadIdx.x) >= o)
          incl += u;
      }
      if (e < ne)
        tiles[e] = carry + incl - v;
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (threadIdx.x == 0)
      tiles[ne] = carry;
  } else {
    constexpr float kMags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int i = static_cast<int>(threadIdx.x) - 32; i < 8 * kLutEntries;
         i += static_cast<int>(blockDim.x) - 32) {
      const float v = i < 8 * kLutExact ? ldexpf(kMags[i % 8], i / 8 - 8) : 0.0f;
      lut[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
    }
  }
  __syncthreads();
}

struct Args {
  MoeW4a8GemmParams p;
  int64_t n, k;
};

constexpr int kPitch = 80;  // bytes per raw weight row in a stage (64 used; conflict-free reads)

// BN grouped rows per tile, W MMA warpgroups (64 weight rows each) and a loader warpgroup.
template <int BN, int W>
struct Layout {
  static constexpr int kBW = 64 * W;  // weight rows per tile
  static constexpr int kThreads = 128 * (W + 1);
  // Registers per thread of the loader and the MMA warpgroups (setmaxnreg), within the launch's
  // 65,536 / kThreads (168 for W = 2; 96 for W = 4).
  static constexpr int kLoaderRegs = W == 2 ? 72 : 56;
  static constexpr int kMmaRegs = W == 2 ? 216 : 104;
  // setmaxnreg moves registers within the CTA's launch allocation only: past it the MMA
  // warpgroups' setmaxnreg.inc never returns (a hang, not an error).
  static_assert(kLoaderRegs + W * kMmaRegs <= (W + 1) * (65536 / kThreads / 8 * 8),
                "setmaxnreg: more registers than the CTA is launched with");
  static constexpr int kOffAct = 0;                       // [BN][128] E4M3, 128-byte swizzle
  static constexpr int kOffRaw = BN * kBK;                // [kBW][kPitch] packed E2M1
  static constexpr int kOffSub = kOffRaw + kBW * kPitch;  // [kBW] u32: four 32-block exponents
  static constexpr int kOffExp = kOffSub + kBW * 4;       // [kBW] u8: block exponents
  static constexpr int kOffSa = kOffExp + kBW;            // [BN] f32: activation scales
  static constexpr int kStageBytes = (kOffSa + BN * 4 + 1023) / 1024 * 1024;
  static constexpr int kStages = BN == 128 || W == 4 ? 6 : 8;
  static constexpr int kOffBars = kStages * kStageBytes;       // u64 full[kStages], empty[kStages]
  static constexpr int kOffLut = kOffBars + 2 * kStages * 8;   // [kLutEntries][8] E4M3
  static constexpr int kOffTiles = kOffLut + kLutEntries * 8;  // int32 [n_experts + 1]
  static int64_t smem_bytes(int64_t n_experts) {
    return kOffTiles + 4 * (n_experts + 1) + 1024;  // + alignment slack
  }
};

template <int BN, int W>
__global__ void __launch_bounds__(Layout<BN, W>::kThreads, 1) moe_w4a8_gemm_kernel(Args args) {
  using L = Layout<BN, W>;
  constexpr int kBW = L::kBW;
  constexpr int S = L::kStages;
  extern __shared__ uint8_t smem_raw[];
  // 1,024-aligned, by pointer arithmetic on the shared array (so that its reads stay LDS).
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const MoeW4a8GemmParams& p = args.p;
  const int64_t N = args.n;
  const int64_t K = args.k;
  const int nk = static_cast<int>(K / kBK);
  const int ne = static_cast<int>(p.w.n_experts);
  int* tiles = reinterpret_cast<int*>(smem + L::kOffTiles);
  const uint32_t smem0 = smem_u32(smem);
  const uint32_t full0 = smem0 + L::kOffBars;
  const uint32_t empty0 = full0 + 8 * S;
  if (threadIdx.x == 0) {
    for (int st = 0; st < S; ++st) {
      mbarrier::init(full0 + 8 * st, 128);       // the loader's threads, as their copies land
      mbarrier::init(empty0 + 8 * st, 128 * W);  // the MMA warpgroups' threads
    }
  }
  tiles_and_lut(p.expert_begin, ne, BN, static_cast<int>(N / kBW), tiles, smem + L::kOffLut);
  const int total = tiles[ne];
  const int my_tiles =
      total > static_cast<int>(blockIdx.x)
          ? (total - 1 - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) + 1
          : 0;
  const int steps = my_tiles * nk;
  const int wg = static_cast<int>(threadIdx.x) / 128;
  const int tid = static_cast<int>(threadIdx.x) % 128;
  auto tile_at = [&](int ti) {
    return decode_tile(tiles,
                       ne,
                       p.expert_begin,
                       static_cast<int>(blockIdx.x) + ti * static_cast<int>(gridDim.x),
                       BN);
  };
  // Both sides walk the steps with counters (no divisions in the loops): the K block, the tile,
  // the ring stage and the parity of the stage's current round.

  if (wg == 0) {
    // ---- loads ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(L::kLoaderRegs) : "memory");
    // Per tile, this thread's sources: activation chunk tid % 8 of rows tid / 8 + 16 j (its
    // swizzled position is the same in every row of the thread), raw chunk tid % 4 of weight rows
    // tid / 4 + 32 j, the 32-block exponents of weight rows tid + 128 j, the activation scale of
    // row tid; each advanced by one K block per step.
    const int a_c = tid & 7;
    const int a_r = tid >> 3;
    const uint32_t a_dst = static_cast<uint32_t>(L::kOffAct + a_r * 128 + ((a_c ^ (a_r & 7)) << 4));
    const int w_c = tid & 3;
    const int w_r = tid >> 2;
    const uint32_t w_dst = static_cast<uint32_t>(L::kOffRaw + w_r * kPitch + w_c * 16);
    Tile t;
    const uint8_t* a_src = nullptr;
    const uint8_t* w_src = nullptr;
    const uint8_t* sub_src = nullptr;
    const uint8_t* exp_src = nullptr;
    const float* sa_src = nullptr;
    int kb = 0;
    int ti = 0;
    int st = 0;
    uint32_t round_parity = 0;
    for (int s = 0; s < steps; ++s) {
      if (kb == 0) {
        t = tile_at(ti);
        const int64_t r0 = static_cast<int64_t>(t.nt) * kBW;  // in one matrix: kBW | inter
        const int64_t inter = p.w.inter;
        const MatrixRef* mats = p.pass == 1 ? p.w.w2 : (r0 < inter ? p.w.w1 : p.w.w3);
        const int64_t rbase = (p.pass == 0 && r0 >= inter) ? r0 - inter : r0;
        const MatrixRef w = mats[t.e];
        w_src = static_cast<const uint8_t*>(w.data) + (rbase + w_r) * (K / 2) + w_c * 16;
        sub_src = static_cast<const uint8_t*>(w.scale) + (rbase + tid) * (K / 32);
        a_src = p.a + (t.row0 + a_r) * K + a_c * 16;
        exp_src = (p.pass == 0 ? p.w.exp13 : p.w.exp2) + static_cast<int64_t>(t.e) * nk * N + r0 +
                  tid * 16;
        sa_src = p.sa + (t.row0 - static_cast<int64_t>(t.mt) * BN) * nk +
                 static_cast<int64_t>(t.mt) * BN + tid;
      }
      if (s >= S)  // the stage's previous round released
        mbarrier::wait(empty0 + 8 * st, round_parity ^ 1u);
      const uint32_t base = smem0 + static_cast<uint32_t>(st * L::kStageBytes);
#pragma unroll
      for (int j = 0; j < BN / 16; ++j) {
        if (a_r + 16 * j < t.m)
          cp_async::copy16(base + a_dst + j * 2048, a_src + (16 * j) * K);
      }
#pragma unroll
      for (int j = 0; j < kBW / 32; ++j)
        cp_async::copy16(base + w_dst + j * 32 * kPitch, w_src + (32 * j) * (K / 2));
#pragma unroll
      for (int j = 0; j < kBW / 128; ++j)
        cp_async::copy4(base + L::kOffSub + (tid + 128 * j) * 4, sub_src + 128 * j * (K / 32));
      if (tid < kBW / 16)
        cp_async::copy16(base + L::kOffExp + tid * 16, exp_src);
      if (tid < t.m)
        cp_async::copy4(base + L::kOffSa + tid * 4, sa_src);
      mbarrier::arrive_on_copies(full0 + 8 * st);
      a_src += kBK;
      w_src += kBK / 2;
      sub_src += kBK / 32;
      exp_src += N;
      sa_src += t.m_e;
      if (++kb == nk) {
        kb = 0;
        ++ti;
      }
      if (++st == S) {
        st = 0;
        round_parity ^= 1u;
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---- conversion and MMAs (warpgroups 1 .. W) ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(L::kMmaRegs) : "memory");
  const int mw = wg - 1;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int row = mw * 64 + warp * 16 + g;  // this lane's weight rows: row and row + 8
  const uint32_t lut = smem_u32(smem + L::kOffLut);
  // A stage's fragments of rows row and row + 8: a[j] for K step j (a[j][h]: row + 8 h, K 4 t ..;
  // a[j][2 + h]: K 16 + 4 t ..), and the rows' block scales.
  auto convert = [&](const uint8_t* stage, uint32_t(&a)[4][4], float(&sb)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;
      const uint32_t sub = *reinterpret_cast<const uint32_t*>(stage + L::kOffSub + r * 4);
      const uint32_t e = stage[L::kOffExp + r];
      // Byte j: the 32-block's table, (s_j - e + 8) mod 256.
      const uint32_t idx4 = __vsub4(sub, ((e - 8u) & 0xFFu) * 0x01010101u);
      const uint8_t* raw = stage + L::kOffRaw + r * kPitch + 4 * tq;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(raw + 16 * j);
        uint2 tab;
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                     : "=r"(tab.x), "=r"(tab.y)
                     : "r"(lut + 8 * prmt(idx4, 0, 0x4440u + j)));
        const uint2 q = e2m1x8_to_e4m3(w, tab.x, tab.y);
        a[j][h] = q.x;
        a[j][2 + h] = q.y;
      }
      sb[h] = __uint_as_float(max(e << 23, 0x00400000u));
    }
  };
  float acc[BN / 2];
  float tot[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) tot[i] = 0.0f;
  uint32_t frag[2][4][4];
  float sbs[2][2];
  if (steps > 0) {
    mbarrier::wait(full0, 0);
    convert(smem, frag[0], sbs[0]);
  }
  Tile t;
  int kb = 0;
  int ti = 0;
  int st = 0;
  uint32_t parity = 0;
  auto step =
      [&](bool more, uint32_t(&cur)[4][4], float(&sb)[2], uint32_t(&nxt)[4][4], float(&sbn)[2]) {
        if (kb == 0)
          t = tile_at(ti);
        const uint8_t* stage = smem + st * L::kStageBytes;
        const uint64_t db = wgmma::desc_k_major_sw128(smem_u32(stage + L::kOffAct));
        wgmma::fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) wgmma::mma_m64nNk32_e4m3_rs<BN>(acc, cur[j], db + 2 * j, j > 0);
        wgmma::commit();
        const int nst = st + 1 == S ? 0 : st + 1;
        const uint32_t nparity = nst == 0 ? parity ^ 1u : parity;
        if (more) {  // the next fragments while the MMAs run
          mbarrier::wait(full0 + 8 * nst, nparity);
          convert(smem + nst * L::kStageBytes, nxt, sbn);
        }
        wgmma::wait<0>();
        wgmma::fence_regs(acc);
        const float* sa = reinterpret_cast<const float*>(stage + L::kOffSa) + 2 * tq;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const float2 a2 = *reinterpret_cast<const float2*>(sa + 8 * j);
          tot[4 * j + 0] = fmaf(acc[4 * j + 0], sb[0] * a2.x, tot[4 * j + 0]);
          tot[4 * j + 1] = fmaf(acc[4 * j + 1], sb[0] * a2.y, tot[4 * j + 1]);
          tot[4 * j + 2] = fmaf(acc[4 * j + 2], sb[1] * a2.x, tot[4 * j + 2]);
          tot[4 * j + 3] = fmaf(acc[4 * j + 3], sb[1] * a2.y, tot[4 * j + 3]);
        }
        mbarrier::arrive(empty0 + 8 * st);  // this thread's reads of the stage are done
        if (++kb == nk) {
          float* out = p.d + static_cast<int64_t>(t.nt) * kBW + row;
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int col = 8 * j + 2 * tq + (i & 1);
              if (col < t.m)
                out[(t.row0 + col) * N + 8 * (i >> 1)] = tot[4 * j + i];
            }
          }
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) tot[i] = 0.0f;
          kb = 0;
          ++ti;
        }
        st = nst;
        parity = nparity;
      };
  for (int s = 0; s < steps; s += 2) {
    step(s + 1 < steps, frag[0], sbs[0], frag[1], sbs[1]);
    if (s + 1 < steps)
      step(s + 2 < steps, frag[1], sbs[1], frag[0], sbs[0]);
  }
}

template <int BN, int W>
Status launch(const Args& args, cudaStream_t stream) {
  using L = Layout<BN, W>;
  static const cudaError_t attr = cudaFuncSetAttribute(
      moe_w4a8_gemm_kernel<BN, W>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
  if (attr != cudaSuccess)
    return failed_precondition(std::string("moe_w4a8: shared memory: ") + cudaGetErrorString(attr));
  const MoeW4a8GemmParams& p = args.p;
  const int64_t max_tiles = ((p.num_pairs + BN - 1) / BN + p.w.n_experts) * (args.n / L::kBW);
  const int64_t grid = std::min<int64_t>(max_tiles, sm_count());
  moe_w4a8_gemm_kernel<BN, W><<<static_cast<unsigned>(grid),
                                L::kThreads,
                                static_cast<size_t>(L::smem_bytes(p.w.n_experts)),
                                stream>>>(args);
  return launched("moe_w4a8 launch");
}

// ---- load-time block exponents ----

// One thread per (expert, matrix row, K block): S = max(largest nonzero 32-block exponent - 6, 0)
// (127, a scale of 1, for an all-zero block), counting the blocks E4M3 cannot hold under it
// (moe_sm90.cu's re-encoding rule, scale_rows 1).
__global__ void moe_w4a8_exponents_kernel(const MatrixRef* mats,
                                          int64_t n_experts,
                                          int64_t rows,
                                          int64_t cols,
                                          uint8_t* out,
                                          int64_t out_rows,
                                          int64_t row_offset,
                                          int* inexact) {
  const int64_t kb = cols / 128;
  const int64_t total = n_experts * rows * kb;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i % rows;
    const int64_t blk = (i / rows) % kb;
    const int64_t e = i / (rows * kb);
    const MatrixRef w = mats[e];
    const uint8_t* packed = static_cast<const uint8_t*>(w.data) + r * (cols / 2) + blk * 64;
    const uint8_t* sub = static_cast<const uint8_t*>(w.scale) + r * (cols / 32) + blk * 4;
    int smax = -1000;
    int smin = 1000;
    for (int j = 0; j < 4; ++j) {
      bool nz = false;
      for (int q = 0; q < 16; ++q) nz |= (packed[j * 16 + q] & 0x77) != 0;
      if (nz) {
        smax = max(smax, static_cast<int>(sub[j]));
        smin = min(smin, static_cast<int>(sub[j]));
      }
    }
    uint8_t S = 127;
    if (smax >= smin) {
      if (smax - smin > 14 || smax < 6)
        atomicAdd(inexact, 1);
      S = static_cast<uint8_t>(max(smax - 6, 0));
    }
    out[(e * kb + blk) * out_rows + row_offset + r] = S;
  }
}

}  // namespace

bool moe_w4a8_available() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
    return false;
  return prop.major == 9 && prop.minor == 0;
}

bool moe_w4a8_supports(int64_t hidden, int64_t inter) {
  return hidden > 0 && inter > 0 && hidden % 128 == 0 && inter % 128 == 0;
}

int64_t moe_mxfp4_exponent_bytes(int64_t n_experts, int64_t hidden, int64_t inter) {
  const int64_t e13 = n_experts * (hidden / 128) * 2 * inter;
  const int64_t e2 = n_experts * (inter / 128) * hidden;
  return (e13 + 255) / 256 * 256 + e2;
}

MoeMxfp4Weights moe_mxfp4_weights_carve(void* base,
                                        const MatrixRef* w1,
                                        const MatrixRef* w3,
                                        const MatrixRef* w2,
                                        int64_t n_experts,
                                        int64_t hidden,
                                        int64_t inter) {
  MoeMxfp4Weights w;
  w.w1 = w1;
  w.w3 = w3;
  w.w2 = w2;
  w.n_experts = n_experts;
  w.hidden = hidden;
  w.inter = inter;
  auto* b = static_cast<uint8_t*>(base);
  const int64_t e13 = n_experts * (hidden / 128) * 2 * inter;
  w.exp13 = b;
  w.exp2 = b + (e13 + 255) / 256 * 256;
  return w;
}

Status launch_moe_mxfp4_scales(const MoeMxfp4Weights& w, int* inexact, cudaStream_t stream) {
  if (!moe_w4a8_supports(w.hidden, w.inter))
    return invalid_argument("moe_mxfp4_scales: hidden and inter must be multiples of 128");
  if (!w.w1 || !w.w3 || !w.w2 || !w.exp13 || !w.exp2 || !inexact)
    return null_pointer("moe_mxfp4_scales");
  const int64_t H = w.hidden;
  const int64_t I = w.inter;
  auto grid_for = [](int64_t total) {
    return static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 1 << 16));
  };
  moe_w4a8_exponents_kernel<<<grid_for(w.n_experts * I * (H / 128)), 256, 0, stream>>>(
      w.w1, w.n_experts, I, H, w.exp13, 2 * I, 0, inexact);
  moe_w4a8_exponents_kernel<<<grid_for(w.n_experts * I * (H / 128)), 256, 0, stream>>>(
      w.w3, w.n_experts, I, H, w.exp13, 2 * I, I, inexact);
  moe_w4a8_exponents_kernel<<<grid_for(w.n_experts * H * (I / 128)), 256, 0, stream>>>(
      w.w2, w.n_experts, H, I, w.exp2, H, 0, inexact);
  return launched("moe_mxfp4_scales");
}

Status launch_moe_w4a8_gemm(const MoeW4a8GemmParams& p, cudaStream_t stream) {
  const int64_t H = p.w.hidden;
  const int64_t I = p.w.inter;
  if (!moe_w4a8_supports(H, I))
    return invalid_argument("moe_w4a8: hidden and inter must be multiples of 128");
  if (p.pass != 0 && p.pass != 1)
    return invalid_argument("moe_w4a8: pass must be 0 or 1");
  if (p.w.n_experts < 1 || p.w.n_experts > kMaxExperts)
    return invalid_argument("moe_w4a8: 1 to 1024 experts");
  if (p.num_pairs == 0)
    return Status();
  if (!p.w.w1 || !p.w.w3 || !p.w.w2 || !p.w.exp13 || !p.w.exp2 || !p.expert_begin || !p.a ||
      !p.sa || !p.d)
    return null_pointer("moe_w4a8");
  if ((reinterpret_cast<uintptr_t>(p.a) & 15u) != 0)
    return invalid_argument("moe_w4a8: activation rows must be 16-byte aligned");
  const Args args{p, p.pass == 0 ? 2 * I : H, p.pass == 0 ? H : I};
  // Grouped rows per tile by the mean per expert (a tile's MMAs cover BN rows whatever the
  // expert's count). Four MMA warpgroups (256 weight rows per tile, within one matrix) where the
  // registers allow, more warps to hide the conversion's latencies (H200, 1,024 tokens of
  // V4-Flash's experts: 1.61-1.71 against 1.84-1.86 ms with two).
  const int64_t mean = (p.num_pairs + p.w.n_experts - 1) / p.w.n_experts;
  if (mean <= 32 && (p.pass == 0 ? I : H) % 256 == 0)
    return launch<32, 4>(args, stream);
  if (mean <= 32)
    return launch<32, 2>(args, stream);
  if (mean <= 64)
    return launch<64, 2>(args, stream);
  return launch<128, 2>(args, stream);
}

}  // namespace dsinfer::cuda
