// Device ceilings (see ceilings.h).
#include "perf/ceilings.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "device/device_error.h"
#include "device/stream.h"
#include "perf/device_memory.h"
#include "perf/fill.h"
#include "perf/lt_gemm.h"

namespace dsinfer::perf {
namespace {

GemmSpec gemm_spec(const CeilingOptions& o, GemmInput input) {
  return GemmSpec{.m = o.gemm_m,
                  .n = o.gemm_n,
                  .k = o.gemm_k,
                  .input = input,
                  .output = GemmOutput::kBf16,
                  .fp8_fast_accum = o.fp8_fast_accum,
                  .workspace_bytes = o.gemm_workspace_bytes,
                  .max_algos = o.gemm_algos};
}

Status check_options(const CeilingOptions& o) {
  const std::string what = "measure_ceilings: ";
  const std::string context = "measure_ceilings";
  if (o.device < -1)
    return invalid_argument(what + "device ordinal " + std::to_string(o.device));
  if (o.measure_copy) {
    if (o.copy_bytes < 1)
      return invalid_argument(what + "copy_bytes " + std::to_string(o.copy_bytes) + " < 1");
    if (o.copy_warmup < 0 || o.copy_iters < 1) {
      return invalid_argument(what + "copy needs warm-up >= 0 and iterations >= 1 (got " +
                              std::to_string(o.copy_warmup) + ", " + std::to_string(o.copy_iters) +
                              ")");
    }
  }
  if (o.measure_fp8 || o.measure_bf16) {
    if (o.gemm_warmup < 0 || o.gemm_iters < 1) {
      return invalid_argument(what + "GEMM needs warm-up >= 0 and iterations >= 1 (got " +
                              std::to_string(o.gemm_warmup) + ", " + std::to_string(o.gemm_iters) +
                              ")");
    }
  }
  if (o.measure_fp8)
    DSI_RETURN_IF_ERROR(check_gemm_spec(gemm_spec(o, GemmInput::kFp8E4M3)).with_context(context));
  if (o.measure_bf16)
    DSI_RETURN_IF_ERROR(check_gemm_spec(gemm_spec(o, GemmInput::kBf16)).with_context(context));
  return Status();
}

// Makes `device` current for the measurement and restores the caller's device afterwards.
class DeviceScope {
 public:
  DeviceScope() = default;
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    if (changed_)
      (void)cudaSetDevice(previous_);
  }
  Status enter(int device) {
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaGetDevice(&previous_), "cudaGetDevice"));
    if (device >= 0 && device != previous_) {
      DSI_RETURN_IF_ERROR(device::check_cuda(cudaSetDevice(device), "cudaSetDevice"));
      changed_ = true;
    }
    return Status();
  }

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// Times `iters` calls of enqueue() (each returns Status and enqueues one operation on `stream`)
// after `warmup` untimed ones: events between consecutive operations, one synchronisation at
// the end. Returns the median or the best time of one operation in milliseconds.
template <typename Enqueue>
Result<double> time_ms(const Enqueue& enqueue,
                       int warmup,
                       int iters,
                       Statistic statistic,
                       cudaStream_t stream,
                       const std::string& what) {
  for (int i = 0; i < warmup; ++i) DSI_RETURN_IF_ERROR(enqueue());
  std::vector<device::Event> events;
  events.reserve(static_cast<size_t>(iters) + 1);
  for (int i = 0; i <= iters; ++i) {
    DSI_ASSIGN_OR_RETURN(device::Event e, device::Event::create(/*timing=*/true));
    events.push_back(std::move(e));
  }
  DSI_RETURN_IF_ERROR(events[0].record(stream));
  for (int i = 0; i < iters; ++i) {
    DSI_RETURN_IF_ERROR(enqueue());
    DSI_RETURN_IF_ERROR(events[static_cast<size_t>(i) + 1].record(stream));
  }
  DSI_RETURN_IF_ERROR(device::sync_stream(stream, what.c_str()));
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    DSI_ASSIGN_OR_RETURN(const float t,
                         device::Event::elapsed_ms(events[static_cast<size_t>(i)],
                                                   events[static_cast<size_t>(i) + 1]));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  double result = ms.front();
  if (statistic == Statistic::kMedian) {
    const size_t h = ms.size() / 2;
    result = ms.size() % 2 == 1 ? ms[h] : 0.5 * (ms[h - 1] + ms[h]);
  }
  if (!(result > 0.0) || !std::isfinite(result)) {
    return Status(StatusCode::kInternal,
                  what + ": timed " + std::to_string(result) +
                      " ms per operation (below the event timer's resolution: use larger sizes)");
  }
  return result;
}

struct Timed {
  double per_s = 0;  // bytes or FLOP per second
  double ms = 0;
};

Result<Timed> measure_copy(const CeilingOptions& o, cudaStream_t stream) {
  const auto bytes = static_cast<size_t>(o.copy_bytes);
  DSI_ASSIGN_OR_RETURN(DeviceMemory src, DeviceMemory::allocate(bytes, "the copy source"));
  DSI_ASSIGN_OR_RETURN(DeviceMemory dst, DeviceMemory::allocate(bytes, "the copy destination"));
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaMemsetAsync(src.get(), 0x5A, bytes, stream), "cudaMemsetAsync"));
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaMemsetAsync(dst.get(), 0, bytes, stream), "cudaMemsetAsync"));
  const auto copy = [&]() {
    return device::check_cuda(
        cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync (device to device)");
  };
  DSI_ASSIGN_OR_RETURN(
      const double ms,
      time_ms(copy, o.copy_warmup, o.copy_iters, o.statistic, stream, "copy ceiling"));
  return Timed{.per_s = 2.0 * static_cast<double>(bytes) / (ms * 1e-3), .ms = ms};
}

Result<Timed> measure_gemm(const CeilingOptions& o, GemmInput input, cudaStream_t stream) {
  const GemmSpec spec = gemm_spec(o, input);
  const std::string what = "GEMM ceiling " + describe(spec);
  DSI_ASSIGN_OR_RETURN(LtGemm gemm, LtGemm::create(spec));
  const int64_t eb = gemm_input_bytes(input);
  const int64_t a_elems = spec.m * spec.k;
  const int64_t b_elems = spec.n * spec.k;
  DSI_ASSIGN_OR_RETURN(DeviceMemory a,
                       DeviceMemory::allocate(static_cast<size_t>(a_elems * eb), "GEMM A"));
  DSI_ASSIGN_OR_RETURN(DeviceMemory b,
                       DeviceMemory::allocate(static_cast<size_t>(b_elems * eb), "GEMM B"));
  DSI_ASSIGN_OR_RETURN(
      DeviceMemory d,
      DeviceMemory::allocate(static_cast<size_t>(spec.m * spec.n * gemm_output_bytes(spec.output)),
                             "GEMM D"));
  DSI_RETURN_IF_ERROR(fill_random(a.get(), a_elems, input, 0x0A, stream));
  DSI_RETURN_IF_ERROR(fill_random(b.get(), b_elems, input, 0x0B, stream));

  double best_ms = std::numeric_limits<double>::infinity();
  Status first_error;
  for (int i = 0; i < gemm.num_algos(); ++i) {
    DSI_RETURN_IF_ERROR(gemm.select_algo(i));
    const auto run = [&]() { return gemm.run(a.get(), b.get(), d.get(), stream); };
    Result<double> ms = time_ms(run,
                                o.gemm_warmup,
                                o.gemm_iters,
                                o.statistic,
                                stream,
                                what + " algorithm " + std::to_string(i));
    if (!ms.ok()) {
      // A dead device ends the measurement; an algorithm that refuses to run is skipped.
      if (device::device_failed())
        return ms.status();
      if (first_error.ok())
        first_error = ms.status();
      continue;
    }
    best_ms = std::min(best_ms, *ms);
  }
  if (!std::isfinite(best_ms))
    return first_error;
  const double flop =
      2.0 * static_cast<double>(spec.m) * static_cast<double>(spec.n) * static_cast<double>(spec.k);
  return Timed{.per_s = flop / (best_ms * 1e-3), .ms = best_ms};
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0)
    std::snprintf(buf, sizeof(buf), "%lld GiB", static_cast<long long>(bytes >> 30));
  else if (bytes >= (int64_t{1} << 20))
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  else
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  return buf;
}

}  // namespace

Result<Ceilings> measure_ceilings(const CeilingOptions& o) {
  DSI_RETURN_IF_ERROR(check_options(o));
  DSI_RETURN_IF_ERROR(device::device_failure());
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: not sticky, clear it
    return failed_precondition(
        std::string("measure_ceilings: no CUDA device (cudaGetDeviceCount: ") +
        cudaGetErrorName(err) + ": " + cudaGetErrorString(err) + ")");
  }
  if (count == 0)
    return failed_precondition("measure_ceilings: no CUDA device");
  if (o.device >= count) {
    return failed_precondition("measure_ceilings: no CUDA device " + std::to_string(o.device) +
                               " (" + std::to_string(count) + " present)");
  }

  DeviceScope scope;  // declared first: restores the caller's device after everything below
  DSI_RETURN_IF_ERROR(scope.enter(o.device));
  Ceilings c;
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaGetDevice(&c.device), "cudaGetDevice"));
  cudaDeviceProp prop{};
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaGetDeviceProperties(&prop, c.device), "cudaGetDeviceProperties"));
  c.device_name = prop.name;
  DSI_ASSIGN_OR_RETURN(device::Stream stream, device::Stream::create(/*non_blocking=*/true));

  if (o.measure_copy) {
    DSI_ASSIGN_OR_RETURN(const Timed t, measure_copy(o, stream.get()));
    c.copy_bytes_per_s = t.per_s;
    c.copy_ms = t.ms;
    c.copy_buffer_bytes = o.copy_bytes;
  }
  if (o.measure_fp8 || o.measure_bf16) {
    c.gemm_m = o.gemm_m;
    c.gemm_n = o.gemm_n;
    c.gemm_k = o.gemm_k;
  }
  if (o.measure_fp8) {
    DSI_ASSIGN_OR_RETURN(const Timed t, measure_gemm(o, GemmInput::kFp8E4M3, stream.get()));
    c.fp8_gemm_flops = t.per_s;
    c.fp8_gemm_ms = t.ms;
  }
  if (o.measure_bf16) {
    DSI_ASSIGN_OR_RETURN(const Timed t, measure_gemm(o, GemmInput::kBf16, stream.get()));
    c.bf16_gemm_flops = t.per_s;
    c.bf16_gemm_ms = t.ms;
  }
  DSI_RETURN_IF_ERROR(stream.synchronize());
  return c;
}

std::string describe(const Ceilings& c) {
  std::string s = c.device_name.empty() ? std::string("device") : c.device_name;
  s += ":";
  char buf[160];
  const auto gemm = [&](const char* name, double flops) {
    std::snprintf(buf,
                  sizeof(buf),
                  " %s GEMM %lldx%lldx%lld %.0f TFLOP/s,",
                  name,
                  static_cast<long long>(c.gemm_m),
                  static_cast<long long>(c.gemm_n),
                  static_cast<long long>(c.gemm_k),
                  flops / 1e12);
    s += buf;
  };
  if (c.copy_bytes_per_s > 0) {
    std::snprintf(buf,
                  sizeof(buf),
                  " copy %.2f TB/s (read+write, %s),",
                  c.copy_bytes_per_s / 1e12,
                  format_bytes(c.copy_buffer_bytes).c_str());
    s += buf;
  }
  if (c.fp8_gemm_flops > 0)
    gemm("FP8", c.fp8_gemm_flops);
  if (c.bf16_gemm_flops > 0)
    gemm("BF16", c.bf16_gemm_flops);
  if (s.back() == ',')
    s.pop_back();
  else
    s += " nothing measured";
  return s;
}

}  // namespace dsinfer::perf
