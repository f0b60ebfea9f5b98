#include "recipe/types.h"

namespace dsinfer::recipe {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kToolCalls:
      return "tool_calls";
    case FinishReason::kStopSequence:
      return "stop_sequence";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

}  // namespace dsinfer::recipe
