#pragma once

// Where one HTTP/1.1 request ends in the bytes read so far, and whether it keeps to the limits:
// pure, so that it is tested and fuzzed alone. The server reads a connection until this says
// the request is complete or refused, and only then hands the request to cpp-httplib.

#include <cstddef>
#include <string>
#include <string_view>

namespace retryloop::http {

/// The most a request may be.
struct RequestLimits {
  /// The request line and the headers, up to and with the empty line.
  size_t max_head_bytes = 16 * 1024;
  /// The body, as the handler gets it (a chunked body: its chunks' data, together).
  size_t max_body_bytes = 1024 * 1024;
};

/// What the bytes of a connection are, so far.
struct RequestFraming {
  enum class Status {
    /// More bytes are needed; nothing is wrong yet.
    incomplete,
    /// `length` bytes are one whole request.
    complete,
    /// The request is refused with `refusal_status` (400, 413, 431, 501, 505) for `reason`,
    /// without reading the rest.
    refused,
  };
  Status status = Status::incomplete;
  /// complete: the request's bytes, head and body.
  size_t length = 0;
  /// incomplete and complete: the head is read and its body is still to come (so a client that
  /// sent `Expect: 100-continue` may be told to send it).
  bool head_read = false;
  bool expects_continue = false;
  int refusal_status = 0;
  std::string reason;
};

/// Frames the request at the start of `bytes`. The body is as long as Content-Length says, or
/// ends with the last chunk of `Transfer-Encoding: chunked` (and its trailers); a request with
/// neither has no body. Refuses a head larger than the limit (431), a body larger than the limit
/// in any framing (413, as soon as the excess is known), a malformed request line, header,
/// length or chunk (400), a transfer coding other than chunked (501), both framings at once
/// (400) and a version other than HTTP/1.0 and 1.1 (505).
RequestFraming frame_request(std::string_view bytes, const RequestLimits& limits);

}  // namespace retryloop::http
