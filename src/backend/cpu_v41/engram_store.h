// EngramStore: V4.1's Engram tables (spec deepseek-v41.md §4) off the model's weight path. Each
// table is either copied into host memory owned by the store (kHost; pinned host memory is the
// CUDA backend's later variant) or read in place from the checkpoint's memory map (kMapped: the
// ~94 GiB-per-table case that does not fit in RAM; the kernel pages rows in on demand). kAuto
// copies the tables that fit in the host budget, in layer order, and maps the rest. kDevice is
// the CUDA V4.1 backend's placement (the tables uploaded to GPU memory, gathered there); the store
// itself refuses it (the CUDA backend opens its store mapped and reads the tables from the map
// once, at upload).
//
// A forward hashes every Engram row address of the chunk before layer 0 and hands them to
// gather_async(), which dequantises the rows of all Engram layers on a helper thread while the
// first layers run; the Engram site of layer L waits only for its own table's rows.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model_v41/config.h"
#include "model_v41/weights.h"

namespace dsinfer::cpu_v41 {

enum class EngramPlacement { kAuto, kHost, kMapped, kDevice };
const char* engram_placement_name(EngramPlacement p);  // "auto", "host", "mapped", "device"
// The --engram-placement spellings; errors name the value.
Result<EngramPlacement> parse_engram_placement(const std::string& s);
// The error of kDevice anywhere but the CUDA V4.1 backend (FailedPrecondition).
Status engram_device_needs_cuda();

struct EngramStoreOptions {
  EngramPlacement placement = EngramPlacement::kAuto;
  // kAuto: bytes of host memory the copied tables may take; 0 = half the machine's memory.
  int64_t host_budget_bytes = 0;
};

class EngramStore {
 public:
  // Over the Engram tables bound in `w` (one per engram_layer_ids entry, in that order).
  static Result<std::unique_ptr<EngramStore>> create(const model_v41::V41Config& c,
                                                     const model_v41::V41Weights& w,
                                                     const EngramStoreOptions& o);

  int num_tables() const { return static_cast<int>(tables_.size()); }
  EngramPlacement placement(int table) const { return tables_[static_cast<size_t>(table)].where; }
  int64_t table_bytes(int table) const { return tables_[static_cast<size_t>(table)].bytes; }
  int64_t host_bytes() const;  // bytes copied into host memory
  int64_t dim() const { return dim_; }

  // Rows `rows` of table `table`, dequantised to fp32: out[i * dim, (i + 1) * dim).
  void gather(int table, std::span<const int64_t> rows, float* out) const;

  // The rows of every table for a chunk: rows[table] = the row ids of its tokens (hash columns
  // per token, token-major). Gathered on a helper thread; wait(table) blocks until that
  // table's rows are ready and returns them ([rows[table].size(), dim]).
  class Pending {
   public:
    const std::vector<float>& wait(int table);

   private:
    friend class EngramStore;
    std::vector<std::shared_future<void>> ready_;
    std::shared_ptr<std::vector<std::vector<float>>> out_;
    std::shared_future<void> worker_;  // the helper thread (joined when the last copy goes)
  };
  Pending gather_async(std::vector<std::vector<int64_t>> rows) const;

 private:
  struct Table {
    EngramPlacement where = EngramPlacement::kMapped;
    int64_t bytes = 0;
    model_v41::EngramTable view;  // reads from the map or from `data` / `scale`
    std::vector<uint8_t> data;    // kHost copies
    std::vector<uint8_t> scale;
  };
  EngramStore() = default;
  std::vector<Table> tables_;
  int64_t dim_ = 0;
};

}  // namespace dsinfer::cpu_v41
