#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/properties.hpp"

namespace retryloop::retry {

// The header contract (design, "Header contract"): retryloop's own headers carry no `x-` prefix
// so that every RabbitMQ version leaves them alone.
namespace header {
inline constexpr std::string_view retries = "retryloop-retries";
inline constexpr std::string_view attempts = "retryloop-attempts";
inline constexpr std::string_view reason = "retryloop-reason";
inline constexpr std::string_view error = "retryloop-error";
inline constexpr std::string_view queue = "retryloop-queue";
inline constexpr std::string_view original_exchange = "retryloop-original-exchange";
inline constexpr std::string_view original_routing_key = "retryloop-original-routing-key";
inline constexpr std::string_view first_failure = "retryloop-first-failure";
inline constexpr std::string_view parked_at = "retryloop-parked-at";
inline constexpr std::string_view consumer = "retryloop-consumer";
inline constexpr std::string_view replays = "retryloop-replays";
/// When a republished retry is due back in its queue: milliseconds since the epoch (int64), the
/// time of the copy plus its delay. now - due is how late the broker brought it back.
inline constexpr std::string_view retry_due = "retryloop-retry-due";
/// The `expiration` property the message carried before retryloop made a copy of it. Copies
/// never carry `expiration` (as when RabbitMQ dead-letters a message): a per-message TTL would
/// cut a wait short or drop a parked message from a queue that dead-letters nowhere.
inline constexpr std::string_view original_expiration = "retryloop-original-expiration";
/// The broker's (not retryloop's) count of earlier deliveries of a message in a quorum queue that
/// went back unsettled. Copies never carry it: the count belongs to the queue it was read from.
inline constexpr std::string_view delivery_count = "x-delivery-count";
/// RabbitMQ 4.3's count of every earlier acquisition of a message by a consumer of its quorum
/// queue, failed or not. Copies never carry it either.
inline constexpr std::string_view acquired_count = "x-acquired-count";
/// A parked message whose properties could not be decoded: its property flags and list as they
/// arrived, as a byte array.
inline constexpr std::string_view raw_properties = "retryloop-raw-properties";
}  // namespace header

/// Longest `retryloop-error` kept; longer texts are cut at a UTF-8 character boundary.
inline constexpr size_t max_error_bytes = 4096;

/// Why a message was parked (`retryloop-reason`). `delivery_limit`: the broker dead-lettered it
/// after it was delivered and not settled more often than the queue's delivery limit allows (it
/// crashed or stalled its consumer again and again); it is parked without running the handler.
enum class ParkReason { exhausted, permanent, poison, delivery_limit };
const char* to_string(ParkReason reason);

/// What a delivery's headers say about its history in its service queue.
struct AttemptInfo {
  /// The handler attempt this delivery is: 1 + `rejected` + `retries`. A redelivery after a
  /// consumer crash carries the same headers, so it is the same attempt again.
  int64_t attempt = 1;
  /// `count` of the `x-death` entry with `queue` == the service queue and `reason` == rejected.
  int64_t rejected = 0;
  /// `retryloop-retries`: retries made by republishing.
  int64_t retries = 0;
  /// `count` of the `x-death` entry with `queue` == the service queue and `reason` ==
  /// delivery_limit (quorum queues); above 0, the message came back from such a dead-lettering.
  int64_t delivery_limited = 0;
  /// `x-delivery-count`: earlier deliveries of this message in a quorum queue that went back
  /// unsettled (0 when absent).
  int64_t delivery_count = 0;
  /// Where the message was first published: `retryloop-original-*`, else the x-death entry
  /// above, else the delivery's own exchange and routing key.
  std::string original_exchange;
  std::string original_routing_key;
  /// When it first failed (seconds since the epoch): `retryloop-first-failure`, else the x-death
  /// entry's `time`; unset on a first attempt.
  std::optional<uint64_t> first_failure;
  /// The message's per-message TTL before any copy or dead-lettering removed it:
  /// `retryloop-original-expiration`, else the `expiration` property, else the x-death entry's
  /// `original-expiration` (the broker moves it there when it dead-letters the message).
  std::optional<std::string> original_expiration;
  /// Set when `x-death` or `retryloop-retries` is not what RabbitMQ or retryloop write (a
  /// non-array `x-death`, a non-table entry, a count or retry number that is not a non-negative
  /// integer): says what is wrong. The malformed parts count as zero; such a message is never
  /// handed back to the broker's dead-lettering (see RetryPolicy).
  std::string malformed;
};

/// Reads the attempt rule's inputs from a delivery on `queue` (the service's input queue).
/// Never throws; forged or odd headers end up in `malformed`.
AttemptInfo read_attempt_info(const amqp::BasicProperties& properties, std::string_view queue,
                              std::string_view delivery_exchange,
                              std::string_view delivery_routing_key);

/// The attempt a delivery is in in_queue mode, where its quorum queue holds it between attempts
/// and counts each failed delivery in `x-delivery-count`: `info.attempt` +
/// `info.delivery_count`, at most INT64_MAX, so that forged counts never wrap to an attempt
/// below max_attempts.
int64_t in_queue_attempt(const AttemptInfo& info);

/// True for the headers RabbitMQ owns and republishing must strip: `x-death`,
/// `x-first-death-*` and `x-last-death-*`.
bool is_death_header(std::string_view name);
/// True for every header the broker writes as a message passes its queues: the death headers,
/// and a quorum queue's `x-delivery-count` and `x-acquired-count`.
bool is_broker_header(std::string_view name);

/// Seconds since the Unix epoch: the clock of every time retryloop writes into a header.
uint64_t unix_seconds();
/// Milliseconds since the Unix epoch (`retryloop-retry-due`).
uint64_t unix_milliseconds();

/// The copy a republish-mode retry publishes to the wait exchange: the same properties with the
/// death headers and the `expiration` property removed, `retryloop-retries` set to
/// `info.attempt` (the attempts made so far, broker rejections included, so that the count never
/// goes down when the x-death entry is stripped), and the original exchange, routing key, first
/// failure time and expiration recorded when not recorded yet. With `due_milliseconds` above 0,
/// `retryloop-retry-due` is set to it.
amqp::BasicProperties make_retry_copy(const amqp::BasicProperties& properties,
                                      const AttemptInfo& info, uint64_t now_seconds,
                                      uint64_t due_milliseconds = 0);

/// What parking records about a message (the parking headers).
struct ParkingNote {
  ParkReason reason = ParkReason::exhausted;
  std::string error;
  /// The service's input queue.
  std::string queue;
  /// Host and process, `host:pid` (retryloop-consumer).
  std::string consumer;
  uint64_t now_seconds = 0;
};

/// The copy that goes to the parking exchange: the same properties (death headers kept, as
/// evidence) with the parking headers set, and without `expiration` (kept in
/// `retryloop-original-expiration`), so that a parked message stays until someone acts on it.
amqp::BasicProperties make_parking_copy(const amqp::BasicProperties& properties,
                                        const AttemptInfo& info, const ParkingNote& note);

/// `text` cut to at most `max_bytes` without splitting a UTF-8 sequence.
std::string truncate_utf8(std::string_view text, size_t max_bytes);

}  // namespace retryloop::retry
