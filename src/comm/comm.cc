// Argument checks shared by the communicators, and LocalComm.
#include "comm/comm.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "base/strings.h"
#include "device/device_error.h"

namespace dsinfer::comm {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// Byte range [begin, end) of block p, checked for overflow.
Status block_bytes(const char* side,
                   int p,
                   int64_t count,
                   int64_t offset,
                   size_t elem_bytes,
                   int64_t* begin,
                   int64_t* end) {
  if (count < 0)
    return invalid_argument(str_format(
        "all_to_all_v: %s_counts[%d] = %lld is negative", side, p, static_cast<long long>(count)));
  if (offset < 0)
    return invalid_argument(str_format("all_to_all_v: %s_offsets[%d] = %lld is negative",
                                       side,
                                       p,
                                       static_cast<long long>(offset)));
  const auto eb = static_cast<int64_t>(elem_bytes);
  if (offset > kInt64Max / eb || count > kInt64Max / eb || offset * eb > kInt64Max - count * eb)
    return invalid_argument(
        str_format("all_to_all_v: %s block %d (offset %lld, count %lld, "
                   "%zu-byte elements) overflows int64 bytes",
                   side,
                   p,
                   static_cast<long long>(offset),
                   static_cast<long long>(count),
                   elem_bytes));
  *begin = offset * eb;
  *end = *begin + count * eb;
  return Status();
}

}  // namespace

Status check_all_to_all_v_args(int rank,
                               int size,
                               const void* send,
                               const int64_t* send_counts,
                               const int64_t* send_offsets,
                               const void* recv,
                               const int64_t* recv_counts,
                               const int64_t* recv_offsets,
                               size_t elem_bytes) {
  if (send_counts == nullptr || send_offsets == nullptr || recv_counts == nullptr ||
      recv_offsets == nullptr)
    return invalid_argument("all_to_all_v: null count or offset array");
  if (elem_bytes == 0 || elem_bytes > static_cast<size_t>(kInt64Max))
    return invalid_argument("all_to_all_v: elem_bytes must be positive");
  bool any_send = false;
  bool any_recv = false;
  std::vector<std::pair<int64_t, int64_t>> recv_blocks;
  recv_blocks.reserve(static_cast<size_t>(size));
  for (int p = 0; p < size; ++p) {
    int64_t b = 0;
    int64_t e = 0;
    DSI_RETURN_IF_ERROR(
        block_bytes("send", p, send_counts[p], send_offsets[p], elem_bytes, &b, &e));
    any_send = any_send || e > b;
    DSI_RETURN_IF_ERROR(
        block_bytes("recv", p, recv_counts[p], recv_offsets[p], elem_bytes, &b, &e));
    any_recv = any_recv || e > b;
    if (e > b)
      recv_blocks.emplace_back(b, e);
  }
  if (any_send && send == nullptr)
    return invalid_argument("all_to_all_v: null send buffer with a non-empty send block");
  if (any_recv && recv == nullptr)
    return invalid_argument("all_to_all_v: null recv buffer with a non-empty recv block");
  if (send_counts[rank] != recv_counts[rank])
    return invalid_argument(
        str_format("all_to_all_v: rank %d sends itself %lld elements but "
                   "expects %lld from itself",
                   rank,
                   static_cast<long long>(send_counts[rank]),
                   static_cast<long long>(recv_counts[rank])));
  std::sort(recv_blocks.begin(), recv_blocks.end());
  for (size_t i = 1; i < recv_blocks.size(); ++i) {
    if (recv_blocks[i].first < recv_blocks[i - 1].second)
      return invalid_argument(
          str_format("all_to_all_v: receive blocks overlap (bytes [%lld, %lld) and [%lld, %lld))",
                     static_cast<long long>(recv_blocks[i - 1].first),
                     static_cast<long long>(recv_blocks[i - 1].second),
                     static_cast<long long>(recv_blocks[i].first),
                     static_cast<long long>(recv_blocks[i].second)));
  }
  return Status();
}

Status check_all_to_all_counts_args(int size,
                                    const int64_t* send_counts,
                                    const int64_t* recv_counts) {
  if (send_counts == nullptr || recv_counts == nullptr)
    return invalid_argument("all_to_all_counts: null count array");
  for (int p = 0; p < size; ++p) {
    if (send_counts[p] < 0)
      return invalid_argument(str_format("all_to_all_counts: send_counts[%d] = %lld is negative",
                                         p,
                                         static_cast<long long>(send_counts[p])));
  }
  return Status();
}

Status check_all_reduce_args(const float* buf, int64_t n) {
  if (n < 0)
    return invalid_argument(
        str_format("all_reduce_sum_f32: n = %lld is negative", static_cast<long long>(n)));
  if (n > 0 && buf == nullptr)
    return invalid_argument("all_reduce_sum_f32: null buffer");
  return Status();
}

Status LocalComm::all_to_all_v(const void* send,
                               const int64_t* send_counts,
                               const int64_t* send_offsets,
                               void* recv,
                               const int64_t* recv_counts,
                               const int64_t* recv_offsets,
                               size_t elem_bytes,
                               cudaStream_t stream) {
  DSI_RETURN_IF_ERROR(check_all_to_all_v_args(
      0, 1, send, send_counts, send_offsets, recv, recv_counts, recv_offsets, elem_bytes));
  if (send_counts[0] == 0)
    return Status();
  const auto* src = static_cast<const char*>(send) + send_offsets[0] * elem_bytes;
  auto* dst = static_cast<char*>(recv) + recv_offsets[0] * elem_bytes;
  return device::check_cuda(cudaMemcpyAsync(dst,
                                            src,
                                            static_cast<size_t>(send_counts[0]) * elem_bytes,
                                            cudaMemcpyDeviceToDevice,
                                            stream),
                            "LocalComm::all_to_all_v: cudaMemcpyAsync");
}

Status LocalComm::all_to_all_counts(const int64_t* send_counts_host,
                                    int64_t* recv_counts_host,
                                    cudaStream_t /*stream*/) {
  DSI_RETURN_IF_ERROR(check_all_to_all_counts_args(1, send_counts_host, recv_counts_host));
  recv_counts_host[0] = send_counts_host[0];
  return Status();
}

Status LocalComm::all_reduce_sum_f32(float* buf, int64_t n, cudaStream_t /*stream*/) {
  return check_all_reduce_args(buf, n);  // the sum over one rank is the buffer itself
}

Status LocalComm::barrier(cudaStream_t stream) {
  return device::sync_stream(stream, "LocalComm::barrier");
}

Status LocalComm::health() {
  return device::poll_device();
}

}  // namespace dsinfer::comm
