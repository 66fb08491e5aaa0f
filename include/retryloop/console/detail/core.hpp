#pragma once

#include <uv.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "retryloop/client/connection.hpp"
#include "retryloop/console/console.hpp"
#include "retryloop/console/detail/api.hpp"
#include "retryloop/console/detail/audit_trail.hpp"
#include "retryloop/console/detail/jobs.hpp"
#include "retryloop/consumer/shared_breaker.hpp"
#include "retryloop/migrate/migration.hpp"
#include "retryloop/parking/parking.hpp"

namespace retryloop::console::detail {

/// The console's state and work, on the loop thread: the connection (made again when lost), the
/// parking depth, the last scan, and the jobs. Every public call but start() and stop() answers
/// an HTTP request, through the LoopBridge.
class Core : public std::enable_shared_from_this<Core> {
 public:
  using ReadyCallback = std::function<void(ServeResult result)>;

  /// A console for `service`. Its actions are recorded in `audit`, which uses this core's
  /// connection when `hosts_audit` (one core of a console does).
  Core(uv_loop_t* loop, Options options, topology::Service service,
       std::shared_ptr<AuditTrail> audit, bool hosts_audit);
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  /// Connects and checks that the parking queue exists and, for a quorum service, that scans
  /// cannot use up its delivery limit (unless Options::allow_counted_reads); `ready` gets the
  /// outcome of this first attempt (Status::stopped meaning success). Later losses are made good
  /// by reconnecting.
  void start(ReadyCallback ready);
  /// Drops the queued jobs, lets a running replay's or edit's copies settle (unless `at_once`),
  /// then closes the connection and the timers; `done` fires once all is closed.
  void stop(bool at_once, std::function<void()> done);

  /// The connection, the depths, the last scan's counts, the job running or last finished.
  /// Looks the depths up again when they are older than a few seconds.
  Reply state();
  /// The depths and the last count in Prometheus text form (`GET /metrics`): sampled as state()
  /// samples them, never a read of the broker per scrape.
  Reply metrics();
  /// The messages the last scan kept, as one line each.
  Reply messages();
  /// One message of scan `scan_id` in full: properties, headers, body (its first MiB).
  Reply message(uint64_t scan_id, size_t index);
  /// Scans with the filter of the request's `filter`.
  Reply request_scan(nlohmann::json request);
  /// Starts a replay, purge or count of the messages that match the request's `filter`. An
  /// `older_than` in it is fixed as the `parked_until` it means now (pin_older_than), and the
  /// job shows the filter so.
  Reply request_action(Job::Kind kind, nlohmann::json request, const std::string& who);
  /// Starts an edit-and-retry of one parked message (`message_id`, optionally `parked_at`) from
  /// what changed: `body` (absent: the original's), `set_headers` (an object of strings, numbers
  /// and booleans), `remove_headers` (names) and `keep_original`. Every other header goes on as
  /// it was, with its AMQP type.
  Reply request_edit(const nlohmann::json& request, const std::string& who);
  /// Records a note (`text`) on a group of messages (`group`, an error cause) in the audit trail.
  Reply request_note(const nlohmann::json& request, const std::string& who);
  /// Stops the running replay once its copies in flight settle, or an action that waits before
  /// it starts.
  Reply stop_action();
  /// The service's name, parking depth and, from the last count of the whole queue, its messages
  /// by reason: a line of the console's summary of every service.
  nlohmann::json summary();
  const topology::Service& service() const { return service_; }

 private:
  void connect();
  void on_connected(const std::shared_ptr<client::Connection>& connection);
  void check_delivery_limit(const std::shared_ptr<client::Connection>& connection);
  void look_up_parking_queue(const std::shared_ptr<client::Connection>& connection);
  void fail_start(ServeResult result);
  void on_lost(const client::Connection* connection, const client::Error& error);
  void schedule_reconnect();
  void refresh_depths();
  /// Starts watching the shared breaker, or counts its instances again when already watching.
  void look_up_breaker();
  /// Reads the service's migration record, unless it was read in the last few seconds.
  void look_up_migration();
  nlohmann::json breaker_json() const;
  /// The unfinished migration as the page shows it; null when there is none.
  nlohmann::json migration_json() const;
  void maybe_rescan();
  void run_next();
  void start_job(const std::shared_ptr<Job>& job);
  void run_job(const std::shared_ptr<Job>& job);
  parking::AuditRecord audit_record(const Job& job, const char* state) const;
  std::optional<Reply> cannot_act() const;
  void finish_job(const std::shared_ptr<Job>& job, const client::Error& error);
  void log_action(const Job& job) const;
  void close_all();
  void part_closed();
  const Job* pending_action() const;
  nlohmann::json job_json(const Job& job) const;
  nlohmann::json scan_json(const Job& scan) const;
  uint64_t now_ms() const;

  uv_loop_t* loop_;
  Options options_;
  topology::Service service_;
  std::shared_ptr<AuditTrail> audit_;
  /// This service's appends go through its own connection, so that one service's outage does
  /// not stop the others' actions.
  std::shared_ptr<parking::AuditWriter> audit_writer_;
  bool hosts_audit_ = false;
  std::string parking_queue_;
  std::string input_queue_;
  std::shared_ptr<client::Connection> connection_;
  std::shared_ptr<client::Connection> connecting_;
  bool connected_ = false;
  std::string connection_error_;
  ReadyCallback ready_;
  uint64_t reconnect_delay_ms_ = 0;
  uv_timer_t reconnect_timer_{};
  bool stopping_ = false;
  bool closed_ = false;
  int open_parts_ = 0;
  std::function<void()> stopped_;

  std::optional<uint32_t> depth_;
  std::optional<uint32_t> input_depth_;
  std::optional<uint32_t> input_consumers_;
  std::string depth_error_;
  uint64_t depth_ms_ = 0;
  bool depth_lookup_ = false;
  /// The service's shared breaker as the broker has it, read with the depths; nullopt until read,
  /// or when the read failed (breaker_error_ says why: no instance has declared it yet, say).
  std::optional<consumer::SharedBreakerStatus> breaker_;
  std::string breaker_error_;
  std::shared_ptr<consumer::SharedBreakerWatch> breaker_watch_;
  /// After a watch that failed once the breaker was found: not before this (now_ms) is another
  /// started, so that its state queue is not read again on every poll.
  uint64_t breaker_watch_retry_ms_ = 0;
  /// The service's unfinished migration (docs/migrate.md), read with the breaker at most every
  /// few seconds; nullopt when there is none, or its record cannot be read.
  std::optional<migrate::Record> migration_;
  uint64_t migration_read_ms_ = 0;
  bool migration_reading_ = false;

  JobQueue jobs_;
  std::shared_ptr<Job> running_;
  /// The last scan that finished, whose counts and messages the page shows.
  std::shared_ptr<Job> shown_scan_;
  std::string scan_error_;
  /// The last replay, purge or count that finished or was stopped.
  std::shared_ptr<Job> last_action_;
};

}  // namespace retryloop::console::detail
