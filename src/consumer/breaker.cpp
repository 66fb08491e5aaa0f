#include <spdlog/spdlog.h>

#include <algorithm>

#include "consumer_impl.hpp"
#include "retryloop/amqp/printable.hpp"
#include "retryloop/consumer/shared_breaker.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/topology/duration.hpp"

// The consumer's side of its service's breaker (outage::Breaker, docs/outage.md): which deliveries
// it keeps while the dependency is down, when it takes deliveries, the probe, and one log line per
// change. The breaker decides; this file carries its decisions out.
namespace retryloop::consumer::detail {

namespace {

std::string label(std::chrono::milliseconds duration) {
  return topology::duration_label(duration);
}

std::string deliveries(size_t count) {
  return std::to_string(count) + (count == 1 ? " delivery" : " deliveries");
}

/// Why the breaker moved, for the log line.
std::string because(const outage::Event& event, const outage::Settings& settings) {
  switch (event.reason) {
    case outage::Reason::consecutive_unavailable:
      return std::to_string(settings.consecutive_unavailable) + " unavailable outcomes in a row";
    case outage::Reason::failure_rate:
      return settings.failure_rate
                 ? "at least " + std::to_string(int(settings.failure_rate->threshold * 100 + 0.5)) +
                       "% of the calls in " + label(settings.failure_rate->window) + " failed"
                 : "the failure rate";
    case outage::Reason::probe_due:
      return "a probe is due";
    case outage::Reason::probe_failed:
      return "the probe failed";
    case outage::Reason::probe_succeeded:
      return "the probe succeeded";
    case outage::Reason::ramp_up:
      return "a ramp interval passed without a failure";
    case outage::Reason::step_back:
      return "a call failed during the ramp";
    case outage::Reason::overloaded:
      return "the dependency answered that it is overloaded";
    case outage::Reason::pace_lifted:
      return "the pace held nothing back for two ramp intervals";
    case outage::Reason::paused:
      return "paused by an operator";
    case outage::Reason::resumed:
      return "resumed by an operator";
    case outage::Reason::opened_elsewhere:
      return "another instance tripped";
    case outage::Reason::recovered_elsewhere:
      return "another instance's probe succeeded";
    case outage::Reason::prober_elsewhere:
      return "another instance probes";
  }
  return outage::to_string(event.reason);
}

std::string pace(const outage::Event& event) {
  if (event.rate <= 0) return event.reason == outage::Reason::pace_lifted ? ", not paced" : "";
  return ", paced at " + std::to_string(int64_t(event.rate + 0.5)) + " calls a second";
}

int64_t wall_ms() {
  return int64_t(retry::unix_milliseconds());
}

/// A failed link is tried again after this long, while the session lasts.
constexpr std::chrono::milliseconds link_retry_delay = std::chrono::seconds(30);
/// How long a linked consumer waits for the service's state before its handlers start anyway.
constexpr std::chrono::milliseconds breaker_state_wait = std::chrono::seconds(10);

bool call_probe(const std::function<bool()>& probe) {
  try {
    return probe();
  } catch (...) {
    return false;  // a probe that throws did not get an answer
  }
}

}  // namespace

std::chrono::milliseconds ConsumerImpl::now() const {
  return std::chrono::milliseconds(uv_now(loop_));
}

outage::Stats ConsumerImpl::breaker_stats() const {
  return breaker_.stats(now());
}

size_t ConsumerImpl::held() const {
  // Closed, what waits is the ordinary backlog waiting for a worker, except what an unavailable
  // outcome sent back to wait (it has begun handling).
  if (breaker_.state() != outage::State::closed || awaiting_breaker_state_until_) {
    return waiting_.size();
  }
  return size_t(std::count_if(waiting_.begin(), waiting_.end(),
                              [](const auto& pending) { return pending->handling != nullptr; }));
}

bool ConsumerImpl::holds_unavailable(Pending& pending) const {
  return outage::holds_unavailable(breaker_.state(), pending.unavailable_while_closed,
                                   options_.service.outage.consecutive_unavailable);
}

void ConsumerImpl::hold(const std::shared_ptr<Pending>& pending) {
  // Unsettled on its channel, so that nothing counts it: no attempt, no requeue toward a delivery
  // limit, no trip through a wait queue. First in line when the breaker lets a call through.
  ++metrics_.held_unavailable;
  end_span(*pending, Settlement::held);
  if (auto* log = options_.logger.get(); log != nullptr && log->should_log(spdlog::level::debug)) {
    log->debug("{} outcome=held breaker={} error=\"{}\"", message_fields(*pending),
               outage::to_string(breaker_.state()),
               amqp::printable(pending->handling->outcome.text));
  }
  waiting_.push_front(pending);
}

void ConsumerImpl::run_probe(outage::Call call) {
  ++running_;
  std::weak_ptr<ConsumerImpl> weak = weak_from_this();
  auto answered = std::make_shared<bool>(false);
  // Shared, for the pool's copyable callbacks; ended on the loop thread, by probe_done.
  auto started_call = std::make_shared<outage::Call>(std::move(call));
  WorkerPool* pool = pool_ ? pool_.get() : probe_pool_.get();
  pool->post([probe = options_.probe, answered] { *answered = call_probe(probe); },
             [weak, call = started_call, answered](bool started) {
               // Taken back before it ran (a pause, a stop): it said nothing of the dependency.
               const outage::Verdict verdict = !started    ? outage::Verdict::not_counted
                                               : *answered ? outage::Verdict::success
                                                           : outage::Verdict::unavailable;
               if (auto self = weak.lock()) self->probe_done(*call, verdict);
             });
}

void ConsumerImpl::probe_done(outage::Call& call, outage::Verdict verdict) {
  --running_;
  breaker_.finished(call, verdict, now());
  start_handlers();
  maybe_finish_stop();
}

void ConsumerImpl::pause() {
  breaker_.pause(now());
  after_breaker();
}

void ConsumerImpl::resume() {
  coordinator_.resume_here(now());
  start_handlers();
}

void ConsumerImpl::after_breaker() {
  if (in_after_breaker_) return;
  in_after_breaker_ = true;
  while (!breaker_events_.empty()) {
    std::vector<outage::Event> events = std::move(breaker_events_);
    breaker_events_.clear();
    for (const outage::Event& event : events) {
      coordinator_.breaker_event(event, wall_ms());
      if (pool_ && (event.to == outage::State::open || event.to == outage::State::paused)) {
        take_back_unstarted();
      }
      if (auto* log = options_.logger.get()) {
        std::string what = "service=" + amqp::printable(options_.service.name) + " breaker " +
                           outage::to_string(event.from) + " -> " + outage::to_string(event.to) +
                           ": " + because(event, options_.service.outage);
        switch (event.to) {
          case outage::State::open:
            what += "; holding " + deliveries(waiting_.size()) + " uncharged, starting none; " +
                    (coordinator_.prober()
                         ? "next probe in " + label(options_.service.outage.probe_interval)
                         : std::string("the instance holding the probe token probes"));
            break;
          case outage::State::probing:
            what += options_.probe ? "; calling the probe" : "; one delivery is the probe";
            break;
          case outage::State::ramping:
            what += "; " + std::to_string(event.limit) + " at once, growing every " +
                    label(options_.service.outage.ramp.interval) + pace(event);
            break;
          case outage::State::closed:
            what += "; " + std::to_string(event.limit) + " at once" + pace(event);
            break;
          case outage::State::paused:
            what += "; holding " + deliveries(waiting_.size()) + ", starting none";
            break;
        }
        log->log(event.to == outage::State::open || event.to == outage::State::paused
                     ? spdlog::level::warn
                     : spdlog::level::info,
                 what);
      }
      if (options_.on_breaker) options_.on_breaker(event);
    }
  }
  carry_out_coordination();
  in_after_breaker_ = false;
}

void ConsumerImpl::link_breaker() {
  if (!options_.share_breaker || !session_ || breaker_link_) return;
  std::weak_ptr<ConsumerImpl> weak = weak_from_this();
  BreakerLinkEvents events;
  events.joined = [weak](const std::optional<outage::Signal>& last) {
    auto self = weak.lock();
    if (!self) return;
    self->breaker_link_retry_at_.reset();
    if (auto* log = self->options_.logger.get()) {
      log->info("service={} breaker shared with the service's other instances as {}{}",
                self->options_.service.name, self->coordinator_.instance(),
                last ? std::string("; last signal ") + outage::to_string(last->kind) + " from " +
                           amqp::printable(last->sender)
                     : std::string());
    }
    self->awaiting_breaker_state_until_.reset();
    self->coordinator_.joined(last, self->now(), wall_ms());
    self->start_handlers();
  };
  events.signal = [weak](const outage::Signal& signal) {
    auto self = weak.lock();
    if (!self) return;
    self->coordinator_.received(signal, self->now());
    self->start_handlers();
  };
  events.token = [weak](uint64_t delivery_tag, const std::optional<outage::Token>& token) {
    auto self = weak.lock();
    if (!self) return;
    self->coordinator_.token(delivery_tag, token, self->now(), wall_ms());
    self->start_handlers();
  };
  events.failed = [weak](const client::Error& error) {
    if (auto self = weak.lock()) self->breaker_link_failed(error);
  };
  awaiting_breaker_state_until_ = now() + breaker_state_wait;
  breaker_link_ = BreakerLink::start(session_->consume_connection(), options_.service.name,
                                     options_.logger, std::move(events));
}

void ConsumerImpl::unlink_breaker() {
  awaiting_breaker_state_until_.reset();
  if (!breaker_link_) return;
  breaker_link_->close();
  breaker_link_.reset();
  coordinator_.left(now());
}

void ConsumerImpl::breaker_link_failed(const client::Error& error) {
  awaiting_breaker_state_until_.reset();
  breaker_link_.reset();
  coordinator_.left(now());
  // A lost connection ends the session too, which links again when it comes back; anything
  // else is tried again after a while.
  if (!session_ || session_->ended()) return;
  breaker_link_retry_at_ = now() + link_retry_delay;
  if (auto* log = options_.logger.get()) {
    const auto level = breaker_link_warned_ ? spdlog::level::debug : spdlog::level::warn;
    log->log(level,
             "service={} breaker not shared with the service's other instances: {}; this "
             "instance keeps a breaker of its own and tries again in {}",
             options_.service.name, error.message(), label(link_retry_delay));
  }
  breaker_link_warned_ = true;
  start_handlers();
}

void ConsumerImpl::tick_breaker_link() {
  if (awaiting_breaker_state_until_ && now() >= *awaiting_breaker_state_until_) {
    awaiting_breaker_state_until_.reset();
    if (auto* log = options_.logger.get()) {
      log->warn(
          "service={} the shared breaker's state is not known after {}; handling with this "
          "instance's breaker until it is",
          options_.service.name, label(breaker_state_wait));
    }
    start_handlers();
  }
  if (breaker_link_retry_at_ && now() >= *breaker_link_retry_at_ && state_ == State::running) {
    breaker_link_retry_at_.reset();
    link_breaker();
    awaiting_breaker_state_until_.reset();  // handling goes on while it links again
  }
  coordinator_.tick(now(), wall_ms());
  coordinator_.can_probe(!waiting_.empty() || running_ > 0 || bool(options_.probe), now());
}

void ConsumerImpl::carry_out_coordination() {
  if (!coordinator_.has_actions()) return;  // the common case, after every handler
  outage::Actions actions = coordinator_.take_actions();
  for (uint64_t tag : actions.ack_tokens) {
    if (breaker_link_) breaker_link_->ack_token(tag);
  }
  if (actions.pass_token && breaker_link_) {
    if (auto* log = options_.logger.get()) {
      log->info(
          "service={} breaker: nothing to probe with for {}; the probe token goes to the "
          "next instance",
          options_.service.name, label(options_.service.outage.probe_interval));
    }
    breaker_link_->pass_token(*actions.pass_token);
  }
  if (actions.signals.empty() && !actions.token) return;
  const std::shared_ptr<client::Channel> channel =
      session_ && !session_->ended() ? session_->publish_channel() : nullptr;
  if (!channel) return;  // not connected: the coordinator tells the others once it is joined
  std::weak_ptr<ConsumerImpl> weak = weak_from_this();
  auto report = [weak](const char* what) {
    return [weak, what](const client::PublishOutcome& outcome) {
      auto self = weak.lock();
      if (!self || outcome.ok()) return;
      if (auto* log = self->options_.logger.get()) {
        log->warn("service={} the breaker's {} did not reach the other instances: {}",
                  self->options_.service.name, what, outcome.error.message());
      }
    };
  };
  for (const outage::Signal& signal : actions.signals) {
    publish_breaker_signal(*channel, options_.service.name, signal,
                           report(outage::to_string(signal.kind)));
  }
  if (actions.token) {
    publish_probe_token(*channel, options_.service.name, *actions.token, report("probe token"));
  }
}

}  // namespace retryloop::consumer::detail
