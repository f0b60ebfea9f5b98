// NumPy SeedSequence + PCG64 + bounded integers, for the Engram hash multipliers.
#include "model_v41/engram.h"

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/file.h"

namespace dsinfer::model_v41 {

namespace {

using u128 = unsigned __int128;

// SeedSequence(entropy).generate_state(n_words, uint32) for an entropy below 2^32 (one word).
std::vector<uint32_t> seed_sequence_state(uint32_t entropy, int n_words) {
  constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd,
                     kMultB = 0x58f38ded, kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
  constexpr int kXShift = 16, kPool = 4;
  uint32_t hash_const = kInitA;
  auto hashmix = [&](uint32_t v) {
    v ^= hash_const;
    hash_const *= kMultA;
    v *= hash_const;
    v ^= v >> kXShift;
    return v;
  };
  auto mix = [](uint32_t x, uint32_t y) {
    uint32_t r = kMixMultL * x - kMixMultR * y;
    r ^= r >> kXShift;
    return r;
  };
  uint32_t pool[kPool];
  for (int i = 0; i < kPool; ++i) pool[i] = hashmix(i == 0 ? entropy : 0u);
  for (int s = 0; s < kPool; ++s) {
    for (int d = 0; d < kPool; ++d) {
      if (s != d) {
        pool[d] = mix(pool[d], hashmix(pool[s]));
      }
    }
  }
  std::vector<uint32_t> out(static_cast<size_t>(n_words));
  uint32_t hc = kInitB;
  for (int i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPool];
    v ^= hc;
    hc *= kMultB;
    v *= hc;
    v ^= v >> kXShift;
    out[static_cast<size_t>(i)] = v;
  }
  return out;
}

const u128 kPcgMult = (static_cast<u128>(2549297995355413924ULL) << 64) | 4865540595714422341ULL;

}  // namespace

NumpyPcg64::NumpyPcg64(uint64_t seed) {
  const std::vector<uint32_t> w = seed_sequence_state(static_cast<uint32_t>(seed), 8);
  uint64_t v[4];
  for (int i = 0; i < 4; ++i) {
    v[i] = static_cast<uint64_t>(w[static_cast<size_t>(2 * i)]) |
           (static_cast<uint64_t>(w[static_cast<size_t>(2 * i + 1)]) << 32);
  }
  const u128 initstate = (static_cast<u128>(v[0]) << 64) | v[1];
  const u128 initseq = (static_cast<u128>(v[2]) << 64) | v[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  state_ = state_ * kPcgMult + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMult + inc_;
}

uint64_t NumpyPcg64::next_u64() {
  state_ = state_ * kPcgMult + inc_;
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint64_t NumpyPcg64::bounded(uint64_t high) {
  const uint64_t rng_excl = high;  // values in [0, high - 1]
  u128 m = static_cast<u128>(next_u64()) * rng_excl;
  uint64_t leftover = static_cast<uint64_t>(m);
  if (leftover < rng_excl) {
    const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - (high - 1)) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<u128>(next_u64()) * rng_excl;
      leftover = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

std::vector<std::vector<int64_t>> engram_multipliers(const V41Config& c) {
  std::vector<std::vector<int64_t>> out;
  if (c.engram_compressed_vocab_size <= 0) {
    return out;
  }
  const int64_t bound = (std::numeric_limits<int64_t>::max() / c.engram_compressed_vocab_size) / 2;
  for (int layer : c.engram_layer_ids) {
    NumpyPcg64 g(static_cast<uint64_t>(10007) * static_cast<uint64_t>(layer));
    std::vector<int64_t> row;
    for (int64_t i = 0; i < c.engram_max_ngram_size; ++i) {
      row.push_back(2 * static_cast<int64_t>(g.bounded(static_cast<uint64_t>(bound))) + 1);
    }
    out.push_back(row);
  }
  return out;
}

Result<std::vector<int32_t>> load_engram_token_map(const std::string& path, const V41Config& c) {
  DSI_ASSIGN_OR_RETURN(std::string text, read_text_file(path, uint64_t{1} << 28));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("token_map") ||
      !j["token_map"].is_array()) {
    return invalid_argument(path + ": not a JSON object with a 'token_map' list");
  }
  const auto& m = j["token_map"];
  if (static_cast<int64_t>(m.size()) != c.vocab_size) {
    return invalid_argument(path + ": token_map has " + std::to_string(m.size()) +
                            " entries, the config's vocab_size is " + std::to_string(c.vocab_size));
  }
  std::vector<int32_t> phi;
  phi.reserve(m.size());
  int32_t next = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    if (!m[i].is_number_integer()) {
      return invalid_argument(path + ": token_map entry " + std::to_string(i) +
                              " is not an integer");
    }
    const int64_t v = m[i].get<int64_t>();
    if (v < 0 || v > next || v >= c.engram_compressed_vocab_size) {
      return invalid_argument(path + ": token_map entry " + std::to_string(i) + " = " +
                              std::to_string(v) +
                              " breaks first-occurrence numbering or is outside [0, "
                              "engram_compressed_vocab_size = " +
                              std::to_string(c.engram_compressed_vocab_size) + ")");
    }
    if (v == next) {
      ++next;
    }
    phi.push_back(static_cast<int32_t>(v));
  }
  if (next != c.engram_compressed_vocab_size) {
    return invalid_argument(path + ": token_map has " + std::to_string(next) +
                            " compressed ids, the config's engram_compressed_vocab_size is " +
                            std::to_string(c.engram_compressed_vocab_size) +
                            " (a different tokenizer would rehash every Engram row)");
  }
  return phi;
}

Result<std::vector<int32_t>> synthetic_engram_token_map(const V41Config& c, uint64_t seed) {
  const int64_t vocab = c.vocab_size, n = c.engram_compressed_vocab_size;
  if (n < 1 || n > vocab || vocab > std::numeric_limits<int32_t>::max()) {
    return invalid_argument("synthetic Engram token map: engram_compressed_vocab_size " +
                            std::to_string(n) +
                            " is not in [1, vocab_size = " + std::to_string(vocab) + "]");
  }
  // splitmix64 (not <random>, whose distributions differ between standard libraries).
  uint64_t state = seed ^ 0x656e6772616d5f6dull;  // "engram_m"
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  // Fisher-Yates order of the ids; the first n in it get raw classes 0..n-1, the others a drawn
  // class (the modulo bias is irrelevant for random weights).
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = i;
  for (int64_t i = vocab - 1; i > 0; --i) {
    std::swap(order[static_cast<size_t>(i)],
              order[static_cast<size_t>(next() % static_cast<uint64_t>(i + 1))]);
  }
  std::vector<int64_t> raw(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < vocab; ++r) {
    raw[static_cast<size_t>(order[static_cast<size_t>(r)])] =
        r < n ? r : static_cast<int64_t>(next() % static_cast<uint64_t>(n));
  }
  // Renumbered in order of first occurrence (the loader's canonical form).
  std::vector<int32_t> renum(static_cast<size_t>(n), -1), phi(static_cast<size_t>(vocab));
  int32_t used = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    int32_t& id = renum[static_cast<size_t>(raw[static_cast<size_t>(i)])];
    if (id < 0) {
      id = used++;
    }
    phi[static_cast<size_t>(i)] = id;
  }
  return phi;
}

Status write_engram_token_map(const std::string& path,
                              const std::vector<int32_t>& phi,
                              const V41Config& c) {
  if (static_cast<int64_t>(phi.size()) != c.vocab_size || c.engram_pad_token_id < 0 ||
      c.engram_pad_token_id >= c.vocab_size) {
    return invalid_argument(path + ": the token map does not fit the config");
  }
  const nlohmann::json j = {
      {"compressed_vocab_size", c.engram_compressed_vocab_size},
      {"pad_id", phi[static_cast<size_t>(c.engram_pad_token_id)]},
      {"token_map", phi},
  };
  std::ofstream f(path, std::ios::binary);
  f << j.dump() << "\n";
  if (!f) {
    return io_error(path + ": cannot write");
  }
  return Status::ok_status();
}

}  // namespace dsinfer::model_v41
