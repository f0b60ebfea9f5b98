// V41CpuModel: the DeepSeek V4.1 text forward (spec deepseek-v41.md §3, §4) on the CPU over a
// V41SequenceState, for any chunk size: every token's arithmetic is independent of how the
// prompt is chunked. YOCO cross-layer KV sharing (consumers read the global compressed KV their
// owner wrote), single-pass mHC, Engram hashing + gate (tables read in place from the
// checkpoint: on the CPU they already are host memory), the indexer's two-level top-k.
//
// Numerics (docs/numerics.md): `reference` = the transformers port in fp32 with the model's own
// FP8 window-KV and FP4 compressed-KV / index fake-quantisation, indexer scores scaled, router
// logits divided by gate_temp; `deepseek` = DeepInfer's differences from that (no indexer
// scaling, gate_temp unread, candidate block scores capped at the bf16 maximum, compressed-KV
// E4M3 scale clamped at 448).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu_v41/engram_store.h"
#include "base/status.h"
#include "model/numerics.h"
#include "model_v41/config.h"
#include "model_v41/weights.h"
#include "state/page_arena.h"
#include "state/sequence_state.h"

namespace dsinfer::cpu_v41 {

using model_v41::V41Config;
using model_v41::V41Weights;

// Engram hashing inputs that do not live in the checkpoint (spec §4.2, §4.3): the compressed
// token map phi (tokenizer-derived) and the per-layer multipliers (NumPy default_rng(10007 L)).
struct EngramHashParams {
  std::vector<int32_t> token_map;                 // [vocab] -> [0, compressed vocab)
  std::vector<std::vector<int64_t>> multipliers;  // per Engram layer: max_ngram odd values
  // Checks sizes and ranges against the config.
  Status validate(const V41Config& c) const;
  // The multipliers computed from the config (model_v41::engram_multipliers) with `token_map`.
  static Result<EngramHashParams> from_config(const V41Config& c, std::vector<int32_t> token_map);
};

// Row ids of every Engram table for position `p` of `tokens` (spec §4.4): out[layer][col].
void engram_row_ids(const V41Config& c,
                    const EngramHashParams& h,
                    std::span<const int32_t> tokens,
                    int64_t p,
                    std::vector<std::vector<int64_t>>* out);

// Per-sequence state lives in a state::SequenceState (the engine's state manager, pages of a
// PageArena) laid out by v41_state_shape: a window ring of window + backtracking slots per layer
// and per DSpark block (dequantised values), the compressed entries and index keys of each KV
// owner (consumers read their owner's), the ratio-2 compressors' (c, z) rings of ratio +
// backtracking - 1 rows, and the latest token ids (the Engram n-grams read them).
state::StateShape v41_state_shape(const V41Config& c, int64_t max_backtracking = 6);

// A standalone sequence (tools, tests): its own growable arena.
struct V41SequenceState {
  std::unique_ptr<state::PageArena> arena;
  std::unique_ptr<state::SequenceState> seq;
  int64_t length() const { return seq->num_tokens(); }
};

V41SequenceState make_v41_state(const V41Config& c, int64_t max_backtracking = 6);

// Speculative rollback (spec §6.5): drops the last tokens so that `new_length` remain (at most
// max_backtracking fewer). The rings need no undo (they hold window / group + backtracking slots,
// so no slot a live window or unfinished group still needs was overwritten); the compressed
// entries and index keys shrink to floor(new_length / ratio) per owner.
Status rollback_v41_state(const V41Config& c, V41SequenceState& st, int64_t new_length);

// The multimodal placeholder ids the release tokenizer policy registers right after the text
// vocabulary (spec §9: 21 ids, 129280-129300 at the real config).
inline constexpr int64_t kV41MultimodalPlaceholders = 21;
// Prompt token ids a text-only V4.1 forward accepts: inside the vocabulary, not the image
// placeholder, not a multimodal placeholder id (each a clear invalid-argument Status).
Status check_v41_tokens(const V41Config& c, std::span<const int32_t> tokens);

// Prefill early exit ("SWA bounded replay", spec §5.2): producers and the boundary layer's global
// KV projection (compressor + index keys) run on every prompt row; the rest of the consumer half
// runs only on the last `keep_rows` rows of the prompt (positions >= prompt_length - keep_rows),
// whose decoder window is narrowed to that tail. A chunk with no kept row still runs its last row
// through the consumer half (a placeholder: empty decoder window, no window-KV write, its output
// is not a prediction). Logits come back for the consumer rows only: prompt logprobs are not
// available in this mode.
struct PrefillExit {
  int64_t prompt_length = 0;  // N
  int64_t keep_rows = 140;    // K; must be >= window + max backtracking
};

struct ForwardResult {
  std::vector<float> logits;  // [rows, vocab]
  int64_t first_row = 0;      // chunk index of the first row with logits (0 without early exit)
  bool placeholder = false;   // the only row is an early-exit placeholder (not a prediction)
};

// DSpark drafting (spec §7.3-§7.4): one pass of the draft blocks over [anchor, noise x (B-1)]
// at positions a+1 .. a+B (a = the sequence's last computed position), then the Markov and
// confidence heads row by row with prev_0 = anchor, prev_{k+1} = d_k.
struct DraftOptions {
  int64_t block = 5;                    // B: 1 .. max_backtracking - 1 (DeepInfer: default 5)
  float confidence_temperature = 1.0f;  // T of the confidence head
  // Picks d_k from the draft logits l_k (the caller's sampler, e.g. temperature / top-p with
  // its own random stream); empty = argmax (greedy).
  std::function<int32_t(int64_t k, std::span<const float> logits)> sample;
};

struct DraftResult {
  std::vector<int32_t> tokens;    // d_0 .. d_{B-1}
  std::vector<float> logits;      // [B, vocab]: l_k = head(norm(h_k)) + Markov(prev_k), fp32
  std::vector<float> confidence;  // c_k, the estimate of P(d_k accepted | d_<k accepted)
  std::vector<float> hidden;      // [B, hidden]: h_k, the pre-norm hidden of the block rows
};

class V41CpuModel {
 public:
  V41CpuModel(const V41Config& c,
              const V41Weights& w,
              EngramHashParams hash,
              model::Numerics numerics,
              const EngramStoreOptions& engram = {EngramPlacement::kMapped, 0});

  // Appends `tokens` to `st` and writes their logits [tokens, vocab] to `logits`.
  Status forward(V41SequenceState& st,
                 std::span<const int32_t> tokens,
                 std::vector<float>* logits) const;
  // Same; with `exit` (a prefill chunk of a prompt of exit->prompt_length tokens) the consumer
  // half runs on the kept rows only (see PrefillExit).
  Status forward(V41SequenceState& st,
                 std::span<const int32_t> tokens,
                 const PrefillExit* exit,
                 ForwardResult* out) const;
  // Over a state of v41_state_shape(config) (reserves its pages; kResourceExhausted when the
  // arena is full). last_logits_only: the head runs on the last row only.
  Status forward(state::SequenceState& st,
                 std::span<const int32_t> tokens,
                 const PrefillExit* exit,
                 ForwardResult* out,
                 bool last_logits_only = false) const;
  const V41Config& config() const { return c_; }
  const V41Weights& weights() const { return w_; }
  model::Numerics numerics() const { return numerics_; }
  const EngramStore& engram_store() const { return *engram_; }
  // The Engram hashing inputs (token map and multipliers) the forward hashes row addresses with.
  const EngramHashParams& hash_params() const { return hash_; }

  // True when the checkpoint has DSpark blocks whose context KV the forward writes (into the
  // state's extra rings, one per block) for every row it runs.
  bool has_dspark() const { return dspark_error_.empty() && w_.has_dspark; }
  // Why the DSpark blocks cannot run (empty when they can or when there are none).
  const std::string& dspark_error() const { return dspark_error_; }
  // Drafts options.block tokens after the sequence in `st` (at least one token computed), the
  // block's first row being `anchor` (the token the target just sampled). `st` is not changed:
  // the block rows' own keys live for this call only.
  Status draft(const state::SequenceState& st,
               int32_t anchor,
               const DraftOptions& options,
               DraftResult* out) const;

 private:
  struct Shared;  // values passed between layers within one forward
  struct Exit {   // early-exit plan of one forward
    bool active = false;
    int64_t window_floor = 0;  // lowest position a consumer window may read
    bool placeholder = false;
  };
  void layer(int l,
             state::SequenceState& st,
             int64_t& first,
             int64_t& n,
             EngramStore::Pending& rows,
             std::vector<float>& X,
             std::vector<float>& pi,
             Shared& sh,
             const Exit& ex) const;
  void attention(int l,
                 state::SequenceState& st,
                 int64_t first,
                 int64_t n,
                 const float* x,
                 float* out,
                 Shared& sh,
                 bool compressed_already,
                 const Exit& ex) const;
  void compress(int l, state::SequenceState& st, int64_t first, int64_t n, const float* x) const;
  void indexer(int l,
               state::SequenceState& st,
               int64_t first,
               int64_t n,
               const float* x,
               const float* q_res,
               Shared& sh) const;
  void moe(const model_v41::MoeWeights& w, const float* x, int64_t n, int64_t k, float* out) const;
  void output_projection(const model_v41::AttentionWeights& a,
                         const float* o,
                         int64_t n,
                         float* out) const;
  // The DSpark context KV of rows [first, first + n) from the captured target features.
  void write_dspark_context(
      state::SequenceState& st, int64_t first, int64_t n, const Shared& sh, bool write) const;
  void expert(const model_v41::ExpertWeights& w,
              const float* x,
              float gate,
              bool weighted,
              float* out) const;
  void engram(int l, int64_t n, EngramStore::Pending& rows, std::vector<float>& X) const;
  void mixes(
      const model_v41::HcSite& s, const float* X, float* pre, float* post, float* comb) const;
  bool deepseek() const { return numerics_ == model::Numerics::kDeepSeek; }

  const V41Config& c_;
  const V41Weights& w_;
  EngramHashParams hash_;
  model::Numerics numerics_;
  std::unique_ptr<EngramStore> engram_;
  std::vector<int> dspark_target_index_;  // per layer: position in dspark_target_layer_ids or -1
  std::string dspark_error_;
  std::vector<float> inv_main_;
  std::vector<float> inv_compress_;
};

// Quantisation points of V4.1 (exposed for tests).
// FP8 E4M3 per 32 values, UE8M0 scale 2^ceil(log2(max(amax, 1e-4) / 448)); in place.
void fp8_window_quant(float* x, int64_t n);
// FP4 E2M1 per 32 values, UE8M0 scale 2^ceil(log2(max(amax, 6 2^-126) / 6)); in place.
void fp4_index_quant(float* x, int64_t n);
// FP4 E2M1 per 16 values, E4M3 scale e4m3(max(amax, 6 2^-9) / 6) (clamped at 448 if asked).
void fp4_compressed_quant(float* x, int64_t n, bool clamp_scale);

}  // namespace dsinfer::cpu_v41
