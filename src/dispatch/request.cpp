#include "retryloop/dispatch/request.hpp"

#include <openssl/sha.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "retryloop/dispatch/detail/calendar.hpp"
#include "retryloop/dispatch/detail/utf8.hpp"
#include "retryloop/dispatch/response.hpp"
#include "retryloop/retry/headers.hpp"

namespace retryloop::dispatch {
namespace {

constexpr char upper_hex[] = "0123456789ABCDEF";
constexpr char lower_hex[] = "0123456789abcdef";
// The last second RFC 3339's four-digit years can write: 9999-12-31T23:59:59Z.
constexpr uint64_t last_rfc3339_second = 253402300799;

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// The CloudEvents HTTP binding's percent-encoding of a string attribute: every character but
// U+0021 to U+007E (the double quote and the percent sign included) as the %XX of its UTF-8 bytes.
std::string percent_encoded(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto byte = [&](unsigned char c) {
    out += '%';
    out += upper_hex[c >> 4];
    out += upper_hex[c & 0xF];
  };
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = i;
    const std::optional<uint32_t> code = detail::next_code_point(text, i);
    if (!code) {
      for (unsigned char c : {0xEF, 0xBF, 0xBD})
        byte(c);
    } else if (*code > 0x20 && *code < 0x7F && *code != '"' && *code != '%') {
      out += static_cast<char>(*code);
    } else {
      for (size_t k = start; k < i; ++k)
        byte(static_cast<unsigned char>(text[k]));
    }
  }
  return out;
}

// Visible ASCII with inner spaces or tabs only: a value that HTTP/1.1 and HTTP/2 carry as it is.
bool is_plain_field_value(std::string_view value) {
  if (value.empty() || value.front() == ' ' || value.front() == '\t' || value.back() == ' ' ||
      value.back() == '\t') {
    return false;
  }
  for (char c : value) {
    if (!((c >= 0x21 && c <= 0x7E) || c == ' ' || c == '\t')) return false;
  }
  return true;
}

std::string rfc3339(uint64_t seconds) {
  const detail::CivilDate date = detail::civil_from_days(static_cast<int64_t>(seconds / 86400));
  const uint64_t second_of_day = seconds % 86400;
  char text[32];
  std::snprintf(text, sizeof text, "%04d-%02u-%02uT%02u:%02u:%02uZ", static_cast<int>(date.year),
                date.month, date.day, static_cast<unsigned>(second_of_day / 3600),
                static_cast<unsigned>(second_of_day / 60 % 60),
                static_cast<unsigned>(second_of_day % 60));
  return text;
}

std::optional<std::string_view> text_of(const amqp::FieldValue* value) {
  if (value == nullptr) return std::nullopt;
  if (const auto* text = value->get_if<std::string>()) return std::string_view(*text);
  if (const auto* bytes = value->get_if<amqp::ByteArray>()) return std::string_view(bytes->bytes);
  return std::nullopt;
}

// Sorted by name (bytes; a repeated name keeps its order): RabbitMQ 3.10 delivers headers in the
// order published but sorts them when it dead-letters, and 4.x sorts them on the way in, so only
// sorted are they the same on every attempt and every version.
amqp::FieldTable carried_headers(const amqp::FieldTable& headers) {
  std::vector<const amqp::FieldEntry*> entries;
  for (const auto& entry : headers) {
    if (is_carried_header(entry.name)) entries.push_back(&entry);
  }
  std::stable_sort(
      entries.begin(), entries.end(),
      [](const amqp::FieldEntry* a, const amqp::FieldEntry* b) { return a->name < b->name; });
  amqp::FieldTable carried;
  for (const amqp::FieldEntry* entry : entries)
    carried.append(entry->name, entry->value);
  return carried;
}

// The parts of a message that every attempt of it shares, each after its length, so that no two
// different sets of parts run together into the same bytes; then their SHA-256.
class Digest {
 public:
  void add(std::string_view part) {
    for (int i = 0; i < 8; ++i)
      input_ += static_cast<char>(static_cast<uint64_t>(part.size()) >> (56 - 8 * i));
    input_ += part;
  }

  void add_optional(const std::optional<std::string>& part) {
    add(part ? std::string_view("1") : std::string_view("0"));
    if (part) add(*part);
  }

  template <class Number>
  void add_number(const std::optional<Number>& part) {
    add_optional(part ? std::optional<std::string>(std::to_string(*part)) : std::nullopt);
  }

  // The first 128 bits, in hex.
  std::string hex() const {
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(input_.data()), input_.size(), digest);
    std::string out;
    for (size_t i = 0; i < 16; ++i) {
      out += lower_hex[digest[i] >> 4];
      out += lower_hex[digest[i] & 0xF];
    }
    return out;
  }

 private:
  std::string input_;
};

std::string event_id(const consumer::Message& message, const retry::AttemptInfo& info,
                     const std::string& carried) {
  if (!message.message_id().empty()) return percent_encoded(message.message_id());
  const amqp::BasicProperties& p = message.properties;
  Digest digest;
  digest.add("retryloop ce-id 1");
  digest.add(info.original_exchange);
  digest.add(info.original_routing_key);
  digest.add_optional(p.content_type);
  digest.add_optional(p.content_encoding);
  digest.add_number(p.delivery_mode);
  digest.add_number(p.priority);
  digest.add_optional(p.correlation_id);
  digest.add_optional(p.reply_to);
  digest.add_optional(info.original_expiration);
  digest.add_number(p.timestamp);
  digest.add_optional(p.type);
  digest.add_optional(p.user_id);
  digest.add_optional(p.app_id);
  digest.add_optional(p.cluster_id);
  digest.add(carried);
  digest.add(message.body);
  return "sha256:" + digest.hex();
}

std::string event_type(const consumer::Message& message, const retry::AttemptInfo& info) {
  for (std::string_view candidate :
       {std::string_view(info.original_routing_key), std::string_view(info.original_exchange),
        std::string_view(message.queue)}) {
    if (!candidate.empty()) return percent_encoded(candidate);
  }
  return "unknown";
}

}  // namespace

std::string_view Request::header(std::string_view name) const {
  for (const auto& [field_name, value] : headers) {
    if (same_ignoring_case(field_name, name)) return value;
  }
  return {};
}

bool is_carried_header(std::string_view name) {
  return !retry::is_death_header(name) && name != retry::header::delivery_count &&
         name != retry::header::acquired_count && !starts_with(name, "retryloop-");
}

Request make_request(const consumer::Message& message, const RequestSettings& settings) {
  const amqp::BasicProperties& p = message.properties;
  const retry::AttemptInfo info =
      retry::read_attempt_info(p, message.queue, message.exchange, message.routing_key);
  const amqp::FieldTable carried = carried_headers(message.headers());
  const std::string encoded = carried.empty() ? std::string() : encode_headers(carried);

  Request request;
  auto add = [&](std::string_view name, std::string value) {
    request.headers.emplace_back(std::string(name), std::move(value));
  };
  add("ce-specversion", "1.0");
  add("ce-id", event_id(message, info, encoded));
  add("ce-source", settings.service.empty() ? "retryloop" : percent_encoded(settings.service));
  add("ce-type", event_type(message, info));
  if (p.timestamp && *p.timestamp <= last_rfc3339_second) add("ce-time", rfc3339(*p.timestamp));

  const bool plain_type = p.content_type && is_plain_field_value(*p.content_type);
  add("Content-Type", plain_type ? *p.content_type : "application/octet-stream");
  if (p.content_encoding && is_plain_field_value(*p.content_encoding)) {
    add("Content-Encoding", *p.content_encoding);
  }

  if (auto trace = message.trace_context()) {
    const std::optional<std::string_view> traceparent =
        text_of(message.headers().find(retry::header::traceparent));
    add("traceparent", traceparent && is_plain_field_value(*traceparent) ? std::string(*traceparent)
                                                                         : trace->traceparent());
    if (is_plain_field_value(trace->tracestate) &&
        trace->tracestate.size() <= settings.max_headers_bytes) {
      add("tracestate", trace->tracestate);
    }
  }

  add(field::attempt, std::to_string(message.attempt));
  add(field::max_attempts, std::to_string(settings.max_attempts));
  add(field::redelivered, message.redelivered ? "true" : "false");
  if (encoded.size() > settings.max_headers_bytes) {
    add(field::headers_omitted, std::to_string(encoded.size()));
  } else if (!encoded.empty()) {
    add(field::headers, encoded);
  }
  return request;
}

}  // namespace retryloop::dispatch
