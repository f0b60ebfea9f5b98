// POSIX file operations with errno in every message.
#include "kvstore/file_ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/strings.h"

namespace dsinfer::kvstore {
namespace {
Status errno_status(const char* what, const std::string& path) {
  return io_error(str_format("%s %s: %s", what, path.c_str(), std::strerror(errno)));
}

Status write_all(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return errno_status("write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status();
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}
}  // namespace

Status FileOps::write_file(const std::string& path, std::string_view head, std::string_view body) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return errno_status("create", path);
  Status s = write_all(fd, head, path);
  if (s.ok())
    s = write_all(fd, body, path);
  if (s.ok() && ::fsync(fd) != 0)
    s = errno_status("fsync", path);
  if (::close(fd) != 0 && s.ok())
    s = errno_status("close", path);
  return s;
}

Status FileOps::publish(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    return errno_status("rename to", to);
  const std::string dir = parent_dir(to);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  return Status();
}

Result<std::string> FileOps::read_file(const std::string& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return not_found(str_format("%s: no such file", path.c_str()));
    return errno_status("open", path);
  }
  std::string out;
  char buf[1 << 16];
  while (out.size() < max_bytes) {
    const size_t want = std::min<uint64_t>(sizeof(buf), max_bytes - out.size());
    const ssize_t n = ::read(fd, buf, want);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      Status s = errno_status("read", path);
      ::close(fd);
      return s;
    }
    if (n == 0)
      break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Result<uint64_t> FileOps::file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return not_found(str_format("%s: no such file", path.c_str()));
    return errno_status("stat", path);
  }
  return static_cast<uint64_t>(st.st_size);
}

Status FileOps::remove(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return errno_status("remove", path);
  return Status();
}

Status FileOps::make_dirs(const std::string& path) {
  std::string cur;
  size_t i = 0;
  while (i <= path.size()) {
    const size_t j = path.find('/', i);
    const size_t end = j == std::string::npos ? path.size() : j;
    cur = path.substr(0, end);
    if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      return errno_status("mkdir", cur);
    if (j == std::string::npos)
      break;
    i = j + 1;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return io_error(str_format("%s is not a directory", path.c_str()));
  return Status();
}

Result<std::vector<std::string>> FileOps::list(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr)
    return errno_status("list", dir);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..")
      continue;
    names.push_back(name);
  }
  ::closedir(d);
  return names;
}

FileOps* posix_file_ops() {
  static FileOps ops;
  return &ops;
}

}  // namespace dsinfer::kvstore
