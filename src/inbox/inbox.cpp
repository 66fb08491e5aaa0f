#include "retryloop/inbox/inbox.hpp"

#include <atomic>
#include <mutex>
#include <vector>

#include "retryloop/outbox/outbox.hpp"
#include "retryloop/outbox/schema.hpp"
#include "retryloop/schedule/scheduler.hpp"

namespace retryloop::inbox {
namespace {

/// Makes the inbox handling a scheduled message and a cancel of it take turns on PostgreSQL, so
/// that each sees what the other committed: whichever comes second waits for the first's
/// transaction to end. On SQLite every writing transaction takes the database's write lock at
/// its start already.
void lock_scheduled_message(store::Database& database, const std::string& queue,
                            const std::string& message_id) {
  if (database.dialect() != store::Dialect::postgresql) return;
  database.execute(
      "SELECT pg_advisory_xact_lock(727272002, hashtext($1::text || E'\\n' || $2::text))",
      {queue, message_id});
}

}  // namespace

namespace detail {

class InboxImpl {
 public:
  explicit InboxImpl(InboxOptions options) : options_(std::move(options)) {}

  void check() {
    if (options_.consumer.empty()) {
      throw store::StoreError(store::ErrorKind::usage, "inbox: the consumer name is empty");
    }
    auto database = store::Database::open(options_.database, false);
    outbox::require_schema(*database);
    release(std::move(database));
  }

  retry::Outcome handle(const consumer::Message& message, const TransactionalHandler& handler);
  uint64_t clean_up(store::Database& database);
  uint64_t clean_up() {
    auto database = acquire();
    uint64_t deleted = clean_up(*database);
    release(std::move(database));
    return deleted;
  }

  InboxStats stats() const {
    InboxStats out;
    out.handled = handled_;
    out.duplicates = duplicates_;
    out.rolled_back = rolled_back_;
    out.missing_id = missing_id_;
    out.cleaned = cleaned_;
    out.cancelled = cancelled_;
    return out;
  }

 private:
  std::unique_ptr<store::Database> acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!idle_.empty()) {
        auto database = std::move(idle_.back());
        idle_.pop_back();
        return database;
      }
    }
    return store::Database::open(options_.database, false);
  }

  void release(std::unique_ptr<store::Database> database) {
    if (!database || !database->usable() || database->in_transaction()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(std::move(database));
  }

  /// Deletes the cancellation of this scheduled message, if there is one, once a cancel of it
  /// that runs at the same moment has committed or waits; true when there was one. A
  /// cancellation of the queue '' (made before cancellations named their queue) counts for every
  /// queue.
  static bool cancellation_used_up(store::Database& database, const std::string& queue,
                                   const std::string& message_id) {
    lock_scheduled_message(database, queue, message_id);
    return database
               .execute(
                   "DELETE FROM retryloop_cancelled WHERE message_id = $1 AND queue IN ($2, '')",
                   {message_id, queue})
               .affected > 0;
  }

  bool cleanup_due() {
    auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    auto interval =
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(options_.cleanup_interval)
            .count();
    auto last = last_cleanup_.load();
    if (last != 0 && now - last < interval) return false;
    return last_cleanup_.compare_exchange_strong(last, now);
  }

  InboxOptions options_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<store::Database>> idle_;
  std::atomic<int64_t> last_cleanup_{0};
  std::atomic<uint64_t> handled_{0}, duplicates_{0}, rolled_back_{0}, missing_id_{0}, cleaned_{0},
      cancelled_{0};
};

retry::Outcome InboxImpl::handle(const consumer::Message& message,
                                 const TransactionalHandler& handler) {
  const std::string_view id = message.message_id();
  if (id.empty()) {
    ++missing_id_;
    if (options_.missing_message_id == MissingMessageId::park) {
      return retry::Outcome::poison(
          "no message-id: the inbox of consumer '" + options_.consumer +
          "' cannot tell a redelivery of this message from a new one (publish with a "
          "message-id, or set missing_message_id to handle)");
    }
  }
  auto database = acquire();
  retry::Outcome outcome;
  try {
    store::Transaction transaction(*database);
    if (!id.empty()) {
      auto recorded = database->execute(
          "INSERT INTO retryloop_inbox (consumer, message_id, received_at, queue) VALUES ($1, $2, "
          "$3, $4) ON CONFLICT DO NOTHING",
          {options_.consumer, std::string(id), outbox::now_ms(), message.queue});
      if (recorded.affected == 0) {
        ++duplicates_;
        outcome =
            retry::Outcome::drop("duplicate: message id " + std::string(id) +
                                 " was handled already by consumer '" + options_.consumer + "'");
        transaction.commit();  // nothing written; ends the transaction
        release(std::move(database));
        return outcome;
      }
      if (message.headers().find(schedule::header::due_at) != nullptr &&
          cancellation_used_up(*database, message.queue, std::string(id))) {
        ++cancelled_;
        transaction.commit();  // the id recorded, the cancellation used up
        release(std::move(database));
        return retry::Outcome::drop("cancelled: scheduled message " + std::string(id) +
                                    " was cancelled before it was due");
      }
    }
    outcome = handler(message, *database);
    if (outcome.kind == retry::OutcomeKind::ack || outcome.kind == retry::OutcomeKind::drop) {
      transaction.commit();
      ++handled_;
    } else {
      ++rolled_back_;  // the transaction's destructor rolls back
    }
  } catch (...) {
    ++rolled_back_;
    release(std::move(database));  // kept only if still usable and out of its transaction
    throw;
  }
  if (cleanup_due()) {
    try {
      clean_up(*database);
    } catch (const store::StoreError&) {
      // The next due cleanup tries again; the message's own work is done.
    }
  }
  release(std::move(database));
  return outcome;
}

uint64_t InboxImpl::clean_up(store::Database& database) {
  const bool postgres = database.dialect() == store::Dialect::postgresql;
  std::string sql =
      std::string(
          "DELETE FROM retryloop_inbox WHERE consumer = $1 AND message_id IN (SELECT message_id "
          "FROM retryloop_inbox WHERE consumer = $1 AND received_at < $2 LIMIT $3") +
      (postgres ? " FOR UPDATE SKIP LOCKED" : "") + ")";
  const int64_t before = outbox::now_ms() - options_.retention.count();
  uint64_t total = 0;
  for (;;) {
    auto deleted =
        database
            .execute(sql, {options_.consumer, before, static_cast<int64_t>(options_.cleanup_batch)})
            .affected;
    total += deleted;
    if (deleted < options_.cleanup_batch) break;
  }
  const std::string cancelled_sql =
      std::string(
          "DELETE FROM retryloop_cancelled WHERE (queue, message_id) IN (SELECT queue, message_id "
          "FROM retryloop_cancelled WHERE keep_until < $1 LIMIT $2") +
      (postgres ? " FOR UPDATE SKIP LOCKED" : "") + ")";
  for (;;) {
    auto deleted =
        database.execute(cancelled_sql, {before, static_cast<int64_t>(options_.cleanup_batch)})
            .affected;
    total += deleted;
    if (deleted < options_.cleanup_batch) break;
  }
  cleaned_ += total;
  return total;
}

}  // namespace detail

std::shared_ptr<Inbox> Inbox::create(InboxOptions options) {
  auto impl = std::make_shared<detail::InboxImpl>(std::move(options));
  impl->check();
  return std::make_shared<Inbox>(std::move(impl));
}

Inbox::Inbox(std::shared_ptr<detail::InboxImpl> impl) : impl_(std::move(impl)) {}
Inbox::~Inbox() = default;

consumer::Handler Inbox::wrap(TransactionalHandler handler) {
  auto impl = impl_;
  return [impl, handler = std::move(handler)](const consumer::Message& message) {
    return impl->handle(message, handler);
  };
}

uint64_t Inbox::clean_up() {
  return impl_->clean_up();
}
InboxStats Inbox::stats() const {
  return impl_->stats();
}

CancelResult cancel_scheduled(store::Database& database, const std::string& queue,
                              const std::string& message_id, int64_t keep_until_ms) {
  if (queue.empty()) {
    throw store::StoreError(store::ErrorKind::usage,
                            "cancel: the queue is empty (a cancellation names the queue its "
                            "message was scheduled for)");
  }
  if (message_id.empty()) {
    throw store::StoreError(store::ErrorKind::usage, "cancel: the message id is empty");
  }
  CancelResult result;
  store::Transaction transaction(database);
  lock_scheduled_message(database, queue, message_id);
  result.recorded = database
                        .execute(
                            "INSERT INTO retryloop_cancelled (queue, message_id, cancelled_at, "
                            "keep_until) VALUES ($1, $2, $3, $4) ON CONFLICT (queue, message_id) "
                            "DO NOTHING",
                            {queue, message_id, outbox::now_ms(), keep_until_ms})
                        .affected > 0;
  if (!result.recorded) {
    database.execute(
        "UPDATE retryloop_cancelled SET keep_until = $3 WHERE queue = $1 AND message_id = $2 AND "
        "keep_until < $3",
        {queue, message_id, keep_until_ms});
  }
  for (const auto& row :
       database
           .execute("SELECT consumer FROM retryloop_inbox WHERE message_id = $1 AND "
                    "queue IN ($2, '') ORDER BY consumer",
                    {message_id, queue})
           .rows) {
    result.handled_by.push_back(row.text(0).value_or(""));
  }
  transaction.commit();
  return result;
}

std::string prometheus_text(const InboxStats& stats, const std::string& consumer_name) {
  const std::string labels =
      "{consumer=\"" + retry::prometheus_escaped(consumer_name, true) + "\"} ";
  std::string out;
  auto counter = [&](const char* family, const char* help, uint64_t value) {
    out += std::string("# HELP ") + family + " " + help + "\n# TYPE " + family + " counter\n" +
           family + labels + std::to_string(value) + "\n";
  };
  counter("retryloop_inbox_handled_total", "Messages whose handler ran and committed.",
          stats.handled);
  counter("retryloop_inbox_duplicates_total",
          "Copies of messages handled already: acked without running the handler.",
          stats.duplicates);
  counter("retryloop_inbox_rolled_back_total", "Handler runs that failed and rolled back.",
          stats.rolled_back);
  counter("retryloop_inbox_missing_id_total", "Messages without a message-id.", stats.missing_id);
  counter("retryloop_inbox_cancelled_total",
          "Scheduled messages dropped because their id was cancelled.", stats.cancelled);
  counter("retryloop_inbox_cleaned_total", "Expired ids and cancellations deleted.", stats.cleaned);
  return out;
}

}  // namespace retryloop::inbox
