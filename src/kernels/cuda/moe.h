// MoE on the GPU (spec §3.9), as the CPU forward (backend/cpu/cpu_model.cc, CpuModel::moe):
//   1. launch_moe_route: router scores (sqrtsoftplus / sigmoid / softmax of the gate logits,
//      which come from launch_linear in fp32), expert selection (hash: tid2eid[token]; score:
//      top-k of score + bias, ties towards the lower id), weights from the unbiased scores,
//      renormalised and scaled by routed_scaling_factor.
//   2. launch_moe_group: a stable counting sort of the (token, slot) pairs by expert.
//   3. launch_expert_ffn: the grouped SwiGLU expert GEMMs over those pairs, each expert's weights
//      in their checkpoint format (MXFP4 routed experts, FP8 shared expert): per pair
//      h = silu(min(W1 x, limit)) * clamp(W3 x, +-limit) * gate, y = W2 h. The shared expert is
//      the same op over all tokens (expert_begin = null, pair_src = null, gates = null).
//   4. launch_moe_combine: out[t] = y_shared[t] + sum of the token's routed outputs in ascending
//      expert order (the CPU's accumulation order), deterministic (no atomics).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

enum class RouterScoring { kSqrtSoftplus, kSigmoid, kSoftmax };

inline constexpr int64_t kMaxExpertsPerToken = 32;
inline constexpr int64_t kMaxExperts = 1024;

struct MoeRouteParams {
  const float* logits = nullptr;  // [n, n_experts] gate logits
  int64_t n = 0;
  int64_t n_experts = 0;  // <= 1024
  int64_t k = 0;          // <= 32
  RouterScoring scoring = RouterScoring::kSqrtSoftplus;
  const float* bias = nullptr;       // [n_experts] or null (score routing only)
  const int32_t* tid2eid = nullptr;  // [vocab, k]: hash routing when set
  const int32_t* tokens = nullptr;   // [n] (hash routing)
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  int32_t* expert_ids = nullptr;  // [n, k]
  float* weights = nullptr;       // [n, k]
};
Status launch_moe_route(const MoeRouteParams& p, cudaStream_t stream);

// Pairs p = t * k + i (token t, slot i) grouped by expert: expert e's pairs are
// pair_src[expert_begin[e] .. expert_begin[e+1]) in ascending p (the CPU's per-expert row
// order); pair_pos[p] is the grouped position of pair p. Ids outside [0, n_experts) are dropped
// (their pair_pos is -1).
struct MoeGroupParams {
  const int32_t* expert_ids = nullptr;  // [n, k]
  int64_t n = 0;
  int64_t k = 0;
  int64_t n_experts = 0;
  int64_t* expert_begin = nullptr;  // [n_experts + 1]
  int32_t* pair_src = nullptr;      // [n * k]
  int32_t* pair_pos = nullptr;      // [n * k]
  // Scratch (moe_group_scratch_ints): with it, more than one chunk of pairs (prefill) is grouped
  // by several blocks; without, by one. The same result either way.
  int32_t* chunk_counts = nullptr;
};
inline constexpr int64_t kMoeGroupChunk = 4096;  // pairs per block of the several-block grouping
inline int64_t moe_group_scratch_ints(int64_t pairs, int64_t n_experts) {
  return (pairs + kMoeGroupChunk - 1) / kMoeGroupChunk * n_experts;
}
Status launch_moe_group(const MoeGroupParams& p, cudaStream_t stream);

struct ExpertFfnParams {
  const MatrixRef* w1 = nullptr;  // device array [n_experts]: [inter, hidden] each
  const MatrixRef* w3 = nullptr;  // [inter, hidden]
  const MatrixRef* w2 = nullptr;  // [hidden, inter]
  int64_t n_experts = 1;
  int64_t hidden = 0;
  int64_t inter = 0;
  const int64_t* expert_begin = nullptr;  // [n_experts + 1]; null: one expert, all pairs
  const int32_t* pair_src = nullptr;      // [num_pairs] pair index p (token p / k); null: identity
  int64_t k = 1;                          // slots per token (pair p reads x row p / k)
  const float* gates = nullptr;           // [pairs] by pair index p; null: 1
  const float* x = nullptr;               // [tokens, hidden]
  int64_t num_pairs = 0;
  float swiglu_limit = 0.0f;  // <= 0: no clamp
  bool quantize_activations = false;
  float* h = nullptr;  // scratch [num_pairs, inter], grouped order
  float* y = nullptr;  // [num_pairs, hidden], grouped order
};
Status launch_expert_ffn(const ExpertFfnParams& p, cudaStream_t stream);

struct MoeCombineParams {
  int64_t n = 0;
  int64_t k = 0;
  int64_t hidden = 0;
  const float* y = nullptr;             // [n * k, hidden] grouped routed outputs
  const int32_t* pair_pos = nullptr;    // [n * k]
  const int32_t* expert_ids = nullptr;  // [n, k]
  const float* shared = nullptr;        // [n, hidden] shared-expert output, or null
  float* out = nullptr;                 // [n, hidden]
};
Status launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
