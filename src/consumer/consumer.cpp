#include "retryloop/consumer/consumer.hpp"
#include "retryloop/consumer/error.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <optional>
#include <random>

#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"
#include "worker_pool.hpp"

namespace retryloop::consumer {
namespace {

using client::ClientError;
using client::Error;

constexpr uint64_t kTickMs = 100;

uint64_t unix_seconds() {
  return uint64_t(std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

std::string default_consumer_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host[0] != '\0' ? host : "unknown-host") + ":" + std::to_string(getpid());
}

double random_unit() {
  thread_local std::mt19937_64 engine{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
}

/// Errors that reconnecting cannot fix: the consumer stops instead of looping. (A 406 is fatal
/// only on declare, where it means drift; later it ends the session like any channel error.)
bool is_fatal(const Error& error) {
  return error.code == make_error_code(ClientError::authentication_failed) ||
         error.code == make_error_code(ClientError::vhost_refused) ||
         error.code == make_error_code(ClientError::tls_failed) ||
         error.code == make_error_code(ConsumerError::topology_drift) || error.reply_code == 403;
}

/// The first problem of a declare report as an error naming the object.
Error declare_problem(const topology::Report& report) {
  for (const auto& result : report.results) {
    const std::string object = topology::describe(result.action);
    switch (result.outcome) {
      case topology::Outcome::drifted: {
        std::string text = object + " exists with other arguments: ";
        if (result.drift) {
          text += result.drift->argument + " is " + result.drift->actual +
                  " on the broker, the topology wants " + result.drift->wanted;
        } else {
          text += result.error.message();
        }
        return Error(ConsumerError::topology_drift,
                     text + " (fix the broker or the file; nothing was changed)");
      }
      case topology::Outcome::failed: {
        Error error = result.error;
        error.reply_text = object + ": " + error.reply_text;
        return error;
      }
      case topology::Outcome::missing:
        return Error(ConsumerError::topology_missing,
                     object + " does not exist (it is declared elsewhere)");
      default:
        break;
    }
  }
  return report.connection_error;
}

Outcome invoke(const Handler& handler, const Message& message, bool& threw) {
  try {
    return handler(message);
  } catch (const PermanentError& e) {
    threw = true;
    return Outcome::permanent(e.what());
  } catch (const std::exception& e) {
    threw = true;
    return Outcome::retry(e.what());
  } catch (...) {
    threw = true;
    return Outcome::retry("unknown exception escaped the handler");
  }
}

}  // namespace

const amqp::FieldTable& Message::headers() const {
  static const amqp::FieldTable empty;
  return properties.headers ? *properties.headers : empty;
}

std::string_view Message::message_id() const {
  return properties.message_id ? std::string_view(*properties.message_id) : std::string_view();
}

/// What a delivery gathers from the moment its handler starts. Kept apart so that the many
/// deliveries waiting for a handler (up to the prefetch) hold only their message.
struct Consumer::Handling {
  AttemptInfo info;
  uint64_t started_ns = 0;
  bool threw = false;
  Decision decision;
  /// The retry or parking copy's properties, built once.
  std::optional<amqp::BasicProperties> copy;
  uint32_t publish_tries = 0;
  /// When a nacked or returned copy is published again (uv_now ms); 0: not waiting.
  uint64_t retry_at_ms = 0;
  /// Since when its copy awaits a confirm (uv_now ms); 0: none in flight.
  uint64_t published_at_ms = 0;
  /// Held back while the broker blocks publishing.
  bool paused = false;
  /// The parking copy was made again without the original's headers (it did not fit).
  bool stripped = false;
  /// The outcome of a synchronous handler run on a worker thread.
  Outcome work_outcome;
};

/// One delivery from receipt to settlement.
struct Consumer::Pending {
  uint64_t id = 0;
  uint64_t generation = 0;
  /// The consume channel it came from: its tag is acked there or nowhere.
  std::shared_ptr<client::Channel> channel;
  uint64_t delivery_tag = 0;
  Message message;
  /// Set when its handler starts (or when it is parked undecoded).
  std::unique_ptr<Handling> handling;
};

/// One connected attempt: a consuming connection and a publishing connection.
struct Consumer::Session {
  uint64_t generation = 0;
  std::shared_ptr<client::Connection> consume_connection;
  std::shared_ptr<client::Connection> publish_connection;
  std::shared_ptr<client::Channel> consume_channel;
  std::shared_ptr<client::Channel> publish_channel;
  std::string consumer_tag;
  int connected = 0;
  bool ended = false;
};

std::shared_ptr<Consumer> Consumer::create(uv_loop_t* loop, ConsumerOptions options,
                                           Handler handler) {
  std::shared_ptr<Consumer> consumer(new Consumer(loop, std::move(options)));
  consumer->handler_ = std::make_shared<const Handler>(std::move(handler));
  return consumer;
}

std::shared_ptr<Consumer> Consumer::create(uv_loop_t* loop, ConsumerOptions options,
                                           AsyncHandler handler) {
  std::shared_ptr<Consumer> consumer(new Consumer(loop, std::move(options)));
  consumer->async_handler_ = std::move(handler);
  return consumer;
}

Consumer::Consumer(uv_loop_t* loop, ConsumerOptions options)
    : loop_(loop), options_(std::move(options)) {
  if (options_.consumer_name.empty()) options_.consumer_name = default_consumer_name();
  if (options_.concurrency == 0) options_.concurrency = 1;
}

Consumer::~Consumer() = default;

size_t Consumer::in_flight() const {
  return waiting_.size() + running_ + settling_.size();
}

size_t Consumer::handlers_running() const {
  return pool_ ? pool_->running() : 0;
}

bool Consumer::wait_for_handlers(std::chrono::milliseconds timeout) const {
  return pool_ ? pool_->wait_idle(timeout) : true;
}

Error Consumer::start() {
  if (state_ != State::idle) return Error(ClientError::invalid_argument, "start called twice");
  if ((!handler_ || !*handler_) && !async_handler_) {
    return Error(ClientError::invalid_argument, "no handler");
  }
  const auto problems = topology::validate(topology::Topology{{options_.service}});
  if (!problems.empty()) {
    return Error(ClientError::invalid_argument, "invalid service: " + to_string(problems[0]));
  }
  init_handles();
  if (handler_ && !options_.handler_on_loop) {
    pool_ = std::make_unique<detail::WorkerPool>(loop_, options_.concurrency);
    ++open_handles_;
  }
  connect_session();
  return {};
}

void Consumer::init_handles() {
  self_ = shared_from_this();
  handles_open_ = true;
  uv_timer_init(loop_, &reconnect_timer_);
  uv_timer_init(loop_, &tick_timer_);
  reconnect_timer_.data = this;
  tick_timer_.data = this;
  open_handles_ = 2;
  uv_timer_start(
      &tick_timer_, [](uv_timer_t* timer) { static_cast<Consumer*>(timer->data)->on_tick(); },
      kTickMs, kTickMs);
  last_metrics_log_ms_ = uv_now(loop_);
  if (options_.stop_on_signals) {
    for (auto [handle, signal] : {std::pair{&sigint_, SIGINT}, std::pair{&sigterm_, SIGTERM}}) {
      uv_signal_init(loop_, handle);
      handle->data = this;
      ++open_handles_;
      uv_signal_start(
          handle,
          [](uv_signal_t* h, int signum) {
            auto* self = static_cast<Consumer*>(h->data);
            if (++self->signals_seen_ == 1) {
              if (auto* log = self->options_.logger.get()) {
                log->info("service={} got {}: stopping gracefully (send it again to stop at once)",
                          self->options_.service.name, signum == SIGINT ? "SIGINT" : "SIGTERM");
              }
              self->stop(self->options_.shutdown_deadline);
            } else {
              self->stop_now();
            }
          },
          signal);
    }
  }
}

// ---- session --------------------------------------------------------------------------------

void Consumer::connect_session() {
  state_ = State::connecting;
  auto session = std::make_shared<Session>();
  session->generation = ++generation_;
  session_ = session;

  client::ConnectionOptions base = options_.connection;
  if (!base.logger) base.logger = options_.logger;
  if (base.connection_name.empty()) base.connection_name = "retryloop " + options_.service.name;
  client::ConnectionOptions consume_options = base;
  consume_options.connection_name += " (consume)";
  client::ConnectionOptions publish_options = base;
  publish_options.connection_name += " (publish)";
  session->consume_connection = client::Connection::create(loop_, consume_options);
  session->publish_connection = client::Connection::create(loop_, publish_options);

  std::weak_ptr<Consumer> weak = weak_from_this();
  std::weak_ptr<Session> weak_session = session;
  auto on_lost = [weak, weak_session](const Error& error) {
    auto self = weak.lock();
    auto s = weak_session.lock();
    if (self && s) self->session_failed(s, error);
  };
  session->publish_connection->set_blocked_handler(
      [weak, weak_session](bool blocked, const std::string& reason) {
        auto self = weak.lock();
        auto s = weak_session.lock();
        if (!self || !s || s != self->session_) return;
        if (auto* log = self->options_.logger.get()) {
          if (blocked) {
            log->warn("service={} broker blocked publishing ({}): retry and parking copies wait",
                      self->options_.service.name, reason);
          } else {
            log->info("service={} broker unblocked publishing", self->options_.service.name);
          }
        }
        self->on_blocked(blocked);
      });
  for (const auto& connection : {session->consume_connection, session->publish_connection}) {
    connection->set_lost_handler(on_lost);
    Error error = connection->connect([weak, weak_session](const Error& error) {
      auto self = weak.lock();
      auto s = weak_session.lock();
      if (!self || !s || s != self->session_ || s->ended) return;
      if (error) {
        self->session_failed(s, error);
      } else if (++s->connected == 2) {
        self->on_session_connected(s);
      }
    });
    if (error) {
      fail_fatally(error);
      return;
    }
  }
}

void Consumer::on_session_connected(const std::shared_ptr<Session>& session) {
  if (options_.declare_topology) {
    declare_topology(session);
  } else {
    open_channels(session);
  }
}

void Consumer::declare_topology(const std::shared_ptr<Session>& session) {
  topology::Plan plan = topology::make_plan(topology::Topology{{options_.service}});
  std::weak_ptr<Consumer> weak = weak_from_this();
  Error error = topology::apply(
      session->consume_connection, plan, [weak, session](const topology::Report& report) {
        auto self = weak.lock();
        if (!self || session != self->session_ || session->ended) return;
        if (report.connection_error) {
          self->session_failed(session, report.connection_error);
          return;
        }
        if (!report.ok()) {
          Error problem = declare_problem(report);
          if (is_fatal(problem) || problem.reply_code == 406) {
            self->fail_fatally(problem);
          } else {
            self->session_failed(session, problem);
          }
          return;
        }
        if (auto* log = self->options_.logger.get()) {
          for (const auto& result : report.results) {
            if (result.outcome == topology::Outcome::created) {
              log->info("service={} created {}", self->options_.service.name,
                        topology::describe(result.action));
            }
            for (const auto& missing : result.defaults_missing) {
              log->warn(
                  "service={} {} was declared without {} (new ones get {}); used as it is, see "
                  "docs/topology.md, \"Older queues\"",
                  self->options_.service.name, topology::describe(result.action), missing.argument,
                  missing.wanted);
            }
          }
        }
        self->open_channels(session);
      });
  if (error) session_failed(session, error);
}

void Consumer::open_channels(const std::shared_ptr<Session>& session) {
  std::weak_ptr<Consumer> weak = weak_from_this();
  auto watch = [weak, session](const std::shared_ptr<client::Channel>& channel) {
    channel->set_close_handler([weak, session](const Error& error) {
      if (auto self = weak.lock()) self->session_failed(session, error);
    });
  };
  Error error = session->publish_connection->open_channel(
      [this, weak, session, watch](const Error& error, std::shared_ptr<client::Channel> channel) {
        auto self = weak.lock();
        if (!self || session != session_ || session->ended) return;
        if (error) return session_failed(session, error);
        session->publish_channel = channel;
        watch(channel);
        Error e = channel->confirm_select([this, weak, session, watch](const Error& error) {
          auto self = weak.lock();
          if (!self || session != session_ || session->ended) return;
          if (error) return session_failed(session, error);
          Error e = session->consume_connection->open_channel(
              [this, weak, session, watch](const Error& error,
                                           std::shared_ptr<client::Channel> channel) {
                auto self = weak.lock();
                if (!self || session != session_ || session->ended) return;
                if (error) return session_failed(session, error);
                session->consume_channel = channel;
                watch(channel);
                Error e =
                    channel->qos(options_.prefetch, [this, weak, session](const Error& error) {
                      auto self = weak.lock();
                      if (!self || session != session_ || session->ended) return;
                      if (error) return session_failed(session, error);
                      start_consuming(session);
                    });
                if (e) session_failed(session, e);
              });
          if (e) session_failed(session, e);
        });
        if (e) session_failed(session, e);
      });
  if (error) session_failed(session, error);
}

void Consumer::start_consuming(const std::shared_ptr<Session>& session) {
  std::weak_ptr<Consumer> weak = weak_from_this();
  std::weak_ptr<Session> weak_session = session;
  client::ConsumeOptions consume_options;
  consume_options.on_cancel = [weak, weak_session](const std::string&) {
    auto self = weak.lock();
    auto s = weak_session.lock();
    if (!self || !s) return;
    self->session_failed(
        s, Error(ClientError::consumer_cancelled,
                 "was queue " + topology::input_queue_name(self->options_.service) + " deleted?"));
  };
  const std::string& queue = topology::input_queue_name(options_.service);
  Error error = session->consume_channel->consume(
      queue, std::move(consume_options),
      [weak, weak_session](client::Delivery&& delivery) {
        auto self = weak.lock();
        auto s = weak_session.lock();
        if (!self || !s || s != self->session_ || s->ended) return;
        self->on_delivery(std::move(delivery));
      },
      [this, weak, session](const Error& error, const std::string& tag) {
        auto self = weak.lock();
        if (!self || session != session_ || session->ended) return;
        if (error) return session_failed(session, error);
        session->consumer_tag = tag;
        state_ = State::running;
        reconnect_attempt_ = 0;
        if (ever_ready_) ++metrics_.reconnects;
        ever_ready_ = true;
        if (auto* log = options_.logger.get()) {
          log->info("service={} queue={} consuming (prefetch {}, concurrency {}, mode {})",
                    options_.service.name, topology::input_queue_name(options_.service),
                    options_.prefetch, options_.concurrency,
                    topology::to_string(options_.service.retry.mode));
        }
        if (on_ready_) on_ready_();
      });
  if (error) session_failed(session, error);
}

void Consumer::session_failed(const std::shared_ptr<Session>& session, const Error& error) {
  if (session != session_ || session->ended) return;
  if (state_ == State::stopping) {
    close_session([this] { close_handles(); });
    return;
  }
  if (is_fatal(error)) {
    fail_fatally(error);
    return;
  }
  if (auto* log = options_.logger.get()) {
    log->warn("service={} session lost: {}; reconnecting", options_.service.name, error.message());
  }
  close_session();
  state_ = State::backing_off;
  schedule_reconnect();
}

void Consumer::fail_fatally(const Error& error) {
  if (state_ == State::stopped) return;
  if (auto* log = options_.logger.get()) {
    log->error("service={} stopping: {}", options_.service.name, error.message());
  }
  fatal_error_ = error;
  state_ = State::stopping;
  uv_timer_stop(&reconnect_timer_);
  close_session([this] { close_handles(); });
}

void Consumer::close_session(std::function<void()> done) {
  std::shared_ptr<Session> session = std::move(session_);
  session_.reset();
  waiting_.clear();  // unacked: the broker requeues them when the channel closes
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> settling = std::move(settling_);
  settling_.clear();
  blocked_ = false;
  if (!session) {
    if (done) done();
    return;
  }
  session->ended = true;
  auto remaining = std::make_shared<int>(2);
  auto closed = [remaining, done](const Error&) {
    if (--*remaining == 0 && done) done();
  };
  session->consume_connection->close(closed);
  session->publish_connection->close(closed);
}

void Consumer::schedule_reconnect() {
  const auto delay = options_.recovery.delay(reconnect_attempt_++, random_unit());
  if (auto* log = options_.logger.get()) {
    log->info("service={} reconnecting in {} ms", options_.service.name, delay.count());
  }
  uv_timer_start(
      &reconnect_timer_,
      [](uv_timer_t* timer) {
        auto* self = static_cast<Consumer*>(timer->data);
        if (self->state_ == State::backing_off) self->connect_session();
      },
      uint64_t(delay.count()), 0);
}

// ---- deliveries -------------------------------------------------------------------------------

void Consumer::on_delivery(client::Delivery&& delivery) {
  ++metrics_.delivered;
  if (delivery.redelivered) ++metrics_.redelivered;
  auto pending = std::make_shared<Pending>();
  pending->id = next_pending_id_++;
  pending->generation = session_->generation;
  pending->channel = session_->consume_channel;
  pending->delivery_tag = delivery.delivery_tag;
  if (state_ == State::stopping) {  // arrived between basic.cancel and cancel-ok
    (void)pending->channel->nack(pending->delivery_tag, false, true);
    return;
  }
  Message& message = pending->message;
  message.body = std::move(delivery.message.body);
  message.properties = std::move(delivery.message.properties);
  message.exchange = std::move(delivery.exchange);
  message.routing_key = std::move(delivery.routing_key);
  message.redelivered = delivery.redelivered;
  if (delivery.message.properties_error) {
    begin_handling(*pending);
    park_undecodable(pending, delivery.message);
    return;
  }
  waiting_.push_back(std::move(pending));
  start_handlers();
}

std::string Consumer::over_delivery_limit(const AttemptInfo& info) const {
  const char* what =
      " (its consumer crashed, stalled or gave it back each time); its handler was "
      "not run again";
  if (info.delivery_limited > 0) {
    return "the broker dead-lettered it for going back unsettled more often than the queue's "
           "delivery limit" +
           std::string(what);
  }
  if (options_.service.queue_type != topology::QueueType::quorum) return {};
  const int64_t limit = options_.service.delivery_limit.value_or(topology::default_delivery_limit);
  if (info.delivery_count < limit) return {};
  return "delivered " + std::to_string(info.delivery_count) +
         " times before without being settled, the service's delivery_limit is " +
         std::to_string(limit) + what;
}

void Consumer::begin_handling(Pending& pending) {
  pending.handling = std::make_unique<Handling>();
  Message& message = pending.message;
  pending.handling->info =
      read_attempt_info(message.properties, topology::input_queue_name(options_.service),
                        message.exchange, message.routing_key);
  message.attempt = pending.handling->info.attempt;
}

void Consumer::park_undecodable(const std::shared_ptr<Pending>& pending,
                                const client::Message& original) {
  // No handler can be given what cannot be read, and no retry can count its attempts: it is
  // parked at once, its property bytes kept whole in a header, persistent like it may have been.
  amqp::BasicProperties& properties = pending->message.properties;
  properties.delivery_mode = 2;
  properties.headers.emplace().set(std::string(header::raw_properties),
                                   amqp::ByteArray{original.raw_properties});
  Decision& decision = pending->handling->decision;
  decision.action = Action::park;
  decision.reason = ParkReason::poison;
  decision.error = "its properties cannot be decoded (" + original.properties_error.message() +
                   "); their bytes are in " + std::string(header::raw_properties);
  settling_[pending->id] = pending;
  publish_copy(pending);
}

void Consumer::start_handlers() {
  if (dispatching_) return;  // the outer call's loop picks up what was added
  dispatching_ = true;
  while (running_ < options_.concurrency && !waiting_.empty() && state_ != State::stopping) {
    std::shared_ptr<Pending> pending = std::move(waiting_.front());
    waiting_.pop_front();
    run_handler(pending);
  }
  dispatching_ = false;
}

void Consumer::run_handler(const std::shared_ptr<Pending>& pending) {
  begin_handling(*pending);
  if (std::string why = over_delivery_limit(pending->handling->info); !why.empty()) {
    Decision& decision = pending->handling->decision;
    decision.action = Action::park;
    decision.reason = ParkReason::delivery_limit;
    decision.error = std::move(why);
    carry_out(pending);
    return;
  }
  ++running_;
  pending->handling->started_ns = uv_hrtime();
  if (async_handler_) {
    std::weak_ptr<Consumer> weak = weak_from_this();
    auto settled = std::make_shared<bool>(false);
    Settle settle = [weak, pending, settled](Outcome outcome) {
      if (*settled) return;
      *settled = true;
      if (auto self = weak.lock()) self->handler_done(pending, std::move(outcome));
    };
    try {
      async_handler_(pending->message, settle);
    } catch (const PermanentError& e) {
      ++metrics_.handler_errors;
      settle(Outcome::permanent(e.what()));
    } catch (const std::exception& e) {
      ++metrics_.handler_errors;
      settle(Outcome::retry(e.what()));
    } catch (...) {
      ++metrics_.handler_errors;
      settle(Outcome::retry("unknown exception escaped the handler"));
    }
    return;
  }
  if (options_.handler_on_loop) {
    Outcome outcome = invoke(*handler_, pending->message, pending->handling->threw);
    handler_done(pending, std::move(outcome));
    return;
  }
  std::weak_ptr<Consumer> weak = weak_from_this();
  pool_->post(
      [pending, handler = handler_] {
        pending->handling->work_outcome =
            invoke(*handler, pending->message, pending->handling->threw);
      },
      [weak, pending] {
        if (auto self = weak.lock())
          self->handler_done(pending, std::move(pending->handling->work_outcome));
      });
}

void Consumer::handler_done(const std::shared_ptr<Pending>& pending, Outcome outcome) {
  --running_;
  metrics_.handler_latency.record(
      std::chrono::nanoseconds(uv_hrtime() - pending->handling->started_ns));
  if (pending->handling->threw) ++metrics_.handler_errors;
  if (!is_live(*pending)) {
    ++metrics_.abandoned;
    log_outcome(*pending, "abandoned",
                "its channel closed while the handler ran; the broker redelivers it");
  } else {
    pending->handling->decision = decide(options_.service, pending->handling->info, outcome);
    carry_out(pending);
  }
  start_handlers();
  maybe_finish_stop();
}

bool Consumer::is_live(const Pending& pending) const {
  return session_ && !session_->ended && pending.generation == session_->generation &&
         pending.channel && pending.channel->is_open();
}

void Consumer::carry_out(const std::shared_ptr<Pending>& pending) {
  const Decision& decision = pending->handling->decision;
  switch (decision.action) {
    case Action::ack:
    case Action::drop:
      if (pending->channel->ack(pending->delivery_tag)) {
        ++metrics_.abandoned;
        return;
      }
      if (decision.action == Action::ack) {
        ++metrics_.acked;
        log_outcome(*pending, "acked", {});
      } else {
        ++metrics_.dropped;
        log_outcome(*pending, "dropped", decision.error);
      }
      return;
    case Action::reject_to_wait:
      if (pending->channel->reject(pending->delivery_tag, false)) {
        ++metrics_.abandoned;
        return;
      }
      ++metrics_.retried;
      log_outcome(*pending, "retry", decision.error);
      return;
    case Action::publish_to_wait:
    case Action::park:
      settling_[pending->id] = pending;
      publish_copy(pending);
      return;
  }
}

void Consumer::publish_copy(const std::shared_ptr<Pending>& pending) {
  if (!is_live(*pending) || !session_->publish_channel) {
    settling_.erase(pending->id);
    ++metrics_.abandoned;
    return;
  }
  if (blocked_) {
    pending->handling->paused = true;
    return;
  }
  pending->handling->paused = false;
  const Decision& decision = pending->handling->decision;
  const bool to_wait = decision.action == Action::publish_to_wait;
  if (!pending->handling->copy) {
    if (to_wait) {
      pending->handling->copy =
          make_retry_copy(pending->message.properties, pending->handling->info, unix_seconds());
    } else {
      ParkingNote note;
      note.reason = decision.reason;
      note.error = decision.error;
      note.queue = topology::input_queue_name(options_.service);
      note.consumer = options_.consumer_name;
      note.now_seconds = unix_seconds();
      pending->handling->copy =
          make_parking_copy(pending->message.properties, pending->handling->info, note);
    }
  }
  const std::string exchange = to_wait ? topology::wait_exchange_name(options_.service.name)
                                       : topology::parking_exchange_name(options_.service.name);
  const std::string& routing_key =
      to_wait ? decision.wait_routing_key : topology::input_queue_name(options_.service);
  pending->handling->published_at_ms = uv_now(loop_);
  std::weak_ptr<Consumer> weak = weak_from_this();
  Error error = session_->publish_channel->publish(
      exchange, routing_key, *pending->handling->copy, pending->message.body,
      client::Mandatory::yes, [weak, pending](const client::PublishOutcome& outcome) {
        auto self = weak.lock();
        if (!self) return;
        pending->handling->published_at_ms = 0;
        if (outcome.ok()) {
          self->copy_confirmed(pending);
          return;
        }
        if (outcome.status == client::PublishStatus::failed) {
          // The session is ending; the original is redelivered.
          if (self->settling_.erase(pending->id) != 0) ++self->metrics_.abandoned;
          self->maybe_finish_stop();
          return;
        }
        ++self->metrics_.publish_failures;
        const auto delay =
            self->options_.publish_retry.delay(pending->handling->publish_tries++, random_unit());
        pending->handling->retry_at_ms = uv_now(self->loop_) + uint64_t(delay.count());
        std::string why = outcome.status == client::PublishStatus::returned
                              ? "returned: " + outcome.error.message()
                              : std::string(
                                    "nacked by the broker (a full queue with "
                                    "reject-publish, or a broker error)");
        if (auto* log = self->options_.logger.get()) {
          log->warn(
              "service={} queue={} message_id={} attempt={} {} copy {}; the original stays "
              "unacked, publishing again in {} ms",
              self->options_.service.name, topology::input_queue_name(self->options_.service),
              pending->message.message_id(), pending->handling->info.attempt,
              pending->handling->decision.action == Action::park ? "parking" : "retry", why,
              delay.count());
        }
      });
  if (error.code == make_error_code(ClientError::properties_too_large)) {
    copy_too_large(pending, error);
  } else if (error) {
    session_failed(session_, error);
  }
}

void Consumer::copy_too_large(const std::shared_ptr<Pending>& pending, const Error& error) {
  // The same message would fail the same way after any reconnect, so it must end here. First
  // retryloop-error is shortened, half at a time, to what fits.
  Handling& handling = *pending->handling;
  amqp::BasicProperties& copy = *handling.copy;
  amqp::FieldValue* value = copy.headers ? copy.headers->find(header::error) : nullptr;
  std::string* text = value ? value->get_if<std::string>() : nullptr;
  if (text != nullptr && !text->empty()) {
    *text = truncate_utf8(*text, text->size() / 2);
    publish_copy(pending);
    return;
  }
  auto* log = options_.logger.get();
  const bool to_wait = handling.decision.action == Action::publish_to_wait;
  ++metrics_.copies_too_large;
  if (to_wait) {
    // A retry by reject instead: Q dead-letters it into its first wait queue inside the broker,
    // where no frame_max applies, and it comes back with every byte and one more attempt counted
    // by x-death, so the attempt cap still ends it (in parking, below).
    if (reject_uncopyable(pending)) {
      ++metrics_.retried;
      if (log) {
        log->warn(
            "service={} queue={} message_id={} attempt={} outcome=retry via=reject "
            "error=\"its retry copy cannot be published ({})\"",
            options_.service.name, topology::input_queue_name(options_.service),
            pending->message.message_id(), handling.info.attempt, error.message());
      }
    }
    maybe_finish_stop();
    return;
  }
  // A reject would bring it back through the wait queue, to fail again. It is parked without the
  // original's headers (or raw property bytes) that do not fit, and retryloop-error says so.
  if (copy.headers && copy.headers->size() > 0 && !handling.stripped) {
    handling.stripped = true;
    amqp::BasicProperties bare = pending->message.properties;
    bare.headers.reset();
    ParkingNote note;
    note.reason = handling.decision.reason;
    note.error = "its headers were removed, the copy needs a header frame over frame_max (" +
                 error.message() + "); " + handling.decision.error;
    note.queue = topology::input_queue_name(options_.service);
    note.consumer = options_.consumer_name;
    note.now_seconds = unix_seconds();
    handling.copy = make_parking_copy(bare, handling.info, note);
    if (log) {
      log->error(
          "service={} queue={} message_id={} attempt={} parking copy too large ({}); "
          "parking it without its headers",
          options_.service.name, topology::input_queue_name(options_.service),
          pending->message.message_id(), handling.info.attempt, error.message());
    }
    publish_copy(pending);
    return;
  }
  // Not even that fits (frame_max far below what the remaining properties need): the original
  // is rejected; the broker's dead-lettering keeps it whole.
  if (reject_uncopyable(pending) && log) {
    log->error(
        "service={} queue={} message_id={} attempt={} no parking copy fits ({}); rejected "
        "to the wait queue",
        options_.service.name, topology::input_queue_name(options_.service),
        pending->message.message_id(), handling.info.attempt, error.message());
  }
  maybe_finish_stop();
}

bool Consumer::reject_uncopyable(const std::shared_ptr<Pending>& pending) {
  settling_.erase(pending->id);
  const bool rejected = !pending->channel->reject(pending->delivery_tag, false);
  if (!rejected) ++metrics_.abandoned;
  return rejected;
}

void Consumer::count_parked(ParkReason reason) {
  switch (reason) {
    case ParkReason::exhausted:
      ++metrics_.parked_exhausted;
      break;
    case ParkReason::permanent:
      ++metrics_.parked_permanent;
      break;
    case ParkReason::poison:
      ++metrics_.parked_poison;
      break;
    case ParkReason::delivery_limit:
      ++metrics_.parked_delivery_limit;
      break;
  }
}

void Consumer::copy_confirmed(const std::shared_ptr<Pending>& pending) {
  if (settling_.erase(pending->id) == 0) return;
  if (!is_live(*pending) || pending->channel->ack(pending->delivery_tag)) {
    // Copied but not acked: the original comes back too (a duplicate, never a loss).
    ++metrics_.abandoned;
    maybe_finish_stop();
    return;
  }
  const Decision& decision = pending->handling->decision;
  if (decision.action == Action::publish_to_wait) {
    ++metrics_.retried;
    log_outcome(*pending, "retry", decision.error);
  } else {
    count_parked(decision.reason);
    log_outcome(*pending, "parked", decision.error);
    depth_check_soon_ = true;
    if (options_.on_parked) {
      ParkedEvent event;
      event.service = options_.service.name;
      event.message_id = std::string(pending->message.message_id());
      event.reason = decision.reason;
      event.error = decision.error;
      event.attempts = pending->handling->info.attempt;
      options_.on_parked(event);
    }
  }
  maybe_finish_stop();
}

void Consumer::log_outcome(const Pending& pending, const char* what,
                           const std::string& text) const {
  auto* log = options_.logger.get();
  if (log == nullptr) return;
  const Decision& decision = pending.handling->decision;
  const auto level = std::string_view(what) == "acked" ? spdlog::level::debug
                     : std::string_view(what) == "parked" || std::string_view(what) == "abandoned"
                         ? spdlog::level::warn
                         : spdlog::level::info;
  if (!log->should_log(level)) return;
  std::string detail;
  if (std::string_view(what) == "retry") {
    detail = decision.action == Action::reject_to_wait
                 ? " via=reject"
                 : " via=republish delay=" + decision.wait_routing_key;
  } else if (std::string_view(what) == "parked") {
    detail = std::string(" reason=") + to_string(decision.reason);
  }
  log->log(level, "service={} queue={} message_id={} attempt={} outcome={}{}{}{}",
           options_.service.name, topology::input_queue_name(options_.service),
           pending.message.message_id(), pending.handling->info.attempt, what, detail,
           text.empty() ? "" : " error=", text.empty() ? std::string() : "\"" + text + "\"");
}

// ---- timers, flow control, stopping -------------------------------------------------------------

void Consumer::on_tick() {
  const uint64_t now = uv_now(loop_);
  if (state_ == State::stopping && stop_deadline_ms_ != 0 && now >= stop_deadline_ms_) {
    if (auto* log = options_.logger.get()) {
      log->warn(
          "service={} shutdown deadline passed with {} messages unsettled; they go back "
          "to the queue",
          options_.service.name, in_flight());
    }
    stop_deadline_ms_ = 0;
    stop_now();
    return;
  }
  if (options_.metrics_interval.count() > 0 &&
      now - last_metrics_log_ms_ >= uint64_t(options_.metrics_interval.count())) {
    last_metrics_log_ms_ = now;
    if (auto* log = options_.logger.get()) {
      log->info("service={} metrics {}", options_.service.name, metrics_.summary());
    }
  }
  if (options_.parking_alert_threshold > 0 && state_ == State::running && !depth_check_in_flight_ &&
      now - last_depth_check_ms_ >=
          (depth_check_soon_ ? 1000 : uint64_t(options_.parking_check_interval.count()))) {
    check_parking_depth();
  }
  if (!session_ || blocked_) return;
  std::vector<std::shared_ptr<Pending>> due;
  for (const auto& [id, pending] : settling_) {
    if (pending->handling->published_at_ms != 0 &&
        now - pending->handling->published_at_ms >= uint64_t(options_.confirm_timeout.count())) {
      session_failed(session_, Error(ClientError::connection_lost,
                                     "no publisher confirm within " +
                                         std::to_string(options_.confirm_timeout.count()) + " ms"));
      return;
    }
    if (pending->handling->retry_at_ms != 0 && now >= pending->handling->retry_at_ms)
      due.push_back(pending);
  }
  for (const auto& pending : due) {
    pending->handling->retry_at_ms = 0;
    publish_copy(pending);
  }
}

void Consumer::check_parking_depth() {
  last_depth_check_ms_ = uv_now(loop_);
  depth_check_soon_ = false;
  depth_check_in_flight_ = true;
  std::weak_ptr<Consumer> weak = weak_from_this();
  const std::string queue = topology::parking_queue_name(options_.service.name);
  auto finished = [weak, queue](const Error& error, const client::QueueInfo& info) {
    auto self = weak.lock();
    if (!self) return;
    self->depth_check_in_flight_ = false;
    if (error) return;  // tried again at the next interval
    const uint32_t depth = info.message_count;
    const uint32_t threshold = self->options_.parking_alert_threshold;
    const bool above = depth > threshold;
    if (above && !self->above_threshold_) {
      if (auto* log = self->options_.logger.get()) {
        log->warn("service={} queue={} parking depth {} is above {}", self->options_.service.name,
                  queue, depth, threshold);
      }
      if (self->options_.on_parking_depth) {
        self->options_.on_parking_depth(
            ParkingDepthEvent{self->options_.service.name, queue, depth, threshold});
      }
    }
    self->above_threshold_ = above;
  };
  client::look_up_queue(session_->consume_connection, queue, std::move(finished));
}

void Consumer::on_blocked(bool blocked) {
  blocked_ = blocked;
  if (blocked) return;
  const uint64_t now = uv_now(loop_);
  std::vector<std::shared_ptr<Pending>> paused;
  for (const auto& [id, pending] : settling_) {
    if (pending->handling->published_at_ms != 0)
      pending->handling->published_at_ms = now;  // time blocked is not late
    if (pending->handling->paused) paused.push_back(pending);
  }
  for (const auto& pending : paused)
    publish_copy(pending);
}

void Consumer::stop(std::chrono::milliseconds deadline) {
  switch (state_) {
    case State::idle:
      state_ = State::stopped;
      if (on_stopped_) on_stopped_(Error{});
      return;
    case State::stopping:
    case State::stopped:
      return;
    case State::connecting:
    case State::backing_off:
      state_ = State::stopping;
      uv_timer_stop(&reconnect_timer_);
      close_session([this] { close_handles(); });
      return;
    case State::running:
      break;
  }
  state_ = State::stopping;
  stop_deadline_ms_ = uv_now(loop_) + uint64_t(std::max<int64_t>(deadline.count(), 0));
  if (auto* log = options_.logger.get()) {
    log->info("service={} stopping: {} handlers running, {} copies settling, {} waiting go back",
              options_.service.name, running_, settling_.size(), waiting_.size());
  }
  for (const auto& pending : waiting_)
    (void)pending->channel->nack(pending->delivery_tag, false, true);
  waiting_.clear();
  std::weak_ptr<Consumer> weak = weak_from_this();
  (void)session_->consume_channel->cancel(session_->consumer_tag, [weak](const Error&) {
    if (auto self = weak.lock()) self->maybe_finish_stop();
  });
  maybe_finish_stop();
}

void Consumer::stop_now() {
  if (state_ == State::stopped) return;
  if (state_ == State::idle) {
    stop(std::chrono::milliseconds(0));
    return;
  }
  state_ = State::stopping;
  uv_timer_stop(&reconnect_timer_);
  close_session([this] { close_handles(); });
}

void Consumer::maybe_finish_stop() {
  if (state_ != State::stopping || !session_ || running_ != 0 || !settling_.empty()) return;
  if (auto* log = options_.logger.get()) {
    log->info("service={} stopped gracefully; {}", options_.service.name, metrics_.summary());
  }
  close_session([this] { close_handles(); });
}

void Consumer::close_handles() {
  if (!handles_open_) return;
  handles_open_ = false;
  auto on_closed = [](uv_handle_t* handle) {
    static_cast<Consumer*>(handle->data)->on_handle_closed();
  };
  uv_close(reinterpret_cast<uv_handle_t*>(&reconnect_timer_), on_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&tick_timer_), on_closed);
  if (options_.stop_on_signals) {
    uv_close(reinterpret_cast<uv_handle_t*>(&sigint_), on_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&sigterm_), on_closed);
  }
  if (pool_) pool_->close(options_.handler_exit_timeout, [this] { on_handle_closed(); });
}

void Consumer::on_handle_closed() {
  if (--open_handles_ != 0) return;
  state_ = State::stopped;  // pool_ stays, for wait_for_handlers()
  std::shared_ptr<Consumer> keep_alive = std::move(self_);
  StoppedHandler handler = std::move(on_stopped_);
  if (handler) handler(fatal_error_);
}

}  // namespace retryloop::consumer
