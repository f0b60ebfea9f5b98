// NCCL loaded with dlopen/dlsym on first use (see nccl_loader.h).
#include "comm/nccl_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "base/strings.h"

namespace dsinfer::comm {
namespace {

constexpr const char* kSoname = "libnccl.so.2";
constexpr const char* kInstallHint =
    "install nvidia-nccl-cu13 (pip) or set DSINFER_NCCL_LIBRARY / LD_LIBRARY_PATH";

Status unavailable(const std::string& why) {
  return failed_precondition("NCCL is not available: " + why + "; " + kInstallHint);
}

// dlopen(name); on failure nullptr and "dlopen(name) failed: <dlerror()>" in *why.
void* open_library(const std::string& name, std::string* why) {
  (void)::dlerror();
  void* h = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = ::dlerror();
    *why = "dlopen(" + name + ") failed: " + (e != nullptr ? e : "unknown error");
  }
  return h;
}

// dlsym(handle, name) into *fn; false (and name appended to *missing) when absent.
template <typename Fn>
bool resolve(void* handle, const char* name, Fn* fn, std::vector<std::string>* missing) {
  (void)::dlerror();
  void* p = ::dlsym(handle, name);
  if (p == nullptr) {
    missing->push_back(name);
    return false;
  }
  static_assert(sizeof(Fn) == sizeof(void*), "function and object pointers differ in size");
  std::memcpy(fn, &p, sizeof(p));  // POSIX: dlsym's object pointer is the function's address
  return true;
}

std::string version_string(int v) {
  // Since 2.9 the code is major * 10000 + minor * 100 + patch; before, major * 1000 + minor * 100.
  const int major = v >= 10000 ? v / 10000 : v / 1000;
  const int minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10;
  return str_format("%d.%d.%d", major, minor, v % 100);
}

Status load_into(NcclApi* api) {
  void* handle = nullptr;
  std::string opened;
  const char* env = std::getenv(kEnvNcclLibrary);
  if (env != nullptr && env[0] != '\0') {
    // An explicit choice: no fallback when it fails.
    std::string why;
    handle = open_library(env, &why);
    if (handle == nullptr)
      return unavailable(why + " (" + kEnvNcclLibrary + ")");
    opened = env;
  } else {
    std::string why;
    handle = open_library(kSoname, &why);
    opened = kSoname;
#ifdef DSINFER_NCCL_FALLBACK_DIR
    if (handle == nullptr) {
      const std::string fallback = std::string(DSINFER_NCCL_FALLBACK_DIR) + "/" + kSoname;
      std::string why2;
      handle = open_library(fallback, &why2);
      if (handle == nullptr)
        why += "; " + why2;
      opened = fallback;
    }
#endif
    if (handle == nullptr)
      return unavailable(why);
  }

  std::vector<std::string> missing;
#define DSI_NCCL_RESOLVE(name) resolve(handle, #name, &api->name, &missing);
  DSI_NCCL_FUNCTIONS(DSI_NCCL_RESOLVE)
#undef DSI_NCCL_RESOLVE
  Dl_info info{};
  if (api->ncclGetVersion != nullptr &&
      ::dladdr(reinterpret_cast<void*>(api->ncclGetVersion), &info) != 0 &&
      info.dli_fname != nullptr && info.dli_fname[0] != '\0')
    opened = info.dli_fname;
  if (!missing.empty()) {
    (void)::dlclose(handle);
    std::string names;
    for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m;
    return unavailable(opened + " is not a usable NCCL (>= 2.14): it does not export " + names);
  }
  int v = 0;
  const ncclResult_t r = api->ncclGetVersion(&v);
  if (r != ncclSuccess || v < NCCL_VERSION(2, 14, 0)) {
    (void)::dlclose(handle);
    if (r != ncclSuccess)
      return unavailable(opened + ": ncclGetVersion failed (" + std::to_string(r) + ")");
    return unavailable(opened + " is NCCL " + version_string(v) +
                       ", older than 2.14 (ncclConfig_t, ncclCommFinalize)");
  }
  api->library = opened;
  api->version = version_string(v);
  api->version_code = v;
  return Status();
}

struct Loaded {
  NcclApi api;
  Status status;
};

}  // namespace

Result<const NcclApi*> load_nccl() {
  static std::once_flag once;
  static Loaded* loaded = nullptr;  // never freed: NCCL stays loaded until the process exits
  std::call_once(once, [] {
    auto* l = new Loaded();
    l->status = load_into(&l->api);
    if (!l->status.ok())
      l->api = NcclApi{};  // no dangling pointers into an unloaded library
    loaded = l;
  });
  if (!loaded->status.ok())
    return loaded->status;
  return static_cast<const NcclApi*>(&loaded->api);
}

}  // namespace dsinfer::comm
