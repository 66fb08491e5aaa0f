#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/properties.hpp"
#include "retryloop/client/connection.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/client/loop.hpp"
#include "retryloop/outage/breaker.hpp"
#include "retryloop/retry/backoff.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/retry/metrics.hpp"
#include "retryloop/retry/outcome.hpp"
#include "retryloop/retry/retry_policy.hpp"
#include "retryloop/retry/trace_context.hpp"
#include "retryloop/topology/topology.hpp"

namespace spdlog {
class logger;
}

namespace retryloop::consumer {

/// The retry layer's names that a handler and the consumer's options speak in, also here, so
/// that a service writes consumer::Outcome and needs only this header.
using retry::Backoff;
using retry::ExceptionPolicy;
using retry::Metrics;
using retry::Outcome;
using retry::OutcomeKind;
using retry::ParkReason;
using retry::PermanentError;
using retry::RetryAfterError;
using retry::to_string;
using retry::TraceContext;
using retry::UnavailableError;

namespace detail {
class ConsumerImpl;
}

/// A delivery as a handler sees it. It stays valid and unchanged until the handler returns (or,
/// for an asynchronous handler, until it settles).
struct Message {
  std::string body;
  /// All 14 basic properties as the broker delivered them; the headers are in
  /// `properties.headers`.
  amqp::BasicProperties properties;
  std::string exchange;
  std::string routing_key;
  /// The queue it was delivered from: the service's input queue.
  std::string queue;
  bool redelivered = false;
  /// The attempt rule: 1 + x-death's rejected count for this queue + `retryloop-retries`. A
  /// redelivery after a crash is the same attempt again.
  int64_t attempt = 1;

  /// The headers table; an empty one when the message has none.
  const amqp::FieldTable& headers() const;
  /// The message-id property, or "" when there is none.
  std::string_view message_id() const;
  /// The W3C trace context of its `traceparent` and `tracestate` headers; nullopt when it has no
  /// valid `traceparent`.
  std::optional<TraceContext> trace_context() const;
};

/// A synchronous handler: returns what became of the message. Runs on the consumer's own
/// worker threads (so it may block; up to `concurrency` at once, each call on some worker
/// thread, so it must be safe to call concurrently when concurrency > 1) or, with
/// ConsumerOptions::handler_on_loop, on the loop thread. An exception escaping it counts as
/// Outcome::retry with the exception's text, except PermanentError, which counts as permanent.
/// (ConsumerOptions::exceptions maps other exception types to outcomes.)
using Handler = std::function<Outcome(const Message& message)>;

/// Settles one delivery of an asynchronous handler. Call it exactly once, on the loop thread;
/// later calls are ignored. Never calling it keeps the message unacked and its concurrency slot
/// taken until the connection ends.
using Settle = std::function<void(Outcome outcome)>;

/// An asynchronous handler: runs on the loop thread, must not block, and calls `settle` later
/// (or before it returns). An exception escaping it before `settle` counts as a retry.
using AsyncHandler = std::function<void(const Message& message, Settle settle)>;

/// What the parking hook is told, on the loop thread, after a parked copy is confirmed.
struct ParkedEvent {
  std::string service;
  std::string message_id;
  ParkReason reason = ParkReason::exhausted;
  std::string error;
  int64_t attempts = 0;
};
using ParkedHandler = std::function<void(const ParkedEvent& event)>;

/// What the parking-depth alert is told, on the loop thread.
struct ParkingDepthEvent {
  std::string service;
  std::string queue;
  uint32_t depth = 0;
  uint32_t threshold = 0;
};
using ParkingDepthHandler = std::function<void(const ParkingDepthEvent& event)>;

/// What the consumer finally did with a delivery whose handler ran.
enum class Settlement {
  acked,    ///< acked: the handler said ack
  dropped,  ///< acked on purpose: the handler said drop
  retried,  ///< on its way to a wait queue: rejected, or its copy confirmed and the original acked
  parked,   ///< its parking copy confirmed and the original acked
  /// not settled: its channel closed first (a lost connection, a stop), so the broker delivers it
  /// again
  abandoned,
  /// not settled: the handler said its dependency is unavailable, so the consumer keeps it,
  /// uncharged, and runs it again once the breaker lets a call through (docs/outage.md)
  held,
};
/// "acked", "dropped", "retried", "parked", "abandoned", "held".
const char* to_string(Settlement settlement);

/// What the end of a handler's span is told.
struct SpanResult {
  /// What the handler said; an exception that escaped it, as the outcome it maps to.
  Outcome outcome;
  Settlement settlement = Settlement::acked;
  /// retried: how long the message waits.
  std::chrono::milliseconds delay{0};
  /// parked: why.
  ParkReason reason = ParkReason::exhausted;
};
/// Ends a span that SpanStart began.
using SpanEnd = std::function<void(const SpanResult& result)>;
/// Begins a span of the application's tracer around one handler call; `parent` is the message's
/// trace context (nullopt when it has none: start a new trace or none, retryloop makes none up).
/// Called on the thread that runs the handler, right before it (a worker thread, or the loop
/// thread for an asynchronous handler or handler_on_loop), so a tracer can make the span current
/// there for the handler. The SpanEnd it returns (may be empty) is called once, on the loop
/// thread, when the delivery is settled: acked, retried or parked once the broker confirmed the
/// copy, or abandoned. It is not called for a handler still running when the consumer has
/// stopped for good (see handler_exit_timeout). Exceptions from either are ignored.
using SpanStart =
    std::function<SpanEnd(const Message& message, const std::optional<TraceContext>& parent)>;

/// Where a consumer is in its life.
enum class ConsumerState {
  not_started,   ///< created, start() not called
  connecting,    ///< connecting for the first time (or waiting to try again)
  consuming,     ///< consuming
  reconnecting,  ///< consumed before, lost its session, and connects again
  stopping,      ///< stop() or a fatal error: finishing and closing
  stopped,       ///< stopped for good
};
/// "not_started", "connecting", "consuming", "reconnecting", "stopping", "stopped".
const char* to_string(ConsumerState state);

/// Told once when the consumer has stopped for good: an empty error after stop() or stop_now(),
/// otherwise the fatal error (topology drift, refused credentials or permissions). By then no
/// synchronous handler runs, unless one outlived ConsumerOptions::handler_exit_timeout (see
/// Consumer::handlers_running()).
using StoppedHandler = std::function<void(const client::Error& error)>;
/// Told each time the consumer starts consuming: first start and every recovery.
using ReadyHandler = std::function<void()>;

struct ConsumerOptions {
  /// Where to connect (uri, heartbeat, ...). The consumer opens two connections with these
  /// options: one that consumes and acks, and one that publishes retry and parking copies, so
  /// that a broker alarm, which blocks publishers, never stalls acks.
  client::ConnectionOptions connection;
  /// The service whose input queue is consumed; its retry and parking settings apply.
  topology::Service service;
  /// basic.qos prefetch: unacked deliveries the broker sends ahead.
  uint16_t prefetch = 200;
  /// Handlers that may run at once. With 1, messages are handled one at a time in delivery
  /// order; with more, they start in delivery order and may finish in any order. Either way a
  /// retried message comes back after its delay, behind newer messages. On the worker threads, up
  /// to concurrency + max(concurrency, 32) deliveries are handed to the workers ahead of a free
  /// one; a stop gives back those whose handlers have not started, like any other waiting one.
  uint32_t concurrency = 1;
  /// Run a synchronous handler on the loop thread instead of the worker pool: faster for cheap
  /// handlers that never block.
  bool handler_on_loop = false;
  /// What an exception escaping a handler means (by default: PermanentError parks it, any other
  /// is a retry): map the application's exception types to outcomes here.
  ExceptionPolicy exceptions;
  /// Declare the service's topology (idempotently) on every (re)connect. When false, the
  /// objects must exist; a missing queue is retried with the recovery backoff.
  bool declare_topology = true;
  /// Delay before each reconnect after a loss (and between failed reconnects). With several
  /// hosts in the URI, the first reconnect after losing a working session goes at once: it tries
  /// the other hosts first, the one just lost last.
  Backoff recovery{};
  /// Delay before publishing a retry or parking copy again after the broker nacked or returned
  /// it (the original stays unacked meanwhile).
  Backoff publish_retry{std::chrono::milliseconds(200), std::chrono::milliseconds(10000), 2.0,
                        0.25};
  /// A copy not confirmed within this time ends the session (and the broker requeues the
  /// originals), as a dead connection would.
  std::chrono::milliseconds confirm_timeout{30000};
  /// Log Metrics::summary() at info level this often; zero turns it off.
  std::chrono::milliseconds metrics_interval{0};
  /// Stop gracefully on the first SIGINT or SIGTERM (with shutdown_deadline), at once on the
  /// second. The signal handlers exist only while the consumer runs.
  bool stop_on_signals = false;
  std::chrono::milliseconds shutdown_deadline{30000};
  /// How long the stopped handler waits for synchronous handlers still running on worker
  /// threads once the connections are closed (after stop_now(), a missed shutdown deadline or a
  /// fatal error). One still running after it is abandoned: `stopped` fires while it runs, and
  /// handlers_running() and wait_for_handlers() tell of it and wait for it.
  std::chrono::milliseconds handler_exit_timeout{10000};
  /// `retryloop-consumer` of parked messages; default `host:pid`.
  std::string consumer_name;
  /// Where the consumer logs (structured: service, queue, message id, attempt, outcome);
  /// nullptr: nowhere. Also used for the connections when they have no logger of their own.
  std::shared_ptr<spdlog::logger> logger;
  /// Told after each parked copy is confirmed (for example, to page someone on the first).
  ParkedHandler on_parked;
  /// Parking-depth alert: with a threshold above 0, the consumer reads its parking queue's
  /// depth every `parking_check_interval` (and soon after it parks a message) and tells
  /// `on_parking_depth` when the depth rises above the threshold; once more after it has fallen
  /// back to or below it.
  uint32_t parking_alert_threshold = 0;
  std::chrono::milliseconds parking_check_interval{10000};
  ParkingDepthHandler on_parking_depth;
  /// A tracer's span around each handler call (see SpanStart); empty: none.
  SpanStart start_span;
  /// While the service's breaker is open, the call that asks whether the dependency answers
  /// again, once per probe interval, instead of running a held message (docs/outage.md): true
  /// when it answered. It runs where synchronous handlers run (a worker thread; for an
  /// asynchronous handler or handler_on_loop, a libuv pool thread), so it may block; give it a
  /// timeout, as the handler's own calls have. An exception means it did not answer. Empty: the
  /// probe is a held message, or the next delivery.
  std::function<bool()> probe;
  /// Told of each change of the breaker, on the loop thread, after the consumer has logged it
  /// and acted on it (stopped or resumed taking deliveries).
  outage::EventHandler on_breaker;
  /// Shares the breaker with every instance of the service through the broker (docs/outage.md,
  /// "One breaker per service"): a trip stops them all, one probes for all, and
  /// `retryloop service pause` reaches them. Needs configure, write and read permission on
  /// `N.breaker`, `N.breaker.state` and `N.breaker.token`; without them the consumer logs a
  /// warning once and keeps a breaker of its own. false: a breaker of its own.
  bool share_breaker = true;
  /// Follows a live migration of the service queue (`retryloop topology migrate`, docs/migrate.md,
  /// "The instances follow"): consumes the holding queue the migration names while the service
  /// queue is made again, and declares nothing meanwhile. Needs configure and read permission on
  /// `N.migration` and `N.migration.settling` (and a server-named queue); without them the consumer
  /// logs a warning once and consumes the service queue only. false: the service queue only, and a
  /// migration of it waits until this instance has stopped.
  bool follow_migrations = true;
};

/// The retry consumer: consumes the service's input queue, runs the handler, and carries out
/// its outcome with the service's retry policy, never acking a message before its retry or
/// parking copy is confirmed and not returned.
///
/// Threading: every call and every callback happens on the loop thread (a synchronous handler
/// may run on the worker pool). Lifetime: the consumer keeps itself alive while it runs; the
/// loop ends only after it has stopped.
///
/// Recovery: a lost connection, a broker-side cancel, a channel the broker closed or a confirm
/// timeout ends the session: both connections close (the broker requeues what was unacked),
/// results of handlers still running are dropped (their messages come back), and the consumer
/// reconnects with `recovery` backoff, redeclares the topology, and restores qos, confirm mode
/// and the consumer. Fatal errors stop it instead: an inequivalent existing object (406 on
/// declare), refused credentials or vhost, or refused permissions (403).
class Consumer {
 public:
  static std::shared_ptr<Consumer> create(uv_loop_t* loop, ConsumerOptions options,
                                          Handler handler);
  static std::shared_ptr<Consumer> create(uv_loop_t* loop, ConsumerOptions options,
                                          AsyncHandler handler);
  /// Made by create(); a Consumer is a handle that shares the running consumer's state.
  explicit Consumer(std::shared_ptr<detail::ConsumerImpl> impl);
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  /// Connects and starts consuming; keeps trying with the recovery backoff while the broker is
  /// unreachable. Returns an error (and starts nothing) when called twice or the options are
  /// unusable.
  client::Error start();

  /// Graceful stop: cancels the consumer, returns deliveries whose handler has not started
  /// (nack, requeue), lets running handlers finish and their outcomes settle for up to
  /// `deadline`, then closes. The stopped handler fires once all is closed; past the deadline,
  /// as after stop_now().
  void stop(std::chrono::milliseconds deadline);
  /// Immediate stop: closes the connections now; every unacked message goes back to its queue.
  /// The stopped handler then fires once no synchronous handler is running any more, or after
  /// `handler_exit_timeout` at the latest; a handler's result that arrives after the close is
  /// dropped (its message comes back).
  void stop_now();

  void set_ready_handler(ReadyHandler handler);
  void set_stopped_handler(StoppedHandler handler);

  /// A copy of the counters and the latency histogram.
  Metrics metrics() const;
  /// True while consuming (between ready and a loss or stop).
  bool is_consuming() const;
  ConsumerState state() const;
  /// True while the broker blocks the connection that publishes retry and parking copies
  /// (connection.blocked: a memory or disk alarm). Copies wait meanwhile; acks keep flowing.
  bool is_blocked() const;
  /// The host (of the URI's hosts) the consumer consumes from; nullopt while it is not consuming.
  std::optional<client::Endpoint> consuming_from() const;
  /// Deliveries received and not yet settled (waiting, in a handler, or being published).
  size_t in_flight() const;
  /// Synchronous handlers running on the worker threads now, also after `stopped` (one that
  /// outlived `handler_exit_timeout`). Any thread.
  size_t handlers_running() const;
  /// Blocks the calling thread until no synchronous handler runs, or `timeout` passes; returns
  /// whether none runs. Any thread, also after the loop has ended (handlers never need the
  /// loop). Call it before destroying what an abandoned handler may still use.
  bool wait_for_handlers(std::chrono::milliseconds timeout) const;
  const topology::Service& service() const;

  /// Where the service's breaker stands in this consumer: closed while the dependency answers;
  /// open, probing or ramping while it is down or recovering; paused by pause().
  outage::State breaker_state() const;
  /// Whether the breaker is shared with the service's other instances now (share_breaker, and
  /// the consumer connected with its link to the broker set up).
  bool breaker_shared() const;
  /// How many handlers the breaker lets run at once now (the concurrency when closed).
  int breaker_limit() const;
  /// ConsumerOptions::parking_alert_threshold: the parking depth above which it warns (0: none).
  uint32_t parking_alert_threshold() const;
  /// Trips, probes, and time spent open, since the consumer was made.
  outage::Stats breaker_stats() const;
  /// Deliveries kept unsettled while the breaker does not let them run (their handlers have not
  /// started, or said the dependency is unavailable): uncharged, and back to the queue on a stop.
  /// While the breaker is closed, only those an unavailable outcome sent back to wait: the backlog
  /// waiting for a free handler is not held.
  size_t held() const;
  /// An operator's stop: the consumer takes no deliveries and starts no handler until resume();
  /// what it holds stays unsettled and uncharged. Running handlers finish and settle as usual.
  void pause();
  /// Ends a pause with one call first (a probe), then the breaker's ramp.
  void resume();

 private:
  std::shared_ptr<detail::ConsumerImpl> impl_;
};

}  // namespace retryloop::consumer
