#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/store/database.hpp"

namespace retryloop::inbox {

namespace detail {
class InboxImpl;
}

/// What the inbox does with a message that has no message-id property: it cannot tell a
/// redelivery of it from a new message.
enum class MissingMessageId {
  park,    ///< park it as poison, naming why (the default: nothing is handled twice silently)
  handle,  ///< run the handler in a transaction without recording anything (at least once)
};

struct InboxOptions {
  /// The database that holds `retryloop_inbox` (see store::Database::open for the URLs): the
  /// one the handler writes its own data to, since both commit in one transaction.
  std::string database;
  /// The name recorded with each message id. Consumers that must each see every message (two
  /// services reading copies of one event) need different names; instances of one service
  /// share theirs. Required.
  std::string consumer;
  /// How long a message id is remembered. A copy arriving later is handled again, so keep it
  /// longer than any copy can take: the retry delays, plus the time a message may stay parked
  /// before a replay. Default: 7 days.
  std::chrono::milliseconds retention{std::chrono::hours(24 * 7)};
  /// How often ids older than the retention are deleted, `cleanup_batch` rows per statement (by
  /// the handler call that finds it due, after its own transaction).
  std::chrono::milliseconds cleanup_interval{60000};
  size_t cleanup_batch = 1000;
  MissingMessageId missing_message_id = MissingMessageId::park;
};

/// What an inbox has done since it was made.
struct InboxStats {
  uint64_t handled = 0;      ///< handler ran and its transaction committed with the id
  uint64_t duplicates = 0;   ///< id already recorded: acked without running the handler
  uint64_t rolled_back = 0;  ///< handler failed (retry, park, exception): nothing recorded
  uint64_t missing_id = 0;   ///< messages without a message-id
  uint64_t cleaned = 0;      ///< expired ids deleted
  uint64_t cancelled = 0;    ///< scheduled messages whose id was cancelled: dropped, not handled
};

/// The handler the inbox wraps. It writes through `database`, inside the transaction the inbox
/// has opened; it must not commit or roll back itself. Its outcome decides: ack or drop commits
/// its writes together with the message id; any other outcome, or an exception, rolls both
/// back, and the message goes to its retry or to parking as usual.
using TransactionalHandler =
    std::function<retry::Outcome(const consumer::Message& message, store::Database& database)>;

/// The idempotent consumer: makes a retry consumer's handler run at most once per message id,
/// even when the broker delivers a message twice (a redelivery after a crash between commit and
/// ack, a relay that published twice, a replay). For each delivery it opens a transaction,
/// records (consumer, message id) in `retryloop_inbox`, runs the handler in the same
/// transaction, and commits; an id already recorded is acked without running the handler
/// (outcome `drop`, "duplicate"). On PostgreSQL, two copies handled at the same moment meet on
/// the table's primary key: the second waits for the first to commit, then sees the duplicate.
///
/// A scheduled message (one with `retryloop-due-at`, schedule/scheduler.hpp) whose queue and id
/// were cancelled (cancel_scheduled) is dropped instead, in the same transaction that deletes the
/// cancellation and records the id: outcome `drop`, "cancelled", counted in `cancelled`. Only
/// scheduled messages cost the extra statements. The id is recorded with the queue it arrived in
/// (consumer::Message::queue), so that a cancel can tell whether its message came already.
///
/// Threading: the handler it makes is safe to call from the consumer's worker threads; each
/// call uses a database connection of its own from a pool.
class Inbox {
 public:
  /// Opens one connection and checks the schema (`retryloop outbox init` creates it). Throws
  /// StoreError.
  static std::shared_ptr<Inbox> create(InboxOptions options);
  explicit Inbox(std::shared_ptr<detail::InboxImpl> impl);
  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  /// The consumer handler that runs `handler` through the inbox.
  consumer::Handler wrap(TransactionalHandler handler);
  /// Deletes ids older than the retention now; returns how many.
  uint64_t clean_up();
  InboxStats stats() const;

 private:
  std::shared_ptr<detail::InboxImpl> impl_;
};

/// An inbox's counters in Prometheus' text format, labelled with its consumer name:
/// `retryloop_inbox_handled_total`, `..._duplicates_total` (copies absorbed),
/// `..._rolled_back_total`, `..._missing_id_total`, `..._cancelled_total`, `..._cleaned_total`
/// (operations::HttpEndpoint::add_metrics serves it).
std::string prometheus_text(const InboxStats& stats, const std::string& consumer_name);

/// What cancel_scheduled found.
struct CancelResult {
  /// False when the message was cancelled already (the cancellation stands).
  bool recorded = false;
  /// Inbox consumers that recorded the id in this queue already: the message reached them before
  /// the cancel, which comes too late for them. Empty means that no inbox consumer on this
  /// database has it or will handle it: the answer is true also when the message arrives while
  /// the cancel runs (the two take turns on a lock of the queue and id).
  std::vector<std::string> handled_by;
};

/// Cancels the scheduled message with this message id for this queue: an inbox consumer
/// (Inbox::wrap) that receives it there drops it. A message with the same id scheduled for
/// another queue is not cancelled. The broker still holds the message until it is due (it is
/// never searched for in the delay levels); a consumer without an inbox on this database handles
/// it as usual. The cancellation is kept until the inbox sees the message, or else until the
/// inbox retention has passed after `keep_until_ms` (when the message is due at the latest: now
/// plus the levels' longest delay), when the inbox cleanup deletes it. Throws StoreError (usage
/// for an empty queue or id).
CancelResult cancel_scheduled(store::Database& database, const std::string& queue,
                              const std::string& message_id, int64_t keep_until_ms);

}  // namespace retryloop::inbox
