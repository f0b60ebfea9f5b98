// Device-error policy of the CUDA backend.
//
// Every CUDA runtime call is checked: DSI_CUDA_CHECK (kernels/cuda/cuda_check.h) for calls that
// cannot fail short of a bug, check_cuda() for calls whose failure the caller handles. Errors
// fall in two classes:
//   - recoverable: bad arguments, out of memory, not ready; the context stays usable, the
//     Status goes back to the caller (one request fails, the engine carries on);
//   - sticky: a kernel faulted (illegal address, assert, ECC error, ...). The CUDA context is
//     unusable from then on and every later call returns the same error. check_cuda() latches
//     the first such error process-wide; the engine polls device_failed() once per step, fails
//     every in-flight request with device_failure() and shuts down cleanly (no further CUDA
//     work, no abort in destructors: see release_ok()).
#pragma once

#include <cuda_runtime_api.h>

#include "base/status.h"

namespace dsinfer::device {

// True for errors that leave the CUDA context unusable.
bool is_sticky_error(cudaError_t err);

// OK for cudaSuccess; otherwise a Status naming `what` and the CUDA error (kResourceExhausted for
// allocation failures, kInternal otherwise). Sticky errors are latched (first one wins).
Status check_cuda(cudaError_t err, const char* what);

// Status of the last kernel launch (cudaGetLastError), through check_cuda().
Status check_launch(const char* what);

// Waits for `stream` and reports any asynchronous error of the work queued on it (a kernel fault
// shows up here), through check_cuda().
Status sync_stream(cudaStream_t stream, const char* what);

// Non-blocking health poll: cudaPeekAtLastError plus the latch. OK while the device is healthy.
Status poll_device();

// The latched sticky failure: OK while none happened.
Status device_failure();
bool device_failed();

// Destructors of device objects (buffers, streams, events) call CUDA to release them; after a
// sticky failure those calls fail too. They use this to decide between DSI_CUDA_CHECK (healthy
// device: a failed release is a bug) and ignoring the error (the context is dead anyway).
bool release_ok(cudaError_t err);

}  // namespace dsinfer::device
