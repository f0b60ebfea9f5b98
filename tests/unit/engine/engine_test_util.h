// Helpers shared by the CPU engine tests and the CUDA engine test: the golden fixture model and a
// token mask (engine::TokenMask).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "engine/request.h"
#include "model/checkpoint.h"

namespace dsinfer::engine::test_support {

// tests/fixtures/tiny-a (official layout), opened once.
inline std::shared_ptr<const model::Checkpoint> tiny_fixture() {
  static std::shared_ptr<const model::Checkpoint> ckpt = [] {
    auto r =
        model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::shared_ptr<const model::Checkpoint>(std::move(r).value());
  }();
  return ckpt;
}

// A mask whose allowed set depends on how many tokens it has accepted (the n-th token must be
// n mod 3, mod 3), as a grammar's does: a mask asked at the wrong time, asked twice for one
// token, or not told about one, shows in the output.
class PositionalMask : public TokenMask {
 public:
  bool fill(std::span<uint32_t> bits) override {
    for (size_t t = 0; t < bits.size() * 32; ++t) {
      if (static_cast<int64_t>(t % 3) == accepted_ % 3)
        bits[t / 32] |= 1u << (t % 32);
    }
    return true;
  }
  void accept(int32_t) override { ++accepted_; }

 private:
  int64_t accepted_ = 0;
};

}  // namespace dsinfer::engine::test_support
