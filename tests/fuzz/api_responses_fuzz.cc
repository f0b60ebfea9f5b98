// libFuzzer: decode_responses_request on arbitrary bytes (driver: api_fuzz_common.h).
#include <cstddef>
#include <cstdint>

#include "api/responses.h"
#include "api_fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsinfer::api;  // NOLINT
  static const fuzz::Protocol<ResponsesStreamEncoder> kProtocol{
      decode_responses_request, render_openai_error, build_responses_response};
  return fuzz::run_one(kProtocol, data, size);
}
