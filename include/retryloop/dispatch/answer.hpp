#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "retryloop/dispatch/response.hpp"
#include "retryloop/retry/outcome.hpp"

namespace retryloop::dispatch {

/// The longest wait a `Retry-After` is read as: a longer one (or a date further ahead) counts as
/// this long, so that no answer makes a message or a service wait for weeks.
inline constexpr std::chrono::milliseconds max_retry_after = std::chrono::hours(24);

/// How much of an answer's body an error text quotes.
inline constexpr size_t max_quoted_body_bytes = 1024;

/// The answer header with which an application names the outcome itself.
inline constexpr std::string_view outcome_header = "Retryloop-Outcome";

/// Reads a `Retry-After` value (RFC 9110, section 10.2.3) as the wait from `now`: delay-seconds
/// (`120`), or an HTTP-date in any of the three forms recipients must accept: IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`), the obsolete RFC 850 form (`Sunday, 06-Nov-94 08:49:37
/// GMT`, a two-digit year more than 50 years ahead of `now` being the century before) and
/// asctime (`Sun Nov  6 08:49:37 1994`). Spaces and tabs around the value are ignored. A date not
/// after `now` gives 0; a wait longer than max_retry_after (a number of any length included)
/// gives max_retry_after. Anything else (empty, a sign, a fraction, a date that does not exist,
/// another format) gives nullopt. Never throws.
std::optional<std::chrono::milliseconds> parse_retry_after(
    std::string_view value, std::chrono::system_clock::time_point now);

/// What outcome_of needs besides the response.
struct AnswerContext {
  /// The time the answer arrived: a `Retry-After` date counts from it.
  std::chrono::system_clock::time_point now;
  /// What was asked, as the error texts name it: "POST http://app/orders".
  std::string target;
};

/// The outcome a message's HTTP exchange means (docs/dispatch.md, "What the answer means"):
///
/// | answer | outcome |
/// |---|---|
/// | no answer (any Failure but none) | unavailable |
/// | 2xx | ack |
/// | 429 | overloaded; `delay` = its Retry-After when that parses |
/// | 502, 503, 504 | unavailable |
/// | 400, 404, 410, 413, 415, 422 | permanent |
/// | any other status (500, 408, 409, 1xx, 3xx, ...) | retry (retry_after with a Retry-After) |
///
/// A `Retryloop-Outcome` answer header (`ack`, `retry`, `permanent`, `poison` or `drop`, in any
/// case) decides instead of the status; Retry-After applies to its `retry`. Any other non-empty
/// value is a retry whose error names the value. The error texts name the target, the status
/// and its reason phrase, and quote the first max_quoted_body_bytes of the body made printable
/// (amqp::printable), saying when the body was longer or cut by the client. Never throws.
retry::Outcome outcome_of(const Response& response, const AnswerContext& context);

/// The reason phrase of a registered HTTP status ("Unprocessable Entity"); "" for others.
std::string_view reason_phrase(int status);

}  // namespace retryloop::dispatch
