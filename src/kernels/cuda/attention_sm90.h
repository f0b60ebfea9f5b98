// Sink attention with BF16 operands (`deepseek` numerics) at the V4 shape, dim 512 and up to 64
// heads, on Hopper's warpgroup MMAs (attention_sm90.cu; builds with CUTLASS's CuTe headers only).
// Same contract and the same rounded values as the mma.sync kernel of attention_mma.cu (q, keys
// and probabilities rounded to BF16, an integer base-2 running maximum); what changes is where
// the operands travel: the mma.sync kernel staged every key tile as fp32 rows in shared memory
// and each of its 8 warps re-read q and the keys for its 16 heads, which bounded it by
// shared-memory bandwidth (ncu at an 8k prefill: L1 62% busy, tensor pipes mostly idle).
#pragma once

#include <cuda_runtime_api.h>

#include "base/status.h"
#include "kernels/cuda/attention.h"

namespace dsinfer::cuda {

// Whether this build has the kernel (CUTLASS found at configure time).
constexpr bool sink_attention_sm90_available() {
#if DSINFER_HAVE_CUTLASS
  return true;
#else
  return false;
#endif
}

// bf16_operands, dim 512, 1 <= heads <= 64, tensor cores on.
bool sink_attention_sm90_supports(const SinkAttentionParams& p);

// The attention kernel alone, nsplit blocks per query (1 <= nsplit <= 32): with nsplit > 1 the
// splits' unnormalised partials go to part = [nsplit][nq][heads][dim + 2] for the caller's merge.
Status launch_sink_attention_sm90(const SinkAttentionParams& p,
                                  int nsplit,
                                  float* part,
                                  cudaStream_t stream);

}  // namespace dsinfer::cuda
