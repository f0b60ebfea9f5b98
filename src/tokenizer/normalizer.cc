#include "tokenizer/normalizer.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tokenizer/utf8.h"

namespace dsinfer::tokenizer {

namespace {

struct CccRange {
  uint32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  uint32_t cp, first, second;
};
struct Composition {
  uint32_t first, second, composite;
};

#include "tokenizer/unicode_nfc_tables.inc"

// Hangul syllable arithmetic (Unicode section 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t ccc(uint32_t cp) {
  if (cp < 0x300)
    return 0;
  const auto* end = std::end(kCccRanges);
  const auto* it = std::upper_bound(
      std::begin(kCccRanges), end, cp, [](uint32_t c, const CccRange& r) { return c < r.first; });
  if (it == std::begin(kCccRanges))
    return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0)
      out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    const auto* end = std::end(kDecompositions);
    const auto* it = std::lower_bound(
        std::begin(kDecompositions), end, cp, [](const Decomposition& d, uint32_t c) {
          return d.cp < c;
        });
    if (it != end && it->cp == cp) {
      decompose(it->first, out);
      if (it->second != 0)
        decompose(it->second, out);
      return;
    }
  }
  out->push_back(cp);
}

// Composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto* end = std::end(kCompositions);
  const auto* it =
      std::lower_bound(std::begin(kCompositions),
                       end,
                       std::make_pair(a, b),
                       [](const Composition& c, const std::pair<uint32_t, uint32_t>& k) {
                         return c.first != k.first ? c.first < k.first : c.second < k.second;
                       });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

std::string nfc(std::string_view text) {
  // Quick check: code points below U+0300 are NFC and never compose with what precedes them.
  bool simple = true;
  for (size_t i = 0; i < text.size() && simple; ++i) {
    const uint8_t b = static_cast<uint8_t>(text[i]);
    simple = b < 0xCC;  // ASCII, continuation bytes, and lead bytes of U+0080..U+02FF
  }
  if (simple)
    return std::string(text);

  // Decompose, then order each run of non-starters by combining class (stable).
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) decompose(utf8::next_code_point(text, &pos), &cps);
  std::vector<uint8_t> cls(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = ccc(cps[i]);
  for (size_t i = 0; i < cps.size();) {
    if (cls[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && cls[j] != 0) ++j;
    if (j - i > 1) {
      std::vector<std::pair<uint8_t, uint32_t>> run;
      for (size_t k = i; k < j; ++k) run.emplace_back(cls[k], cps[k]);
      std::stable_sort(
          run.begin(), run.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      for (size_t k = i; k < j; ++k) {
        cls[k] = run[k - i].first;
        cps[k] = run[k - i].second;
      }
    }
    i = j;
  }

  // Canonical composition.
  std::string out;
  out.reserve(text.size());
  size_t starter = SIZE_MAX;  // index in `kept` of the last starter
  std::vector<uint32_t> kept;
  std::vector<uint8_t> kept_cls;
  kept.reserve(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t cp = cps[i];
    const uint8_t c = cls[i];
    if (starter != SIZE_MAX) {
      // Blocked if a character between the starter and this one has ccc 0 or >= c.
      const uint8_t last_cls = kept.size() - 1 == starter ? 0 : kept_cls.back();
      const bool adjacent = kept.size() - 1 == starter;
      if (adjacent || (last_cls != 0 && last_cls < c)) {
        const uint32_t comp = compose(kept[starter], cp);
        if (comp != 0) {
          kept[starter] = comp;
          continue;
        }
      }
    }
    if (c == 0)
      starter = kept.size();
    kept.push_back(cp);
    kept_cls.push_back(c);
  }
  for (uint32_t cp : kept) utf8::append_code_point(cp, &out);
  return out;
}

std::string normalize(NormalizerKind kind, std::string_view text) {
  return kind == NormalizerKind::kNfc ? nfc(text) : std::string(text);
}

}  // namespace dsinfer::tokenizer
