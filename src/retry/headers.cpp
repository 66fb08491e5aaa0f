#include "retryloop/retry/headers.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

#include "saturating.hpp"

#include "retryloop/topology/topology.hpp"

namespace retryloop::retry {
namespace {

using detail::saturating_add;

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

std::optional<std::string_view> string_field(const amqp::FieldTable& table, std::string_view name) {
  const amqp::FieldValue* value = table.find(name);
  return value != nullptr ? value->as_string() : std::nullopt;
}

std::optional<uint64_t> time_field(const amqp::FieldTable& table, std::string_view name) {
  const amqp::FieldValue* value = table.find(name);
  if (value == nullptr) return std::nullopt;
  if (const auto* timestamp = value->get_if<amqp::Timestamp>()) return timestamp->seconds;
  if (auto number = value->as_int64(); number && *number >= 0) return uint64_t(*number);
  return std::nullopt;
}

void note_malformed(AttemptInfo& info, std::string what) {
  if (!info.malformed.empty()) info.malformed += "; ";
  info.malformed += what;
}

/// Reads the x-death entries for {queue, rejected} and {queue, delivery_limit} into `info`, those
/// of the queue's holding queue too (a migration's: a message may have been rejected in both).
void read_x_death(const amqp::FieldValue& x_death, std::string_view queue, AttemptInfo& info,
                  std::string& exchange, std::optional<std::string>& routing_key) {
  const auto* entries = x_death.get_if<amqp::FieldArray>();
  if (entries == nullptr) {
    note_malformed(info,
                   std::string("x-death is not an array (type '") + x_death.type_letter() + "')");
    return;
  }
  bool found = false;
  bool found_holding = false;
  bool details_read = false;
  bool details_from_queue = false;
  std::optional<std::string_view> death_expiration;
  for (size_t i = 0; i < entries->size(); ++i) {
    const auto* entry = (*entries)[i].get_if<amqp::FieldTable>();
    if (entry == nullptr) {
      note_malformed(info, "x-death[" + std::to_string(i) + "] is not a table");
      continue;
    }
    const auto name = string_field(*entry, "queue");
    const bool in_holding = name && topology::is_holding_queue_of(*name, queue);
    if (name != queue && !in_holding) continue;
    if (string_field(*entry, "reason") == std::string_view("delivery_limit")) {
      const amqp::FieldValue* count = entry->find("count");
      if (auto n = count != nullptr ? count->as_int64() : std::nullopt; n && *n > 0) {
        info.delivery_limited = std::max(info.delivery_limited, *n);
      }
      continue;
    }
    bool& seen = in_holding ? found_holding : found;
    if (seen || string_field(*entry, "reason") != std::string_view("rejected")) continue;
    const amqp::FieldValue* count = entry->find("count");
    std::optional<int64_t> n = count != nullptr ? count->as_int64() : std::nullopt;
    if (!n || *n < 0) {
      note_malformed(info,
                     "x-death[" + std::to_string(i) + "].count is not a non-negative integer");
      continue;
    }
    // RabbitMQ keeps one entry per {queue, reason}; the first is the most recent.
    seen = true;
    info.rejected = saturating_add(info.rejected, *n);
    if (auto time = time_field(*entry, "time");
        time && (!info.first_failure || *time < *info.first_failure)) {
      info.first_failure = time;
    }
    // Where it was published comes from the service queue's entry when there is one: the
    // holding queue's names the default exchange and the holding queue, where the migration's
    // mover put the message.
    if (details_read && (details_from_queue || in_holding)) continue;
    details_read = true;
    details_from_queue = !in_holding;
    if (auto name = string_field(*entry, "exchange")) exchange = std::string(*name);
    if (const amqp::FieldValue* keys = entry->find("routing-keys")) {
      if (const auto* list = keys->get_if<amqp::FieldArray>(); list && !list->empty()) {
        if (auto key = list->front().as_string()) routing_key = std::string(*key);
      }
    }
    death_expiration = string_field(*entry, "original-expiration");
  }
  if (death_expiration && !info.original_expiration) {
    info.original_expiration = std::string(*death_expiration);
  }
}

/// Moves a per-message TTL out of the copy's properties into its header.
void keep_expiration(amqp::BasicProperties& copy, amqp::FieldTable& headers,
                     const AttemptInfo& info) {
  copy.expiration.reset();
  if (info.original_expiration && headers.find(header::original_expiration) == nullptr) {
    headers.set(std::string(header::original_expiration), *info.original_expiration);
  }
}

}  // namespace

const char* to_string(ParkReason reason) {
  switch (reason) {
    case ParkReason::exhausted:
      return "exhausted";
    case ParkReason::permanent:
      return "permanent";
    case ParkReason::poison:
      return "poison";
    case ParkReason::delivery_limit:
      return "delivery_limit";
  }
  return "unknown";
}

bool is_death_header(std::string_view name) {
  return name == "x-death" || starts_with(name, "x-first-death-") ||
         starts_with(name, "x-last-death-");
}

bool is_broker_header(std::string_view name) {
  return is_death_header(name) || name == header::delivery_count || name == header::acquired_count;
}

AttemptInfo read_attempt_info(const amqp::BasicProperties& properties, std::string_view queue,
                              std::string_view delivery_exchange,
                              std::string_view delivery_routing_key) {
  AttemptInfo info;
  info.original_exchange = delivery_exchange;
  info.original_routing_key = delivery_routing_key;
  info.original_expiration = properties.expiration;
  if (!properties.headers) return info;
  const amqp::FieldTable& headers = *properties.headers;

  if (const amqp::FieldValue* count = headers.find(header::delivery_count)) {
    info.delivery_count = std::max<int64_t>(count->as_int64().value_or(0), 0);
  }
  if (const amqp::FieldValue* retries = headers.find(header::retries)) {
    std::optional<int64_t> n = retries->as_int64();
    if (n && *n >= 0) {
      info.retries = *n;
    } else {
      note_malformed(info, std::string(header::retries) + " is not a non-negative integer");
    }
  }

  std::string death_exchange(delivery_exchange);
  std::optional<std::string> death_routing_key;
  bool from_death = false;
  if (const amqp::FieldValue* x_death = headers.find("x-death")) {
    read_x_death(*x_death, queue, info, death_exchange, death_routing_key);
    from_death = info.rejected > 0;
  }
  if (from_death) {
    info.original_exchange = std::move(death_exchange);
    if (death_routing_key) info.original_routing_key = std::move(*death_routing_key);
  }
  if (auto exchange = string_field(headers, header::original_exchange)) {
    info.original_exchange = std::string(*exchange);
  }
  if (auto key = string_field(headers, header::original_routing_key)) {
    info.original_routing_key = std::string(*key);
  }
  if (auto first = time_field(headers, header::first_failure)) info.first_failure = first;
  if (auto expiration = string_field(headers, header::original_expiration)) {
    info.original_expiration = std::string(*expiration);
  }

  info.attempt = saturating_add(saturating_add(1, info.rejected), info.retries);
  return info;
}

int64_t in_queue_attempt(const AttemptInfo& info) {
  return saturating_add(info.attempt, info.delivery_count);
}

uint64_t unix_seconds() {
  return uint64_t(std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

uint64_t unix_milliseconds() {
  return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

amqp::BasicProperties make_retry_copy(const amqp::BasicProperties& properties,
                                      const AttemptInfo& info, uint64_t now_seconds,
                                      uint64_t due_milliseconds) {
  amqp::BasicProperties copy = properties;
  amqp::FieldTable& headers = copy.headers ? *copy.headers : copy.headers.emplace();
  headers.erase_if(is_broker_header);
  // Every attempt so far, the broker's rejections included: stripping x-death drops them.
  headers.set(std::string(header::retries), info.attempt);
  if (headers.find(header::original_exchange) == nullptr) {
    headers.set(std::string(header::original_exchange), info.original_exchange);
  }
  if (headers.find(header::original_routing_key) == nullptr) {
    headers.set(std::string(header::original_routing_key), info.original_routing_key);
  }
  if (headers.find(header::first_failure) == nullptr) {
    headers.set(std::string(header::first_failure),
                amqp::Timestamp{info.first_failure.value_or(now_seconds)});
  }
  if (due_milliseconds > 0) {
    headers.set(std::string(header::retry_due), static_cast<int64_t>(due_milliseconds));
  }
  keep_expiration(copy, headers, info);
  return copy;
}

amqp::BasicProperties make_parking_copy(const amqp::BasicProperties& properties,
                                        const AttemptInfo& info, const ParkingNote& note) {
  amqp::BasicProperties copy = properties;
  amqp::FieldTable& headers = copy.headers ? *copy.headers : copy.headers.emplace();
  headers.set(std::string(header::attempts), info.attempt);
  headers.set(std::string(header::reason), to_string(note.reason));
  headers.set(std::string(header::error), truncate_utf8(note.error, max_error_bytes));
  headers.set(std::string(header::queue), note.queue);
  headers.set(std::string(header::original_exchange), info.original_exchange);
  headers.set(std::string(header::original_routing_key), info.original_routing_key);
  headers.set(std::string(header::first_failure),
              amqp::Timestamp{info.first_failure.value_or(note.now_seconds)});
  headers.set(std::string(header::parked_at), amqp::Timestamp{note.now_seconds});
  headers.set(std::string(header::consumer), note.consumer);
  headers.erase(header::delivery_count);
  headers.erase(header::acquired_count);
  keep_expiration(copy, headers, info);
  return copy;
}

std::string truncate_utf8(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t end = max_bytes;
  // Step back over continuation bytes (10xxxxxx) to the start of the cut character.
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80)
    --end;
  return std::string(text.substr(0, end));
}

}  // namespace retryloop::retry
