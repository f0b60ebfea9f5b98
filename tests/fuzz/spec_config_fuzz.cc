// libFuzzer: spec::parse_config (`--speculative`) on arbitrary text; an accepted setting has a
// draft count in range and survives to_string -> parse_config unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "spec/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto r = dsinfer::spec::parse_config(text);
  if (!r.ok())
    return 0;
  const dsinfer::spec::Config& c = *r;
  if (c.mode != dsinfer::spec::Mode::kOff && (c.k < 1 || c.k > dsinfer::spec::kMaxDrafts))
    __builtin_trap();
  auto again = dsinfer::spec::parse_config(dsinfer::spec::to_string(c));
  if (!again.ok() || again->mode != c.mode || again->k != c.k)
    __builtin_trap();
  return 0;
}
