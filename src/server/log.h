// Server logging: one line per record on stderr, "2026-05-01T12:00:00.123Z INFO  message".
// Records carry sizes, ids and timings only; prompt and completion text is never logged.
#pragma once

namespace dsinfer::server {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
// "debug" | "info" | "warn" | "error" | "off"; false for anything else.
bool parse_log_level(const char* s, LogLevel* out);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace dsinfer::server

#define DSI_SERVER_LOG(level, ...)                                                     \
  do {                                                                                 \
    if (static_cast<int>(level) >= static_cast<int>(::dsinfer::server::log_level())) { \
      ::dsinfer::server::log_message(level, __VA_ARGS__);                              \
    }                                                                                  \
  } while (0)
#define DSI_LOG_DEBUG(...) DSI_SERVER_LOG(::dsinfer::server::LogLevel::kDebug, __VA_ARGS__)
#define DSI_LOG_INFO(...) DSI_SERVER_LOG(::dsinfer::server::LogLevel::kInfo, __VA_ARGS__)
#define DSI_LOG_WARN(...) DSI_SERVER_LOG(::dsinfer::server::LogLevel::kWarn, __VA_ARGS__)
#define DSI_LOG_ERROR(...) DSI_SERVER_LOG(::dsinfer::server::LogLevel::kError, __VA_ARGS__)
