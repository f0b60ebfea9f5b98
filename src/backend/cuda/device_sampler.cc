#include "backend/cuda/device_sampler.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "device/device_error.h"
#include "kernels/cuda/sampling.h"

namespace dsinfer::gpu {

namespace {
size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}
}  // namespace

DeviceSampler::~DeviceSampler() {
  for (void* p : {blob_dev_, out_dev_, ws_dev_}) {
    if (p) {
      const cudaError_t err = cudaFree(p);
      DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
    }
  }
}

DeviceSampler::Layout DeviceSampler::layout(size_t n, size_t p, size_t m, size_t words) {
  Layout l;
  size_t at = 0;
  l.requests = at;
  at = align_up(at + n * sizeof(cuda::SamplingRequest), 16);
  l.penalty_begin = at;
  at = align_up(at + (n + 1) * sizeof(int64_t), 16);
  l.penalty_token = at;
  at = align_up(at + std::max<size_t>(p, 1) * sizeof(int32_t), 16);
  l.penalty_count = at;
  at = align_up(at + std::max<size_t>(p, 1) * sizeof(int32_t), 16);
  l.masks = at;
  at = align_up(at + m * words * sizeof(uint32_t), 16);
  l.bytes = at;
  return l;
}

Status DeviceSampler::grow_device(
    void** buf, size_t* cap, size_t bytes, cudaStream_t stream, const char* what) {
  if (*cap >= bytes)
    return Status();
  DSI_RETURN_IF_ERROR(device::sync_stream(stream, what));
  if (*buf)
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaFree(*buf), "cudaFree"));
  *buf = nullptr;
  *cap = 0;
  const size_t n = std::max<size_t>(bytes + bytes / 2, size_t{1} << 16);
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(buf, n), what));
  *cap = n;
  return Status();
}

Status DeviceSampler::launch(const float* logits,
                             int64_t vocab,
                             std::span<const Row> rows,
                             cudaStream_t stream) {
  const size_t n = rows.size();
  // Each launch in the other buffer set: the previous launch's picks may still be on their way
  // back (asynchronous scheduling reads them after this launch is queued).
  cur_ ^= 1;
  Set& set = sets_[cur_];
  set.logprobs.clear();
  if (n == 0)
    return Status();
  const size_t words = static_cast<size_t>((vocab + 31) / 32);
  // Penalty tokens (CSR): every token seen in the prompt or output, with its output count.
  pen_begin_.assign(1, 0);
  pen_token_.clear();
  pen_count_.clear();
  size_t masks = 0;
  for (const Row& r : rows) {
    const backend::SampleRequest& q = *r.request;
    DSI_CHECK(q.config != nullptr && q.config->top_logprobs == 0,
              "device sampling needs a config without top_logprobs");
    if (q.penalties && sampling::uses_penalties(*q.config)) {
      // extra_output (at most a verification's drafts) merged in: each token once in the list.
      std::vector<std::pair<int32_t, int32_t>> extra;  // (token, count)
      for (int32_t tok : q.extra_output) {
        auto e =
            std::find_if(extra.begin(), extra.end(), [&](const auto& x) { return x.first == tok; });
        if (e == extra.end())
          extra.emplace_back(tok, 1);
        else
          ++e->second;
      }
      std::vector<bool> merged(extra.size(), false);
      const auto& out = q.penalties->output_counts();
      for (const auto& [tok, seen] : q.penalties->seen()) {
        (void)seen;
        const auto it = out.find(tok);
        int32_t count = it == out.end() ? 0 : it->second;
        for (size_t e = 0; e < extra.size(); ++e) {
          if (extra[e].first == tok) {
            count += extra[e].second;
            merged[e] = true;
          }
        }
        pen_token_.push_back(tok);
        pen_count_.push_back(count);
      }
      for (size_t e = 0; e < extra.size(); ++e) {
        if (!merged[e]) {
          pen_token_.push_back(extra[e].first);
          pen_count_.push_back(extra[e].second);
        }
      }
    }
    pen_begin_.push_back(static_cast<int64_t>(pen_token_.size()));
    if (!q.allowed.empty())
      ++masks;
  }
  const Layout l = layout(n, pen_token_.size(), masks, words);
  const size_t out_bytes = n * (sizeof(int32_t) + sizeof(float));
  if (set.staging.size() < l.bytes || set.results.size() < out_bytes) {
    DSI_RETURN_IF_ERROR(device::sync_stream(stream, "sampling staging"));
    if (set.staging.size() < l.bytes) {
      DSI_ASSIGN_OR_RETURN(set.staging, device::PinnedBuffer::allocate(l.bytes + l.bytes / 2));
    }
    if (set.results.size() < out_bytes) {
      DSI_ASSIGN_OR_RETURN(set.results, device::PinnedBuffer::allocate(2 * out_bytes));
    }
  }
  DSI_RETURN_IF_ERROR(
      grow_device(&blob_dev_, &blob_cap_, l.bytes, stream, "cudaMalloc (sampling)"));
  DSI_RETURN_IF_ERROR(
      grow_device(&out_dev_, &out_cap_, out_bytes, stream, "cudaMalloc (sampling)"));
  const size_t ws = cuda::sample_workspace_bytes(static_cast<int64_t>(n), vocab);
  DSI_RETURN_IF_ERROR(grow_device(&ws_dev_, &ws_cap_, ws, stream, "cudaMalloc (sampling)"));

  uint8_t* host = set.staging.as<uint8_t>();
  auto* reqs = reinterpret_cast<cuda::SamplingRequest*>(host + l.requests);
  uint32_t* mask_host = reinterpret_cast<uint32_t*>(host + l.masks);
  int32_t mask_row = 0;
  for (size_t i = 0; i < n; ++i) {
    const backend::SampleRequest& q = *rows[i].request;
    const sampling::SamplingConfig& c = *q.config;
    cuda::SamplingRequest& d = reqs[i];
    d = cuda::SamplingRequest{};
    d.temperature = c.temperature;
    d.top_p = c.top_p;
    d.top_k = c.top_k;
    d.min_p = c.min_p;
    d.presence_penalty = c.presence_penalty;
    d.frequency_penalty = c.frequency_penalty;
    d.repetition_penalty = c.repetition_penalty;
    d.seed = c.seed;
    d.step = q.step;
    d.row = rows[i].logits_row;
    d.mask_row = -1;
    d.logprobs = c.logprobs;  // the raw log-sum-exp costs a pass of double exps: only on request
    if (!q.allowed.empty()) {
      uint32_t* dst = mask_host + static_cast<size_t>(mask_row) * words;
      const size_t k = std::min(words, q.allowed.size());
      std::memcpy(dst, q.allowed.data(), k * sizeof(uint32_t));
      std::fill(dst + k, dst + words, 0u);  // past the mask: not allowed (apply_token_mask)
      d.mask_row = mask_row++;
    }
    set.logprobs.push_back(c.logprobs ? 1 : 0);
  }
  std::memcpy(host + l.penalty_begin, pen_begin_.data(), pen_begin_.size() * sizeof(int64_t));
  if (!pen_token_.empty()) {
    std::memcpy(host + l.penalty_token, pen_token_.data(), pen_token_.size() * sizeof(int32_t));
    std::memcpy(host + l.penalty_count, pen_count_.data(), pen_count_.size() * sizeof(int32_t));
  }
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaMemcpyAsync(blob_dev_, host, l.bytes, cudaMemcpyHostToDevice, stream),
                         "copying the sampling requests"));
  auto* dev = static_cast<uint8_t*>(blob_dev_);
  cuda::SampleParams p;
  p.logits = logits;
  p.n = static_cast<int64_t>(n);
  p.vocab = vocab;
  p.requests = reinterpret_cast<const cuda::SamplingRequest*>(dev + l.requests);
  if (!pen_token_.empty()) {
    p.penalty_begin = reinterpret_cast<const int64_t*>(dev + l.penalty_begin);
    p.penalty_token = reinterpret_cast<const int32_t*>(dev + l.penalty_token);
    p.penalty_count = reinterpret_cast<const int32_t*>(dev + l.penalty_count);
  }
  if (masks > 0) {
    p.allowed = reinterpret_cast<const uint32_t*>(dev + l.masks);
    p.allowed_words = static_cast<int64_t>(words);
  }
  p.workspace = ws_dev_;
  p.workspace_bytes = ws_cap_;
  p.out_tokens = static_cast<int32_t*>(out_dev_);
  p.out_logprobs = reinterpret_cast<float*>(static_cast<int32_t*>(out_dev_) + n);
  DSI_RETURN_IF_ERROR(cuda::launch_sample(p, stream));
  return device::check_cuda(
      cudaMemcpyAsync(set.results.get(), out_dev_, out_bytes, cudaMemcpyDeviceToHost, stream),
      "copying the sampled tokens");
}

sampling::SampleResult DeviceSampler::result(int which, size_t i) const {
  DSI_CHECK(which == 0 || which == 1, "sampler buffer set %d", which);
  const Set& set = sets_[which];
  const size_t n = set.logprobs.size();
  DSI_CHECK(i < n, "sampled row %zu of %zu", i, n);
  sampling::SampleResult r;
  r.token = set.results.as<int32_t>()[i];
  if (set.logprobs[i])
    r.logprob = reinterpret_cast<const float*>(set.results.as<int32_t>() + n)[i];
  return r;
}

}  // namespace dsinfer::gpu
