// OpenAI Chat Completions codec (DeepSeek dialect, spec §3.1): request JSON -> GenerationRequest,
// OutputEvents -> chat.completion / chat.completion.chunk SSE.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/error.h"
#include "api/options.h"
#include "recipe/types.h"

namespace dsinfer::api {

ApiResult<recipe::GenerationRequest> decode_chat_request(std::string_view body,
                                                         const DecodeOptions& opts);

namespace detail {
class BlockTracker;
}

// Feeds OutputEvents, returns SSE text ("data: {...}\n\n" frames; `data: [DONE]` at the end).
// start() is implied by the first add(); finish() closes the stream; usage rides on the last
// chunk (DeepSeek quirk), with "usage": null on earlier chunks iff include_usage.
class ChatStreamEncoder {
 public:
  ChatStreamEncoder(const recipe::GenerationRequest& request, ResponseMeta meta);
  ~ChatStreamEncoder();
  ChatStreamEncoder(const ChatStreamEncoder&) = delete;
  ChatStreamEncoder& operator=(const ChatStreamEncoder&) = delete;

  std::string start();
  std::string add(const recipe::OutputEvent& event);
  std::string finish(const recipe::Usage& usage);
  // An error frame that ends the stream ("data: {"error":…}" then [DONE]).
  std::string error(const ApiError& e);

  // The non-streaming chat.completion object for everything fed so far.
  std::string response_json(const recipe::Usage& usage) const;
  const ResponseMeta& meta() const { return meta_; }

 private:
  ResponseMeta meta_;
  bool include_usage_ = false;
  bool started_ = false;
  bool done_ = false;
  std::unique_ptr<detail::BlockTracker> tracker_;
};

// The non-streaming response body (JSON) for a completed generation.
std::string build_chat_response(const recipe::GenerationRequest& request,
                                const ResponseMeta& meta,
                                const std::vector<recipe::OutputEvent>& events,
                                const recipe::Usage& usage);

// Chat finish_reason string: stop, length, tool_calls, aborted, insufficient_system_resource.
const char* chat_finish_reason(recipe::FinishReason f);

}  // namespace dsinfer::api
