// CPU reference of the expert-parallel MoE: N ranks simulated in one process, the transport
// (NCCL all-to-all on real hardware) replaced by copies. Depends on no model code: the experts
// are a callable, so backend/cpu (CpuModel::expert) or a test can plug in the math.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "parallel/dispatch.h"

namespace dsinfer::parallel {

// One rank's MoE input under data-parallel attention: its own tokens, their routing and the
// shared expert's output (the shared expert is replicated, computed locally).
struct RankMoeInput {
  std::span<const float> x;             // [n, hidden] MoE input rows (after the FFN norm)
  std::span<const int32_t> expert_ids;  // [n, k] global expert ids; invalid ids are dropped
  std::span<const float> gates;         // [n, k] routing weights
  std::span<const float> shared;        // [n, hidden] shared-expert output, or empty (none)
};

// Runs routed expert `expert` (global id) over m rows x_rows [m, hidden] with per-row routing
// weights gates [m] and ADDS the result to out_rows [m, hidden], which the caller zeroes
// (CpuModel::expert's contract). Must be row-independent for EP to equal EP=1 bit for bit.
using ExpertFn = std::function<void(
    int64_t expert, const float* x_rows, int64_t m, const float* gates, float* out_rows)>;

// Per rank r: plan_dispatch over its routing; blocks "sent" (copied: rows, gates, expert ids)
// to their owners; plan_receive on every destination; each destination runs its local experts
// in grouped order (one expert_fn call per local expert with pairs); outputs go back in arrival
// order to their sources; combine with the shared output. Returns each rank's [n_r, hidden]
// output. Every plan is check()ed. inputs.size() must equal part.ranks().
std::vector<std::vector<float>> moe_expert_parallel_reference(const ExpertPartition& part,
                                                              std::span<const RankMoeInput> inputs,
                                                              int64_t k,
                                                              int64_t hidden,
                                                              const ExpertFn& expert_fn);

}  // namespace dsinfer::parallel
