#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/parking/parked_message.hpp"

namespace retryloop::parking {

/// A parked message as one JSON object, as `retryloop parking list --json` prints it: its place,
/// id, when (ISO 8601, UTC) and why it was parked, the decoded parking headers, its history
/// (history_json), every property, every header (header_json) and the body: text when it is UTF-8
/// (`body_encoding` "utf-8"), base64 otherwise ("base64").
nlohmann::json message_json(const ParkedMessage& parked, uint64_t now_seconds);

/// `retryloop-history` decoded: {"entries": [{"attempt", "at" (ISO 8601 or null), "outcome",
/// and when known "error", "delay_ms", "via", "consumer", "reason", "by"}, ...], "older": N},
/// plus "malformed" when the header is not what retryloop writes.
nlohmann::json history_json(const amqp::FieldTable* headers);

/// A header value as JSON: tables as objects, arrays as arrays, numbers and booleans as they are,
/// timestamps as seconds, decimals as numbers, strings and byte arrays as text when they are
/// UTF-8 and as {"base64": ...} otherwise.
nlohmann::json header_json(const amqp::FieldValue& value);

/// Whether `text` is well-formed UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool is_utf8(std::string_view text);

/// Whether the arrays and objects of JSON `text` nest at most `limit` deep; brackets in strings do
/// not count. One flat pass over the text, for text that must not reach a recursive parser or
/// serializer when it is deeper (the console's requests, audit records read back).
bool nests_at_most(std::string_view text, size_t limit);

/// `bytes` in base64 (RFC 4648, with padding).
std::string base64(std::string_view bytes);

/// A Unix time as `2026-11-23T10:15:00Z`.
std::string iso_time(uint64_t seconds);

}  // namespace retryloop::parking
