#include "retryloop/retry/trace_context.hpp"

namespace retryloop::retry {
namespace {

bool is_lower_hex(std::string_view text) {
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return !text.empty();
}

bool all_zero(std::string_view text) {
  return text.find_first_not_of('0') == std::string_view::npos;
}

int hex_digit(char c) {
  return c <= '9' ? c - '0' : c - 'a' + 10;
}

std::optional<std::string_view> text_of(const amqp::FieldValue* value) {
  if (value == nullptr) return std::nullopt;
  if (const auto* text = value->get_if<std::string>()) return std::string_view(*text);
  if (const auto* bytes = value->get_if<amqp::ByteArray>()) return std::string_view(bytes->bytes);
  return std::nullopt;
}

}  // namespace

std::string TraceContext::traceparent() const {
  static const char digits[] = "0123456789abcdef";
  std::string out = "00-" + trace_id + "-" + parent_id + "-";
  out += digits[flags >> 4];
  out += digits[flags & 0x0f];
  return out;
}

std::optional<TraceContext> parse_traceparent(std::string_view traceparent,
                                              std::string_view tracestate) {
  // version "-" trace-id "-" parent-id "-" trace-flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55.
  constexpr size_t length = 55;
  if (traceparent.size() < length) return std::nullopt;
  const std::string_view version = traceparent.substr(0, 2);
  const std::string_view trace_id = traceparent.substr(3, 32);
  const std::string_view parent_id = traceparent.substr(36, 16);
  const std::string_view flags = traceparent.substr(53, 2);
  if (traceparent[2] != '-' || traceparent[35] != '-' || traceparent[52] != '-') {
    return std::nullopt;
  }
  if (!is_lower_hex(version) || version == "ff") return std::nullopt;
  if (version == "00" ? traceparent.size() != length
                      : traceparent.size() > length && traceparent[length] != '-') {
    return std::nullopt;
  }
  if (!is_lower_hex(trace_id) || all_zero(trace_id)) return std::nullopt;
  if (!is_lower_hex(parent_id) || all_zero(parent_id)) return std::nullopt;
  if (!is_lower_hex(flags)) return std::nullopt;
  TraceContext context;
  context.version = std::string(version);
  context.trace_id = std::string(trace_id);
  context.parent_id = std::string(parent_id);
  context.flags = static_cast<uint8_t>(hex_digit(flags[0]) * 16 + hex_digit(flags[1]));
  context.tracestate = std::string(tracestate);
  return context;
}

std::optional<TraceContext> trace_context(const amqp::FieldTable& headers) {
  const auto traceparent = text_of(headers.find(header::traceparent));
  if (!traceparent) return std::nullopt;
  return parse_traceparent(*traceparent,
                           text_of(headers.find(header::tracestate)).value_or(std::string_view()));
}

}  // namespace retryloop::retry
