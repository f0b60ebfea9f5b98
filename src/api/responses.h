// OpenAI Responses codec (DeepSeek dialect, spec §3.3, stateless): request JSON ->
// GenerationRequest, OutputEvents -> response object / semantic SSE events.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/error.h"
#include "api/options.h"
#include "recipe/types.h"

namespace dsinfer::api {

ApiResult<recipe::GenerationRequest> decode_responses_request(std::string_view body,
                                                              const DecodeOptions& opts);

// Feeds OutputEvents, returns SSE text ("event: X\ndata: {"type":X,"sequence_number":n,…}\n\n").
// start() sends response.created + response.in_progress and is implied by the first add();
// finish() ends with response.completed / response.incomplete / response.failed (no [DONE]).
class ResponsesStreamEncoder {
 public:
  ResponsesStreamEncoder(const recipe::GenerationRequest& request, ResponseMeta meta);
  ~ResponsesStreamEncoder();
  ResponsesStreamEncoder(const ResponsesStreamEncoder&) = delete;
  ResponsesStreamEncoder& operator=(const ResponsesStreamEncoder&) = delete;

  std::string start();
  std::string add(const recipe::OutputEvent& event);
  std::string finish(const recipe::Usage& usage);
  // An `error` event that ends the stream.
  std::string error(const ApiError& e);

  // The response object (status from the finish reason; in_progress before finish()).
  std::string response_json(const recipe::Usage& usage) const;
  const ResponseMeta& meta() const { return meta_; }

 private:
  struct Impl;
  ResponseMeta meta_;
  std::unique_ptr<Impl> impl_;
};

std::string build_responses_response(const recipe::GenerationRequest& request,
                                     const ResponseMeta& meta,
                                     const std::vector<recipe::OutputEvent>& events,
                                     const recipe::Usage& usage);

// "completed" / "incomplete" / "failed".
const char* responses_status(recipe::FinishReason f);

}  // namespace dsinfer::api
