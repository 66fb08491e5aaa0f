#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "retryloop/amqp/field_table.hpp"

namespace retryloop::retry {

namespace header {
/// W3C Trace Context (https://www.w3.org/TR/trace-context/): the trace a message belongs to and
/// the span that sent it. Ordinary application headers to retryloop: retry, parking and replay
/// copies carry both unchanged, and retryloop never adds them to a message that had none.
inline constexpr std::string_view traceparent = "traceparent";
inline constexpr std::string_view tracestate = "tracestate";
}  // namespace header

/// A message's W3C trace context, read from its `traceparent` and `tracestate` headers.
struct TraceContext {
  /// The version field, two lowercase hex digits: "00" (a later version is read by its first
  /// four fields, as the spec asks).
  std::string version;
  /// 32 lowercase hex digits, not all zero.
  std::string trace_id;
  /// The sending span's id: 16 lowercase hex digits, not all zero.
  std::string parent_id;
  /// trace-flags; bit 0 is `sampled`.
  uint8_t flags = 0;
  /// `tracestate` exactly as it arrived (vendor entries); empty when absent.
  std::string tracestate;

  bool sampled() const { return (flags & 0x01) != 0; }
  /// The `traceparent` value: `00-<trace_id>-<parent_id>-<flags>`.
  std::string traceparent() const;
};

/// Parses a `traceparent` value by the W3C rules: version (not `ff`), trace id, parent id and
/// flags, lowercase hex, separated by `-`; version 00 is exactly 55 characters, a later version
/// may be longer, with a `-` after the flags. An all-zero trace id or parent id is invalid.
/// Returns nullopt for anything invalid; `tracestate` is then ignored too, as the spec says.
std::optional<TraceContext> parse_traceparent(std::string_view traceparent,
                                              std::string_view tracestate = {});

/// The trace context in a headers table: `traceparent` (and `tracestate`) as long strings or
/// byte arrays. nullopt when there is no valid `traceparent`; never made up.
std::optional<TraceContext> trace_context(const amqp::FieldTable& headers);

}  // namespace retryloop::retry
