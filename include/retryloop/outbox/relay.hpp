#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "retryloop/client/connection.hpp"
#include "retryloop/client/loop.hpp"
#include "retryloop/outbox/outbox.hpp"
#include "retryloop/retry/backoff.hpp"
#include "retryloop/topology/topology.hpp"

namespace spdlog {
class logger;
}

namespace retryloop::outbox {

namespace detail {
class RelayImpl;
}

struct RelayOptions {
  /// The database that holds `retryloop_outbox` (see store::Database::open for the URLs).
  std::string database;
  /// The broker to publish to.
  client::ConnectionOptions connection;
  /// Rows claimed, published and settled together.
  size_t batch_size = 500;
  /// Batches out at once (PostgreSQL), each claimed in a transaction of its own on a database
  /// connection of its own: while one waits for its confirms, the next is claimed and
  /// published, so that neither the broker nor the database waits for the other. A batch skips
  /// the rows and the ordering keys the others hold, as another relay's would. SQLite, with its
  /// single writer, has one batch out at a time.
  size_t batches_in_flight = 2;
  /// Wake on PostgreSQL notifications (LISTEN retryloop_outbox; the table's trigger notifies at
  /// each commit that inserts rows). SQLite has none and always polls.
  bool notifications = true;
  /// How often to look for rows when nothing woke the relay; 0: 5 s on PostgreSQL with
  /// notifications (a safety net), 100 ms on SQLite or without notifications.
  std::chrono::milliseconds poll_interval{0};
  /// Keep published rows this long (state `published`) before they are deleted; 0: delete a
  /// row as soon as its publish is confirmed.
  std::chrono::milliseconds retain_published{0};
  /// How often kept published rows are deleted, `cleanup_batch` rows per statement.
  std::chrono::milliseconds cleanup_interval{60000};
  size_t cleanup_batch = 1000;
  /// A batch whose publishes are not all confirmed within this time ends the broker connection,
  /// as a dead one would: its unconfirmed rows stay pending and are published again.
  std::chrono::milliseconds confirm_timeout{30000};
  /// The delay levels that rows with a due time wait in (the topology file's `delay_levels`,
  /// applied). Without it such a row is marked failed, naming why.
  std::optional<topology::Schedule> schedule;
  /// Delay before reconnecting to the broker or the database after a loss.
  retry::Backoff recovery{};
  /// Stop gracefully on the first SIGINT or SIGTERM, at once on the second.
  bool stop_on_signals = false;
  /// Where the relay logs; nullptr: nowhere.
  std::shared_ptr<spdlog::logger> logger;
};

/// What a relay has done since it started.
struct RelayStats {
  uint64_t published = 0;   ///< rows confirmed by the broker and then deleted or marked published
  uint64_t failed = 0;      ///< rows the broker returned or nacked, marked failed
  uint64_t unsettled = 0;   ///< rows left pending because the connection ended before the confirm
  uint64_t batches = 0;     ///< batches that claimed at least one row
  uint64_t overlapped = 0;  ///< of those, batches claimed while another was out
  uint64_t cleaned = 0;     ///< published rows deleted by the cleanup
  uint64_t database_errors = 0;
  uint64_t broker_losses = 0;
};

/// A relay's counters and, when given, the table's state in Prometheus' text format:
/// `retryloop_outbox_published_total`, `..._failed_total`, `..._unsettled_total`,
/// `..._batches_total`, `..._database_errors_total`, `..._broker_losses_total`, and from `table`
/// `retryloop_outbox_rows{state}` and `retryloop_outbox_oldest_pending_age_seconds`
/// (operations::HttpEndpoint::add_metrics serves it).
std::string prometheus_text(const RelayStats& stats, const std::optional<OutboxStats>& table,
                            int64_t now_ms);

/// Told once when the relay has stopped and closed its connections: an empty text after stop()
/// or stop_now(), otherwise
/// the error that made it give up (the schema is missing or of another version).
using RelayStoppedHandler = std::function<void(const std::string& error)>;

/// Moves rows of `retryloop_outbox` to the broker. Each batch claims up to `batch_size` pending
/// rows, publishes them in id order with `mandatory` on a confirm-mode channel, then deletes (or
/// marks published) each confirmed row, marks each returned or nacked row failed with the
/// broker's error, and commits. A row whose outcome is unknown (the connection ended) stays
/// pending. So every committed row reaches the broker at least once; a row may be published
/// twice (a consumer deduplicates by message id).
///
/// PostgreSQL: a batch is one transaction, which claims with `FOR UPDATE SKIP LOCKED` so that
/// several relays share the table; up to `batches_in_flight` batches are out at once. A crash or
/// a lost database rolls the batch back. SQLite: one relay publishes, holding an exclusive lock
/// on the file `DATABASE-relay-lock`, and the others stand by; its claim is a read and its
/// settle a short transaction, so that the application's writers never wait for the broker.
///
/// Ordering: rows with the same ordering key are claimed by one relay at a time and published in
/// id order, which is their commit order; a failed row holds back the later rows of its key
/// until it is retried or purged.
///
/// Threading: every call and callback on the loop thread. Database calls block the loop for
/// their duration. The relay keeps itself alive while it runs.
class Relay {
 public:
  static std::shared_ptr<Relay> create(uv_loop_t* loop, RelayOptions options);
  explicit Relay(std::shared_ptr<detail::RelayImpl> impl);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  /// Starts relaying; keeps trying while the database or the broker is unreachable. Returns an
  /// error text (and starts nothing) when called twice or the options are unusable.
  std::string start();
  /// Claims no more rows; the batches in flight settle and commit, then the relay closes.
  void stop();
  /// Closes at once; the batches in flight roll back (their rows are published again later).
  void stop_now();
  void set_stopped_handler(RelayStoppedHandler handler);

  RelayStats stats() const;
  /// True when the last look at the table found no row to claim.
  bool idle() const;

 private:
  std::shared_ptr<detail::RelayImpl> impl_;
};

}  // namespace retryloop::outbox
