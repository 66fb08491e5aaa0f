#include "retryloop/consumer/retry_policy.hpp"

namespace retryloop::consumer {
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
    case Action::publish_to_wait:
      return "publish_to_wait";
    case Action::park:
      return "park";
  }
  return "unknown";
}

Decision decide(const topology::Service& service, const AttemptInfo& info, const Outcome& outcome) {
  switch (outcome.kind) {
    case OutcomeKind::ack:
      return Decision{Action::ack, {}, ParkReason::exhausted, {}};
    case OutcomeKind::drop:
      return Decision{Action::drop, {}, ParkReason::exhausted, outcome.text};
    case OutcomeKind::permanent:
      return park(ParkReason::permanent, outcome.text);
    case OutcomeKind::poison:
      return park(ParkReason::poison, outcome.text);
    case OutcomeKind::retry:
      break;
  }
  if (!info.malformed.empty()) {
    return park(ParkReason::poison,
                "cannot count attempts: " + info.malformed + "; last error: " + outcome.text);
  }
  if (info.attempt >= service.retry.max_attempts) {
    return park(ParkReason::exhausted, outcome.text);
  }
  Decision decision;
  decision.error = outcome.text;
  if (service.retry.mode == topology::RetryMode::reject) {
    decision.action = Action::reject_to_wait;
  } else {
    decision.action = Action::publish_to_wait;
    int attempt = info.attempt > 1000000 ? 1000000 : static_cast<int>(info.attempt);
    decision.wait_routing_key = topology::wait_routing_key(service, attempt);
  }
  return decision;
}

}  // namespace retryloop::consumer
