// Status and Result<T>: expected failures (bad input, missing file, I/O) as values.
// No exceptions cross module boundaries; callers propagate with DSI_RETURN_IF_ERROR /
// DSI_ASSIGN_OR_RETURN.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "base/check.h"

namespace dsinfer {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad user input (flags, request fields, ids)
  kNotFound,         // missing file / tensor / field
  kDataLoss,         // truncated or corrupted file
  kFailedPrecondition,
  kUnimplemented,
  kResourceExhausted,
  kIoError,
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "code: message"
  std::string to_string() const;
  // Returns a copy with `context + ": "` prepended to the message.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status not_found(std::string m) {
  return Status(StatusCode::kNotFound, std::move(m));
}
inline Status data_loss(std::string m) {
  return Status(StatusCode::kDataLoss, std::move(m));
}
inline Status io_error(std::string m) {
  return Status(StatusCode::kIoError, std::move(m));
}
inline Status unimplemented(std::string m) {
  return Status(StatusCode::kUnimplemented, std::move(m));
}
inline Status failed_precondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    DSI_CHECK(!std::get<Status>(v_).ok(), "Result constructed from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    DSI_CHECK(ok(), "Result::value() on error: %s", std::get<Status>(v_).to_string().c_str());
    return std::get<T>(v_);
  }
  const T& value() const& {
    DSI_CHECK(ok(), "Result::value() on error: %s", std::get<Status>(v_).to_string().c_str());
    return std::get<T>(v_);
  }
  T&& value() && {
    DSI_CHECK(ok(), "Result::value() on error: %s", std::get<Status>(v_).to_string().c_str());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace dsinfer

#define DSI_CONCAT_INNER_(a, b) a##b
#define DSI_CONCAT_(a, b) DSI_CONCAT_INNER_(a, b)

#define DSI_RETURN_IF_ERROR(expr)           \
  do {                                      \
    ::dsinfer::Status dsi_status_ = (expr); \
    if (!dsi_status_.ok())                  \
      return dsi_status_;                   \
  } while (0)

#define DSI_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok())                                   \
    return tmp.status();                           \
  lhs = std::move(tmp).value()

#define DSI_ASSIGN_OR_RETURN(lhs, expr) \
  DSI_ASSIGN_OR_RETURN_IMPL_(DSI_CONCAT_(dsi_result_, __LINE__), lhs, expr)
