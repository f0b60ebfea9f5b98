// libFuzzer: decode_messages_request on arbitrary bytes (driver: api_fuzz_common.h).
#include <cstddef>
#include <cstdint>

#include "api/messages.h"
#include "api_fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsinfer::api;  // NOLINT
  static const fuzz::Protocol<MessagesStreamEncoder> kProtocol{
      decode_messages_request, render_anthropic_error, build_messages_response};
  return fuzz::run_one(kProtocol, data, size);
}
