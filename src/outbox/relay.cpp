#include "retryloop/outbox/relay.hpp"

#include <spdlog/spdlog.h>
#include <uv.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "retryloop/amqp/printable.hpp"
#include "retryloop/client/channel.hpp"
#include "retryloop/outbox/outbox.hpp"
#include "retryloop/outbox/schema.hpp"
#include "retryloop/process/stop_signals.hpp"
#include "retryloop/schedule/scheduler.hpp"
#include "retryloop/store/database.hpp"
#include "rows.hpp"

namespace retryloop::outbox {
namespace detail {
namespace {

// Pending rows in id order. A row with an ordering key is taken only when no earlier row of its
// key has failed, and (PostgreSQL) only by the relay that holds its key's lock for the batch.
// Rows other relays hold are skipped, not waited for.
std::string claim_sql(store::Dialect dialect) {
  const bool postgres = dialect == store::Dialect::postgresql;
  return std::string("SELECT ") + row_columns +
         " FROM retryloop_outbox o WHERE o.state = 'pending' AND (o.ordering_key IS NULL OR ("
         "NOT EXISTS (SELECT 1 FROM retryloop_outbox f WHERE f.state = 'failed' AND "
         "f.ordering_key = o.ordering_key AND f.id < o.id)" +
         (postgres ? " AND pg_try_advisory_xact_lock(727272002, hashtext(o.ordering_key))" : "") +
         ")) ORDER BY o.id LIMIT $1" + (postgres ? " FOR UPDATE OF o SKIP LOCKED" : "");
}

// PostgreSQL: the keys of a claimed batch that have a row still pending or failed before the
// key's last row in the batch and not in it. The claim takes a key's lock at the first of the
// key's rows it evaluates while the lock is free, and the plan decides the order it evaluates
// rows in: by id, or as they lie in the table (a bitmap scan, then a sort). When the relay that
// held the key ends its transaction in the middle of the claim (it settled, died, or left rows
// it could not publish), the claim has passed over some of the key's rows already and takes
// others: later ones, or some on either side of those it passed. Published, they would overtake
// the rows passed over. Each of the key's pending rows up to its last in the batch is in the
// batch unless one was passed over, so counting them finds it. This statement sees the table as
// it is now, with the keys' locks held: nothing another relay did to these keys is hidden from
// it.
std::string overtaking_keys_sql(size_t keys) {
  std::string values;
  for (size_t i = 0; i < keys; ++i) {
    values += std::string(i == 0 ? "" : ", ") + "($" + std::to_string(3 * i + 1) + "::text, $" +
              std::to_string(3 * i + 2) + "::bigint, $" + std::to_string(3 * i + 3) + "::bigint)";
  }
  // One pass over the pending rows up to the last key's last row (joined, not looked up key by
  // key: a range of the pending index, about as long as the batch), one over the failed ones.
  const std::string last = "$" + std::to_string(3 * keys + 1) + "::bigint";
  return "WITH v (ordering_key, last_id, claimed) AS (VALUES " + values +
         ") SELECT v.ordering_key FROM retryloop_outbox p JOIN v ON p.ordering_key = "
         "v.ordering_key AND p.id <= v.last_id WHERE p.state = 'pending' AND p.id <= " +
         last +
         " GROUP BY v.ordering_key, v.claimed HAVING count(*) > v.claimed"
         " UNION SELECT f.ordering_key FROM retryloop_outbox f JOIN v ON f.ordering_key = "
         "v.ordering_key AND f.id < v.last_id WHERE f.state = 'failed' AND f.id < " +
         last;
}

std::string outcome_text(const client::PublishOutcome& outcome) {
  switch (outcome.status) {
    case client::PublishStatus::returned:
      return "returned by the broker: " + outcome.error.message();
    case client::PublishStatus::nacked:
      return "nacked by the broker (for example a queue at its length limit with "
             "reject-publish)";
    default:
      return outcome.error.message();
  }
}

// A batch as the debug log shows it: its ids, and each ordering key's first and last message
// id, in publish order.
std::string describe_batch(const std::vector<OutboxRow>& rows) {
  std::string text = std::to_string(rows.size()) + " rows, ids " + std::to_string(rows.front().id) +
                     ".." + std::to_string(rows.back().id);
  struct Span {
    std::string first;
    std::string last;
    size_t rows = 0;
  };
  std::vector<std::pair<std::string, Span>> keys;
  for (const auto& row : rows) {
    if (!row.ordering_key) continue;
    auto it = std::find_if(keys.begin(), keys.end(),
                           [&row](const auto& key) { return key.first == *row.ordering_key; });
    if (it == keys.end()) {
      keys.push_back({*row.ordering_key, Span{row.message_id, row.message_id, 0}});
      it = std::prev(keys.end());
    }
    it->second.last = row.message_id;
    ++it->second.rows;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& [key, span] = keys[i];
    text += (i == 0 ? "; keys: " : ", ") + key + " " + span.first +
            (span.rows > 1 ? ".." + span.last : "") + " (" + std::to_string(span.rows) + ")";
  }
  return amqp::printable(text);
}

}  // namespace

size_t leave_out_overtaking_rows(store::Database& database, std::vector<OutboxRow>& rows) {
  struct Span {
    int64_t last_id = 0;
    int64_t claimed = 0;
  };
  std::map<std::string, Span> spans;
  for (const auto& row : rows) {
    if (!row.ordering_key) continue;
    Span& span = spans[*row.ordering_key];
    span.last_id = row.id;
    ++span.claimed;
  }
  if (spans.empty()) return 0;
  std::vector<store::Value> values;
  values.reserve(3 * spans.size() + 1);
  int64_t last = 0;
  for (const auto& [key, span] : spans) {
    values.emplace_back(key);
    values.emplace_back(span.last_id);
    values.emplace_back(span.claimed);
    last = std::max(last, span.last_id);
  }
  values.emplace_back(last);
  auto result = database.execute(overtaking_keys_sql(spans.size()), values);
  if (result.rows.empty()) return 0;
  std::set<std::string> keys;
  for (const auto& row : result.rows)
    keys.insert(*row.text(0));
  const size_t claimed = rows.size();
  rows.erase(std::remove_if(rows.begin(), rows.end(),
                            [&keys](const OutboxRow& row) {
                              return row.ordering_key && keys.count(*row.ordering_key) != 0;
                            }),
             rows.end());
  return claimed - rows.size();
}

// SQLite: an exclusive lock on a file beside the database (`FILE-relay-lock`), held by the one
// relay that publishes; the others stand by. The kernel lets go of it when its holder dies.
class RelayFileLock {
 public:
  // The lock, or nullptr while another process holds it; throws StoreError when the file cannot
  // be opened.
  static std::unique_ptr<RelayFileLock> try_take(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw store::StoreError(store::ErrorKind::connection,
                              "cannot open the relay lock " + path + ": " + std::strerror(errno));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return nullptr;
    }
    return std::unique_ptr<RelayFileLock>(new RelayFileLock(fd));
  }
  ~RelayFileLock() { ::close(fd_); }
  RelayFileLock(const RelayFileLock&) = delete;
  RelayFileLock& operator=(const RelayFileLock&) = delete;

 private:
  explicit RelayFileLock(int fd) : fd_(fd) {}
  int fd_;
};

class RelayImpl : public std::enable_shared_from_this<RelayImpl> {
 public:
  RelayImpl(uv_loop_t* loop, RelayOptions options) : loop_(loop), options_(std::move(options)) {}

  std::string start();
  void stop();
  void stop_now();

  RelayStoppedHandler stopped_handler;
  RelayStats stats;
  bool idle = false;

 private:
  struct Batch {
    uint64_t generation = 0;
    std::vector<OutboxRow> rows;
    std::vector<std::optional<client::PublishOutcome>> outcomes;
    /// Why a row was refused before it was published (a due row the delay levels cannot take);
    /// empty for the rows that were published.
    std::vector<std::string> refusals;
    size_t settled = 0;
  };

  // A database connection and the batch its transaction holds. While one lane's batch waits for
  // its confirms, another lane claims and publishes the next batch: its claim skips the rows and
  // the ordering keys the first transaction holds, as it would another relay's. Lane 0's
  // connection also listens for notifications. SQLite has one lane, and its batch holds no
  // transaction while it is out (see RelayFileLock).
  struct Lane {
    RelayImpl* relay = nullptr;
    size_t index = 0;
    std::unique_ptr<store::Database> database;
    std::optional<Batch> batch;
    uv_timer_t confirm_timer{};
  };

  spdlog::logger* log() const { return options_.logger.get(); }

  void open_database(Lane& lane);
  void drop_database(Lane& lane, const std::string& why);
  void connect_broker();
  void drop_broker(const client::Error& why);
  void on_notification();
  void wake(std::chrono::milliseconds delay);
  Lane* free_lane();
  bool busy() const;
  bool take_file_lock(store::Database& database);
  void cycle();
  void publish_batch(Lane& lane);
  void on_outcome(uint64_t generation, size_t index, const client::PublishOutcome& outcome);
  void settle_batch(Lane& lane);
  void settle_later(Lane& lane, Batch batch);
  void after_batch(std::chrono::milliseconds delay);
  void mark_failed(store::Database& database, int64_t id, const std::string& error);
  void clean_up(Lane& lane);
  void finish(std::string error);
  void maybe_done();
  void close_poll();
  void close_handle(uv_handle_t* handle);

  uv_loop_t* loop_;
  RelayOptions options_;
  std::shared_ptr<RelayImpl> self_;
  bool started_ = false;
  bool stopping_ = false;
  bool finished_ = false;

  std::vector<std::unique_ptr<Lane>> lanes_;
  bool sqlite_ = false;
  std::unique_ptr<RelayFileLock> file_lock_;
  bool standing_by_ = false;
  uint32_t database_failures_ = 0;
  uv_poll_t* poll_ = nullptr;
  std::chrono::milliseconds poll_interval_{100};

  std::shared_ptr<client::Connection> connection_;
  std::shared_ptr<client::Channel> channel_;
  uint32_t broker_failures_ = 0;
  bool broker_pending_ = false;

  uv_timer_t wake_timer_{};
  uv_timer_t broker_timer_{};
  int open_handles_ = 0;
  bool connection_closing_ = false;
  std::string final_error_;

  uint64_t generation_ = 0;
  uint64_t last_cleanup_ms_ = 0;
  std::unique_ptr<process::StopSignals> signals_;
};

std::string RelayImpl::start() {
  if (started_) return "the relay was started already";
  if (options_.batch_size == 0) return "batch size must be at least 1";
  if (options_.batches_in_flight == 0) return "batches in flight must be at least 1";
  for (size_t i = 0; i < options_.batches_in_flight; ++i) {
    lanes_.push_back(std::make_unique<Lane>());
    lanes_.back()->relay = this;
    lanes_.back()->index = i;
  }
  try {
    open_database(*lanes_[0]);
  } catch (const store::StoreError& error) {
    if (error.kind() == store::ErrorKind::usage || error.kind() == store::ErrorKind::schema) {
      lanes_.clear();
      return error.what();
    }
    if (auto* l = log()) l->warn("outbox relay: {}; trying again", amqp::printable(error.what()));
  }
  started_ = true;
  self_ = shared_from_this();
  for (uv_timer_t* timer : {&wake_timer_, &broker_timer_}) {
    uv_timer_init(loop_, timer);
    timer->data = this;
    ++open_handles_;
  }
  for (auto& lane : lanes_) {
    uv_timer_init(loop_, &lane->confirm_timer);
    lane->confirm_timer.data = lane.get();
    ++open_handles_;
  }
  if (options_.stop_on_signals) {
    std::weak_ptr<RelayImpl> weak = shared_from_this();
    signals_ = std::make_unique<process::StopSignals>(
        loop_,
        [weak](int signum) {
          auto self = weak.lock();
          if (!self) return;
          if (auto* l = self->log()) {
            l->info(
                "outbox relay: got {}: stopping after the batches in flight (send it again to "
                "stop at once)",
                signum == SIGINT ? "SIGINT" : "SIGTERM");
          }
          self->stop();
        },
        [weak] {
          if (auto self = weak.lock()) self->stop_now();
        });
  }
  connect_broker();
  wake(std::chrono::milliseconds(0));
  return {};
}

// Opens the lane's connection if it has none (or it broke); throws StoreError.
void RelayImpl::open_database(Lane& lane) {
  if (lane.database && lane.database->usable()) return;
  if (lane.database) drop_database(lane, "connection broken");
  auto database = store::Database::open(options_.database, false);
  require_schema(*database);
  // A relay waits briefly for SQLite's write lock (another relay's batch), then tries later.
  database->set_lock_timeout(std::chrono::milliseconds(200));
  sqlite_ = database->dialect() == store::Dialect::sqlite;
  if (lane.index > 0) {
    lane.database = std::move(database);
    return;
  }
  bool listening = false;
  if (options_.notifications && database->dialect() == store::Dialect::postgresql) {
    database->listen("retryloop_outbox");
    // The loop watches a duplicate of the connection's socket: libpq closes its own when the
    // connection breaks, and a watched descriptor must stay open until the watch ends.
    int fd =
        database->notification_descriptor() >= 0 ? dup(database->notification_descriptor()) : -1;
    if (fd >= 0) {
      poll_ = new uv_poll_t{};
      uv_poll_init(loop_, poll_, fd);
      poll_->data = this;
      ++open_handles_;
      uv_poll_start(poll_, UV_READABLE, [](uv_poll_t* poll, int, int) {
        static_cast<RelayImpl*>(poll->data)->on_notification();
      });
      listening = true;
    }
  }
  poll_interval_ = options_.poll_interval.count() > 0 ? options_.poll_interval
                   : listening                        ? std::chrono::milliseconds(5000)
                                                      : std::chrono::milliseconds(100);
  lane.database = std::move(database);
  if (database_failures_ > 0 && log()) log()->info("outbox relay: database reachable again");
  database_failures_ = 0;
}

void RelayImpl::close_poll() {
  if (!poll_) return;
  uv_poll_stop(poll_);
  uv_close(reinterpret_cast<uv_handle_t*>(poll_), [](uv_handle_t* handle) {
    auto* self = static_cast<RelayImpl*>(handle->data);
    auto* poll = reinterpret_cast<uv_poll_t*>(handle);
    uv_os_fd_t fd = -1;
    if (uv_fileno(handle, &fd) == 0) ::close(fd);
    delete poll;
    --self->open_handles_;
    self->maybe_done();
  });
  poll_ = nullptr;
}

void RelayImpl::drop_database(Lane& lane, const std::string& why) {
  ++stats.database_errors;
  if (auto* l = log()) l->warn("outbox relay: database: {}", amqp::printable(why));
  if (lane.index == 0) close_poll();  // before the connection closes its socket
  lane.database.reset();
}

void RelayImpl::on_notification() {
  Lane& lane = *lanes_[0];
  if (!lane.database) return;
  lane.database->take_notifications();
  if (!lane.database->usable()) {
    close_poll();            // the socket stays readable (closed): stop watching it at once
    if (lane.batch) return;  // settling the batch meets the error
    drop_database(lane, "connection lost");
    wake(options_.recovery.delay(database_failures_++));
    return;
  }
  if (free_lane()) wake(std::chrono::milliseconds(0));
}
void RelayImpl::connect_broker() {
  if (stopping_ || broker_pending_) return;
  broker_pending_ = true;
  connection_ = client::Connection::create(loop_, options_.connection);
  // The callbacks hold the relay and the connection weakly: the connection and its channel
  // store them, and a strong reference would keep both alive for ever.
  std::weak_ptr<RelayImpl> weak = shared_from_this();
  std::weak_ptr<client::Connection> weak_connection = connection_;
  auto current = [weak, weak_connection]() -> std::shared_ptr<RelayImpl> {
    auto self = weak.lock();
    auto connection = weak_connection.lock();
    return self && connection && self->connection_ == connection ? self : nullptr;
  };
  auto failed = [current](const client::Error& error) {
    if (auto self = current()) self->drop_broker(error);
  };
  connection_->set_lost_handler(failed);
  client::Error error = connection_->connect([current, failed](const client::Error& e) {
    auto self = current();
    if (!self) return;
    if (e) return failed(e);
    client::Error open = self->connection_->open_channel(
        [current, failed](const client::Error& e, std::shared_ptr<client::Channel> channel) {
          if (e) return failed(e);
          // The callback holds the channel (the handle the connection gave only to this
          // callback) until confirm mode is on; the channel lets go of it once it has fired.
          client::Error select =
              channel->confirm_select([current, failed, channel](const client::Error& e) {
                if (e) return failed(e);
                auto self = current();
                if (!self) return;
                self->channel_ = channel;
                self->broker_pending_ = false;
                if (self->broker_failures_ > 0 && self->log()) {
                  self->log()->info("outbox relay: broker reachable again");
                }
                self->broker_failures_ = 0;
                channel->set_close_handler(failed);
                self->wake(std::chrono::milliseconds(0));
              });
          if (select) failed(select);
        });
    if (open) failed(open);
  });
  if (error) drop_broker(error);
}

// The broker connection is gone (or useless): publishes in flight fail, and a new connection
// is made after the recovery backoff.
void RelayImpl::drop_broker(const client::Error& why) {
  ++stats.broker_losses;
  if (auto* l = log()) l->warn("outbox relay: broker: {}", why.message());
  channel_.reset();
  broker_pending_ = false;
  if (auto connection = std::move(connection_)) connection->close();
  if (stopping_ || finished_) return;
  uv_timer_start(
      &broker_timer_,
      [](uv_timer_t* timer) { static_cast<RelayImpl*>(timer->data)->connect_broker(); },
      options_.recovery.delay(broker_failures_++).count(), 0);
}

void RelayImpl::wake(std::chrono::milliseconds delay) {
  if (finished_) return;
  uv_timer_start(
      &wake_timer_, [](uv_timer_t* timer) { static_cast<RelayImpl*>(timer->data)->cycle(); },
      delay.count(), 0);
}

// The lane to claim the next batch with; none while every lane has a batch out.
RelayImpl::Lane* RelayImpl::free_lane() {
  const size_t usable = sqlite_ ? 1 : lanes_.size();
  for (size_t i = 0; i < usable; ++i) {
    if (!lanes_[i]->batch) return lanes_[i].get();
  }
  return nullptr;
}

bool RelayImpl::busy() const {
  return std::any_of(lanes_.begin(), lanes_.end(),
                     [](const std::unique_ptr<Lane>& lane) { return lane->batch.has_value(); });
}

// SQLite: true once this relay holds the relay lock. A relay that stands by is idle when no row
// is pending (the one that publishes has them all).
bool RelayImpl::take_file_lock(store::Database& database) {
  if (!sqlite_ || file_lock_) return true;
  const std::string file = database.file_path();
  if (file.empty()) return true;  // an in-memory database is this connection's alone
  const std::string path = file + "-relay-lock";
  file_lock_ = RelayFileLock::try_take(path);
  if (file_lock_) {
    if (standing_by_ && log()) log()->info("outbox relay: took over {}: publishing", path);
    standing_by_ = false;
    return true;
  }
  if (!standing_by_ && log()) {
    log()->info("outbox relay: another relay holds {}: standing by until it stops", path);
  }
  standing_by_ = true;
  idle = database.execute("SELECT 1 FROM retryloop_outbox WHERE state = 'pending' LIMIT 1")
             .rows.empty();
  return false;
}

void RelayImpl::cycle() {
  if (stopping_) return;
  Lane* lane = free_lane();
  if (!lane) return;  // a settled batch wakes the relay
  try {
    // Lane 0 first, while it has no batch out: it listens, and its connection tells the
    // dialect (and so how many lanes there are).
    if (!lanes_[0]->batch) open_database(*lanes_[0]);
    lane = free_lane();
    if (!lane) return;
    open_database(*lane);
  } catch (const store::StoreError& error) {
    if (error.kind() == store::ErrorKind::schema) return finish(error.what());
    ++stats.database_errors;
    if (auto* l = log())
      l->warn("outbox relay: database: {}; trying again", amqp::printable(error.what()));
    if (!busy()) wake(options_.recovery.delay(database_failures_++));
    return;
  }
  if (!channel_) return;  // the broker's confirm_select wakes the relay
  try {
    if (!take_file_lock(*lane->database)) return wake(poll_interval_);
  } catch (const store::StoreError& error) {
    if (auto* l = log()) l->warn("outbox relay: {}; trying again", amqp::printable(error.what()));
    return wake(options_.recovery.delay(database_failures_++));
  }
  if (options_.retain_published.count() > 0 &&
      uv_now(loop_) - last_cleanup_ms_ >=
          static_cast<uint64_t>(options_.cleanup_interval.count())) {
    clean_up(*lane);
    if (!lane->database) {
      if (!busy()) wake(options_.recovery.delay(database_failures_++));
      return;
    }
  }
  publish_batch(*lane);
}

void RelayImpl::publish_batch(Lane& lane) {
  store::Database& database = *lane.database;
  Batch batch;
  size_t left_out = 0;
  try {
    // PostgreSQL: the batch's transaction holds its rows and keys until it settles. SQLite: the
    // relay lock keeps other relays away, and the claim is a read, so that the application's
    // writers never wait for the broker.
    if (!sqlite_) database.begin();
    auto result = database.execute(claim_sql(database.dialect()),
                                   {static_cast<int64_t>(options_.batch_size)});
    batch.rows.reserve(result.rows.size());
    std::vector<std::pair<int64_t, std::string>> undecodable;
    for (const auto& row : result.rows) {
      try {
        batch.rows.push_back(decode_row(row));
      } catch (const store::StoreError& error) {
        // A row written by hand that cannot become a message (headers that are not a JSON
        // object, a property of the wrong type) fails at once, with the reason, instead of
        // stopping the relay at the same row for ever.
        if (error.kind() != store::ErrorKind::usage) throw;
        undecodable.emplace_back(row.integer(0),
                                 std::string("cannot be published: ") + error.what());
      }
    }
    if (!undecodable.empty()) {
      const bool own_transaction = !database.in_transaction();
      if (own_transaction) database.begin();
      for (const auto& [id, reason] : undecodable)
        mark_failed(database, id, reason);
      if (own_transaction) database.commit();
      stats.failed += undecodable.size();
    }
    if (database.dialect() == store::Dialect::postgresql) {
      left_out = leave_out_overtaking_rows(database, batch.rows);
      if (left_out != 0 && log()) {
        log()->info(
            "outbox relay: left {} claimed rows for a later batch: their keys have earlier rows "
            "still to publish",
            left_out);
      }
    }
    if (batch.rows.empty() && database.in_transaction()) database.commit();
    // Rows left out, or failed at once: their keys' locks are free again; claim in order now.
    if (batch.rows.empty() && !result.rows.empty()) return wake(std::chrono::milliseconds(0));
  } catch (const store::StoreError& error) {
    if (database.usable()) database.rollback();
    if (error.kind() == store::ErrorKind::busy) {
      idle = false;
      if (!busy()) wake(poll_interval_);
      return;
    }
    drop_database(lane, error.what());
    if (!busy()) wake(options_.recovery.delay(database_failures_++));
    return;
  }
  if (batch.rows.empty()) {
    // With another batch out, the rows it holds (and its keys' rows) were skipped: its
    // settlement looks again.
    if (busy()) return;
    idle = true;
    return wake(poll_interval_);
  }
  idle = false;
  ++stats.batches;
  if (busy()) ++stats.overlapped;
  batch.generation = ++generation_;
  if (auto* l = log(); l && l->should_log(spdlog::level::debug)) {
    l->debug("outbox relay: batch {} (lane {}): {}", batch.generation, lane.index,
             describe_batch(batch.rows));
  }
  batch.outcomes.resize(batch.rows.size());
  batch.refusals.resize(batch.rows.size());
  lane.batch = std::move(batch);
  std::weak_ptr<RelayImpl> weak = shared_from_this();
  const uint64_t generation = generation_;
  // After a publish that could not start, none of the rest is tried: a later row of the same
  // key must not reach the broker before it.
  bool broken = false;
  for (size_t i = 0; i < lane.batch->rows.size(); ++i) {
    const OutboxRow& row = lane.batch->rows[i];
    client::Error error;
    std::optional<schedule::ScheduledCopy> scheduled;
    if (row.due_at_ms) {
      try {
        if (!options_.schedule) {
          throw std::invalid_argument(
              "the row is due later, and the relay has no delay levels to hold it: give it the "
              "topology file's schedule (RelayOptions::schedule, `outbox relay -t FILE`)");
        }
        const int64_t now = schedule::now_ms();
        scheduled =
            schedule::make_scheduled_copy(*options_.schedule, row.routing_key, row.properties,
                                          std::chrono::milliseconds(*row.due_at_ms - now), now);
      } catch (const std::invalid_argument& e) {
        lane.batch->refusals[i] = e.what();
        client::PublishOutcome refused;  // settled as failed, with the refusal as its error
        refused.status = client::PublishStatus::nacked;
        on_outcome(generation, i, refused);
        if (!lane.batch || lane.batch->generation != generation) return;  // settled at once
        continue;
      }
    }
    if (!broken && channel_) {
      error = channel_->publish(scheduled ? scheduled->exchange : row.exchange,
                                scheduled ? scheduled->routing_key : row.routing_key,
                                scheduled ? scheduled->properties : row.properties, row.body,
                                client::Mandatory::yes,
                                [weak, generation, i](const client::PublishOutcome& outcome) {
                                  if (auto self = weak.lock()) {
                                    self->on_outcome(generation, i, outcome);
                                  }
                                });
    } else {
      error = client::Error(client::ClientError::not_open, "broker connection lost");
    }
    if (error) {
      broken = true;
      client::PublishOutcome failed;
      failed.status = client::PublishStatus::failed;
      failed.error = error;
      on_outcome(generation, i, failed);
      if (!lane.batch || lane.batch->generation != generation) return;  // settled at once
    }
  }
  uv_timer_start(
      &lane.confirm_timer,
      [](uv_timer_t* timer) {
        static_cast<Lane*>(timer->data)
            ->relay->drop_broker(
                client::Error(client::ClientError::connection_lost,
                              "publishes not confirmed within the confirm timeout"));
      },
      options_.confirm_timeout.count(), 0);
  // While this batch waits for its confirms, the next is claimed and published.
  if (free_lane()) wake(std::chrono::milliseconds(0));
}

void RelayImpl::on_outcome(uint64_t generation, size_t index,
                           const client::PublishOutcome& outcome) {
  for (auto& lane : lanes_) {
    auto& batch = lane->batch;
    if (!batch || batch->generation != generation) continue;
    if (batch->outcomes[index]) return;
    batch->outcomes[index] = outcome;
    if (++batch->settled == batch->rows.size()) settle_batch(*lane);
    return;
  }
}

// Every publish of the lane's batch has an outcome: record them and commit.
void RelayImpl::settle_batch(Lane& lane) {
  uv_timer_stop(&lane.confirm_timer);
  Batch batch = std::move(*lane.batch);
  lane.batch.reset();
  std::vector<int64_t> published;
  std::vector<std::pair<int64_t, std::string>> failed;
  uint64_t unsettled = 0;
  uint64_t nacked = 0;
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    const auto& outcome = *batch.outcomes[i];
    if (outcome.ok()) {
      published.push_back(batch.rows[i].id);
    } else if (outcome.status == client::PublishStatus::failed) {
      ++unsettled;
    } else {
      // A refused row never reached the broker: no reason to doubt the channel.
      if (outcome.status == client::PublishStatus::nacked && batch.refusals[i].empty()) ++nacked;
      failed.emplace_back(batch.rows[i].id,
                          batch.refusals[i].empty() ? outcome_text(outcome) : batch.refusals[i]);
    }
  }
  try {
    if (!lane.database) {
      throw store::StoreError(store::ErrorKind::connection, "the connection was closed");
    }
    store::Database& database = *lane.database;
    if (!database.in_transaction()) database.begin();  // SQLite: the claim held none
    const int64_t now = now_ms();
    constexpr size_t chunk = 500;
    for (size_t first = 0; first < published.size(); first += chunk) {
      size_t count = std::min(chunk, published.size() - first);
      std::vector<store::Value> values;
      values.reserve(count + 1);
      values.emplace_back(now);
      for (size_t i = 0; i < count; ++i)
        values.emplace_back(published[first + i]);
      std::string ids = "(" + store::placeholders(2, count) + ")";
      if (options_.retain_published.count() > 0) {
        database.execute(
            "UPDATE retryloop_outbox SET state = 'published', updated_at = $1 WHERE id IN " + ids,
            values);
      } else {
        values.erase(values.begin());
        database.execute(
            "DELETE FROM retryloop_outbox WHERE id IN (" + store::placeholders(1, count) + ")",
            values);
      }
    }
    for (const auto& [id, error] : failed)
      mark_failed(database, id, error);
    database.commit();
  } catch (const store::StoreError& error) {
    if (sqlite_ && error.kind() == store::ErrorKind::busy) {
      lane.database->rollback();
      return settle_later(lane, std::move(batch));
    }
    // The batch rolls back: its rows stay pending and are published again.
    drop_database(lane, std::string("settling a batch: ") + error.what());
    stats.unsettled += batch.rows.size();
    return after_batch(options_.recovery.delay(database_failures_++));
  }
  stats.published += published.size();
  stats.failed += failed.size();
  stats.unsettled += unsettled;
  if (auto* l = log()) {
    l->debug("outbox relay: batch {} settled: {} published, {} failed, {} left pending",
             batch.generation, published.size(), failed.size(), unsettled);
  }
  // RabbitMQ 3.10 nacks every later publish on a channel whose publish to a quorum queue came
  // while the queue was between leaders: after a nack the relay goes on on a new connection.
  if (nacked > 0 && channel_) {
    drop_broker(client::Error(
        client::ClientError::connection_lost,
        std::to_string(nacked) + " publishes nacked; reconnecting for a fresh channel"));
  }
  // Look again at once: rows committed while this batch was out, or a full batch's rest. The
  // look that finds nothing makes the relay idle and waits for the next wake-up.
  if (lanes_[0]->database) lanes_[0]->database->take_notifications();
  after_batch(std::chrono::milliseconds(0));
}

// SQLite: the application's writers kept the write lock longer than the relay waits for it. The
// batch keeps its outcomes, and its rows stay pending (no other relay publishes them: this one
// holds the relay lock) until it settles, a moment later.
void RelayImpl::settle_later(Lane& lane, Batch batch) {
  if (auto* l = log())
    l->info("outbox relay: settling a batch: the database is busy; trying again");
  lane.batch = std::move(batch);
  uv_timer_start(
      &lane.confirm_timer,
      [](uv_timer_t* timer) {
        auto* busy_lane = static_cast<Lane*>(timer->data);
        busy_lane->relay->settle_batch(*busy_lane);
      },
      50, 0);
}

// A batch has settled (or rolled back): the relay stops once none is out, or looks for rows.
void RelayImpl::after_batch(std::chrono::milliseconds delay) {
  if (stopping_) {
    if (!busy()) finish({});
    return;
  }
  wake(delay);
}

// Marks a claimed row failed, in the batch's transaction.
void RelayImpl::mark_failed(store::Database& database, int64_t id, const std::string& error) {
  database.execute(
      "UPDATE retryloop_outbox SET state = 'failed', attempts = attempts + 1, last_error = $1, "
      "updated_at = $2 WHERE id = $3",
      {error, now_ms(), id});
  if (auto* l = log()) l->error("outbox relay: row {} failed: {}", id, amqp::printable(error));
}

void RelayImpl::clean_up(Lane& lane) {
  last_cleanup_ms_ = uv_now(loop_);
  try {
    uint64_t deleted = delete_published(
        *lane.database, now_ms() - options_.retain_published.count(), options_.cleanup_batch);
    stats.cleaned += deleted;
    if (deleted && log()) log()->info("outbox relay: deleted {} published rows", deleted);
  } catch (const store::StoreError& error) {
    if (error.kind() == store::ErrorKind::busy) return;
    drop_database(lane, std::string("cleanup: ") + error.what());
  }
}

void RelayImpl::stop() {
  if (!started_ || stopping_) return;
  stopping_ = true;
  if (!busy()) finish({});
}

void RelayImpl::stop_now() {
  if (!started_ || finished_) return;
  stopping_ = true;
  for (auto& lane : lanes_) {
    if (!lane->batch) continue;
    lane->batch.reset();
    if (lane->database && lane->database->usable()) lane->database->rollback();
  }
  finish({});
}

void RelayImpl::close_handle(uv_handle_t* handle) {
  uv_close(handle, [](uv_handle_t* closed) {
    auto* self = static_cast<RelayImpl*>(closed->data);
    --self->open_handles_;
    self->maybe_done();
  });
}

void RelayImpl::finish(std::string error) {
  if (finished_) return;
  finished_ = true;
  stopping_ = true;
  if (!error.empty() && log()) log()->error("outbox relay: {}", amqp::printable(error));
  final_error_ = std::move(error);
  if (signals_) signals_->close();
  channel_.reset();
  if (auto connection = std::move(connection_)) {
    connection_closing_ = true;
    std::weak_ptr<RelayImpl> weak = shared_from_this();
    connection->close([weak](const client::Error&) {
      if (auto self = weak.lock()) {
        self->connection_closing_ = false;
        self->maybe_done();
      }
    });
  }
  close_poll();
  for (uv_timer_t* timer : {&wake_timer_, &broker_timer_}) {
    uv_timer_stop(timer);
    close_handle(reinterpret_cast<uv_handle_t*>(timer));
  }
  file_lock_.reset();
  for (auto& lane : lanes_) {
    lane->database.reset();
    uv_timer_stop(&lane->confirm_timer);
    lane->confirm_timer.data = this;  // the close callback counts it as the relay's handle
    close_handle(reinterpret_cast<uv_handle_t*>(&lane->confirm_timer));
  }
}

// Once the relay has finished and its broker connection and loop handles are closed: tells the
// stopped handler, then lets go of itself.
void RelayImpl::maybe_done() {
  if (!finished_ || open_handles_ > 0 || connection_closing_ || !self_) return;
  auto handler = std::move(stopped_handler);
  auto self = std::move(self_);
  if (handler) handler(final_error_);
}

}  // namespace detail

std::shared_ptr<Relay> Relay::create(uv_loop_t* loop, RelayOptions options) {
  return std::make_shared<Relay>(std::make_shared<detail::RelayImpl>(loop, std::move(options)));
}

Relay::Relay(std::shared_ptr<detail::RelayImpl> impl) : impl_(std::move(impl)) {}
Relay::~Relay() = default;
std::string Relay::start() {
  return impl_->start();
}
void Relay::stop() {
  impl_->stop();
}
void Relay::stop_now() {
  impl_->stop_now();
}
void Relay::set_stopped_handler(RelayStoppedHandler handler) {
  impl_->stopped_handler = std::move(handler);
}
RelayStats Relay::stats() const {
  return impl_->stats;
}
bool Relay::idle() const {
  return impl_->idle;
}

std::string prometheus_text(const RelayStats& stats, const std::optional<OutboxStats>& table,
                            int64_t now_ms) {
  std::string out;
  auto family = [&out](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto counter = [&](const char* name, const char* help, uint64_t value) {
    family(name, "counter", help);
    out += std::string(name) + " " + std::to_string(value) + "\n";
  };
  counter("retryloop_outbox_published_total", "Rows the broker confirmed.", stats.published);
  counter("retryloop_outbox_failed_total",
          "Rows marked failed: returned or nacked by the broker, or refused by the relay.",
          stats.failed);
  counter("retryloop_outbox_unsettled_total",
          "Rows left pending because the connection ended before their confirm.", stats.unsettled);
  counter("retryloop_outbox_batches_total", "Batches that claimed at least one row.",
          stats.batches);
  counter("retryloop_outbox_database_errors_total", "Database errors the relay recovered from.",
          stats.database_errors);
  counter("retryloop_outbox_broker_losses_total", "Broker connections lost.", stats.broker_losses);
  if (!table) return out;
  family("retryloop_outbox_rows", "gauge", "Rows of retryloop_outbox by state.");
  out += "retryloop_outbox_rows{state=\"pending\"} " + std::to_string(table->pending) + "\n";
  out += "retryloop_outbox_rows{state=\"failed\"} " + std::to_string(table->failed) + "\n";
  out += "retryloop_outbox_rows{state=\"published\"} " + std::to_string(table->published) + "\n";
  family("retryloop_outbox_oldest_pending_age_seconds", "gauge",
         "How long the oldest pending row has waited; 0 when none is pending.");
  const int64_t age =
      table->oldest_pending_ms ? std::max<int64_t>(now_ms - *table->oldest_pending_ms, 0) : 0;
  out +=
      "retryloop_outbox_oldest_pending_age_seconds " + std::to_string(double(age) / 1000.0) + "\n";
  return out;
}

}  // namespace retryloop::outbox
