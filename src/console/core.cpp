#include "retryloop/console/detail/core.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <string_view>
#include <utility>

#include "retryloop/amqp/printable.hpp"
#include "retryloop/console/detail/api.hpp"
#include "retryloop/migrate/driver.hpp"
#include "retryloop/parking/parked_json.hpp"
#include "retryloop/random/os_random.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/retry/metrics.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"

namespace retryloop::console::detail {

namespace {

using client::Error;

constexpr uint64_t kDepthMaxAgeMs = 2000;
constexpr uint64_t kRescanDurationFactor = 10;
/// How often the service's migration record is read (for the breaker's badge).
constexpr uint64_t kMigrationReadMs = 5000;
/// A breaker watch that failed after the service's breaker was found is started again after this
/// long.
constexpr uint64_t kBreakerWatchRetryMs = 30000;
constexpr uint64_t kReconnectFirstMs = 1000;
constexpr uint64_t kReconnectMaxMs = 15000;
constexpr size_t kBodyShownBytes = 1024 * 1024;
constexpr size_t kErrorGroupsShown = 100;
constexpr size_t kPreviewBytes = 160;
constexpr size_t kErrorLineBytes = 400;
constexpr size_t kNoteBytes = 2000;
/// Indenting a JSON body recurses as deep as it nests: a deeper one is shown as it is.
constexpr size_t kPrettyDepth = 64;

const char* kind_name(Job::Kind kind) {
  switch (kind) {
    case Job::Kind::scan:
      return "scan";
    case Job::Kind::replay:
      return "replay";
    case Job::Kind::purge:
      return "purge";
    case Job::Kind::count:
      return "count";
    case Job::Kind::edit:
      return "edit";
  }
  return "?";
}

const char* state_name(Job::State state) {
  switch (state) {
    case Job::State::queued:
      return "queued";
    case Job::State::running:
      return "running";
    case Job::State::done:
      return "done";
    case Job::State::failed:
      return "failed";
  }
  return "?";
}

/// Bytes that are not UTF-8 become U+FFFD instead of failing.
std::string dump(const nlohmann::json& json, int indent = -1) {
  return json.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

Reply json_reply(const nlohmann::json& json, int status = 200) {
  return Reply{status, dump(json)};
}

Reply error_reply(int status, const std::string& message) {
  return json_reply({{"error", message}}, status);
}

/// Backs off at most three bytes, the tail of one UTF-8 character: a binary text may hold any
/// number of bytes that look like one.
std::string cut(const std::string& text, size_t bytes) {
  if (text.size() <= bytes) return text;
  size_t end = bytes;
  for (int i = 0; i < 3 && end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80; ++i) {
    --end;
  }
  return text.substr(0, end);
}

parking::ParkedMessage without_body(const parking::ParkedMessage& parked) {
  parking::ParkedMessage out;
  out.position = parked.position;
  out.message.properties = parked.message.properties;
  out.body_size = parked.body_size;
  out.message_id = parked.message_id;
  out.parked_at = parked.parked_at;
  out.reason = parked.reason;
  out.attempts = parked.attempts;
  out.error = parked.error;
  out.queue = parked.queue;
  out.original_exchange = parked.original_exchange;
  out.original_routing_key = parked.original_routing_key;
  out.replays = parked.replays;
  return out;
}

nlohmann::json progress_json(const parking::Progress& progress) {
  return {{"total", progress.total},   {"scanned", progress.scanned},
          {"moved", progress.moved},   {"skipped", progress.skipped},
          {"failed", progress.failed}, {"uncertain", progress.uncertain}};
}

nlohmann::json optional_json(const std::optional<uint64_t>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

/// RabbitMQ 4.0 and later give a quorum queue declared without `x-delivery-limit` a limit of
/// 20; 3.x none. A broker that does not say its version is taken for a later one.
bool applies_default_delivery_limit(const amqp::FieldTable& server_properties) {
  const auto version = client::broker_version(server_properties);
  return !version || version->at_least(4, 0);
}

/// Why scanning `queue` could drop parked messages, by verify's report on it; empty when it
/// cannot, or when it is missing (the depth lookup says so then).
std::string delivery_limit_problem(const topology::Report& report, const std::string& queue,
                                   bool default_limit_applies) {
  using topology::Outcome;
  if (report.connection_error) return report.connection_error.message();
  if (report.results.empty()) return {};
  const topology::ActionResult& result = report.results.front();
  switch (result.outcome) {
    case Outcome::matches:
      for (const auto& missing : result.defaults_missing) {
        if (missing.argument == "x-delivery-limit" && default_limit_applies) {
          return "queue " + queue +
                 " is a quorum queue declared without x-delivery-limit, so RabbitMQ 4.x gives it "
                 "a limit of 20 deliveries, and every scan of the console reads each parked "
                 "message once: about 20 scans would drop them. Give it a policy with "
                 "\"delivery-limit\": 1000000 (docs/topology.md, \"Older queues\"), or move its "
                 "messages away, delete it and run `retryloop topology apply`";
        }
      }
      return {};
    case Outcome::missing:
      return {};
    case Outcome::drifted:
      return "queue " + queue + " was declared with other arguments than the topology file's (" +
             (result.drift ? result.drift->argument + ": the file wants " + result.drift->wanted +
                                 ", the broker has " + result.drift->actual
                           : result.error.reply_text) +
             "), so its delivery limit may be one that repeated scans reach, and drop parked "
             "messages. `retryloop topology migrate` makes it again with the file's arguments, "
             "every parked message kept (docs/migrate.md)";
    default:
      if (result.exists.value_or(false) && result.error.reply_code == 403) {
        return "cannot check the delivery limit of queue " + queue +
               ": comparing its arguments takes configure permission on it (" +
               result.error.reply_text + ")";
      }
      return "cannot check the delivery limit of queue " + queue + ": " +
             (result.error.reply_code != 0 ? result.error.reply_text : result.error.message());
  }
}

}  // namespace

Core::Core(uv_loop_t* loop, Options options, topology::Service service,
           std::shared_ptr<AuditTrail> audit, bool hosts_audit)
    : loop_(loop),
      options_(std::move(options)),
      service_(std::move(service)),
      audit_(std::move(audit)),
      hosts_audit_(hosts_audit),
      parking_queue_(topology::parking_queue_name(service_.name)),
      input_queue_(topology::input_queue_name(service_)) {
  uv_timer_init(loop_, &reconnect_timer_);
  reconnect_timer_.data = this;
}

uint64_t Core::now_ms() const {
  return uv_now(loop_);
}

void Core::start(ReadyCallback ready) {
  ready_ = std::move(ready);
  connect();
}

void Core::fail_start(ServeResult result) {
  if (auto ready = std::exchange(ready_, nullptr)) ready(std::move(result));
}

void Core::connect() {
  if (stopping_) return;
  auto connection = client::Connection::create(loop_, options_.connection);
  connecting_ = connection;
  std::weak_ptr<Core> weak = weak_from_this();
  Error error = connection->connect([weak, connection](const Error& error) {
    auto self = weak.lock();
    if (self) self->connecting_.reset();
    if (!self || self->stopping_) {
      connection->close();
      return;
    }
    if (!error) return self->on_connected(connection);
    self->connection_error_ = error.message();
    if (self->ready_) {
      return self->fail_start({ServeResult::Status::cannot_connect, error.message()});
    }
    if (self->options_.logger) {
      self->options_.logger->warn("console: {}: cannot connect to {}: {}", self->service_.name,
                                  self->options_.connection.uri.redacted(), error.message());
    }
    self->schedule_reconnect();
  });
  if (error) {
    connecting_.reset();
    connection_error_ = error.message();
    if (ready_) return fail_start({ServeResult::Status::cannot_connect, error.message()});
    schedule_reconnect();
  }
}

void Core::on_connected(const std::shared_ptr<client::Connection>& connection) {
  connection_ = connection;
  connected_ = true;
  connection_error_.clear();
  reconnect_delay_ms_ = 0;
  std::weak_ptr<Core> weak = weak_from_this();
  const client::Connection* raw = connection.get();
  connection->set_lost_handler([weak, raw](const Error& error) {
    if (auto self = weak.lock()) self->on_lost(raw, error);
  });
  if (options_.logger) {
    options_.logger->info("console: {}: connected to {}", service_.name,
                          connection->uri().redacted());
  }
  if (options_.audit_on_broker) {
    audit_writer_ = parking::AuditWriter::open(
        connection,
        [weak](const Error& error) {
          auto self = weak.lock();
          if (self && self->options_.logger) {
            self->options_.logger->warn("console: {}: the audit trail's channel ended: {}",
                                        self->service_.name, error.message());
          }
        },
        options_.audit_key);
  }
  if (hosts_audit_) audit_->attach(connection);
  const bool first = static_cast<bool>(ready_);
  if (first && service_.queue_type == topology::QueueType::quorum &&
      !options_.allow_counted_reads) {
    check_delivery_limit(connection);
  } else {
    look_up_parking_queue(connection);
  }
}

void Core::check_delivery_limit(const std::shared_ptr<client::Connection>& connection) {
  topology::Plan plan;
  for (auto& action : topology::make_plan(topology::Topology{{service_}}).actions) {
    if (action.kind == topology::ActionKind::declare_queue &&
        action.role == topology::Role::parking_queue) {
      plan.actions.push_back(std::move(action));
    }
  }
  const bool default_limit_applies =
      applies_default_delivery_limit(connection->server_properties());
  std::weak_ptr<Core> weak = weak_from_this();
  topology::VerifyOptions options;
  options.compare_arguments = true;
  Error error = topology::verify(
      connection, plan,
      [weak, connection, default_limit_applies](const topology::Report& report) {
        auto self = weak.lock();
        if (!self || self->stopping_) return;
        std::string problem =
            delivery_limit_problem(report, self->parking_queue_, default_limit_applies);
        if (!problem.empty()) {
          const auto status = report.connection_error ? ServeResult::Status::cannot_connect
                                                      : ServeResult::Status::unsafe_delivery_limit;
          return self->fail_start({status, std::move(problem)});
        }
        self->look_up_parking_queue(connection);
      },
      options);
  if (error) fail_start({ServeResult::Status::cannot_connect, error.message()});
}

void Core::look_up_parking_queue(const std::shared_ptr<client::Connection>& connection) {
  std::weak_ptr<Core> weak = weak_from_this();
  client::look_up_queue(
      connection, parking_queue_, [weak](const Error& error, const client::QueueInfo& info) {
        auto self = weak.lock();
        if (!self || self->stopping_) return;
        if (!error) {
          self->depth_ = info.message_count;
          self->depth_ms_ = self->now_ms();
          self->depth_error_.clear();
        } else {
          self->depth_error_ = error.message();
        }
        if (self->ready_) {
          if (error && error.reply_code == 404) {
            return self->fail_start({ServeResult::Status::no_queue,
                                     "queue " + self->parking_queue_ +
                                         " does not exist (run `retryloop topology apply`)"});
          }
          if (error)
            return self->fail_start({ServeResult::Status::cannot_connect, error.message()});
          std::exchange(self->ready_, nullptr)({ServeResult::Status::stopped, {}});
        }
        if (!self->shown_scan_ && !self->running_ && self->jobs_.empty()) {
          self->jobs_.request_scan({}, nlohmann::json::object(), true);
        }
        self->run_next();
      });
}

void Core::on_lost(const client::Connection* connection, const Error& error) {
  if (connection != connection_.get()) return;
  connected_ = false;
  connection_.reset();
  if (audit_writer_) std::exchange(audit_writer_, nullptr)->close();
  if (hosts_audit_) audit_->detach();
  connection_error_ = error.message();
  if (options_.logger) {
    options_.logger->warn("console: {}: lost the connection to the broker: {}; reconnecting",
                          service_.name, error.message());
  }
  // A running job ends with the error through its own callback (its channel closes).
  if (!stopping_) schedule_reconnect();
}

void Core::schedule_reconnect() {
  if (stopping_) return;
  reconnect_delay_ms_ = reconnect_delay_ms_ == 0
                            ? kReconnectFirstMs
                            : std::min(reconnect_delay_ms_ * 2, kReconnectMaxMs);
  uv_timer_start(
      &reconnect_timer_, [](uv_timer_t* timer) { static_cast<Core*>(timer->data)->connect(); },
      reconnect_delay_ms_, 0);
}

void Core::refresh_depths() {
  if (!connected_ || depth_lookup_ || now_ms() - depth_ms_ < kDepthMaxAgeMs) return;
  depth_lookup_ = true;
  std::weak_ptr<Core> weak = weak_from_this();
  auto connection = connection_;
  client::look_up_queue(connection, parking_queue_,
                        [weak, connection](const Error& error, const client::QueueInfo& info) {
                          auto self = weak.lock();
                          if (!self) return;
                          if (error) {
                            self->depth_error_ = error.message();
                          } else {
                            self->depth_ = info.message_count;
                            self->depth_error_.clear();
                          }
                          self->depth_ms_ = self->now_ms();
                          if (!connection->is_open()) {
                            self->depth_lookup_ = false;
                            return;
                          }
                          client::look_up_queue(
                              connection, self->input_queue_,
                              [weak](const Error& error, const client::QueueInfo& info) {
                                auto self = weak.lock();
                                if (!self) return;
                                self->depth_lookup_ = false;
                                if (error) {
                                  self->input_depth_.reset();
                                  self->input_consumers_.reset();
                                } else {
                                  self->input_depth_ = info.message_count;
                                  self->input_consumers_ = info.consumer_count;
                                }
                                self->look_up_breaker();
                                self->look_up_migration();
                                self->maybe_rescan();
                              });
                        });
}

void Core::look_up_breaker() {
  if (!connected_ || stopping_) return;
  if (breaker_watch_ && !breaker_watch_->ended()) return breaker_watch_->refresh();
  if (breaker_watch_ && now_ms() < breaker_watch_retry_ms_) return;
  std::weak_ptr<Core> weak = weak_from_this();
  breaker_watch_ = consumer::SharedBreakerWatch::start(
      connection_, service_.name,
      [weak](const consumer::SharedBreakerStatus& status) {
        auto self = weak.lock();
        if (!self) return;
        self->breaker_ = status;
        self->breaker_error_.clear();
      },
      [weak](const Error& error) {
        auto self = weak.lock();
        if (!self) return;
        self->breaker_.reset();
        self->breaker_error_ = error.message();
        // A service whose breaker is not declared yet fails at its first look-up, before the
        // state queue is read: that is looked for again at the next poll. A watch that failed
        // after it found the breaker waits, so that the state queue is not read over and over.
        const bool found = self->breaker_watch_ && self->breaker_watch_->found();
        self->breaker_watch_retry_ms_ = found ? self->now_ms() + kBreakerWatchRetryMs : 0;
      });
}

void Core::look_up_migration() {
  if (!connected_ || stopping_ || migration_reading_) return;
  if (migration_read_ms_ != 0 && now_ms() - migration_read_ms_ < kMigrationReadMs) return;
  migration_reading_ = true;
  std::weak_ptr<Core> weak = weak_from_this();
  const Error error = migrate::read_record(
      connection_, service_.name,
      [weak](const Error& error, const std::optional<migrate::Record>& record) {
        auto self = weak.lock();
        if (!self) return;
        self->migration_reading_ = false;
        self->migration_read_ms_ = self->now_ms();
        // Unreadable (no read permission on N.migration, say): shown as none.
        if (error || !record || record->finished) {
          self->migration_.reset();
        } else {
          self->migration_ = record;
        }
      });
  if (error) migration_reading_ = false;
}

nlohmann::json Core::migration_json() const {
  if (!migration_) return nullptr;
  return {{"id", migration_->id},
          {"next_step", migration_->next_step},
          {"started_at_ms", migration_->started_at_ms},
          {"holding", migration_->holding}};
}

nlohmann::json Core::breaker_json() const {
  if (!breaker_) return nullptr;
  nlohmann::json out = {{"state", consumer::shared_breaker_state(breaker_->last)},
                        {"instances", breaker_->instances},
                        {"tokens_waiting", breaker_->tokens_waiting},
                        {"signal", nullptr}};
  if (const auto& last = breaker_->last) {
    out["signal"] = {{"kind", outage::to_string(last->kind)},
                     {"at_ms", last->at_ms},
                     {"sender", last->sender},
                     {"reason", last->reason}};
  }
  return out;
}

void Core::maybe_rescan() {
  if (options_.rescan_after.count() <= 0 || stopping_ || !connected_ || running_ ||
      !jobs_.empty() || !shown_scan_ || !depth_ || *depth_ == shown_scan_->stats.depth) {
    return;
  }
  const uint64_t took = shown_scan_->finished_ms - shown_scan_->started_ms;
  const uint64_t wait =
      std::max(uint64_t(options_.rescan_after.count()), took * kRescanDurationFactor);
  if (now_ms() - shown_scan_->finished_ms < wait) return;
  jobs_.request_scan(shown_scan_->filter, shown_scan_->filter_json, true);
  run_next();
}

void Core::run_next() {
  if (running_ || stopping_ || !connected_) return;
  if (std::shared_ptr<Job> job = jobs_.pop()) start_job(job);
}

parking::AuditRecord Core::audit_record(const Job& job, const char* state) const {
  parking::AuditRecord record;
  record.id = job.audit_id;
  record.who = job.who;
  record.action = kind_name(job.kind);
  record.state = state;
  record.service = service_.name;
  record.filter = job.kind == Job::Kind::edit ? nlohmann::json(nullptr) : job.filter_json;
  record.asked = job.asked;
  if (job.kind == Job::Kind::edit) {
    record.message_id = job.edit.message_id;
    record.new_message_id = job.edit_result.new_message_id;
  }
  if (job.state == Job::State::done || job.state == Job::State::failed) {
    record.done = job.progress.moved;
    record.failed = job.progress.failed;
    record.error = job.error;
  }
  return record;
}

void Core::start_job(const std::shared_ptr<Job>& job) {
  running_ = job;
  job->state = Job::State::running;
  job->started_ms = now_ms();
  job->started_at = retry::unix_seconds();
  if (job->kind == Job::Kind::scan) return run_job(job);
  // Recorded before it touches a message: an action that cannot be recorded is not done.
  std::error_code no_id;
  job->audit_id = random::random_id(no_id);
  if (no_id) {
    return finish_job(job, Error(no_id,
                                 "cannot draw the audit record's id (getrandom); nothing "
                                 "was done"));
  }
  std::weak_ptr<Core> weak = weak_from_this();
  audit_->append(
      audit_record(*job, "started"), audit_writer_.get(), [weak, job](const std::string& error) {
        auto self = weak.lock();
        if (!self) return;
        if (!error.empty()) {
          return self->finish_job(
              job, Error(client::ClientError::not_open,
                         "not recorded in the audit trail (" + error + "); nothing was done"));
        }
        if (self->stopping_ || !self->connected_) {
          return self->finish_job(job, Error(client::ClientError::not_open,
                                             "the console lost its broker connection; nothing was "
                                             "done"));
        }
        self->run_job(job);
      });
}

void Core::run_job(const std::shared_ptr<Job>& job) {
  std::weak_ptr<Core> weak = weak_from_this();
  auto on_progress = [job](const parking::Progress& progress) { job->progress = progress; };
  Error error;
  switch (job->kind) {
    case Job::Kind::scan: {
      parking::StatsOptions options;
      options.filter = job->filter;
      options.keep = options_.list_limit;
      options.kept_body_bytes = kBodyShownBytes;
      error = parking::stats(
          connection_, service_, options,
          [weak, job](const Error& error, parking::Stats stats) {
            job->stats = std::move(stats);
            if (auto self = weak.lock()) self->finish_job(job, error);
          },
          on_progress);
      break;
    }
    case Job::Kind::replay: {
      parking::ReplayOptions options;
      options.filter = job->filter;
      options.note.via = "console";
      options.note.by = job->who;
      error = parking::replay(
          connection_, service_, options,
          [weak, job](const parking::ReplayResult& result) {
            job->progress = result.progress;
            job->interrupted = result.interrupted;
            if (auto self = weak.lock()) self->finish_job(job, result.error);
          },
          &job->replay, on_progress);
      break;
    }
    case Job::Kind::purge:
    case Job::Kind::count: {
      parking::PurgeOptions options;
      options.filter = job->filter;
      options.execute = job->kind == Job::Kind::purge;
      error = parking::purge(
          connection_, service_, options,
          [weak, job](const Error& error, const parking::Progress& progress) {
            job->progress = progress;
            if (auto self = weak.lock()) self->finish_job(job, error);
          },
          on_progress);
      break;
    }
    case Job::Kind::edit: {
      job->edit.note.via = "console";
      job->edit.note.by = job->who;
      error = parking::edit(
          connection_, service_, job->edit,
          [weak, job](const parking::EditResult& result) {
            job->edit_result = result;
            job->interrupted = result.interrupted;
            job->progress.moved = result.sent ? 1 : 0;
            job->progress.failed = result.found && !result.sent && !result.may_have_been_sent;
            job->progress.uncertain = result.may_have_been_sent ? 1 : 0;
            Error error = result.error;
            if (!error && !result.found && !result.interrupted) {
              error = Error(client::ClientError::invalid_argument,
                            "no parked message has the id " + job->edit.message_id + " (any more)");
            }
            if (auto self = weak.lock()) self->finish_job(job, error);
          },
          &job->edit_run);
      break;
    }
  }
  if (error) finish_job(job, error);
}

void Core::finish_job(const std::shared_ptr<Job>& job, const Error& error) {
  if (job->state != Job::State::running) return;
  job->state = error ? Job::State::failed : Job::State::done;
  job->error = error ? error.message() : std::string();
  job->finished_ms = now_ms();
  job->finished_at = retry::unix_seconds();
  job->replay.reset();
  job->edit_run.reset();
  if (running_ == job) running_.reset();
  if (job->kind == Job::Kind::scan) {
    if (error) {
      scan_error_ = job->error;
    } else {
      scan_error_.clear();
      auto& groups = job->stats.by_error;
      if (groups.size() > kErrorGroupsShown) {
        job->error_groups_dropped = groups.size() - kErrorGroupsShown;
        groups.resize(kErrorGroupsShown);
      }
      groups.shrink_to_fit();
      auto& causes = job->stats.by_cause;
      if (causes.size() > kErrorGroupsShown) causes.resize(kErrorGroupsShown);
      causes.shrink_to_fit();
      job->stats.messages.shrink_to_fit();
      shown_scan_ = job;
      depth_ = job->stats.depth;
      if (auto input = job->stats.loop_depths.find(input_queue_);
          input != job->stats.loop_depths.end()) {
        input_depth_ = input->second;
      }
    }
  } else {
    last_action_ = job;
    log_action(*job);
    if (!job->audit_id.empty()) {
      const char* state = job->state == Job::State::failed ? "failed"
                          : job->interrupted               ? "stopped"
                                                           : "done";
      std::weak_ptr<Core> weak = weak_from_this();
      audit_->append(audit_record(*job, state), audit_writer_.get(),
                     [weak](const std::string& error) {
                       auto self = weak.lock();
                       if (!error.empty() && self && self->options_.logger) {
                         self->options_.logger->error(
                             "console: the end of an action was not recorded in the "
                             "audit trail: {}",
                             error);
                       }
                     });
    }
    // The counts changed. A scan the user asked for meanwhile keeps its newer filter.
    if (job->kind != Job::Kind::count && !stopping_) {
      jobs_.refresh(shown_scan_ ? shown_scan_->filter : parking::Filter{},
                    shown_scan_ ? shown_scan_->filter_json : nlohmann::json::object());
    }
  }
  if (stopping_) {
    close_all();
    return;
  }
  run_next();
}

void Core::log_action(const Job& job) const {
  if (!options_.logger) return;
  const parking::Progress& p = job.progress;
  const char* outcome = job.state == Job::State::failed ? "failed"
                        : job.interrupted               ? "stopped"
                                                        : "done";
  options_.logger->info("console: {}: {} {} {}: read {}, {} {}, skipped {}, failed {}{}{}",
                        service_.name, kind_name(job.kind), job.id, outcome, p.scanned,
                        job.kind == Job::Kind::replay  ? "moved"
                        : job.kind == Job::Kind::purge ? "deleted"
                        : job.kind == Job::Kind::edit  ? "sent"
                                                       : "matched",
                        p.moved, p.skipped, p.failed, job.error.empty() ? "" : ": ",
                        amqp::printable(job.error));
}

void Core::stop(bool at_once, std::function<void()> done) {
  if (done) stopped_ = std::move(done);
  stopping_ = true;
  jobs_.clear();
  if (breaker_watch_) breaker_watch_->close();
  if (closed_) {
    if (open_parts_ == 0 && stopped_) std::exchange(stopped_, nullptr)();
    return;
  }
  // finish_job closes once a running replay's or edit's copies settle: closed before, a copy's
  // confirm would be lost with the channel, and whether it was sent unknown.
  if (!at_once && running_ && connected_ && (running_->replay || running_->edit_run)) {
    running_->stop_requested = true;
    if (running_->replay) {
      running_->replay->stop();
    } else {
      running_->edit_run->stop();
    }
    return;
  }
  close_all();
}

void Core::close_all() {
  if (closed_) return;
  closed_ = true;
  connected_ = false;
  if (audit_writer_) std::exchange(audit_writer_, nullptr)->close();
  if (hosts_audit_) audit_->detach();
  open_parts_ = 2;  // the timer and the connection
  uv_timer_stop(&reconnect_timer_);
  if (auto connecting = std::move(connecting_)) connecting->close();
  uv_close(reinterpret_cast<uv_handle_t*>(&reconnect_timer_),
           [](uv_handle_t* handle) { static_cast<Core*>(handle->data)->part_closed(); });
  if (connection_) {
    auto connection = std::move(connection_);
    std::weak_ptr<Core> weak = weak_from_this();
    connection->close([weak](const Error&) {
      if (auto self = weak.lock()) self->part_closed();
    });
  } else {
    part_closed();
  }
}

void Core::part_closed() {
  if (--open_parts_ == 0 && stopped_) std::exchange(stopped_, nullptr)();
}

const Job* Core::pending_action() const {
  if (running_ && running_->kind != Job::Kind::scan) return running_.get();
  return jobs_.waiting_action();
}

nlohmann::json Core::job_json(const Job& job) const {
  nlohmann::json out = {{"id", job.id},
                        {"kind", kind_name(job.kind)},
                        {"state", state_name(job.state)},
                        {"filter", job.filter_json},
                        {"progress", progress_json(job.progress)},
                        {"error", job.error},
                        {"interrupted", job.interrupted},
                        {"stop_requested", job.stop_requested},
                        {"automatic", job.automatic}};
  if (job.kind == Job::Kind::replay || job.kind == Job::Kind::edit) out["target"] = input_queue_;
  if (job.asked) out["asked"] = *job.asked;
  if (job.kind == Job::Kind::edit) {
    const parking::EditResult& result = job.edit_result;
    out["message_id"] = job.edit.message_id;
    out["new_message_id"] = result.new_message_id;
    out["kept_original"] = job.edit.keep_original;
    out["outcome"] = job.state == Job::State::queued || job.state == Job::State::running ? "pending"
                     : result.sent                                                       ? "sent"
                     : result.may_have_been_sent                                         ? "unknown"
                                                 : "not_sent";
    out["kept_not_editable"] = result.kept_not_editable;
  }
  if (job.started_at != 0) out["started_at"] = job.started_at;
  if (job.finished_at != 0) {
    out["finished_at"] = job.finished_at;
    out["duration_ms"] = job.finished_ms - job.started_ms;
  }
  return out;
}

nlohmann::json Core::scan_json(const Job& scan) const {
  nlohmann::json out = job_json(scan);
  const parking::Stats& stats = scan.stats;
  out["depth"] = stats.depth;
  out["scanned"] = stats.scanned;
  out["matched"] = stats.matched;
  out["kept"] = stats.messages.size();
  out["oldest_parked_at"] = optional_json(stats.oldest_parked_at);
  nlohmann::json reasons = nlohmann::json::array();
  for (const auto& [reason, count] : stats.by_reason) {
    reasons.push_back({{"reason", reason}, {"count", count}});
  }
  out["by_reason"] = std::move(reasons);
  nlohmann::json errors = nlohmann::json::array();
  for (const auto& [error, count] : stats.by_error) {
    errors.push_back({{"error", error}, {"count", count}});
  }
  out["by_error"] = std::move(errors);
  nlohmann::json causes = nlohmann::json::array();
  for (const auto& cause : stats.by_cause) {
    causes.push_back({{"cause", cause.fingerprint},
                      {"count", cause.count},
                      {"distinct", cause.distinct},
                      {"example", cause.example}});
  }
  out["by_cause"] = std::move(causes);
  out["more_error_groups"] = scan.error_groups_dropped;
  return out;
}

Reply Core::state() {
  refresh_depths();
  maybe_rescan();
  const auto& service = service_;
  nlohmann::json out = {
      {"service", service.name},
      {"parking_queue", parking_queue_},
      {"input_queue", input_queue_},
      {"queue_type", service.queue_type == topology::QueueType::quorum ? "quorum" : "classic"},
      {"broker", options_.connection.uri.redacted()},
      {"connected", connected_},
      {"connection_error", connection_error_},
      {"depth", depth_ ? nlohmann::json(*depth_) : nlohmann::json(nullptr)},
      {"input_depth", input_depth_ ? nlohmann::json(*input_depth_) : nlohmann::json(nullptr)},
      {"breaker", breaker_json()},
      {"breaker_error", breaker_error_},
      {"migrating", migration_json()},
      {"depth_error", depth_error_},
      {"scan_error", scan_error_},
      {"now", retry::unix_seconds()},
      {"list_limit", options_.list_limit},
      {"rescan_after_ms", options_.rescan_after.count()}};
  out["scan"] = shown_scan_ ? scan_json(*shown_scan_) : nlohmann::json(nullptr);
  const Job* scanning =
      running_ && running_->kind == Job::Kind::scan ? running_.get() : jobs_.waiting_scan();
  out["scanning"] = scanning ? job_json(*scanning) : nlohmann::json(nullptr);
  const Job* action = pending_action();
  out["job"] = action         ? job_json(*action)
               : last_action_ ? job_json(*last_action_)
                              : nlohmann::json(nullptr);
  out["notes"] = audit_->notes(service_.name);
  return json_reply(out);
}

Reply Core::metrics() {
  refresh_depths();
  maybe_rescan();
  const std::string service = "service=\"" + retry::prometheus_escaped(service_.name, true) + "\"";
  std::string out;
  auto gauge = [&out](const char* name, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n";
  };
  gauge("retryloop_parking_depth",
        "Messages in the service's parking queue, looked up at most every few seconds.");
  if (depth_) {
    out += "retryloop_parking_depth{" + service + ",queue=\"" +
           retry::prometheus_escaped(parking_queue_, true) + "\"} " + std::to_string(*depth_) +
           "\n";
  }
  gauge("retryloop_queue_messages",
        "Messages ready in the service's input queue (looked up with the parking depth), and in "
        "its wait queues and delay levels as the last count found them.");
  std::map<std::string, uint64_t> queues;
  if (input_depth_) queues[input_queue_] = *input_depth_;
  if (shown_scan_) {
    for (const auto& [queue, depth] : shown_scan_->stats.loop_depths) {
      if (queue != input_queue_) queues[queue] = depth;
    }
  }
  for (const auto& [queue, depth] : queues) {
    out += "retryloop_queue_messages{" + service + ",queue=\"" +
           retry::prometheus_escaped(queue, true) + "\"} " + std::to_string(depth) + "\n";
  }
  gauge("retryloop_queue_consumers",
        "Consumers of the service's input queue, looked up with the parking depth: 0 means no "
        "instance of the service is consuming.");
  if (input_consumers_) {
    out += "retryloop_queue_consumers{" + service + ",queue=\"" +
           retry::prometheus_escaped(input_queue_, true) + "\"} " +
           std::to_string(*input_consumers_) + "\n";
  }
  // Counts by reason only from a count of every parked message: a filtered one would undercount.
  const bool whole = shown_scan_ && shown_scan_->filter.empty();
  gauge("retryloop_parking_messages",
        "Parked messages by reason, as the last count of the whole parking queue found them.");
  if (whole) {
    for (const auto& [reason, count] : shown_scan_->stats.by_reason) {
      out += "retryloop_parking_messages{" + service + ",reason=\"" +
             retry::prometheus_escaped(reason, true) + "\"} " + std::to_string(count) + "\n";
    }
  }
  gauge("retryloop_parking_count_age_seconds", "Seconds since that count ended.");
  if (whole) {
    const uint64_t now = retry::unix_seconds();
    const uint64_t at = shown_scan_->finished_at;
    out += "retryloop_parking_count_age_seconds{" + service + "} " +
           std::to_string(now > at ? now - at : 0) + "\n";
  }
  Reply reply;
  reply.body = std::move(out);
  reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
  return reply;
}

Reply Core::messages() {
  nlohmann::json list = nlohmann::json::array();
  if (!shown_scan_) return json_reply({{"scan", nullptr}, {"messages", list}});
  const auto& kept = shown_scan_->stats.messages;
  for (size_t i = 0; i < kept.size(); ++i) {
    const parking::ParkedMessage& parked = kept[i];
    const std::string preview = cut(parked.message.body, kPreviewBytes);
    list.push_back(
        {{"index", i},
         {"position", parked.position},
         {"message_id", parked.message_id},
         {"parked_at", optional_json(parked.parked_at)},
         {"reason", parked.reason},
         {"attempts", parked.attempts ? nlohmann::json(*parked.attempts) : nlohmann::json(nullptr)},
         {"error", cut(parking::first_line(parked.error), kErrorLineBytes)},
         {"routing_key", parked.original_routing_key},
         {"exchange", parked.original_exchange},
         {"replays", parked.replays},
         {"size", parked.body_size},
         {"preview",
          parking::is_utf8(preview) ? nlohmann::json(preview) : nlohmann::json(nullptr)}});
  }
  return json_reply({{"scan", shown_scan_->id}, {"messages", std::move(list)}});
}

Reply Core::message(uint64_t scan_id, size_t index) {
  if (!shown_scan_ || shown_scan_->id != scan_id) {
    return error_reply(410, "the list was refreshed since: open the message again");
  }
  const auto& kept = shown_scan_->stats.messages;
  if (index >= kept.size()) return error_reply(404, "no such message in this list");
  parking::ParkedMessage shown = without_body(kept[index]);
  const std::string& body = kept[index].message.body;
  shown.message.body = cut(body, kBodyShownBytes);
  const bool truncated = shown.body_size > shown.message.body.size();
  nlohmann::json out = parking::message_json(shown, retry::unix_seconds());
  out["scan"] = scan_id;
  out["index"] = index;
  out["body_size"] = shown.body_size;
  out["body_truncated"] = truncated;
  out["parked_at_seconds"] = optional_json(shown.parked_at);
  nlohmann::json times = nlohmann::json::object();
  if (shown.message.properties.headers) {
    for (const auto& entry : *shown.message.properties.headers) {
      if (const auto* time = entry.value.get_if<amqp::Timestamp>()) {
        times[entry.name] = parking::iso_time(time->seconds);
      }
    }
  }
  out["header_times"] = std::move(times);
  nlohmann::json types = nlohmann::json::object();
  nlohmann::json editable = nlohmann::json::array();
  nlohmann::json kept_headers = nlohmann::json::array();
  if (shown.message.properties.headers) {
    for (const auto& entry : *shown.message.properties.headers) {
      types[entry.name] = parking::field_type_name(entry.value);
      if (parking::header_editable_as_text(entry.name, entry.value)) {
        editable.push_back(entry.name);
      } else if (parking::header_editable(entry.name)) {
        kept_headers.push_back(entry.name);
      }
    }
  }
  // What an edit may change as text, and the application headers it keeps as they are.
  out["header_types"] = std::move(types);
  out["editable_headers"] = std::move(editable);
  out["kept_headers"] = std::move(kept_headers);
  if (!truncated && parking::nests_at_most(body, kPrettyDepth) && parking::is_utf8(body)) {
    nlohmann::json parsed = nlohmann::json::parse(body, nullptr, false);
    if (!parsed.is_discarded() && (parsed.is_object() || parsed.is_array())) {
      out["body_pretty"] = dump(parsed, 2);
    }
  }
  return json_reply(out);
}

Reply Core::request_scan(nlohmann::json request) {
  if (stopping_) return error_reply(503, "the console is stopping");
  nlohmann::json filter_json = nlohmann::json::object();
  if (auto given = request.find("filter"); given != request.end()) filter_json = std::move(*given);
  parking::Filter filter;
  try {
    filter = parse_filter(filter_json);
  } catch (const std::invalid_argument& e) {
    return error_reply(400, std::string("filter: ") + e.what());
  }
  jobs_.request_scan(std::move(filter), std::move(filter_json), false);
  run_next();
  return json_reply({{"queued", true}, {"connected", connected_}});
}

std::optional<Reply> Core::cannot_act() const {
  if (stopping_) return error_reply(503, "the console is stopping");
  if (!connected_) {
    return error_reply(503, "not connected to the broker (" + connection_error_ +
                                "); the console is reconnecting");
  }
  if (const Job* pending = pending_action()) {
    return error_reply(
        409, std::string("a ") + kind_name(pending->kind) + " is running: wait for it, or stop it");
  }
  return std::nullopt;
}

Reply Core::request_action(Job::Kind kind, nlohmann::json request, const std::string& who) {
  if (auto refused = cannot_act()) return *refused;
  auto given = request.find("filter");
  if (given == request.end()) {
    return error_reply(400, "give a filter (an empty object takes every message)");
  }
  nlohmann::json filter_json = std::move(*given);
  parking::Filter filter;
  try {
    parse_filter(filter_json);
    filter_json = pin_older_than(std::move(filter_json), retry::unix_seconds());
    filter = parse_filter(filter_json);
  } catch (const std::invalid_argument& e) {
    return error_reply(400, std::string("filter: ") + e.what());
  }
  std::optional<uint64_t> asked;
  if (auto given_count = request.find("asked"); given_count != request.end()) {
    if (!given_count->is_number_unsigned()) {
      return error_reply(400, "asked: give the number of messages the user confirmed");
    }
    asked = given_count->get<uint64_t>();
  }
  auto job = jobs_.make(kind, std::move(filter), std::move(filter_json));
  job->who = who;
  job->asked = asked;
  if (options_.logger && kind != Job::Kind::count) {
    options_.logger->info("console: {}: {} {} requested from {}, filter {}", service_.name,
                          kind_name(kind), job->id, amqp::printable(who),
                          amqp::printable(dump(job->filter_json)));
  }
  jobs_.push_action(job);
  run_next();
  return json_reply({{"job", job->id}});
}

Reply Core::stop_action() {
  if (auto stopped = jobs_.stop_waiting_action()) {
    stopped->started_ms = stopped->finished_ms = now_ms();
    stopped->finished_at = retry::unix_seconds();
    last_action_ = stopped;
    log_action(*stopped);
    return json_reply({{"stopped", true}});
  }
  if (!running_ || running_->kind == Job::Kind::scan) {
    return error_reply(409, "no action is running");
  }
  if (!running_->replay) {
    return error_reply(409, std::string("a ") + kind_name(running_->kind) +
                                " cannot be stopped halfway; it ends by itself");
  }
  running_->stop_requested = true;
  running_->replay->stop();
  return json_reply({{"stopping", true}});
}

Reply Core::request_edit(const nlohmann::json& request, const std::string& who) {
  if (auto refused = cannot_act()) return *refused;
  parking::EditOptions edit;
  auto text = [&request](const char* key) -> std::optional<std::string> {
    auto it = request.find(key);
    if (it == request.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  auto id = text("message_id");
  if (!id || id->empty()) return error_reply(400, "message_id: give the parked message's id");
  edit.message_id = *id;
  if (auto body = request.find("body"); body != request.end() && !body->is_null()) {
    if (!body->is_string()) {
      return error_reply(400,
                         "body: give the edited body as a string, or leave it out to keep the "
                         "original's");
    }
    edit.body = body->get<std::string>();
  }
  if (request.contains("headers")) {
    return error_reply(400,
                       "headers: send only what changed, as set_headers (an object) and "
                       "remove_headers (an array of names); every other header is kept as "
                       "it is");
  }
  if (auto set = request.find("set_headers"); set != request.end() && !set->is_null()) {
    if (!set->is_object()) {
      return error_reply(400, "set_headers: give an object of header names and values");
    }
    for (const auto& [name, value] : set->items()) {
      if (value.is_string()) {
        edit.set_headers.append(name, value.get<std::string>());
      } else if (value.is_boolean()) {
        edit.set_headers.append(name, value.get<bool>());
      } else if (value.is_number_integer() &&
                 !(value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX))) {
        edit.set_headers.append(name, value.get<int64_t>());
      } else if (value.is_number_float()) {
        edit.set_headers.append(name, value.get<double>());
      } else {
        return error_reply(400, "set_headers: " + name +
                                    " must be a string, a number (a 64-bit integer or a double) "
                                    "or true/false; tables, arrays, byte arrays, timestamps and "
                                    "decimals are kept as they are and cannot be set here");
      }
    }
  }
  if (auto removed = request.find("remove_headers");
      removed != request.end() && !removed->is_null()) {
    if (!removed->is_array()) {
      return error_reply(400, "remove_headers: give an array of header names");
    }
    for (const auto& name : *removed) {
      if (!name.is_string())
        return error_reply(400, "remove_headers: give header names as strings");
      edit.remove_headers.push_back(name.get<std::string>());
    }
  }
  if (client::Error refused = parking::check_edit(edit)) {
    return error_reply(400, refused.reply_text);
  }
  if (auto parked_at = request.find("parked_at");
      parked_at != request.end() && !parked_at->is_null()) {
    if (!parked_at->is_number_unsigned()) {
      return error_reply(400, "parked_at: give the parked time in seconds since the epoch");
    }
    edit.parked_at = parked_at->get<uint64_t>();
  }
  if (auto keep = request.find("keep_original"); keep != request.end()) {
    if (!keep->is_boolean()) return error_reply(400, "keep_original: give true or false");
    edit.keep_original = keep->get<bool>();
  }
  auto job = jobs_.make(Job::Kind::edit, {}, nlohmann::json{{"message_id", edit.message_id}});
  job->who = who;
  job->asked = 1;
  job->edit = std::move(edit);
  if (options_.logger) {
    options_.logger->info("console: {}: edit {} of {} requested from {}", service_.name, job->id,
                          amqp::printable(job->edit.message_id), amqp::printable(who));
  }
  jobs_.push_action(job);
  run_next();
  return json_reply({{"job", job->id}});
}

Reply Core::request_note(const nlohmann::json& request, const std::string& who) {
  auto group = request.find("group");
  auto text = request.find("text");
  if (group == request.end() || !group->is_string() || group->get<std::string>().empty()) {
    return error_reply(400, "group: give the cause the note is about");
  }
  if (text == request.end() || !text->is_string()) {
    return error_reply(400, "text: give the note (an empty text clears it)");
  }
  if (group->get<std::string>().size() > kErrorLineBytes ||
      text->get<std::string>().size() > kNoteBytes) {
    return error_reply(400, "the note is too long (at most " + std::to_string(kNoteBytes) +
                                " bytes, its group " + std::to_string(kErrorLineBytes) + ")");
  }
  parking::AuditRecord record;
  record.who = who;
  record.action = "note";
  record.state = "done";
  record.service = service_.name;
  record.group = group->get<std::string>();
  record.note = text->get<std::string>();
  std::weak_ptr<Core> weak = weak_from_this();
  audit_->append(std::move(record), audit_writer_.get(), [weak](const std::string& error) {
    auto self = weak.lock();
    if (!error.empty() && self && self->options_.logger) {
      self->options_.logger->error("console: a note was not recorded: {}", error);
    }
  });
  return json_reply({{"recording", true}});
}

nlohmann::json Core::summary() {
  refresh_depths();
  maybe_rescan();
  nlohmann::json out = {{"service", service_.name},
                        {"parking_queue", parking_queue_},
                        {"connected", connected_},
                        {"depth", depth_ ? nlohmann::json(*depth_) : nlohmann::json(nullptr)},
                        {"breaker", breaker_json()},
                        {"migrating", migration_json()}};
  const bool whole = shown_scan_ && shown_scan_->filter.empty();
  nlohmann::json reasons = nlohmann::json::object();
  if (whole) {
    for (const auto& [reason, count] : shown_scan_->stats.by_reason)
      reasons[reason] = count;
  }
  out["by_reason"] = whole ? reasons : nlohmann::json(nullptr);
  out["counted_at"] = whole ? nlohmann::json(shown_scan_->finished_at) : nlohmann::json(nullptr);
  return out;
}

}  // namespace retryloop::console::detail
