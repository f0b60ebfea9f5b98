// Model::forward for backends whose forward is their forward_batch: the one sequence as a batch of
// one item (its per-item status returned; a batch failure first).
#pragma once

#include <cstdint>
#include <span>

#include "backend/model.h"

namespace dsinfer::backend {

inline Status forward_as_batch(Model& m,
                               state::SequenceState& st,
                               std::span<const int32_t> tokens,
                               const ForwardOptions& options,
                               ForwardOutputs* out) {
  ForwardItem item;
  item.state = &st;
  item.tokens = tokens;
  item.options = options;
  item.out = out;
  DSI_RETURN_IF_ERROR(m.forward_batch(std::span<ForwardItem>(&item, 1)));
  return item.status;
}

}  // namespace dsinfer::backend
