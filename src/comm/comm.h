// The transport of expert parallelism: a communicator over the ranks of one job (one process per
// GPU). Comm is the interface the MoE dispatch/combine and the engine program against;
// LocalComm is the size-1 communicator (--ep 1: the real single-rank path, plain device copies),
// NcclComm (comm/nccl_comm.h) the multi-GPU one.
//
// Conventions: device buffers, host count/offset arrays of size() entries, counts and offsets in
// elements (elem_bytes each). Work is enqueued on the caller's stream and runs in stream order;
// calls return once it is enqueued, except all_to_all_counts and barrier, which wait for it.
// Arguments are validated before anything is enqueued (kInvalidArgument). A communicator is
// driven by one thread at a time; the CUDA device current on that thread must be the
// communicator's device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace dsinfer::comm {

class Comm {
 public:
  virtual ~Comm() = default;
  Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Variable all-to-all: for every rank p, send_counts[p] elements at
  // send + send_offsets[p] * elem_bytes go to rank p, and recv_counts[p] elements from rank p
  // land at recv + recv_offsets[p] * elem_bytes. recv_counts[p] must equal rank p's
  // send_counts[rank()] (exchange them first with all_to_all_counts); only the block a rank sends
  // itself can be checked locally. Receive blocks must not overlap each other; send and recv
  // must not overlap (no in-place).
  virtual Status all_to_all_v(const void* send,
                              const int64_t* send_counts,
                              const int64_t* send_offsets,
                              void* recv,
                              const int64_t* recv_counts,
                              const int64_t* recv_offsets,
                              size_t elem_bytes,
                              cudaStream_t stream) = 0;

  // recv_counts_host[p] = rank p's send_counts_host[rank()]. Host arrays; blocks until done (the
  // stream is synchronised). The usual first half of a dispatch: counts, then all_to_all_v.
  virtual Status all_to_all_counts(const int64_t* send_counts_host,
                                   int64_t* recv_counts_host,
                                   cudaStream_t stream) = 0;

  // In place: buf[i] = sum over ranks of buf[i], n >= 0 floats on the device.
  virtual Status all_reduce_sum_f32(float* buf, int64_t n, cudaStream_t stream) = 0;

  // Returns when every rank has reached the barrier and the work queued on `stream` before it
  // is complete.
  virtual Status barrier(cudaStream_t stream) = 0;

  // Non-blocking health poll: OK while the communicator and the device are usable; otherwise
  // the (latched) failure. Poll once per engine step, as device::poll_device().
  virtual Status health() = 0;
};

// The size-1 communicator: rank 0 of 1. all_to_all_v is one device-to-device copy of the block
// the rank sends itself, all_reduce_sum_f32 leaves the buffer as it is, barrier synchronises the
// stream.
class LocalComm final : public Comm {
 public:
  LocalComm() = default;
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status all_to_all_v(const void* send,
                      const int64_t* send_counts,
                      const int64_t* send_offsets,
                      void* recv,
                      const int64_t* recv_counts,
                      const int64_t* recv_offsets,
                      size_t elem_bytes,
                      cudaStream_t stream) override;
  Status all_to_all_counts(const int64_t* send_counts_host,
                           int64_t* recv_counts_host,
                           cudaStream_t stream) override;
  Status all_reduce_sum_f32(float* buf, int64_t n, cudaStream_t stream) override;
  Status barrier(cudaStream_t stream) override;
  Status health() override;
};

// Shared argument checks (used by every implementation before enqueueing anything).
// all_to_all_v: count/offset arrays present, counts and offsets >= 0, elem_bytes > 0, byte
// extents within int64, buffers non-null when anything moves, receive blocks disjoint, and the
// block a rank sends itself as long as the one it receives from itself.
Status check_all_to_all_v_args(int rank,
                               int size,
                               const void* send,
                               const int64_t* send_counts,
                               const int64_t* send_offsets,
                               const void* recv,
                               const int64_t* recv_counts,
                               const int64_t* recv_offsets,
                               size_t elem_bytes);
Status check_all_to_all_counts_args(int size,
                                    const int64_t* send_counts,
                                    const int64_t* recv_counts);
Status check_all_reduce_args(const float* buf, int64_t n);

}  // namespace dsinfer::comm
