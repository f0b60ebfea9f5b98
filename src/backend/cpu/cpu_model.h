// CpuModel: the whole DeepSeek V4 forward (spec §3) on the CPU over a SequenceState, for any
// chunk size: prefill in chunks of any length, then one token at a time, equals one full
// forward. The reference the CUDA backend is tested against.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/model.h"
#include "base/status.h"
#include "model/config.h"
#include "model/numerics.h"
#include "model/weights.h"
#include "state/sequence_state.h"

namespace dsinfer::cpu {

using ForwardOutputs = backend::ForwardOutputs;
using ForwardOptions = backend::ForwardOptions;

// The argmax of logits[0, vocab) and its softmax probability (a draft and its confidence).
int32_t top1(const float* logits, int64_t vocab, float* prob);

class CpuModel final : public backend::Model {
 public:
  CpuModel(const model::ModelConfig& config,
           const model::ModelWeights& weights,
           model::Numerics numerics);

  // Appends `tokens` to the sequence in `st` and computes their logits. Token ids are validated
  // (a bad id is an invalid-argument Status and leaves `st` untouched).
  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const ForwardOptions& options,
                 ForwardOutputs* out) const;
  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const ForwardOptions& options,
                 ForwardOutputs* out) override {
    return static_cast<const CpuModel*>(this)->forward(st, tokens, options, out);
  }

  // MTP drafting (backend::Model::mtp_draft_batch, DraftItem): the catch-up, then `steps` top-1
  // drafts after next_token.
  Status mtp_draft(state::SequenceState& st,
                   int32_t next_token,
                   int32_t steps,
                   std::span<const int32_t> catch_up,
                   int32_t* tokens,
                   float* probs) const;
  Status mtp_draft_batch(std::span<backend::DraftItem> items) override;
  // mtp_draft's preconditions (OK: it may run).
  Status check_draft(const state::SequenceState& st,
                     int32_t next_token,
                     int32_t steps,
                     std::span<const int32_t> catch_up) const;
  // The MTP block over the catch-up positions (DraftItem::catch_up) of a sequence that passed
  // check_draft: afterwards it is one position behind.
  void mtp_catch_up(state::SequenceState& st, std::span<const int32_t> catch_up) const;
  bool can_draft() const override { return !weights_.mtp.empty(); }
  // Its MTP attention honours LayerState::window_floor (attention.cc).
  bool can_resume_drafting() const override { return can_draft(); }
  // The MTP part of a forward (ForwardOptions::run_mtp) over a chunk whose main-model final
  // streams are `x` ([tokens.size(), hc * hidden]), called before the state advances; and the
  // final streams the MTP block needs later. Public for the fast CPU backend.
  Status check_mtp(const state::SequenceState& st) const;
  Status mtp_chunk(state::SequenceState& st,
                   const float* x,
                   std::span<const int32_t> tokens,
                   bool want_logits,
                   ForwardOutputs* out) const;
  void store_final_streams(state::SequenceState& st, const float* x, int64_t n) const;

  const char* name() const override { return "cpu"; }
  const model::ModelConfig& config() const override { return config_; }
  model::Numerics numerics() const override { return numerics_; }

  // The MoE sub-layer's pieces, public for the expert-parallel reference (src/parallel) and its
  // tests; `forward` uses exactly these.
  // Router: per token k expert ids [n, k] and routing weights [n, k] (hash or score routing).
  void moe_route(const model::MoeWeights& w,
                 const model::LayerPlan& plan,
                 const float* x,
                 std::span<const int32_t> tokens,
                 int32_t* ids,
                 float* gates) const;
  // out[n, hidden] = shared expert + each routed expert's rows, added in ascending expert id.
  void moe(const model::MoeWeights& w,
           const model::LayerPlan& plan,
           const float* x,
           std::span<const int32_t> tokens,
           float* out) const;
  // One SwiGLU expert over n rows with per-row routing weights; ADDS its output to out_accum.
  // Each row's result depends only on that row (row-independent, any n).
  void expert(const model::ExpertWeights& w,
              const float* x,
              int64_t n,
              const float* gates,
              float* out_accum) const;

 private:
  void decoder_layer(const model::LayerWeights& w,
                     const model::LayerPlan& plan,
                     state::LayerState& ls,
                     std::span<const int32_t> tokens,
                     int64_t first_pos,
                     std::vector<float>& x) const;
  void attention(const model::AttentionWeights& w,
                 const model::LayerPlan& plan,
                 state::LayerState& ls,
                 const float* x,
                 int64_t first_pos,
                 int64_t n,
                 float* out) const;
  void head(const model::HyperHeadWeights& hc_head,
            const std::vector<float>& norm,
            const float* streams,
            int64_t n,
            float* logits) const;
  void mtp(const model::MtpWeights& w,
           const model::LayerPlan& plan,
           state::LayerState& ls,
           const float* streams,
           std::span<const int32_t> next_tokens,
           int64_t first_pos,
           float* logits,                        // [n, vocab] draft logits, or null
           float* streams_out = nullptr) const;  // [n, hc * hidden] the block's output streams
  bool quantize_acts() const { return numerics_ == model::Numerics::kDeepSeek; }
  const std::vector<float>& inv_freq(model::RopeTable t) const {
    return t == model::RopeTable::kMain ? inv_freq_main_ : inv_freq_compress_;
  }

  const model::ModelConfig& config_;
  const model::ModelWeights& weights_;
  model::Numerics numerics_;
  std::vector<float> inv_freq_main_;
  std::vector<float> inv_freq_compress_;
};

}  // namespace dsinfer::cpu
