#include "backend/cuda/state_pool.h"

#include <algorithm>

#include "base/check.h"
#include "base/strings.h"
#include "device/device_error.h"

namespace dsinfer::gpu {

Status grow_state_pool(
    StatePool* pool, const state::PageArena& arena, cudaStream_t s, const char* what, bool* grew) {
  *grew = false;
  const int64_t need = arena.num_pages();
  if (pool->pages >= need)
    return Status();
  // Growable arenas: grow by half again, keeping the contents.
  const int64_t pages = std::max(need, pool->pages + pool->pages / 2);
  float* p = nullptr;
  DSI_RETURN_IF_ERROR(device::check_cuda(
      cudaMalloc(reinterpret_cast<void**>(&p), static_cast<size_t>(pages * arena.page_bytes())),
      str_format("cudaMalloc of the %s (%lld pages of %lld bytes)",
                 what,
                 static_cast<long long>(pages),
                 static_cast<long long>(arena.page_bytes()))
          .c_str()));
  if (pool->p) {
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaMemcpyAsync(p,
                                           pool->p,
                                           static_cast<size_t>(pool->pages * arena.page_bytes()),
                                           cudaMemcpyDeviceToDevice,
                                           s),
                           "growing the state pool"));
    DSI_RETURN_IF_ERROR(device::sync_stream(s, "growing the state pool"));
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaFree(pool->p), "cudaFree"));
  }
  pool->p = p;
  pool->pages = pages;
  *grew = true;
  return Status();
}

Status copy_pool_pages(float* pool,
                       int64_t page_floats,
                       const std::vector<std::pair<int32_t, int32_t>>& pairs,
                       cudaStream_t s) {
  for (const auto& [from, to] : pairs) {
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaMemcpyAsync(pool + to * page_floats,
                                                           pool + from * page_floats,
                                                           static_cast<size_t>(page_floats * 4),
                                                           cudaMemcpyDeviceToDevice,
                                                           s),
                                           "copying state pages"));
  }
  return device::sync_stream(s, "copying state pages");
}

Status read_pool_pages(const float* pool,
                       int64_t page_floats,
                       std::span<const int32_t> pages,
                       float* dst,
                       cudaStream_t s) {
  for (size_t i = 0; i < pages.size(); ++i) {
    DSI_CHECK(pages[i] >= 0, "read_state_pages: page %d", pages[i]);
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaMemcpyAsync(dst + static_cast<int64_t>(i) * page_floats,
                                           pool + pages[i] * page_floats,
                                           static_cast<size_t>(page_floats * 4),
                                           cudaMemcpyDeviceToHost,
                                           s),
                           "reading state pages"));
  }
  return device::sync_stream(s, "reading state pages");
}

Status write_pool_pages(float* pool,
                        int64_t page_floats,
                        std::span<const int32_t> pages,
                        const float* src,
                        cudaStream_t s) {
  for (size_t i = 0; i < pages.size(); ++i) {
    DSI_CHECK(pages[i] >= 0, "write_state_pages: page %d", pages[i]);
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaMemcpyAsync(pool + pages[i] * page_floats,
                                           src + static_cast<int64_t>(i) * page_floats,
                                           static_cast<size_t>(page_floats * 4),
                                           cudaMemcpyHostToDevice,
                                           s),
                           "writing state pages"));
  }
  return device::sync_stream(s, "writing state pages");
}

}  // namespace dsinfer::gpu
