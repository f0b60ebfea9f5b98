// Rank environment and the id file (host only).
#include "comm/bootstrap.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "base/strings.h"

namespace dsinfer::comm {
namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

// The variable's value as an integer in [lo, hi].
Result<int64_t> env_int(const char* name, int64_t lo, int64_t hi, const char* hint) {
  const char* v = std::getenv(name);
  if (v == nullptr)
    return invalid_argument(str_format("%s is not set (%s)", name, hint));
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (v[0] == '\0' || std::isspace(static_cast<unsigned char>(v[0])) || end == v || *end != '\0' ||
      errno == ERANGE)
    return invalid_argument(str_format("%s='%s' is not an integer", name, v));
  if (x < lo || x > hi)
    return invalid_argument(str_format("%s=%lld is out of range [%lld, %lld]",
                                       name,
                                       x,
                                       static_cast<long long>(lo),
                                       static_cast<long long>(hi)));
  return static_cast<int64_t>(x);
}

Status write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return io_error(errno_text(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status();
}

// Reads the file in full (at most max_bytes + 1 bytes, so a larger file is detected).
Result<std::string> read_small_file(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT)
      return not_found(path + ": no such file");
    return io_error(path + ": cannot open: " + errno_text(err));
  }
  std::string data;
  char buf[512];
  while (data.size() <= max_bytes) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      const int err = errno;
      ::close(fd);
      return io_error(path + ": read error: " + errno_text(err));
    }
    if (r == 0)
      break;
    data.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return data;
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

bool rank_env_present() {
  return std::getenv(kEnvRank) != nullptr;
}

Result<Bootstrap> bootstrap_from_env() {
  constexpr const char* kHint = "set for every rank by `dsinfer ... --ep N`";
  Bootstrap b;
  DSI_ASSIGN_OR_RETURN(const int64_t size, env_int(kEnvSize, 1, kMaxRanks, kHint));
  DSI_ASSIGN_OR_RETURN(const int64_t rank, env_int(kEnvRank, 0, size - 1, kHint));
  b.size = static_cast<int>(size);
  b.rank = static_cast<int>(rank);
  const char* file = std::getenv(kEnvIdFile);
  if (file == nullptr)
    return invalid_argument(str_format("%s is not set (%s)", kEnvIdFile, kHint));
  if (file[0] == '\0')
    return invalid_argument(str_format("%s is empty (it must name the id file path)", kEnvIdFile));
  b.id_file = file;
  if (const char* t = std::getenv(kEnvTimeout); t != nullptr) {
    char* end = nullptr;
    errno = 0;
    const double s = std::strtod(t, &end);
    if (t[0] == '\0' || std::isspace(static_cast<unsigned char>(t[0])) || end == t ||
        *end != '\0' || errno == ERANGE || !std::isfinite(s) || s <= 0.0 || s > 86400.0)
      return invalid_argument(
          str_format("%s='%s' is not a number of seconds in (0, 86400]", kEnvTimeout, t));
    b.timeout_ms = std::max<int64_t>(1, static_cast<int64_t>(std::llround(s * 1000.0)));
  }
  return b;
}

Status publish_unique_id(const std::string& path, const UniqueId& id) {
  if (path.empty())
    return invalid_argument("publish_unique_id: empty id file path");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return io_error(tmp + ": cannot create: " + errno_text(errno));
  Status st = write_all(fd, id.data(), id.size());
  if (st.ok() && ::fsync(fd) != 0)
    st = io_error(errno_text(errno));
  if (::close(fd) != 0 && st.ok())
    st = io_error(errno_text(errno));
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    st = io_error("rename to " + path + ": " + errno_text(errno));
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st.with_context("publishing the NCCL id to " + tmp);
  }
  return Status();
}

Result<UniqueId> await_unique_id(const std::string& path, int64_t timeout_ms) {
  if (path.empty())
    return invalid_argument("await_unique_id: empty id file path");
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms));
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    struct stat sb {};
    if (::stat(path.c_str(), &sb) == 0)
      break;
    if (errno != ENOENT)
      return io_error(path + ": " + errno_text(errno));
    if (std::chrono::steady_clock::now() >= deadline)
      return not_found(str_format(
          "timed out after %.1f s waiting for the NCCL id file %s: rank 0 did not publish it "
          "(is rank 0 running, and is %s the same path for every rank?)",
          static_cast<double>(timeout_ms) / 1000.0,
          path.c_str(),
          kEnvIdFile));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
  DSI_ASSIGN_OR_RETURN(const std::string data, read_small_file(path, kUniqueIdBytes));
  if (data.size() != kUniqueIdBytes)
    return data_loss(str_format("%s: NCCL id file holds %zu bytes, expected %zu",
                                path.c_str(),
                                data.size(),
                                kUniqueIdBytes));
  UniqueId id{};
  std::memcpy(id.data(), data.data(), kUniqueIdBytes);
  return id;
}

Result<std::string> make_id_file_path() {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string templ = (tmpdir != nullptr && tmpdir[0] != '\0') ? tmpdir : "/tmp";
  templ += "/dsinfer-ep-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    return io_error(templ + ": mkdtemp: " + errno_text(errno));
  return templ + "/nccl_id";
}

Status remove_id_file(const std::string& path) {
  if (path.empty())
    return Status();
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return io_error(path + ": unlink: " + errno_text(errno));
  // Temporary files of a publisher that died between write and rename.
  const std::string dir = dir_of(path);
  const std::string prefix = base_of(path) + ".tmp.";
  if (DIR* d = ::opendir(dir.c_str()); d != nullptr) {
    while (const dirent* e = ::readdir(d)) {
      if (str_starts_with(e->d_name, prefix))
        ::unlink((dir + "/" + e->d_name).c_str());
    }
    ::closedir(d);
  }
  if (str_starts_with(base_of(dir), "dsinfer-ep-") && ::rmdir(dir.c_str()) != 0 &&
      errno != ENOENT && errno != ENOTEMPTY)
    return io_error(dir + ": rmdir: " + errno_text(errno));
  return Status();
}

}  // namespace dsinfer::comm
