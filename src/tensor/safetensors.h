// safetensors files: a read-only mmap'ed reader that validates the header completely (JSON,
// dtypes, shapes, offsets inside the file, no overlaps), a small in-memory writer and a writer
// that streams tensor data into a pre-laid-out file from several threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"

namespace dsinfer {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t nbytes = 0;
  const void* data = nullptr;  // points into the mapping; valid while the file object lives

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates its header. Errors name the file and the offending tensor.
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Parses an in-memory image (used by the fuzzer and tests); `bytes` must outlive the object.
  static Result<std::unique_ptr<SafetensorsFile>> parse(const uint8_t* bytes,
                                                        size_t size,
                                                        const std::string& source);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;  // null when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // exactly numel * dtype_size bytes
};

// Name, dtype and shape of a tensor to be written (its data comes later).
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// A safetensors file whose header (and so every tensor's place) is fixed when it is created; the
// data is then written piecewise at any offset, from any number of threads (pwrite), so a large
// file never has to exist in memory. Tensors are stored back to back in the given order.
class SafetensorsWriter {
 public:
  // Validates names and shapes (same rules and messages as write_safetensors), creates `path`
  // at its final size and writes the header.
  static Result<std::unique_ptr<SafetensorsWriter>> create(
      const std::string& path,
      const std::vector<TensorSpec>& tensors,
      const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // closes the file; it is complete only if finish() succeeded
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  size_t num_tensors() const { return num_tensors_; }
  int64_t tensor_bytes(size_t tensor) const;
  uint64_t file_bytes() const { return file_bytes_; }  // header + data
  // Writes `n` bytes at byte `offset` of tensor `tensor` (index in creation order). Thread-safe;
  // each byte of each tensor must be written exactly once.
  Status write(size_t tensor, int64_t offset, const void* data, int64_t n);
  // Checks that every tensor received all its bytes and closes the file.
  Status finish();

 private:
  SafetensorsWriter() = default;
  std::string path_;
  int fd_ = -1;
  size_t num_tensors_ = 0;
  std::vector<std::string> names_;
  std::vector<uint64_t> offsets_;  // data-section offsets, plus the end
  uint64_t data_begin_ = 0;
  uint64_t file_bytes_ = 0;
  std::unique_ptr<std::atomic<int64_t>[]> written_;
};

// Writes a safetensors file (tensors in the given order, 8-byte aligned header).
Status write_safetensors(const std::string& path,
                         const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// Convenience: a float32 tensor from values.
TensorToWrite f32_tensor(const std::string& name,
                         std::vector<int64_t> shape,
                         const std::vector<float>& values);

}  // namespace dsinfer
