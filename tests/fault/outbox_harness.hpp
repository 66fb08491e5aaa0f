#pragma once

// The outbox lanes' harness. A run has an "application" that commits rows to the outbox in
// transactions (some rolled back on purpose) together with business rows that record each
// message, relays (`retryloop outbox relay` processes) that move the rows to a service's input
// exchange, and an idempotent consumer (tests/fault/programs/fault_inbox_consumer, a process)
// whose handler writes one "business effect" row per run through inbox::Inbox. An audit queue
// bound next to the service's input queue keeps a copy of everything the relays published;
// nothing reads it until the checker drains it (or a lane takes what has arrived so far).
//
// The database is the ground truth: a transaction committed exactly when its rows are in
// app_events (so a commit whose answer was lost to a crash is judged by what the database
// kept), and each effect is a row of app_effects.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fault_harness.hpp"
#include "retryloop/store/database.hpp"
#include "retryloop/topology/topology.hpp"
#include "support/databases.hpp"
#include "support/process.hpp"
#include "support/tcp_proxy.hpp"

namespace retryloop::test::fault {

/// Ordering keys the application spreads its keyed rows over.
inline constexpr int ordering_keys = 5;

/// One lane's database (a fresh SQLite file or PostgreSQL schema with the retryloop tables and
/// the application's) and its objects on the broker: a service (classic queues, a retry policy
/// patient enough to outlast a database restart) and the audit queue.
struct OutboxLane {
  OutboxLane(const std::string& fault, const std::string& database_label);
  ~OutboxLane();
  OutboxLane(const OutboxLane&) = delete;
  OutboxLane& operator=(const OutboxLane&) = delete;

  const std::string& exchange() const { return service.input.exchange; }
  const std::string& input_queue() const;
  std::string wait_queue() const;
  std::string parking_queue() const;
  /// Declares the service and the audit queue, bound to the input exchange with the same key.
  void declare(Probe& probe) const;
  /// Deletes them.
  void remove(Probe& probe) const;

  std::string fault;
  TestDatabase database;
  topology::Service service;
  std::string topology_path;
  std::string audit_queue;
};

/// The application: threads, each with a connection of its own, that commit transactions of one
/// to three outbox rows until stopped. Each row has a unique message id; about 60% of the
/// transactions carry an ordering key (shared by their keyed rows); every sixth transaction of a
/// thread rolls back on purpose. With each row the transaction inserts app_events (message_id,
/// ordering_key, seq), where seq counts the key's committed rows: the transaction takes it from
/// app_keys after enqueueing, so it holds the key's locks and seq is the key's commit order. A
/// failed statement or commit (the database went away) is not retried: its rows are in doubt,
/// and app_events says later whether they committed. The connection is opened again.
class AppWriter {
 public:
  AppWriter(std::string url, std::string exchange, std::string prefix, int threads = 2,
            std::chrono::milliseconds pause = std::chrono::milliseconds(10));
  ~AppWriter();
  AppWriter(const AppWriter&) = delete;
  AppWriter& operator=(const AppWriter&) = delete;

  void start();
  /// Stops the threads and waits for them.
  void stop();
  /// Rows of transactions whose commit returned.
  uint64_t committed() const { return committed_; }
  /// Failed statements, commits and connection attempts.
  uint64_t errors() const { return errors_; }
  /// Every message id a transaction wrote, committed or not.
  std::set<std::string> attempted() const;
  /// The ids of transactions rolled back on purpose.
  std::set<std::string> rolled_back() const;
  /// The first few errors, for the report.
  std::vector<std::string> error_samples() const;

 private:
  void run(int thread);

  std::string url_;
  std::string exchange_;
  std::string prefix_;
  int thread_count_;
  std::chrono::milliseconds pause_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> committed_{0};
  std::atomic<uint64_t> errors_{0};
  mutable std::mutex mutex_;
  std::set<std::string> attempted_;
  std::set<std::string> rolled_back_;
  std::vector<std::string> error_samples_;
  std::vector<std::thread> threads_;
};

/// A connection to the lane's database for the checker: opened again whenever it broke (a
/// restarted PostgreSQL); a query that fails returns nothing instead of failing the test.
class LaneDatabase {
 public:
  explicit LaneDatabase(std::string url) : url_(std::move(url)) {}
  std::optional<store::Result> query(const std::string& sql,
                                     const std::vector<store::Value>& parameters = {});
  /// Rows in retryloop_outbox: pending, failed, published (or nullopt when unreachable).
  struct Rows {
    int64_t pending = 0, failed = 0;
  };
  std::optional<Rows> outbox_rows();
  /// Of `ids`, those whose outbox row is still pending.
  std::set<std::string> pending_among(const std::vector<std::string>& ids);

 private:
  std::string url_;
  std::unique_ptr<store::Database> db_;
};

/// The counts of one outbox lane's run (columns of the report, in order).
struct OutboxTally {
  size_t committed = 0;    ///< rows in app_events: committed with their transaction
  size_t rolled_back = 0;  ///< rows written by transactions that did not commit
  size_t received = 0;     ///< committed rows that reached the audit queue (at least once)
  size_t effects = 0;      ///< committed rows whose effect happened (at least once)
  size_t absorbed = 0;     ///< deliveries the inbox answered as duplicates
  size_t phantoms = 0;     ///< ids of uncommitted transactions that reached the broker or took
                           ///< effect, and ids nobody wrote
  size_t doubles = 0;      ///< ids whose effect happened more than once
  size_t disorder = 0;     ///< messages out of their key's commit order (see check_order)
  size_t lost = 0;         ///< committed rows never received or without an effect
  size_t duplicates = 0;   ///< copies the audit queue got beyond the first of each id
  size_t unexpected = 0;   ///< phantoms + doubles + disorder + rows rolled back on purpose yet
                           ///< committed
  std::vector<std::string> problems;
};

/// Per ordering key, the key's messages in the order the audit queue delivered them, each copy
/// of a message already seen earlier dropped: what remains must be strictly increasing in seq
/// (the key's commit order). Returns how many messages break that (each one whose seq is below
/// the highest seq kept before it), with a line each in `problems`.
size_t check_order(const std::vector<std::string>& received,
                   const std::map<std::string, std::pair<std::string, int64_t>>& keyed,
                   std::vector<std::string>& problems);

/// One run of an outbox lane: the lane, the test loop and probe, the application, the relays
/// and consumers started so far (dead ones too, for their output), and what the audit queue
/// delivered so far, in order.
class OutboxRun {
 public:
  OutboxRun(const std::string& fault, const std::string& database_label);
  ~OutboxRun();

  /// A relay process publishing to `url` (default: the test broker).
  ChildProcess& start_relay(const std::string& url = "");
  /// An inbox consumer process; `crash_after` as its --crash-after.
  ChildProcess& start_consumer(uint64_t crash_after = 0);
  /// Starts the application.
  void start_writer() { writer.start(); }
  /// Commits `rows` rows of ordering key `key` (one the application does not use) in one
  /// transaction, with their app_events: message ids `key/1`, `key/2`, ..., seq 1, 2, ...
  void commit_backlog(const std::string& key, int rows);
  /// Runs the loop until the application has committed `rows` more rows than `since`.
  void wait_committed(uint64_t since, uint64_t rows, std::chrono::milliseconds timeout = 60s);
  /// Takes what the audit queue holds now into `received`; false when the broker failed.
  bool collect();
  /// Holds back the broker's replies to the relay behind `proxy` (its publishes still reach the
  /// broker, its confirms do not come back) until a batch of its is in flight: rows it published
  /// after the proxy froze, that reached the audit queue and are still pending in the table, the
  /// same ones 300 ms later. Their confirms never reached the relay. When it publishes nothing
  /// (it waits for confirms the freeze holds), thaws and tries again. Returns their ids; the
  /// replies stay held until the proxy thaws or is cut.
  std::set<std::string> hold_batch_in_flight(TcpProxy& proxy);
  /// hold_batch_in_flight, then kills the relay with SIGKILL and cuts the proxy.
  std::set<std::string> kill_relay_mid_batch(ChildProcess& relay, TcpProxy& proxy);
  /// Freezes `proxy` (the relay behind it publishes into a network that delivers nothing) until
  /// the relay has sent a batch into it, or for 5 s (it had a batch out, whose confirms cannot
  /// come), then kills the relay with SIGKILL and cuts the proxy.
  void kill_relay_behind_frozen_network(ChildProcess& relay, TcpProxy& proxy);
  /// Stops the application, waits until the outbox is empty and every committed row has taken
  /// effect (or nothing changes for 10 s), drains the audit and parking queues, stops the relays
  /// and consumers (SIGTERM: exit 0), classifies and reports. `in_flight`: ids that reached the
  /// broker in a batch whose relay died or lost its connection before their confirms reached it;
  /// each must arrive at least twice.
  OutboxTally finish(const std::string& notes = "", const std::set<std::string>& in_flight = {});

  TestLoop loop;
  Probe probe{loop, test::broker_url()};
  std::unique_ptr<OutboxLane> lane;
  AppWriter writer;
  LaneDatabase db;
  std::vector<std::unique_ptr<ChildProcess>> relays;
  std::vector<std::unique_ptr<ChildProcess>> consumers;
  std::vector<std::string> received;
  Clock::time_point started = Clock::now();
};

/// Prints one row of the outbox table (its header first, once per process and once per
/// $RETRYLOOP_FAULT_REPORT file) and `notes` under it, then checks: 0 lost, 0 unexpected. The
/// last four columns are lost, dup, unexpected and seconds, as in the other table.
void report_outbox(const std::string& fault, const std::string& database, const OutboxTally& tally,
                   double seconds, const std::string& notes, const std::string& logs);

/// The test PostgreSQL's control script (RETRYLOOP_TEST_PG_CTL COMMAND RETRYLOOP_TEST_PG_DIR), run
/// as with run_async.
int postgres_async(TestLoop& loop, const std::string& command, std::string* output = nullptr);

/// The broker's AMQP port (RETRYLOOP_TEST_AMQP_PORT), for a proxy in front of it.
uint16_t broker_amqp_port();

}  // namespace retryloop::test::fault
