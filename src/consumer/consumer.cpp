#include "retryloop/consumer/consumer.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <system_error>

#include "consumer_impl.hpp"
#include "retryloop/amqp/printable.hpp"
#include "retryloop/consumer/detail/instance_id.hpp"
#include "retryloop/random/os_random.hpp"
#include "retryloop/topology/duration.hpp"
#include "retryloop/topology/plan.hpp"

namespace retryloop::consumer {
namespace {

using client::ClientError;
using client::Error;

constexpr uint64_t kTickMs = 100;

std::string default_consumer_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host[0] != '\0' ? host : "unknown-host") + ":" + std::to_string(getpid());
}

SpanEnd begin_span(const SpanStart& start_span, const Message& message,
                   const std::optional<TraceContext>& trace) {
  if (!start_span) return {};
  try {
    return start_span(message, trace);
  } catch (...) {
    return {};
  }
}

Outcome invoke(const Handler& handler, const ExceptionPolicy& exceptions, const Message& message,
               bool& threw) {
  try {
    return handler(message);
  } catch (...) {
    threw = true;
    return exceptions.classify(std::current_exception());
  }
}

}  // namespace

namespace detail {

std::string instance_id() {
  static std::atomic<uint64_t> consumers{0};
  std::error_code error;
  std::string random = random::random_id(error);
  if (error) {
    // The source failed: the monotonic clock's nanoseconds tell two processes apart as well.
    char digits[17] = {};
    std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(uv_hrtime()));
    random = digits + 8;
  }
  return default_consumer_name() + "#" + std::to_string(++consumers) + "." + random.substr(0, 8);
}

}  // namespace detail

const amqp::FieldTable& Message::headers() const {
  static const amqp::FieldTable empty;
  return properties.headers ? *properties.headers : empty;
}

std::string_view Message::message_id() const {
  return properties.message_id ? std::string_view(*properties.message_id) : std::string_view();
}

std::optional<TraceContext> Message::trace_context() const {
  return retry::trace_context(headers());
}

const char* to_string(Settlement settlement) {
  switch (settlement) {
    case Settlement::acked:
      return "acked";
    case Settlement::dropped:
      return "dropped";
    case Settlement::retried:
      return "retried";
    case Settlement::parked:
      return "parked";
    case Settlement::abandoned:
      return "abandoned";
    case Settlement::held:
      return "held";
  }
  return "unknown";
}

const char* to_string(ConsumerState state) {
  switch (state) {
    case ConsumerState::not_started:
      return "not_started";
    case ConsumerState::connecting:
      return "connecting";
    case ConsumerState::consuming:
      return "consuming";
    case ConsumerState::reconnecting:
      return "reconnecting";
    case ConsumerState::stopping:
      return "stopping";
    case ConsumerState::stopped:
      return "stopped";
  }
  return "unknown";
}

namespace detail {

ConsumerImpl::ConsumerImpl(uv_loop_t* loop, ConsumerOptions options)
    : options_(std::move(options)),
      loop_(loop),
      parking_depth_(options_),
      breaker_(options_.service.outage, int(std::max<uint32_t>(options_.concurrency, 1)),
               [this](const outage::Event& event) { breaker_events_.push_back(event); }),
      coordinator_(breaker_, instance_id()) {
  if (options_.consumer_name.empty()) options_.consumer_name = default_consumer_name();
  if (options_.concurrency == 0) options_.concurrency = 1;
  exceptions_ = std::make_shared<const ExceptionPolicy>(options_.exceptions);
  start_span_ = std::make_shared<const SpanStart>(options_.start_span);
}

ConsumerImpl::~ConsumerImpl() = default;

ConsumerState ConsumerImpl::state() const {
  switch (state_) {
    case State::idle:
      return ConsumerState::not_started;
    case State::connecting:
    case State::backing_off:
      return ever_ready_ ? ConsumerState::reconnecting : ConsumerState::connecting;
    case State::running:
      return ConsumerState::consuming;
    case State::stopping:
      return ConsumerState::stopping;
    case State::stopped:
      return ConsumerState::stopped;
  }
  return ConsumerState::stopped;
}

size_t ConsumerImpl::in_flight() const {
  return waiting_.size() + running_ + settling_.size();
}

size_t ConsumerImpl::handlers_running() const {
  return pool_ ? pool_->running() : 0;
}

bool ConsumerImpl::wait_for_handlers(std::chrono::milliseconds timeout) const {
  return pool_ ? pool_->wait_idle(timeout) : true;
}

Error ConsumerImpl::start() {
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
    pool_ = std::make_unique<WorkerPool>(loop_, options_.concurrency);
    ++open_handles_;
  } else if (options_.probe) {
    probe_pool_ = std::make_unique<WorkerPool>(loop_, 1);
    ++open_handles_;
  }
  connect_session();
  return {};
}

void ConsumerImpl::init_handles() {
  self_ = shared_from_this();
  handles_open_ = true;
  uv_timer_init(loop_, &reconnect_timer_);
  uv_timer_init(loop_, &tick_timer_);
  reconnect_timer_.data = this;
  tick_timer_.data = this;
  open_handles_ = 2;
  uv_timer_start(
      &tick_timer_, [](uv_timer_t* timer) { static_cast<ConsumerImpl*>(timer->data)->on_tick(); },
      kTickMs, kTickMs);
  last_metrics_log_ms_ = uv_now(loop_);
  if (options_.stop_on_signals) {
    ++open_handles_;
    std::weak_ptr<ConsumerImpl> weak = weak_from_this();
    signals_ = std::make_unique<process::StopSignals>(
        loop_,
        [weak](int signum) {
          auto self = weak.lock();
          if (!self) return;
          if (auto* log = self->options_.logger.get()) {
            log->info("service={} got {}: stopping gracefully (send it again to stop at once)",
                      self->options_.service.name, signum == SIGINT ? "SIGINT" : "SIGTERM");
          }
          self->stop(self->options_.shutdown_deadline);
        },
        [weak] {
          if (auto self = weak.lock()) self->stop_now();
        });
  }
}

// ---- session --------------------------------------------------------------------------------

void ConsumerImpl::connect_session() {
  state_ = State::connecting;
  std::weak_ptr<ConsumerImpl> weak = weak_from_this();
  SessionEvents events;
  events.ready = [weak] {
    if (auto self = weak.lock()) self->session_ready();
  };
  events.failed = [weak](const Error& error, bool fatal) {
    if (auto self = weak.lock()) self->session_failed(error, fatal);
  };
  events.delivery = [weak](client::Delivery&& delivery) {
    if (auto self = weak.lock()) self->on_delivery(std::move(delivery));
  };
  events.blocked = [weak](bool blocked, const std::string& reason) {
    if (auto self = weak.lock()) self->on_blocked(blocked, reason);
  };
  events.left = [weak](const void* mark) {
    if (auto self = weak.lock()) self->give_back(mark);
  };
  events.drifted = [weak](const std::string& text) {
    auto self = weak.lock();
    if (!self || self->drift_logged_) return;
    self->drift_logged_ = true;
    if (auto* log = self->options_.logger.get()) {
      log->warn("service={} {}", self->options_.service.name, text);
    }
  };
  session_ = Session::start(loop_, options_, ++generation_, std::move(events));
}

void ConsumerImpl::session_ready() {
  state_ = State::running;
  reconnect_attempt_ = 0;
  if (ever_ready_) ++metrics_.reconnects;
  ever_ready_ = true;
  if (auto* log = options_.logger.get()) {
    if (breaker_.state() == outage::State::closed) {
      log->info("service={} queue={} consuming (prefetch {}, concurrency {}, mode {})",
                options_.service.name, topology::input_queue_name(options_.service),
                options_.prefetch, options_.concurrency,
                topology::to_string(options_.service.retry.mode));
    } else {
      log->info(
          "service={} queue={} consuming; the breaker is {}: deliveries are held, "
          "uncharged, until it lets calls through",
          options_.service.name, topology::input_queue_name(options_.service),
          outage::to_string(breaker_.state()));
    }
  }
  if (on_ready_) on_ready_();
  link_breaker();
  start_handlers();
}

void ConsumerImpl::session_failed(const Error& error, bool fatal) {
  if (state_ == State::stopping) {
    close_session([this] { close_handles(); });
    return;
  }
  if (fatal) {
    fail_fatally(error);
    return;
  }
  if (auto* log = options_.logger.get()) {
    log->warn("service={} session lost: {}; reconnecting", options_.service.name, error.message());
  }
  // With several hosts, the next session tries the host this one was on last; the first try
  // after losing a working session goes at once, since it goes to another node. Only a failed
  // try waits for the recovery backoff.
  const bool several_hosts = !options_.connection.uri.other_hosts.empty();
  if (session_ && several_hosts) {
    const client::Uri& on = session_->consume_connection()->uri();
    options_.connection.uri = options_.connection.uri.with_last(client::Endpoint{on.host, on.port});
  }
  const bool elsewhere_at_once = several_hosts && state_ == State::running;
  close_session();
  state_ = State::backing_off;
  schedule_reconnect(elsewhere_at_once);
}

void ConsumerImpl::fail_fatally(const Error& error) {
  if (state_ == State::stopped) return;
  if (auto* log = options_.logger.get()) {
    log->error("service={} stopping: {}", options_.service.name, error.message());
  }
  fatal_error_ = error;
  state_ = State::stopping;
  uv_timer_stop(&reconnect_timer_);
  close_session([this] { close_handles(); });
}

void ConsumerImpl::close_session(std::function<void()> done) {
  unlink_breaker();
  std::shared_ptr<Session> session = std::move(session_);
  session_.reset();
  waiting_.clear();  // unacked: the broker requeues them when the channel closes
  withdraw_handlers();
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> settling = std::move(settling_);
  settling_.clear();
  for (const auto& [id, pending] : settling)
    end_span(*pending, Settlement::abandoned);
  blocked_ = false;
  if (!session) {
    if (done) done();
    return;
  }
  session->close(std::move(done));
}

void ConsumerImpl::schedule_reconnect(bool at_once) {
  const auto delay =
      at_once ? std::chrono::milliseconds(0) : options_.recovery.delay(reconnect_attempt_++);
  if (auto* log = options_.logger.get()) {
    log->info("service={} reconnecting in {} ms", options_.service.name, delay.count());
  }
  uv_timer_start(
      &reconnect_timer_,
      [](uv_timer_t* timer) {
        auto* self = static_cast<ConsumerImpl*>(timer->data);
        if (self->state_ == State::backing_off) self->connect_session();
      },
      uint64_t(delay.count()), 0);
}

// ---- deliveries -------------------------------------------------------------------------------

void ConsumerImpl::on_delivery(client::Delivery&& delivery) {
  ++metrics_.delivered;
  if (delivery.redelivered) ++metrics_.redelivered;
  auto pending = std::make_shared<Pending>();
  pending->id = next_pending_id_++;
  pending->generation = session_->generation();
  pending->channel = session_->consume_channel();
  pending->delivery_tag = delivery.delivery_tag;
  pending->mark = session_->mark_of(delivery.consumer_tag);
  if (state_ == State::stopping) {  // arrived between basic.cancel and cancel-ok
    (void)pending->channel->nack(pending->delivery_tag, false, true);
    return;
  }
  // The session consumes with raw_properties: what arrived is kept as it came, and decoded when
  // its handler starts (begin_handling). Properties the channel could not even keep are empty
  // here, and fail to decode then like any other.
  Arrived& arrived = pending->arrived;
  arrived.body = std::move(delivery.message.body);
  arrived.properties = std::move(delivery.message.raw_properties);
  arrived.exchange = std::move(delivery.exchange);
  arrived.routing_key = std::move(delivery.routing_key);
  arrived.redelivered = delivery.redelivered;
  waiting_.push_back(std::move(pending));
  start_handlers();
}

void ConsumerImpl::give_back(const void* mark) {
  size_t given = 0;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->mark.get() != mark) {
      ++it;
      continue;
    }
    if (is_live(**it)) (void)(*it)->channel->nack((*it)->delivery_tag, false, true);
    it = waiting_.erase(it);
    ++given;
  }
  if (auto* log = options_.logger.get(); log && given > 0) {
    log->info("service={} gave back {} deliveries waiting for a handler to the queue it left",
              options_.service.name, given);
  }
}

std::string ConsumerImpl::over_delivery_limit(const retry::AttemptInfo& info) const {
  const char* what =
      " (its consumer crashed, stalled or gave it back each time); its handler was "
      "not run again";
  if (info.delivery_limited > 0) {
    return "the broker dead-lettered it for going back unsettled more often than the queue's "
           "delivery limit" +
           std::string(what);
  }
  if (options_.service.queue_type != topology::QueueType::quorum) return {};
  if (options_.service.retry.mode == topology::RetryMode::in_queue) {
    // Every failed delivery is an attempt here (begin_handling): one past max_attempts means
    // that consumers died with it, or gave it back failed, after its last handled attempt.
    const int max = options_.service.retry.max_attempts;
    if (info.attempt <= max) return {};
    return "failed " + std::to_string(info.attempt - 1) +
           " deliveries (its handler's retries and consumers that died with it), max_attempts is " +
           std::to_string(max) + "; its handler was not run again";
  }
  const int64_t limit = options_.service.delivery_limit.value_or(topology::default_delivery_limit);
  if (info.delivery_count < limit) return {};
  return "delivered " + std::to_string(info.delivery_count) +
         " times before without being settled, the service's delivery_limit is " +
         std::to_string(limit) + what;
}

bool ConsumerImpl::begin_handling(const std::shared_ptr<Pending>& pending) {
  Arrived& arrived = pending->arrived;
  pending->handling = std::make_unique<Handling>();
  pending->message = std::make_unique<Message>();
  Message& message = *pending->message;
  message.body = std::move(arrived.body);
  message.exchange = std::move(arrived.exchange);
  message.routing_key = std::move(arrived.routing_key);
  message.redelivered = arrived.redelivered;
  message.queue = topology::input_queue_name(options_.service);
  const std::error_code undecodable =
      client::decode_properties(arrived.properties, message.properties);
  if (undecodable) message.properties = amqp::BasicProperties{};
  Handling& handling = *pending->handling;
  handling.info =
      retry::read_attempt_info(message.properties, topology::input_queue_name(options_.service),
                               message.exchange, message.routing_key);
  if (options_.service.retry.mode == topology::RetryMode::in_queue) {
    // The queue counts the failed deliveries (RabbitMQ 4.3): each is an attempt.
    handling.info.attempt = retry::in_queue_attempt(handling.info);
  }
  message.attempt = handling.info.attempt;
  handling.trace = message.trace_context();
  if (undecodable) park_undecodable(pending, arrived.properties, undecodable);
  std::string().swap(arrived.properties);
  return !undecodable;
}

void ConsumerImpl::park_undecodable(const std::shared_ptr<Pending>& pending,
                                    std::string_view raw_properties, std::error_code error) {
  // No handler can be given what cannot be read, and no retry can count its attempts: it is
  // parked at once, its property bytes kept whole in a header, persistent like it may have been.
  amqp::BasicProperties& properties = pending->message->properties;
  properties.delivery_mode = 2;
  properties.headers.emplace().set(std::string(retry::header::raw_properties),
                                   amqp::ByteArray{std::string(raw_properties)});
  retry::Decision& decision = pending->handling->decision;
  decision.action = retry::Action::park;
  decision.reason = ParkReason::poison;
  decision.error = "its properties cannot be decoded (" + error.message() +
                   "); their bytes are in " + std::string(retry::header::raw_properties);
  settling_[pending->id] = pending;
  publish_copy(pending);
}

size_t ConsumerImpl::handler_window() const {
  // The worker pool runs `concurrency` handlers at once and starts its queued jobs in order, so
  // a few more are handed to it ahead: a worker that finishes takes the next without waiting for
  // the loop, and the loop collects finished handlers in batches. Only a handed-over delivery
  // carries its Handling, so the look-ahead is bounded, not the whole prefetch.
  if (pool_) return options_.concurrency + std::max<size_t>(options_.concurrency, 32);
  return options_.concurrency;
}

void ConsumerImpl::start_handlers() {
  if (dispatching_) return;  // the outer call's loop picks up what was added
  dispatching_ = true;
  while (state_ != State::stopping && !awaiting_breaker_state_until_) {
    // Closed, the consumer's window bounds what starts (it hands a few more to the worker pool
    // ahead of a free worker); otherwise the breaker's limit does.
    const bool closed = breaker_.state() == outage::State::closed;
    const size_t window = closed ? handler_window() : size_t(breaker_.limit());
    if (running_ >= window) break;
    const bool probe_function = options_.probe && breaker_.state() != outage::State::closed &&
                                breaker_.state() != outage::State::ramping;
    if (waiting_.empty() && !probe_function) break;
    std::optional<outage::Call> call = breaker_.try_start(closed ? 0 : int(running_), now());
    if (!call) break;
    if (call->probe() && options_.probe) {
      run_probe(std::move(*call));
      continue;
    }
    // Only the probe function starts with nothing waiting, and the breaker gave the probe.
    std::shared_ptr<Pending> pending = std::move(waiting_.front());
    waiting_.pop_front();
    run_handler(pending, std::move(*call));
  }
  dispatching_ = false;
  after_breaker();
}

void ConsumerImpl::run_handler(const std::shared_ptr<Pending>& pending, outage::Call call) {
  // `call` is the pending's only once its handler runs: a delivery parked before that ends it
  // here, uncounted, and a probe it was lets the next delivery probe.
  if (!pending->handling) {
    if (!begin_handling(pending)) return;
    if (std::string why = over_delivery_limit(pending->handling->info); !why.empty()) {
      retry::Decision& decision = pending->handling->decision;
      decision.action = retry::Action::park;
      decision.reason = ParkReason::delivery_limit;
      decision.error = std::move(why);
      carry_out(pending);
      return;
    }
  } else {
    // Held after an unavailable outcome: the same attempt again, nothing of the last run kept.
    Handling& handling = *pending->handling;
    handling.threw = false;
    handling.finished_ns = 0;
    handling.decision = retry::Decision{};
    handling.work_outcome = Outcome{};
    handling.outcome = Outcome{};
  }
  pending->call = std::move(call);
  ++running_;
  if (async_handler_ || options_.handler_on_loop) {
    pending->handling->started_ns = uv_hrtime();
    pending->handling->span_end =
        begin_span(*start_span_, *pending->message, pending->handling->trace);
  }
  if (async_handler_) {
    std::weak_ptr<ConsumerImpl> weak = weak_from_this();
    auto settled = std::make_shared<bool>(false);
    Settle settle = [weak, pending, settled](Outcome outcome) {
      if (*settled) return;
      *settled = true;
      if (auto self = weak.lock()) self->handler_done(pending, std::move(outcome));
    };
    try {
      async_handler_(*pending->message, settle);
    } catch (...) {
      ++metrics_.handler_errors;
      settle(options_.exceptions.classify(std::current_exception()));
    }
    return;
  }
  if (options_.handler_on_loop) {
    Outcome outcome =
        invoke(*handler_, options_.exceptions, *pending->message, pending->handling->threw);
    handler_done(pending, std::move(outcome));
    return;
  }
  std::weak_ptr<ConsumerImpl> weak = weak_from_this();
  pool_->post(
      [pending, handler = handler_, exceptions = exceptions_, start_span = start_span_] {
        pending->handling->started_ns = uv_hrtime();
        pending->handling->span_end =
            begin_span(*start_span, *pending->message, pending->handling->trace);
        pending->handling->work_outcome =
            invoke(*handler, *exceptions, *pending->message, pending->handling->threw);
        pending->handling->finished_ns = uv_hrtime();
      },
      [weak, pending](bool started) {
        auto self = weak.lock();
        if (!self) return;
        if (started) {
          self->handler_done(pending, std::move(pending->handling->work_outcome));
        } else {
          self->handler_withdrawn(pending);
        }
      });
}

size_t ConsumerImpl::withdraw_handlers() {
  return pool_ ? pool_->withdraw() : 0;
}

void ConsumerImpl::handler_withdrawn(const std::shared_ptr<Pending>& pending) {
  // Handed to the pool but not started: it goes back like a waiting delivery. The breaker keeps
  // it waiting; a graceful stop hands it back; a session that ended takes it with its channel.
  --running_;
  if (pending->call) {
    breaker_.finished(*pending->call, outage::Verdict::not_counted, now());
    pending->call.reset();
  }
  if (taking_back_ != nullptr) {
    taking_back_->push_back(pending);
    return;
  }
  if (is_live(*pending)) (void)pending->channel->nack(pending->delivery_tag, false, true);
}

void ConsumerImpl::take_back_unstarted() {
  std::vector<std::shared_ptr<Pending>> taken;
  taking_back_ = &taken;
  withdraw_handlers();
  taking_back_ = nullptr;
  waiting_.insert(waiting_.begin(), taken.begin(), taken.end());
}

void ConsumerImpl::handler_done(const std::shared_ptr<Pending>& pending, Outcome outcome) {
  --running_;
  // A worker's handler is timed to its return, not to when the loop collected it.
  const uint64_t finished_ns =
      pending->handling->finished_ns != 0 ? pending->handling->finished_ns : uv_hrtime();
  metrics_.handler_latency.record(
      std::chrono::nanoseconds(finished_ns - pending->handling->started_ns));
  if (pending->handling->threw) ++metrics_.handler_errors;
  pending->handling->outcome = outcome;
  if (pending->call) {
    const bool quiet = outcome.overloaded_dependency && outcome.delay;
    breaker_.finished(*pending->call, retry::breaker_verdict(outcome), now(),
                      quiet ? *outcome.delay : std::chrono::milliseconds(0));
    pending->call.reset();
  }
  if (!is_live(*pending)) {
    abandon(*pending);
    log_outcome(*pending, "abandoned",
                "its channel closed while the handler ran; the broker redelivers it");
  } else if (outcome.kind == retry::OutcomeKind::unavailable && holds_unavailable(*pending)) {
    hold(pending);
  } else {
    pending->handling->decision = retry::decide(options_.service, pending->handling->info, outcome);
    carry_out(pending);
  }
  start_handlers();
  maybe_finish_stop();
}

bool ConsumerImpl::is_live(const Pending& pending) const {
  return session_ && !session_->ended() && pending.generation == session_->generation() &&
         pending.channel && pending.channel->is_open();
}

void ConsumerImpl::carry_out(const std::shared_ptr<Pending>& pending) {
  const retry::Decision& decision = pending->handling->decision;
  switch (decision.action) {
    case retry::Action::ack:
    case retry::Action::drop:
      if (pending->channel->ack(pending->delivery_tag)) {
        abandon(*pending);
        return;
      }
      if (decision.action == retry::Action::ack) {
        ++metrics_.acked;
        log_outcome(*pending, "acked", {});
        end_span(*pending, Settlement::acked);
      } else {
        ++metrics_.dropped;
        log_outcome(*pending, "dropped", decision.error);
        end_span(*pending, Settlement::dropped);
      }
      return;
    case retry::Action::reject_to_wait:
    case retry::Action::requeue_delayed:
      if (pending->channel->reject(pending->delivery_tag,
                                   decision.action == retry::Action::requeue_delayed)) {
        abandon(*pending);
        return;
      }
      count_retry(decision);
      log_outcome(*pending, "retry", decision.error);
      end_span(*pending, Settlement::retried);
      return;
    case retry::Action::publish_to_wait:
    case retry::Action::park:
      settling_[pending->id] = pending;
      publish_copy(pending);
      return;
  }
}

void ConsumerImpl::log_outcome(const Pending& pending, const char* what,
                               const std::string& text) const {
  auto* log = options_.logger.get();
  if (log == nullptr) return;
  const retry::Decision& decision = pending.handling->decision;
  const auto level = std::string_view(what) == "acked" ? spdlog::level::debug
                     : std::string_view(what) == "parked" || std::string_view(what) == "abandoned"
                         ? spdlog::level::warn
                         : spdlog::level::info;
  if (!log->should_log(level)) return;
  std::string detail;
  if (std::string_view(what) == "retry") {
    detail = decision.action == retry::Action::reject_to_wait    ? " via=reject"
             : decision.action == retry::Action::requeue_delayed ? " via=in-queue"
             : decision.hops > 0 || !decision.wait_exchange.empty()
                 ? " via=delay-levels hops=" + std::to_string(decision.hops)
                 : " via=republish";
    detail += " delay=" + topology::duration_label(decision.delay);
    if (decision.requested_delay) {
      detail += " requested=" + topology::duration_label(*decision.requested_delay);
      if (decision.capped) {
        detail += decision.action == retry::Action::reject_to_wait
                      ? " (reject mode waits its one delay)"
                  : decision.action == retry::Action::requeue_delayed
                      ? " (in_queue mode waits what the queue's delayed retry gives)"
                      : " (capped: the longest wait the topology allows)";
      }
    }
  } else if (std::string_view(what) == "parked") {
    detail = std::string(" reason=") + to_string(decision.reason);
  }
  log->log(level, "{} outcome={}{}{}{}", message_fields(pending), what, detail,
           text.empty() ? "" : " error=",
           text.empty() ? std::string() : "\"" + amqp::printable(text) + "\"");
}

std::string ConsumerImpl::message_fields(const Pending& pending) const {
  std::string fields =
      "service=" + amqp::printable(options_.service.name) +
      " queue=" + amqp::printable(topology::input_queue_name(options_.service)) + " message_id=" +
      (pending.message ? amqp::printable(pending.message->message_id()) : std::string());
  if (pending.handling) {
    fields += " attempt=" + std::to_string(pending.handling->info.attempt);
    if (pending.handling->trace) {
      fields += " trace_id=" + amqp::printable(pending.handling->trace->trace_id);
    }
  }
  return fields;
}

void ConsumerImpl::count_retry(const retry::Decision& decision) {
  ++metrics_.retried;
  ++metrics_.retried_by_delay[retry::retry_delay_label(options_.service, decision)];
}

void ConsumerImpl::abandon(const Pending& pending) {
  ++metrics_.abandoned;
  end_span(pending, Settlement::abandoned);
}

void ConsumerImpl::end_span(const Pending& pending, Settlement settlement) {
  if (!pending.handling || !pending.handling->span_end) return;
  SpanEnd end = std::move(pending.handling->span_end);
  pending.handling->span_end = nullptr;
  SpanResult result;
  result.outcome = pending.handling->outcome;
  result.settlement = settlement;
  result.delay = pending.handling->decision.delay;
  result.reason = pending.handling->decision.reason;
  try {
    end(result);
  } catch (...) {
    // A tracer's failure is not the message's.
  }
}

// ---- timers, flow control, stopping -------------------------------------------------------------

void ConsumerImpl::on_tick() {
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
  if (state_ == State::running) parking_depth_.tick(now, session_->consume_connection());
  if (state_ != State::stopping) {
    const bool due = breaker_.wake_at().has_value();
    if (due) breaker_.tick(std::chrono::milliseconds(now));
    tick_breaker_link();
    if (due || !breaker_events_.empty()) {
      start_handlers();
    } else {
      carry_out_coordination();
    }
  }
  if (session_ && !blocked_) check_copies(now);
  if (session_) session_->close_drained_channels();
}

void ConsumerImpl::stop(std::chrono::milliseconds deadline) {
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
  // Those handed to the worker pool and not started yet go back first, so that what is counted
  // as running is running.
  const size_t going_back = waiting_.size() + withdraw_handlers();
  if (auto* log = options_.logger.get()) {
    log->info("service={} stopping: {} handlers running, {} copies settling, {} waiting go back",
              options_.service.name, running_, settling_.size(), going_back);
  }
  for (const auto& pending : waiting_)
    (void)pending->channel->nack(pending->delivery_tag, false, true);
  waiting_.clear();
  std::weak_ptr<ConsumerImpl> weak = weak_from_this();
  session_->stop_consuming([weak] {
    if (auto self = weak.lock()) self->maybe_finish_stop();
  });
  maybe_finish_stop();
}

void ConsumerImpl::stop_now() {
  if (state_ == State::stopped) return;
  if (state_ == State::idle) {
    stop(std::chrono::milliseconds(0));
    return;
  }
  state_ = State::stopping;
  uv_timer_stop(&reconnect_timer_);
  close_session([this] { close_handles(); });
}

void ConsumerImpl::maybe_finish_stop() {
  if (state_ != State::stopping || !session_ || running_ != 0 || !settling_.empty()) return;
  if (auto* log = options_.logger.get()) {
    log->info("service={} stopped gracefully; {}", options_.service.name, metrics_.summary());
  }
  close_session([this] { close_handles(); });
}

void ConsumerImpl::close_handles() {
  if (!handles_open_) return;
  handles_open_ = false;
  auto on_closed = [](uv_handle_t* handle) {
    static_cast<ConsumerImpl*>(handle->data)->on_handle_closed();
  };
  uv_close(reinterpret_cast<uv_handle_t*>(&reconnect_timer_), on_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&tick_timer_), on_closed);
  if (signals_) signals_->close([this] { on_handle_closed(); });
  if (pool_) pool_->close(options_.handler_exit_timeout, [this] { on_handle_closed(); });
  if (probe_pool_) {
    probe_pool_->close(options_.handler_exit_timeout, [this] { on_handle_closed(); });
  }
}

void ConsumerImpl::on_handle_closed() {
  if (--open_handles_ != 0) return;
  state_ = State::stopped;  // pool_ stays, for wait_for_handlers()
  std::shared_ptr<ConsumerImpl> keep_alive = std::move(self_);
  StoppedHandler handler = std::move(on_stopped_);
  if (handler) handler(fatal_error_);
}

std::optional<client::Endpoint> ConsumerImpl::consuming_from() const {
  if (!is_consuming() || !session_) return std::nullopt;
  const client::Uri& uri = session_->consume_connection()->uri();
  return client::Endpoint{uri.host, uri.port};
}

}  // namespace detail

std::shared_ptr<Consumer> Consumer::create(uv_loop_t* loop, ConsumerOptions options,
                                           Handler handler) {
  auto impl = std::make_shared<detail::ConsumerImpl>(loop, std::move(options));
  impl->handler_ = std::make_shared<const Handler>(std::move(handler));
  return std::make_shared<Consumer>(std::move(impl));
}

std::shared_ptr<Consumer> Consumer::create(uv_loop_t* loop, ConsumerOptions options,
                                           AsyncHandler handler) {
  auto impl = std::make_shared<detail::ConsumerImpl>(loop, std::move(options));
  impl->async_handler_ = std::move(handler);
  return std::make_shared<Consumer>(std::move(impl));
}

Consumer::Consumer(std::shared_ptr<detail::ConsumerImpl> impl) : impl_(std::move(impl)) {}
Consumer::~Consumer() = default;

Error Consumer::start() {
  return impl_->start();
}
void Consumer::stop(std::chrono::milliseconds deadline) {
  impl_->stop(deadline);
}
void Consumer::stop_now() {
  impl_->stop_now();
}
void Consumer::set_ready_handler(ReadyHandler handler) {
  impl_->on_ready_ = std::move(handler);
}
void Consumer::set_stopped_handler(StoppedHandler handler) {
  impl_->on_stopped_ = std::move(handler);
}
Metrics Consumer::metrics() const {
  return impl_->metrics_;
}
bool Consumer::is_consuming() const {
  return impl_->is_consuming();
}
ConsumerState Consumer::state() const {
  return impl_->state();
}
bool Consumer::is_blocked() const {
  return impl_->is_blocked();
}
std::optional<client::Endpoint> Consumer::consuming_from() const {
  return impl_->consuming_from();
}
size_t Consumer::in_flight() const {
  return impl_->in_flight();
}
size_t Consumer::handlers_running() const {
  return impl_->handlers_running();
}
bool Consumer::wait_for_handlers(std::chrono::milliseconds timeout) const {
  return impl_->wait_for_handlers(timeout);
}
const topology::Service& Consumer::service() const {
  return impl_->options_.service;
}
outage::State Consumer::breaker_state() const {
  return impl_->breaker_state();
}
bool Consumer::breaker_shared() const {
  return impl_->breaker_shared();
}
int Consumer::breaker_limit() const {
  return impl_->breaker_limit();
}

uint32_t Consumer::parking_alert_threshold() const {
  return impl_->parking_alert_threshold();
}
outage::Stats Consumer::breaker_stats() const {
  return impl_->breaker_stats();
}
size_t Consumer::held() const {
  return impl_->held();
}
void Consumer::pause() {
  impl_->pause();
}
void Consumer::resume() {
  impl_->resume();
}

}  // namespace retryloop::consumer
