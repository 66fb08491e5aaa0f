#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "retryloop/client/channel.hpp"
#include "retryloop/client/connection.hpp"
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
/// nullopt when the queue is empty. A message that is not a signal is skipped. Another reader
/// holds the queue's message for a moment, so an empty queue is read again after 50, 100 and
/// 200 ms (timers on `loop`, the channel's) before it is believed; with a null `loop`, once.
using StateCallback =
    std::function<void(const client::Error& error, const std::optional<outage::Signal>& last)>;
void read_shared_breaker_state(const std::shared_ptr<client::Channel>& channel, uv_loop_t* loop,
                               const std::string& service, StateCallback done);

/// What the broker knows of a service's shared breaker: what `retryloop service status` prints
/// and the console shows.
struct SharedBreakerStatus {
  /// The state queue's newest signal; nullopt when no instance has signalled anything.
  std::optional<outage::Signal> last;
  /// Instances connected now (the instances queue's consumers).
  uint32_t instances = 0;
  /// Probe tokens in the token queue: 1 while open and nobody holds it, else 0.
  uint32_t tokens_waiting = 0;
};
/// The state the last signal leaves the service in: "closed" (none yet, or recovered), "open"
/// (open or probing), "paused", or "resuming" (resumed, its probe not yet answered).
const char* shared_breaker_state(const std::optional<outage::Signal>& last);
/// Reads the status through `channel` without declaring anything: a service whose breaker
/// objects do not exist yet fails with the broker's NOT_FOUND, which closes the channel.
using StatusCallback =
    std::function<void(const client::Error& error, const SharedBreakerStatus& status)>;
void read_shared_breaker_status(const std::shared_ptr<client::Channel>& channel, uv_loop_t* loop,
                                const std::string& service, StatusCallback done);
/// Watches a service's shared breaker without taking part in it, for an operator's view (the
/// console): it binds an exclusive queue of its own to the breaker's fanout, reads the state queue
/// once, and from then on hears every signal as it is sent, so it never reads the state queue
/// again (a reader holds that queue's one message for a moment, and an instance that joins in that
/// moment would find it empty). refresh() counts the instances and tokens again. It declares
/// nothing of the service's: a service whose breaker objects do not exist yet fails with NOT_FOUND.
/// Runs on the connection's loop thread; the callbacks do too.
class SharedBreakerWatch {
 public:
  using ChangeCallback = std::function<void(const SharedBreakerStatus& status)>;
  using FailureCallback = std::function<void(const client::Error& error)>;
  /// `changed` hears the status once read, and again after each signal and refresh; `failed`
  /// hears the first error, after which the watch has ended (start another).
  static std::shared_ptr<SharedBreakerWatch> start(
      const std::shared_ptr<client::Connection>& connection, const std::string& service,
      ChangeCallback changed, FailureCallback failed);
  virtual ~SharedBreakerWatch() = default;
  virtual void refresh() = 0;
  virtual bool ended() const = 0;
  /// Whether it found the service's breaker (its exchange): a watch that failed before that read
  /// nothing; one that failed after it may have read the state queue.
  virtual bool found() const = 0;
  /// Closes its channel (and so its queue); no callback runs after it.
  virtual void close() = 0;
};

/// Publishes `signal` to the service's breaker exchange: persistent, mandatory, and `done` hears
/// the confirm (the channel must be in confirm mode).
void publish_breaker_signal(client::Channel& channel, const std::string& service,
                            const outage::Signal& signal, client::PublishCallback done);
/// Publishes a probe token into the service's token queue: persistent, mandatory.
void publish_probe_token(client::Channel& channel, const std::string& service,
                         const outage::Token& token, client::PublishCallback done);

}  // namespace retryloop::consumer
