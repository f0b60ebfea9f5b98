// The step sequences the V4.1 forward (forward.cc) and the DSpark drafter (dspark_draft.cc) both
// chain: the streams of a chunk, an mHC site's mixes and post step, and the attention's
// projections, sink attention and grouped output. Each launches its kernels in the CPU forward's
// order (backend/cpu_v41/model.cc).
#include <cmath>

#include "backend/cuda/launch_helpers.h"
#include "backend/cuda_v41/backend.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/v41.h"

namespace dsinfer::gpu_v41 {

Result<CudaV41Backend::Streams> CudaV41Backend::embed_streams(const int32_t* tokens, int64_t n) {
  const int64_t hc = c_->hc_mult, D = c_->hidden_size;
  Streams st;
  DSI_ASSIGN_OR_RETURN(st.X, tmp<float>(n * hc * D, true));
  DSI_ASSIGN_OR_RETURN(st.Xalt, tmp<float>(n * hc * D, true));
  cuda::EmbedParams ep;
  ep.table = weights_->embed;
  ep.tokens = tokens;
  ep.n = n;
  ep.copies = hc;
  ep.out = st.X;
  DSI_RETURN_IF_ERROR(cuda::launch_embed(ep, stream_.get()));
  std::vector<float> pi(static_cast<size_t>(n * hc), 0.0f);
  for (int64_t t = 0; t < n; ++t) pi[static_cast<size_t>(t * hc)] = 1.0f;
  DSI_ASSIGN_OR_RETURN(st.pi, upload(pi));
  return st;
}

Result<CudaV41Backend::Site> CudaV41Backend::site_in(
    const DHc& hs, const float* norm, const float* X, const float* pi, int64_t n) {
  const model_v41::V41Config& c = *c_;
  const int64_t hc = c.hc_mult, D = c.hidden_size;
  Site site;
  DSI_ASSIGN_OR_RETURN(site.pre, tmp<float>(n * hc, true));  // the next carried mix
  DSI_ASSIGN_OR_RETURN(site.post, tmp<float>(n * hc));
  DSI_ASSIGN_OR_RETURN(site.comb, tmp<float>(n * hc * hc));
  DSI_ASSIGN_OR_RETURN(site.u, tmp<float>(n * D));
  DSI_ASSIGN_OR_RETURN(site.F, tmp<float>(n * D));
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
  mp.n = n;
  mp.pre = site.pre;
  mp.post = site.post;
  mp.comb = site.comb;
  DSI_RETURN_IF_ERROR(cuda::launch_v41_hc_mix(mp, stream_.get()));
  DSI_RETURN_IF_ERROR(collapse(X, pi, n, site.u));
  DSI_RETURN_IF_ERROR(rms(site.u, n, D, norm));
  return site;
}

Status CudaV41Backend::site_out(const Site& site, const float* X, int64_t n, float* x_out) {
  cuda::V41HcPostParams pp;
  pp.hc = c_->hc_mult;
  pp.hidden = c_->hidden_size;
  pp.n = n;
  pp.f = site.F;
  pp.x = X;
  pp.post = site.post;
  pp.comb = site.comb;
  pp.x_out = x_out;
  return cuda::launch_v41_hc_post(pp, stream_.get());
}

Result<CudaV41Backend::Qkv> CudaV41Backend::attn_qkv(
    const DAttention& a, const float* x, int64_t n, const int64_t* pos, const float* inv) {
  const model_v41::V41Config& c = *c_;
  const int64_t H = c.num_attention_heads, hd = c.head_dim;
  Qkv t;
  DSI_ASSIGN_OR_RETURN(t.q_res, tmp<float>(n * c.q_lora_rank));
  DSI_RETURN_IF_ERROR(linear(a.wq_a, x, n, t.q_res));
  DSI_RETURN_IF_ERROR(rms(t.q_res, n, c.q_lora_rank, a.q_norm));
  DSI_ASSIGN_OR_RETURN(t.q, tmp<float>(n * H * hd));
  DSI_ASSIGN_OR_RETURN(t.kv, tmp<float>(n * hd));
  DSI_RETURN_IF_ERROR(linear(a.wq_b, t.q_res, n, t.q));
  DSI_RETURN_IF_ERROR(linear(a.wkv, x, n, t.kv));
  DSI_RETURN_IF_ERROR(rms(t.kv, n, hd, a.kv_norm));
  DSI_RETURN_IF_ERROR(rope(t.q, n, H, hd, pos, inv, false));
  DSI_RETURN_IF_ERROR(rope(t.kv, n, 1, hd, pos, inv, false));
  DSI_RETURN_IF_ERROR(quant(t.kv, n, hd, cuda::V41Quant::kFp8Window));
  return t;
}

Result<float*> CudaV41Backend::attend(const DAttention& a,
                                      const Qkv& t,
                                      int64_t n,
                                      const int64_t* key_begin,
                                      const int64_t* key_refs,
                                      const int64_t* pos,
                                      const float* inv) {
  const int64_t H = c_->num_attention_heads, hd = c_->head_dim;
  DSI_ASSIGN_OR_RETURN(float* o, tmp<float>(n * H * hd));
  cuda::SinkAttentionParams ap;
  ap.q = t.q;
  ap.nq = n;
  ap.heads = H;
  ap.dim = hd;
  ap.pool = pool_;
  ap.local = t.kv;
  ap.key_begin = key_begin;
  ap.key_refs = key_refs;
  ap.sinks = a.sink;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ap.out = o;
  DSI_RETURN_IF_ERROR(cuda::launch_sink_attention(ap, stream_.get()));
  DSI_RETURN_IF_ERROR(rope(o, n, H, hd, pos, inv, true));
  return o;
}

Status CudaV41Backend::attn_out(const DAttention& a, const float* o, int64_t n, float* out) {
  const model_v41::V41Config& c = *c_;
  const int64_t H = c.num_attention_heads, hd = c.head_dim;
  // wo_a per group of H / o_groups heads, then wo_b.
  const int64_t G = c.o_groups, in_g = H / G * hd, r = c.o_lora_rank;
  DSI_ASSIGN_OR_RETURN(float* y, tmp<float>(n * G * r));
  DSI_RETURN_IF_ERROR(gpu::grouped_linear(a.wo_a, G, r, o, H * hd, in_g, n, y, stream_.get()));
  return linear(a.wo_b, y, n, out);
}

}  // namespace dsinfer::gpu_v41
