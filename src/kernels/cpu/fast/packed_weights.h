// PackedWeights: the fast layout of each checkpoint weight, made on first use.
//
// F32 and BF16 weights are used in place (the mmap'ed checkpoint, no copy). FP8 E4M3 with UE8M0
// 128x128 block scales and MXFP4 (E2M1 with E8M0 per 32 inputs) are converted once to BF16:
// both are exact there (at most 3 mantissa bits times a power of two, within BF16's exponent
// range), so the fast path reads the checkpoint's values, not approximations. A weight whose
// conversion would round (e.g. FP8 with F32 block scales that are not powers of two, F16) is
// kept in F32 instead. Conversion is per matrix and lazy, so a model's memory grows only with
// the weights that are actually used (routed experts never selected stay unconverted); the
// converted copy is 2 bytes per weight (2x FP8, 4x MXFP4).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/fast/gemm.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cpu::fast {

class PackedWeights {
 public:
  PackedWeights() = default;
  PackedWeights(const PackedWeights&) = delete;
  PackedWeights& operator=(const PackedWeights&) = delete;

  // The fast view of `w` (converted on the first call for this weight). Thread-safe.
  WeightView get(const MatrixRef& w);
  // Bytes held by converted copies.
  int64_t converted_bytes() const;

 private:
  struct Entry {
    WeightView view;
    std::vector<uint16_t> bf16;
    std::vector<float> f32;
  };
  mutable std::mutex mu_;
  std::unordered_map<const void*, std::unique_ptr<Entry>> entries_;
  int64_t converted_bytes_ = 0;
};

// A fast view straight from the checkpoint when no conversion is needed (F32 or BF16 kFloat),
// else an empty view (data == nullptr).
WeightView direct_view(const MatrixRef& w);

}  // namespace dsinfer::cpu::fast
