// FileOps: the file-system calls the SSD tier makes, behind an interface so that tests can inject
// faults (full disk, read-only directory, a crash between write and publish). The POSIX
// implementation writes a file completely and fsyncs it before it can be published by rename().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsinfer::kvstore {

class FileOps {
 public:
  virtual ~FileOps() = default;
  // Creates `path` (truncating), writes head then body, fsyncs and closes it.
  virtual Status write_file(const std::string& path, std::string_view head, std::string_view body);
  // Renames from -> to (atomic publish) and fsyncs the directory of `to`.
  virtual Status publish(const std::string& from, const std::string& to);
  // Reads up to max_bytes from offset 0 (fewer when the file is shorter).
  virtual Result<std::string> read_file(const std::string& path, uint64_t max_bytes);
  // File size; not_found when missing.
  virtual Result<uint64_t> file_size(const std::string& path);
  virtual Status remove(const std::string& path);
  // mkdir -p.
  virtual Status make_dirs(const std::string& path);
  // Names of the directory's regular files.
  virtual Result<std::vector<std::string>> list(const std::string& dir);
};

// The process-wide POSIX implementation.
FileOps* posix_file_ops();

}  // namespace dsinfer::kvstore
