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
  // `choice_index`: the choice this encoder streams (n > 1: one encoder per choice, sharing
  // `meta`; see finish_choice() and build_chat_choices_response()).
  ChatStreamEncoder(const recipe::GenerationRequest& request,
                    ResponseMeta meta,
                    int choice_index = 0);
  ~ChatStreamEncoder();
  ChatStreamEncoder(const ChatStreamEncoder&) = delete;
  ChatStreamEncoder& operator=(const ChatStreamEncoder&) = delete;

  std::string start();
  std::string add(const recipe::OutputEvent& event);
  std::string finish(const recipe::Usage& usage);
  // n > 1: closes this choice with its finish_reason chunk (no usage, no [DONE]); once every
  // choice is closed, chat_choices_done() ends the stream.
  std::string finish_choice();
  // An error frame that ends the stream ("data: {"error":…}" then [DONE]).
  std::string error(const ApiError& e);

  // The non-streaming chat.completion object for everything fed so far.
  std::string response_json(const recipe::Usage& usage) const;
  const ResponseMeta& meta() const { return meta_; }

 private:
  friend std::string chat_choices_done(const ChatStreamEncoder& first, const recipe::Usage& usage);
  friend std::string build_chat_choices_response(
      const std::vector<const ChatStreamEncoder*>& choices,
      const recipe::Usage& usage,
      bool renumber);

  // The choice's finish_reason chunk (usage on it where given); empty once done.
  std::string close_choice(const recipe::Usage* usage);

  ResponseMeta meta_;
  int choice_index_ = 0;
  bool include_usage_ = false;
  bool logprobs_ = false;                             // the request asked for logprobs
  std::vector<recipe::TokenLogprob> all_logprobs_;    // everything fed (the response object)
  std::vector<recipe::TokenLogprob> carry_logprobs_;  // streaming: not yet on a chunk
  bool started_ = false;
  bool done_ = false;
  std::unique_ptr<detail::BlockTracker> tracker_;
};

// The non-streaming response body (JSON) for a completed generation.
std::string build_chat_response(const recipe::GenerationRequest& request,
                                const ResponseMeta& meta,
                                const std::vector<recipe::OutputEvent>& events,
                                const recipe::Usage& usage);

// n > 1, streaming: the end after every choice's finish_choice(): with include_usage a last
// chunk with no choices and the usage of all choices (as OpenAI sends it), then [DONE].
std::string chat_choices_done(const ChatStreamEncoder& first, const recipe::Usage& usage);
// n > 1, not streaming: one chat.completion with every choice (each encoder fed its own events).
// renumber: the choices' indices are their positions in `choices` (best_of's selection) rather
// than the indices their encoders were made with.
std::string build_chat_choices_response(const std::vector<const ChatStreamEncoder*>& choices,
                                        const recipe::Usage& usage,
                                        bool renumber = false);

// Chat finish_reason string: stop, length, tool_calls, aborted, insufficient_system_resource.
const char* chat_finish_reason(recipe::FinishReason f);

}  // namespace dsinfer::api
