// NCCL loaded at run time (src/comm/nccl_loader.h): a missing or wrong library is a clear Status
// from NcclComm::create / library_version, never a crash or a failure to start. No GPU, no CUDA
// call. The loader runs once per process (std::call_once), so every case runs in a child: gtest's
// "threadsafe" death-test style re-executes this binary for the one test, where nothing has loaded
// NCCL yet; the child sets DSINFER_NCCL_LIBRARY, prints what it got to stderr and exits 0 when it
// is as expected (the parent matches the message).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "comm/bootstrap.h"
#include "comm/nccl_comm.h"

namespace dsinfer::comm {
namespace {

constexpr const char* kEnvNcclLibrary = "DSINFER_NCCL_LIBRARY";
constexpr const char* kHint =
    "; install nvidia-nccl-cu13 (pip) or set DSINFER_NCCL_LIBRARY / LD_LIBRARY_PATH";

// `s` as a POSIX extended regular expression matching itself.
std::string quote(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string(".[]{}()\\*+?|^$").find(c) != std::string::npos)
      out += '\\';
    out += c;
  }
  return out;
}

// A valid rank 0 of 1: create() gets past its argument checks to loading NCCL (and fails there,
// before touching the id file or CUDA).
Bootstrap rank0_of_1() {
  return Bootstrap{.rank = 0, .size = 1, .id_file = "/nonexistent-dir/nccl_id", .timeout_ms = 1000};
}

// In the child: loads `library`; exits 0 when create(), library_version() and nccl_loadable()
// all report the same kFailedPrecondition (printed to stderr).
[[noreturn]] void unavailable_child(const std::string& library) {
  ::setenv(kEnvNcclLibrary, library.c_str(), 1);
  auto c = NcclComm::create(rank0_of_1(), 0, 1, 0);
  auto v = NcclComm::library_version();
  auto p = NcclComm::library_path();
  const bool loadable = NcclComm::nccl_loadable();
  std::fprintf(stderr, "create: %s\n", c.status().to_string().c_str());
  const bool ok = !c.ok() && c.status().code() == StatusCode::kFailedPrecondition && !v.ok() &&
                  v.status().message() == c.status().message() && !p.ok() &&
                  p.status().message() == c.status().message() && !loadable;
  std::fflush(stderr);
  std::_Exit(ok ? 0 : 1);
}

class NcclLoader : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!NcclComm::built_with_nccl())
      GTEST_SKIP() << "built without NCCL: nothing to load";
    GTEST_FLAG_SET(death_test_style, "threadsafe");
  }
};

TEST_F(NcclLoader, MissingLibraryIsAClearError) {
  const std::string lib = "/nonexistent/libnccl.so.2";
  EXPECT_EXIT(unavailable_child(lib),
              ::testing::ExitedWithCode(0),
              quote("NCCL is not available: dlopen(" + lib + ") failed: " + lib +
                    ": cannot open shared object file: No such file or directory "
                    "(DSINFER_NCCL_LIBRARY)" +
                    kHint));
}

TEST_F(NcclLoader, LibraryWithoutNcclIsAClearError) {
  // Loads fine, exports none of NCCL's functions.
  EXPECT_EXIT(unavailable_child("libc.so.6"),
              ::testing::ExitedWithCode(0),
              quote("NCCL is not available: ") + ".*libc\\.so\\.6 " +
                  quote("is not a usable NCCL (>= 2.14): it does not export ncclGetVersion, "
                        "ncclGetUniqueId, ncclCommInitRankConfig") +
                  ".*" + quote("ncclAllReduce" + std::string(kHint)));
}

TEST_F(NcclLoader, ExplicitLibraryLoads) {
#ifndef DSI_TEST_NCCL_LIBRARY
  GTEST_SKIP() << "no configure-time libnccl.so.2 path";
#else
  const std::string lib = DSI_TEST_NCCL_LIBRARY;
  if (::access(lib.c_str(), R_OK) != 0)
    GTEST_SKIP() << lib << " is gone";
  EXPECT_EXIT(
      {
        ::setenv(kEnvNcclLibrary, lib.c_str(), 1);
        auto v = NcclComm::library_version();
        auto p = NcclComm::library_path();
        std::fprintf(stderr,
                     "loaded %s: NCCL %s\n",
                     p.ok() ? p->c_str() : p.status().to_string().c_str(),
                     v.ok() ? v->c_str() : v.status().to_string().c_str());
        std::fflush(stderr);
        std::_Exit(v.ok() && v->rfind("2.", 0) == 0 && p.ok() && *p == lib &&
                           NcclComm::nccl_loadable()
                       ? 0
                       : 1);
      },
      ::testing::ExitedWithCode(0),
      quote("loaded " + lib + ": NCCL 2."));
#endif
}

}  // namespace
}  // namespace dsinfer::comm
