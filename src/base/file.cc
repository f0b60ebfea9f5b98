// Whole-file reads.
#include "base/file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/strings.h"

namespace dsinfer {

Result<std::string> read_text_file(const std::string& path, uint64_t max_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    if (err == ENOENT)
      return not_found(path + ": no such file");
    return io_error(path + ": cannot open: " + std::strerror(err));
  }
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    text.append(buf, n);
    if (text.size() > max_bytes) {
      std::fclose(f);
      return invalid_argument(path + ": file is larger than " + human_bytes(max_bytes));
    }
  }
  const bool read_error = std::ferror(f) != 0;
  std::fclose(f);
  if (read_error)
    return io_error(path + ": read error");
  return text;
}

}  // namespace dsinfer
