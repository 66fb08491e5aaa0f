#include "retryloop/http/request_framing.hpp"

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
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
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

RequestFraming too_large(const RequestLimits& limits) {
  return refuse(413, "the request body is larger than " + size_text(limits.max_body_bytes));
}

/// Frames the chunked body that starts at `start`.
RequestFraming frame_chunks(std::string_view bytes, size_t start, const RequestLimits& limits) {
  RequestFraming incomplete;
  incomplete.head_read = true;
  // Chunk sizes, extensions and line ends may add as much as the body itself, no more.
  const size_t max_sent = 2 * limits.max_body_bytes + kMaxChunkLine;
  uint64_t body = 0;
  size_t at = start;
  for (;;) {
    if (at - start > max_sent) {
      return refuse(413, "the chunked request body, with its chunk framing, is larger than " +
                             size_text(2 * limits.max_body_bytes));
    }
    const size_t line_end = bytes.find(kLineEnd, at);
    if (line_end == std::string_view::npos || line_end - at > kMaxChunkLine) {
      // The longest size line, and the "\r" of its line end, may still be waiting for its "\n".
      if (bytes.size() - at > kMaxChunkLine + 1) {
        return refuse(400, "a chunk's size line is longer than " + size_text(kMaxChunkLine));
      }
      return incomplete;
    }
    std::string_view size_line = bytes.substr(at, line_end - at);
    size_line = trim(size_line.substr(0, size_line.find(';')));
    const auto size = hexadecimal(size_line);
    if (!size) return refuse(400, "a chunk's size is not a hexadecimal number");
    at = line_end + kLineEnd.size();
    if (*size == 0) break;
    body += *size;
    if (body > limits.max_body_bytes) return too_large(limits);
    if (bytes.size() - at < *size + kLineEnd.size()) return incomplete;
    if (bytes.substr(at + *size, kLineEnd.size()) != kLineEnd) {
      return refuse(400, "a chunk is longer than its size says");
    }
    at += *size + kLineEnd.size();
  }
  // Trailers, then the empty line.
  for (const size_t trailers = at;;) {
    const size_t line_end = bytes.find(kLineEnd, at);
    if (line_end == std::string_view::npos) {
      if (bytes.size() - trailers > limits.max_head_bytes) {
        return refuse(431,
                      "the request's trailers are larger than " + size_text(limits.max_head_bytes));
      }
      return incomplete;
    }
    const bool empty_line = line_end == at;
    at = line_end + kLineEnd.size();
    // The trailers are held to the head's limit with their empty line, so that a request
    // refused whole is refused in every start of it too.
    if (at - trailers > limits.max_head_bytes) {
      return refuse(431,
                    "the request's trailers are larger than " + size_text(limits.max_head_bytes));
    }
    if (empty_line) {
      RequestFraming complete;
      complete.status = RequestFraming::Status::complete;
      complete.length = at;
      return complete;
    }
  }
}

}  // namespace

RequestFraming frame_request(std::string_view bytes, const RequestLimits& limits) {
  const size_t head_end = bytes.substr(0, limits.max_head_bytes).find("\r\n\r\n");
  if (head_end == std::string_view::npos) {
    if (bytes.size() >= limits.max_head_bytes) {
      return refuse(
          431, "the request line and headers are larger than " + size_text(limits.max_head_bytes));
    }
    return {};
  }
  Head head;
  head.length = head_end + 4;
  if (auto refusal = parse_head(bytes.substr(0, head.length), head)) return *refusal;

  RequestFraming framing;
  framing.head_read = true;
  framing.expects_continue = head.expects_continue;
  if (head.chunked) {
    framing = frame_chunks(bytes, head.length, limits);
    framing.expects_continue = head.expects_continue;
    return framing;
  }
  const uint64_t body = head.content_length.value_or(0);
  if (body > limits.max_body_bytes) return too_large(limits);
  if (bytes.size() - head.length < body) return framing;
  framing.status = RequestFraming::Status::complete;
  framing.length = head.length + size_t(body);
  return framing;
}

}  // namespace retryloop::http
