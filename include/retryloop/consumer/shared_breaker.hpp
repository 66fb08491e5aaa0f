#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "retryloop/client/channel.hpp"
#include "retryloop/outage/coordinator.hpp"

namespace retryloop::consumer {

/// Declares the objects through which a service's instances share one breaker (docs/outage.md,
/// "One breaker per service"): the fanout `N.breaker`, the queue `N.breaker.state` bound to it
/// (classic, durable, one message, the oldest dropped), the queue `N.breaker.token` (quorum,
/// single active consumer) and the queue `N.breaker.instances` (classic, holds nothing; each
/// instance consumes it). Declaring them again with the same arguments changes nothing.
void declare_shared_breaker(const std::shared_ptr<client::Channel>& channel,
                            const std::string& service, client::CompletionCallback done);

/// The state queue's newest signal, read without taking it (every message read is requeued);
/// nullopt when the queue is empty. A message that is not a signal is skipped.
using StateCallback =
    std::function<void(const client::Error& error, const std::optional<outage::Signal>& last)>;
void read_shared_breaker_state(const std::shared_ptr<client::Channel>& channel,
                               const std::string& service, StateCallback done);

/// Publishes `signal` to the service's breaker exchange: persistent, mandatory, and `done` hears
/// the confirm (the channel must be in confirm mode).
void publish_breaker_signal(client::Channel& channel, const std::string& service,
                            const outage::Signal& signal, client::PublishCallback done);
/// Publishes a probe token for the outage that began at `opened_at_ms`.
void publish_probe_token(client::Channel& channel, const std::string& service, int64_t opened_at_ms,
                         client::PublishCallback done);

}  // namespace retryloop::consumer
