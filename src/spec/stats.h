// Speculative decoding metrics: acceptance per draft position, accepted length, verify lengths.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsinfer::spec {

struct Stats {
  // Drafts verified / accepted at each draft position (index 0 = the first draft).
  std::vector<int64_t> verified;
  std::vector<int64_t> accepted;
  // Decode steps of requests by the number of drafts verified (index k = k drafts, 0..K).
  std::vector<int64_t> verify_len;
  int64_t spec_steps = 0;   // request-steps that verified >= 1 draft
  int64_t spec_tokens = 0;  // tokens those steps emitted (accepted drafts + the target's token)
  int64_t drafted = 0;      // drafts proposed (drafted but trimmed before verification included)
  int64_t resumed = 0;      // requests that stopped speculating (auto) and later resumed

  void resize(int32_t max_k);
  // Acceptance rate at draft position i (0 when none verified there).
  double acceptance(size_t i) const;
  // Tokens emitted per request-step that verified drafts (1 + accepted drafts).
  double mean_accepted_length() const;
  // Mean number of drafts verified per decode request-step.
  double mean_verify_len() const;
  // One line: "accept 0.91 0.85 ... | mean accepted length 3.2 | mean verify length 3.9".
  std::string summary() const;
};

}  // namespace dsinfer::spec
