// CudaModel's kernel chain for one pass: mHC sub-layers, attention (queries, shared K=V head,
// compressors, Lightning indexer, sink attention over paged keys, grouped output projection),
// MoE and the head — the order of operations of backend/cpu, op by op.
#include <cmath>
#include <cstdlib>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/launch_helpers.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/kv_record.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/paged.h"

namespace dsinfer::gpu {

LinearCtx CudaModel::lin() const {
  return LinearCtx{ws_.get(), !options_.batch_invariant};
}

bool CudaModel::use_moe_sm90_rows(int64_t n) const {
  // Prefill-sized batches only: decode steps (which CUDA graphs replay) keep the shared expert's
  // W8A8 kernels whatever their batch size (the routed experts: use_moe_sm90).
  return n >= kMoeSm90MinTokens && !options_.batch_invariant && !decode_step_;
}

bool CudaModel::use_moe_sm90(const DMoe& w, int64_t n) const {
  if ((w.routed_fp8.n_experts == 0 && w.routed_w4.n_experts == 0) || n < kMoeSm90MinTokens ||
      options_.batch_invariant)
    return false;
  if (!decode_step_)
    return true;
  // A decode step (or verification) of more pairs per expert than the expert GEMV takes: the
  // W4A8 mma.sync tiles streamed 0.41 TB/s there on the H200, the grouped wgmma over the FP8 copy
  // 4.2 TB/s (`bench --ops`, 384 tokens of top-6 over 256 experts: 8.58 against 1.64 ms), where
  // the experts are large enough to be streamed (CudaModelOptions). A function of n and the
  // weights, so replayed graphs still equal eager launches.
  const int64_t weights = w.num_local_experts * 3 * config_.hidden_size * w.inter;
  const int64_t expert_bytes = w.routed_format == WeightFormat::kMxfp4 ? weights / 2 : weights;
  if (expert_bytes < options_.moe_grouped_decode_min_bytes)
    return false;
  return !(w.routed_gemv && cuda::expert_gemv_supports(config_.hidden_size, w.inter) &&
           n * config_.num_experts_per_tok <= cuda::kExpertGemvTokens * w.num_local_experts);
}

bool CudaModel::use_moe_w4a8(const DMoe& w, int64_t n) const {
  // Both the FP8 copy and the W4A8 GEMMs (bit for bit the same results): W4A8 up to 32 pairs per
  // expert on average. H200, V4-Flash's routed experts (bench --ops, twenty-second session): 1.42
  // against 1.54 ms at 128 tokens, 1.61-1.71 against 1.71 at 1,024 (BN 32, four MMA warpgroups),
  // 6.2 against 4.1 at 8,192. A function of n and the weights, so graphs replay what eager runs.
  if (w.routed_w4.n_experts == 0)
    return false;
  if (w.routed_fp8.n_experts == 0)
    return true;
  return n * config_.num_experts_per_tok <= kW4a8MaxMeanPairs * w.num_local_experts;
}

Status CudaModel::moe_sm90_scratch(cuda::MoeSm90Params* p) {
#if DSINFER_HAVE_CUTLASS
  const bool w4 = p->w4.n_experts > 0;
  p->scratch_bytes = cuda::moe_sm90_scratch_bytes(w4 ? p->w4.n_experts : p->w.n_experts,
                                                  p->num_pairs,
                                                  w4 ? p->w4.hidden : p->w.hidden,
                                                  w4 ? p->w4.inter : p->w.inter);
  uint8_t* scratch = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&scratch, p->scratch_bytes + 256));
  p->scratch =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch) + 255) & ~uintptr_t{255});
  return Status();
#else
  (void)p;
  return unimplemented("moe_sm90: built without CUTLASS");
#endif
}

using model::AttentionType;

Status CudaModel::launch_compressor(const DCompressor& w,
                                    const model::LayerPlan& plan,
                                    const CompressorPlan& cp,
                                    bool index,
                                    int64_t n,
                                    const int64_t* positions,
                                    uint8_t* pack,
                                    const HostPack& hp,
                                    const float* u,
                                    const cuda::Bf16SplitActs* us,
                                    cudaStream_t s) {
  const auto& c = config_;
  const bool overlap = plan.attention == AttentionType::kCsa;
  const int64_t d = index ? c.index_head_dim : c.head_dim;
  const int64_t width = (overlap ? 2 : 1) * d;
  float* kv = nullptr;
  float* score = nullptr;
  float* local = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&kv, n * width));
  DSI_RETURN_IF_ERROR(ws_->get(&score, n * width));
  DSI_RETURN_IF_ERROR(ws_->get(&local, n * 2 * width));
  // Compressor projections stay fp32 (on u's BF16 halves when the caller split it once).
  DSI_RETURN_IF_ERROR(linear(lin(), w.wkv, u, n, kv, false, s, false, nullptr, us));
  DSI_RETURN_IF_ERROR(linear(lin(), w.wgate, u, n, score, false, s, false, nullptr, us));
  cuda::CompressorAppendParams ap;
  ap.kv = kv;
  ap.score = score;
  ap.ape = w.ape;
  ap.positions = positions;
  ap.n = n;
  ap.width = width;
  ap.ratio = plan.compress_ratio;
  ap.pool = pool_;
  ap.local = local;
  ap.dest_refs = hp.resolve<int64_t>(pack, cp.local_dest);
  DSI_RETURN_IF_ERROR(cuda::launch_compressor_append(ap, s));
  cuda::CompressorPoolParams pp;
  pp.n_entries = cp.n_entries;
  pp.ratio = plan.compress_ratio;
  pp.d = d;
  pp.overlap = overlap;
  pp.pool = pool_;
  pp.local = local;
  pp.token_refs = hp.resolve<int64_t>(pack, cp.token_refs);
  pp.block = hp.resolve<int64_t>(pack, cp.block);
  pp.norm_weight = w.norm;
  pp.eps = static_cast<float>(c.rms_norm_eps);
  pp.inv_freq = inv_freq(plan.rope);
  pp.rope_half = c.qk_rope_head_dim / 2;
  pp.post = !q8()   ? cuda::CompressorPost::kNone
            : index ? cuda::CompressorPost::kIndexFp4
                    : cuda::CompressorPost::kKvFp8;
  pp.out = pool_;
  pp.out_offsets = hp.resolve<int64_t>(pack, cp.out_offset);
  pp.records = records();
  DSI_RETURN_IF_ERROR(cuda::launch_compressor_pool(pp, s));
  // The rows the ring keeps, written after pooling read the older ones.
  ap.local = nullptr;
  ap.dest_refs = hp.resolve<int64_t>(pack, cp.ring_dest);
  return cuda::launch_compressor_append(ap, s);
}

Status CudaModel::launch_attention(const DAttention& w,
                                   const model::LayerPlan& plan,
                                   const LayerPass& lp,
                                   int64_t n,
                                   const int64_t* positions,
                                   uint8_t* pack,
                                   const HostPack& hp,
                                   const float* u,
                                   float* f) {
  const auto& c = config_;
  const cudaStream_t s = stream_.get();
  const int64_t heads = c.num_attention_heads;
  const int64_t hd = c.head_dim;
  const int64_t rd = c.qk_rope_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float* freqs = inv_freq(plan.rope);
  const bool q8 = this->q8();

  // Queries on the main stream.
  float* qr = nullptr;
  float* q = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&qr, n * c.q_lora_rank));
  DSI_RETURN_IF_ERROR(ws_->get(&q, n * heads * hd));
  // u feeds wq_a and wkv, qr feeds wq_b and the indexer's wq_b: each quantised once when both
  // of its linears take FP8 activations.
  cuda::Fp8Acts uq;
  const cuda::Fp8Acts* uqp = nullptr;
  if (n > 0 && fp8_linear_path(w.wq_a, q8) && fp8_linear_path(w.wkv, q8) &&
      w.wq_a.cols == w.wkv.cols) {
    DSI_RETURN_IF_ERROR(quantize_fp8(ws_.get(), u, n, w.wq_a.cols, s, &uq));
    uqp = &uq;
  }
  // Compressors (and the indexer's weights_proj): u split into BF16 halves once for all of their
  // BF16x2 linears (prefill sizes; decode takes the GEMVs on fp32 u).
  cuda::Bf16SplitActs us;
  const cuda::Bf16SplitActs* usp = nullptr;
  if (plan.attention != AttentionType::kSliding) {
    bool all = bf16x2_linear_path(lin(), w.comp.wkv, n, false) &&
               bf16x2_linear_path(lin(), w.comp.wgate, n, false);
    if (plan.attention == AttentionType::kCsa) {
      all = all && bf16x2_linear_path(lin(), w.index_comp.wkv, n, false) &&
            bf16x2_linear_path(lin(), w.index_comp.wgate, n, false) &&
            bf16x2_linear_path(lin(), w.indexer_weights_proj, n, false);
    }
    all = all && w.comp.wkv.cols == c.hidden_size && w.comp.wgate.cols == c.hidden_size &&
          (plan.attention != AttentionType::kCsa ||
           (w.index_comp.wkv.cols == c.hidden_size && w.index_comp.wgate.cols == c.hidden_size &&
            w.indexer_weights_proj.cols == c.hidden_size));
    if (all) {
      DSI_RETURN_IF_ERROR(split_bf16(ws_.get(), u, n, c.hidden_size, 0, s, &us));
      usp = &us;
    }
  }
  // Side stream 0: the shared K=V vector (chunk-local until it is written to the ring after
  // attention) and the compressor; side stream 1 (CSA): the indexer's compressor and head
  // weights. Both are joined before the first kernel that reads what they write.
  float* kv = nullptr;
  float* kv_rec = nullptr;  // records(): the rows packed, kv_width() floats each
  DSI_RETURN_IF_ERROR(ws_->get(&kv, n * hd));
  DSI_ASSIGN_OR_RETURN(Branch kv_branch, sides_.fork(s, 0));
  {
    const cudaStream_t ks = kv_branch.stream();
    DSI_RETURN_IF_ERROR(linear(lin(), w.wkv, u, n, kv, q8, ks, false, uqp));
    // deepseek numerics: K=V rounded as its record stores it (FP8 no-RoPE dims in blocks of 64,
    // BF16 RoPE dims), by the norm kernel itself where it can.
    DSI_RETURN_IF_ERROR(rms_norm_rope(kv,
                                      n,
                                      hd,
                                      w.kv_norm,
                                      eps,
                                      1,
                                      positions,
                                      freqs,
                                      rd / 2,
                                      ks,
                                      nullptr,
                                      numerics_ == model::Numerics::kDeepSeek ? 64 : 0));
    if (records()) {
      // The chunk's K=V rows as KV records: what attention reads them as (beside the pool's),
      // and what the ring write copies.
      DSI_RETURN_IF_ERROR(ws_->get(&kv_rec, n * kv_width()));
      cuda::KvRecordPackParams kp;
      kp.x = kv;
      kp.rows = n;
      kp.dim = hd;
      kp.rope_dim = rd;
      kp.out = reinterpret_cast<uint8_t*>(kv_rec);
      DSI_RETURN_IF_ERROR(cuda::launch_kv_record_pack(kp, ks));
    }
    if (plan.attention != AttentionType::kSliding) {
      DSI_RETURN_IF_ERROR(
          launch_compressor(w.comp, plan, lp.comp, false, n, positions, pack, hp, u, usp, ks));
    }
  }
  const bool csa = plan.attention == AttentionType::kCsa;
  const int64_t ih = c.index_n_heads;
  const int64_t ihd = c.index_head_dim;
  float* hw = nullptr;
  Branch index_branch;
  if (csa) {
    DSI_RETURN_IF_ERROR(ws_->get(&hw, n * ih));
    DSI_ASSIGN_OR_RETURN(index_branch, sides_.fork(s, 1));
    const cudaStream_t is = index_branch.stream();
    DSI_RETURN_IF_ERROR(launch_compressor(
        w.index_comp, plan, lp.index_comp, true, n, positions, pack, hp, u, usp, is));
    DSI_RETURN_IF_ERROR(
        linear(lin(), w.indexer_weights_proj, u, n, hw, false, is, false, nullptr, usp));
  }
  DSI_RETURN_IF_ERROR(linear(lin(), w.wq_a, u, n, qr, q8, s, false, uqp));
  // The q norm also writes wq_b's FP8 activations (and the indexer's wq_b's: the same columns).
  cuda::Fp8Acts qrq;
  DSI_ASSIGN_OR_RETURN(
      const cuda::Fp8Acts* qrqp,
      rms_norm_for(ws_.get(), w.wq_b, q8, qr, n, c.q_lora_rank, w.q_norm, eps, s, &qrq));
  DSI_RETURN_IF_ERROR(linear(lin(), w.wq_b, qr, n, q, q8, s, false, qrqp));
  // deepseek numerics at the wgmma attention's shape: the q norm writes the BF16 q attention
  // rounds to anyway (half the bytes written and read, and the attention copies it in unconverted).
  uint16_t* q16 = nullptr;
  {
    cuda::SinkAttentionParams probe;
    probe.heads = heads;
    probe.dim = hd;
    probe.bf16_operands = numerics_ == model::Numerics::kDeepSeek;
    if (n > 0 && cuda::sink_attention_reads_q_bf16(probe) && cuda::rms_norm_writes_bf16(hd, rd / 2))
      DSI_RETURN_IF_ERROR(ws_->get(&q16, n * heads * hd));
  }
  DSI_RETURN_IF_ERROR(
      rms_norm_rope(q, n * heads, hd, nullptr, eps, heads, positions, freqs, rd / 2, s, q16));
  int64_t* key_refs = hp.resolve<int64_t>(pack, lp.key_refs);
  if (csa) {
    float* qi = nullptr;
    DSI_RETURN_IF_ERROR(ws_->get(&qi, n * ih * ihd));
    DSI_RETURN_IF_ERROR(linear(lin(),
                               w.indexer_wq_b,
                               qr,
                               n,
                               qi,
                               q8,
                               s,
                               false,
                               w.indexer_wq_b.cols == c.q_lora_rank ? qrqp : nullptr));
    DSI_RETURN_IF_ERROR(rope(qi, n, ih, ihd, positions, freqs, rd / 2, false, s));
    if (numerics_ == model::Numerics::kDeepSeek) {
      cuda::QuantSimParams qs;
      qs.x = qi;
      qs.rows = n * ih;
      qs.ld = ihd;
      qs.len = ihd;
      qs.block = 32;
      qs.kind = cuda::QuantSim::kFp4;
      qs.hadamard = true;
      DSI_RETURN_IF_ERROR(cuda::launch_quant_sim(qs, s));
    }
    DSI_RETURN_IF_ERROR(index_branch.join());  // the index keys and hw
    const int64_t room = std::max<int64_t>(lp.visible_room, 1);
    float* scores = nullptr;
    int32_t* selected = nullptr;
    DSI_RETURN_IF_ERROR(ws_->get(&scores, n * room));
    DSI_RETURN_IF_ERROR(ws_->get(&selected, n * c.index_topk));
    const int64_t page_floats = arena_->page_floats();
    cuda::IndexerScoreParams ip;
    ip.q = qi;
    ip.head_w = hw;
    ip.w_scale = 1.0f / std::sqrt(static_cast<float>(ihd)) / std::sqrt(static_cast<float>(ih));
    ip.nq = n;
    ip.heads = ih;
    ip.dim = ihd;
    ip.pool = pool_;
    ip.page_floats = page_floats;
    ip.row_floats = index_width();
    ip.rows_per_page = page_floats / index_width();
    ip.key_records = records();
    ip.pages = hp.resolve<int32_t>(pack, lp.index_pages);
    ip.page_begin = hp.resolve<int64_t>(pack, lp.index_page_begin);
    ip.visible = hp.resolve<int64_t>(pack, lp.visible);
    ip.max_visible = lp.visible_room;
    ip.scores = scores;
    ip.ld = room;
    ip.bf16_exact = numerics_ == model::Numerics::kDeepSeek;  // FP4-simulated q and keys
    DSI_RETURN_IF_ERROR(cuda::launch_indexer_scores(ip, s));
    cuda::TopKParams tp;
    tp.scores = scores;
    tp.ld = room;
    tp.n = ip.visible;
    tp.nq = n;
    tp.k = c.index_topk;
    tp.out = selected;
    DSI_RETURN_IF_ERROR(cuda::launch_top_k(tp, s));
    cuda::RefsFromIndicesParams rp;
    rp.indices = selected;
    rp.nq = n;
    rp.k = c.index_topk;
    rp.pages = hp.resolve<int32_t>(pack, lp.entry_pages);
    rp.page_begin = hp.resolve<int64_t>(pack, lp.entry_page_begin);
    rp.rows_per_page = page_floats / kv_width();
    rp.page_floats = page_floats;
    rp.width = kv_width();
    rp.out_begin = hp.resolve<int64_t>(pack, lp.select_begin);
    rp.out = key_refs;
    DSI_RETURN_IF_ERROR(cuda::launch_refs_from_indices(rp, s));
  }
  DSI_RETURN_IF_ERROR(kv_branch.join());  // K=V and the compressed keys
  // Sink attention over window + compressed keys, inverse RoPE on the output.
  const int64_t groups = c.o_groups;
  const int64_t olr = c.o_lora_rank;
  const int64_t group_in = heads * hd / groups;
  const bool bf16_o = numerics_ == model::Numerics::kDeepSeek;
  // Decode batches: wo_a as a GEMV on fp32 o; larger ones: the BF16 path on o's BF16 copy.
  const bool gemv_o = lin().wgmma && n > 0 && n <= cuda::kGemvMaxTokens &&
                      cuda::gemv_fp8_supports(w.wo_a) && w.wo_a.cols == group_in &&
                      group_in % 4 == 0;
  const bool bf16x2_o = !gemv_o && n > 0 && cuda::bf16x2_gemm_supports(w.wo_a) &&
                        w.wo_a.cols == group_in && group_in % 64 == 0;
  float* o = nullptr;
  cuda::SinkAttentionParams sp;
  sp.q = q16 ? nullptr : q;
  sp.q_bf16 = q16;
  sp.nq = n;
  sp.heads = heads;
  sp.dim = hd;
  sp.pool = pool_;
  sp.local = records() ? kv_rec : kv;
  sp.kv_records = records();
  sp.record_rope_dim = rd;
  sp.key_begin = hp.resolve<int64_t>(pack, lp.key_begin);
  sp.key_refs = key_refs;
  sp.sinks = w.sinks;
  sp.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  sp.out = o;
  // deepseek numerics: BF16 q, keys (FP8 no-RoPE dims, BF16 RoPE dims: exact) and probabilities,
  // as DeepSeek's kernel (docs/numerics.md, point 4).
  sp.bf16_operands = numerics_ == model::Numerics::kDeepSeek;
  // Split key lists (few queries) sum in an order that depends on the batch: not when invariant.
  sp.split_scratch_floats =
      options_.batch_invariant ? 0 : cuda::sink_attention_scratch_floats(n, heads, hd);
  if (sp.split_scratch_floats > 0)
    DSI_RETURN_IF_ERROR(ws_->get(&sp.split_scratch, sp.split_scratch_floats));
  // deepseek numerics on the BF16 path: the attention writes o's BF16 copy itself, the inverse
  // RoPE applied first (no fp32 o, no separate RoPE or split pass).
  cuda::Bf16SplitActs oh;
  if (bf16_o && bf16x2_o) {
    sp.out_bf16_ld = cuda::bf16_split_ld(heads * hd);
    sp.positions = positions;
    sp.inv_freq = freqs;
    sp.rope_half = rd / 2;
    if (cuda::sink_attention_writes_bf16(sp)) {
      uint16_t* hi = nullptr;
      DSI_RETURN_IF_ERROR(ws_->get(&hi, n * sp.out_bf16_ld));
      sp.out_bf16 = hi;
      oh = cuda::Bf16SplitActs{hi, nullptr, sp.out_bf16_ld};
    }
  }
  if (sp.out_bf16 == nullptr) {
    DSI_RETURN_IF_ERROR(ws_->get(&o, n * heads * hd));
    sp.out = o;
  }
  // deepseek numerics with key splits (decode): the split merge applies the inverse RoPE and the
  // BF16 rounding to fp32 o itself (no rope and round_o launches).
  bool o_finished = false;
  if (bf16_o && o != nullptr) {
    cuda::SinkAttentionParams fp = sp;
    fp.positions = positions;
    fp.inv_freq = freqs;
    fp.rope_half = rd / 2;
    fp.finish_out = true;
    if (cuda::sink_attention_finishes_out(fp)) {
      sp = fp;
      o_finished = true;
    }
  }
  DSI_RETURN_IF_ERROR(cuda::launch_sink_attention(sp, s));
  if (o != nullptr && !o_finished)
    DSI_RETURN_IF_ERROR(rope(o, n, heads, hd, positions, freqs, rd / 2, true, s));
  // This step's K=V rows into the ring (read by later steps only), on side stream 0 beside the
  // output projection; joined after it (before the layer's workspace is reused).
  cuda::ScatterRowsParams rw;
  rw.src = records() ? kv_rec : kv;
  rw.n = n;
  rw.width = kv_width();
  rw.pool = pool_;
  rw.dest_refs = hp.resolve<int64_t>(pack, lp.ring_dest);
  DSI_ASSIGN_OR_RETURN(Branch ring_write, sides_.fork(s, 0));
  DSI_RETURN_IF_ERROR(cuda::launch_scatter_rows(rw, ring_write.stream()));
  // Grouped output projection: wo_a per group (never quantised), then wo_b. deepseek numerics:
  // on the attention output rounded to BF16 (docs/numerics.md, point 5), by the hi-only split
  // on the BF16 path and in place otherwise.
  auto round_o = [&]() -> Status {
    if (!bf16_o || o_finished)
      return Status();
    cuda::QuantSimParams qs;
    qs.x = o;
    qs.rows = n;
    qs.len = heads * hd;
    qs.block = hd;
    qs.kind = cuda::QuantSim::kBf16;
    return cuda::launch_quant_sim(qs, s);
  };
  float* z = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&z, n * groups * olr));
  if (gemv_o) {
    DSI_RETURN_IF_ERROR(round_o());
    // Decode: the FP8 weight streamed once by the GEMV, straight from fp32 o.
    cuda::GemvFp8Params p;
    p.w = w.wo_a;
    p.rows = olr;
    p.x = o;
    p.ldx = heads * hd;
    p.n = n;
    p.y = z;
    p.ldy = groups * olr;
    p.groups = groups;
    p.group_x = group_in;
    p.group_y = olr;
    DSI_RETURN_IF_ERROR(cuda::launch_gemv_fp8(p, s));
    DSI_RETURN_IF_ERROR(linear(lin(), w.wo_b, z, n, f, q8, s));
    return ring_write.join();
  }
  if (bf16x2_o) {
    // o split into BF16 halves once (deepseek: rounded, the high halves only, unless the
    // attention wrote them); group g reads its columns [g * group_in, +group_in), all groups in
    // one launch.
    if (o != nullptr)
      DSI_RETURN_IF_ERROR(split_bf16(ws_.get(), o, n, heads * hd, 0, s, &oh, bf16_o));
    cuda::Bf16x2LinearParams p;
    p.rows = olr;
    p.x = oh;
    p.n = n;
    p.y = z;
    p.ldy = groups * olr;
    p.groups = groups;
    p.group_x = group_in;
    p.group_y = olr;
    p.wgmma = lin().wgmma;
    // The BF16 copy where it takes the wgmma path (every group in one launch; from 16 rows),
    // else the FP8 weight on the fixed-order kernel.
    p.w = w.wo_a_bf16;
    if (w.wo_a_bf16.empty() || !cuda::bf16x2_linear_uses_wgmma(p))
      p.w = w.wo_a;
    p.scratch_floats = p.wgmma ? cuda::bf16x2_linear_scratch_floats(p.w, olr, n, groups) : 0;
    if (p.scratch_floats > 0)
      DSI_RETURN_IF_ERROR(ws_->get(&p.scratch, p.scratch_floats));
    DSI_RETURN_IF_ERROR(cuda::launch_bf16x2_linear(p, s));
    DSI_RETURN_IF_ERROR(linear(lin(), w.wo_b, z, n, f, q8, s));
    return ring_write.join();
  }
  DSI_RETURN_IF_ERROR(round_o());
  DSI_RETURN_IF_ERROR(grouped_linear(w.wo_a, groups, olr, o, heads * hd, group_in, n, z, s));
  DSI_RETURN_IF_ERROR(linear(lin(), w.wo_b, z, n, f, q8, s));
  return ring_write.join();
}

static_assert(kSpanPosWidth == cuda::kExpandKeysSpanWidth, "span_pos layout");

Status CudaModel::expand_keys(const PassPlan& plan, uint8_t* pack, const HostPack& hp) {
  cuda::ExpandKeysParams p;
  p.rows = plan.rows;
  p.row_span = hp.resolve<int32_t>(pack, plan.row_span);
  p.span_pos = hp.resolve<int64_t>(pack, plan.span_pos);
  p.window = config_.sliding_window;
  p.width = kv_width();
  p.page_floats = arena_->page_floats();
  for (size_t l0 = 0; l0 < plan.layers.size(); l0 += cuda::kExpandKeysMaxLayers) {
    p.n_layers = 0;
    for (size_t l = l0; l < plan.layers.size() && p.n_layers < cuda::kExpandKeysMaxLayers; ++l) {
      const LayerPass& lp = plan.layers[l];
      cuda::ExpandKeysLayer& k = p.layers[p.n_layers++];
      k = cuda::ExpandKeysLayer();
      k.out = hp.resolve<int64_t>(pack, lp.key_refs);
      k.key_begin = hp.resolve<int64_t>(pack, lp.key_begin);
      k.ring_pages = hp.resolve<int32_t>(pack, lp.ring_pages);
      k.ring_page_begin = hp.resolve<int32_t>(pack, lp.ring_page_begin);
      if (lp.hca_ratio > 0) {
        k.hca_pages = hp.resolve<int32_t>(pack, lp.hca_pages);
        k.hca_page_begin = hp.resolve<int32_t>(pack, lp.hca_page_begin);
        k.hca_ratio = static_cast<int32_t>(lp.hca_ratio);
      }
      // A pass without real rows plans no ring geometry: nothing is expanded then.
      k.ring_capacity = static_cast<int32_t>(std::max<int64_t>(lp.ring_capacity, 1));
      k.ring_rows_per_page = static_cast<int32_t>(std::max<int64_t>(lp.ring_rows_per_page, 1));
      k.entry_rows_per_page = static_cast<int32_t>(std::max<int64_t>(lp.entry_rows_per_page, 1));
    }
    DSI_RETURN_IF_ERROR(cuda::launch_expand_keys(p, stream_.get()));
  }
  return Status();
}

// The experts of `p` (the reference ExpertFfnParams) on the FP8 tensor-core kernels, over the
// already quantised activations xq; h's FP8 copy comes from the workspace.
Status CudaModel::fp8_experts(const cuda::ExpertFfnParams& p,
                              WeightFormat format,
                              bool gemv,
                              const cuda::Fp8Acts& xq,
                              cudaStream_t s) {
  cuda::Fp8ExpertFfnParams q;
  q.w1 = p.w1;
  q.w3 = p.w3;
  q.w2 = p.w2;
  q.format = format;
  q.n_experts = p.n_experts;
  q.hidden = p.hidden;
  q.inter = p.inter;
  q.expert_begin = p.expert_begin;
  q.pair_src = p.pair_src;
  q.k = p.k;
  q.gates = p.gates;
  q.x = xq;
  q.num_pairs = p.num_pairs;
  q.swiglu_limit = p.swiglu_limit;
  q.h = p.h;
  q.y = p.y;
  q.gemv = gemv && !options_.batch_invariant;
  Fp8ActsRoom h;
  DSI_RETURN_IF_ERROR(fp8_acts_room(ws_.get(), p.num_pairs, p.inter, &h));
  q.h_codes = h.codes;
  q.h_scales = h.scales;
  return cuda::launch_fp8_expert_ffn(q, s);
}

Status CudaModel::launch_moe(const DMoe& w,
                             const model::LayerPlan& plan,
                             int64_t n,
                             const int32_t* tokens,
                             const float* u,
                             float* f) {
  const auto& c = config_;
  const cudaStream_t s = stream_.get();
  const int64_t ne = c.n_routed_experts;
  const int64_t k = c.num_experts_per_tok;
  const int64_t hidden = c.hidden_size;
  float* logits = nullptr;
  int32_t* ids = nullptr;
  float* gates = nullptr;
  float* ys = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&logits, n * ne));
  DSI_RETURN_IF_ERROR(ws_->get(&ids, n * k));
  DSI_RETURN_IF_ERROR(ws_->get(&gates, n * k));
  DSI_RETURN_IF_ERROR(ws_->get(&ys, n * hidden));
  cuda::MoeRouteParams rp;
  rp.logits = logits;
  rp.n = n;
  rp.n_experts = ne;
  rp.k = k;
  switch (c.scoring_func) {
    case model::ScoringFunc::kSqrtSoftplus:
      rp.scoring = cuda::RouterScoring::kSqrtSoftplus;
      break;
    case model::ScoringFunc::kSigmoid:
      rp.scoring = cuda::RouterScoring::kSigmoid;
      break;
    case model::ScoringFunc::kSoftmax:
      rp.scoring = cuda::RouterScoring::kSoftmax;
      break;
  }
  if (plan.moe == model::MoeType::kHash) {
    rp.tid2eid = w.tid2eid;
    rp.tokens = tokens;
  } else {
    rp.bias = w.bias;
  }
  rp.norm_topk_prob = c.norm_topk_prob;
  rp.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  rp.expert_ids = ids;
  rp.weights = gates;
  // The shared expert: one expert over every token, gate 1.
  cuda::ExpertFfnParams sp;
  sp.w1 = w.shared_w1;
  sp.w3 = w.shared_w3;
  sp.w2 = w.shared_w2;
  sp.n_experts = 1;
  sp.hidden = hidden;
  sp.inter = w.shared_inter;
  sp.k = 1;
  sp.x = u;
  sp.num_pairs = n;
  sp.swiglu_limit = static_cast<float>(c.swiglu_limit);
  sp.quantize_activations = q8();
  sp.h = nullptr;  // the h scratch is taken below by the paths that use it (not the wgmma one)
  sp.y = ys;
  // FP8 activations on the tensor cores: u quantised once for the shared and routed experts.
  const bool fast_shared = q8() && w.shared_fast;
  const bool fast_routed = q8() && w.routed_fast && options_.comm == nullptr;
  cuda::Fp8Acts uq;
  if (fast_shared || fast_routed)
    DSI_RETURN_IF_ERROR(quantize_fp8(ws_.get(), u, n, hidden, s, &uq));
  // The shared expert on side stream 0, beside the router and the routed experts; joined before
  // the combine reads its output. With expert parallelism on the main stream (the routed
  // experts' exchange takes the shared output with it).
  DSI_ASSIGN_OR_RETURN(Branch shared, sides_.fork(s, 0, options_.comm == nullptr));
  const cudaStream_t ss = shared.stream();
  if (fast_shared && w.shared_fp8.n_experts > 0 && use_moe_sm90_rows(n)) {
#if DSINFER_HAVE_CUTLASS
    // Prefill-sized: the shared expert as a one-expert grouped wgmma GEMM (moe_sm90.h).
    cuda::MoeSm90Params mp;
    mp.w = w.shared_fp8;
    mp.k = 1;
    mp.x = uq;
    mp.num_pairs = n;
    mp.swiglu_limit = static_cast<float>(c.swiglu_limit);
    DSI_RETURN_IF_ERROR(moe_sm90_scratch(&mp));
    mp.y = ys;
    DSI_RETURN_IF_ERROR(cuda::launch_moe_sm90(mp, ss));
#endif
  } else {
    DSI_RETURN_IF_ERROR(ws_->get(&sp.h, n * w.shared_inter));
    if (fast_shared)
      DSI_RETURN_IF_ERROR(fp8_experts(sp, w.shared_format, w.shared_gemv, uq, ss));
    else
      DSI_RETURN_IF_ERROR(cuda::launch_expert_ffn(sp, ss));
  }
  DSI_RETURN_IF_ERROR(linear(lin(), w.gate, u, n, logits, false, s));  // router in fp32
  DSI_RETURN_IF_ERROR(cuda::launch_moe_route(rp, s));
  if (options_.comm != nullptr)
    return launch_routed_ep(w, n, u, ids, gates, ys, f);

  // Every routed expert is local: group the (token, slot) pairs by expert, run them, combine.
  int64_t* expert_begin = nullptr;
  int32_t* pair_src = nullptr;
  int32_t* pair_pos = nullptr;
  float* y = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&expert_begin, ne + 1));
  DSI_RETURN_IF_ERROR(ws_->get(&pair_src, n * k));
  DSI_RETURN_IF_ERROR(ws_->get(&pair_pos, n * k));
  DSI_RETURN_IF_ERROR(ws_->get(&y, n * k * hidden));
  cuda::MoeGroupParams gp;
  gp.expert_ids = ids;
  gp.n = n;
  gp.k = k;
  gp.n_experts = ne;
  gp.expert_begin = expert_begin;
  gp.pair_src = pair_src;
  gp.pair_pos = pair_pos;
  DSI_RETURN_IF_ERROR(ws_->get(&gp.chunk_counts, cuda::moe_group_scratch_ints(n * k, ne)));
  DSI_RETURN_IF_ERROR(cuda::launch_moe_group(gp, s));
  cuda::ExpertFfnParams ep = sp;
  ep.w1 = w.w1;
  ep.w3 = w.w3;
  ep.w2 = w.w2;
  ep.n_experts = ne;
  ep.inter = w.inter;
  ep.expert_begin = expert_begin;
  ep.pair_src = pair_src;
  ep.k = k;
  ep.gates = gates;
  ep.num_pairs = n * k;
  ep.h = nullptr;  // taken below where used (the grouped wgmma path has its own scratch)
  ep.y = y;
  if (fast_routed && use_moe_sm90(w, n)) {
#if DSINFER_HAVE_CUTLASS
    stats_.moe_grouped_decode += decode_step_ ? 1 : 0;
    cuda::MoeSm90Params mp;
    if (use_moe_w4a8(w, n))
      mp.w4 = w.routed_w4;  // MXFP4 as they are (moe_w4a8_sm90.h)
    else
      mp.w = w.routed_fp8;
    mp.expert_begin = expert_begin;
    mp.pair_src = pair_src;
    mp.k = k;
    mp.gates = gates;
    mp.x = uq;
    mp.num_pairs = n * k;
    mp.swiglu_limit = static_cast<float>(c.swiglu_limit);
    DSI_RETURN_IF_ERROR(moe_sm90_scratch(&mp));
    mp.y = y;
    DSI_RETURN_IF_ERROR(cuda::launch_moe_sm90(mp, s));
#endif
  } else {
    DSI_RETURN_IF_ERROR(ws_->get(&ep.h, n * k * w.inter));
    if (fast_routed)
      DSI_RETURN_IF_ERROR(fp8_experts(ep, w.routed_format, w.routed_gemv, uq, s));
    else
      DSI_RETURN_IF_ERROR(cuda::launch_expert_ffn(ep, s));
  }
  DSI_RETURN_IF_ERROR(shared.join());
  cuda::MoeCombineParams cp;
  cp.n = n;
  cp.k = k;
  cp.hidden = hidden;
  cp.y = y;
  cp.pair_pos = pair_pos;
  cp.expert_ids = ids;
  cp.shared = ys;
  cp.out = f;
  return cuda::launch_moe_combine(cp, s);
}

Status CudaModel::alloc_hc_carry(int64_t n, HcCarry* carry) {
  const int64_t hc = config_.hc_mult;
  *carry = HcCarry{};
  for (int b = 0; b < 2; ++b) {
    DSI_RETURN_IF_ERROR(ws_->get(&carry->f[b], n * config_.hidden_size));
    DSI_RETURN_IF_ERROR(ws_->get(&carry->post[b], n * hc));
    DSI_RETURN_IF_ERROR(ws_->get(&carry->comb[b], n * hc * hc));
  }
  return Status();
}

Status CudaModel::launch_layer(const DLayer& w,
                               const model::LayerPlan& plan,
                               const LayerPass& lp,
                               int64_t n,
                               const int32_t* tokens,
                               const int64_t* positions,
                               uint8_t* pack,
                               const HostPack& hp,
                               float** x,
                               float** x_alt,
                               HcCarry* carry,
                               bool flush) {
  const auto& c = config_;
  const cudaStream_t s = stream_.get();
  const int64_t hc = c.hc_mult;
  const int64_t hidden = c.hidden_size;
  // The layer's temporaries are reused by the next layer (the carried post step is not).
  const Workspace::Mark scope = ws_->mark();
  for (int sub = 0; sub < 2; ++sub) {
    const DHyperConn& hw = sub == 0 ? w.hc_attn : w.hc_ffn;
    const int b = carry->next;
    float* u = nullptr;
    DSI_RETURN_IF_ERROR(ws_->get(&u, n * hidden));
    cuda::HcPreParams pre;
    pre.fn = hw.fn;
    pre.base = hw.base;
    pre.scale = hw.scale;
    pre.hc = hc;
    pre.hidden = hidden;
    pre.sinkhorn_iters = c.hc_sinkhorn_iters;
    pre.hc_eps = static_cast<float>(c.hc_eps);
    pre.norm_eps = static_cast<float>(c.rms_norm_eps);
    pre.x = *x;
    pre.n = n;
    if (carry->pending) {
      // The previous sub-layer's post step, applied by this one's mixing kernel.
      pre.pending = cuda::HcPending{.f = carry->f[1 - b],
                                    .post = carry->post[1 - b],
                                    .comb = carry->comb[1 - b],
                                    .x_out = *x_alt};
    }
    pre.norm_weight = sub == 0 ? w.attn_norm : w.ffn_norm;
    pre.post = carry->post[b];
    pre.comb = carry->comb[b];
    pre.collapsed = u;
    DSI_RETURN_IF_ERROR(ws_->get(&pre.scratch, cuda::hc_mix_scratch_doubles(n, (2 + hc) * hc)));
    DSI_RETURN_IF_ERROR(cuda::launch_hc_pre(pre, s));
    if (carry->pending) {
      std::swap(*x, *x_alt);
      carry->pending = false;
    }
    float* f = carry->f[b];
    if (sub == 0) {
      DSI_RETURN_IF_ERROR(launch_attention(w.attn, plan, lp, n, positions, pack, hp, u, f));
    } else {
      DSI_RETURN_IF_ERROR(launch_moe(w.moe, plan, n, tokens, u, f));
    }
    carry->pending = true;
    carry->next = 1 - b;
  }
  if (flush) {
    const int b = 1 - carry->next;
    cuda::HcPostParams po;
    po.hc = hc;
    po.hidden = hidden;
    po.n = n;
    po.f = carry->f[b];
    po.x = *x;
    po.post = carry->post[b];
    po.comb = carry->comb[b];
    po.x_out = *x_alt;
    DSI_RETURN_IF_ERROR(cuda::launch_hc_post(po, s));
    std::swap(*x, *x_alt);
    carry->pending = false;
  }
  ws_->release(scope);
  return Status();
}

Status CudaModel::launch_head(
    const DHyperConn& hc_head, const float* norm, const float* x, int64_t rows, float* logits) {
  const auto& c = config_;
  const cudaStream_t s = stream_.get();
  float* u = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&u, rows * c.hidden_size));
  cuda::HcHeadParams hp;
  hp.fn = hc_head.fn;
  hp.base = hc_head.base;
  hp.scale = hc_head.scale;
  hp.hc = c.hc_mult;
  hp.hidden = c.hidden_size;
  hp.hc_eps = static_cast<float>(c.hc_eps);
  hp.norm_eps = static_cast<float>(c.rms_norm_eps);
  hp.x = x;
  hp.n = rows;
  hp.collapsed = u;
  hp.norm_weight = norm;  // the final RMSNorm, fused
  DSI_RETURN_IF_ERROR(ws_->get(&hp.scratch, cuda::hc_mix_scratch_doubles(rows, c.hc_mult)));
  DSI_RETURN_IF_ERROR(cuda::launch_hc_head(hp, s));
  // LM head in fp32. A few rows (decode, last-token logits) stream the BF16 weights with the GEMV,
  // more rows take the tensor cores (linear()); batch-invariant mode keeps the latter for all.
  const MatrixRef& head = weights_->head;
  if (lin().wgmma && rows <= cuda::kGemvMaxTokens && cuda::gemv_supports(head) &&
      (reinterpret_cast<uintptr_t>(u) & 15u) == 0) {
    cuda::GemvParams g;
    g.w = head;
    g.x = u;
    g.n = rows;
    g.y = logits;
    return cuda::launch_gemv_bf16(g, s);
  }
  return linear(lin(), head, u, rows, logits, false, s);
}

}  // namespace dsinfer::gpu
