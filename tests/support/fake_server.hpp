#pragma once

#include <uv.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace retryloop::test {

/// Starts `listener` on 127.0.0.1 at a free port, with `owner` as its data, calling
/// `on_connection` for each client; returns the port. The test fails if it cannot listen.
uint16_t listen_on_loopback(uv_loop_t* loop, uv_tcp_t& listener, void* owner,
                            uv_connection_cb on_connection);

/// A fake AMQP server on 127.0.0.1 that the tests script, on the test's loop. For each client
/// it waits for the 8-byte protocol header, then writes `script` as it is (garbage, truncated
/// or malformed frames) and, with `close_after`, closes the socket; otherwise it keeps the
/// connection open and silent.
class FakeServer {
 public:
  FakeServer(uv_loop_t* loop, std::string script, bool close_after);
  ~FakeServer();
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  uint16_t port() const { return port_; }
  /// Bytes received from clients, in order.
  const std::string& received() const { return received_; }

 private:
  struct Client;
  void on_accept();
  void close_client(Client* client);

  uv_loop_t* loop_;
  std::string script_;
  bool close_after_;
  uint16_t port_ = 0;
  uv_tcp_t listener_{};
  bool listener_closed_ = false;
  std::string received_;
  std::vector<std::unique_ptr<Client>> clients_;
  int open_clients_ = 0;
};

}  // namespace retryloop::test
