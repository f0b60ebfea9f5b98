// NCCL loaded at run time: src/comm compiles against nccl.h (types, enums, NCCL_VERSION) but does
// not link libnccl, so binaries start, and every command without expert parallelism over NCCL
// runs, on hosts without NCCL. The first use dlopen()s the library and resolves the functions
// below with dlsym. Internal to src/comm: nccl.h is only on dsinfer_comm's include path, and this
// header is only for builds that found it (DSINFER_HAVE_NCCL).
#pragma once

#ifdef DSINFER_HAVE_NCCL

#include <nccl.h>

#include <string>

#include "base/status.h"

namespace dsinfer::comm {

// Every NCCL function src/comm calls. A function called anywhere else must be added here (calling
// NCCL directly fails to link: no binary links libnccl).
#define DSI_NCCL_FUNCTIONS(X) \
  X(ncclGetVersion)           \
  X(ncclGetUniqueId)          \
  X(ncclCommInitRankConfig)   \
  X(ncclCommFinalize)         \
  X(ncclCommDestroy)          \
  X(ncclCommAbort)            \
  X(ncclCommGetAsyncError)    \
  X(ncclGetErrorString)       \
  X(ncclGetLastError)         \
  X(ncclGroupStart)           \
  X(ncclGroupEnd)             \
  X(ncclSend)                 \
  X(ncclRecv)                 \
  X(ncclAllReduce)

// The resolved entry points, named as in nccl.h (api.ncclSend(...)), with what was loaded.
struct NcclApi {
#define DSI_NCCL_MEMBER(name) decltype(&::name) name = nullptr;
  DSI_NCCL_FUNCTIONS(DSI_NCCL_MEMBER)
#undef DSI_NCCL_MEMBER
  std::string library;   // the file loaded (as the dynamic loader names it)
  std::string version;   // "2.32.3"
  int version_code = 0;  // ncclGetVersion: major * 10000 + minor * 100 + patch
};

// Environment variable: a path to libnccl.so.2 to load instead of searching.
inline constexpr const char* kEnvNcclLibrary = "DSINFER_NCCL_LIBRARY";

// Loads NCCL on the first call (std::call_once; the outcome, success or failure, holds for the
// rest of the process; the library is never unloaded). Which file:
//   1. $DSINFER_NCCL_LIBRARY when set and not empty, and nothing else;
//   2. dlopen("libnccl.so.2"): the dynamic loader's search (LD_LIBRARY_PATH, the binary's
//      RUNPATH, which a build tree points at the NCCL that cmake/nccl.cmake found, ld.so.cache,
//      the system directories);
//   3. DSINFER_NCCL_FALLBACK_DIR/libnccl.so.2 (the directory found at configure time, e.g. the
//      nvidia-nccl-cu13 Python package's lib/), for binaries whose RUNPATH was dropped.
// Failure (kFailedPrecondition): "NCCL is not available: dlopen(libnccl.so.2) failed: <dlerror>;
// install nvidia-nccl-cu13 (pip) or set DSINFER_NCCL_LIBRARY / LD_LIBRARY_PATH", or the library
// lacks one of the functions, or it is older than NCCL 2.14.
Result<const NcclApi*> load_nccl();

}  // namespace dsinfer::comm

#endif  // DSINFER_HAVE_NCCL
