// MtpDrafter: drafting through backend::Model::mtp_draft_batch.
#include "spec/drafter.h"

#include <algorithm>

#include "base/check.h"
#include "base/strings.h"

namespace dsinfer::spec {

MtpDrafter::MtpDrafter(backend::Model* model, int32_t max_drafts)
    : model_(model), max_drafts_(max_drafts) {
  DSI_CHECK(model_ != nullptr && model_->can_draft(), "MtpDrafter needs a backend that drafts");
  DSI_CHECK(max_drafts_ >= 1, "MtpDrafter: max_drafts %d", max_drafts_);
}

void MtpDrafter::prepare(backend::ForwardOptions& options, int32_t drafts) const {
  options.run_mtp = drafts == 0;
  options.want_mtp_logits = false;
}

int64_t MtpDrafter::catch_up_from(const state::SequenceState& st) const {
  return st.mtp_num_tokens();
}

Status MtpDrafter::draft(std::span<DraftRequest> requests) {
  items_.clear();
  item_req_.clear();
  for (size_t i = 0; i < requests.size(); ++i) {
    DraftRequest& r = requests[i];
    r.status = Status();
    r.deferred = false;
    if (r.max_drafts < 0 || r.max_drafts > max_drafts_ || r.out == nullptr) {
      r.status = invalid_argument(str_format(
          "draft: %d drafts requested (this drafter proposes 0..%d)", r.max_drafts, max_drafts_));
      continue;
    }
    r.out->tokens.resize(static_cast<size_t>(r.max_drafts));
    r.out->confidence.resize(static_cast<size_t>(r.max_drafts));
    if (r.max_drafts == 0 && r.catch_up.empty())
      continue;  // nothing to do
    backend::DraftItem it;
    it.state = r.state;
    it.next_token = r.next_token;
    it.num_steps = r.max_drafts;
    it.catch_up = r.catch_up;
    it.tokens = r.out->tokens.data();
    it.probs = r.out->confidence.data();
    it.may_defer = r.may_defer;
    items_.push_back(it);
    item_req_.push_back(i);
  }
  if (items_.empty())
    return Status();
  DSI_RETURN_IF_ERROR(model_->mtp_draft_batch(items_));
  for (size_t k = 0; k < items_.size(); ++k) {
    DraftRequest& r = requests[item_req_[k]];
    r.status = items_[k].status;
    r.deferred = r.status.ok() && items_[k].deferred;
    if (!r.status.ok()) {
      r.out->tokens.clear();
      r.out->confidence.clear();
    }
  }
  return Status();
}

BlockDrafter::BlockDrafter(backend::Model* model, int32_t block) : model_(model), block_(block) {
  DSI_CHECK(model_ != nullptr && block_ >= 1 && block_ <= model_->block_draft_size(),
            "BlockDrafter: block %d (the backend drafts 1..%d)",
            block_,
            model_ ? model_->block_draft_size() : 0);
}

Status BlockDrafter::draft(std::span<DraftRequest> requests) {
  items_.clear();
  item_req_.clear();
  const size_t B = static_cast<size_t>(block_);
  tokens_.resize(requests.size() * B);
  confidence_.resize(requests.size() * B);
  for (size_t i = 0; i < requests.size(); ++i) {
    DraftRequest& r = requests[i];
    r.status = Status();
    if (r.max_drafts < 1 || r.max_drafts > block_ || r.out == nullptr) {
      r.status = invalid_argument(str_format(
          "draft: %d drafts requested (this drafter proposes 1..%d)", r.max_drafts, block_));
      continue;
    }
    backend::BlockDraftItem it;
    it.state = r.state;
    it.anchor = r.next_token;
    it.tokens = tokens_.data() + i * B;
    it.confidence = confidence_.data() + i * B;
    items_.push_back(it);
    item_req_.push_back(i);
  }
  if (items_.empty())
    return Status();
  DSI_RETURN_IF_ERROR(model_->block_draft_batch(items_, block_));
  for (size_t k = 0; k < items_.size(); ++k) {
    DraftRequest& r = requests[item_req_[k]];
    r.status = items_[k].status;
    if (!r.status.ok()) {
      r.out->tokens.clear();
      r.out->confidence.clear();
      continue;
    }
    const size_t n = static_cast<size_t>(r.max_drafts);
    r.out->tokens.assign(items_[k].tokens, items_[k].tokens + n);
    r.out->confidence.assign(items_[k].confidence, items_[k].confidence + n);
  }
  return Status();
}

std::unique_ptr<Drafter> make_drafter(backend::Model* model, int32_t max_drafts) {
  if (model == nullptr || max_drafts < 1)
    return nullptr;
  if (model->block_draft_size() > 0) {
    if (max_drafts > model->block_draft_size())
      return nullptr;
    return std::make_unique<BlockDrafter>(model, max_drafts);
  }
  if (!model->can_draft())
    return nullptr;
  return std::make_unique<MtpDrafter>(model, max_drafts);
}

}  // namespace dsinfer::spec
