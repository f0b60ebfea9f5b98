// EngramStore: host copies or in-place mapped Engram tables, gathered on a helper thread.
#include "backend/cpu_v41/engram_store.h"

#include <unistd.h>

#include <cstring>

#include "base/check.h"
#include "tensor/dtype.h"

namespace dsinfer::cpu_v41 {

const char* engram_placement_name(EngramPlacement p) {
  switch (p) {
    case EngramPlacement::kAuto:
      return "auto";
    case EngramPlacement::kHost:
      return "host";
    case EngramPlacement::kMapped:
      return "mapped";
    case EngramPlacement::kDevice:
      return "device";
  }
  return "?";
}

Result<EngramPlacement> parse_engram_placement(const std::string& s) {
  if (s == "auto")
    return EngramPlacement::kAuto;
  if (s == "host")
    return EngramPlacement::kHost;
  if (s == "mapped")
    return EngramPlacement::kMapped;
  if (s == "device")
    return EngramPlacement::kDevice;
  return invalid_argument("Engram placement must be auto, host, mapped or device, got `" + s + "`");
}

Status engram_device_needs_cuda() {
  return Status(StatusCode::kFailedPrecondition,
                "Engram placement `device` needs the CUDA V4.1 backend (--device cuda); on the CPU "
                "the tables live in host memory (host) or the checkpoint's memory map (mapped)");
}

namespace {
int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{8} << 30;
}
}  // namespace

Result<std::unique_ptr<EngramStore>> EngramStore::create(const model_v41::V41Config& c,
                                                         const model_v41::V41Weights& w,
                                                         const EngramStoreOptions& o) {
  if (o.host_budget_bytes < 0)
    return invalid_argument("Engram host memory budget must be >= 0");
  if (o.placement == EngramPlacement::kDevice)
    return engram_device_needs_cuda();
  std::unique_ptr<EngramStore> s(new EngramStore());
  s->dim_ = c.engram_head_dim;
  int64_t budget = o.host_budget_bytes > 0 ? o.host_budget_bytes : physical_memory_bytes() / 2;
  for (int l : c.engram_layer_ids) {
    const model_v41::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    if (!lw.has_engram || lw.engram.table.data == nullptr) {
      return Status(StatusCode::kNotFound,
                    "missing Engram table for Engram layer " + std::to_string(l) +
                        " (engram_layer_ids lists it; the checkpoint bound none)");
    }
    const model_v41::EngramTable& t = lw.engram.table;
    Table tab;
    tab.view = t;
    const int64_t elem = t.fp8 ? 1 : dtype_size(static_cast<DType>(t.data_dtype));
    const int64_t data_bytes = t.rows * t.dim * elem;
    const int64_t scale_bytes = t.fp8 ? t.rows * (t.dim / 32) : 0;
    tab.bytes = data_bytes + scale_bytes;
    bool host = o.placement == EngramPlacement::kHost;
    if (o.placement == EngramPlacement::kAuto && tab.bytes <= budget) {
      host = true;
      budget -= tab.bytes;
    }
    if (host) {
      tab.where = EngramPlacement::kHost;
      tab.data.resize(static_cast<size_t>(data_bytes));
      std::memcpy(tab.data.data(), t.data, static_cast<size_t>(data_bytes));
      if (scale_bytes > 0) {
        tab.scale.resize(static_cast<size_t>(scale_bytes));
        std::memcpy(tab.scale.data(), t.scale, static_cast<size_t>(scale_bytes));
      }
    } else {
      tab.where = EngramPlacement::kMapped;
    }
    s->tables_.push_back(std::move(tab));
  }
  // Views of the host copies (after the vector stopped moving).
  for (Table& tab : s->tables_) {
    if (tab.where == EngramPlacement::kHost) {
      tab.view.data = tab.data.data();
      tab.view.scale = tab.scale.empty() ? nullptr : tab.scale.data();
    }
  }
  return s;
}

int64_t EngramStore::host_bytes() const {
  int64_t b = 0;
  for (const Table& t : tables_) b += t.where == EngramPlacement::kHost ? t.bytes : 0;
  return b;
}

void EngramStore::gather(int table, std::span<const int64_t> rows, float* out) const {
  const model_v41::EngramTable& t = tables_[static_cast<size_t>(table)].view;
  for (size_t i = 0; i < rows.size(); ++i) {
    DSI_CHECK(rows[i] >= 0 && rows[i] < t.rows,
              "Engram row %lld outside [0, %lld)",
              static_cast<long long>(rows[i]),
              static_cast<long long>(t.rows));
    t.row(rows[i], out + static_cast<int64_t>(i) * dim_);
  }
}

EngramStore::Pending EngramStore::gather_async(std::vector<std::vector<int64_t>> rows) const {
  DSI_CHECK(rows.size() == tables_.size(),
            "gather_async with %zu row lists for %zu tables",
            rows.size(),
            tables_.size());
  Pending p;
  p.out_ = std::make_shared<std::vector<std::vector<float>>>(rows.size());
  auto promises = std::make_shared<std::vector<std::promise<void>>>(rows.size());
  for (auto& pr : *promises) p.ready_.push_back(pr.get_future().share());
  if (rows.empty())
    return p;
  p.worker_ =
      std::async(std::launch::async, [this, rows = std::move(rows), out = p.out_, promises] {
        for (size_t t = 0; t < rows.size(); ++t) {
          (*out)[t].resize(rows[t].size() * static_cast<size_t>(dim_));
          gather(static_cast<int>(t), rows[t], (*out)[t].data());
          (*promises)[t].set_value();
        }
      }).share();
  return p;
}

const std::vector<float>& EngramStore::Pending::wait(int table) {
  ready_[static_cast<size_t>(table)].wait();
  return (*out_)[static_cast<size_t>(table)];
}

}  // namespace dsinfer::cpu_v41
