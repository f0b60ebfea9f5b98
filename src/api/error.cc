#include "api/error.h"

#include "api/detail/common.h"

namespace dsinfer::api {

using detail::Json;

ApiError invalid_request(std::string param, std::string message) {
  ApiError e;
  e.http_status = 400;
  e.type = "invalid_request_error";
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError internal_error(std::string message) {
  ApiError e;
  e.http_status = 500;
  e.type = "internal_error";
  e.message = std::move(message);
  return e;
}

namespace {

// Messages may quote request values; the decoders cut those, and this caps the whole message so
// an error body never echoes a huge user string.
constexpr size_t kMaxMessageBytes = 2048;

std::string capped(const std::string& message) {
  if (message.size() <= kMaxMessageBytes)
    return message;
  size_t n = kMaxMessageBytes;
  while (n > 0 && (static_cast<unsigned char>(message[n]) & 0xC0) == 0x80) --n;
  return message.substr(0, n) + "...";
}

}  // namespace

std::string render_openai_error(const ApiError& e) {
  Json err = Json::object();
  err["message"] = capped(e.message);
  err["type"] = e.type;
  err["param"] = e.param.empty() ? Json(nullptr) : Json(e.param);
  err["code"] = e.code.empty() ? e.type : e.code;
  Json body = Json::object();
  body["error"] = std::move(err);
  return detail::dump(body);
}

std::string anthropic_error_type(const ApiError& e) {
  switch (e.http_status) {
    case 400:
    case 405:
    case 408:
    case 415:
    case 422:
    case 431:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 402:
      return "billing_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return "api_error";
  }
}

std::string render_anthropic_error(const ApiError& e) {
  Json err = Json::object();
  err["type"] = anthropic_error_type(e);
  err["message"] = capped(e.message);
  Json body = Json::object();
  body["type"] = "error";
  body["error"] = std::move(err);
  return detail::dump(body);
}

}  // namespace dsinfer::api
