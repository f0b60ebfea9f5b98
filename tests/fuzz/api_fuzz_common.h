// Shared by the api_*_fuzz targets: a canned output-event stream built partly from the decoded
// request (its tool names and last message text), re-encoded by every encoder.
#pragma once

#include <string>
#include <vector>

#include "recipe/types.h"

namespace dsinfer::api::fuzz {

inline std::vector<recipe::OutputEvent> canned_events(const recipe::GenerationRequest& req,
                                                      size_t variant) {
  using recipe::OutputEvent;
  std::vector<OutputEvent> ev;
  auto add = [&](OutputEvent::Type t, std::string text, int32_t index = -1, std::string name = "") {
    OutputEvent e;
    e.type = t;
    e.text = std::move(text);
    e.tool_index = index;
    e.tool_name = std::move(name);
    ev.push_back(std::move(e));
  };
  std::string echo;
  if (!req.conversation.messages.empty()) {
    const recipe::Message& m = req.conversation.messages.back();
    echo = m.content;
    for (const recipe::ContentBlock& b : m.blocks) echo += b.text;
  }
  add(OutputEvent::Type::kReasoningDelta, "thinking ");
  add(OutputEvent::Type::kReasoningDelta, echo);
  add(OutputEvent::Type::kContentDelta, echo);
  int32_t i = 0;
  for (const recipe::ToolSpec& t : req.conversation.tools) {
    add(OutputEvent::Type::kToolCallStart, "", i, t.name);
    add(OutputEvent::Type::kToolCallArgumentsDelta, "{\"q\": ", i);
    add(OutputEvent::Type::kToolCallArgumentsDelta, "\"" + std::to_string(i) + "\"}", i);
    if (variant % 2 == 0)
      add(OutputEvent::Type::kToolCallEnd, "", i);
    ++i;
    if (i >= 4)
      break;
  }
  add(OutputEvent::Type::kContentDelta, "tail");
  OutputEvent fin;
  fin.type = OutputEvent::Type::kFinish;
  fin.finish = static_cast<recipe::FinishReason>(variant % 6);
  if (fin.finish == recipe::FinishReason::kStopSequence && !req.sampling.stop.empty()) {
    fin.stop_sequence = req.sampling.stop[0];
  }
  ev.push_back(std::move(fin));
  return ev;
}

inline recipe::Usage canned_usage(size_t variant) {
  recipe::Usage u;
  u.prompt_tokens = static_cast<int64_t>(variant % 1000);
  u.cached_prompt_tokens = u.prompt_tokens / 2;
  u.completion_tokens = 17;
  u.reasoning_tokens = 3;
  return u;
}

}  // namespace dsinfer::api::fuzz
