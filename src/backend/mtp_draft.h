// The preconditions of MTP drafting (backend::Model::mtp_draft_batch, DraftItem), shared by the
// backends that draft.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "base/strings.h"
#include "model/config.h"
#include "state/sequence_state.h"

namespace dsinfer::backend {

inline Status check_mtp_draft(const model::ModelConfig& c,
                              bool has_mtp_weights,
                              const state::SequenceState& st,
                              int32_t next_token,
                              int32_t steps,
                              std::span<const int32_t> catch_up = {}) {
  if (!has_mtp_weights || c.mtp_layers.empty())
    return failed_precondition("MTP drafting needs MTP weights; the checkpoint has none");
  if (next_token < 0 || next_token >= c.vocab_size) {
    return invalid_argument(str_format("draft: token id %d is outside the vocabulary [0, %lld)",
                                       next_token,
                                       static_cast<long long>(c.vocab_size)));
  }
  for (int32_t t : catch_up) {
    if (t < 0 || t >= c.vocab_size) {
      return invalid_argument(
          str_format("draft: catch-up token id %d is outside the vocabulary [0, %lld)",
                     t,
                     static_cast<long long>(c.vocab_size)));
    }
  }
  const int64_t pos0 = st.num_tokens() - 1;  // the last position in the state
  // Drafts past the first write the MTP block's window ring at positions the verification may
  // reject; a sliding ring of sliding_window + max_rollback slots keeps every position the next
  // accepted one still attends to. A compressing MTP layer would need its rows rolled back too.
  if (steps < 0 || steps > st.max_rollback() ||
      c.mtp_layers[0].attention != model::AttentionType::kSliding) {
    return invalid_argument(str_format(
        "draft: %d steps with a rollback limit of %lld (needs 0..limit and a sliding MTP layer)",
        steps,
        static_cast<long long>(st.max_rollback())));
  }
  // The block is behind by catch_up.size() + 1 positions, all of whose final streams are kept
  // (the last max_rollback + 1 positions' are).
  const int64_t lag = static_cast<int64_t>(catch_up.size());
  bool kept = lag <= st.max_rollback();
  for (int64_t p = pos0 - lag; kept && p <= pos0; ++p) kept = st.final_streams_row(p) >= 0;
  if (pos0 < 0 || st.mtp_num_tokens() != pos0 - lag || !kept) {
    return failed_precondition(
        str_format("draft: MTP state at %lld, sequence at %lld, %lld catch-up tokens (MTP must be "
                   "one position behind plus the catch-up, within the kept final streams)",
                   static_cast<long long>(st.mtp_num_tokens()),
                   static_cast<long long>(st.num_tokens()),
                   static_cast<long long>(lag)));
  }
  return Status();
}

}  // namespace dsinfer::backend
