// `--speculative` parsing.
#include "spec/config.h"

#include <charconv>

#include "base/strings.h"

namespace dsinfer::spec {

namespace {
Result<int32_t> parse_k(std::string_view text, std::string_view whole) {
  int32_t k = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, k);
  if (ec != std::errc() || p != end || k < 1 || k > kMaxDrafts) {
    return invalid_argument(str_format("--speculative %.*s: the number of drafts must be 1..%d",
                                       static_cast<int>(whole.size()),
                                       whole.data(),
                                       kMaxDrafts));
  }
  return k;
}
}  // namespace

Result<Config> parse_config(std::string_view text) {
  Config c;
  if (text == "off")
    return c;
  if (text == "auto") {
    c.mode = Mode::kAuto;
    c.k = kDefaultAutoMax;
    return c;
  }
  for (const auto& [prefix, mode] : {std::pair<std::string_view, Mode>{"fixed:", Mode::kFixed},
                                     std::pair<std::string_view, Mode>{"auto:", Mode::kAuto}}) {
    if (text.substr(0, prefix.size()) == prefix) {
      DSI_ASSIGN_OR_RETURN(c.k, parse_k(text.substr(prefix.size()), text));
      c.mode = mode;
      return c;
    }
  }
  return invalid_argument(str_format(
      "--speculative %.*s: expected off, auto, auto:K or fixed:K (K = number of drafts, 1..%d)",
      static_cast<int>(text.size()),
      text.data(),
      kMaxDrafts));
}

std::string to_string(const Config& c) {
  switch (c.mode) {
    case Mode::kOff:
      return "off";
    case Mode::kFixed:
      return str_format("fixed:%d", c.k);
    case Mode::kAuto:
      return c.k == kDefaultAutoMax ? std::string("auto") : str_format("auto:%d", c.k);
  }
  return "?";
}

}  // namespace dsinfer::spec
