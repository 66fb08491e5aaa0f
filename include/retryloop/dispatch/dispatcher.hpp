#pragma once

#include <uv.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/dispatch/http_client.hpp"
#include "retryloop/dispatch/request.hpp"
#include "retryloop/dispatch/response.hpp"
#include "retryloop/retry/metrics.hpp"

namespace retryloop::dispatch {

/// What a Dispatcher is told.
struct DispatcherOptions {
  /// Where the requests go, and the client's limits.
  ClientSettings http;
  /// The service and its max_attempts, for the request's fields.
  RequestSettings request;
};

/// What a Dispatcher has done since it was made.
struct DispatchStats {
  /// Answers by status class: index 1 for 1xx up to 5 for 5xx; index 0 for a status outside
  /// 100-599.
  std::array<uint64_t, 6> answers{};
  /// Exchanges that ended without an answer, indexed by Failure (index 0, none, stays 0).
  std::array<uint64_t, 7> failures{};
  /// The outcomes the exchanges meant, indexed by retry::OutcomeKind.
  std::array<uint64_t, 6> outcomes{};
  /// How long each exchange took, from its post to the answer's end or the failure.
  retry::LatencyHistogram latency;
  /// The HTTP client's counters: requests in flight, connections open and opened.
  ClientStats client;
  /// ClientSettings::pool_size: the connections it may keep open.
  size_t pool_size = 0;
};

/// The handler of `retryloop dispatch`: each message becomes an HTTP POST to the application
/// (make_request: the CloudEvents HTTP binding, binary mode), and the answer its outcome
/// (outcome_of; docs/dispatch.md has the table). A 429's `Retry-After` becomes the quiet the
/// service's breaker keeps (Outcome::overloaded), a refused connection or a timeout an
/// unavailable dependency, which the breaker counts and which costs the message no attempt.
///
/// Threads: everything on the loop's thread, the consumer's (handler() is an AsyncHandler).
/// Lifetime: the handler keeps the dispatcher; close() it once its consumer has stopped.
class Dispatcher : public std::enable_shared_from_this<Dispatcher> {
 public:
  /// Throws std::invalid_argument for settings the HTTP client refuses (HttpClient).
  static std::shared_ptr<Dispatcher> create(uv_loop_t* loop, DispatcherOptions options);

  /// The consumer's handler: posts the message and settles it with what the answer means.
  consumer::AsyncHandler handler();
  /// What it has done so far.
  DispatchStats stats() const;
  /// Ends its HTTP client: requests still in flight fail (their messages unavailable, so held or
  /// handed back, never charged); `closed` runs once its handles are closed.
  void close(std::function<void()> closed = {});

  /// Made by create().
  Dispatcher(uv_loop_t* loop, DispatcherOptions options);

 private:
  void dispatch(const consumer::Message& message, consumer::Settle settle);
  void answered(const Response& response, const consumer::Settle& settle);

  DispatcherOptions options_;
  std::string target_text_;
  HttpClient client_;
  DispatchStats stats_;
};

/// A dispatcher's metrics in Prometheus' text format, each sample labelled with `service`:
/// retryloop_dispatch_answers_total{class="2xx"}, retryloop_dispatch_failures_total{failure=
/// "refused"}, retryloop_dispatch_outcomes_total{outcome="retry"}, the exchange latency histogram
/// retryloop_dispatch_request_duration_seconds, and the gauges retryloop_dispatch_in_flight,
/// retryloop_dispatch_connections_open and retryloop_dispatch_pool_size, and the counters
/// retryloop_dispatch_connections_opened_total and retryloop_dispatch_bodies_cut_total.
std::string prometheus_text(const DispatchStats& stats, const std::string& service);

}  // namespace retryloop::dispatch
