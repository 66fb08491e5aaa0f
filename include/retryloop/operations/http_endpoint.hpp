#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "retryloop/client/error.hpp"
#include "retryloop/client/loop.hpp"
#include "retryloop/consumer/consumer.hpp"

namespace spdlog {
class logger;
}

namespace retryloop::operations {

namespace detail {
class HttpEndpointImpl;
}

/// Where an HTTP endpoint listens.
struct ListenAddress {
  std::string host = "127.0.0.1";
  /// 0: a free port, picked when it starts (HttpEndpoint::port() tells which).
  uint16_t port = 9464;

  /// `host:port`, with an IPv6 host in brackets.
  std::string text() const;
};

/// Parses `HOST:PORT`, `[IPV6]:PORT` or a bare `PORT` (on 127.0.0.1). Throws
/// std::invalid_argument naming what is wrong.
ListenAddress parse_listen_address(std::string_view text);

struct HttpEndpointOptions {
  /// Loopback unless told otherwise: `0.0.0.0` (or `::`) serves every interface.
  ListenAddress listen;
  /// How long a request waits for the loop thread to answer before it gets 503: a loop thread
  /// that does not answer within it fails `/healthz`.
  std::chrono::milliseconds loop_timeout{2000};
  /// A request not complete this long after its connection opened is answered 408 and closed.
  std::chrono::milliseconds request_time{10000};
  /// Connections open at once, each on a thread of its own; one more is answered 503 at once.
  size_t max_connections = 512;
  /// Where it logs (the address it listens on, failures); nullptr: nowhere.
  std::shared_ptr<spdlog::logger> logger;
};

/// The operations endpoint of a process that runs consumers: Prometheus metrics and health
/// probes over HTTP (cpp-httplib), on threads of its own.
///
///   GET /metrics  200, the consumers' metrics (prometheus_text)
///   GET /healthz  200 while the process and its loop thread answer
///   GET /readyz   200 while every consumer consumes and none is blocked by the broker; 503
///                 while one connects, reconnects, is blocked (connection.blocked), stops or has
///                 stopped; the body says which
///
/// Threads: create(), add(), start() and close() on the loop thread. Requests are served on the
/// endpoint's own threads (one a connection, so that an idle or slow client delays nobody else),
/// which never touch a consumer: each request asks the loop thread (through a client::LoopBridge)
/// for a snapshot of the consumers and waits for it up to `loop_timeout`.
///
/// Lifetime: once started it keeps itself and the loop alive until close(); close it when its
/// consumers have stopped (for example from their stopped handler).
class HttpEndpoint {
 public:
  static std::shared_ptr<HttpEndpoint> create(uv_loop_t* loop, HttpEndpointOptions options);
  /// Made by create(); an HttpEndpoint is a handle that shares the endpoint's state.
  explicit HttpEndpoint(std::shared_ptr<detail::HttpEndpointImpl> impl);
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  /// Reports `consumer` too (it is kept until close). Before or after start().
  void add(std::shared_ptr<consumer::Consumer> consumer);
  /// Adds the text `source` returns, in Prometheus' text format, to each `/metrics` answer after
  /// the consumers' (outbox::prometheus_text for a relay, inbox::prometheus_text for an inbox).
  /// `source` runs on the loop thread. Before or after start().
  void add_metrics(std::function<std::string()> source);
  /// Binds the address and starts serving. Returns an error (and serves nothing) when the
  /// address cannot be bound, or when called twice or after close().
  client::Error start();
  /// The port it listens on (the picked one for port 0); 0 before start().
  uint16_t port() const;
  /// Stops serving: requests waiting for the loop get 503 at once, open connections are closed,
  /// the server's threads are joined on a thread of its own, and `done` runs on the loop thread
  /// once its handle is closed; the loop never blocks on it. A later call's `done` runs then too
  /// (at once, once closed).
  void close(std::function<void()> done = {});

 private:
  std::shared_ptr<detail::HttpEndpointImpl> impl_;
};

}  // namespace retryloop::operations
