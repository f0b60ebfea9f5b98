// The protocol side of a generation request, independent of HTTP: request body -> decoded
// GenerationRequest -> rendered and tokenized prompt -> limits -> engine Job; and OutputEvents
// -> the protocol's SSE frames or response object (a facade over src/api's three encoders).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/chat.h"
#include "api/error.h"
#include "api/messages.h"
#include "api/options.h"
#include "api/responses.h"
#include "grammar/grammar.h"
#include "recipe/types.h"
#include "server/engine_loop.h"
#include "server/generation.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::server {

enum class Endpoint { kChat, kResponses, kMessages };
// Route label (metrics, logs): "/v1/chat/completions", "/v1/responses", "/v1/messages".
const char* endpoint_label(Endpoint e);

struct ServingContext {
  const tokenizer::Tokenizer* tokenizer = nullptr;
  recipe::ModelVersion version = recipe::ModelVersion::kV4;
  api::DecodeOptions decode;      // served model names, output-token cap
  int64_t max_context = 0;        // prompt + generated tokens
  int64_t max_prompt_tokens = 0;  // <= max_context
  // Cheap bound before tokenizing: a rendered prompt longer than this many bytes cannot fit
  // in max_prompt_tokens (see prompt_byte_limit()); 0 = none.
  size_t max_prompt_bytes = 0;
  double request_timeout_s = 0;               // 0 = none
  const ScriptedOutputs* scripted = nullptr;  // test-only
  // Structured outputs (grammars compiled on the preparing thread, cached); nullptr: requests
  // asking for them get a 400.
  grammar::Compiler* grammar = nullptr;
};

// The byte bound for ServingContext::max_prompt_bytes: max_prompt_tokens times the longest
// token's bytes, times 4 for normalizers that shrink text (a prompt over it cannot fit).
size_t prompt_byte_limit(const tokenizer::Tokenizer& tok, int64_t max_prompt_tokens);

struct PreparedRequest {
  recipe::GenerationRequest request;
  Job job;  // choice 0
  // n > 1 (or best_of > 1): choices 1..max(n, best_of)-1 (seed + i, same prompt)
  std::vector<Job> more_choices;
};

// Decodes, renders the DeepSeek prompt, tokenizes, applies the prompt-length and output limits
// and builds the engine request (sampling seed: the request's, else `default_seed`; with n > 1,
// choice i gets that seed + i). Every
// failure is the protocol's 4xx naming the problem.
api::ApiResult<PreparedRequest> prepare_request(Endpoint endpoint,
                                                std::string_view body,
                                                const ServingContext& ctx,
                                                uint64_t default_seed);

// The protocol's error body (Anthropic shape for Messages, OpenAI shape otherwise).
std::string render_error(Endpoint endpoint, const api::ApiError& e);
// A rejection by the engine (validation on submit) as an API error (400, or 503 on shutdown).
api::ApiError rejection_error(const Status& s);
// The error to report for a request that did not complete (timeout 504, shutdown 503, engine
// error 500); nullopt when it completed (or the client is gone).
std::optional<api::ApiError> completion_error(const Completion& c);

// One response in its protocol: SSE frames when streaming, the response object otherwise.
class ProtocolEncoder {
 public:
  ProtocolEncoder(Endpoint endpoint,
                  const recipe::GenerationRequest& request,
                  const api::ResponseMeta& meta);
  ~ProtocolEncoder();
  ProtocolEncoder(const ProtocolEncoder&) = delete;
  ProtocolEncoder& operator=(const ProtocolEncoder&) = delete;

  // The opening frames; Messages' message_start carries the prompt usage.
  std::string start(const recipe::Usage& prompt_usage);
  // `choice`: which of the request's `n` choices the events belong to (Chat; 0 elsewhere).
  std::string add(const std::vector<recipe::OutputEvent>& events, size_t choice = 0);
  // n > 1, streaming: the choice's finish chunk, once it is done.
  std::string finish_choice(size_t choice);
  // The end of the response (every choice done); `usage` summed over the choices.
  std::string finish(const recipe::Usage& usage);
  std::string error(const api::ApiError& e);
  std::string response_json(const recipe::Usage& usage) const;
  // best_of > n, once every choice finished: response_json() returns the n choices of highest
  // cumulative logprob, best first, numbered from 0 (no-op otherwise).
  void keep_best(const std::vector<std::optional<Completion>>& finished);
  size_t choices() const { return chats_.empty() ? 1 : chats_.size(); }

 private:
  std::vector<std::unique_ptr<api::ChatStreamEncoder>> chats_;  // one per choice
  std::vector<size_t> selected_;                                // best_of's choices
  int32_t n_ = 1;
  int32_t best_of_ = 0;
  std::unique_ptr<api::ResponsesStreamEncoder> responses_;
  std::unique_ptr<api::MessagesStreamEncoder> messages_;
};

}  // namespace dsinfer::server
