// Token sampling on the GPU, one block per request, choosing exactly what the host sampler
// (sampling/sampler.cc) chooses for the same logits, config and step: penalties (repetition on
// prompt + output tokens, presence/frequency on output tokens), greedy (temperature 0 or
// top_k 1; first maximum), otherwise candidates sorted by (logit desc, id asc), top-k, softmax at
// temperature in double, top-p (smallest prefix reaching the mass), min-p (relative to the top
// probability), and the inverse-CDF pick with u = rng::uniform_from(seed, step)
// (numeric/counter_rng.h, shared with the host). The double sums are reduced in a different order
// than the host's serial loops, so a pick can differ only when u falls within a few ulps of a
// cumulative boundary.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace dsinfer::cuda {

// One request's sampling settings (sampling::SamplingConfig's fields, plus the draw's step).
struct SamplingRequest {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0 = off
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  uint64_t step = 0;  // index of the token being generated (the RNG counter)
  int64_t row = -1;   // the logits row this request samples from; < 0: row r (its own index)
  // Structured outputs: the row of SampleParams::allowed holding this request's token mask
  // (bit t%32 of word t/32 = token t may be chosen; it must allow at least one token of the
  // vocabulary, as the host sampler ignores a mask that allows none); < 0: no mask.
  int32_t mask_row = -1;
  // Report out_logprobs[r] for this request (a log-sum-exp over the whole row, in double); false:
  // skipped, out_logprobs[r] = 0.
  bool logprobs = true;
};

struct SampleParams {
  const float* logits = nullptr;  // [n, ld], read only
  int64_t ld = 0;                 // 0: vocab
  int64_t n = 0;                  // requests
  int64_t vocab = 0;
  const SamplingRequest* requests = nullptr;  // [n] (device)
  // Penalty tokens per request, CSR: request r's entries are [penalty_begin[r],
  // penalty_begin[r+1]), each a distinct token seen in the prompt or output, with its number of
  // occurrences among the generated tokens (0 for prompt-only tokens). Null: no penalties.
  const int64_t* penalty_begin = nullptr;  // [n + 1]
  const int32_t* penalty_token = nullptr;
  const int32_t* penalty_count = nullptr;
  // Token masks, [rows, allowed_words] (see SamplingRequest::mask_row); may be null when no
  // request has one. Masked-out tokens are removed before penalties and temperature; logprobs
  // still report the model's own distribution (the host sampler's rule).
  const uint32_t* allowed = nullptr;
  int64_t allowed_words = 0;  // >= (vocab + 31) / 32 when allowed is set
  void* workspace = nullptr;  // sample_workspace_bytes(n, vocab, full_sort) bytes, 8-aligned
  size_t workspace_bytes = 0;
  // false (default): the cuts are found by radix descents without sorting (sampling.cu); true:
  // the whole vocabulary is sorted first (the first implementation, slower; tests compare both).
  bool full_sort = false;
  int32_t* out_tokens = nullptr;  // [n]
  // [n] or null: log-softmax of the raw logits at the pick, for requests with logprobs set
  float* out_logprobs = nullptr;
};

// Workspace of n requests: 26 bytes per token (select), 28 with full_sort.
size_t sample_workspace_bytes(int64_t n, int64_t vocab, bool full_sort = false);
Status launch_sample(const SampleParams& p, cudaStream_t stream);

// Greedy picks without a request blob (chained drafting steps, graph-captured whole): per row
// the first maximum (the token launch_sample gives a greedy request) and its log-softmax (equal
// to launch_sample's to a few ulps: the double sum runs in another order, over a cluster of
// blocks); `next` (optional) gets the tokens too (the next step's input).
struct GreedyPickParams {
  const float* logits = nullptr;  // [n, ld]
  int64_t ld = 0;                 // 0: vocab
  int64_t n = 0;
  int64_t vocab = 0;
  int32_t* tokens = nullptr;  // [n]
  float* logprobs = nullptr;  // [n]
  int32_t* next = nullptr;    // [n] or null
};
Status launch_greedy_pick(const GreedyPickParams& p, cudaStream_t stream);

// Drafts into a verification's token rows on the device: dst[dst_index[i]] = src[src_index[i]]
// for i < n (the picks of a drafting call left on the device, written into the next forward's
// token array before its embedding reads it). Indices are in range (the caller's plan).
Status launch_scatter_tokens(const int32_t* src,
                             const int32_t* src_index,
                             int32_t* dst,
                             const int32_t* dst_index,
                             int64_t n,
                             cudaStream_t stream);

}  // namespace dsinfer::cuda
