// CpuModel: the whole DeepSeek V4 forward (spec §3) on the CPU over a SequenceState, for any
// chunk size: prefill in chunks of any length, then one token at a time, equals one full
// forward. The reference the CUDA backend is tested against.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/numerics.h"
#include "model/weights.h"
#include "state/sequence_state.h"

namespace dsinfer::cpu {

struct ForwardOutputs {
  std::vector<float> logits;  // [n, vocab] for the chunk's tokens (when want_logits), or
                              // [1, vocab] with last_logits_only
  // MTP draft logits for the positions whose next token became known in this call:
  // mtp_first_pos .. mtp_first_pos + mtp_count - 1; row i predicts token (pos + 2).
  std::vector<float> mtp_logits;  // [mtp_count, vocab]
  int64_t mtp_first_pos = 0;
  int64_t mtp_count = 0;
};

struct ForwardOptions {
  bool want_logits = true;
  bool last_logits_only = false;  // logits of the chunk's last token only ([1, vocab])
  bool run_mtp = false;           // requires MTP weights
};

class CpuModel {
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

  const model::ModelConfig& config() const { return config_; }
  model::Numerics numerics() const { return numerics_; }

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
  void moe(const model::MoeWeights& w,
           const model::LayerPlan& plan,
           const float* x,
           std::span<const int32_t> tokens,
           float* out) const;
  void expert(const model::ExpertWeights& w,
              const float* x,
              int64_t n,
              const float* gates,
              float* out_accum) const;
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
           float* logits) const;
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
