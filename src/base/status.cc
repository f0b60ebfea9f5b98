// Status formatting and the abort path of DSI_CHECK.
#include "base/status.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace dsinfer {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kDataLoss:
      return "data loss";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kIoError:
      return "i/o error";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok())
    return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (ok())
    return *this;
  return Status(code_, context + ": " + message_);
}

namespace detail {
void check_failed(const char* file, int line, const char* cond, const char* fmt, ...) {
  std::fprintf(stderr, "dsinfer: CHECK failed at %s:%d: %s\n  ", file, line, cond);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace dsinfer
