#pragma once

#include <uv.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "retryloop/dispatch/response.hpp"

namespace retryloop::dispatch {

/// Which HTTP versions the client speaks.
enum class HttpVersion {
  /// HTTP/1.1 only.
  http1,
  /// HTTP/2 when a TLS server offers it by ALPN, HTTP/1.1 otherwise (and always in cleartext).
  negotiate,
  /// HTTP/2 from the first byte, without asking (h2c with prior knowledge; over TLS, h2 by ALPN
  /// or nothing). For an application known to speak cleartext HTTP/2. Needs libcurl 8.0.0 or
  /// later: before it, every request on a reused connection fails.
  http2_prior_knowledge,
};

/// How an HttpClient reaches the application, and its limits.
struct ClientSettings {
  /// Where every request goes: `http://host:port/path`, `https://host:port/path`, or a Unix
  /// socket `unix:/run/app.sock` (HTTP path `/`) or `unix:/run/app.sock:/path` (the HTTP path
  /// after the first colon that follows the socket's path; a socket path with a colon cannot be
  /// named). Over a Unix socket the request is cleartext HTTP with `Host: localhost`.
  std::string target;

  /// Connections kept open to the target at most, busy and idle together. A request that finds
  /// every connection busy waits inside the client for one to free up (HTTP/1.1), or shares one
  /// (HTTP/2 multiplexes up to the server's stream limit, at most 100 streams per connection).
  /// That wait counts in the request timeout: give at least as many connections as requests
  /// are sent at once over HTTP/1.1.
  std::size_t pool_size = 64;

  /// Which HTTP versions to speak.
  HttpVersion http_version = HttpVersion::negotiate;

  /// To open the connection, the TLS handshake included.
  std::chrono::milliseconds connect_timeout{5000};
  /// For the whole exchange, from post() to the answer's last byte: waiting for a free
  /// connection, connecting, sending and receiving.
  std::chrono::milliseconds request_timeout{30000};

  /// The answer's body is kept up to this many bytes. A longer one is cut there
  /// (Response::body_cut), the rest is not read, and the connection is closed (over HTTP/2 the
  /// stream is reset): a huge or endless answer never holds more than this in memory.
  std::size_t max_body_bytes = 1 << 20;
  /// The answer's status line and header fields together, interim (1xx) answers included. More
  /// is Failure::broken.
  std::size_t max_header_bytes = 64 << 10;

  /// HTTPS: the PEM file of the certificate authorities that may sign the server's certificate;
  /// empty: the system's store. The server's certificate and name are always verified; there
  /// is no way to turn that off.
  std::string ca_file;
  /// HTTPS: the client's certificate (PEM), when the server asks for one; empty: none.
  std::string client_certificate;
  /// HTTPS: the client certificate's private key (PEM, not encrypted); empty: in the
  /// certificate's file.
  std::string client_key;
};

/// What an HttpClient has done.
struct ClientStats {
  /// Requests posted whose callback has not run yet.
  std::size_t in_flight = 0;
  /// Connections open now, busy or idle in the pool.
  std::size_t connections_open = 0;
  /// Connections opened since the start, attempts that failed included.
  std::uint64_t connections_opened = 0;
  /// Exchanges ended, answered or failed (close() included, not the posts refused after it).
  std::uint64_t requests = 0;
  /// Answers whose body was cut at ClientSettings::max_body_bytes.
  std::uint64_t bodies_cut = 0;
  /// Answers received over HTTP/2.
  std::uint64_t http2_answers = 0;
};

/// An HTTP client on a libuv loop: libcurl's multi-socket interface, driven by the loop's
/// sockets and one timer. No thread per request, and no thread of its own (except the one
/// libcurl may start to resolve a host name). It POSTs to one target and keeps a bounded pool of
/// keep-alive connections to it. It follows no redirect, asks for no compression, and uses no
/// proxy (http_proxy and the like are ignored).
///
/// Thread rule: construct it, call every member and destroy it on the loop's thread; every
/// callback runs on that thread. The loop must run for anything to happen.
///
/// Lifetime: close() ends it: requests in flight fail, and every handle of the client is closed,
/// so that a loop with nothing else on it ends. Destroying the client without close() abandons
/// the requests in flight (their callbacks are destroyed, never run) and closes the handles the
/// same way; their memory is freed when the loop runs the handles' close. A callback may
/// destroy or close the client.
class HttpClient {
 public:
  /// Header fields of a request, in the order sent, names as given.
  using HeaderFields = std::vector<std::pair<std::string, std::string>>;
  /// Runs once per post(), with how the exchange ended.
  using ResponseCallback = std::function<void(Response)>;
  /// Runs once when close() is over.
  using ClosedCallback = std::function<void()>;

  /// A client of `settings.target` on `loop`. Throws std::invalid_argument for a target that is
  /// not http://, https:// or unix:, a pool of 0, a zero limit, or HTTP/2 with prior knowledge on
  /// a libcurl older than 8.0.0; std::runtime_error when libcurl cannot start.
  HttpClient(uv_loop_t* loop, ClientSettings settings);
  /// See the class comment: without close(), the requests in flight are abandoned.
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// POSTs `body` with `headers` to the target; `path` empty: the target's own path, otherwise
  /// this path (and query) on the target's host instead. `done` runs once, from the loop after
  /// post() returned, with the answer or the failure; but after close(), or when libcurl
  /// refuses the request, it runs at once, inside post(), with Failure::broken. Without a
  /// `Content-Type` field the request has none; `Expect: 100-continue` is never sent; a CR or LF
  /// in a field's value is sent as a space. On a failure after the status line came, the
  /// Response keeps that status and the header fields.
  void post(std::string_view path, const HeaderFields& headers, std::string body,
            ResponseCallback done);

  /// Ends the client: every request in flight fails with Failure::broken ("closed before the
  /// answer"), its callback run inside close(); the connections are closed; `closed` runs from
  /// the loop once every handle of the client is closed. Later calls do nothing (their `closed`
  /// never runs).
  void close(ClosedCallback closed = {});

  /// Requests posted whose callback has not run yet.
  std::size_t in_flight() const;
  /// The counters; after the client closed, as they were at the end.
  ClientStats stats() const;

 private:
  class Impl;
  friend class Impl;
  Impl* impl_;  // frees itself once its handles are closed; null after that
  ClientStats final_stats_;
};

}  // namespace retryloop::dispatch
