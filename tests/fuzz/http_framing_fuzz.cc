// libFuzzer target: HTTP/1.1 request framing as the server does it (src/server/http_framing.h):
// header block size and obs-folding, Host, Transfer-Encoding lists and parameters, chunk sizes
// and extensions, Content-Length, pipelined requests, over Boost.Beast's parser.
//
// Input: byte 0 picks the body limit; the rest is the byte stream a client sends. Checks:
//   * no crash, leak or undefined behaviour (ASan + UBSan);
//   * every accepted request's body is within the limit, and only the last framed request may
//     be a refusal (the server closes the connection after it);
//   * round trip: each accepted request, re-sent with a Content-Length body, frames to the same
//     method, target and body (so no request can be framed two ways).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/http_framing.h"

namespace {

using dsinfer::server::frame_requests;
using dsinfer::server::FramedRequest;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "http_framing_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const uint64_t limits[4] = {0, 16, 4096, uint64_t{1} << 20};
  const uint64_t body_limit = limits[data[0] & 3];
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto framed = frame_requests(bytes, body_limit);
  for (size_t i = 0; i < framed.size(); ++i) {
    const FramedRequest& r = framed[i];
    if (r.status != 0) {
      if (i + 1 != framed.size())
        fail("a request was framed after a refusal");
      if (r.status != 400 && r.status != 413 && r.status != 431 && r.status != 501)
        fail("unexpected refusal status");
      continue;
    }
    if (r.body.size() > body_limit)
      fail("a body over the limit was accepted");
    std::string again = r.method + " " + r.target +
                        " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                        std::to_string(r.body.size()) + "\r\n\r\n" + r.body;
    const auto back = frame_requests(again, body_limit);
    if (back.size() != 1 || back[0].status != 0)
      fail("an accepted request does not frame again");
    if (back[0].method != r.method || back[0].target != r.target || back[0].body != r.body)
      fail("an accepted request frames differently the second time");
  }
  return 0;
}
