// Engram hash multipliers (spec deepseek-v41.md §4.3): per Engram layer L, m_i = 2 r_i + 1 with
// r = NumPy `default_rng(10007 L).integers(0, B, max_ngram)` and B = floor(floor((2^63 - 1) /
// |phi|) / 2). Reproduced here bit for bit (SeedSequence -> PCG64 -> bounded Lemire draws) so an
// engine needs no Python to hash; checked against the spec's table and the fixtures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model_v41/config.h"

namespace dsinfer::model_v41 {

// NumPy's Generator(PCG64(SeedSequence(seed))): next 64-bit output and integers in [0, high).
class NumpyPcg64 {
 public:
  explicit NumpyPcg64(uint64_t seed);
  uint64_t next_u64();
  // Generator.integers(0, high, dtype=int64) for high > 2^32 (64-bit Lemire, as NumPy).
  uint64_t bounded(uint64_t high);

 private:
  unsigned __int128 state_ = 0;
  unsigned __int128 inc_ = 0;
};

// Multipliers per Engram layer (engram_layer_ids order), engram_max_ngram_size values each.
std::vector<std::vector<int64_t>> engram_multipliers(const V41Config& c);

// The compressed token map phi (spec §4.2) from the JSON that tools/reference/v41/
// engram_token_map.py writes ({"compressed_vocab_size", "token_map"}), checked against the
// config: vocab_size entries, ids in [0, engram_compressed_vocab_size), every id used, numbered
// in order of first occurrence.
Result<std::vector<int32_t>> load_engram_token_map(const std::string& path, const V41Config& c);

// A token map for random-weight checkpoints (no tokenizer to derive phi from): vocab_size ids onto
// all engram_compressed_vocab_size compressed ids (the first ones, in a seed-shuffled order, get
// one each; the rest a seed-drawn one), numbered in order of first occurrence so that
// load_engram_token_map accepts it. Deterministic in (sizes, seed), platform independent. Needs
// 1 <= engram_compressed_vocab_size <= vocab_size.
Result<std::vector<int32_t>> synthetic_engram_token_map(const V41Config& c, uint64_t seed);

// Writes phi as engram_token_map.py does: {"compressed_vocab_size", "pad_id" = phi(pad id),
// "token_map"}.
Status write_engram_token_map(const std::string& path,
                              const std::vector<int32_t>& phi,
                              const V41Config& c);

}  // namespace dsinfer::model_v41
