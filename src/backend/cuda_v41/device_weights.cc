// V41DeviceWeights::upload: one cudaMalloc + copy per tensor (the checkpoint's bytes as they are),
// then the per-expert MatrixRef tables.
#include "backend/cuda_v41/device_weights.h"

#include <cuda_runtime_api.h>

#include "base/check.h"
#include "device/device_error.h"
#include "tensor/dtype.h"

namespace dsinfer::gpu_v41 {

Result<const void*> V41DeviceWeights::copy(const void* src, int64_t n) {
  if (src == nullptr || n <= 0)
    return static_cast<const void*>(nullptr);
  void* p = nullptr;
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(&p, static_cast<size_t>(n)),
                                         "cudaMalloc for the V4.1 weights"));
  allocs_.push_back(p);
  bytes_ += n;
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaMemcpy(p, src, static_cast<size_t>(n), cudaMemcpyHostToDevice),
                         "copying the V4.1 weights to the device"));
  return static_cast<const void*>(p);
}

Status V41DeviceWeights::upload_engram_tables(const model_v41::V41Config& c,
                                              const model_v41::V41Weights& w) {
  engram_tables.clear();
  for (int l : c.engram_layer_ids) {
    const model_v41::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    if (!lw.has_engram || lw.engram.table.data == nullptr) {
      return Status(StatusCode::kNotFound,
                    "missing Engram table for Engram layer " + std::to_string(l) +
                        " (engram_layer_ids lists it; the checkpoint bound none)");
    }
    const model_v41::EngramTable& t = lw.engram.table;
    DEngramTable d;
    d.rows = t.rows;
    d.dim = t.dim;
    d.fp8 = t.fp8;
    d.data_dtype = t.data_dtype;
    const int64_t elem = t.fp8 ? 1 : dtype_size(static_cast<DType>(t.data_dtype));
    const int64_t data_bytes = t.rows * t.dim * elem;
    const int64_t scale_bytes = t.fp8 ? t.rows * (t.dim / 32) : 0;
    const std::string what = "Engram placement device: the table of layer " + std::to_string(l) +
                             " (" + std::to_string(data_bytes + scale_bytes) + " bytes)";
    auto data = copy(t.data, data_bytes);
    if (!data.ok())
      return data.status().with_context(what);
    d.data = *data;
    if (t.fp8) {
      auto scale = copy(t.scale, scale_bytes);
      if (!scale.ok())
        return scale.status().with_context(what);
      d.scale = static_cast<const uint8_t*>(*scale);
    }
    engram_bytes_ += data_bytes + scale_bytes;
    engram_tables.push_back(d);
  }
  return Status();
}

Status V41DeviceWeights::matrix(const MatrixRef& h, MatrixRef* d) {
  *d = h;
  if (h.empty())
    return Status();
  DSI_ASSIGN_OR_RETURN(d->data, copy(h.data, h.data_bytes()));
  DSI_ASSIGN_OR_RETURN(d->scale, copy(h.scale, h.scale_bytes()));
  return Status();
}

Status V41DeviceWeights::vec(const std::vector<float>& v, const float** d) {
  DSI_ASSIGN_OR_RETURN(const void* p,
                       copy(v.data(), static_cast<int64_t>(v.size() * sizeof(float))));
  *d = static_cast<const float*>(p);
  return Status();
}

Status V41DeviceWeights::layer(const model_v41::V41Config& c,
                               const model_v41::LayerWeights& h,
                               DLayer* d) {
  DSI_RETURN_IF_ERROR(vec(h.attn_norm, &d->attn_norm));
  DSI_RETURN_IF_ERROR(vec(h.ffn_norm, &d->ffn_norm));
  for (auto [src, dst] : {std::pair{&h.hc_attn, &d->hc_attn}, {&h.hc_ffn, &d->hc_ffn}}) {
    DSI_RETURN_IF_ERROR(vec(src->fn, &dst->fn));
    DSI_RETURN_IF_ERROR(vec(src->base, &dst->base));
    DSI_RETURN_IF_ERROR(vec(src->scale, &dst->scale));
  }
  const model_v41::AttentionWeights& a = h.attn;
  DAttention& da = d->attn;
  DSI_RETURN_IF_ERROR(matrix(a.wq_a, &da.wq_a));
  DSI_RETURN_IF_ERROR(matrix(a.wq_b, &da.wq_b));
  DSI_RETURN_IF_ERROR(matrix(a.wkv, &da.wkv));
  DSI_RETURN_IF_ERROR(matrix(a.wo_a, &da.wo_a));
  DSI_RETURN_IF_ERROR(matrix(a.wo_b, &da.wo_b));
  DSI_RETURN_IF_ERROR(vec(a.q_norm, &da.q_norm));
  DSI_RETURN_IF_ERROR(vec(a.kv_norm, &da.kv_norm));
  DSI_RETURN_IF_ERROR(vec(a.attn_sink, &da.sink));
  DSI_RETURN_IF_ERROR(matrix(a.compressor.wkv, &da.comp_wkv));
  DSI_RETURN_IF_ERROR(matrix(a.compressor.wgate, &da.comp_wgate));
  DSI_RETURN_IF_ERROR(vec(a.compressor.norm, &da.comp_norm));
  DSI_RETURN_IF_ERROR(matrix(a.indexer.wq_b, &da.idx_wq_b));
  DSI_RETURN_IF_ERROR(matrix(a.indexer.weights_proj, &da.idx_weights_proj));
  DSI_RETURN_IF_ERROR(matrix(a.indexer.wk, &da.idx_wk));
  DSI_RETURN_IF_ERROR(vec(a.indexer.k_norm, &da.idx_k_norm));
  const model_v41::MoeWeights& m = h.ffn;
  DMoe& dm = d->moe;
  DSI_RETURN_IF_ERROR(matrix(m.gate, &dm.gate));
  DSI_RETURN_IF_ERROR(vec(m.bias, &dm.bias));
  dm.n_experts = static_cast<int64_t>(m.experts.size());
  DSI_CHECK(dm.n_experts == m.gate.rows,
            "V4.1 MoE: %lld experts bound for a router of %lld",
            static_cast<long long>(dm.n_experts),
            static_cast<long long>(m.gate.rows));
  dm.inter = m.experts.empty() ? 0 : m.experts[0].w1.rows;
  dm.shared_inter = m.shared.w1.rows;
  std::vector<MatrixRef> refs;  // w1[E], w3[E], w2[E], s1, s3, s2
  refs.resize(static_cast<size_t>(3 * dm.n_experts + 3));
  for (int64_t e = 0; e < dm.n_experts; ++e) {
    const model_v41::ExpertWeights& x = m.experts[static_cast<size_t>(e)];
    DSI_RETURN_IF_ERROR(matrix(x.w1, &refs[static_cast<size_t>(e)]));
    DSI_RETURN_IF_ERROR(matrix(x.w3, &refs[static_cast<size_t>(dm.n_experts + e)]));
    DSI_RETURN_IF_ERROR(matrix(x.w2, &refs[static_cast<size_t>(2 * dm.n_experts + e)]));
  }
  const size_t s0 = static_cast<size_t>(3 * dm.n_experts);
  DSI_RETURN_IF_ERROR(matrix(m.shared.w1, &refs[s0]));
  DSI_RETURN_IF_ERROR(matrix(m.shared.w3, &refs[s0 + 1]));
  DSI_RETURN_IF_ERROR(matrix(m.shared.w2, &refs[s0 + 2]));
  DSI_ASSIGN_OR_RETURN(const void* table,
                       copy(refs.data(), static_cast<int64_t>(refs.size() * sizeof(MatrixRef))));
  const auto* t = static_cast<const MatrixRef*>(table);
  dm.w1 = t;
  dm.w3 = t + dm.n_experts;
  dm.w2 = t + 2 * dm.n_experts;
  dm.s1 = t + s0;
  dm.s3 = t + s0 + 1;
  dm.s2 = t + s0 + 2;
  d->engram = h.has_engram;
  if (h.has_engram) {
    DSI_RETURN_IF_ERROR(matrix(h.engram.wkv, &d->eng.wkv));
    const int64_t width = c.hc_mult * c.hidden_size;
    if (static_cast<int64_t>(h.engram.q_weight.size()) != width ||
        static_cast<int64_t>(h.engram.k_weight.size()) != width)
      return invalid_argument("Engram q_weight / k_weight are not [hc_mult, hidden]");
    std::vector<float> qk(static_cast<size_t>(width));
    for (size_t i = 0; i < qk.size(); ++i) qk[i] = h.engram.q_weight[i] * h.engram.k_weight[i];
    DSI_RETURN_IF_ERROR(vec(qk, &d->eng.qk));
  }
  return Status();
}

Result<std::unique_ptr<V41DeviceWeights>> V41DeviceWeights::upload(const model_v41::V41Config& c,
                                                                   const model_v41::V41Weights& w,
                                                                   bool dspark) {
  std::unique_ptr<V41DeviceWeights> d(new V41DeviceWeights());
  DSI_RETURN_IF_ERROR(d->matrix(w.embed, &d->embed));
  DSI_RETURN_IF_ERROR(d->matrix(w.head, &d->head));
  DSI_RETURN_IF_ERROR(d->vec(w.norm, &d->norm));
  d->layers.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l)
    DSI_RETURN_IF_ERROR(d->layer(c, w.layers[l], &d->layers[l]));
  if (dspark && w.has_dspark) {
    d->has_dspark = true;
    DSI_RETURN_IF_ERROR(d->matrix(w.dspark.main_proj, &d->dspark.main_proj));
    DSI_RETURN_IF_ERROR(d->vec(w.dspark.main_norm, &d->dspark.main_norm));
    for (const model_v41::DsparkBlockWeights& b : w.dspark.blocks) {
      MatrixRef m;
      const float* nrm = nullptr;
      DSI_RETURN_IF_ERROR(d->matrix(b.layer.attn.wkv, &m));
      DSI_RETURN_IF_ERROR(d->vec(b.layer.attn.kv_norm, &nrm));
      d->dspark.wkv.push_back(m);
      d->dspark.kv_norm.push_back(nrm);
    }
    d->draft.blocks.resize(w.dspark.blocks.size());
    for (size_t b = 0; b < w.dspark.blocks.size(); ++b)
      DSI_RETURN_IF_ERROR(d->layer(c, w.dspark.blocks[b].layer, &d->draft.blocks[b]));
    DSI_RETURN_IF_ERROR(d->vec(w.dspark.norm, &d->draft.norm));
    DSI_RETURN_IF_ERROR(d->matrix(w.dspark.markov_embed, &d->draft.markov_embed));
    DSI_RETURN_IF_ERROR(d->matrix(w.dspark.markov_head, &d->draft.markov_head));
  }
  DSI_RETURN_IF_ERROR(d->vec(model::rope_inv_freq(c.rope_main, c.qk_rope_head_dim), &d->inv_main));
  DSI_RETURN_IF_ERROR(
      d->vec(model::rope_inv_freq(c.rope_compress, c.qk_rope_head_dim), &d->inv_compress));
  return d;
}

V41DeviceWeights::~V41DeviceWeights() {
  for (void* p : allocs_) (void)cudaFree(p);
}

}  // namespace dsinfer::gpu_v41
