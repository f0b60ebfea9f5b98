// Helpers for the API codec tests: event builders and SSE parsing.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "recipe/types.h"

namespace dsinfer::api::testing {

using Json = nlohmann::ordered_json;
using recipe::FinishReason;
using recipe::OutputEvent;

inline OutputEvent reasoning(std::string t) {
  OutputEvent e;
  e.type = OutputEvent::Type::kReasoningDelta;
  e.text = std::move(t);
  return e;
}
inline OutputEvent content(std::string t) {
  OutputEvent e;
  e.type = OutputEvent::Type::kContentDelta;
  e.text = std::move(t);
  return e;
}
inline OutputEvent tool_start(int32_t index, std::string name) {
  OutputEvent e;
  e.type = OutputEvent::Type::kToolCallStart;
  e.tool_index = index;
  e.tool_name = std::move(name);
  return e;
}
inline OutputEvent tool_args(int32_t index, std::string text) {
  OutputEvent e;
  e.type = OutputEvent::Type::kToolCallArgumentsDelta;
  e.tool_index = index;
  e.text = std::move(text);
  return e;
}
inline OutputEvent tool_end(int32_t index) {
  OutputEvent e;
  e.type = OutputEvent::Type::kToolCallEnd;
  e.tool_index = index;
  return e;
}
inline OutputEvent finish(FinishReason f, std::string stop = "") {
  OutputEvent e;
  e.type = OutputEvent::Type::kFinish;
  e.finish = f;
  e.stop_sequence = std::move(stop);
  return e;
}

// Reasoning, answer text, then two tool calls, finishing with tool_calls.
inline std::vector<OutputEvent> thinking_tools_events() {
  return {reasoning("Need the "),
          reasoning("weather."),
          content("Let me check."),
          tool_start(0, "get_weather"),
          tool_args(0, "{\"city\": "),
          tool_args(0, "\"Paris\"}"),
          tool_end(0),
          tool_start(1, "get_time"),
          tool_args(1, "{}"),
          tool_end(1),
          finish(FinishReason::kToolCalls)};
}

inline recipe::Usage sample_usage() {
  recipe::Usage u;
  u.prompt_tokens = 100;
  u.cached_prompt_tokens = 64;
  u.completion_tokens = 30;
  u.reasoning_tokens = 5;
  return u;
}

struct SseFrame {
  std::string event;  // empty for data-only frames
  std::string data;   // raw data text
  Json json;          // parsed data (discarded for [DONE])
};

// Splits SSE text into frames; fails the test on malformed framing.
inline std::vector<SseFrame> parse_sse(const std::string& text) {
  std::vector<SseFrame> frames;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n\n", pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "unterminated SSE frame at " << pos;
      break;
    }
    std::string frame = text.substr(pos, end - pos);
    pos = end + 2;
    SseFrame f;
    size_t line_start = 0;
    while (line_start <= frame.size()) {
      size_t nl = frame.find('\n', line_start);
      std::string line =
          frame.substr(line_start, nl == std::string::npos ? std::string::npos : nl - line_start);
      if (line.rfind("event: ", 0) == 0) {
        f.event = line.substr(7);
      } else if (line.rfind("data: ", 0) == 0) {
        f.data = line.substr(6);
      } else {
        ADD_FAILURE() << "unexpected SSE line: " << line;
      }
      if (nl == std::string::npos)
        break;
      line_start = nl + 1;
    }
    f.json = Json::parse(f.data, nullptr, false);
    frames.push_back(std::move(f));
  }
  return frames;
}

inline Json parse(const std::string& text) {
  Json j = Json::parse(text, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << text;
  return j;
}

}  // namespace dsinfer::api::testing
