#include "backend/cuda/workspace.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "base/check.h"
#include "device/device_error.h"

namespace dsinfer::gpu {

Workspace::~Workspace() {
  for (Block& b : blocks_) {
    const cudaError_t err = cudaFree(b.p);
    DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
  }
}

int64_t Workspace::bytes() const {
  int64_t t = 0;
  for (const Block& b : blocks_) t += b.size;
  return t;
}

Status Workspace::alloc(int64_t bytes, void** out) {
  bytes = (bytes + 255) / 256 * 256;
  while (block_ < blocks_.size()) {
    if (offset_ + bytes <= blocks_[block_].size) {
      *out = static_cast<uint8_t*>(blocks_[block_].p) + offset_;
      offset_ += bytes;
      return Status();
    }
    ++block_;
    offset_ = 0;
  }
  const int64_t last = blocks_.empty() ? 0 : blocks_.back().size;
  Block b;
  b.size = std::max<int64_t>({bytes, 2 * last, int64_t{64} << 20});
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(&b.p, static_cast<size_t>(b.size)),
                                         "cudaMalloc for the forward workspace"));
  blocks_.push_back(b);
  block_ = blocks_.size() - 1;
  offset_ = bytes;
  *out = b.p;
  return Status();
}

Result<bool> Workspace::consolidate() {
  if (blocks_.size() <= 1)
    return false;
  const int64_t total = bytes();
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaDeviceSynchronize(), "workspace consolidation"));
  for (Block& b : blocks_) DSI_RETURN_IF_ERROR(device::check_cuda(cudaFree(b.p), "cudaFree"));
  blocks_.clear();
  Block b;
  b.size = total;
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(&b.p, static_cast<size_t>(b.size)),
                                         "cudaMalloc for the forward workspace"));
  blocks_.push_back(b);
  reset();
  return true;
}

}  // namespace dsinfer::gpu
