#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/properties.hpp"
#include "retryloop/retry/headers.hpp"

namespace retryloop::retry {

namespace header {
/// What happened to a message, oldest first: an array of tables, one per failed attempt, park,
/// replay or edit (docs/headers.md, "History"). Every copy keeps it; only the last
/// max_history_entries stay on the message.
inline constexpr std::string_view history = "retryloop-history";
/// How many older entries were dropped from `retryloop-history` (int64).
inline constexpr std::string_view history_older = "retryloop-history-older";
}  // namespace header

/// The most entries `retryloop-history` keeps; older ones are only counted.
inline constexpr size_t max_history_entries = 20;
/// The longest error line an entry keeps (cut at a UTF-8 character boundary).
inline constexpr size_t max_history_error_bytes = 256;

/// The `outcome` of a history entry.
namespace history_outcome {
/// A failed attempt sent back to wait (`via` says how).
inline constexpr std::string_view retry = "retry";
/// A failed attempt (or a delivery over the delivery limit) that went to parking (`reason`).
inline constexpr std::string_view parked = "parked";
/// Sent from parking back to a queue (`by` says who).
inline constexpr std::string_view replayed = "replayed";
/// Edited in the console and sent to a queue as a new message (`by` says who).
inline constexpr std::string_view edited = "edited";
}  // namespace history_outcome

/// One event in a message's history. Optional parts are absent when not known: a retry the
/// broker dead-lettered (`via` reject) carries no error and no time, because a reject carries
/// nothing back; its entry is written later, by the next copy retryloop makes of the message.
struct HistoryEntry {
  /// The attempt the event ended (retry, parked), or the attempts made before it (replayed,
  /// edited). A replay starts the count again at 1.
  int64_t attempt = 0;
  /// Seconds since the epoch (an AMQP timestamp on the wire).
  std::optional<uint64_t> at;
  std::string outcome;
  /// The first line of the error, at most max_history_error_bytes.
  std::string error;
  /// How long the retry waits.
  std::optional<int64_t> delay_ms;
  /// How: `republish`, `reject` or `in_queue` for a retry; the retry mode of the service for a
  /// park; `cli` or `console` for a replay or an edit.
  std::string via;
  /// The consumer (host:pid) that made the copy.
  std::string consumer;
  /// `retryloop-reason` of a park.
  std::string reason;
  /// Who replayed or edited it: the console's caller, or the command line's user@host.
  std::string by;

  friend bool operator==(const HistoryEntry& a, const HistoryEntry& b);
};

struct History {
  /// Oldest first.
  std::vector<HistoryEntry> entries;
  /// Entries dropped before `entries[0]`.
  int64_t older = 0;
  /// Set when the header is there but not what retryloop writes (not an array, an entry that is
  /// not a table): says what is wrong. The readable entries are kept.
  std::string malformed;
};

/// Reads `retryloop-history` and `retryloop-history-older`; never throws.
History read_history(const amqp::FieldTable* headers);

/// Writes `history` into `headers`, keeping its last max_history_entries (the rest are added to
/// `older`). An empty history removes both headers.
void write_history(amqp::FieldTable& headers, History history);

/// Adds the attempts before `attempt` that the history has no entry for since its last replay or
/// edit: retries that the broker dead-lettered (`via` reject) or that waited in their own queue
/// (`in_queue`), which no copy recorded when they happened. At most max_history_entries are
/// added; the rest are counted in `older`. `first_failure` becomes the time of attempt 1.
void add_unrecorded_attempts(History& history, int64_t attempt, std::string_view via,
                             std::optional<int64_t> delay_ms,
                             std::optional<uint64_t> first_failure);

/// Appends `entry` (its error cut to its first line and max_history_error_bytes) to the copy's
/// headers, after the attempts that add_unrecorded_attempts finds missing before
/// `entry.attempt` (when `unrecorded_via` is not empty).
void record_history(amqp::BasicProperties& copy, HistoryEntry entry,
                    std::string_view unrecorded_via = {},
                    std::optional<int64_t> unrecorded_delay_ms = std::nullopt,
                    std::optional<uint64_t> first_failure = std::nullopt);

/// Drops the oldest half (at least one) of the copy's history entries, counting them in
/// `retryloop-history-older`; false when it has none left to drop. How a copy that does not fit
/// frame_max gives up its history before anything else.
bool shorten_history(amqp::BasicProperties& copy);

}  // namespace retryloop::retry
