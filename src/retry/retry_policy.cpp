#include "retryloop/retry/retry_policy.hpp"

#include <algorithm>

#include "retryloop/random/os_random.hpp"
#include "retryloop/retry/backoff.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/duration.hpp"

namespace retryloop::retry {
namespace {

Decision park(ParkReason reason, std::string error) {
  Decision decision;
  decision.action = Action::park;
  decision.reason = reason;
  decision.error = std::move(error);
  return decision;
}

}  // namespace

const char* to_string(OutcomeKind kind) {
  switch (kind) {
    case OutcomeKind::ack:
      return "ack";
    case OutcomeKind::retry:
      return "retry";
    case OutcomeKind::permanent:
      return "permanent";
    case OutcomeKind::poison:
      return "poison";
    case OutcomeKind::drop:
      return "drop";
    case OutcomeKind::unavailable:
      return "unavailable";
  }
  return "unknown";
}

const char* to_string(Action action) {
  switch (action) {
    case Action::ack:
      return "ack";
    case Action::drop:
      return "drop";
    case Action::reject_to_wait:
      return "reject_to_wait";
    case Action::requeue_delayed:
      return "requeue_delayed";
    case Action::publish_to_wait:
      return "publish_to_wait";
    case Action::park:
      return "park";
  }
  return "unknown";
}

Decision decide(const topology::Service& service, const AttemptInfo& info, const Outcome& outcome,
                const DecisionContext& context) {
  switch (outcome.kind) {
    case OutcomeKind::ack:
      return Decision{};
    case OutcomeKind::drop: {
      Decision decision;
      decision.action = Action::drop;
      decision.error = outcome.text;
      return decision;
    }
    case OutcomeKind::permanent:
      return park(ParkReason::permanent, outcome.text);
    case OutcomeKind::poison:
      return park(ParkReason::poison, outcome.text);
    case OutcomeKind::retry:
    case OutcomeKind::unavailable:
      break;
  }
  if (!info.malformed.empty()) {
    return park(ParkReason::poison,
                "cannot count attempts: " + info.malformed + "; last error: " + outcome.text);
  }
  const topology::Retry& retry = service.retry;
  if (info.attempt >= retry.max_attempts) {
    return park(ParkReason::exhausted, outcome.text);
  }
  if (retry.max_retry_duration) {
    const uint64_t first =
        std::min(info.first_failure.value_or(context.now_seconds), context.now_seconds);
    const auto elapsed = std::chrono::seconds(context.now_seconds - first);
    if (elapsed >= *retry.max_retry_duration) {
      return park(ParkReason::exhausted,
                  outcome.text + "\n(retry budget used up: first failed " +
                      std::to_string(elapsed.count()) + "s ago, max_retry_duration " +
                      topology::duration_label(*retry.max_retry_duration) + ")");
    }
  }
  Decision decision;
  decision.error = outcome.text;
  decision.requested_delay = outcome.delay;
  const int attempt = info.attempt > 1000000 ? 1000000 : static_cast<int>(info.attempt);
  if (retry.mode == topology::RetryMode::in_queue) {
    // The queue counts this reject as a failed delivery: it holds the message for the step
    // times the failed deliveries, `attempt` of them after this one, at most the cap.
    decision.action = Action::requeue_delayed;
    decision.delay = topology::delay_after_attempt(service, attempt);
    decision.capped = outcome.delay && *outcome.delay != decision.delay;
    return decision;
  }
  if (retry.mode == topology::RetryMode::reject) {
    decision.action = Action::reject_to_wait;
    decision.delay = topology::delay_after_attempt(service, attempt);
    decision.capped = outcome.delay && *outcome.delay != decision.delay;
    return decision;
  }
  decision.action = Action::publish_to_wait;
  std::optional<std::chrono::milliseconds> wanted = outcome.delay;
  if (!wanted && retry.backoff && retry.delay_levels) {
    const topology::RetryBackoff& b = *retry.backoff;
    Backoff backoff{b.initial, b.max, b.multiplier, b.jitter};
    wanted = backoff.delay(static_cast<uint32_t>(attempt - 1), context.random);
  }
  if (wanted && retry.delay_levels) {
    const topology::DelayRoute route = topology::delay_route(service, *wanted);
    decision.wait_exchange = route.exchange;
    decision.wait_routing_key = route.routing_key;
    decision.delay = route.delay;
    decision.hops = route.hops;
    decision.capped = outcome.delay && route.capped;
    return decision;
  }
  if (wanted) {
    // No delay levels: the shortest tier that waits long enough, else the longest.
    const auto tiers = topology::wait_delays(service);
    std::optional<std::chrono::milliseconds> best;
    std::chrono::milliseconds longest{0};
    for (auto tier : tiers) {
      longest = std::max(longest, tier);
      if (tier >= *wanted && (!best || tier < *best)) best = tier;
    }
    decision.delay = best.value_or(longest);
    decision.capped = !best;
  } else {
    decision.delay = topology::delay_after_attempt(service, attempt);
  }
  decision.wait_routing_key = topology::duration_label(decision.delay);
  return decision;
}

Decision decide(const topology::Service& service, const AttemptInfo& info, const Outcome& outcome) {
  DecisionContext context;
  // Only a retry reads the clock and the jitter: acks, the common case, pay for neither.
  if (outcome.kind != OutcomeKind::retry && outcome.kind != OutcomeKind::unavailable) {
    return decide(service, info, outcome, context);
  }
  context.now_seconds = unix_seconds();
  std::error_code no_jitter;
  const double random = random::random_fraction(no_jitter);
  // Without the operating system's source the retry waits its delay without jitter.
  if (!no_jitter) context.random = random;
  return decide(service, info, outcome, context);
}

outage::Verdict breaker_verdict(const Outcome& outcome) {
  switch (outcome.kind) {
    case OutcomeKind::ack:
    case OutcomeKind::drop:
      return outage::Verdict::success;
    case OutcomeKind::unavailable:
      return outcome.overloaded_dependency ? outage::Verdict::overloaded
                                           : outage::Verdict::unavailable;
    case OutcomeKind::retry:
      return outage::Verdict::failure;
    case OutcomeKind::permanent:
    case OutcomeKind::poison:
      return outage::Verdict::not_counted;
  }
  return outage::Verdict::not_counted;
}

std::string retry_delay_label(const topology::Service& service, const Decision& decision) {
  const auto& levels = service.retry.delay_levels;
  if (decision.wait_exchange.empty() || !levels || levels->base.count() <= 0) {
    return topology::duration_label(decision.delay);
  }
  const int64_t units = (decision.delay.count() + levels->base.count() - 1) / levels->base.count();
  int64_t step = 1;
  while (step < units)
    step *= 2;
  return topology::duration_label(units == 0 ? decision.delay : levels->base * step);
}

Outcome ExceptionPolicy::classify(const std::exception_ptr& error) const {
  for (const auto& rule : rules_) {
    try {
      if (auto outcome = rule(error)) return std::move(*outcome);
    } catch (const std::exception& e) {
      return Outcome::retry(std::string("the exception policy threw while mapping an exception: ") +
                            e.what());
    } catch (...) {
      return Outcome::retry("the exception policy threw while mapping an exception");
    }
  }
  try {
    std::rethrow_exception(error);
  } catch (const PermanentError& e) {
    return Outcome::permanent(e.what());
  } catch (const UnavailableError& e) {
    return Outcome::unavailable(e.what());
  } catch (const RetryAfterError& e) {
    return Outcome::retry_after(e.delay(), e.what());
  } catch (const std::exception& e) {
    return Outcome::retry(e.what());
  } catch (...) {
    return Outcome::retry("unknown exception escaped the handler");
  }
}

}  // namespace retryloop::retry
