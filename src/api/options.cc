#include "api/options.h"

#include <algorithm>

namespace dsinfer::api {

using recipe::ReasoningEffort;

std::optional<EffortSetting> parse_effort(std::string_view s) {
  EffortSetting e;
  if (s == "none") {
    e.thinking_off = true;
  } else if (s == "minimal" || s == "low") {
    e.effort = ReasoningEffort::kLow;
  } else if (s == "medium" || s == "high" || s == "xhigh") {
    e.effort = ReasoningEffort::kHigh;
  } else if (s == "max" || s == "ultra") {
    e.effort = ReasoningEffort::kMax;
  } else {
    return std::nullopt;
  }
  return e;
}

const char* effort_name(ReasoningEffort e) {
  switch (e) {
    case ReasoningEffort::kLow:
      return "low";
    case ReasoningEffort::kHigh:
      return "high";
    case ReasoningEffort::kMax:
      return "max";
    default:
      return "";
  }
}

int64_t default_max_tokens(recipe::ThinkingMode mode, ReasoningEffort effort) {
  if (mode == recipe::ThinkingMode::kChat)
    return 8 * 1024;
  if (effort == ReasoningEffort::kMax)
    return 128 * 1024;
  return 64 * 1024;
}

ApiResult<int64_t> resolve_max_tokens(const recipe::GenerationRequest& request,
                                      int64_t prompt_tokens,
                                      int64_t max_context) {
  const int64_t room = max_context - prompt_tokens;
  if (room < 1) {
    return invalid_request("messages",
                           "This model's maximum context length is " + std::to_string(max_context) +
                               " tokens. However, your messages " + "resulted in " +
                               std::to_string(prompt_tokens) +
                               " tokens. Please reduce the length of the messages.");
  }
  if (request.sampling.max_tokens) {
    const int64_t want = *request.sampling.max_tokens;
    if (want > room) {
      return invalid_request(
          "max_tokens",
          "This model's maximum context length is " + std::to_string(max_context) +
              " tokens. However, you requested " + std::to_string(prompt_tokens + want) +
              " tokens (" + std::to_string(prompt_tokens) + " in the messages, " +
              std::to_string(want) + " in the completion). Please reduce the length of the " +
              "messages or completion.");
    }
    return want;
  }
  return std::min(room,
                  default_max_tokens(request.conversation.thinking, request.conversation.effort));
}

}  // namespace dsinfer::api
