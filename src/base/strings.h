// printf-style string formatting (GCC 12 has no std::format) and small string helpers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsinfer {

std::string str_format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::vector<std::string> str_split(const std::string& s, char sep);
bool str_starts_with(const std::string& s, const std::string& prefix);
bool str_ends_with(const std::string& s, const std::string& suffix);
// "1.5 MiB" style.
std::string human_bytes(uint64_t bytes);

}  // namespace dsinfer
