// In-backend sampling for CudaModel (backend::SampleRequest): the rows to sample are packed into
// one host blob (kernels/cuda/sampling.h's per-request settings, the penalty tokens as CSR, the
// token masks), copied to the device in one transfer, sampled by launch_sample straight from the
// logits the head wrote, and only (token, logprob) per row comes back.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/model.h"
#include "base/status.h"
#include "device/allocator.h"

namespace dsinfer::gpu {

class DeviceSampler {
 public:
  struct Row {
    const backend::SampleRequest* request = nullptr;
    int64_t logits_row = 0;  // row of the logits matrix this request samples from
  };

  DeviceSampler() = default;
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;
  ~DeviceSampler();

  // Enqueues the sampling of `rows` from `logits` ([*, vocab], device) on `stream`, and the copy
  // of the results to host memory. The results are valid once the stream has synchronized. Two
  // launches in a row use two sets of host buffers (current() says which), so that a launch's
  // results can be read after the next launch was queued (asynchronous scheduling); the rows'
  // requests are not used after launch returns.
  Status launch(const float* logits, int64_t vocab, std::span<const Row> rows, cudaStream_t stream);
  int current() const { return cur_; }
  // Row i's result of the launch that used buffer set `which` (once its copy has arrived);
  // logprob only when its config asked for it.
  sampling::SampleResult result(int which, size_t i) const;
  sampling::SampleResult result(size_t i) const { return result(cur_, i); }
  // The last launch's picked tokens on the device ([rows], int32; valid in stream order after
  // it): what chained work (the next drafting step's embedding) reads without a round trip.
  const int32_t* device_tokens() const { return static_cast<const int32_t*>(out_dev_); }

  // The host blob's layout for n rows, p penalty entries and m masks of `words` words (tests).
  struct Layout {
    size_t requests = 0, penalty_begin = 0, penalty_token = 0, penalty_count = 0, masks = 0;
    size_t bytes = 0;
  };
  static Layout layout(size_t n, size_t p, size_t m, size_t words);

 private:
  Status grow_device(void** buf, size_t* cap, size_t bytes, cudaStream_t stream, const char* what);

  struct Set {
    device::PinnedBuffer staging;   // the blob going up
    device::PinnedBuffer results;   // [n] tokens, then [n] logprobs, coming back
    std::vector<uint8_t> logprobs;  // per row: whether its config asked for the logprob
  };
  std::array<Set, 2> sets_;
  int cur_ = 1;  // the latest launch's set
  void* blob_dev_ = nullptr;
  size_t blob_cap_ = 0;
  void* out_dev_ = nullptr;
  size_t out_cap_ = 0;
  void* ws_dev_ = nullptr;
  size_t ws_cap_ = 0;
  std::vector<int32_t> pen_token_;  // host scratch for the CSR
  std::vector<int32_t> pen_count_;
  std::vector<int64_t> pen_begin_;
};

}  // namespace dsinfer::gpu
