// The preconditions of MTP drafting (backend::Model::mtp_draft_batch, DraftItem), shared by the
// backends that draft.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "base/strings.h"
#include "model/config.h"
#include "state/sequence_state.h"

namespace dsinfer::backend {

inline Status check_mtp_draft(const model::ModelConfig& c,
                              bool has_mtp_weights,
                              const state::SequenceState& st,
                              int32_t next_token,
                              int32_t steps) {
  if (!has_mtp_weights || c.mtp_layers.empty())
    return failed_precondition("MTP drafting needs MTP weights; the checkpoint has none");
  if (next_token < 0 || next_token >= c.vocab_size) {
    return invalid_argument(str_format("draft: token id %d is outside the vocabulary [0, %lld)",
                                       next_token,
                                       static_cast<long long>(c.vocab_size)));
  }
  const int64_t pos0 = st.num_tokens() - 1;  // the last position in the state
  // Drafts past the first write the MTP block's window ring at positions the verification may
  // reject; a sliding ring of sliding_window + max_rollback slots keeps every position the next
  // accepted one still attends to. A compressing MTP layer would need its rows rolled back too.
  if (steps < 1 || steps > st.max_rollback() ||
      c.mtp_layers[0].attention != model::AttentionType::kSliding) {
    return invalid_argument(str_format(
        "draft: %d steps with a rollback limit of %lld (needs 1..limit and a sliding MTP layer)",
        steps,
        static_cast<long long>(st.max_rollback())));
  }
  if (pos0 < 0 || st.mtp_num_tokens() != pos0 || st.final_streams_row(pos0) < 0) {
    return failed_precondition(
        str_format("draft: MTP state at %lld, sequence at %lld (MTP must be one position behind; "
                   "run every forward with MTP on)",
                   static_cast<long long>(st.mtp_num_tokens()),
                   static_cast<long long>(st.num_tokens())));
  }
  return Status();
}

}  // namespace dsinfer::backend
