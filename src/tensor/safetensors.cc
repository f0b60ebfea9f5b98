// safetensors reader (mmap + full header validation) and writer.
//
// File layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON (an object mapping
// tensor name -> {"dtype", "shape", "data_offsets": [begin, end]} plus an optional
// "__metadata__" string -> string map), then the data section; offsets are relative to it.
#include "tensor/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "base/strings.h"

namespace dsinfer {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;  // 100 MB, like the reference lib

const char* json_type_name(const json& j) {
  return j.type_name();
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) {
      s += ", ";
    }
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Reads a JSON integer into a non-negative int64; false for any other value.
bool json_nonneg_int(const json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
    *out = static_cast<int64_t>(v);
    return true;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) {
      return false;
    }
    *out = v;
    return true;
  }
  return false;
}

// Validates UTF-8 so that nlohmann's dump() (which throws on invalid UTF-8) cannot throw.
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) {
      return false;
    }
    for (size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) {
        return false;
      }
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

}  // namespace

int64_t TensorInfo::numel() const {
  // Any zero dimension makes the tensor empty (checked first: the other dimensions of an empty
  // tensor may multiply past int64; parse() guarantees non-empty shapes do not).
  for (int64_t d : shape) {
    if (d == 0) {
      return 0;
    }
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) {
    munmap(map_, map_size_);
  }
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return not_found(path + ": no such file");
    }
    return io_error(path + ": cannot open: " + std::strerror(err));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return io_error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return data_loss(str_format(
        "%s: file is %zu bytes, too small for a safetensors header", path.c_str(), size));
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    return io_error(path + ": mmap failed: " + std::strerror(map_err));
  }

  auto parsed = parse(static_cast<const uint8_t*>(map), size, path);
  if (!parsed.ok()) {
    munmap(map, size);
    return parsed.status();
  }
  std::unique_ptr<SafetensorsFile> file = std::move(parsed).value();
  file->map_ = map;
  file->map_size_ = size;
  return file;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(const uint8_t* bytes,
                                                                size_t size,
                                                                const std::string& source) {
  const char* src = source.c_str();
  if (size < 8) {
    return data_loss(
        str_format("%s: file is %zu bytes, too small for a safetensors header", src, size));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    return data_loss(str_format("%s: header length %llu exceeds the 100 MB limit",
                                src,
                                static_cast<unsigned long long>(header_len)));
  }
  if (header_len > size - 8) {
    return data_loss(str_format("%s: header length %llu exceeds the file size (%zu bytes)",
                                src,
                                static_cast<unsigned long long>(header_len),
                                size));
  }
  const uint64_t data_size = size - 8 - header_len;
  const uint8_t* data = bytes + 8 + header_len;

  // Parse with a callback that records top-level keys so that duplicates (which nlohmann
  // silently collapses) are detected.
  std::set<std::string> seen_keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen_keys.insert(k).second && duplicate.empty()) {
        duplicate = k;
      }
    }
    return true;
  };
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  json header = json::parse(text, text + header_len, cb, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return data_loss(std::string(src) + ": header is not valid JSON");
  }
  if (!header.is_object()) {
    return data_loss(
        str_format("%s: header must be a JSON object, got %s", src, json_type_name(header)));
  }
  if (!duplicate.empty()) {
    return data_loss(
        str_format("%s: tensor '%s' appears more than once in the header", src, duplicate.c_str()));
  }

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = source;
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    const char* tn = name.c_str();
    if (name == "__metadata__") {
      if (!v.is_object()) {
        return data_loss(
            str_format("%s: __metadata__ must be an object, got %s", src, json_type_name(v)));
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return data_loss(str_format("%s: __metadata__ entry '%s' must be a string, got %s",
                                      src,
                                      m.key().c_str(),
                                      json_type_name(m.value())));
        }
        file->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (name.empty()) {
      return data_loss(std::string(src) + ": tensor with an empty name");
    }
    if (!v.is_object()) {
      return data_loss(str_format(
          "%s: tensor '%s': entry must be an object, got %s", src, tn, json_type_name(v)));
    }
    TensorInfo info;
    info.name = name;
    // dtype
    auto d = v.find("dtype");
    if (d == v.end()) {
      return data_loss(str_format("%s: tensor '%s': missing dtype", src, tn));
    }
    if (!d->is_string()) {
      return data_loss(str_format(
          "%s: tensor '%s': dtype must be a string, got %s", src, tn, json_type_name(*d)));
    }
    const std::string dtype_str = d->get<std::string>();
    std::optional<DType> dt = dtype_from_name(dtype_str);
    if (!dt) {
      return data_loss(
          str_format("%s: tensor '%s': unknown dtype '%s'", src, tn, dtype_str.c_str()));
    }
    info.dtype = *dt;
    // shape
    auto s = v.find("shape");
    if (s == v.end()) {
      return data_loss(str_format("%s: tensor '%s': missing shape", src, tn));
    }
    if (!s->is_array()) {
      return data_loss(str_format(
          "%s: tensor '%s': shape must be an array, got %s", src, tn, json_type_name(*s)));
    }
    if (s->size() > 16) {
      return data_loss(
          str_format("%s: tensor '%s': shape has %zu dimensions (max 16)", src, tn, s->size()));
    }
    int64_t numel = 1;
    bool overflow = false;
    for (const json& dim : *s) {
      int64_t x;
      if (!json_nonneg_int(dim, &x)) {
        return data_loss(
            str_format("%s: tensor '%s': shape entries must be non-negative integers, got %s",
                       src,
                       tn,
                       dim.dump(-1, ' ', false, json::error_handler_t::replace).c_str()));
      }
      info.shape.push_back(x);
      if (!overflow && __builtin_mul_overflow(numel, x, &numel)) {
        overflow = true;
      }
    }
    // Any zero dimension makes the tensor empty, whatever the other dimensions are.
    bool has_zero = false;
    for (int64_t x : info.shape) has_zero |= (x == 0);
    if (has_zero) {
      numel = 0;
      overflow = false;
    }
    int64_t nbytes = 0;
    if (overflow || __builtin_mul_overflow(numel, dtype_size(info.dtype), &nbytes)) {
      return data_loss(str_format(
          "%s: tensor '%s': shape %s is too large", src, tn, shape_string(info.shape).c_str()));
    }
    info.nbytes = nbytes;
    // data_offsets
    auto o = v.find("data_offsets");
    if (o == v.end()) {
      return data_loss(str_format("%s: tensor '%s': missing data_offsets", src, tn));
    }
    int64_t begin = 0, end = 0;
    if (!o->is_array() || o->size() != 2 || !json_nonneg_int((*o)[0], &begin) ||
        !json_nonneg_int((*o)[1], &end)) {
      return data_loss(str_format(
          "%s: tensor '%s': data_offsets must be two non-negative integers [begin, end]", src, tn));
    }
    if (end < begin) {
      return data_loss(str_format("%s: tensor '%s': data_offsets [%lld, %lld] end before begin",
                                  src,
                                  tn,
                                  static_cast<long long>(begin),
                                  static_cast<long long>(end)));
    }
    if (static_cast<uint64_t>(end) > data_size) {
      return data_loss(str_format(
          "%s: tensor '%s': data_offsets [%lld, %lld] extend past the data section (%llu bytes; "
          "file truncated?)",
          src,
          tn,
          static_cast<long long>(begin),
          static_cast<long long>(end),
          static_cast<unsigned long long>(data_size)));
    }
    if (end - begin != nbytes) {
      return data_loss(str_format(
          "%s: tensor '%s': data_offsets [%lld, %lld] span %lld bytes but dtype %s shape %s "
          "needs %lld",
          src,
          tn,
          static_cast<long long>(begin),
          static_cast<long long>(end),
          static_cast<long long>(end - begin),
          dtype_name(info.dtype),
          shape_string(info.shape).c_str(),
          static_cast<long long>(nbytes)));
    }
    info.data = data + begin;
    spans.push_back(
        {static_cast<uint64_t>(begin), static_cast<uint64_t>(end), file->tensors_.size()});
    file->tensors_.push_back(std::move(info));
  }

  // Overlaps: sort by begin (then end) and compare neighbours; empty tensors never overlap.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t prev_end = 0;
  size_t prev_index = 0;
  bool have_prev = false;
  for (const Span& sp : spans) {
    if (sp.begin == sp.end) {
      continue;
    }
    if (have_prev && sp.begin < prev_end) {
      return data_loss(str_format("%s: tensor '%s' overlaps tensor '%s' in the data section",
                                  src,
                                  file->tensors_[sp.index].name.c_str(),
                                  file->tensors_[prev_index].name.c_str()));
    }
    prev_end = sp.end;
    prev_index = sp.index;
    have_prev = true;
  }

  // Keep tensors in file order.
  std::vector<TensorInfo> ordered;
  ordered.reserve(file->tensors_.size());
  std::vector<Span> by_offset = spans;
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const Span& a, const Span& b) {
    return a.begin < b.begin;
  });
  for (const Span& sp : by_offset) ordered.push_back(std::move(file->tensors_[sp.index]));
  file->tensors_ = std::move(ordered);
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_[file->tensors_[i].name] = i;
  return file;
}

namespace {

// The header text (padded to a multiple of 8) for tensors stored back to back in the given order.
// `byte_sizes`, when given, are the caller's data sizes, checked against dtype x shape.
Result<std::string> build_header(const std::string& path,
                                 const std::vector<TensorSpec>& tensors,
                                 const std::vector<size_t>* byte_sizes,
                                 const std::map<std::string, std::string>& metadata,
                                 std::vector<uint64_t>* offsets) {
  json header = json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  offsets->clear();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__" || !valid_utf8(t.name)) {
      return invalid_argument(path + ": invalid tensor name '" + t.name + "'");
    }
    if (!names.insert(t.name).second) {
      return invalid_argument(path + ": duplicate tensor name '" + t.name + "'");
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) {
        return invalid_argument(path + ": tensor '" + t.name + "' has an invalid shape " +
                                shape_string(t.shape));
      }
    }
    int64_t expected = 0;
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(t.dtype)), &expected)) {
      return invalid_argument(path + ": tensor '" + t.name + "' has an invalid shape " +
                              shape_string(t.shape));
    }
    if (byte_sizes != nullptr && static_cast<int64_t>((*byte_sizes)[i]) != expected) {
      return invalid_argument(
          str_format("%s: tensor '%s' has %zu bytes, but dtype %s shape %s needs %lld",
                     path.c_str(),
                     t.name.c_str(),
                     (*byte_sizes)[i],
                     dtype_name(t.dtype),
                     shape_string(t.shape).c_str(),
                     static_cast<long long>(expected)));
    }
    json entry = json::object();
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + static_cast<uint64_t>(expected)};
    header[t.name] = std::move(entry);
    offsets->push_back(offset);
    offset += static_cast<uint64_t>(expected);
  }
  offsets->push_back(offset);
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : metadata) {
      if (!valid_utf8(k) || !valid_utf8(v)) {
        return invalid_argument(path + ": metadata entry '" + k + "' is not valid UTF-8");
      }
      meta[k] = v;
    }
    header["__metadata__"] = std::move(meta);
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  return text;
}

// pwrite until done (short writes and EINTR retried).
bool pwrite_all(int fd, const void* data, size_t n, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) {
        continue;
      }
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::create(
    const std::string& path,
    const std::vector<TensorSpec>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  DSI_ASSIGN_OR_RETURN(std::string text,
                       build_header(path, tensors, nullptr, metadata, &w->offsets_));
  w->path_ = path;
  w->data_begin_ = 8 + text.size();
  w->file_bytes_ = w->data_begin_ + w->offsets_.back();
  w->written_ = std::make_unique<std::atomic<int64_t>[]>(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) w->written_[i] = 0;
  w->num_tensors_ = tensors.size();
  w->names_.reserve(tensors.size());
  for (const TensorSpec& t : tensors) w->names_.push_back(t.name);

  w->fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) {
    return io_error(path + ": cannot create: " + std::strerror(errno));
  }
  uint8_t len_bytes[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  // Size the file up front: every tensor then has its final place, and gaps read as zeros.
  if (::ftruncate(w->fd_, static_cast<off_t>(w->file_bytes_)) != 0 ||
      !pwrite_all(w->fd_, len_bytes, 8, 0) || !pwrite_all(w->fd_, text.data(), text.size(), 8)) {
    return io_error(path + ": write failed: " + std::strerror(errno));
  }
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

int64_t SafetensorsWriter::tensor_bytes(size_t i) const {
  return static_cast<int64_t>(offsets_[i + 1] - offsets_[i]);
}

Status SafetensorsWriter::write(size_t tensor, int64_t offset, const void* data, int64_t n) {
  if (fd_ < 0) {
    return failed_precondition(path_ + ": writer is closed");
  }
  if (tensor >= num_tensors_ || offset < 0 || n < 0 || offset + n > tensor_bytes(tensor)) {
    return invalid_argument(str_format("%s: write of %lld bytes at %lld is outside tensor %zu",
                                       path_.c_str(),
                                       static_cast<long long>(n),
                                       static_cast<long long>(offset),
                                       tensor));
  }
  if (n > 0 && !pwrite_all(fd_,
                           data,
                           static_cast<size_t>(n),
                           data_begin_ + offsets_[tensor] + static_cast<uint64_t>(offset))) {
    return io_error(path_ + ": write failed: " + std::strerror(errno));
  }
  written_[tensor] += n;
  return Status::ok_status();
}

Status SafetensorsWriter::finish() {
  if (fd_ < 0) {
    return failed_precondition(path_ + ": writer is closed");
  }
  for (size_t i = 0; i < num_tensors_; ++i) {
    if (written_[i].load() != tensor_bytes(i)) {
      ::close(fd_);
      fd_ = -1;
      return failed_precondition(str_format("%s: tensor '%s' got %lld of its %lld bytes",
                                            path_.c_str(),
                                            names_[i].c_str(),
                                            static_cast<long long>(written_[i].load()),
                                            static_cast<long long>(tensor_bytes(i))));
    }
  }
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    return io_error(path_ + ": write failed: " + std::strerror(errno));
  }
  return Status::ok_status();
}

Status write_safetensors(const std::string& path,
                         const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  std::vector<size_t> sizes;
  specs.reserve(tensors.size());
  sizes.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    specs.push_back({t.name, t.dtype, t.shape});
    sizes.push_back(t.bytes.size());
  }
  std::vector<uint64_t> offsets;
  DSI_RETURN_IF_ERROR(build_header(path, specs, &sizes, metadata, &offsets).status());
  DSI_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create(path, specs, metadata));
  for (size_t i = 0; i < tensors.size(); ++i) {
    DSI_RETURN_IF_ERROR(writer->write(
        i, 0, tensors[i].bytes.data(), static_cast<int64_t>(tensors[i].bytes.size())));
  }
  return writer->finish();
}

TensorToWrite f32_tensor(const std::string& name,
                         std::vector<int64_t> shape,
                         const std::vector<float>& values) {
  TensorToWrite t;
  t.name = name;
  t.dtype = DType::kF32;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  DSI_CHECK(numel == static_cast<int64_t>(values.size()),
            "f32_tensor %s: %lld values for %lld",
            name.c_str(),
            static_cast<long long>(values.size()),
            static_cast<long long>(numel));
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * sizeof(float));
  if (!values.empty()) {
    std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  }
  return t;
}

}  // namespace dsinfer
