// Drafter: what proposes the draft tokens of speculative decoding. The engine asks a drafter for
// up to k drafts per sequence (all sequences of a step in one call), verifies them in one batched
// forward of the target model and keeps the accepted prefix. Two kinds fit behind this
// interface:
//   - sequential drafters (V4's MTP block, run recurrently): each draft costs one more drafter
//     step, so the engine decides how many to draft before drafting;
//   - block drafters (V4.1's DSpark): one pass proposes a whole block with a confidence per
//     position, and the engine decides afterwards how many of them to verify.
// Either way each draft comes with a confidence: the drafter's estimate of the probability that
// the target accepts it (MTP: the draft softmax's probability of the drafted token; DSpark: its
// confidence head). The scheduler (verify_length.h) calibrates it against observed acceptance.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/model.h"
#include "base/status.h"
#include "state/sequence_state.h"

namespace dsinfer::spec {

struct Draft {
  std::vector<int32_t> tokens;    // proposed continuation after the sequence's pending token
  std::vector<float> confidence;  // [tokens.size()] per-position confidences in [0, 1]
};

// One sequence's drafting request. The sequence's state holds positions [0, N); next_token is
// the pending token at position N (sampled, not yet in the state). Drafts are proposed for
// positions N+1, N+2, ...
struct DraftRequest {
  state::SequenceState* state = nullptr;
  int32_t next_token = 0;
  // <= Drafter::max_drafts() and <= state->max_rollback(); 0: no drafts, the drafter's state
  // brought up to date only (see catch_up_from)
  int32_t max_drafts = 0;
  // The sequence's tokens from position catch_up_from(*state) + 1 to N - 1 (empty when it is
  // N): what a drafter whose verifications skip its forward work needs to catch up.
  std::span<const int32_t> catch_up;
  Draft* out = nullptr;
  Status status;  // per-request failure (that request is verified without drafts)
  // backend::DraftItem::may_defer / deferred: the drafts may be left on the device for the
  // verification (ForwardOptions::device_drafts), out->tokens and out->confidence then written
  // when that forward returns.
  bool may_defer = false;
  bool deferred = false;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual const char* name() const = 0;
  // The most drafts one call proposes for a sequence.
  virtual int32_t max_drafts() const = 0;
  // True when every draft costs one drafter step (the engine chooses k before drafting).
  virtual bool sequential() const = 0;
  // What the target model's forward must do so that the drafter's state follows the sequence,
  // for a forward that verifies `drafts` drafts (0: a prompt chunk or a plain decode). MTP: a
  // forward without drafts runs the MTP block over every position whose next token it makes
  // known; a verification skips it (the next draft call catches up over the accepted positions
  // in its first pass, one MTP pass per step fewer).
  virtual void prepare(backend::ForwardOptions& options, int32_t drafts) const = 0;
  // The first position whose drafter state is not up to date (the catch-up starts after it):
  // the sequence's last position where nothing is behind.
  virtual int64_t catch_up_from(const state::SequenceState& st) const {
    return st.num_tokens() - 1;
  }
  // Proposes drafts for every request (per-request errors in request.status). The returned
  // Status is a failure of the whole call (a device error).
  virtual Status draft(std::span<DraftRequest> requests) = 0;
};

// V4's MTP block as a drafter (top-1 chain): step 1 at the sequence's last position with the
// pending token, each later step on the block's own output streams with its previous draft.
class MtpDrafter final : public Drafter {
 public:
  // model must outlive the drafter and report can_draft().
  MtpDrafter(backend::Model* model, int32_t max_drafts);
  const char* name() const override { return "mtp"; }
  int32_t max_drafts() const override { return max_drafts_; }
  bool sequential() const override { return true; }
  void prepare(backend::ForwardOptions& options, int32_t drafts) const override;
  // The MTP block's position (mtp_num_tokens).
  int64_t catch_up_from(const state::SequenceState& st) const override;
  Status draft(std::span<DraftRequest> requests) override;

 private:
  backend::Model* model_;
  int32_t max_drafts_;
  std::vector<backend::DraftItem> items_;
  std::vector<size_t> item_req_;
};

// A backend's block drafter (V4.1's DSpark, backend::Model::block_draft_batch) as a drafter: one
// pass drafts a block of max_drafts tokens with a confidence each (the confidence head); each
// request gets the first request.max_drafts of them. The block is always drafted in full (the
// drafts depend on the block's length: its rows attend to each other), so that a sequence's
// drafts are the same whatever prefix of them is verified.
class BlockDrafter final : public Drafter {
 public:
  // model must outlive the drafter; 1 <= block <= model->block_draft_size().
  BlockDrafter(backend::Model* model, int32_t block);
  const char* name() const override { return "dspark"; }
  int32_t max_drafts() const override { return block_; }
  bool sequential() const override { return false; }
  void prepare(backend::ForwardOptions& options, int32_t drafts) const override {
    (void)options;
    (void)drafts;
  }
  Status draft(std::span<DraftRequest> requests) override;

 private:
  backend::Model* model_;
  int32_t block_;
  std::vector<backend::BlockDraftItem> items_;
  std::vector<size_t> item_req_;
  std::vector<int32_t> tokens_;
  std::vector<float> confidence_;
};

// The drafter this model has (a block drafter: BlockDrafter; MTP weights: an MtpDrafter), or
// null when it has none or the backend cannot draft.
std::unique_ptr<Drafter> make_drafter(backend::Model* model, int32_t max_drafts);

}  // namespace dsinfer::spec
