// NcclComm: the multi-GPU communicator over NCCL (non-blocking communicator, polled). NCCL is
// loaded on first use (nccl_loader.h): every call goes through the resolved NcclApi.
#include "comm/nccl_comm.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "base/strings.h"
#include "device/allocator.h"
#include "device/device_error.h"

#ifdef DSINFER_HAVE_NCCL
#include "comm/nccl_loader.h"
#endif

namespace dsinfer::comm {
bool NcclComm::built_with_nccl() {
#ifdef DSINFER_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

#ifndef DSINFER_HAVE_NCCL

namespace {
constexpr const char* kNoNccl = "built without NCCL: pip install nvidia-nccl-cu13 and reconfigure";
}  // namespace

struct NcclComm::Impl {};

bool NcclComm::nccl_loadable() {
  return false;
}

Result<std::string> NcclComm::library_version() {
  return unimplemented(kNoNccl);
}

Result<std::string> NcclComm::library_path() {
  return unimplemented(kNoNccl);
}

Result<std::unique_ptr<NcclComm>> NcclComm::create(const Bootstrap&, int, int, int) {
  return unimplemented(kNoNccl);
}

NcclComm::NcclComm(std::unique_ptr<Impl> impl, int rank, int size, int device)
    : impl_(std::move(impl)), rank_(rank), size_(size), device_(device) {}
NcclComm::~NcclComm() = default;
Status NcclComm::all_to_all_v(const void*,
                              const int64_t*,
                              const int64_t*,
                              void*,
                              const int64_t*,
                              const int64_t*,
                              size_t,
                              cudaStream_t) {
  return unimplemented(kNoNccl);
}
Status NcclComm::all_to_all_counts(const int64_t*, int64_t*, cudaStream_t) {
  return unimplemented(kNoNccl);
}
Status NcclComm::all_reduce_sum_f32(float*, int64_t, cudaStream_t) {
  return unimplemented(kNoNccl);
}
Status NcclComm::barrier(cudaStream_t) {
  return unimplemented(kNoNccl);
}
Status NcclComm::health() {
  return unimplemented(kNoNccl);
}

#else  // DSINFER_HAVE_NCCL

static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes, "NCCL_UNIQUE_ID_BYTES changed");
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0), "NCCL >= 2.14 (ncclConfig_t) needed");

namespace {

using Clock = std::chrono::steady_clock;

// Status for a failed NCCL call: invalid argument/usage as kInvalidArgument, the rest kInternal;
// the message carries NCCL's description and its last error text.
Status nccl_status(const NcclApi& nccl, ncclResult_t r, ncclComm_t comm, const std::string& what) {
  const StatusCode code = (r == ncclInvalidArgument || r == ncclInvalidUsage)
                              ? StatusCode::kInvalidArgument
                              : StatusCode::kInternal;
  std::string msg = what + ": NCCL error " + std::to_string(static_cast<int>(r)) + " (" +
                    nccl.ncclGetErrorString(r) + ")";
  const char* last = nccl.ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0')
    msg += ": " + std::string(last);
  return Status(code, msg);
}

// NVLink SHARP / multicast off unless the user chose otherwise; before NCCL reads its
// environment (before NCCL is loaded, so before its first call in the process).
void default_nvls_off() {
  static std::once_flag once;
  std::call_once(once, [] { ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); });
}

// The loaded NCCL (loading it on the first call), or why it is not available.
Result<const NcclApi*> nccl_api() {
  default_nvls_off();
  return load_nccl();
}

// Polls with a short spin, then sleeps: NCCL calls usually settle at once, connection setup and
// remote ranks take longer.
class Backoff {
 public:
  void pause() {
    if (++n_ < 2000) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

 private:
  int n_ = 0;
};

}  // namespace

struct NcclComm::Impl {
  const NcclApi* nccl = nullptr;  // set before anything else
  ncclComm_t comm = nullptr;
  Status failure;           // latched: the first asynchronous error
  void* scratch = nullptr;  // device: int64 send[size], int64 recv[size], float flag
  int64_t* d_send = nullptr;
  int64_t* d_recv = nullptr;
  float* d_flag = nullptr;
  device::PinnedBuffer h_counts;  // int64 send[size], int64 recv[size]

  ~Impl() {
    if (comm != nullptr) {
      bool clean = failure.ok() && !device::device_failed();
      if (clean) {
        // Flush and wait for global quiescence, but do not hang on ranks that are gone.
        clean = settle_after(nccl->ncclCommFinalize(comm), "ncclCommFinalize", 30'000).ok();
      }
      if (comm != nullptr) {
        if (clean)
          (void)nccl->ncclCommDestroy(comm);
        else
          (void)nccl->ncclCommAbort(comm);
        comm = nullptr;
      }
    }
    if (scratch != nullptr) {
      const cudaError_t err = cudaFree(scratch);
      DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
    }
  }

  // Latches `st` as the communicator's failure and aborts it.
  Status fail(Status st) {
    if (failure.ok())
      failure = std::move(st);
    if (comm != nullptr) {
      (void)nccl->ncclCommAbort(comm);
      comm = nullptr;
    }
    return failure;
  }

  Status usable() const {
    if (!failure.ok())
      return failure;
    return device::device_failure();
  }

  // The outcome of an NCCL call on a non-blocking communicator: ncclInProgress is polled
  // (ncclCommGetAsyncError) until it settles or, with a timeout, until timeout_ms have passed
  // (then the message is `what` + " did not complete within T s" + timeout_hint). Any error
  // aborts the communicator (invalid arguments are caught before NCCL is called).
  Status settle_after(ncclResult_t r,
                      const std::string& what,
                      std::optional<int64_t> timeout_ms = std::nullopt,
                      const std::string& timeout_hint = "") {
    if (r != ncclSuccess && r != ncclInProgress)
      return fail(nccl_status(*nccl, r, comm, what));
    std::optional<Clock::time_point> deadline;
    if (timeout_ms.has_value())
      deadline = Clock::now() + std::chrono::milliseconds(*timeout_ms);
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = nccl->ncclCommGetAsyncError(comm, &state);
      if (q != ncclSuccess)
        return fail(nccl_status(*nccl, q, comm, what + " (ncclCommGetAsyncError)"));
      if (state == ncclSuccess)
        return Status();
      if (state != ncclInProgress)
        return fail(nccl_status(*nccl, state, comm, what));
      if (deadline.has_value() && Clock::now() >= *deadline)
        return fail(Status(StatusCode::kInternal,
                           str_format("%s did not complete within %.1f s%s",
                                      what.c_str(),
                                      static_cast<double>(*timeout_ms) / 1000.0,
                                      timeout_hint.c_str())));
      backoff.pause();
    }
  }

  // Waits for `stream` while watching the communicator for asynchronous errors.
  Status wait_stream(cudaStream_t stream, const char* what) {
    Backoff backoff;
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess)
        return Status();
      if (e != cudaErrorNotReady)
        return device::check_cuda(e, what);
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = nccl->ncclCommGetAsyncError(comm, &state);
      if (q != ncclSuccess)
        return fail(nccl_status(*nccl, q, comm, std::string(what) + " (ncclCommGetAsyncError)"));
      if (state != ncclSuccess && state != ncclInProgress)
        return fail(nccl_status(*nccl, state, comm, what));
      backoff.pause();
    }
  }
};

bool NcclComm::nccl_loadable() {
  return nccl_api().ok();
}

Result<std::string> NcclComm::library_version() {
  DSI_ASSIGN_OR_RETURN(const NcclApi* nccl, nccl_api());
  return nccl->version;
}

Result<std::string> NcclComm::library_path() {
  DSI_ASSIGN_OR_RETURN(const NcclApi* nccl, nccl_api());
  return nccl->library;
}

Result<std::unique_ptr<NcclComm>> NcclComm::create(const Bootstrap& boot,
                                                   int rank,
                                                   int size,
                                                   int device) {
  if (size < 1 || size > kMaxRanks)
    return invalid_argument(str_format("NcclComm: size %d (expected 1..%d)", size, kMaxRanks));
  if (rank < 0 || rank >= size)
    return invalid_argument(str_format("NcclComm: rank %d out of range for size %d", rank, size));
  if (boot.rank != rank || boot.size != size)
    return invalid_argument(
        str_format("NcclComm: rank %d of %d does not match the bootstrap's "
                   "rank %d of %d",
                   rank,
                   size,
                   boot.rank,
                   boot.size));
  if (device < 0)
    return invalid_argument(str_format("NcclComm: device %d is negative", device));
  if (boot.id_file.empty())
    return invalid_argument("NcclComm: the bootstrap has no id file");
  if (boot.timeout_ms <= 0)
    return invalid_argument("NcclComm: the bootstrap's timeout must be positive");
  // NCCL itself (loaded now, on first use): before waiting for other ranks or touching CUDA.
  DSI_ASSIGN_OR_RETURN(const NcclApi* nccl, nccl_api());

  // Agree on the unique id. Rank 0 selects its device first (NCCL's usual order); the others
  // wait for the id before touching CUDA.
  auto set_device = [device] {
    return device::check_cuda(cudaSetDevice(device), "NcclComm: cudaSetDevice");
  };
  ncclUniqueId nid{};
  if (rank == 0) {
    DSI_RETURN_IF_ERROR(set_device());
    const ncclResult_t r = nccl->ncclGetUniqueId(&nid);
    if (r != ncclSuccess)
      return nccl_status(*nccl, r, nullptr, "ncclGetUniqueId");
    UniqueId id{};
    std::memcpy(id.data(), nid.internal, kUniqueIdBytes);
    DSI_RETURN_IF_ERROR(publish_unique_id(boot.id_file, id));
  } else {
    DSI_ASSIGN_OR_RETURN(const UniqueId id, await_unique_id(boot.id_file, boot.timeout_ms));
    std::memcpy(nid.internal, id.data(), kUniqueIdBytes);
    DSI_RETURN_IF_ERROR(set_device());
  }

  auto impl = std::make_unique<Impl>();
  impl->nccl = nccl;
  const size_t counts_bytes = 2 * static_cast<size_t>(size) * sizeof(int64_t);
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(&impl->scratch, counts_bytes + 256),
                                         "NcclComm: cudaMalloc (scratch)"));
  impl->d_send = static_cast<int64_t*>(impl->scratch);
  impl->d_recv = impl->d_send + size;
  impl->d_flag = reinterpret_cast<float*>(static_cast<char*>(impl->scratch) + counts_bytes);
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaMemset(impl->d_flag, 0, sizeof(float)),
                                         "NcclComm: cudaMemset (scratch)"));
  DSI_ASSIGN_OR_RETURN(impl->h_counts, device::PinnedBuffer::allocate(counts_bytes));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = nccl->ncclCommInitRankConfig(&impl->comm, size, nid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    Status st = nccl_status(*nccl, r, impl->comm, "ncclCommInitRankConfig");
    if (impl->comm != nullptr)
      (void)impl->fail(st);
    return st;
  }
  DSI_RETURN_IF_ERROR(impl->settle_after(
      ncclSuccess,
      str_format("NCCL init of rank %d of %d on device %d", rank, size, device),
      boot.timeout_ms,
      str_format(": are all %d ranks running, with the same %s?", size, kEnvIdFile)));
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(impl), rank, size, device));
}

NcclComm::NcclComm(std::unique_ptr<Impl> impl, int rank, int size, int device)
    : impl_(std::move(impl)), rank_(rank), size_(size), device_(device) {}

NcclComm::~NcclComm() = default;

Status NcclComm::all_to_all_v(const void* send,
                              const int64_t* send_counts,
                              const int64_t* send_offsets,
                              void* recv,
                              const int64_t* recv_counts,
                              const int64_t* recv_offsets,
                              size_t elem_bytes,
                              cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_all_to_all_v_args(
      rank_, size_, send, send_counts, send_offsets, recv, recv_counts, recv_offsets, elem_bytes));
  DSI_RETURN_IF_ERROR(impl_->usable());
  const NcclApi& nccl = *impl_->nccl;
  ncclComm_t c = impl_->comm;
  ncclResult_t r = nccl.ncclGroupStart();
  if (r != ncclSuccess)
    return impl_->fail(nccl_status(nccl, r, c, "all_to_all_v: ncclGroupStart"));
  ncclResult_t first = ncclSuccess;
  for (int p = 0; p < size_ && first == ncclSuccess; ++p) {
    if (send_counts[p] > 0) {
      first = nccl.ncclSend(static_cast<const char*>(send) + send_offsets[p] * elem_bytes,
                            static_cast<size_t>(send_counts[p]) * elem_bytes,
                            ncclUint8,
                            p,
                            c,
                            stream);
    }
    if (first == ncclSuccess && recv_counts[p] > 0) {
      first = nccl.ncclRecv(static_cast<char*>(recv) + recv_offsets[p] * elem_bytes,
                            static_cast<size_t>(recv_counts[p]) * elem_bytes,
                            ncclUint8,
                            p,
                            c,
                            stream);
    }
  }
  r = nccl.ncclGroupEnd();  // always closes the group
  if (first != ncclSuccess && first != ncclInProgress)
    return impl_->fail(nccl_status(nccl, first, c, "all_to_all_v: ncclSend/ncclRecv"));
  return impl_->settle_after(r, "all_to_all_v: ncclGroupEnd");
}

Status NcclComm::all_to_all_counts(const int64_t* send_counts_host,
                                   int64_t* recv_counts_host,
                                   cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_all_to_all_counts_args(size_, send_counts_host, recv_counts_host));
  DSI_RETURN_IF_ERROR(impl_->usable());
  const NcclApi& nccl = *impl_->nccl;
  const size_t bytes = static_cast<size_t>(size_) * sizeof(int64_t);
  auto* h_send = impl_->h_counts.as<int64_t>();
  int64_t* h_recv = h_send + size_;
  std::memcpy(h_send, send_counts_host, bytes);
  DSI_RETURN_IF_ERROR(device::check_cuda(
      cudaMemcpyAsync(impl_->d_send, h_send, bytes, cudaMemcpyHostToDevice, stream),
      "all_to_all_counts: upload"));
  ncclComm_t c = impl_->comm;
  ncclResult_t r = nccl.ncclGroupStart();
  if (r != ncclSuccess)
    return impl_->fail(nccl_status(nccl, r, c, "all_to_all_counts: ncclGroupStart"));
  ncclResult_t first = ncclSuccess;
  for (int p = 0; p < size_ && first == ncclSuccess; ++p) {
    first = nccl.ncclSend(impl_->d_send + p, 1, ncclInt64, p, c, stream);
    if (first == ncclSuccess)
      first = nccl.ncclRecv(impl_->d_recv + p, 1, ncclInt64, p, c, stream);
  }
  r = nccl.ncclGroupEnd();
  if (first != ncclSuccess && first != ncclInProgress)
    return impl_->fail(nccl_status(nccl, first, c, "all_to_all_counts: ncclSend/ncclRecv"));
  DSI_RETURN_IF_ERROR(impl_->settle_after(r, "all_to_all_counts: ncclGroupEnd"));
  DSI_RETURN_IF_ERROR(device::check_cuda(
      cudaMemcpyAsync(h_recv, impl_->d_recv, bytes, cudaMemcpyDeviceToHost, stream),
      "all_to_all_counts: download"));
  DSI_RETURN_IF_ERROR(impl_->wait_stream(stream, "all_to_all_counts: wait"));
  std::memcpy(recv_counts_host, h_recv, bytes);
  return Status();
}

Status NcclComm::all_reduce_sum_f32(float* buf, int64_t n, cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_all_reduce_args(buf, n));
  DSI_RETURN_IF_ERROR(impl_->usable());
  const NcclApi& nccl = *impl_->nccl;
  if (n == 0)
    return Status();
  return impl_->settle_after(
      nccl.ncclAllReduce(
          buf, buf, static_cast<size_t>(n), ncclFloat32, ncclSum, impl_->comm, stream),
      "all_reduce_sum_f32: ncclAllReduce");
}

Status NcclComm::barrier(cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(impl_->usable());
  const NcclApi& nccl = *impl_->nccl;
  DSI_RETURN_IF_ERROR(impl_->settle_after(
      nccl.ncclAllReduce(
          impl_->d_flag, impl_->d_flag, 1, ncclFloat32, ncclSum, impl_->comm, stream),
      "barrier: ncclAllReduce"));
  return impl_->wait_stream(stream, "barrier: wait");
}

Status NcclComm::health() {
  DSI_RETURN_IF_ERROR(impl_->usable());
  const NcclApi& nccl = *impl_->nccl;
  DSI_RETURN_IF_ERROR(device::poll_device());
  ncclResult_t state = ncclSuccess;
  const ncclResult_t q = nccl.ncclCommGetAsyncError(impl_->comm, &state);
  if (q != ncclSuccess)
    return impl_->fail(nccl_status(nccl, q, impl_->comm, "health: ncclCommGetAsyncError"));
  if (state != ncclSuccess && state != ncclInProgress)
    return impl_->fail(nccl_status(nccl, state, impl_->comm, "health: asynchronous NCCL error"));
  return Status();
}

#endif  // DSINFER_HAVE_NCCL

}  // namespace dsinfer::comm
