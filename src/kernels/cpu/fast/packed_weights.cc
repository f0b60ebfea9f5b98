// PackedWeights: lazy, exact conversion of quantised weights to BF16.
#include "kernels/cpu/fast/packed_weights.h"

#include <cstring>

#include "base/check.h"

namespace dsinfer::cpu::fast {

WeightView direct_view(const MatrixRef& w) {
  WeightView v;
  if (w.format != WeightFormat::kFloat)
    return v;
  if (w.dtype == DType::kF32) {
    v.elem = WeightElem::kF32;
  } else if (w.dtype == DType::kBF16) {
    v.elem = WeightElem::kBF16;
  } else {
    return v;
  }
  v.data = w.data;
  v.rows = w.rows;
  v.cols = w.cols;
  v.ld = w.cols;
  return v;
}

WeightView PackedWeights::get(const MatrixRef& w) {
  DSI_CHECK(!w.empty(), "packing an unbound weight");
  if (WeightView v = direct_view(w); v.data)
    return v;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(w.data);
  if (it != entries_.end())
    return it->second->view;
  auto e = std::make_unique<Entry>();
  const size_t count = static_cast<size_t>(w.rows * w.cols);
  std::vector<float> row(static_cast<size_t>(w.cols));
  e->bf16.resize(count);
  bool exact = true;
  for (int64_t r = 0; r < w.rows && exact; ++r) {
    w.dequant_row(r, row.data());
    uint16_t* dst = e->bf16.data() + r * w.cols;
    for (int64_t c = 0; c < w.cols; ++c) {
      uint32_t bits;
      std::memcpy(&bits, &row[static_cast<size_t>(c)], sizeof bits);
      if ((bits & 0xFFFFu) != 0) {  // needs more than BF16's 7 mantissa bits
        exact = false;
        break;
      }
      dst[c] = static_cast<uint16_t>(bits >> 16);
    }
  }
  e->view.rows = w.rows;
  e->view.cols = w.cols;
  e->view.ld = w.cols;
  if (exact) {
    e->view.elem = WeightElem::kBF16;
    e->view.data = e->bf16.data();
    converted_bytes_ += static_cast<int64_t>(count * sizeof(uint16_t));
  } else {
    e->bf16 = {};
    e->f32.resize(count);
    for (int64_t r = 0; r < w.rows; ++r) w.dequant_row(r, e->f32.data() + r * w.cols);
    e->view.elem = WeightElem::kF32;
    e->view.data = e->f32.data();
    converted_bytes_ += static_cast<int64_t>(count * sizeof(float));
  }
  const WeightView v = e->view;
  entries_.emplace(w.data, std::move(e));
  return v;
}

int64_t PackedWeights::converted_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return converted_bytes_;
}

}  // namespace dsinfer::cpu::fast
