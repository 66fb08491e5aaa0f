#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "retryloop/outage/breaker.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/retry/outcome.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::retry {

/// What the consumer does with a delivery once its handler has answered.
enum class Action {
  ack,              ///< basic.ack
  drop,             ///< basic.ack, logged as dropped
  reject_to_wait,   ///< basic.reject(requeue=false): the broker moves it through the wait queue
  requeue_delayed,  ///< basic.reject(requeue=true): the queue holds it back (in_queue mode)
  publish_to_wait,  ///< publish a copy to the wait exchange (confirmed, not returned), then ack
  park,             ///< publish a copy to the parking exchange (confirmed, not returned), then ack
};

const char* to_string(Action action);

struct Decision {
  Action action = Action::ack;
  /// publish_to_wait: the exchange to publish the copy to; empty: the service's wait exchange.
  std::string wait_exchange;
  /// publish_to_wait: the routing key (the delay's label, e.g. `300ms`, on the wait exchange; the
  /// delay's bits and the queue on the delay levels).
  std::string wait_routing_key;
  /// publish_to_wait, reject_to_wait and requeue_delayed: how long the message is to wait.
  std::chrono::milliseconds delay{0};
  /// An Outcome::retry_after: what the handler asked for. `capped`: the topology cannot wait that
  /// long, and the message waits `delay` instead.
  std::optional<std::chrono::milliseconds> requested_delay;
  bool capped = false;
  /// publish_to_wait through the delay levels: the level queues it passes.
  int hops = 0;
  /// park: why.
  ParkReason reason = ParkReason::exhausted;
  /// park: the text stored in `retryloop-error`.
  std::string error;
};

/// What decide() needs besides the message, passed in so that it stays pure.
struct DecisionContext {
  /// Now, in seconds since the epoch: max_retry_duration compares it with the first failure.
  uint64_t now_seconds = 0;
  /// A number in [0, 1) that picks the backoff's jitter.
  double random = 0.5;
};

/// The retry policy: pure, so it is tested without a broker.
///
/// - ack and drop settle the message.
/// - permanent and poison park it at once.
/// - unavailable is decided as retry is (the breaker, not this policy, keeps an outage from
///   charging the message: docs/outage.md).
/// - retry parks it as `exhausted` when `info.attempt` >= max_attempts, or when its first
///   failure is max_retry_duration or longer ago (retryloop-error then gets a second line that
///   says so). Otherwise reject mode rejects it into the wait queue, and republish mode publishes
///   it: after Outcome::retry_after, into the delay levels (or the shortest delay tier that is
///   long enough, else the longest); with a backoff, into the delay levels for the backoff's
///   delay; else to the wait queue of the delay for this attempt (delays[min(attempt-1, last)]).
/// - A retry of a message whose `x-death` or `retryloop-retries` is malformed parks it as
///   `poison`, naming what is wrong: its attempts cannot be counted, and RabbitMQ's own
///   dead-lettering must not be handed a forged `x-death`. (Its other outcomes apply as usual.)
Decision decide(const topology::Service& service, const AttemptInfo& info, const Outcome& outcome,
                const DecisionContext& context);
/// decide() now, with a random number drawn from the operating system (read only for a retry;
/// should that source fail, the retry's delay gets no jitter).
Decision decide(const topology::Service& service, const AttemptInfo& info, const Outcome& outcome);

/// What a service's breaker makes of an outcome: ack and drop are successes, unavailable is the
/// dependency's failure, retry a failure the handler did not classify (counted only by a
/// failure-rate trip), and permanent and poison are the message's own (never counted).
outage::Verdict breaker_verdict(const Outcome& outcome);

/// The `delay` a retry is counted under (Metrics::retried_by_delay, the `delay` label of the
/// retries metric): the label of its wait queue's delay (`30s`); through delay levels, its delay
/// rounded up to the levels' base times a power of two (`1s`, `2s`, `4s`, ...), so that whatever
/// delays the handlers ask for, a service has at most one label per delay level.
std::string retry_delay_label(const topology::Service& service, const Decision& decision);

}  // namespace retryloop::retry
