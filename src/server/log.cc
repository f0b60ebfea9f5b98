#include "server/log.h"

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace dsinfer::server {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO ";
    case LogLevel::kWarn:
      return "WARN ";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kOff:
      break;
  }
  return "?    ";
}
}  // namespace

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level));
}

LogLevel log_level() {
  return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed));
}

bool parse_log_level(const char* s, LogLevel* out) {
  static const struct {
    const char* name;
    LogLevel level;
  } kLevels[] = {{"debug", LogLevel::kDebug},
                 {"info", LogLevel::kInfo},
                 {"warn", LogLevel::kWarn},
                 {"error", LogLevel::kError},
                 {"off", LogLevel::kOff}};
  for (const auto& l : kLevels) {
    if (std::strcmp(s, l.name) == 0) {
      *out = l.level;
      return true;
    }
  }
  return false;
}

void log_message(LogLevel level, const char* fmt, ...) {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t t = system_clock::to_time_t(now);
  const auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char line[2048];
  int n = static_cast<int>(std::strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm));
  n += std::snprintf(line + n,
                     sizeof(line) - static_cast<size_t>(n),
                     ".%03dZ %s ",
                     static_cast<int>(ms),
                     level_name(level));
  va_list ap;
  va_start(ap, fmt);
  const int m = std::vsnprintf(line + n, sizeof(line) - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m > 0 ? static_cast<size_t>(m) : 0);
  if (len > sizeof(line) - 2)
    len = sizeof(line) - 2;
  line[len] = '\n';
  std::fwrite(line, 1, len + 1, stderr);  // one write per record: lines never interleave
}

}  // namespace dsinfer::server
