#include "core.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "retryloop/console/detail/api.hpp"
#include "retryloop/consumer/headers.hpp"
#include "retryloop/parking/parked_json.hpp"

namespace retryloop::console::detail {

namespace {

using client::Error;

/// Depths older than this are looked up again when the page asks for the state.
constexpr uint64_t kDepthMaxAgeMs = 2000;
/// An automatic rescan waits at least this many times as long as the last scan took.
constexpr uint64_t kRescanDurationFactor = 10;
constexpr uint64_t kReconnectFirstMs = 1000;
constexpr uint64_t kReconnectMaxMs = 15000;
/// Larger bodies are cut to this for the page.
constexpr size_t kBodyShownBytes = 1024 * 1024;
/// Error groups sent to the page; the rest are counted.
constexpr size_t kErrorGroupsShown = 100;
constexpr size_t kPreviewBytes = 160;
constexpr size_t kErrorLineBytes = 400;
/// JSON bodies nested deeper than this are shown as they are, not indented.
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

/// JSON text; bytes that are not UTF-8 become U+FFFD instead of failing.
std::string dump(const nlohmann::json& json, int indent = -1) {
  return json.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

Reply json_reply(const nlohmann::json& json, int status = 200) {
  return Reply{status, dump(json)};
}

Reply error_reply(int status, const std::string& message) {
  return json_reply({{"error", message}}, status);
}

/// At most `bytes` bytes of `text`, not cutting a UTF-8 character in two.
std::string cut(const std::string& text, size_t bytes) {
  if (text.size() <= bytes) return text;
  size_t end = bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80)
    --end;
  return text.substr(0, end);
}

/// Whether the arrays and objects of JSON `text` nest at most `limit` deep. Indenting a deeper
/// document would recurse as deep (the serializer is recursive), so such a body is shown as it
/// is.
bool nests_at_most(std::string_view text, size_t limit) {
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return true;
}

/// `parked` without its body, which may be large.
parking::ParkedMessage without_body(const parking::ParkedMessage& parked) {
  parking::ParkedMessage out;
  out.position = parked.position;
  out.message.properties = parked.message.properties;
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
  return {{"total", progress.total},
          {"scanned", progress.scanned},
          {"moved", progress.moved},
          {"skipped", progress.skipped},
          {"failed", progress.failed}};
}

nlohmann::json optional_json(const std::optional<uint64_t>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace

Core::Core(uv_loop_t* loop, Options options)
    : loop_(loop),
      options_(std::move(options)),
      parking_queue_(topology::parking_queue_name(options_.service.name)),
      input_queue_(topology::input_queue_name(options_.service)) {
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
    if (auto ready = std::move(self->ready_)) {
      return ready({ServeResult::Status::cannot_connect, error.message()});
    }
    if (self->options_.logger) {
      self->options_.logger->warn("console: cannot connect to {}: {}",
                                  self->options_.connection.uri.redacted(), error.message());
    }
    self->schedule_reconnect();
  });
  if (error) {
    connecting_.reset();
    connection_error_ = error.message();
    if (auto ready = std::move(ready_)) {
      return ready({ServeResult::Status::cannot_connect, error.message()});
    }
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
    options_.logger->info("console: connected to {}", connection->uri().redacted());
  }
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
        if (auto ready = std::move(self->ready_)) {
          if (error) {
            const std::string why = error.reply_code == 404
                                        ? "queue " + self->parking_queue_ +
                                              " does not exist (run `retryloop topology apply`)"
                                        : error.message();
            return ready({error.reply_code == 404 ? ServeResult::Status::no_queue
                                                  : ServeResult::Status::cannot_connect,
                          why});
          }
          ready({ServeResult::Status::stopped, {}});
        }
        if (!self->shown_scan_ && !self->running_ && self->queue_.empty()) {
          self->enqueue_scan({}, nlohmann::json::object(), true);
        }
        self->run_next();
      });
}

void Core::on_lost(const client::Connection* connection, const Error& error) {
  if (connection != connection_.get()) return;
  connected_ = false;
  connection_.reset();
  connection_error_ = error.message();
  if (options_.logger) {
    options_.logger->warn("console: lost the connection to the broker: {}; reconnecting",
                          error.message());
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
                                } else {
                                  self->input_depth_ = info.message_count;
                                }
                                self->maybe_rescan();
                              });
                        });
}

void Core::maybe_rescan() {
  if (options_.rescan_after.count() <= 0 || stopping_ || !connected_ || running_ ||
      !queue_.empty() || !shown_scan_ || !depth_ || *depth_ == shown_scan_->stats.depth) {
    return;
  }
  const uint64_t took = shown_scan_->finished_ms - shown_scan_->started_ms;
  const uint64_t wait =
      std::max(uint64_t(options_.rescan_after.count()), took * kRescanDurationFactor);
  if (now_ms() - shown_scan_->finished_ms < wait) return;
  enqueue_scan(shown_scan_->filter, shown_scan_->filter_json, true);
  run_next();
}

std::shared_ptr<Job> Core::make_job(Job::Kind kind, parking::Filter filter,
                                    nlohmann::json filter_json) {
  auto job = std::make_shared<Job>();
  job->id = next_job_id_++;
  job->kind = kind;
  job->filter = std::move(filter);
  job->filter_json = std::move(filter_json);
  return job;
}

void Core::enqueue_scan(const parking::Filter& filter, const nlohmann::json& filter_json,
                        bool automatic) {
  // One scan waiting is enough: it takes the latest filter.
  for (auto& job : queue_) {
    if (job->kind == Job::Kind::scan) {
      job->filter = filter;
      job->filter_json = filter_json;
      job->automatic = job->automatic && automatic;
      return;
    }
  }
  auto job = make_job(Job::Kind::scan, filter, filter_json);
  job->automatic = automatic;
  queue_.push_back(std::move(job));
}

void Core::run_next() {
  if (running_ || stopping_ || !connected_ || queue_.empty()) return;
  std::shared_ptr<Job> job = std::move(queue_.front());
  queue_.pop_front();
  start_job(job);
}

void Core::start_job(const std::shared_ptr<Job>& job) {
  running_ = job;
  job->state = Job::State::running;
  job->started_ms = now_ms();
  job->started_at = consumer::unix_seconds();
  std::weak_ptr<Core> weak = weak_from_this();
  auto on_progress = [job](const parking::Progress& progress) { job->progress = progress; };
  Error error;
  switch (job->kind) {
    case Job::Kind::scan: {
      parking::StatsOptions options;
      options.filter = job->filter;
      options.keep = options_.list_limit;
      error = parking::stats(
          connection_, options_.service, options,
          [weak, job](const Error& error, const parking::Stats& stats) {
            job->stats = stats;
            if (auto self = weak.lock()) self->finish_job(job, error);
          },
          on_progress);
      break;
    }
    case Job::Kind::replay: {
      parking::ReplayOptions options;
      options.filter = job->filter;
      error = parking::replay(
          connection_, options_.service, options,
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
          connection_, options_.service, options,
          [weak, job](const Error& error, const parking::Progress& progress) {
            job->progress = progress;
            if (auto self = weak.lock()) self->finish_job(job, error);
          },
          on_progress);
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
  job->finished_at = consumer::unix_seconds();
  job->replay.reset();
  if (running_ == job) running_.reset();
  if (job->kind == Job::Kind::scan) {
    if (error) {
      scan_error_ = job->error;
    } else {
      scan_error_.clear();
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
    if (options_.logger) {
      const parking::Progress& p = job->progress;
      options_.logger->info("console: {} {} {}: read {}, {} {}, skipped {}, failed {}{}{}",
                            kind_name(job->kind), job->id,
                            error ? "failed" : (job->interrupted ? "stopped" : "done"), p.scanned,
                            job->kind == Job::Kind::replay  ? "moved"
                            : job->kind == Job::Kind::purge ? "deleted"
                                                            : "matched",
                            p.moved, p.skipped, p.failed, error ? ": " : "", job->error);
    }
    // The counts changed: scan again with the filter the page shows.
    if (job->kind != Job::Kind::count && !stopping_) {
      enqueue_scan(shown_scan_ ? shown_scan_->filter : parking::Filter{},
                   shown_scan_ ? shown_scan_->filter_json : nlohmann::json::object(), false);
    }
  }
  if (stopping_) {
    close_all();
    return;
  }
  run_next();
}

void Core::stop(bool at_once, std::function<void()> done) {
  if (done) stopped_ = std::move(done);
  stopping_ = true;
  queue_.clear();
  if (closed_) {
    if (open_parts_ == 0 && stopped_) std::move(stopped_)();
    return;
  }
  if (!at_once && running_ && running_->kind == Job::Kind::replay && running_->replay &&
      connected_) {
    running_->stop_requested = true;
    running_->replay->stop();  // finish_job closes once its copies settle
    return;
  }
  close_all();
}

void Core::close_all() {
  if (closed_) return;
  closed_ = true;
  connected_ = false;
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
  if (--open_parts_ == 0 && stopped_) std::move(stopped_)();
}

const Job* Core::pending_action() const {
  if (running_ && running_->kind != Job::Kind::scan) return running_.get();
  for (const auto& job : queue_) {
    if (job->kind != Job::Kind::scan) return job.get();
  }
  return nullptr;
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
  if (job.kind == Job::Kind::replay) out["target"] = input_queue_;
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
  for (size_t i = 0; i < stats.by_error.size() && i < kErrorGroupsShown; ++i) {
    errors.push_back({{"error", stats.by_error[i].first}, {"count", stats.by_error[i].second}});
  }
  out["by_error"] = std::move(errors);
  out["more_error_groups"] =
      stats.by_error.size() - std::min(stats.by_error.size(), kErrorGroupsShown);
  return out;
}

Reply Core::state() {
  refresh_depths();
  maybe_rescan();
  const auto& service = options_.service;
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
      {"depth_error", depth_error_},
      {"scan_error", scan_error_},
      {"now", consumer::unix_seconds()},
      {"list_limit", options_.list_limit},
      {"rescan_after_ms", options_.rescan_after.count()}};
  out["scan"] = shown_scan_ ? scan_json(*shown_scan_) : nlohmann::json(nullptr);
  nlohmann::json scanning = nullptr;
  if (running_ && running_->kind == Job::Kind::scan) scanning = job_json(*running_);
  for (const auto& job : queue_) {
    if (scanning.is_null() && job->kind == Job::Kind::scan) scanning = job_json(*job);
  }
  out["scanning"] = std::move(scanning);
  const Job* action = pending_action();
  out["job"] = action         ? job_json(*action)
               : last_action_ ? job_json(*last_action_)
                              : nlohmann::json(nullptr);
  return json_reply(out);
}

Reply Core::messages() {
  nlohmann::json list = nlohmann::json::array();
  if (!shown_scan_) return json_reply({{"scan", nullptr}, {"messages", list}});
  const auto& kept = shown_scan_->stats.messages;
  for (size_t i = 0; i < kept.size(); ++i) {
    const parking::ParkedMessage& parked = kept[i];
    const std::string& body = parked.message.body;
    const std::string preview = cut(body, kPreviewBytes);
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
         {"size", body.size()},
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
  nlohmann::json out = parking::message_json(shown, consumer::unix_seconds());
  out["scan"] = scan_id;
  out["index"] = index;
  out["body_size"] = body.size();
  out["body_truncated"] = body.size() > kBodyShownBytes;
  out["parked_at_seconds"] = optional_json(shown.parked_at);
  // Timestamp headers read as seconds in `headers`; the page shows them as times too.
  nlohmann::json times = nlohmann::json::object();
  if (shown.message.properties.headers) {
    for (const auto& entry : *shown.message.properties.headers) {
      if (const auto* time = entry.value.get_if<amqp::Timestamp>()) {
        times[entry.name] = parking::iso_time(time->seconds);
      }
    }
  }
  out["header_times"] = std::move(times);
  if (body.size() <= kBodyShownBytes && nests_at_most(body, kPrettyDepth) &&
      parking::is_utf8(body)) {
    nlohmann::json parsed = nlohmann::json::parse(body, nullptr, false);
    if (!parsed.is_discarded() && (parsed.is_object() || parsed.is_array())) {
      out["body_pretty"] = dump(parsed, 2);
    }
  }
  return json_reply(out);
}

Reply Core::request_scan(const nlohmann::json& request) {
  if (stopping_) return error_reply(503, "the console is stopping");
  const nlohmann::json filter_json =
      request.contains("filter") ? request.at("filter") : nlohmann::json::object();
  parking::Filter filter;
  try {
    filter = parse_filter(filter_json);
  } catch (const std::invalid_argument& e) {
    return error_reply(400, std::string("filter: ") + e.what());
  }
  enqueue_scan(filter, filter_json, false);
  run_next();
  return json_reply({{"queued", true}, {"connected", connected_}});
}

Reply Core::request_action(Job::Kind kind, const nlohmann::json& request, const std::string& who) {
  if (stopping_) return error_reply(503, "the console is stopping");
  if (!connected_) {
    return error_reply(503, "not connected to the broker (" + connection_error_ +
                                "); the console is reconnecting");
  }
  if (const Job* pending = pending_action()) {
    return error_reply(
        409, std::string("a ") + kind_name(pending->kind) + " is running: wait for it, or stop it");
  }
  if (!request.contains("filter")) {
    return error_reply(400, "give a filter (an empty object takes every message)");
  }
  parking::Filter filter;
  try {
    filter = parse_filter(request.at("filter"));
  } catch (const std::invalid_argument& e) {
    return error_reply(400, std::string("filter: ") + e.what());
  }
  auto job = make_job(kind, std::move(filter), request.at("filter"));
  if (options_.logger && kind != Job::Kind::count) {
    options_.logger->info("console: {} {} requested from {}, filter {}", kind_name(kind), job->id,
                          who, dump(job->filter_json));
  }
  // Before any scan that waits: the action is what the user is waiting for.
  queue_.push_front(job);
  run_next();
  return json_reply({{"job", job->id}});
}

Reply Core::stop_action() {
  const Job* pending = pending_action();
  if (!pending) return error_reply(409, "no action is running");
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if ((*it)->kind != Job::Kind::scan) {
      queue_.erase(it);
      return json_reply({{"stopped", true}});
    }
  }
  if (!running_->replay) {
    return error_reply(409, std::string("a ") + kind_name(running_->kind) +
                                " cannot be stopped halfway; it ends by itself");
  }
  running_->stop_requested = true;
  running_->replay->stop();
  return json_reply({{"stopping", true}});
}

}  // namespace retryloop::console::detail
