// safetensors files: a read-only mmap'ed reader that validates the header completely (JSON,
// dtypes, shapes, offsets inside the file, no overlaps) and a small writer.
#pragma once

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

// Writes a safetensors file (tensors in the given order, 8-byte aligned header).
Status write_safetensors(const std::string& path,
                         const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// Convenience: a float32 tensor from values.
TensorToWrite f32_tensor(const std::string& name,
                         std::vector<int64_t> shape,
                         const std::vector<float>& values);

}  // namespace dsinfer
