// V41Backend: DeepSeek V4.1 behind the engine's backend seam (backend::Model), on the CPU. It
// owns the opened checkpoint and the V41CpuModel, describes V4.1's per-sequence state to the
// engine's state manager (state_shape: the sequence states the engine allocates in its PageArena
// are laid out for V4.1), rejects the prompt ids a text-only V4.1 cannot take, and runs prefill
// early exit on prefill chunks when asked (prefill_keep_rows > 0).
#pragma once

#include <memory>
#include <span>
#include <string>

#include "backend/cpu_v41/model.h"
#include "backend/model.h"
#include "model_v41/checkpoint.h"

namespace dsinfer::cpu_v41 {

// Prefix-cache save points of V4.1 bounded replay: multiples of 128 tokens (DeepInfer's block of
// the paged compressed cache, spec §5.3, §6.2).
inline constexpr int64_t kV41SavePoint = 128;

struct V41BackendOptions {
  model::Numerics numerics = model::Numerics::kReference;
  // Prefill early exit (spec §5.2): the consumer half runs on the last K prompt rows; 0 = exact.
  int64_t prefill_keep_rows = 0;
  // The Engram compressed token map; empty = <model dir>/engram_token_map.json.
  std::string engram_token_map;
  // Where the Engram tables live (--engram-placement): auto copies them to host memory while
  // they fit and maps the rest, host copies all, mapped reads them in place from the
  // checkpoint's memory map (EngramStore); device is the CUDA V4.1 backend's (tables in GPU
  // memory, gathered there) and this backend refuses it.
  EngramStoreOptions engram;
};

// True when dir/config.json is a DeepSeek V4.1 config (model_type deepseek_v41 / _text).
bool is_v41_model_dir(const std::string& dir);

// The engine-facing ModelConfig of a V4.1 model: vocabulary, special ids, context limit and the
// widths the engine and the server read. Its `layers` name each layer's attention for display
// (ratio-0 layers sliding, the others CSA at their ratio); V4.1's state layout is state_shape().
model::ModelConfig v41_engine_view(const model_v41::V41Config& c);

class V41Backend final : public backend::Model {
 public:
  // Opens and validates the checkpoint, loads the Engram token map (when the model has Engram
  // layers) and checks the options. Errors name the file or the option.
  static Result<std::unique_ptr<V41Backend>> open(const std::string& dir,
                                                  const V41BackendOptions& options);

  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const backend::ForwardOptions& options,
                 backend::ForwardOutputs* out) override;
  const state::StateShape* state_shape() const override { return &shape_; }
  // Prefix cache (spec §5.3). Exact prefill (prefill_keep_rows 0): whole-state images at any
  // length. Early exit: bounded replay, units at multiples of kV41SavePoint tokens holding the
  // compressed caches, index keys, token history and the producer layers' window rings (not the
  // consumer or DSpark rings, nor compressor rows: no group is open at a save point); a unit of
  // B tokens serves a prompt of N only when B <= N - prefill_keep_rows, so the replay of [B, N)
  // recomputes every row the early exit runs through the consumer half.
  Result<backend::PrefixCacheLayout> prefix_cache_layout() const override;
  Status check_prompt(std::span<const int32_t> tokens) const override {
    return check_v41_tokens(ckpt_->config(), tokens);
  }
  // DeepSeek V4.1's "release" tokenizer policy (spec §9, the default) adds BOS when plain text
  // is encoded; "native" does not.
  int32_t text_prompt_bos() const override {
    const model_v41::V41Config& c = ckpt_->config();
    return c.tokenizer_compatibility == "release" ? static_cast<int32_t>(c.bos_token_id) : -1;
  }
  const char* name() const override { return "cpu-v41"; }
  const model::ModelConfig& config() const override { return view_; }
  model::Numerics numerics() const override { return options_.numerics; }

  // The DSpark drafter (spec §7): drafts options.block tokens after a sequence of this engine
  // (its state as the engine holds it), the block's first token `anchor` being the one the
  // target just sampled. The state is not changed; speculative decoding verifies the drafts with
  // a forward over [anchor, drafts] and rolls back what it rejects (SequenceState::rollback, at
  // most max_backtracking tokens). FailedPrecondition without usable DSpark blocks.
  Status draft(const state::SequenceState& st,
               int32_t anchor,
               const DraftOptions& options,
               DraftResult* out) const {
    return model_->draft(st, anchor, options, out);
  }
  // The engine's block drafter (spec::BlockDrafter): DSpark with greedy drafts, blocks of up to
  // max backtracking - 1 tokens (a verification of the anchor and B drafts must be undoable);
  // 0 without usable DSpark blocks.
  int32_t block_draft_size() const override;
  Status block_draft_batch(std::span<backend::BlockDraftItem> items, int32_t block) override;
  const model_v41::V41Checkpoint& checkpoint() const { return *ckpt_; }
  const V41CpuModel& v41() const { return *model_; }

 private:
  V41Backend() = default;
  std::unique_ptr<model_v41::V41Checkpoint> ckpt_;
  std::unique_ptr<V41CpuModel> model_;
  V41BackendOptions options_;
  model::ModelConfig view_;
  state::StateShape shape_;
};

}  // namespace dsinfer::cpu_v41
