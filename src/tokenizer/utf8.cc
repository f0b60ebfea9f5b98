#include "tokenizer/utf8.h"

#include <array>
#include <cstring>

namespace dsinfer::tokenizer::utf8 {

namespace {

enum class Seq { kValid, kInvalid, kTruncated };

// Classifies the sequence starting at p[0] (n >= 1 bytes available). Sets *len to the length of
// the valid character, of the maximal ill-formed subpart (>= 1), or of the truncated prefix.
inline Seq classify(const uint8_t* p, size_t n, size_t* len) {
  const uint8_t b0 = p[0];
  if (b0 < 0x80) {
    *len = 1;
    return Seq::kValid;
  }
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0)
      lo = 0xA0;
    if (b0 == 0xED)
      hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0)
      lo = 0x90;
    if (b0 == 0xF4)
      hi = 0x8F;
  } else {
    *len = 1;  // 80..C1, F5..FF never start a sequence
    return Seq::kInvalid;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) {
      *len = i;
      return Seq::kTruncated;
    }
    const uint8_t b = p[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *len = i;
      return Seq::kInvalid;
    }
  }
  *len = need;
  return Seq::kValid;
}

inline bool all_ascii8(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return (w & 0x8080808080808080ull) == 0;
}

}  // namespace

bool is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n && all_ascii8(p + i)) {
      i += 8;
      continue;
    }
    size_t len;
    if (classify(p + i, n - i, &len) != Seq::kValid)
      return false;
    i += len;
  }
  return true;
}

size_t append_lossy(std::string_view s, bool final, std::string* out) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  size_t run = 0;  // start of the pending run of valid bytes
  while (i < n) {
    if (i + 8 <= n && all_ascii8(p + i)) {
      i += 8;
      continue;
    }
    size_t len;
    const Seq kind = classify(p + i, n - i, &len);
    if (kind == Seq::kValid) {
      i += len;
      continue;
    }
    out->append(s.data() + run, i - run);
    if (kind == Seq::kTruncated && !final)
      return i;
    out->append(kReplacement);
    i += len;
    run = i;
  }
  out->append(s.data() + run, n - run);
  return n;
}

uint32_t next_code_point(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + *pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) {
    *pos += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    *pos += 2;
    return (uint32_t(b0 & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (b0 < 0xF0) {
    *pos += 3;
    return (uint32_t(b0 & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *pos += 4;
  return (uint32_t(b0 & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) |
         (uint32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

uint32_t prev_code_point(std::string_view s, size_t end, size_t* start) {
  size_t b = end;
  do {
    --b;
  } while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80);
  *start = b;
  size_t pos = b;
  return next_code_point(s, &pos);
}

void append_code_point(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_white_space(uint32_t cp) {
  if (cp <= 0x20)
    return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85)
    return false;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

struct ByteMap {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 0x144> to_byte{};  // stand-ins are all below U+0144
  ByteMap() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

uint32_t byte_to_char(uint8_t b) {
  return byte_map().to_char[b];
}

int char_to_byte(uint32_t cp) {
  return cp < 0x144 ? byte_map().to_byte[cp] : -1;
}

}  // namespace dsinfer::tokenizer::utf8
