// Always-on invariant checks. A failed DSI_CHECK is a bug: it prints file:line and aborts.
// Expected failures (bad input) must use Status instead (base/status.h).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace dsinfer::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
}  // namespace dsinfer::detail

#define DSI_CHECK(cond, ...)                                                   \
  do {                                                                         \
    if (__builtin_expect(!(cond), 0)) {                                        \
      ::dsinfer::detail::check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__); \
    }                                                                          \
  } while (0)

#ifdef NDEBUG
#define DSI_DCHECK(cond, ...) \
  do {                        \
  } while (0)
#else
#define DSI_DCHECK(cond, ...) DSI_CHECK(cond, __VA_ARGS__)
#endif
