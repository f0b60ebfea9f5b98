// Decode-sized dense FP8 linears on wgmma (fp8_gemm_decode.h).
//
// Block (tile, split) of a grid of row tiles x K splits (the splits of a tile one cluster): W
// consumer warpgroups and two loader warps. The loaders copy, per 128-wide K block, the tile's
// 64 W weight rows (one warp) and the n token rows of activation codes and their scales (the
// other; codes K-major in the 128-byte swizzle) into a ring of kStages stages by cp.async, the
// copies arriving on the stage's full mbarrier as they land; the first stages' weights are
// requested before the PDL wait (they stream in while the kernel before this one finishes).
// Consumer warpgroup c multiplies weight rows 64 c .. + 63 with the tokens (four m64nBNk32 wgmmas,
// both operands in shared memory), then adds the block's sums times (weight block scale x
// activation scale) into its totals and releases the stage. With one split the totals go to y; with
// several, every block stores its totals in shared memory and, after a cluster barrier, each block
// adds a slice of the tile's outputs over the splits in split order.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/fp8_gemm_decode.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/wgmma_fp8.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kBK = 128;
constexpr int kStages = 4;
constexpr int kMaxSplits = 8;  // a portable cluster

template <int W, int BN>
struct Layout {
  static constexpr int kBM = 64 * W;   // weight rows per tile
  static constexpr int kLoaders = 64;  // two loader warps after the consumer warpgroups
  static constexpr int kThreads = 128 * W + kLoaders;
  static constexpr int kOffW = 0;                  // [kBM][128] E4M3, 128-byte swizzle
  static constexpr int kOffX = kBM * kBK;          // [BN][128] E4M3, 128-byte swizzle
  static constexpr int kOffXs = kOffX + BN * kBK;  // [BN] f32 activation scales
  static constexpr int kStageBytes = (kOffXs + BN * 4 + 1023) / 1024 * 1024;
  static constexpr int kOffBars = kStages * kStageBytes;  // u64 full[kStages], empty[kStages]
  // After the K loop the ring holds the block's totals: [BN][kRedPitch] f32.
  static constexpr int kRedPitch = kBM + 4;
  static_assert(BN * kRedPitch * 4 <= kOffBars, "the totals must fit the ring");
  static constexpr int kSmem = kOffBars + 16 * kStages + 1024;  // + alignment slack
};

struct Args {
  Fp8LinearParams p;  // rows resolved
  int64_t ldy;
  int kb_per;  // K blocks per split
  int splits;
};

template <int W, int BN>
__global__ void __launch_bounds__(Layout<W, BN>::kThreads, 2) fp8_gemm_decode_kernel(Args a) {
  using L = Layout<W, BN>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (cp_async::smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t s0 = cp_async::smem_u32(smem);
  const uint32_t full0 = s0 + L::kOffBars;
  const uint32_t empty0 = full0 + 8 * kStages;
  const Fp8LinearParams& p = a.p;
  const int64_t K = p.w.cols;
  const int64_t KB = K / kBK;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * L::kBM;  // within the row range
  const int64_t kb0 = static_cast<int64_t>(blockIdx.y) * a.kb_per;
  const int nkb = static_cast<int>(min(KB, kb0 + a.kb_per) - kb0);
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) {
      mbarrier::init(full0 + 8 * st, L::kLoaders);  // the loader threads, as their copies land
      mbarrier::init(empty0 + 8 * st, 128 * W);     // the consumers' threads
    }
  }
  __syncthreads();
  const bool loader = warp >= 4 * W;
  // Two loader warps: warp 4 W copies the weight rows, warp 4 W + 1 the tokens' codes and scales,
  // so that each one's arrivals (an arrival waits for all of its thread's earlier copies) wait for
  // its own stages only: the weights of stage i do not wait for those issued after them, nor the
  // activations for the weights requested before the PDL wait. Lane l copies 16-byte chunk l % 8
  // of rows l / 8 + 4 m (the swizzled chunk alternates between two positions with m).
  const bool wloader = warp == 4 * W;
  const int lr = lane >> 3;
  const int lc = lane & 7;
  const uint32_t swz[2] = {static_cast<uint32_t>(lr * 128 + ((lc ^ lr) << 4)),
                           static_cast<uint32_t>((lr + 4) * 128 + ((lc ^ (lr + 4)) << 4))};
  const auto* wdata = static_cast<const uint8_t*>(p.w.data) + lc * 16;
  const uint8_t* xdata = p.x.codes + lc * 16;
  // K block i of this split -> stage i % kStages: the weight rows (past the range: its last row,
  // computed, not stored), or the tokens' codes and scales.
  auto copy_w = [&](int i) {
    const uint32_t base = s0 + static_cast<uint32_t>((i % kStages) * L::kStageBytes + L::kOffW);
    const int64_t k = (kb0 + i) * kBK;
#pragma unroll
    for (int m = 0; m < L::kBM / 4; ++m) {
      const int64_t row = p.row_begin + min(row0 + lr + 4 * m, p.rows - 1);
      cp_async::copy16(base + swz[m & 1] + (m >> 1) * 1024, wdata + row * K + k);
    }
  };
  auto copy_x = [&](int i) {
    const uint32_t base = s0 + static_cast<uint32_t>((i % kStages) * L::kStageBytes);
    const int64_t kb = kb0 + i;
#pragma unroll
    for (int m = 0; m < BN / 4; ++m) {
      const int t = lr + 4 * m;
      if (t < p.n)
        cp_async::copy16(base + L::kOffX + swz[m & 1] + (m >> 1) * 1024,
                         xdata + t * p.x.ld + kb * kBK);
    }
    for (int t = lane; t < BN; t += 32) {
      if (t < p.n)
        cp_async::copy4(base + L::kOffXs + t * 4, p.x.scales + t * (p.x.ld / kBK) + kb);
    }
  };
  const int pre = min(nkb, kStages);
  pdl_begin_after([&] {
    if (wloader) {
      for (int i = 0; i < pre; ++i) {
        copy_w(i);
        mbarrier::arrive_on_copies(full0 + 8 * i);
      }
    }
  });

  const int cw = warp >> 2;  // consumer warpgroup
  const int g = lane >> 2;
  const int tq = lane & 3;
  float tot[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) tot[i] = 0.0f;
  // This thread's weight rows in the tile: ra and ra + 8.
  const int ra = 64 * cw + 16 * (warp & 3) + g;
  if (loader) {
    for (int i = wloader ? pre : 0; i < nkb; ++i) {
      const int st = i % kStages;
      if (i >= kStages)  // the stage's previous round released
        mbarrier::wait(empty0 + 8 * st, static_cast<uint32_t>((i / kStages - 1) & 1));
      if (wloader) {
        copy_w(i);
      } else {
        copy_x(i);
      }
      mbarrier::arrive_on_copies(full0 + 8 * st);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
  } else {
    const bool sf32 = p.w.scale_dtype == DType::kF32;
    const int64_t scale_rows[2] = {(p.row_begin + min(row0 + ra, p.rows - 1)) / 128 * KB + kb0,
                                   (p.row_begin + min(row0 + ra + 8, p.rows - 1)) / 128 * KB + kb0};
    float acc[BN / 2];
    // The weight scales one K block ahead (their loads in flight during a block's MMAs).
    float wsn0 = fp8_block_scale(p.w.scale, sf32, scale_rows[0]);
    float wsn1 = fp8_block_scale(p.w.scale, sf32, scale_rows[1]);
    for (int i = 0; i < nkb; ++i) {
      const int st = i % kStages;
      const float ws0 = wsn0;
      const float ws1 = wsn1;
      if (i + 1 < nkb) {
        wsn0 = fp8_block_scale(p.w.scale, sf32, scale_rows[0] + i + 1);
        wsn1 = fp8_block_scale(p.w.scale, sf32, scale_rows[1] + i + 1);
      }
      mbarrier::wait(full0 + 8 * st, static_cast<uint32_t>((i / kStages) & 1));
      wgmma::fence_async_smem();
      const uint8_t* stage = smem + st * L::kStageBytes;
      const uint64_t da = wgmma::desc_k_major_sw128(cp_async::smem_u32(stage + L::kOffW) +
                                                    static_cast<uint32_t>(cw * 64 * 128));
      const uint64_t db = wgmma::desc_k_major_sw128(cp_async::smem_u32(stage + L::kOffX));
      wgmma::fence();
#pragma unroll
      for (int j = 0; j < 4; ++j)
        wgmma::mma_m64nNk32_e4m3_ss<BN>(acc, da + 2 * j, db + 2 * j, j > 0);
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_regs(acc);
      const float* xs = reinterpret_cast<const float*>(stage + L::kOffXs) + 2 * tq;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const float2 x2 = *reinterpret_cast<const float2*>(xs + 8 * j);
        tot[4 * j + 0] = fmaf(acc[4 * j + 0], __fmul_rn(ws0, x2.x), tot[4 * j + 0]);
        tot[4 * j + 1] = fmaf(acc[4 * j + 1], __fmul_rn(ws0, x2.y), tot[4 * j + 1]);
        tot[4 * j + 2] = fmaf(acc[4 * j + 2], __fmul_rn(ws1, x2.x), tot[4 * j + 2]);
        tot[4 * j + 3] = fmaf(acc[4 * j + 3], __fmul_rn(ws1, x2.y), tot[4 * j + 3]);
      }
      mbarrier::arrive(empty0 + 8 * st);
    }
  }

  // tot[4 j + i]: row ra + 8 (i / 2), token 8 j + 2 tq + i % 2.
  if (a.splits == 1) {
    if (!loader) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int t = 8 * j + 2 * tq + (i & 1);
          const int64_t r = row0 + ra + 8 * (i >> 1);
          if (t < p.n && r < p.rows) {
            float* y = p.y + t * a.ldy + r;
            *y = p.accumulate ? __fadd_rn(*y, tot[4 * j + i]) : tot[4 * j + i];
          }
        }
      }
    }
    return;
  }
  __syncthreads();  // every stage consumed and every copy landed: the ring holds the totals now
  float* red = reinterpret_cast<float*>(smem);
  if (!loader) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        red[(8 * j + 2 * tq + (i & 1)) * L::kRedPitch + ra + 8 * (i >> 1)] = tot[4 * j + i];
    }
  }
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's totals stored
  // Block q of the cluster (q = blockIdx.y) adds outputs [q E / S, (q + 1) E / S) of the tile's
  // E = tokens x rows over the splits.
  const int tokens = static_cast<int>(p.n < BN ? p.n : BN);
  const int total = tokens * L::kBM;
  const int q = static_cast<int>(blockIdx.y);
  const int e1 = (q + 1) * total / a.splits;
  for (int e = q * total / a.splits + static_cast<int>(threadIdx.x); e < e1;
       e += static_cast<int>(blockDim.x)) {
    const int t = e / L::kBM;
    const int r = e % L::kBM;
    if (row0 + r >= p.rows)
      continue;
    float part[kMaxSplits];  // every split's value requested before the first is added
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s < a.splits)
        part[s] = cluster.map_shared_rank(red, s)[t * L::kRedPitch + r];
    }
    float v = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s < a.splits)
        v = __fadd_rn(v, part[s]);
    }
    float* y = p.y + t * a.ldy + row0 + r;
    *y = p.accumulate ? __fadd_rn(*y, v) : v;
  }
  cluster.sync();  // the other blocks' totals stay until every block has read them
}

// The kernel's shared-memory attribute, set once per instantiation.
template <int W, int BN>
cudaError_t kernel_attributes() {
  static const cudaError_t attr = cudaFuncSetAttribute(fp8_gemm_decode_kernel<W, BN>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       Layout<W, BN>::kSmem);
  return attr;
}

// Blocks of the instantiation that run at once in clusters of `splits` (0 where the query fails),
// asked once per (instantiation, splits).
template <int W, int BN>
int64_t capacity(int splits) {
  static std::atomic<int64_t> cache[4] = {-1, -1, -1, -1};  // splits 1, 2, 4, 8
  const int slot = splits == 1 ? 0 : splits == 2 ? 1 : splits == 4 ? 2 : 3;
  if (const int64_t known = cache[slot].load(std::memory_order_relaxed); known >= 0)
    return known;
  int64_t blocks = 0;
  if (kernel_attributes<W, BN>() == cudaSuccess) {
    if (splits == 1) {
      int per_sm = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm,
                                                        fp8_gemm_decode_kernel<W, BN>,
                                                        Layout<W, BN>::kThreads,
                                                        Layout<W, BN>::kSmem) == cudaSuccess) {
        blocks = static_cast<int64_t>(per_sm) * sm_count();
      } else {
        (void)cudaGetLastError();  // a failed query leaves no error behind
      }
    } else {
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = 1;
      attr.val.clusterDim.y = static_cast<unsigned>(splits);
      attr.val.clusterDim.z = 1;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(1, static_cast<unsigned>(splits));
      cfg.blockDim = dim3(Layout<W, BN>::kThreads);
      cfg.dynamicSmemBytes = Layout<W, BN>::kSmem;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, fp8_gemm_decode_kernel<W, BN>, &cfg) ==
          cudaSuccess) {
        blocks = static_cast<int64_t>(clusters) * splits;
      } else {
        (void)cudaGetLastError();
      }
    }
  }
  cache[slot].store(blocks, std::memory_order_relaxed);
  return blocks;
}

template <int W, int BN>
Status launch(const Args& args, int64_t tiles, cudaStream_t stream) {
  using L = Layout<W, BN>;
  const cudaError_t attr = kernel_attributes<W, BN>();
  if (attr != cudaSuccess)
    return failed_precondition(std::string("fp8_gemm_decode: shared memory: ") +
                               cudaGetErrorString(attr));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(args.splits));
  const dim3 cluster = args.splits > 1 ? dim3(1, static_cast<unsigned>(args.splits), 1) : dim3(0);
  launch_pdl_cluster(fp8_gemm_decode_kernel<W, BN>,
                     grid,
                     dim3(L::kThreads),
                     static_cast<size_t>(L::kSmem),
                     stream,
                     cluster,
                     args);
  return launched("fp8_gemm_decode launch");
}

// The plan of one launch: 64 W weight rows per tile, K in `splits` ranges.
struct Plan {
  int w = 2;
  int splits = 1;
  int64_t tiles = 0;
};

// The one-wave plan (every block running at once) that keeps the most SMs busy; ties go to fewer
// splits (less to add up), then to 128-row tiles (each token row read half as often).
template <int BN>
Plan plan_for(int64_t rows, int64_t kb) {
  Plan best;
  best.tiles = ceil_div(rows, 128);
  int64_t best_busy = -1;
  for (int w : {2, 1}) {
    const int64_t tiles = ceil_div(rows, 64 * w);
    for (int splits : {1, 2, 4, 8}) {
      if (splits > kb)
        break;
      const int64_t blocks = tiles * splits;
      const int64_t cap = w == 2 ? capacity<2, BN>(splits) : capacity<1, BN>(splits);
      if (blocks > cap)
        continue;
      const int64_t busy = std::min<int64_t>(blocks, sm_count());
      if (busy > best_busy || (busy == best_busy && splits < best.splits)) {
        best_busy = busy;
        best = Plan{w, splits, tiles};
      }
    }
  }
  return best;
}

template <int BN>
Status launch_bn(Args args, cudaStream_t stream) {
  const int64_t kb = args.p.w.cols / kBK;
  const Plan plan = plan_for<BN>(args.p.rows, kb);
  args.kb_per = static_cast<int>(ceil_div(kb, plan.splits));
  args.splits = static_cast<int>(ceil_div(kb, args.kb_per));
  return plan.w == 2 ? launch<2, BN>(args, plan.tiles, stream)
                     : launch<1, BN>(args, plan.tiles, stream);
}

}  // namespace

bool fp8_gemm_decode_supports(const MatrixRef& w) {
  static const bool sm90 = [] {
    const char* env = std::getenv("DSINFER_FP8_DECODE");
    if (env != nullptr && std::strcmp(env, "0") == 0)
      return false;  // an A/B switch: the paths before it (mma.sync tiles, CUTLASS from 64 rows)
    int dev = 0;
    cudaDeviceProp prop{};
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaGetDeviceProperties(&prop, dev) == cudaSuccess && prop.major == 9 && prop.minor == 0;
  }();
  return sm90 && w.format == WeightFormat::kFp8Block128 && w.dtype == DType::kF8E4M3 &&
         w.cols > 0 && w.cols % kBK == 0 && (reinterpret_cast<uintptr_t>(w.data) & 15u) == 0;
}

bool fp8_gemm_decode_takes(const MatrixRef& w, int64_t n) {
  return n >= 1 && n <= kFp8DecodeMaxRows &&
         (n > kGemvMaxTokens || w.cols <= kFp8DecodeSmallBatchMaxK) && fp8_gemm_decode_supports(w);
}

Status launch_fp8_gemm_decode(const Fp8LinearParams& p, cudaStream_t stream) {
  if (!fp8_gemm_decode_supports(p.w))
    return invalid_argument("fp8_gemm_decode: needs FP8 block-128 weights, K % 128 == 0, sm_90");
  if (p.n < 1 || p.n > kFp8DecodeMaxRows)
    return invalid_argument("fp8_gemm_decode: " + std::to_string(p.n) + " rows out of [1, 64]");
  if (p.rows < 0 || p.row_begin < 0 || p.row_begin + p.rows > p.w.rows)
    return invalid_argument("fp8_gemm_decode: row range exceeds the weight");
  if (p.x.ld % kBK != 0 || p.x.ld < p.w.cols || (reinterpret_cast<uintptr_t>(p.x.codes) & 15u) != 0)
    return invalid_argument("fp8_gemm_decode: activation rows must be 16-byte aligned, ld % 128");
  if (p.rows == 0)
    return Status();
  const Args args{p, p.ldy == 0 ? p.rows : p.ldy, 0, 1};
  return p.n <= 32 ? launch_bn<32>(args, stream) : launch_bn<64>(args, stream);
}

}  // namespace dsinfer::cuda
