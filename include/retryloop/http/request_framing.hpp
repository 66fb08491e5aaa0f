#pragma once

// Where one HTTP/1.1 request ends in the bytes read so far, and whether it keeps to the limits:
// no I/O, so that it is tested and fuzzed alone. The server feeds a connection's bytes to a
// RequestFramer as they come until it says the request is complete or refused, and only then
// hands the request to cpp-httplib.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace retryloop::http {

/// The most a request may be.
struct RequestLimits {
  /// The request line and the headers, up to and with the empty line.
  size_t max_head_bytes = 16 * 1024;
  /// The body, as the handler gets it (a chunked body: its chunks' data, together); 0: no request
  /// may have a body.
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

/// Frames the request at the start of a connection's bytes, fed as they come. The body is as long
/// as Content-Length says, or ends with the last chunk of `Transfer-Encoding: chunked` (and its
/// trailers); a request with neither has no body. Refuses a head larger than the limit (431), a
/// body larger than the limit in any framing (413, as soon as the excess is known), a malformed
/// request line, header, length, chunk or trailer (400: a line that ends in a bare LF, or has
/// another control character than a tab, among them), a transfer coding other than chunked
/// (501), both framings at once (400) and a version other than HTTP/1.0 and 1.1 (505).
///
/// Each feed() goes on from where the last one stopped: the framing of a request costs the same
/// whether it comes at once or a byte at a time, and its bytes may be split anywhere.
class RequestFramer {
 public:
  explicit RequestFramer(RequestLimits limits = {});

  /// Adds the connection's next bytes; the framing of every byte fed so far. Once the request is
  /// complete or refused, more bytes are kept but not framed.
  const RequestFraming& feed(std::string_view more);
  const RequestFraming& framing() const { return framing_; }
  /// Every byte fed so far: a complete request is the first `framing().length` of them.
  const std::string& bytes() const { return bytes_; }
  /// How many bytes the framing has gone through so far, a byte once each time: at most twice
  /// the bytes fed (the head and the chunk lines are scanned, then parsed), however they were
  /// split. For the tests of its cost.
  size_t examined() const { return examined_; }

 private:
  enum class Phase { head, sized_body, size_line, chunk_data, chunk_end, trailers, done };

  void frame_head();
  void frame_sized_body();
  void frame_size_line();
  void frame_chunk_data();
  void frame_chunk_end();
  void frame_trailers();
  void refuse(int status, std::string reason);
  void complete(size_t length);

  RequestLimits limits_;
  std::string bytes_;
  RequestFraming framing_;
  Phase phase_ = Phase::head;
  /// The next byte to frame.
  size_t at_ = 0;
  size_t examined_ = 0;
  /// Of "\r\n\r\n", how much the head's last bytes match.
  size_t head_end_matched_ = 0;
  /// Where the body starts (after the head's empty line).
  size_t body_start_ = 0;
  uint64_t content_length_ = 0;
  /// Where the chunk size line or trailer line being read starts.
  size_t line_start_ = 0;
  /// Where the trailers start.
  size_t trailers_start_ = 0;
  /// The chunks' data so far, and what the current chunk has still to come (after its data: how
  /// much of the line end that follows has come).
  uint64_t chunked_body_ = 0;
  uint64_t chunk_left_ = 0;
};

/// The framing of `bytes` fed at once.
RequestFraming frame_request(std::string_view bytes, const RequestLimits& limits);

}  // namespace retryloop::http
