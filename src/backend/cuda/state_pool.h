// The device mirror of a PageArena's pages (backends whose state lives on the GPU: the arena hands
// out page ids only): one device array of the arena's pages, grown with it, and the page copies
// of the backend seam (copy / read / write state pages). Shared by CudaModel and CudaV41Backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "base/status.h"
#include "state/page_arena.h"

namespace dsinfer::gpu {

struct StatePool {
  float* p = nullptr;
  int64_t pages = 0;
};

// Grows `pool` to the arena's page count (by half again at least: growable arenas), keeping its
// contents (copied on s, then s synced, the old array freed); *grew says whether it moved.
// `what` names the pool in errors.
Status grow_state_pool(
    StatePool* pool, const state::PageArena& arena, cudaStream_t s, const char* what, bool* grew);

// Page copies within the pool (pairs of from, to), each page page_floats floats; s synced after.
Status copy_pool_pages(float* pool,
                       int64_t page_floats,
                       const std::vector<std::pair<int32_t, int32_t>>& pairs,
                       cudaStream_t s);
// dst[i] = page pages[i] of the pool; s synced after.
Status read_pool_pages(const float* pool,
                       int64_t page_floats,
                       std::span<const int32_t> pages,
                       float* dst,
                       cudaStream_t s);
// Page pages[i] of the pool = src[i]; s synced after.
Status write_pool_pages(float* pool,
                        int64_t page_floats,
                        std::span<const int32_t> pages,
                        const float* src,
                        cudaStream_t s);

}  // namespace dsinfer::gpu
