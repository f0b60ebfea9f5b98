// libFuzzer: restore_state of arbitrary bytes into fresh sequences: one of the V4 fixture model
// (version 1 images) and two of the V4.1 fixture's layout (version 2 images: token history, the
// whole state as exact prefill stores it, and bounded replay's images that leave out the consumer
// and DSpark rings and the compressor rows). Each restore either is rejected (and the sequence
// stays fresh) or the restored state passes the integrity checker and captures back to the same
// bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "backend/cpu_v41/model.h"
#include "base/file.h"
#include "model/config.h"
#include "model_v41/config.h"
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

const model_v41::V41Config& v41_config() {
  static const model_v41::V41Config c = [] {
    auto r = model_v41::load_v41_config(std::string(DSI_SOURCE_DIR) +
                                        "/tests/fixtures/v41-tiny/official/config.json");
    if (!r.ok())
      __builtin_trap();
    return *r;
  }();
  return c;
}

// Bounded replay's image options for the V4.1 fixture (as V41Backend::prefix_cache_layout).
state::ImageOptions replay_options(const state::StateShape& shape, int boundary) {
  state::ImageOptions o;
  o.skip_compressor_rows = true;
  o.skip_rings.assign(shape.layers.size() + static_cast<size_t>(shape.extra_rings), 1);
  for (int i = 0; i < boundary; ++i) o.skip_rings[static_cast<size_t>(i)] = 0;
  return o;
}

// Restores `image` into `st`; rejected -> still fresh, accepted -> consistent and canonical.
void check(state::PageArena& arena,
           state::SequenceState& st,
           std::string_view image,
           const state::ImageOptions& options) {
  const int64_t floats = arena.page_floats();
  state::PageWriter write = [&](std::span<const int32_t> pages, const float* src) {
    for (size_t i = 0; i < pages.size(); ++i)
      std::memcpy(arena.page(pages[i]), src + i * floats, floats * 4);
    return Status();
  };
  state::PageReader read = [&](std::span<const int32_t> pages, float* dst) {
    for (size_t i = 0; i < pages.size(); ++i)
      std::memcpy(dst + i * floats, arena.page(pages[i]), floats * 4);
    return Status();
  };
  const Status s = state::restore_state(image, st, write, options);
  st.check_integrity();
  arena.check_integrity();
  if (!s.ok()) {
    if (st.num_tokens() != 0)
      __builtin_trap();
    return;
  }
  auto again = state::capture_state(st, read, options);
  if (!again.ok() || *again != image)
    __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view image(reinterpret_cast<const char*>(data), size);
  {
    const auto& mc = config();
    auto arena = state::PageArena::growable(state::min_page_bytes(mc));
    state::SequenceState st(mc, arena.get(), 1, 0);
    if (!st.ok())
      __builtin_trap();
    check(*arena, st, image, {});
  }
  const auto& vc = v41_config();
  static const state::StateShape shape = cpu_v41::v41_state_shape(vc);
  static const state::ImageOptions replay = replay_options(shape, vc.yoco_boundary);
  for (const state::ImageOptions* o : {static_cast<const state::ImageOptions*>(nullptr), &replay}) {
    auto arena = state::PageArena::growable(state::min_page_bytes(shape));
    state::SequenceState st(shape, arena.get(), 1);
    if (!st.ok())
      __builtin_trap();
    check(*arena, st, image, o ? *o : state::ImageOptions());
  }
  return 0;
}
