// Work and traffic of the V4 forward, from the config and the checkpoint's tensor sizes: the
// denominators that turn measured times into fractions of the device's limits (dsinfer bench).
//   - FLOPs: 2 * (weights applied per token) per token, plus attention (q.k and p.v over the keys
//     each query visits) and the Lightning indexer's scores;
//   - bytes: weight bytes a step reads (dense weights once; routed experts as the expected number
//     of distinct experts a batch touches under uniform routing) and state bytes read.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/weights.h"

namespace dsinfer::model {

struct ForwardCost {
  double matmul_flops = 0;     // weight GEMMs
  double attention_flops = 0;  // q.k + p.v, indexer scores
  double weight_bytes = 0;     // weight bytes read
  double state_bytes = 0;      // KV / compressed / index-key bytes read
  double flops() const { return matmul_flops + attention_flops; }
  double bytes() const { return weight_bytes + state_bytes; }
};

// Prefill of one sequence of `tokens` tokens from an empty state (LM head on the last token).
ForwardCost prefill_cost(const ModelConfig& c, const ModelWeights& w, int64_t tokens);

// One decode step of `batch` sequences, each at `context` tokens before the step.
// kv_row_bytes / index_row_bytes: bytes of one stored K=V row and one index key as the backend
// keeps them (0: fp32 rows, 4 * head_dim and 4 * index_head_dim; the CUDA backend's records in
// deepseek numerics: state::kv_row_floats / index_row_floats times 4).
ForwardCost decode_cost(const ModelConfig& c,
                        const ModelWeights& w,
                        int64_t batch,
                        int64_t context,
                        double kv_row_bytes = 0,
                        double index_row_bytes = 0);

}  // namespace dsinfer::model
