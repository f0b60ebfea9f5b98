// The tensor-core implementations behind launch_sink_attention and launch_indexer_scores
// (attention_mma.cu). The public launchers validate the arguments and dispatch here when the
// shape is supported and the caller left tensor_cores on.
#pragma once

#include <cuda_runtime_api.h>

#include "base/status.h"
#include "kernels/cuda/attention.h"

namespace dsinfer::cuda {

bool sink_attention_mma_supports(const SinkAttentionParams& p);
Status launch_sink_attention_mma(const SinkAttentionParams& p, cudaStream_t stream);

bool indexer_scores_mma_supports(const IndexerScoreParams& p);
Status launch_indexer_scores_mma(const IndexerScoreParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
