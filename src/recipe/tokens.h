// DeepSeek V4 / V4.1 special-token strings (spec recipe §1.2). The bars are U+FF5C, the
// underscores U+2581; copy byte-exact.
#pragma once

#include <string_view>

namespace dsinfer::recipe::tok {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kSystem = "<｜System｜>";  // V4.1 only
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
inline constexpr std::string_view kDsmlAscii = "|DSML|";  // malformed variant seen in the wild

}  // namespace dsinfer::recipe::tok
