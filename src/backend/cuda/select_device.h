// The device checks of the CUDA backends' open: a CUDA device exists, the asked one among them;
// then it is made current.
#pragma once

#include "base/status.h"

namespace dsinfer::gpu {

// kFailedPrecondition without any CUDA device; invalid-argument for a device out of range.
Status select_device(int device);

}  // namespace dsinfer::gpu
