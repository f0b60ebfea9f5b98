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

Status write_safetensors(const std::string& path,
                         const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
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
    const int64_t expected = numel * dtype_size(t.dtype);
    if (static_cast<int64_t>(t.bytes.size()) != expected) {
      return invalid_argument(
          str_format("%s: tensor '%s' has %zu bytes, but dtype %s shape %s needs %lld",
                     path.c_str(),
                     t.name.c_str(),
                     t.bytes.size(),
                     dtype_name(t.dtype),
                     shape_string(t.shape).c_str(),
                     static_cast<long long>(expected)));
    }
    json entry = json::object();
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.bytes.size()};
    header[t.name] = std::move(entry);
    offset += t.bytes.size();
  }
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

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return io_error(path + ": cannot create: " + std::strerror(errno));
  }
  uint8_t len_bytes[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  bool ok = std::fwrite(len_bytes, 1, 8, f) == 8 &&
            std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const TensorToWrite& t : tensors) {
    if (!ok) {
      break;
    }
    if (!t.bytes.empty()) {
      ok = std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
    }
  }
  const int close_rc = std::fclose(f);
  if (!ok || close_rc != 0) {
    return io_error(path + ": write failed: " + std::strerror(errno));
  }
  return Status::ok_status();
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
