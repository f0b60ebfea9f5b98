// HTTP/1.1 request framing rules the server enforces on top of Boost.Beast's parser (RFC 9112):
// the header block's size (431) and obs-folding (400), exactly one Host in HTTP/1.1, and
// Transfer-Encoding whose final coding is chunked (anything else could smuggle a request).
// frame_requests() runs the server's steps synchronously over a byte string (fuzzer, tests).
#pragma once

#include <boost/beast/http/message.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsinfer::server {

// Request line + header fields; beyond: 431.
inline constexpr size_t kHeaderLimit = 64 * 1024;

bool iequals(std::string_view a, std::string_view b);  // ASCII case-insensitive
std::string_view trim_ows(std::string_view s);         // spaces and tabs at both ends

// Where the header block in `data` ends (just past the empty line), or npos when it is not
// complete yet. A bare LF line end also ends it (the parser then rejects the request).
size_t header_block_end(std::string_view data);

// Whether a header field line in `block` (the request line excluded) starts with SP/HTAB: an
// obs-folded continuation line (RFC 9112 section 5.2: a server rejects it with 400).
bool has_obs_fold(std::string_view block);

// The transfer codings of a request, all Transfer-Encoding lines joined.
enum class TransferCoding {
  kNone,             // no Transfer-Encoding field
  kChunked,          // exactly `chunked`
  kFinalNotChunked,  // RFC 9112 section 6.3: 400 and close
  kUnsupported,      // chunked after other codings, which this server does not decode: 501
};
TransferCoding transfer_coding(const boost::beast::http::fields& fields);

// `Content-Type: application/json` (any parameters, any case).
bool is_json_content_type(std::string_view content_type);

// Why a request is refused before its body is read; status 0: it is not. Every refusal closes
// the connection (the stream cannot be trusted to resynchronise).
struct Refusal {
  int status = 0;
  std::string message;
};
// On the raw bytes buffered so far, the header block ending at `head_end` (npos: incomplete
// although the buffer holds more than kHeaderLimit bytes).
Refusal check_header_block(std::string_view buffered, size_t head_end);
// On the parsed header: Host, Transfer-Encoding rules.
Refusal check_request_header(const boost::beast::http::request_header<>& header);

// One request as the server frames it: status 0 and the request, or the refusal status that
// ends the stream (400, 413, 431, 501).
struct FramedRequest {
  int status = 0;
  std::string method;
  std::string target;
  std::string body;
  bool keep_alive = false;
};
// Frames the requests in `bytes` with the server's steps and limits; stops at the first refusal,
// at a request that does not keep the connection alive, or where the bytes end mid-request.
std::vector<FramedRequest> frame_requests(std::string_view bytes, uint64_t body_limit);

}  // namespace dsinfer::server
