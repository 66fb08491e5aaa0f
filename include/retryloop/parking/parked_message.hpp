#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/properties.hpp"
#include "retryloop/client/message.hpp"

namespace retryloop::parking {

/// A message read from a parking queue, with its parking headers decoded. Headers that are
/// missing or of another type leave their field empty; nothing here throws.
struct ParkedMessage {
  /// 0-based place in the parking queue when it was read.
  uint64_t position = 0;
  client::Message message;
  /// The size of the body as it was read. `message.body` may hold only its first bytes
  /// (StatsOptions::kept_body_bytes).
  uint64_t body_size = 0;
  std::string message_id;
  /// `retryloop-parked-at`, seconds since the epoch.
  std::optional<uint64_t> parked_at;
  /// `retryloop-reason`; for a message the broker parked itself (it has `x-death` but no
  /// `retryloop-reason`), unrouted_reason.
  std::string reason;
  std::optional<int64_t> attempts;
  std::string error;
  std::string queue;
  std::string original_exchange;
  std::string original_routing_key;
  /// `retryloop-replays`: times it was replayed before.
  int64_t replays = 0;
  /// The routing key it was delivered with.
  std::string routing_key;
};

/// The reason of a message that the wait exchange's alternate exchange parked: no queue took a
/// retry (its wait queue, or the service queue when its delay ended, did not exist).
inline constexpr const char* unrouted_reason = "unrouted";

/// Decodes the parking headers of `message`.
ParkedMessage read_parked(client::Message message, uint64_t position);

/// A header value as text, for filters and tables: strings as they are, numbers in decimal,
/// booleans as true/false, timestamps as seconds; nullopt for tables, arrays and void.
std::optional<std::string> header_text(const amqp::FieldValue& value);

/// The first line of `text` (all of it when it has no line break): what `stats` groups errors by.
std::string first_line(std::string_view text);

/// An error line with what varies from message to message masked, so that the messages of one
/// cause form one group: quoted text becomes `"<value>"`, UUIDs `<uuid>`, dates and times
/// `<time>`, hex numbers (`0x1f`, or eight or more hex digits with a letter) `<hex>`, other
/// numbers `<n>`, and words that mix letters and digits `<id>`. "customer 1 does not exist" and
/// "customer 4 does not exist" both become "customer <n> does not exist".
std::string error_fingerprint(std::string_view line);

/// Which parked messages an operation takes. Every condition must hold; an empty filter takes
/// every message.
struct Filter {
  /// HEADER=VALUE pairs: the header must be present with this text (header_text).
  std::vector<std::pair<std::string, std::string>> where;
  /// Parked longer ago than this (by `retryloop-parked-at`; a message without it never matches).
  std::optional<std::chrono::milliseconds> older_than;
  /// Parked for one of these reasons (ParkedMessage::reason); empty: any.
  std::vector<std::string> reasons;
  /// Parked at or after this time, and at or before `parked_until` (seconds since the epoch, by
  /// `retryloop-parked-at`; a message without it never matches either bound).
  std::optional<uint64_t> parked_from;
  std::optional<uint64_t> parked_until;
  /// The error (`retryloop-error`) contains this text, ignoring the case of ASCII letters; empty:
  /// any.
  std::string error_contains;
  /// The error's first_line() is exactly this; "" takes the messages without an error.
  std::optional<std::string> error_first_line;
  /// The error_fingerprint() of the error's first line is exactly this; "" takes the messages
  /// without an error.
  std::optional<std::string> error_fingerprint;
  /// The message id is one of these; empty: any.
  std::unordered_set<std::string> message_ids;
  /// `retryloop-original-routing-key` is exactly this.
  std::optional<std::string> original_routing_key;

  bool empty() const {
    return where.empty() && !older_than && reasons.empty() && !parked_from && !parked_until &&
           error_contains.empty() && !error_first_line && !error_fingerprint &&
           message_ids.empty() && !original_routing_key;
  }
  bool matches(const ParkedMessage& parked, uint64_t now_seconds) const;
};

/// Parses `HEADER=VALUE` (`--where`). Throws std::invalid_argument naming the problem.
std::pair<std::string, std::string> parse_where(const std::string& text);

/// Who sends a parked message back, for its history entry.
struct ActionNote {
  /// The history entry's outcome; empty: `replayed`.
  std::string outcome;
  /// `cli` or `console`.
  std::string via = "cli";
  /// The console's caller, or the command line's user@host.
  std::string by;
  /// Seconds since the epoch; 0: now.
  uint64_t now_seconds = 0;
};

/// The command line's user@host, for ActionNote::by.
std::string command_line_user();

/// The copy a replay publishes: the same body and properties, with `x-death`,
/// `x-first-death-*`, `x-last-death-*`, `retryloop-retries` and the parking headers removed (the
/// original exchange and routing key stay: they say where the message came from),
/// `retryloop-replays` incremented, and a `replayed` entry (attempts made, when, via, by) added to
/// `retryloop-history`, which stays. The message starts fresh on every RabbitMQ version. An
/// `expiration` property is not restored or kept: it moves to `retryloop-original-expiration`
/// (which replay keeps), so the replayed message cannot expire in the queue it goes to.
amqp::BasicProperties make_replay_copy(const amqp::BasicProperties& properties,
                                       const ActionNote& note = {});

}  // namespace retryloop::parking
