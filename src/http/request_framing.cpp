#include "retryloop/http/request_framing.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>

namespace retryloop::http {

namespace {

constexpr std::string_view kLineEnd = "\r\n";
/// A chunk's size line: the size in hex and any chunk extensions.
constexpr size_t kMaxChunkLine = 1024;

std::string size_text(size_t bytes) {
  if (bytes >= 1024 * 1024 && bytes % (1024 * 1024) == 0) {
    return std::to_string(bytes / (1024 * 1024)) + " MiB";
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + " KiB";
  return std::to_string(bytes) + " bytes";
}

RequestFraming refuse(int status, std::string reason) {
  RequestFraming framing;
  framing.status = RequestFraming::Status::refused;
  framing.refusal_status = status;
  framing.reason = std::move(reason);
  return framing;
}

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

/// A token character of RFC 9110 (method and header names).
bool is_token_char(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_token(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!is_token_char(c)) return false;
  }
  return true;
}

/// A control character other than a tab: not allowed in a header, a chunk line or a trailer.
bool is_control(char c) {
  return (static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t'))
    text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t'))
    text.remove_suffix(1);
  return text;
}

std::optional<uint64_t> decimal(std::string_view text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + uint64_t(c - '0');
  }
  return value;
}

std::optional<uint64_t> hexadecimal(std::string_view text) {
  if (text.empty() || text.size() > 15) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    const char l = lower(c);
    uint64_t digit = 0;
    if (l >= '0' && l <= '9') {
      digit = uint64_t(l - '0');
    } else if (l >= 'a' && l <= 'f') {
      digit = uint64_t(l - 'a' + 10);
    } else {
      return std::nullopt;
    }
    value = value * 16 + digit;
  }
  return value;
}

/// What the head says about the body.
struct Head {
  size_t length = 0;  // with the empty line
  std::optional<uint64_t> content_length;
  bool chunked = false;
  bool expects_continue = false;
};

/// Parses the head that ends at `length`; a refusal when it is malformed.
std::optional<RequestFraming> parse_head(std::string_view head, Head& out) {
  size_t line_end = head.find(kLineEnd);
  const std::string_view request_line = head.substr(0, line_end);
  const size_t first_space = request_line.find(' ');
  const size_t last_space = request_line.rfind(' ');
  if (first_space == std::string_view::npos || first_space == last_space) {
    return refuse(400, "the request line is not METHOD TARGET HTTP/1.1");
  }
  const std::string_view method = request_line.substr(0, first_space);
  const std::string_view target =
      request_line.substr(first_space + 1, last_space - first_space - 1);
  const std::string_view version = request_line.substr(last_space + 1);
  if (!is_token(method)) return refuse(400, "the request's method is not a word");
  if (target.empty() || target.find_first_of(std::string_view(" \t\0", 3)) != target.npos) {
    return refuse(400, "the request line is not METHOD TARGET HTTP/1.1");
  }
  for (char c : target) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return refuse(400, "the request's target has a control character");
    }
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    if (version.rfind("HTTP/", 0) == 0) {
      return refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
    }
    return refuse(400, "the request line is not METHOD TARGET HTTP/1.1");
  }
  size_t transfer_encodings = 0;
  for (size_t start = line_end + kLineEnd.size(); start + kLineEnd.size() < head.size();) {
    line_end = head.find(kLineEnd, start);
    const std::string_view line = head.substr(start, line_end - start);
    start = line_end + kLineEnd.size();
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) {
      return refuse(400, "a header line is not NAME: VALUE");
    }
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = trim(line.substr(colon + 1));
    for (char c : value) {
      if (is_control(c)) {
        return refuse(400, "the header " + std::string(name) + " has a control character");
      }
    }
    if (equals_ignoring_case(name, "Content-Length")) {
      const auto length = decimal(value);
      if (!length) return refuse(400, "Content-Length is not a number of bytes");
      if (out.content_length && *out.content_length != *length) {
        return refuse(400, "the request gives two different Content-Lengths");
      }
      out.content_length = length;
    } else if (equals_ignoring_case(name, "Transfer-Encoding")) {
      if (!equals_ignoring_case(value, "chunked") || ++transfer_encodings > 1) {
        return refuse(501, "the only transfer coding served is chunked, once");
      }
      out.chunked = true;
    } else if (equals_ignoring_case(name, "Expect")) {
      out.expects_continue = equals_ignoring_case(value, "100-continue");
    }
  }
  if (out.chunked && out.content_length) {
    return refuse(400, "the request gives both Content-Length and Transfer-Encoding");
  }
  return std::nullopt;
}

std::string too_large_reason(const RequestLimits& limits) {
  if (limits.max_body_bytes == 0) return "the request has a body, and none is taken here";
  return "the request body is larger than " + size_text(limits.max_body_bytes);
}

}  // namespace

RequestFramer::RequestFramer(RequestLimits limits) : limits_(limits) {}

const RequestFraming& RequestFramer::feed(std::string_view more) {
  bytes_.append(more);
  // Each phase goes on from `at_` and stops at the end of the bytes, or where the next phase
  // begins; every byte is gone through once, whatever the bytes fed at a time.
  for (;;) {
    const Phase phase = phase_;
    const size_t at = at_;
    switch (phase_) {
      case Phase::head:
        frame_head();
        break;
      case Phase::sized_body:
        frame_sized_body();
        break;
      case Phase::size_line:
        frame_size_line();
        break;
      case Phase::chunk_data:
        frame_chunk_data();
        break;
      case Phase::chunk_end:
        frame_chunk_end();
        break;
      case Phase::trailers:
        frame_trailers();
        break;
      case Phase::done:
        return framing_;
    }
    if (phase_ == phase && at_ == at) return framing_;
  }
}

void RequestFramer::refuse(int status, std::string reason) {
  framing_ = RequestFraming{};
  framing_.status = RequestFraming::Status::refused;
  framing_.refusal_status = status;
  framing_.reason = std::move(reason);
  phase_ = Phase::done;
}

void RequestFramer::complete(size_t length) {
  framing_.status = RequestFraming::Status::complete;
  framing_.length = length;
  phase_ = Phase::done;
}

void RequestFramer::frame_head() {
  constexpr std::string_view head_end = "\r\n\r\n";
  const size_t end = std::min(bytes_.size(), limits_.max_head_bytes);
  for (; at_ < end && head_end_matched_ < head_end.size(); ++at_, ++examined_) {
    const char c = bytes_[at_];
    if (c == head_end[head_end_matched_]) {
      ++head_end_matched_;
    } else {
      head_end_matched_ = c == '\r' ? 1 : 0;
    }
  }
  if (head_end_matched_ < head_end.size()) {
    if (at_ >= limits_.max_head_bytes) {
      refuse(431,
             "the request line and headers are larger than " + size_text(limits_.max_head_bytes));
    }
    return;
  }
  Head head;
  head.length = at_;
  examined_ += head.length;
  if (auto refusal = parse_head(std::string_view(bytes_).substr(0, head.length), head)) {
    return refuse(refusal->refusal_status, std::move(refusal->reason));
  }
  framing_.head_read = true;
  framing_.expects_continue = head.expects_continue;
  body_start_ = head.length;
  if (head.chunked) {
    line_start_ = at_;
    phase_ = Phase::size_line;
    return;
  }
  content_length_ = head.content_length.value_or(0);
  if (content_length_ > limits_.max_body_bytes) return refuse(413, too_large_reason(limits_));
  phase_ = Phase::sized_body;
}

void RequestFramer::frame_sized_body() {
  const uint64_t left = content_length_ - (at_ - body_start_);
  const size_t step = size_t(std::min<uint64_t>(left, bytes_.size() - at_));
  at_ += step;
  examined_ += step;
  if (step == left) complete(at_);
}

void RequestFramer::frame_size_line() {
  for (; at_ < bytes_.size(); ++at_) {
    const char c = bytes_[at_];
    ++examined_;
    const bool after_cr = at_ > line_start_ && bytes_[at_ - 1] == '\r';
    if (c == '\n') {
      if (!after_cr) return refuse(400, "a chunk's size line has a bare LF");
      break;
    }
    if (after_cr || (is_control(c) && c != '\r')) {
      return refuse(400, "a chunk's size line has a control character");
    }
    // The longest size line, and the "\r" of its line end, may still be waiting for its "\n".
    if (at_ + 1 - line_start_ > kMaxChunkLine + 1) {
      return refuse(400, "a chunk's size line is longer than " + size_text(kMaxChunkLine));
    }
  }
  if (at_ == bytes_.size()) return;
  std::string_view size_line = std::string_view(bytes_).substr(line_start_, at_ - 1 - line_start_);
  examined_ += size_line.size();
  ++at_;
  size_line = trim(size_line.substr(0, size_line.find(';')));
  const auto size = hexadecimal(size_line);
  if (!size) return refuse(400, "a chunk's size is not a hexadecimal number");
  if (*size == 0) {
    line_start_ = trailers_start_ = at_;
    phase_ = Phase::trailers;
    return;
  }
  chunked_body_ += *size;
  if (chunked_body_ > limits_.max_body_bytes) return refuse(413, too_large_reason(limits_));
  chunk_left_ = *size;
  phase_ = Phase::chunk_data;
}

void RequestFramer::frame_chunk_data() {
  const size_t step = size_t(std::min<uint64_t>(chunk_left_, bytes_.size() - at_));
  at_ += step;
  examined_ += step;
  chunk_left_ -= step;
  if (chunk_left_ == 0) phase_ = Phase::chunk_end;
}

void RequestFramer::frame_chunk_end() {
  // The "\r\n" after the chunk's data; `chunk_left_` counts its bytes seen.
  for (; at_ < bytes_.size() && chunk_left_ < kLineEnd.size(); ++at_, ++chunk_left_) {
    ++examined_;
    if (bytes_[at_] != kLineEnd[chunk_left_]) {
      return refuse(400, "a chunk is longer than its size says");
    }
  }
  if (chunk_left_ < kLineEnd.size()) return;
  chunk_left_ = 0;
  // Chunk sizes, extensions and line ends may add as much as the body itself, no more.
  if (at_ - body_start_ > 2 * limits_.max_body_bytes + kMaxChunkLine) {
    return refuse(413, "the chunked request body, with its chunk framing, is larger than " +
                           size_text(2 * limits_.max_body_bytes));
  }
  line_start_ = at_;
  phase_ = Phase::size_line;
}

void RequestFramer::frame_trailers() {
  const auto too_large = [this] {
    refuse(431, "the request's trailers are larger than " + size_text(limits_.max_head_bytes));
  };
  for (; at_ < bytes_.size(); ++at_) {
    const char c = bytes_[at_];
    ++examined_;
    const bool after_cr = at_ > line_start_ && bytes_[at_ - 1] == '\r';
    if (c == '\n') {
      if (!after_cr) return refuse(400, "a trailer line has a bare LF");
      // The trailers are held to the head's limit with their empty line, so that a request
      // refused whole is refused in every start of it too.
      if (at_ + 1 - trailers_start_ > limits_.max_head_bytes) return too_large();
      const std::string_view line =
          std::string_view(bytes_).substr(line_start_, at_ - 1 - line_start_);
      if (line.empty()) return complete(at_ + 1);
      const size_t colon = line.find(':');
      examined_ += colon == std::string_view::npos ? line.size() : colon + 1;
      if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) {
        return refuse(400, "a trailer line is not NAME: VALUE");
      }
      line_start_ = at_ + 1;
      continue;
    }
    if (after_cr || (is_control(c) && c != '\r')) {
      return refuse(400, "a trailer line has a control character");
    }
    if (at_ + 1 - trailers_start_ > limits_.max_head_bytes) return too_large();
  }
}

RequestFraming frame_request(std::string_view bytes, const RequestLimits& limits) {
  RequestFramer framer(limits);
  return framer.feed(bytes);
}

}  // namespace retryloop::http
