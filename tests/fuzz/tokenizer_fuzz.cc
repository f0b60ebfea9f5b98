// libFuzzer target: tokenizer encode/decode round trip.
//
// Encodes arbitrary bytes with the tiny fixture tokenizer (tests/fixtures/tokenizer/tiny, a
// byte-level BPE with DeepSeek special tokens; $DSINFER_FUZZ_TOKENIZER picks another
// tokenizer.json, e.g. the DeepSeek V4 one) and checks:
//   * encode never fails, every id has a token;
//   * decode(encode(s)) == s for valid UTF-8, and == s with U+FFFD repairs otherwise;
//   * feeding the ids one by one to IncrementalDecoder yields only complete UTF-8 whose
//     concatenation equals decode;
//   * with special tokens allowed, encode succeeds and decodes to valid UTF-8.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using dsinfer::tokenizer::IncrementalDecoder;
using dsinfer::tokenizer::Tokenizer;
namespace utf8 = dsinfer::tokenizer::utf8;

[[noreturn]] void die(const char* what, std::string_view input) {
  std::fprintf(stderr, "tokenizer_fuzz: %s (input %zu bytes)\n", what, input.size());
  std::abort();
}

const Tokenizer& tokenizer() {
  static std::unique_ptr<Tokenizer> tok = [] {
    const char* env = std::getenv("DSINFER_FUZZ_TOKENIZER");
    const std::string path =
        env != nullptr && *env != '\0'
            ? std::string(env)
            : std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tokenizer/tiny/tokenizer.json";
    auto r = Tokenizer::load(path);
    if (!r.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: %s\n", r.status().to_string().c_str());
      std::abort();
    }
    return std::move(r).value();
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& tok = tokenizer();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string expected;
  utf8::append_lossy(input, /*final=*/true, &expected);

  auto ids = tok.encode(input, /*allow_special=*/false);
  if (!ids.ok())
    die("encode failed", input);
  for (int32_t id : *ids) {
    if (!tok.has_token(id))
      die("encode produced an id with no token", input);
  }
  auto text = tok.decode(*ids);
  if (!text.ok())
    die("decode failed", input);
  if (*text != expected)
    die("decode(encode(s)) != s", input);

  IncrementalDecoder dec(tok);
  std::string streamed;
  for (int32_t id : *ids) {
    auto piece = dec.feed(id);
    if (!piece.ok())
      die("incremental feed failed", input);
    if (!utf8::is_valid(*piece))
      die("incremental decoder emitted partial UTF-8", input);
    streamed += *piece;
  }
  streamed += dec.flush();
  if (streamed != *text)
    die("incremental decode != decode", input);

  auto special = tok.encode(input, /*allow_special=*/true);
  if (!special.ok())
    die("encode(allow_special) failed", input);
  auto special_text = tok.decode(*special);
  if (!special_text.ok() || !utf8::is_valid(*special_text))
    die("special decode invalid", input);
  return 0;
}
