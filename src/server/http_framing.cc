#include "server/http_framing.h"

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "base/strings.h"

namespace dsinfer::server {

namespace http = boost::beast::http;

namespace {

std::string_view sv(boost::core::string_view s) {
  return std::string_view(s.data(), s.size());
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z')
      x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z')
      y = static_cast<char>(y - 'A' + 'a');
    if (x != y)
      return false;
  }
  return true;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

size_t header_block_end(std::string_view data) {
  const size_t crlf = data.find("\r\n\r\n");
  const size_t lf = data.find("\n\n");
  const size_t a = crlf == std::string_view::npos ? crlf : crlf + 4;
  const size_t b = lf == std::string_view::npos ? lf : lf + 2;
  return std::min(a, b);
}

bool has_obs_fold(std::string_view block) {
  for (size_t i = block.find('\n'); i != std::string_view::npos && i + 1 < block.size();
       i = block.find('\n', i + 1)) {
    if (block[i + 1] == ' ' || block[i + 1] == '\t')
      return true;
  }
  return false;
}

TransferCoding transfer_coding(const http::fields& fields) {
  std::vector<std::string_view> codings;
  bool present = false;
  for (auto it = fields.find(http::field::transfer_encoding);
       it != fields.end() && it->name() == http::field::transfer_encoding;
       ++it) {
    present = true;
    std::string_view v = sv(it->value());
    while (!v.empty()) {
      const size_t comma = v.find(',');
      std::string_view item = trim_ows(v.substr(0, comma));
      item = trim_ows(item.substr(0, item.find(';')));  // transfer parameters
      if (!item.empty())
        codings.push_back(item);
      if (comma == std::string_view::npos)
        break;
      v.remove_prefix(comma + 1);
    }
  }
  if (!present)
    return TransferCoding::kNone;
  if (codings.empty() || !iequals(codings.back(), "chunked"))
    return TransferCoding::kFinalNotChunked;
  return codings.size() == 1 ? TransferCoding::kChunked : TransferCoding::kUnsupported;
}

bool is_json_content_type(std::string_view content_type) {
  return iequals(trim_ows(content_type.substr(0, content_type.find(';'))), "application/json");
}

Refusal check_header_block(std::string_view buffered, size_t head_end) {
  if (head_end == std::string_view::npos || head_end > kHeaderLimit) {
    return {431,
            str_format("The request line and header fields exceed this server's limit of %zu "
                       "bytes.",
                       kHeaderLimit)};
  }
  if (has_obs_fold(buffered.substr(0, head_end))) {
    return {400, "Obsolete line folding in a header field is not accepted (RFC 9112 section 5.2)."};
  }
  return {};
}

Refusal check_request_header(const http::request_header<>& header) {
  const unsigned version = header.version();
  const size_t hosts = header.count(http::field::host);
  if (hosts > 1 || (version >= 11 && hosts == 0)) {
    return {400, "An HTTP/1.1 request needs exactly one Host header field (RFC 9112 section 3.2)."};
  }
  const TransferCoding te = transfer_coding(header);
  if (te != TransferCoding::kNone &&
      (version < 11 || header.count(http::field::content_length) > 0)) {
    return {400,
            "Transfer-Encoding is not accepted with Content-Length or in HTTP/1.0 (RFC 9112 "
            "section 6.1)."};
  }
  switch (te) {
    case TransferCoding::kFinalNotChunked:
      return {400,
              "The final transfer coding of a request must be chunked (RFC 9112 section 6.3)."};
    case TransferCoding::kUnsupported:
      return {501, "Only the chunked transfer coding is supported."};
    case TransferCoding::kNone:
    case TransferCoding::kChunked:
      break;
  }
  return {};
}

std::vector<FramedRequest> frame_requests(std::string_view bytes, uint64_t body_limit) {
  std::vector<FramedRequest> out;
  for (;;) {
    // The server's steps: skip empty lines, find the header block, check it raw, parse it,
    // check the parsed header, read the body.
    while (!bytes.empty() && (bytes.front() == '\r' || bytes.front() == '\n'))
      bytes.remove_prefix(1);
    if (bytes.empty())
      return out;
    const size_t head_end =
        header_block_end(bytes.substr(0, std::min(bytes.size(), kHeaderLimit + 4)));
    if (head_end == std::string_view::npos && bytes.size() <= kHeaderLimit)
      return out;  // incomplete header
    FramedRequest r;
    Refusal refusal = check_header_block(bytes, head_end);
    if (refusal.status != 0) {
      r.status = refusal.status;
      out.push_back(std::move(r));
      return out;
    }
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(kHeaderLimit + 8));
    parser.body_limit(body_limit);
    boost::system::error_code ec;
    size_t used = parser.put(boost::asio::buffer(bytes.data(), head_end), ec);
    if (ec || !parser.is_header_done()) {
      r.status = ec == http::error::body_limit ? 413 : 400;
      out.push_back(std::move(r));
      return out;
    }
    bytes.remove_prefix(used);
    refusal = check_request_header(parser.get());
    if (refusal.status != 0) {
      r.status = refusal.status;
      out.push_back(std::move(r));
      return out;
    }
    parser.eager(true);
    while (!parser.is_done()) {
      used = parser.put(boost::asio::buffer(bytes.data(), bytes.size()), ec);
      bytes.remove_prefix(used);
      if (!ec && used == 0 && !parser.is_done())
        return out;
      if (ec == http::error::need_more) {
        if (used == 0)
          return out;  // the bytes end mid-body
        ec = {};
        continue;
      }
      if (ec) {
        r.status = ec == http::error::body_limit ? 413 : 400;
        out.push_back(std::move(r));
        return out;
      }
    }
    const auto& req = parser.get();
    r.method = std::string(sv(req.method_string()));
    r.target = std::string(sv(req.target()));
    r.body = req.body();
    r.keep_alive = req.keep_alive();
    out.push_back(std::move(r));
    if (!out.back().keep_alive)
      return out;
  }
}

}  // namespace dsinfer::server
