// API errors as values: every decoder failure is an ApiError, rendered in the protocol's own
// error body shape. Nothing in src/api throws.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "base/check.h"

namespace dsinfer::api {

struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";  // OpenAI `type` (Anthropic type derives from it)
  std::string message;
  std::string param;  // offending field, OpenAI path style ("messages[1].role"); empty: none
  std::string code;   // OpenAI `code`; empty: same as `type`
};

// 400 invalid_request_error naming `param`.
ApiError invalid_request(std::string param, std::string message);
// 500 internal_error.
ApiError internal_error(std::string message);

// {"error":{"message":…,"type":…,"param":…|null,"code":…}} (Chat Completions and Responses).
std::string render_openai_error(const ApiError& e);
// {"type":"error","error":{"type":…,"message":…}} (Anthropic Messages).
std::string render_anthropic_error(const ApiError& e);
// The Anthropic error type for an error ("invalid_request_error", "api_error", …).
std::string anthropic_error_type(const ApiError& e);

// Either a value or an ApiError.
template <typename T>
class [[nodiscard]] ApiResult {
 public:
  ApiResult(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  ApiResult(ApiError error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  const ApiError& error() const {
    DSI_CHECK(!ok(), "ApiResult::error() on a value");
    return std::get<ApiError>(v_);
  }
  T& value() & {
    DSI_CHECK(ok(), "ApiResult::value() on error: %s", std::get<ApiError>(v_).message.c_str());
    return std::get<T>(v_);
  }
  const T& value() const& {
    DSI_CHECK(ok(), "ApiResult::value() on error: %s", std::get<ApiError>(v_).message.c_str());
    return std::get<T>(v_);
  }
  T&& value() && {
    DSI_CHECK(ok(), "ApiResult::value() on error: %s", std::get<ApiError>(v_).message.c_str());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, ApiError> v_;
};

}  // namespace dsinfer::api
