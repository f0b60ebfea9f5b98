// Anthropic Messages codec (DeepSeek dialect, spec §3.2): request JSON -> GenerationRequest,
// OutputEvents -> message object / SSE (message_start … message_stop).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/error.h"
#include "api/options.h"
#include "recipe/types.h"

namespace dsinfer::api {

ApiResult<recipe::GenerationRequest> decode_messages_request(std::string_view body,
                                                             const DecodeOptions& opts);

namespace detail {
class BlockTracker;
}

// Feeds OutputEvents, returns SSE text ("event: X\ndata: {...}\n\n"). start() sends
// message_start (its usage carries the prompt counts) and is implied by the first add().
class MessagesStreamEncoder {
 public:
  MessagesStreamEncoder(const recipe::GenerationRequest& request, ResponseMeta meta);
  ~MessagesStreamEncoder();
  MessagesStreamEncoder(const MessagesStreamEncoder&) = delete;
  MessagesStreamEncoder& operator=(const MessagesStreamEncoder&) = delete;

  std::string start(const recipe::Usage& prompt_usage = {});
  std::string add(const recipe::OutputEvent& event);
  // content_block_stop (if open), message_delta, message_stop.
  std::string finish(const recipe::Usage& usage);
  // An `error` event that ends the stream.
  std::string error(const ApiError& e);
  // A keep-alive `ping` event.
  std::string ping() const;

  std::string response_json(const recipe::Usage& usage) const;
  const ResponseMeta& meta() const { return meta_; }

 private:
  ResponseMeta meta_;
  bool started_ = false;
  bool done_ = false;
  std::unique_ptr<detail::BlockTracker> tracker_;
};

std::string build_messages_response(const recipe::GenerationRequest& request,
                                    const ResponseMeta& meta,
                                    const std::vector<recipe::OutputEvent>& events,
                                    const recipe::Usage& usage);

// stop_reason: end_turn, max_tokens, stop_sequence, tool_use.
const char* messages_stop_reason(recipe::FinishReason f);

}  // namespace dsinfer::api
