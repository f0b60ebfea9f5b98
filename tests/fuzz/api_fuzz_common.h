// Shared by the api_*_fuzz targets: the driver (decode arbitrary bytes; errors render, and an
// accepted request re-encodes a canned event stream, streaming and not, and renders its prompt)
// and the canned output-event stream, built partly from the decoded request (its tool names and
// last message text).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/error.h"
#include "api/options.h"
#include "recipe/encoder.h"
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

// One protocol's entry points for run_one: its request decoder, error renderer, streaming
// encoder and non-streaming response builder.
template <typename StreamEncoder>
struct Protocol {
  ApiResult<recipe::GenerationRequest> (*decode)(std::string_view, const DecodeOptions&);
  std::string (*render_error)(const ApiError&);
  std::string (*build_response)(const recipe::GenerationRequest&,
                                const ResponseMeta&,
                                const std::vector<recipe::OutputEvent>&,
                                const recipe::Usage&);
};

// The body of LLVMFuzzerTestOneInput for one protocol.
template <typename StreamEncoder>
int run_one(const Protocol<StreamEncoder>& protocol, const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  DecodeOptions opts;
  auto r = protocol.decode(body, opts);
  if (!r.ok()) {
    const ApiError& e = r.error();
    if (e.http_status != 400 || e.message.empty())
      __builtin_trap();
    (void)protocol.render_error(e);
    return 0;
  }
  const recipe::GenerationRequest& req = r.value();
  ResponseMeta meta;
  meta.seed = size;
  const auto events = canned_events(req, size);
  const recipe::Usage usage = canned_usage(size);
  StreamEncoder enc(req, meta);
  std::string out = enc.start();
  for (const recipe::OutputEvent& e : events) out += enc.add(e);
  out += enc.finish(usage);
  if (out.empty())
    __builtin_trap();
  (void)protocol.build_response(req, meta, events, usage);
  (void)resolve_max_tokens(req, 1000, 1 << 20);
  for (recipe::ModelVersion v : {recipe::ModelVersion::kV4, recipe::ModelVersion::kV41}) {
    (void)recipe::render_prompt(req.conversation, v);
  }
  return 0;
}

}  // namespace dsinfer::api::fuzz
