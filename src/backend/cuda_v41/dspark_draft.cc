// The DSpark drafter on the device (spec deepseek-v41.md §7.3-§7.4), step by step as
// V41CpuModel::draft: the block rows [anchor, noise x (B - 1)] through the three draft blocks as
// one single-pass mHC chain (window attention over the block's context ring plus every block
// row, non-causal inside the block; the draft MoE), the pre-norm hidden of each row, the head,
// then row by row the Markov bigram term and the greedy pick on the device and the confidence on
// the host (its [hidden ; markov] dot in the CPU's order). The state is not changed.
#include <algorithm>
#include <cmath>

#include "backend/cuda_v41/backend.h"
#include "base/check.h"
#include "device/device_error.h"
#include "kernels/cpu/dot.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/v41.h"

namespace dsinfer::gpu_v41 {

int32_t CudaV41Backend::block_draft_size() const {
  const state::StateShape* shape = state_shape();
  if (!dspark_ || weights_->draft.blocks.empty() || shape->max_rollback < 2)
    return 0;
  return static_cast<int32_t>(shape->max_rollback - 1);
}

Status CudaV41Backend::block_draft_batch(std::span<backend::BlockDraftItem> items, int32_t block) {
  for (backend::BlockDraftItem& it : items) {
    it.status = Status();
    if (it.state == nullptr || it.tokens == nullptr || it.confidence == nullptr) {
      it.status = invalid_argument("block draft: no state or output");
      continue;
    }
    it.status = draft_one(*it.state, it.anchor, block, it.tokens, it.confidence);
  }
  return health();
}

Status CudaV41Backend::draft_one(
    const state::SequenceState& st, int32_t anchor, int64_t B, int32_t* tokens, float* confidence) {
  const model_v41::V41Config& c = *c_;
  const DDspark& dw = weights_->draft;
  if (!dspark_ || dw.blocks.empty())
    return Status(StatusCode::kFailedPrecondition,
                  "draft: the checkpoint has no usable DSpark blocks");
  if (st.mtp_layers().size() != dw.blocks.size() ||
      st.layers().size() != static_cast<size_t>(c.num_hidden_layers)) {
    return invalid_argument("draft: the sequence state was not made for this V4.1 model");
  }
  if (st.num_tokens() < 1)
    return invalid_argument("draft: the sequence has no computed token (prefill it first)");
  if (B < 1 || B + 1 > st.max_rollback()) {
    return invalid_argument(
        "draft: block " + std::to_string(B) + " must be in [1, " +
        std::to_string(st.max_rollback() - 1) +
        "] (max backtracking - 1: the verify step rolls back up to B + 1 rows)");
  }
  const int32_t tok[1] = {anchor};
  DSI_RETURN_IF_ERROR(cpu_v41::check_v41_tokens(c, tok).with_context("draft anchor"));
  DSI_RETURN_IF_ERROR(ensure_pool(*st.arena()));
  const int64_t D = c.hidden_size;
  const int64_t hd = c.head_dim, W = c.sliding_window, V = c.vocab_size;
  const int64_t R = c.dspark_markov_rank;
  const int64_t a_pos = st.num_tokens() - 1;
  cudaStream_t s = stream_.get();
  Status status = [&]() -> Status {
    std::vector<int32_t> toks(static_cast<size_t>(B),
                              static_cast<int32_t>(c.dspark_noise_token_id));
    toks[0] = anchor;
    std::vector<int64_t> pos(static_cast<size_t>(B));
    for (int64_t t = 0; t < B; ++t) pos[static_cast<size_t>(t)] = a_pos + 1 + t;
    DSI_ASSIGN_OR_RETURN(int32_t * dtok, upload(toks));
    DSI_ASSIGN_OR_RETURN(int64_t * dpos, upload(pos));
    DSI_ASSIGN_OR_RETURN(const Streams streams, embed_streams(dtok, B));
    float* X = streams.X;
    float* Xalt = streams.Xalt;
    float* pi = streams.pi;
    for (size_t b = 0; b < dw.blocks.size(); ++b) {
      const DLayer& w = dw.blocks[b];
      const state::LayerState& ring = st.mtp_layers()[b];
      for (int site = 0; site < 2; ++site) {
        DSI_ASSIGN_OR_RETURN(
            const Site si,
            site_in(
                site == 0 ? w.hc_attn : w.hc_ffn, site == 0 ? w.attn_norm : w.ffn_norm, X, pi, B));
        if (site == 0) {
          // Window-only attention (main RoPE): the context KV of positions a-W+1 .. a from this
          // block's ring plus every block row, non-causal inside the block.
          const DAttention& at = w.attn;
          DSI_ASSIGN_OR_RETURN(const Qkv qkv, attn_qkv(at, si.u, B, dpos, weights_->inv_main));
          std::vector<int64_t> keys;
          for (int64_t k = std::max<int64_t>(0, a_pos - W + 1); k <= a_pos; ++k)
            keys.push_back(ring.ring.pool_offset(k % ring.ring_capacity));
          for (int64_t t = 0; t < B; ++t) keys.push_back(cuda::kv_ref_local(t * hd));
          const int64_t S = static_cast<int64_t>(keys.size());
          std::vector<int64_t> refs, begin;
          for (int64_t t = 0; t < B; ++t) {
            begin.push_back(t * S);
            refs.insert(refs.end(), keys.begin(), keys.end());
          }
          begin.push_back(B * S);
          DSI_ASSIGN_OR_RETURN(int64_t * drefs, upload(refs));
          DSI_ASSIGN_OR_RETURN(int64_t * dbegin, upload(begin));
          DSI_ASSIGN_OR_RETURN(const float* o,
                               attend(at, qkv, B, dbegin, drefs, dpos, weights_->inv_main));
          DSI_RETURN_IF_ERROR(attn_out(at, o, B, si.F));
        } else {
          DSI_RETURN_IF_ERROR(moe(w.moe, si.u, B, c.dspark_num_experts_per_tok, si.F));
        }
        pi = si.pre;
        DSI_RETURN_IF_ERROR(site_out(si, X, B, Xalt));
        std::swap(X, Xalt);
      }
    }
    // h_k: the final collapse with the last block's FFN-site pre (the pre-norm hidden).
    DSI_ASSIGN_OR_RETURN(float* hidden, tmp<float>(B * D));
    DSI_RETURN_IF_ERROR(collapse(X, pi, B, hidden));
    DSI_ASSIGN_OR_RETURN(float* hn, tmp<float>(B * D));
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpyAsync(hn, hidden, static_cast<size_t>(B * D * 4), cudaMemcpyDeviceToDevice, s),
        "DSpark hidden"));
    DSI_RETURN_IF_ERROR(rms(hn, B, D, dw.norm));
    DSI_ASSIGN_OR_RETURN(float* logits, tmp<float>(B * V));
    DSI_RETURN_IF_ERROR(linear(weights_->head, hn, B, logits));
    std::vector<float> h_host(static_cast<size_t>(B * D)), em_host(static_cast<size_t>(R));
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpyAsync(
            h_host.data(), hidden, h_host.size() * sizeof(float), cudaMemcpyDeviceToHost, s),
        "DSpark hidden to the host"));
    // Row by row: the Markov bigram term from E_markov[prev_k], the greedy pick, the confidence.
    const std::vector<float>& conf_w = cpu_->v41().weights().dspark.confidence;
    if (static_cast<int64_t>(conf_w.size()) != D + R)
      return invalid_argument("draft: the confidence head is not [hidden + markov_rank] wide");
    DSI_ASSIGN_OR_RETURN(float* em, tmp<float>(R));
    DSI_ASSIGN_OR_RETURN(float* mk, tmp<float>(V));
    DSI_ASSIGN_OR_RETURN(int32_t * dprev, tmp<int32_t>(1));
    DSI_ASSIGN_OR_RETURN(int32_t * pick, tmp<int32_t>(1));
    DSI_ASSIGN_OR_RETURN(int64_t * dvocab, upload(std::vector<int64_t>{V}));
    std::vector<float> conf_in(static_cast<size_t>(D + R));
    int32_t prev = anchor;
    for (int64_t k = 0; k < B; ++k) {
      DSI_RETURN_IF_ERROR(device::check_cuda(
          cudaMemcpyAsync(dprev, &prev, sizeof(int32_t), cudaMemcpyHostToDevice, s),
          "DSpark previous token"));
      cuda::EmbedParams mp;
      mp.table = dw.markov_embed;
      mp.tokens = dprev;
      mp.n = 1;
      mp.copies = 1;
      mp.out = em;
      DSI_RETURN_IF_ERROR(cuda::launch_embed(mp, s));
      DSI_RETURN_IF_ERROR(linear(dw.markov_head, em, 1, mk));
      DSI_RETURN_IF_ERROR(axpy(logits + k * V, mk, V));
      DSI_RETURN_IF_ERROR(top_k(logits + k * V, V, dvocab, 1, 1, pick));
      int32_t d = -1;
      DSI_RETURN_IF_ERROR(device::check_cuda(
          cudaMemcpyAsync(&d, pick, sizeof(int32_t), cudaMemcpyDeviceToHost, s), "DSpark pick"));
      DSI_RETURN_IF_ERROR(device::check_cuda(
          cudaMemcpyAsync(
              em_host.data(), em, em_host.size() * sizeof(float), cudaMemcpyDeviceToHost, s),
          "DSpark Markov row"));
      DSI_RETURN_IF_ERROR(device::sync_stream(s, "DSpark draft step"));
      if (d < 0 || d >= V)
        return Status(StatusCode::kInternal, "draft: no token picked");
      std::copy_n(h_host.data() + k * D, D, conf_in.data());
      std::copy(em_host.begin(), em_host.end(), conf_in.begin() + D);
      const float z = std::clamp(cpu::dot8(conf_w.data(), conf_in.data(), D + R), -60.0f, 60.0f);
      confidence[k] = 1.0f / (1.0f + std::exp(-z));
      tokens[k] = d;
      prev = d;
    }
    return Status();
  }();
  (void)cudaStreamSynchronize(s);
  end_pass();
  return status;
}

}  // namespace dsinfer::gpu_v41
