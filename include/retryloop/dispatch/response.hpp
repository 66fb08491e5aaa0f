#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace retryloop::dispatch {

/// Why an HTTP exchange ended without an answer from the application.
enum class Failure {
  none,             ///< the application answered (Response::status is its status)
  refused,          ///< the connection was refused, or the Unix socket is missing
  resolve,          ///< the host name did not resolve
  connect_timeout,  ///< no connection within the connect timeout
  timeout,          ///< connected, but no whole answer within the request timeout
  tls,              ///< the TLS handshake or the peer's certificate failed
  broken,           ///< the connection broke, or the answer was not valid HTTP
};

/// "none", "refused", "resolve", "connect-timeout", "timeout", "tls", "broken".
const char* to_string(Failure failure);

/// Whether `a` and `b` are equal with ASCII letters compared without case and every other byte
/// as it is: how HTTP compares field names and tokens.
bool same_ignoring_case(std::string_view a, std::string_view b);

/// One HTTP exchange's end, as the HTTP client reports it and the outcome mapping reads it.
struct Response {
  Failure failure = Failure::none;
  /// The transport's words for a failure (libcurl's error buffer); empty when it answered.
  std::string failure_text;
  /// The answer's status; 0 when it did not answer.
  int status = 0;
  /// The answer's header fields in the order received, names as sent.
  std::vector<std::pair<std::string, std::string>> headers;
  /// The answer's body, at most the client's answer limit.
  std::string body;
  /// The body was longer than the limit: the rest was not read, and the connection was closed.
  bool body_cut = false;
  /// From the request's start to the answer's end (or the failure).
  std::chrono::microseconds elapsed{0};

  /// The value of the first header field of that name (ASCII case-insensitive); empty when none.
  std::string_view header(std::string_view name) const;
};

}  // namespace retryloop::dispatch
