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
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/v41.h"

namespace dsinfer::gpu_v41 {
namespace {

// The CPU forward's dot product (8 running partials, then their fixed sum).
float dot8(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

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
  const int64_t hc = c.hc_mult, D = c.hidden_size, H = c.num_attention_heads;
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
    DSI_ASSIGN_OR_RETURN(float* X, tmp<float>(B * hc * D, true));
    DSI_ASSIGN_OR_RETURN(float* Xalt, tmp<float>(B * hc * D, true));
    cuda::EmbedParams ep;
    ep.table = weights_->embed;
    ep.tokens = dtok;
    ep.n = B;
    ep.copies = hc;
    ep.out = X;
    DSI_RETURN_IF_ERROR(cuda::launch_embed(ep, s));
    std::vector<float> pi_h(static_cast<size_t>(B * hc), 0.0f);
    for (int64_t t = 0; t < B; ++t) pi_h[static_cast<size_t>(t * hc)] = 1.0f;
    DSI_ASSIGN_OR_RETURN(float* pi, upload(pi_h));
    for (size_t b = 0; b < dw.blocks.size(); ++b) {
      const DLayer& w = dw.blocks[b];
      const state::LayerState& ring = st.mtp_layers()[b];
      for (int site = 0; site < 2; ++site) {
        const DHc& hs = site == 0 ? w.hc_attn : w.hc_ffn;
        DSI_ASSIGN_OR_RETURN(float* pre, tmp<float>(B * hc, true));
        DSI_ASSIGN_OR_RETURN(float* post, tmp<float>(B * hc));
        DSI_ASSIGN_OR_RETURN(float* comb, tmp<float>(B * hc * hc));
        DSI_ASSIGN_OR_RETURN(float* u, tmp<float>(B * D));
        DSI_ASSIGN_OR_RETURN(float* F, tmp<float>(B * D));
        cuda::V41HcMixParams mp;
        mp.fn = hs.fn;
        mp.base = hs.base;
        mp.scale = hs.scale;
        mp.hc = hc;
        mp.hidden = D;
        mp.sinkhorn_iters = c.hc_sinkhorn_iters;
        mp.hc_eps = static_cast<float>(c.hc_eps);
        mp.norm_eps = static_cast<float>(c.rms_norm_eps);
        mp.x = X;
        mp.n = B;
        mp.pre = pre;
        mp.post = post;
        mp.comb = comb;
        DSI_RETURN_IF_ERROR(cuda::launch_v41_hc_mix(mp, s));
        cuda::V41CollapseParams cp;
        cp.x = X;
        cp.pi = pi;
        cp.n = B;
        cp.hc = hc;
        cp.hidden = D;
        cp.out = u;
        DSI_RETURN_IF_ERROR(cuda::launch_v41_collapse(cp, s));
        DSI_RETURN_IF_ERROR(rms(u, B, D, site == 0 ? w.attn_norm : w.ffn_norm));
        if (site == 0) {
          // Window-only attention (main RoPE): the context KV of positions a-W+1 .. a from this
          // block's ring plus every block row, non-causal inside the block.
          const DAttention& at = w.attn;
          DSI_ASSIGN_OR_RETURN(float* q_res, tmp<float>(B * c.q_lora_rank));
          DSI_RETURN_IF_ERROR(linear(at.wq_a, u, B, q_res));
          DSI_RETURN_IF_ERROR(rms(q_res, B, c.q_lora_rank, at.q_norm));
          DSI_ASSIGN_OR_RETURN(float* q, tmp<float>(B * H * hd));
          DSI_ASSIGN_OR_RETURN(float* kv, tmp<float>(B * hd));
          DSI_RETURN_IF_ERROR(linear(at.wq_b, q_res, B, q));
          DSI_RETURN_IF_ERROR(linear(at.wkv, u, B, kv));
          DSI_RETURN_IF_ERROR(rms(kv, B, hd, at.kv_norm));
          DSI_RETURN_IF_ERROR(rope(q, B, H, hd, dpos, weights_->inv_main, false));
          DSI_RETURN_IF_ERROR(rope(kv, B, 1, hd, dpos, weights_->inv_main, false));
          cuda::V41QuantParams qp;
          qp.x = kv;
          qp.rows = B;
          qp.len = hd;
          qp.kind = cuda::V41Quant::kFp8Window;
          DSI_RETURN_IF_ERROR(cuda::launch_v41_quant(qp, s));
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
          DSI_ASSIGN_OR_RETURN(float* o, tmp<float>(B * H * hd));
          cuda::SinkAttentionParams ap;
          ap.q = q;
          ap.nq = B;
          ap.heads = H;
          ap.dim = hd;
          ap.pool = pool_;
          ap.local = kv;
          ap.key_begin = dbegin;
          ap.key_refs = drefs;
          ap.sinks = at.sink;
          ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
          ap.out = o;
          DSI_RETURN_IF_ERROR(cuda::launch_sink_attention(ap, s));
          DSI_RETURN_IF_ERROR(rope(o, B, H, hd, dpos, weights_->inv_main, true));
          const int64_t G = c.o_groups, in_g = H / G * hd, r = c.o_lora_rank;
          DSI_ASSIGN_OR_RETURN(float* y, tmp<float>(B * G * r));
          for (int64_t g = 0; g < G; ++g) {
            cuda::LinearParams lp;
            lp.w = at.wo_a;
            lp.row_begin = g * r;
            lp.rows = r;
            lp.x = o + g * in_g;
            lp.ldx = H * hd;
            lp.n = B;
            lp.y = y + g * r;
            lp.ldy = G * r;
            DSI_RETURN_IF_ERROR(cuda::launch_linear(lp, s));
          }
          DSI_RETURN_IF_ERROR(linear(at.wo_b, y, B, F));
        } else {
          DSI_RETURN_IF_ERROR(moe(w.moe, u, B, c.dspark_num_experts_per_tok, F));
        }
        pi = pre;
        cuda::V41HcPostParams pp;
        pp.hc = hc;
        pp.hidden = D;
        pp.n = B;
        pp.f = F;
        pp.x = X;
        pp.post = post;
        pp.comb = comb;
        pp.x_out = Xalt;
        DSI_RETURN_IF_ERROR(cuda::launch_v41_hc_post(pp, s));
        std::swap(X, Xalt);
      }
    }
    // h_k: the final collapse with the last block's FFN-site pre (the pre-norm hidden).
    DSI_ASSIGN_OR_RETURN(float* hidden, tmp<float>(B * D));
    cuda::V41CollapseParams cp;
    cp.x = X;
    cp.pi = pi;
    cp.n = B;
    cp.hc = hc;
    cp.hidden = D;
    cp.out = hidden;
    DSI_RETURN_IF_ERROR(cuda::launch_v41_collapse(cp, s));
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
      cuda::V41AxpyParams ap;
      ap.y = logits + k * V;
      ap.add = mk;
      ap.n = V;
      DSI_RETURN_IF_ERROR(cuda::launch_v41_axpy(ap, s));
      cuda::TopKParams tp;
      tp.scores = logits + k * V;
      tp.ld = V;
      tp.n = dvocab;
      tp.nq = 1;
      tp.k = 1;
      tp.out = pick;
      DSI_RETURN_IF_ERROR(cuda::launch_top_k(tp, s));
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
      const float z = std::clamp(dot8(conf_w.data(), conf_in.data(), D + R), -60.0f, 60.0f);
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
