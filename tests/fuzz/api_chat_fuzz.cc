// libFuzzer: decode_chat_request on arbitrary bytes; errors render, and an accepted request
// re-encodes a canned event stream (streaming and not) and renders its prompt.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "api/chat.h"
#include "api_fuzz_common.h"
#include "recipe/encoder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsinfer;  // NOLINT
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  api::DecodeOptions opts;
  auto r = api::decode_chat_request(body, opts);
  if (!r.ok()) {
    const api::ApiError& e = r.error();
    if (e.http_status != 400 || e.message.empty())
      __builtin_trap();
    (void)api::render_openai_error(e);
    return 0;
  }
  const recipe::GenerationRequest& req = r.value();
  api::ResponseMeta meta;
  meta.seed = size;
  const auto events = api::fuzz::canned_events(req, size);
  const recipe::Usage usage = api::fuzz::canned_usage(size);
  api::ChatStreamEncoder enc(req, meta);
  std::string out = enc.start();
  for (const recipe::OutputEvent& e : events) out += enc.add(e);
  out += enc.finish(usage);
  if (out.empty())
    __builtin_trap();
  (void)api::build_chat_response(req, meta, events, usage);
  (void)api::resolve_max_tokens(req, 1000, 1 << 20);
  for (recipe::ModelVersion v : {recipe::ModelVersion::kV4, recipe::ModelVersion::kV41}) {
    (void)recipe::render_prompt(req.conversation, v);
  }
  return 0;
}
