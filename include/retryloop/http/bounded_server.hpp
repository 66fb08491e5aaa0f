#pragma once

// cpp-httplib's server with limits that hold against idle, slow and oversized clients. Shared by
// the parking console and the operations endpoint.

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "retryloop/http/request_framing.hpp"

namespace retryloop::http {

/// What a BoundedServer allows each connection.
struct ServerLimits {
  RequestLimits request;
  /// From the connection's accept to the request's last byte: a request not complete by then is
  /// answered 408 and closed, however steadily its bytes trickle in.
  std::chrono::milliseconds request_time{10000};
  /// How long writing the answer may take.
  std::chrono::milliseconds write_time{10000};
  /// Connections open at once; one more is answered 503 and closed at once.
  size_t max_connections = 512;
};

/// An answer the server gives itself (a refused request): the status, the reason in words, and
/// the response to fill in. The default is the reason as text/plain.
using RefusalWriter =
    std::function<void(httplib::Response&, int status, const std::string& reason)>;

/// An httplib::Server that reads each request whole, within ServerLimits, before its handlers see
/// it. Every connection has a thread of its own (at most `max_connections`), so no connection
/// waits for another; each answers one request and is closed (`Connection: close`). A client that
/// sent `Expect: 100-continue` gets one `100 Continue`, from the server, once the head is read and
/// its body has not come with it (none when it did: httplib's own is not sent). Routes,
/// handlers and default headers are set as on any httplib::Server; the thread and timeout knobs
/// of httplib::Server are not used.
class BoundedServer : public httplib::Server {
 public:
  explicit BoundedServer(ServerLimits limits = {});
  ~BoundedServer() override;

  /// Binds `host`:`port` (0: any free port) without SO_REUSEPORT, so that a port another
  /// program listens on is refused instead of shared. The port bound, or -1 with errno set.
  int bind(const std::string& host, int port);

  /// Answers through `writer` the requests the server refuses itself.
  void set_refusal_writer(RefusalWriter writer);

  /// The bytes a connection that sent `request` gets back: what the handlers answer to a
  /// complete request, the refusal otherwise (408 for one that stays incomplete). For tests and
  /// fuzzing: no socket is involved.
  std::string answer(std::string_view request);

  /// Connections open now.
  size_t connections() const;

 private:
  class ConnectionThreads;
  bool process_and_close_socket(socket_t sock) override;
  /// A complete HTTP response for a refusal, with `Connection: close`.
  std::string refusal(int status, const std::string& reason) const;
  /// Hands the complete request to httplib; writes through `write`.
  void dispatch(std::string_view request, const std::string& remote_ip, int remote_port,
                const std::function<bool(std::string_view)>& write);

  const ServerLimits limits_;
  RefusalWriter refusal_writer_;
  mutable std::mutex mutex_;
  std::condition_variable all_closed_;
  std::set<socket_t> open_;
  bool stopping_ = false;
};

}  // namespace retryloop::http
