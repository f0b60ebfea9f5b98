// `dsinfer bench --ops`: the tensor-core linear layers and the MoE expert GEMMs at
// DeepSeek-V4-Flash shapes, alone, on random device weights, at several token counts (time,
// TFLOP/s, TB/s, and the fractions of the ceilings measured in the same run).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/status.h"

namespace dsinfer::cli {

struct OpBenchOptions {
  int device = 0;
  std::vector<int64_t> tokens = {1, 16, 64, 256, 1024, 8192};
  int iters = 20;               // timed launches per figure (median)
  double copy_bytes_per_s = 0;  // ceilings (0: fractions left out)
  double fp8_flops = 0;
  bool batch_invariant = false;  // no wgmma GEMMs (fp8_gemm.h)
};

// One JSON object per (op, tokens): {"op", "shape", "tokens", "ms", "tflops", "tbps", "bytes",
// "flops", "fraction_fp8_peak", "fraction_copy_bw"}.
Result<nlohmann::ordered_json> bench_ops(const OpBenchOptions& o);

}  // namespace dsinfer::cli
