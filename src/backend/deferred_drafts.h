// Where a drafting call's picks go (backend::DraftItem): the call leaves its greedy picks on
// the device as [steps][rows] token ids followed by as many log-probabilities, and each
// drafting sequence owns one column. DeferredDrafts records, per sequence, its column and the
// item's output arrays, finds a sequence's entry (a forward that verifies drafts still on the
// device, ForwardOptions::device_drafts) and writes the drafts into their items once the picks'
// host copy has arrived. Host-only bookkeeping shared by the backends that draft on a device.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/check.h"
#include "state/sequence_state.h"

namespace dsinfer::backend {

class DeferredDrafts {
 public:
  struct Entry {
    const state::SequenceState* state = nullptr;
    int32_t* tokens = nullptr;  // the item's drafts, steps of them
    float* probs = nullptr;     // their probabilities under the drafter
    int32_t steps = 0;
    int64_t col = 0;  // step s's pick at s * rows + col
  };

  // Forgets the entries and sets the picks' layout: `rows` columns per step, `picks` token ids
  // (steps * rows) before the log-probabilities.
  void reset(int64_t rows, int64_t picks) {
    entries_.clear();
    sealed_ = true;
    rows_ = rows;
    picks_ = picks;
  }
  // One sequence's drafts (a sequence appears once); find() is valid after seal().
  void add(const Entry& e) {
    DSI_CHECK(e.steps >= 0 && e.col >= 0 && (e.steps == 0 || last_index(e) < picks_),
              "drafts beyond the picks (%d steps at column %lld)",
              e.steps,
              static_cast<long long>(e.col));
    entries_.push_back(e);
    sealed_ = false;
  }
  // Orders the entries by sequence for find() (a batch of 256 looks up each of its sequences).
  void seal() {
    std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
      return a.state < b.state;
    });
    for (size_t i = 1; i < entries_.size(); ++i) {
      DSI_CHECK(entries_[i - 1].state != entries_[i].state, "one sequence drafted twice");
    }
    sealed_ = true;
  }
  bool empty() const { return entries_.empty(); }
  int64_t rows() const { return rows_; }

  const Entry* find(const state::SequenceState* st) const {
    DSI_CHECK(sealed_ || entries_.empty(), "DeferredDrafts::find before seal()");
    auto it = std::lower_bound(
        entries_.begin(), entries_.end(), st, [](const Entry& e, const state::SequenceState* s) {
          return e.state < s;
        });
    return it != entries_.end() && it->state == st ? &*it : nullptr;
  }
  // Where step s of an entry's drafts lies among the picks.
  int64_t index(const Entry& e, int32_t step) const { return step * rows_ + e.col; }

  // Writes every entry's drafts from the picks' host copy (picks_ int32 ids, then as many float
  // log-probabilities) into their items, and forgets them.
  void deliver(const void* host_picks) {
    const auto* tok = static_cast<const int32_t*>(host_picks);
    const auto* lp = reinterpret_cast<const float*>(tok + picks_);
    for (const Entry& e : entries_) {
      for (int32_t s = 0; s < e.steps; ++s) {
        const int64_t at = index(e, s);
        e.tokens[s] = tok[at];
        e.probs[s] = std::exp(lp[at]);
      }
    }
    entries_.clear();
    sealed_ = true;
  }

 private:
  int64_t last_index(const Entry& e) const { return index(e, e.steps - 1); }

  std::vector<Entry> entries_;
  int64_t rows_ = 0;
  int64_t picks_ = 0;
  bool sealed_ = true;
};

}  // namespace dsinfer::backend
