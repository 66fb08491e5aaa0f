#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/properties.hpp"
#include "retryloop/store/database.hpp"

namespace retryloop::outbox {

/// A message for the broker, written to `retryloop_outbox` in the application's transaction and
/// published later by a relay.
struct OutboxMessage {
  std::string exchange;
  std::string routing_key;
  std::string body;
  /// The message-id property, which an idempotent consumer deduplicates by; empty: a random one
  /// (PostgreSQL: a UUID; SQLite: 32 hex digits).
  std::string message_id;
  /// Properties to publish with. `headers` go to the `headers` column; the other properties that
  /// are set go to `properties` (docs/outbox.md). Unset delivery_mode means persistent.
  amqp::BasicProperties properties;
  /// Messages with the same ordering key reach the broker in the order their transactions
  /// committed; messages without one in any order.
  std::optional<std::string> ordering_key;
  /// When the message is due (milliseconds since the Unix epoch; outbox::due_in makes one from a
  /// delay): the relay publishes it through the delay levels (RelayOptions::schedule), so that it
  /// reaches its queue then, not before. A due message goes to one queue: `routing_key` names it
  /// (one of the schedule's queues) and `exchange` stays empty. Unset: published as soon as
  /// possible.
  std::optional<int64_t> due_at_ms;
};

/// The due time `delay` from now (OutboxMessage::due_at_ms), by this process's clock.
int64_t due_in(std::chrono::milliseconds delay);

/// Inserts `message` into `retryloop_outbox` through `database`, inside whatever transaction the
/// caller has open there (that is the point: it commits or rolls back with the business data).
/// Returns the row's id. Throws StoreError; header text that is not UTF-8 is a usage error.
int64_t enqueue(store::Database& database, const OutboxMessage& message);

/// A row's state: `pending` until a relay publishes it, `failed` when the broker returned or
/// nacked it (it waits for `retry` or `purge`), `published` while kept for `retain_published`.
enum class RowState { pending, failed, published };
const char* to_string(RowState state);
std::optional<RowState> row_state_from(std::string_view text);

/// A row of `retryloop_outbox`, with its columns decoded.
struct OutboxRow {
  int64_t id = 0;
  std::string exchange;
  std::string routing_key;
  std::string message_id;
  /// Every property to publish with, headers included.
  amqp::BasicProperties properties;
  std::string body;
  std::optional<std::string> ordering_key;
  /// OutboxMessage::due_at_ms.
  std::optional<int64_t> due_at_ms;
  int64_t created_at_ms = 0;
  RowState state = RowState::pending;
  int64_t attempts = 0;
  std::optional<std::string> last_error;
  std::optional<int64_t> updated_at_ms;
};

/// Rows in the given state (all states when unset), oldest first, at most `limit`. A row whose
/// properties or headers cannot be read (written by hand) is listed without them.
std::vector<OutboxRow> list_rows(store::Database& database, std::optional<RowState> state,
                                 size_t limit, int64_t after_id = 0);

/// How many rows are in each state, and the creation time of the oldest pending one.
struct OutboxStats {
  uint64_t pending = 0;
  uint64_t failed = 0;
  uint64_t published = 0;
  std::optional<int64_t> oldest_pending_ms;
};
OutboxStats stats(store::Database& database);

/// Failed rows back to pending (the given ids, or every failed row when `ids` is empty), and the
/// relays woken. Returns how many changed. Rows that are not failed are left alone.
uint64_t retry_failed(store::Database& database, const std::vector<int64_t>& ids);

/// Deletes failed rows (the given ids, or every failed row when `ids` is empty). Returns how
/// many. Rows that are not failed are left alone.
uint64_t purge_failed(store::Database& database, const std::vector<int64_t>& ids);

/// Deletes published rows last updated before `before_ms`, at most `batch` per statement and
/// transaction, so that no statement holds many locks for long. Returns how many in all.
uint64_t delete_published(store::Database& database, int64_t before_ms, size_t batch);

/// Milliseconds since the Unix epoch, as the tables store times.
int64_t now_ms();

/// The JSON the `headers` column holds for `table`, and back. Strings, integers, floats,
/// booleans, null (void), arrays and tables map to their JSON kinds; a timestamp becomes its
/// seconds, a decimal its value, a byte array its text. Throws StoreError (usage) for text that
/// is not UTF-8, or JSON that is not an object.
std::string headers_to_json(const amqp::FieldTable& table);
amqp::FieldTable headers_from_json(const std::string& json);

}  // namespace retryloop::outbox
