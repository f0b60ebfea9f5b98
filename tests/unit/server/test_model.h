// The server tests' fixture model: a random-weight tiny V4 (model::tiny_preset_config) with the
// small fixture tokenizer (tests/fixtures/tokenizer/tiny, a byte-level BPE with DeepSeek's
// special tokens): its vocabulary size, BOS/EOS ids and tokenizer.json. Used until (and besides)
// the bundled models/dsv4-mini.
#pragma once

#include <fstream>
#include <string>

#include "base/status.h"
#include "model/synthetic.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::server::testing {

inline std::string fixture_tokenizer_path() {
  return std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tokenizer/tiny/tokenizer.json";
}

inline Status write_server_test_model(const std::string& dir) {
  auto tok = tokenizer::Tokenizer::load(fixture_tokenizer_path());
  if (!tok.ok())
    return tok.status();
  auto bos = (*tok)->token_to_id("<｜begin▁of▁sentence｜>");
  auto eos = (*tok)->token_to_id("<｜end▁of▁sentence｜>");
  if (!bos || !eos)
    return invalid_argument(fixture_tokenizer_path() + " has no BOS/EOS token");
  model::SyntheticSpec spec;
  spec.config = model::tiny_preset_config();
  spec.config.vocab_size = (*tok)->vocab_size();
  spec.config.bos_token_id = *bos;
  spec.config.eos_token_id = *eos;
  spec.config.max_position_embeddings = 4096;
  spec.seed = 7;
  spec.quantized = false;
  spec.with_mtp = false;
  DSI_RETURN_IF_ERROR(model::write_synthetic_checkpoint(spec, dir));
  std::ifstream in(fixture_tokenizer_path(), std::ios::binary);
  std::ofstream out(dir + "/tokenizer.json", std::ios::binary);
  out << in.rdbuf();
  if (!out)
    return io_error("cannot write " + dir + "/tokenizer.json");
  return Status();
}

}  // namespace dsinfer::server::testing
