// `dsinfer bench --ops` (bench_ops.h): every op on random device data, timed with CUDA events.
#include "cli/bench_ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/fp8_gemm_decode.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/moe_sm90.h"
#include "perf/fill.h"

namespace dsinfer::cli {
namespace {

using json = nlohmann::ordered_json;

// Device buffers freed at scope exit.
class DeviceArena {
 public:
  ~DeviceArena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  Status alloc(T** p, int64_t n) {
    void* v = nullptr;
    if (cudaMalloc(&v, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)) != cudaSuccess) {
      cudaGetLastError();
      return Status(StatusCode::kResourceExhausted, "bench --ops: out of device memory");
    }
    ptrs_.push_back(v);
    *p = static_cast<T*>(v);
    return Status();
  }

 private:
  std::vector<void*> ptrs_;
};

// Median time of `iters` launches of f, in ms.
Result<double> time_ms(const std::function<Status()>& f, int iters) {
  for (int i = 0; i < 2; ++i) DSI_RETURN_IF_ERROR(f());
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(a);
    DSI_RETURN_IF_ERROR(f());
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return static_cast<double>(ms[ms.size() / 2]);
}

// Time per launch of `count` launches back to back in one CUDA graph (as a decode step runs its
// linears: launched with PDL, one after another), launch(i, stream) making the i-th; the median of
// `iters` replays after one untimed replay.
Result<double> graph_ms_per_launch(const std::function<Status(int, cudaStream_t)>& launch,
                                   int count,
                                   int iters) {
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    return Status(StatusCode::kInternal, "bench --ops: cannot create a stream");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Status st;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    st = Status(StatusCode::kInternal, "bench --ops: stream capture failed");
  } else {
    for (int i = 0; i < count && st.ok(); ++i) st = launch(i, stream);
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (st.ok() && (end != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess))
      st = Status(StatusCode::kInternal, "bench --ops: graph capture failed");
  }
  std::vector<float> ms;
  if (st.ok()) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaGraphLaunch(exec, stream);
    for (int i = 0; i < iters; ++i) {
      cudaEventRecord(a, stream);
      cudaGraphLaunch(exec, stream);
      cudaEventRecord(b, stream);
      cudaEventSynchronize(b);
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      ms.push_back(t / static_cast<float>(count));
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (cudaStreamSynchronize(stream) != cudaSuccess)
      st = Status(StatusCode::kInternal, "bench --ops: graph replay failed");
  }
  if (exec)
    cudaGraphExecDestroy(exec);
  if (graph)
    cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaGetLastError();
  DSI_RETURN_IF_ERROR(st);
  std::sort(ms.begin(), ms.end());
  return static_cast<double>(ms[ms.size() / 2]);
}

// A random FP8 (E4M3 codes, E8M0 block scales) or MXFP4 weight on the device.
Status random_weight(
    DeviceArena& arena, WeightFormat f, int64_t rows, int64_t cols, uint64_t seed, MatrixRef* w) {
  w->format = f;
  w->rows = rows;
  w->cols = cols;
  w->scale_dtype = DType::kF8E8M0;
  uint8_t* data = nullptr;
  uint8_t* scale = nullptr;
  const int64_t data_bytes = f == WeightFormat::kMxfp4 ? rows * cols / 2 : rows * cols;
  const int64_t scale_bytes =
      f == WeightFormat::kMxfp4 ? rows * cols / 32 : ((rows + 127) / 128) * ((cols + 127) / 128);
  DSI_RETURN_IF_ERROR(arena.alloc(&data, data_bytes));
  DSI_RETURN_IF_ERROR(arena.alloc(&scale, scale_bytes));
  // Random E4M3 bytes are also random E2M1 nibble pairs.
  DSI_RETURN_IF_ERROR(
      perf::fill_random(data, data_bytes, perf::GemmInput::kFp8E4M3, seed, nullptr));
  cudaMemset(scale, 120, static_cast<size_t>(scale_bytes));  // 2^-7
  w->dtype = f == WeightFormat::kMxfp4 ? DType::kI8 : DType::kF8E4M3;
  w->data = data;
  w->scale = scale;
  return Status();
}

json figure(const std::string& op,
            const std::string& shape,
            int64_t tokens,
            double ms,
            double flops,
            double bytes,
            const OpBenchOptions& o) {
  const double s = ms * 1e-3;
  json j = {{"op", op},
            {"shape", shape},
            {"tokens", tokens},
            {"ms", ms},
            {"tflops", flops / s * 1e-12},
            {"tbps", bytes / s * 1e-12},
            {"flops", flops},
            {"bytes", bytes}};
  if (o.fp8_flops > 0)
    j["fraction_fp8_peak"] = flops / s / o.fp8_flops;
  if (o.copy_bytes_per_s > 0)
    j["fraction_copy_bw"] = bytes / s / o.copy_bytes_per_s;
  return j;
}

}  // namespace

Result<json> bench_ops(const OpBenchOptions& o) {
  if (cudaSetDevice(o.device) != cudaSuccess)
    return failed_precondition("bench --ops: no CUDA device " + std::to_string(o.device));
  const int64_t max_t = *std::max_element(o.tokens.begin(), o.tokens.end());
  json out = json::array();
  DeviceArena arena;
  // Activations (fp32, then FP8) for the largest token count and the widest K.
  constexpr int64_t kMaxK = 8192;
  float* x = nullptr;
  DSI_RETURN_IF_ERROR(arena.alloc(&x, max_t * kMaxK));
  {
    std::vector<float> h(static_cast<size_t>(max_t * kMaxK));
    std::mt19937 g(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : h) v = nd(g);
    cudaMemcpy(x, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  DSI_RETURN_IF_ERROR(arena.alloc(&codes, max_t * kMaxK));
  DSI_RETURN_IF_ERROR(arena.alloc(&scales, max_t * kMaxK / 128));

  // Dense FP8 linears of one V4-Flash layer: name, rows (out), cols (in).
  struct Dense {
    const char* name;
    int64_t rows, cols;
  };
  const Dense dense[] = {{"wq_a", 1024, 4096},
                         {"wkv", 512, 4096},
                         {"wq_b", 32768, 1024},
                         {"wo_b", 4096, 8192},
                         {"indexer.wq_b", 8192, 1024},
                         {"shared.w1", 2048, 4096}};
  float* y = nullptr;
  DSI_RETURN_IF_ERROR(arena.alloc(&y, std::max<int64_t>(max_t * 32768, 256 * 129280)));
  // The wgmma path's scale scratch (fp8_gemm.h), as the forward takes it from its workspace.
  float* gemm_scratch = nullptr;
  int64_t gemm_scratch_floats = 0;
  for (const Dense& d : dense) {
    MatrixRef shape;
    shape.format = WeightFormat::kFp8Block128;
    shape.dtype = DType::kF8E4M3;
    shape.rows = d.rows;
    shape.cols = d.cols;
    for (int64_t t : o.tokens) {
      gemm_scratch_floats =
          std::max(gemm_scratch_floats, cuda::fp8_linear_scratch_floats(shape, -1, t));
    }
  }
  DSI_RETURN_IF_ERROR(arena.alloc(&gemm_scratch, std::max<int64_t>(gemm_scratch_floats, 1)));
  uint64_t seed = 1;
  for (const Dense& d : dense) {
    MatrixRef w;
    DSI_RETURN_IF_ERROR(
        random_weight(arena, WeightFormat::kFp8Block128, d.rows, d.cols, seed++, &w));
    // Copies of w totalling at least 256 MB (at least 4), made on first use and freed with the op.
    DeviceArena copy_arena;
    std::vector<MatrixRef> copies;
    auto ensure_copies = [&](const MatrixRef& src, std::vector<MatrixRef>* out) -> Status {
      if (!out->empty())
        return Status();
      const int64_t data_bytes = src.rows * src.cols;
      const int64_t scale_bytes = ((src.rows + 127) / 128) * ((src.cols + 127) / 128);
      const int64_t n = std::clamp<int64_t>((256 << 20) / data_bytes + 1, 4, 256);
      for (int64_t i = 0; i < n; ++i) {
        MatrixRef c = src;
        uint8_t* data = nullptr;
        uint8_t* scale = nullptr;
        DSI_RETURN_IF_ERROR(copy_arena.alloc(&data, data_bytes));
        DSI_RETURN_IF_ERROR(copy_arena.alloc(&scale, scale_bytes));
        cudaMemcpy(data, src.data, static_cast<size_t>(data_bytes), cudaMemcpyDeviceToDevice);
        cudaMemcpy(scale, src.scale, static_cast<size_t>(scale_bytes), cudaMemcpyDeviceToDevice);
        c.data = data;
        c.scale = scale;
        out->push_back(c);
      }
      return Status();
    };
    for (int64_t t : o.tokens) {
      cuda::QuantizeFp8Params q{x, d.cols, t, d.cols, codes, scales};
      DSI_RETURN_IF_ERROR(cuda::launch_quantize_fp8(q, nullptr));
      cuda::Fp8LinearParams p;
      p.w = w;
      p.x = cuda::Fp8Acts{codes, scales, cuda::fp8_acts_ld(d.cols)};
      p.n = t;
      p.y = y;
      p.wgmma = !o.batch_invariant;
      p.scratch = gemm_scratch;
      p.scratch_floats = gemm_scratch_floats;
      auto ms = time_ms([&] { return cuda::launch_fp8_linear(p, nullptr); }, o.iters);
      if (!ms.ok())
        return ms.status();
      const double bytes = static_cast<double>(w.nbytes()) + static_cast<double>(t) * d.cols +
                           4.0 * static_cast<double>(t) * d.rows;
      out.push_back(figure(std::string("linear ") + d.name,
                           std::to_string(d.rows) + "x" + std::to_string(d.cols),
                           t,
                           *ms,
                           2.0 * t * d.rows * d.cols,
                           bytes,
                           o));
      // Decode sizes also as a decode step runs them: launches back to back in a graph, each on
      // another copy of the weight (together past L2, so every launch reads its weight from HBM).
      if (t <= cuda::kFp8DecodeMaxRows) {
        DSI_RETURN_IF_ERROR(ensure_copies(w, &copies));
        auto sms = graph_ms_per_launch(
            [&](int i, cudaStream_t stream) {
              cuda::Fp8LinearParams pi = p;
              pi.w = copies[static_cast<size_t>(i)];
              return cuda::launch_fp8_linear(pi, stream);
            },
            static_cast<int>(copies.size()),
            std::max(o.iters / 4, 3));
        if (!sms.ok())
          return sms.status();
        json j = figure(std::string("linear ") + d.name + " (graph, HBM)",
                        std::to_string(d.rows) + "x" + std::to_string(d.cols),
                        t,
                        *sms,
                        2.0 * t * d.rows * d.cols,
                        bytes,
                        o);
        j["note"] = std::to_string(copies.size()) +
                    " launches back to back in one CUDA graph over as many copies of the weight; "
                    "time per launch";
        out.push_back(j);
      }
      auto qms = time_ms([&] { return cuda::launch_quantize_fp8(q, nullptr); }, o.iters);
      if (!qms.ok())
        return qms.status();
      out.push_back(figure("quantize_fp8",
                           std::to_string(t) + "x" + std::to_string(d.cols),
                           t,
                           *qms,
                           0.0,
                           5.0 * t * d.cols + 4.0 * t * d.cols / 128,
                           o));
    }
  }

  // fp32-activation linears on the BF16 tensor cores (x split into BF16 halves): one wo_a group
  // (FP8), the router, a CSA compressor projection and the LM head (BF16).
  const Dense plain[] = {{"wo_a (one of 8 groups)", 1024, 4096},
                         {"router", 256, 4096},
                         {"compressor.wkv (CSA)", 1024, 4096},
                         {"head", 129280, 4096}};
  uint16_t *hi = nullptr, *lo = nullptr;
  DSI_RETURN_IF_ERROR(arena.alloc(&hi, max_t * 4096));
  DSI_RETURN_IF_ERROR(arena.alloc(&lo, max_t * 4096));
  for (const Dense& d : plain) {
    MatrixRef w;
    const bool fp8 = d.rows == 1024 && std::string(d.name).rfind("wo_a", 0) == 0;
    if (fp8) {
      DSI_RETURN_IF_ERROR(
          random_weight(arena, WeightFormat::kFp8Block128, d.rows, d.cols, seed++, &w));
    } else {
      uint16_t* data = nullptr;
      DSI_RETURN_IF_ERROR(arena.alloc(&data, d.rows * d.cols));
      DSI_RETURN_IF_ERROR(
          perf::fill_random(data, d.rows * d.cols, perf::GemmInput::kBf16, seed++, nullptr));
      w.format = WeightFormat::kFloat;
      w.dtype = DType::kBF16;
      w.rows = d.rows;
      w.cols = d.cols;
      w.data = data;
    }
    for (int64_t t : o.tokens) {
      if (d.rows > 32768 && t > 256)
        continue;  // the head runs on the last token of each sequence only
      cuda::SplitBf16Params sp;
      sp.x = x;
      sp.n = t;
      sp.k = d.cols;
      sp.hi = hi;
      sp.lo = lo;
      DSI_RETURN_IF_ERROR(cuda::launch_split_bf16(sp, nullptr));
      cuda::Bf16x2LinearParams p;
      p.w = w;
      p.x = cuda::Bf16SplitActs{hi, lo, cuda::bf16_split_ld(d.cols)};
      p.n = t;
      p.y = y;
      auto ms = time_ms([&] { return cuda::launch_bf16x2_linear(p, nullptr); }, o.iters);
      if (!ms.ok())
        return ms.status();
      const double bytes = static_cast<double>(w.nbytes()) + 4.0 * t * d.cols +
                           4.0 * static_cast<double>(t) * d.rows;
      json j = figure(std::string("linear bf16x2 ") + d.name,
                      std::to_string(d.rows) + "x" + std::to_string(d.cols),
                      t,
                      *ms,
                      2.0 * t * d.rows * d.cols,
                      bytes,
                      o);
      j["note"] = "two BF16 MMAs per step (hi + lo): the FP8 peak fraction counts the FLOPs once";
      out.push_back(j);
      if (!fp8 && t <= cuda::kGemvMaxTokens) {  // what the model runs for a few tokens
        cuda::GemvParams g;
        g.w = w;
        g.x = x;
        g.n = t;
        g.y = y;
        auto gms = time_ms([&] { return cuda::launch_gemv_bf16(g, nullptr); }, o.iters);
        if (!gms.ok())
          return gms.status();
        out.push_back(figure(std::string("gemv bf16 ") + d.name,
                             std::to_string(d.rows) + "x" + std::to_string(d.cols),
                             t,
                             *gms,
                             2.0 * t * d.rows * d.cols,
                             bytes,
                             o));
      }
    }
  }

  // Routed experts of one MoE layer: 256 MXFP4 experts, top-6, 4096 -> 2048 -> 4096, uniform
  // random routing; gate/up + SwiGLU, quantisation of h, down (the combine is not included).
  constexpr int64_t kExperts = 256, kTopK = 6, kHidden = 4096, kInter = 2048;
  std::vector<MatrixRef> w1(kExperts), w3(kExperts), w2(kExperts);
  for (int64_t e = 0; e < kExperts; ++e) {
    DSI_RETURN_IF_ERROR(
        random_weight(arena, WeightFormat::kMxfp4, kInter, kHidden, seed++, &w1[e]));
    DSI_RETURN_IF_ERROR(
        random_weight(arena, WeightFormat::kMxfp4, kInter, kHidden, seed++, &w3[e]));
    DSI_RETURN_IF_ERROR(
        random_weight(arena, WeightFormat::kMxfp4, kHidden, kInter, seed++, &w2[e]));
  }
  MatrixRef* refs = nullptr;
  DSI_RETURN_IF_ERROR(arena.alloc(&refs, 3 * kExperts));
  cudaMemcpy(refs, w1.data(), kExperts * sizeof(MatrixRef), cudaMemcpyHostToDevice);
  cudaMemcpy(refs + kExperts, w3.data(), kExperts * sizeof(MatrixRef), cudaMemcpyHostToDevice);
  cudaMemcpy(refs + 2 * kExperts, w2.data(), kExperts * sizeof(MatrixRef), cudaMemcpyHostToDevice);
  const int64_t max_pairs = max_t * kTopK;
  int32_t *ids = nullptr, *src = nullptr, *pos = nullptr;
  int64_t* begin = nullptr;
  float *gates = nullptr, *h = nullptr, *hs = nullptr, *ye = nullptr;
  uint8_t* hq = nullptr;
  DSI_RETURN_IF_ERROR(arena.alloc(&ids, max_pairs));
  DSI_RETURN_IF_ERROR(arena.alloc(&src, max_pairs));
  DSI_RETURN_IF_ERROR(arena.alloc(&pos, max_pairs));
  DSI_RETURN_IF_ERROR(arena.alloc(&begin, kExperts + 1));
  DSI_RETURN_IF_ERROR(arena.alloc(&gates, max_pairs));
  DSI_RETURN_IF_ERROR(arena.alloc(&h, max_pairs * kInter));
  DSI_RETURN_IF_ERROR(arena.alloc(&hq, max_pairs * kInter));
  DSI_RETURN_IF_ERROR(arena.alloc(&hs, max_pairs * kInter / 128));
  DSI_RETURN_IF_ERROR(arena.alloc(&ye, max_pairs * kHidden));
  const double expert_bytes = static_cast<double>(w1[0].nbytes() + w3[0].nbytes() + w2[0].nbytes());
  // The decode path (the expert GEMV, up to kExpertGemvTokens pairs per expert on average), where
  // these experts pass its scale check (what DeviceWeights::enable_expert_gemv asks).
  int* bad = nullptr;
  DSI_RETURN_IF_ERROR(arena.alloc(&bad, 1));
  DSI_ASSIGN_OR_RETURN(const bool gemv_ok,
                       cuda::expert_gemv_takes(refs,
                                               refs + kExperts,
                                               refs + 2 * kExperts,
                                               WeightFormat::kMxfp4,
                                               kExperts,
                                               kHidden,
                                               kInter,
                                               bad));
  // The prefill path of the model (from 128 tokens, CudaModel::kMoeSm90MinTokens): the experts
  // re-encoded once into FP8, grouped wgmma GEMMs (moe_sm90.h), with one scale per 128 x 128 block
  // (what the model takes where exact) and with one per row and 128-wide K block.
#if DSINFER_HAVE_CUTLASS
  cuda::MoeFp8Weights fp8w[2];  // scale_rows 128, 1
  bool fp8w_exact[2] = {false, false};
  uint8_t* sm90_scratch = nullptr;
  int64_t sm90_scratch_bytes = 0;
  {
    int* inexact = nullptr;
    DSI_RETURN_IF_ERROR(arena.alloc(&inexact, 1));
    for (int i = 0; i < 2; ++i) {
      const int scale_rows = i == 0 ? 128 : 1;
      uint8_t* mem = nullptr;
      DSI_RETURN_IF_ERROR(
          arena.alloc(&mem, cuda::moe_fp8_weights_bytes(kExperts, kHidden, kInter, scale_rows)));
      cudaMemset(inexact, 0, sizeof(int));
      fp8w[i] = cuda::moe_fp8_weights_carve(mem, kExperts, kHidden, kInter, scale_rows);
      DSI_RETURN_IF_ERROR(cuda::launch_moe_fp8_reencode(refs,
                                                        refs + kExperts,
                                                        refs + 2 * kExperts,
                                                        WeightFormat::kMxfp4,
                                                        fp8w[i],
                                                        inexact,
                                                        nullptr));
      int bad = 0;
      cudaMemcpy(&bad, inexact, sizeof(int), cudaMemcpyDeviceToHost);
      fp8w_exact[i] = bad == 0;
    }
    sm90_scratch_bytes = cuda::moe_sm90_scratch_bytes(kExperts, max_pairs, kHidden, kInter);
    DSI_RETURN_IF_ERROR(arena.alloc(&sm90_scratch, sm90_scratch_bytes + 256));
  }
  // The same experts read as they are by the grouped W4A8 GEMMs (moe_w4a8_sm90.h: the prefill
  // path where E4M3 holds every row block, no FP8 copy).
  cuda::MoeMxfp4Weights w4;
  bool w4_exact = false;
  if (cuda::moe_w4a8_available()) {
    int* inexact = nullptr;
    uint8_t* mem = nullptr;
    DSI_RETURN_IF_ERROR(arena.alloc(&inexact, 1));
    DSI_RETURN_IF_ERROR(
        arena.alloc(&mem, cuda::moe_mxfp4_exponent_bytes(kExperts, kHidden, kInter)));
    cudaMemset(inexact, 0, sizeof(int));
    w4 = cuda::moe_mxfp4_weights_carve(
        mem, refs, refs + kExperts, refs + 2 * kExperts, kExperts, kHidden, kInter);
    DSI_RETURN_IF_ERROR(cuda::launch_moe_mxfp4_scales(w4, inexact, nullptr));
    int bad = 0;
    cudaMemcpy(&bad, inexact, sizeof(int), cudaMemcpyDeviceToHost);
    w4_exact = bad == 0;
  }
#endif
  for (int64_t t : o.tokens) {
    std::mt19937 g(static_cast<uint32_t>(t));
    std::vector<int32_t> hid(static_cast<size_t>(t * kTopK));
    std::vector<int> touched(kExperts, 0);
    for (int64_t i = 0; i < t; ++i) {
      std::vector<int32_t> perm(kExperts);
      for (int32_t e = 0; e < kExperts; ++e) perm[e] = e;
      for (int64_t j = 0; j < kTopK; ++j) {
        std::swap(perm[j], perm[j + g() % (kExperts - j)]);
        hid[i * kTopK + j] = perm[j];
        touched[perm[j]] = 1;
      }
    }
    const int distinct = std::count(touched.begin(), touched.end(), 1);
    cudaMemcpy(ids, hid.data(), hid.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
    std::vector<float> hg(hid.size(), 1.0f / kTopK);
    cudaMemcpy(gates, hg.data(), hg.size() * sizeof(float), cudaMemcpyHostToDevice);
    cuda::MoeGroupParams gp{ids, t, kTopK, kExperts, begin, src, pos};
    DSI_RETURN_IF_ERROR(cuda::launch_moe_group(gp, nullptr));
    cuda::QuantizeFp8Params q{x, kHidden, t, kHidden, codes, scales};
    DSI_RETURN_IF_ERROR(cuda::launch_quantize_fp8(q, nullptr));
    cuda::Fp8ExpertFfnParams p;
    p.w1 = refs;
    p.w3 = refs + kExperts;
    p.w2 = refs + 2 * kExperts;
    p.format = WeightFormat::kMxfp4;
    p.n_experts = kExperts;
    p.hidden = kHidden;
    p.inter = kInter;
    p.expert_begin = begin;
    p.pair_src = src;
    p.k = kTopK;
    p.gates = gates;
    p.x = cuda::Fp8Acts{codes, scales, kHidden};
    p.num_pairs = t * kTopK;
    p.swiglu_limit = 10.0f;
    p.h = h;
    p.h_codes = hq;
    p.h_scales = hs;
    p.y = ye;
    auto ms = time_ms([&] { return cuda::launch_fp8_expert_ffn(p, nullptr); }, o.iters);
    if (!ms.ok())
      return ms.status();
    const double pairs = static_cast<double>(t * kTopK);
    const double bytes = distinct * expert_bytes +
                         pairs * (kHidden + 4.0 * kInter + 5.0 * kInter + kInter + 4.0 * kHidden);
    // One MoE row: the routed experts at t tokens (their FLOPs), with the distinct experts hit.
    auto add_moe = [&](const char* name, double ms_taken, double bytes_moved) {
      json j = figure(name,
                      "256x[2x2048x4096 + 4096x2048] top-6",
                      t,
                      ms_taken,
                      2.0 * pairs * 3 * kInter * kHidden,
                      bytes_moved,
                      o);
      j["distinct_experts"] = distinct;
      out.push_back(j);
    };
    add_moe("moe routed experts (W4A8)", *ms, bytes);
    if (gemv_ok && t * kTopK <= cuda::kExpertGemvTokens * kExperts) {
      p.gemv = true;
      auto gms = time_ms([&] { return cuda::launch_fp8_expert_ffn(p, nullptr); }, o.iters);
      p.gemv = false;
      if (!gms.ok())
        return gms.status();
      add_moe("moe routed experts (W4A8 expert GEMV: the decode path)", *gms, bytes);
    }
#if DSINFER_HAVE_CUTLASS
    // The grouped path's launch at t tokens, its weights left to set.
    auto sm90_params = [&] {
      cuda::MoeSm90Params sp;
      sp.expert_begin = begin;
      sp.pair_src = src;
      sp.k = kTopK;
      sp.gates = gates;
      sp.x = p.x;
      sp.num_pairs = t * kTopK;
      sp.swiglu_limit = 10.0f;
      sp.scratch = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(sm90_scratch) + 255) &
                                           ~uintptr_t{255});
      sp.scratch_bytes = sm90_scratch_bytes;
      sp.y = ye;
      return sp;
    };
    for (int i = 0; i < 2 && t >= 128; ++i) {
      if (!fp8w_exact[i])
        continue;  // E4M3 cannot hold these random experts under that granularity
      cuda::MoeSm90Params sp = sm90_params();
      sp.w = fp8w[i];
      auto ms9 = time_ms([&] { return cuda::launch_moe_sm90(sp, nullptr); }, o.iters);
      if (!ms9.ok())
        return ms9.status();
      // FP8 weights (twice the MXFP4 bytes) and fp32 gate/up rows written and read back.
      const double bytes9 =
          2.0 * distinct * expert_bytes +
          pairs * (kHidden + 8.0 * kInter + 8.0 * kInter + kInter + 4.0 * kHidden);
      add_moe(i == 0 ? "moe routed experts (FP8 re-encoded, 128x128 block scales, grouped wgmma: "
                       "prefill path)"
                     : "moe routed experts (FP8 re-encoded, per-row scales, grouped wgmma)",
              *ms9,
              bytes9);
    }
    if (w4_exact && t >= 128) {
      cuda::MoeSm90Params sp = sm90_params();
      sp.w4 = w4;
      auto msw = time_ms([&] { return cuda::launch_moe_sm90(sp, nullptr); }, o.iters);
      if (!msw.ok())
        return msw.status();
      // MXFP4 weights and fp32 gate/up rows written and read back.
      const double bytes_w =
          distinct * expert_bytes +
          pairs * (kHidden + 8.0 * kInter + 8.0 * kInter + kInter + 4.0 * kHidden);
      add_moe("moe routed experts (MXFP4 as they are, grouped W4A8 wgmma: prefill path)",
              *msw,
              bytes_w);
    }
#endif
  }
  return out;
}

}  // namespace dsinfer::cli
