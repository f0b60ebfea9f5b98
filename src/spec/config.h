// Speculative decoding settings: `--speculative off|fixed:K|auto`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dsinfer::spec {

enum class Mode {
  kOff,    // no drafting
  kFixed,  // always k drafts (fewer only near max_tokens / the context limit)
  kAuto,   // per step and request, the k that maximises expected accepted tokens per second
};

inline constexpr int32_t kMaxDrafts = 8;       // the largest K accepted
inline constexpr int32_t kDefaultAutoMax = 5;  // auto's largest K (DeepSeek's default block)

struct Config {
  Mode mode = Mode::kOff;
  int32_t k = 0;  // kFixed: the number of drafts; kAuto: the most drafts per step
  // Whether the mode was chosen by default (auto where the checkpoint has a drafter): then a
  // checkpoint or backend without a drafter silently runs without speculation, while an explicit
  // request for it is an error.
  bool defaulted = false;
  int32_t max_drafts() const { return mode == Mode::kOff ? 0 : k; }
};

// Parses "off", "auto", "auto:K" or "fixed:K" (1 <= K <= kMaxDrafts). Errors quote the text.
Result<Config> parse_config(std::string_view text);
std::string to_string(const Config& c);

}  // namespace dsinfer::spec
