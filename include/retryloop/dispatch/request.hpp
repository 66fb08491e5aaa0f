#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/dispatch/header_encoding.hpp"

namespace retryloop::dispatch {

/// The request's own header fields besides the CloudEvents ones (docs/dispatch.md, "The
/// request").
namespace field {
/// The delivery's attempt (consumer::Message::attempt), 1 on the first.
inline constexpr std::string_view attempt = "Retryloop-Attempt";
/// The service's max_attempts: the attempt after which a retry parks the message.
inline constexpr std::string_view max_attempts = "Retryloop-Max-Attempts";
/// `true` when the broker delivers the message again after a consumer lost it, else `false`.
inline constexpr std::string_view redelivered = "Retryloop-Redelivered";
/// The message's AMQP headers (encode_headers).
inline constexpr std::string_view headers = headers_field;
/// Instead of Retryloop-Headers when their encoding is longer than
/// RequestSettings::max_headers_bytes: the encoding's length in bytes.
inline constexpr std::string_view headers_omitted = "Retryloop-Headers-Omitted";
}  // namespace field

/// What a request says besides what the message says.
struct RequestSettings {
  /// The service whose queue the message came from: `ce-source`.
  std::string service;
  /// The service's max_attempts: `Retryloop-Max-Attempts`.
  int64_t max_attempts = 1;
  /// The longest Retryloop-Headers value sent, and the longest `tracestate` carried: 8 KiB, the
  /// line nginx accepts by default. Longer headers are left out and Retryloop-Headers-Omitted
  /// says so; a longer tracestate is left out.
  size_t max_headers_bytes = 8192;
};

/// The header fields of the HTTP request a message becomes: the CloudEvents HTTP binding in
/// binary mode. The method (POST), the target and the body (the message's, byte for byte) are the
/// client's.
struct Request {
  /// In the order to send them; every name and value is legal in HTTP/1.1 and HTTP/2 (visible
  /// ASCII and inner spaces only: no control character, CR, LF or NUL from the message gets in).
  std::vector<std::pair<std::string, std::string>> headers;

  /// The value of the first field of that name (ASCII case-insensitive); empty when none.
  std::string_view header(std::string_view name) const;
};

/// The request for `message` (docs/dispatch.md, "The request"), its fields in this order:
///
/// - `ce-specversion`: `1.0`;
/// - `ce-id`: the message-id; without one, `sha256:` and 32 hex digits of a digest of what stays
///   the same on every attempt of the message (its original exchange and routing key, its
///   properties, its carried headers and its body);
/// - `ce-source`: the service (`retryloop` when settings name none);
/// - `ce-type`: the routing key it was first published with (retry::AttemptInfo), else the
///   exchange it was first published to, else its queue;
/// - `ce-time`: the timestamp property in RFC 3339 (UTC); absent without one or past year 9999;
/// - `Content-Type`: the content-type property, else `application/octet-stream`;
/// - `Content-Encoding`: the content-encoding property, when set;
/// - `traceparent`, `tracestate`: the headers as they are, when the traceparent is valid;
/// - `Retryloop-Attempt`, `Retryloop-Max-Attempts`, `Retryloop-Redelivered` (see `field`);
/// - `Retryloop-Headers`: the carried headers (is_carried_header), sorted by name, by
///   encode_headers, absent when there are none; or `Retryloop-Headers-Omitted` when they are
///   too long.
///
/// The `ce-` values are percent-encoded as the binding asks (bytes that are not UTF-8 count as
/// U+FFFD). A content type, content encoding or trace header that is not a legal field value is
/// not sent (the content type becomes `application/octet-stream`). Pure: reads only its
/// arguments.
Request make_request(const consumer::Message& message, const RequestSettings& settings);

/// Whether Retryloop-Headers carries AMQP header `name`: every header but those the broker
/// writes on the way (`x-death`, `x-first-death-*`, `x-last-death-*`, `x-delivery-count`,
/// `x-acquired-count`) and retryloop's own (`retryloop-*`), which change from one attempt to the
/// next and whose meaning the request gives in its own fields.
bool is_carried_header(std::string_view name);

}  // namespace retryloop::dispatch
