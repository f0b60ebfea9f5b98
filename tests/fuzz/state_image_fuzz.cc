// libFuzzer: restore_state of arbitrary bytes into a fresh sequence of the fixture model. Either
// it is rejected (and the sequence stays fresh) or the restored state passes the integrity
// checker and captures back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "base/file.h"
#include "model/config.h"
#include "state/sequence_state.h"

using namespace dsinfer;

namespace {
const model::ModelConfig& config() {
  static const model::ModelConfig c = [] {
    const std::string path =
        std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official/config.json";
    auto text = read_text_file(path, 1 << 20);
    if (!text.ok())
      __builtin_trap();
    auto r = model::parse_model_config(*text, path);
    if (!r.ok())
      __builtin_trap();
    return *r;
  }();
  return c;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& mc = config();
  auto arena = state::PageArena::growable(state::min_page_bytes(mc));
  state::SequenceState st(mc, arena.get(), 1, 0);
  if (!st.ok())
    __builtin_trap();
  const int64_t floats = arena->page_floats();
  state::PageWriter write = [&](std::span<const int32_t> pages, const float* src) {
    for (size_t i = 0; i < pages.size(); ++i)
      std::memcpy(arena->page(pages[i]), src + i * floats, floats * 4);
    return Status();
  };
  state::PageReader read = [&](std::span<const int32_t> pages, float* dst) {
    for (size_t i = 0; i < pages.size(); ++i)
      std::memcpy(dst + i * floats, arena->page(pages[i]), floats * 4);
    return Status();
  };
  const std::string_view image(reinterpret_cast<const char*>(data), size);
  const Status s = state::restore_state(image, st, write);
  st.check_integrity();
  arena->check_integrity();
  if (!s.ok()) {
    if (st.num_tokens() != 0)
      __builtin_trap();
    return 0;
  }
  auto again = state::capture_state(st, read);
  if (!again.ok() || *again != image)
    __builtin_trap();
  return 0;
}
