// The device's ceilings, measured in-process, for `dsinfer bench`: every speed figure of a bench
// run is also reported as a fraction of a limit measured in the same run on the same device.
//
//   copy:      cudaMemcpyAsync device-to-device of a large buffer; read + write bytes per second
//              (2 * size / time, torch's "copy ... TB/s (read+write)" figure). H200: ~4.2 TB/s.
//   FP8 GEMM:  cuBLASLt, E4M3 x E4M3 -> BF16, fp32 accumulation, M = N = K = 8192 by default;
//              2 * M * N * K FLOP per GEMM. H200: ~1400 TFLOP/s.
//   BF16 GEMM: the same with BF16 inputs. H200: ~750-800 TFLOP/s.
//
// Each figure: a few warm-up runs, then `iters` runs timed one by one with CUDA events on a
// private stream; the figure is the median (default) or the best of them. For the GEMMs the
// heuristic's best `gemm_algos` algorithms are each timed this way and the fastest one counts.
// The measurement allocates its own buffers (2 x copy_bytes, then the GEMM operands: about
// 0.4 GiB at 8192^3) and frees them before returning; run it before loading a model, or with
// smaller sizes.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace dsinfer::perf {

enum class Statistic {
  kMedian,  // robust: the default
  kBest,    // the fastest iteration
};

struct CeilingOptions {
  int device = -1;  // CUDA ordinal; -1: the calling thread's current device (restored afterwards)

  bool measure_copy = true;
  int64_t copy_bytes = int64_t{1} << 30;  // size of the source (and of the destination)
  int copy_warmup = 3;
  int copy_iters = 20;

  bool measure_fp8 = true;
  bool measure_bf16 = true;
  int64_t gemm_m = 8192;  // FP8 needs multiples of 16
  int64_t gemm_n = 8192;
  int64_t gemm_k = 8192;
  int gemm_warmup = 3;
  int gemm_iters = 10;
  int gemm_algos = 4;  // heuristic candidates timed per GEMM, in [1, 32]
  int64_t gemm_workspace_bytes = int64_t{32} << 20;
  bool fp8_fast_accum = false;  // cuBLASLt's FP8 fast accumulation (off: periodic promotion)

  Statistic statistic = Statistic::kMedian;
};

struct Ceilings {
  double copy_bytes_per_s = 0;  // device-to-device read+write bytes per second (2*size/time)
  double fp8_gemm_flops = 0;    // dense FP8 E4M3 GEMM, FLOP/s (2*M*N*K/time)
  double bf16_gemm_flops = 0;   // dense BF16 GEMM, FLOP/s
  int64_t gemm_m = 0;
  int64_t gemm_n = 0;
  int64_t gemm_k = 0;
  std::string device_name;

  // How the figures were obtained (0 for a figure not measured).
  int device = 0;                 // CUDA ordinal
  int64_t copy_buffer_bytes = 0;  // bytes per copy (each copy reads and writes this much)
  double copy_ms = 0;             // the statistic's time of one copy
  double fp8_gemm_ms = 0;         // ... of one FP8 GEMM (fastest algorithm)
  double bf16_gemm_ms = 0;        // ... of one BF16 GEMM
};

// kInvalidArgument for bad options (sizes < 1, iterations < 1, warm-up < 0, FP8 sizes not
// multiples of 16, ...), checked before any CUDA call; kFailedPrecondition when there is no CUDA
// device (or no such ordinal); kUnimplemented for FP8 on a device below sm_89;
// kResourceExhausted when the buffers do not fit; kInternal for CUDA/cuBLASLt failures (the
// message names the call and the status). Figures not requested are 0.
Result<Ceilings> measure_ceilings(const CeilingOptions& options = {});

// One line: "NVIDIA H200: copy 4.27 TB/s (read+write, 1 GiB), FP8 GEMM 8192x8192x8192
// 1402 TFLOP/s, BF16 GEMM 8192x8192x8192 781 TFLOP/s" (figures not measured are left out).
std::string describe(const Ceilings& c);

}  // namespace dsinfer::perf
