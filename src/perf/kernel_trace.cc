// CUPTI activity records of kernels (kernel_trace.h), with libcupti loaded by dlopen.
#include "perf/kernel_trace.h"

#include <cupti_activity.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace dsinfer::perf {
namespace {

// The kernel's source-level name (CUPTI reports the mangled symbol); the symbol when it does not
// demangle (extern "C" kernels).
std::string demangled(const char* symbol) {
  if (symbol == nullptr)
    return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : symbol;
  std::free(d);
  return out;
}

struct Row {
  std::string name;
  uint64_t start = 0, end = 0;
  uint32_t stream = 0, correlation = 0, graph = 0;
  uint64_t graph_node = 0;
  int32_t grid[3] = {}, block[3] = {};
};

// The CUPTI entry points this file uses.
struct Cupti {
  void* lib = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc,
                                    CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
};

struct Trace {
  std::mutex mu;
  std::vector<Row> rows;
  Cupti api;
  bool loaded = false;
  bool active = false;
  int ranges = 0;  // ranges written
};

Trace& trace() {
  static Trace t;
  return t;
}

constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Trace& t = trace();
  std::vector<Row> got;
  CUpti_Activity* record = nullptr;
  while (t.api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    Row r;
    r.name = k->name != nullptr ? k->name : "";  // demangled when written (off the callback)
    r.start = k->start;
    r.end = k->end;
    r.stream = k->streamId;
    r.correlation = k->correlationId;
    r.graph = k->graphId;
    r.graph_node = k->graphNodeId;
    r.grid[0] = k->gridX;
    r.grid[1] = k->gridY;
    r.grid[2] = k->gridZ;
    r.block[0] = k->blockX;
    r.block[1] = k->blockY;
    r.block[2] = k->blockZ;
    got.push_back(std::move(r));
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(t.mu);
  for (Row& r : got) t.rows.push_back(std::move(r));
}

template <typename F>
bool bind(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

Status load(Cupti* api) {
  std::vector<std::string> names;
  if (const char* env = std::getenv("DSINFER_CUPTI_LIB"); env != nullptr && *env != '\0')
    names.emplace_back(env);
  for (const char* n : {"libcupti.so",
                        "libcupti.so.13",
                        "libcupti.so.12",
                        "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so",
                        "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"})
    names.emplace_back(n);
  for (const std::string& n : names) {
    api->lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api->lib != nullptr)
      break;
  }
  if (api->lib == nullptr)
    return not_found(
        "DSINFER_KERNEL_TRACE: libcupti not found (set DSINFER_CUPTI_LIB to its path)");
  if (!bind(api->lib, "cuptiActivityRegisterCallbacks", &api->register_callbacks) ||
      !bind(api->lib, "cuptiActivityEnable", &api->enable) ||
      !bind(api->lib, "cuptiActivityDisable", &api->disable) ||
      !bind(api->lib, "cuptiActivityFlushAll", &api->flush_all) ||
      !bind(api->lib, "cuptiActivityGetNextRecord", &api->next_record))
    return failed_precondition("DSINFER_KERNEL_TRACE: libcupti lacks the activity API");
  return Status();
}

const char* path() {
  const char* p = std::getenv("DSINFER_KERNEL_TRACE");
  return p != nullptr && *p != '\0' ? p : nullptr;
}

}  // namespace

bool kernel_trace_requested() {
  return path() != nullptr;
}

Status kernel_trace_begin() {
  if (!kernel_trace_requested())
    return Status();
  Trace& t = trace();
  if (!t.loaded) {
    DSI_RETURN_IF_ERROR(load(&t.api));
    if (t.api.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS)
      return failed_precondition("DSINFER_KERNEL_TRACE: CUPTI refused the activity buffers");
    t.loaded = true;
  }
  if (t.api.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
    return failed_precondition("DSINFER_KERNEL_TRACE: CUPTI cannot record kernels here");
  t.active = true;
  return Status();
}

Status kernel_trace_end() {
  Trace& t = trace();
  if (!kernel_trace_requested() || !t.active)
    return Status();
  t.active = false;
  t.api.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  t.api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    rows.swap(t.rows);
  }
  // The first range of the process truncates the file and writes the header, later ones append.
  const int range = ++t.ranges;
  FILE* f = std::fopen(path(), range == 1 ? "w" : "a");
  if (f == nullptr)
    return io_error(std::string("DSINFER_KERNEL_TRACE: cannot write ") + path());
  if (range == 1)
    std::fprintf(f, "range,name,start_ns,end_ns,stream,correlation,graph,graph_node,grid,block\n");
  for (const Row& r : rows) {
    std::string name;  // the CSV field is quoted: any quote in it doubled
    for (char c : demangled(r.name.empty() ? nullptr : r.name.c_str())) {
      name.push_back(c);
      if (c == '"')
        name.push_back('"');
    }
    std::fprintf(f,
                 "%d,\"%s\",%llu,%llu,%u,%u,%u,%llu,%dx%dx%d,%dx%dx%d\n",
                 range,
                 name.c_str(),
                 static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end),
                 r.stream,
                 r.correlation,
                 r.graph,
                 static_cast<unsigned long long>(r.graph_node),
                 r.grid[0],
                 r.grid[1],
                 r.grid[2],
                 r.block[0],
                 r.block[1],
                 r.block[2]);
  }
  const bool ok = std::fclose(f) == 0;
  if (!ok)
    return io_error(std::string("DSINFER_KERNEL_TRACE: cannot write ") + path());
  std::fprintf(stderr, "[kernel-trace] range %d: %zu kernels -> %s\n", range, rows.size(), path());
  return Status();
}

}  // namespace dsinfer::perf
