// The multi-GPU communicator over NCCL: one process per GPU, ranks bootstrapped through the id
// file of comm/bootstrap.h. nccl.h stays out of this header (the module builds without NCCL; then
// create() returns kUnimplemented).
//
// NCCL is not linked: the first create() (or library_version(), nccl_loadable()) loads
// libnccl.so.2 with dlopen (comm/nccl_loader.h: $DSINFER_NCCL_LIBRARY, else the dynamic loader's
// search, else the directory found at configure time). Binaries therefore start without NCCL;
// where it cannot be loaded, create() fails with kFailedPrecondition "NCCL is not available:
// dlopen(libnccl.so.2) failed: <dlerror>; install nvidia-nccl-cu13 (pip) or set
// DSINFER_NCCL_LIBRARY / LD_LIBRARY_PATH".
//
// NVLink multicast (NVLS) is off: NCCL_NVLS_ENABLE=0 is set in the environment before NCCL is
// loaded (so before its first call in the process) unless the user set the variable, so NCCL never
// calls cuMulticastCreate. The communicator is non-blocking (ncclConfig_t::blocking = 0): every
// NCCL call is followed by polling ncclCommGetAsyncError until it settles, which lets
// initialisation time out (Bootstrap::timeout_ms) instead of hanging when a rank never arrives, and
// lets the host waits (all_to_all_counts, barrier) notice asynchronous errors. The first
// asynchronous error aborts the communicator (ncclCommAbort) and is latched: every later call
// returns it.
#pragma once

#include <memory>
#include <string>

#include "comm/bootstrap.h"
#include "comm/comm.h"

namespace dsinfer::comm {

class NcclComm final : public Comm {
 public:
  // Whether this build has NCCL (DSINFER_HAVE_NCCL: nccl.h was found at configure time). Says
  // nothing about the library being present at run time: see nccl_loadable().
  static bool built_with_nccl();
  // Whether NCCL can be used: built with it, and libnccl.so.2 loads (loading it if needed; the
  // outcome holds for the rest of the process).
  static bool nccl_loadable();
  // NCCL version of the library in use ("2.32.3"); an error without NCCL or when it cannot be
  // loaded (the same Status as create()).
  static Result<std::string> library_version();
  // The file the library was loaded from, as the dynamic loader names it; errors as above.
  static Result<std::string> library_path();

  // Rank `rank` of `size` on CUDA device `device` (made current). rank and size must equal the
  // bootstrap's. After the argument checks NCCL is loaded (its error, before any CUDA call or
  // wait, when it cannot be). Rank 0 creates the unique id and publishes it to boot.id_file; the
  // others wait for it (boot.timeout_ms). Then ncclCommInitRankConfig, waiting at most
  // boot.timeout_ms for the other ranks. Allocates a few bytes of device scratch (counts exchange,
  // barrier).
  static Result<std::unique_ptr<NcclComm>> create(const Bootstrap& boot,
                                                  int rank,
                                                  int size,
                                                  int device);

  // ncclCommFinalize + ncclCommDestroy when healthy, ncclCommAbort after a failure.
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  // ncclGroupStart, per peer ncclSend/ncclRecv of the byte blocks (ncclUint8), ncclGroupEnd.
  // Zero-sized blocks are skipped (consistently on both sides when the counts match).
  Status all_to_all_v(const void* send,
                      const int64_t* send_counts,
                      const int64_t* send_offsets,
                      void* recv,
                      const int64_t* recv_counts,
                      const int64_t* recv_offsets,
                      size_t elem_bytes,
                      cudaStream_t stream) override;
  // Through the device scratch: upload, one int64 to and from every peer, download, wait.
  Status all_to_all_counts(const int64_t* send_counts_host,
                           int64_t* recv_counts_host,
                           cudaStream_t stream) override;
  Status all_reduce_sum_f32(float* buf, int64_t n, cudaStream_t stream) override;
  // A one-float all-reduce on the scratch, then a wait on the stream.
  Status barrier(cudaStream_t stream) override;
  Status health() override;

  struct Impl;  // NCCL state (nccl_comm.cc)

 private:
  explicit NcclComm(std::unique_ptr<Impl> impl, int rank, int size, int device);
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
};

}  // namespace dsinfer::comm
