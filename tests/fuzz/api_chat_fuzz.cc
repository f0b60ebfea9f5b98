// libFuzzer: decode_chat_request on arbitrary bytes (driver: api_fuzz_common.h).
#include <cstddef>
#include <cstdint>

#include "api/chat.h"
#include "api_fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsinfer::api;  // NOLINT
  static const fuzz::Protocol<ChatStreamEncoder> kProtocol{
      decode_chat_request, render_openai_error, build_chat_response};
  return fuzz::run_one(kProtocol, data, size);
}
