// FastCpuModel: the DeepSeek V4 forward on the CPU at CPU speed, next to the reference CpuModel
// (backend/cpu/cpu_model.h), which stays the oracle for `score --numerics reference`, the golden
// tests and the CUDA backend's tests.
//
// One forward_batch is one step for all its sequences: the rows of every item (decode tokens of
// many sequences, prefill chunks) are stacked, and each linear runs as one GEMM over all of
// them (kernels/cpu/fast/gemm.h), so every weight is read once per step. MoE groups the rows by
// expert, so each selected expert's weights are read once per step too. Only what depends on a
// sequence's state (compressor pooling, the indexer's scores, the attention itself) runs per
// sequence, in parallel over rows. Quantised weights are used through exact BF16 copies made on
// first use (kernels/cpu/fast/packed_weights.h). Scratch lives in the model and is reused, so a
// step allocates nothing once the batch shape has been seen.
//
// The numerics are the reference's (same numerics modes, same quantisation points); only the
// rounding differs: fp32 summation order (16/8-lane partial sums and FMAs, fp32 instead of
// double in the mHC mixes) and, with AVX-512, a vectorised exp in the experts' SwiGLU (a few
// ulp). Logits differ from the reference by that rounding: docs/performance.md gives the budget
// and tests/unit/backend/cpu_fast_test.cc checks it. A token's results do not depend on the
// other rows of its step (batch invariance, bit for bit).
//
// MTP (ForwardOptions::run_mtp, `score --mtp`, and drafting for speculative decoding) runs the
// same way: the MTP block's rows of every item in one pass of batched GEMMs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "backend/model.h"
#include "base/status.h"
#include "kernels/cpu/fast/packed_weights.h"
#include "kernels/cpu/fast/thread_pool.h"
#include "model/config.h"
#include "model/numerics.h"
#include "model/weights.h"

namespace dsinfer::cpu::fast {

class FastCpuModel final : public backend::Model {
 public:
  // pool: the worker threads (null: single-threaded).
  FastCpuModel(const model::ModelConfig& config,
               const model::ModelWeights& weights,
               model::Numerics numerics,
               ThreadPool* pool);

  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const backend::ForwardOptions& options,
                 backend::ForwardOutputs* out) override;
  Status forward_batch(std::span<backend::ForwardItem> items) override;
  bool can_draft() const override { return reference_.can_draft(); }
  bool can_resume_drafting() const override { return reference_.can_resume_drafting(); }
  Status mtp_draft_batch(std::span<backend::DraftItem> items) override;

  const char* name() const override { return "cpu-fast"; }
  const model::ModelConfig& config() const override { return config_; }
  model::Numerics numerics() const override { return numerics_; }

  int64_t converted_weight_bytes() const { return packed_.converted_bytes(); }
  int threads() const { return pool_ ? pool_->threads() : 1; }

 private:
  // One sequence's rows in the step.
  struct Seg {
    backend::ForwardItem* item = nullptr;
    int64_t row0 = 0;
    int64_t n = 0;
    int64_t first_pos = 0;
  };
  // Per-task scratch of the per-row attention phase.
  struct RowScratch {
    std::vector<const float*> keys;
    std::vector<float> logits;
    std::vector<float> scores;
    std::vector<int32_t> order;
    std::vector<int32_t> selected;
  };

  void layer(size_t l, std::vector<float>& x);
  void attention(size_t l, const float* u, float* out);
  void moe(const model::MoeWeights& w, const model::LayerPlan& plan, const float* u, float* out);
  void expert(const model::ExpertWeights& w,
              const float* x,
              int64_t n,
              const float* gates,
              float* out_accum);
  void head(const model::HyperHeadWeights& hw,
            const std::vector<float>& norm,
            const float* streams,
            int64_t n,
            float* logits);
  // Layer l of the main model, or of the MTP blocks while mtp_pass_ is set.
  const model::LayerWeights& layer_weights(size_t l) const {
    return mtp_pass_ ? weights_.mtp[l].layer : weights_.layers[l];
  }
  const model::LayerPlan& layer_plan(size_t l) const {
    return mtp_pass_ ? config_.mtp_layers[l] : config_.layers[l];
  }
  state::LayerState& layer_state(state::SequenceState& st, size_t l) const {
    return mtp_pass_ ? st.mtp_layers()[l] : st.layers()[l];
  }
  // The MTP block over the step's rows (segs_ and the row tables set up for it: row_token_ the
  // next tokens, row_pos_ the MTP positions): `streams` [rows_, hc * hidden] are the main
  // model's final streams (or the block's own, when drafting); writes the draft logits
  // ([rows_, vocab], when logits is not null) and the block's output streams (when streams_out
  // is not null).
  void mtp_rows(const float* streams, float* logits, float* streams_out);
  // Sets up the per-row tables for segs_ (rows_ rows) with the given tokens and positions.
  void set_rows(const int32_t* tokens, const int64_t* positions);
  // Pools the compressor rows of segment s (projections already in kv/score, [n, width]).
  template <typename Emit>
  void compress_seg(const model::CompressorWeights& w,
                    state::CompressorRows& rows,
                    int64_t ratio,
                    bool overlap,
                    int64_t d,
                    int post,
                    const std::vector<float>& freqs,
                    const Seg& s,
                    float* kv,
                    float* score,
                    Emit&& emit);
  // y = x . w^T over n rows (x row stride ldx, y row stride ldy); with quantize, x's rows are
  // first rounded through 1x128 UE8M0 FP8 (the reference's activation quantisation).
  void linear(const WeightView& w,
              const float* x,
              int64_t ldx,
              int64_t n,
              float* y,
              int64_t ldy,
              bool quantize);
  void linear(const MatrixRef& w, const float* x, int64_t n, float* y, bool quantize) {
    linear(packed_.get(w), x, w.cols, n, y, w.rows, quantize);
  }
  // fn(row_begin, row_end) over [0, n), split across the pool when n is large enough.
  template <typename F>
  void parallel_rows(int64_t n, int64_t min_rows_per_task, F&& fn);
  // The cos/sin table of every row of the step for one RoPE table: [N, 2 * half].
  const float* rope_table(model::RopeTable t);
  bool quantize_acts() const { return numerics_ == model::Numerics::kDeepSeek; }

  const model::ModelConfig& config_;
  const model::ModelWeights& weights_;
  model::Numerics numerics_;
  ThreadPool* pool_;
  CpuModel reference_;  // MTP preconditions and final-stream bookkeeping
  PackedWeights packed_;
  std::vector<float> inv_freq_main_;
  std::vector<float> inv_freq_compress_;

  // The step: segments and per-row tables.
  std::vector<Seg> segs_;
  std::vector<int32_t> row_token_;
  std::vector<int64_t> row_pos_;
  std::vector<int32_t> row_seg_;
  int64_t rows_ = 0;
  bool mtp_pass_ = false;
  bool rope_ready_[2] = {false, false};
  std::vector<float> rope_cs_[2];
  // Scratch reused across steps (grown, never shrunk).
  std::vector<float> x_, xnext_, u_, f_, post_, comb_, mix_, qbuf_;
  std::vector<float> qr_, q_, kv_, ckv_, csc_, ikv_, isc_, qi_, hw_, o_, z_;
  std::vector<float> pool_logit_, pool_value_, entry_;
  std::vector<float> scores_, gates_, ones_, xs_, gs_, ys_, ea_, eu_, ey_;
  std::vector<int32_t> ids_, expert_rows_, expert_start_;
  std::vector<RowScratch> row_scratch_;
  std::vector<float> head_in_, head_u_, head_mix_, logits_;
  std::vector<int64_t> logit_rows_;
  // MTP passes (forward with run_mtp, drafting).
  std::vector<float> mtp_x_, mtp_in_, mtp_e_, mtp_ep_, mtp_h_, mtp_logits_;
  std::vector<float> draft_prev_, draft_streams_, step_streams_;
  std::vector<int32_t> mtp_tokens_;
  std::vector<int64_t> mtp_pos_;
  std::vector<Seg> main_segs_;
  std::vector<backend::ForwardItem> draft_items_;
  std::vector<size_t> draft_active_;
  std::vector<int32_t> draft_tok_;
};

}  // namespace dsinfer::cpu::fast
