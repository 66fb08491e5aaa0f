#pragma once

#include <string>

#include "retryloop/consumer/headers.hpp"
#include "retryloop/consumer/outcome.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::consumer {

/// What the consumer does with a delivery once its handler has answered.
enum class Action {
  ack,              ///< basic.ack
  drop,             ///< basic.ack, logged as dropped
  reject_to_wait,   ///< basic.reject(requeue=false): the broker moves it through the wait queue
  publish_to_wait,  ///< publish a copy to the wait exchange (confirmed, not returned), then ack
  park,             ///< publish a copy to the parking exchange (confirmed, not returned), then ack
};

const char* to_string(Action action);

struct Decision {
  Action action = Action::ack;
  /// publish_to_wait: the wait exchange's routing key (the delay's label, e.g. `300ms`).
  std::string wait_routing_key;
  /// park: why.
  ParkReason reason = ParkReason::exhausted;
  /// park: the text stored in `retryloop-error`.
  std::string error;
};

/// The retry policy: pure, so it is tested without a broker.
///
/// - ack and drop settle the message.
/// - permanent and poison park it at once.
/// - retry parks it as `exhausted` when `info.attempt` >= max_attempts; otherwise reject mode
///   rejects it into the wait queue and republish mode publishes it to the wait queue of the
///   delay for this attempt (delays[min(attempt-1, last)]).
/// - A retry of a message whose `x-death` or `retryloop-retries` is malformed parks it as
///   `poison`, naming what is wrong: its attempts cannot be counted, and RabbitMQ's own
///   dead-lettering must not be handed a forged `x-death`. (Its other outcomes apply as usual.)
Decision decide(const topology::Service& service, const AttemptInfo& info, const Outcome& outcome);

}  // namespace retryloop::consumer
