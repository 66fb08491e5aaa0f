#pragma once

#include <uv.h>

#include <cstdint>
#include <list>
#include <memory>
#include <string>

namespace retryloop::test {

/// A TCP proxy on 127.0.0.1 that the tests control: it passes traffic to an upstream port, and
/// can freeze (stop relaying in both directions, keeping the sockets open, as a network that
/// drops every packet), hold back only the replies (what the upstream sends: a client's
/// publishes reach the broker, its confirms never come back) or cut (close every proxied
/// connection). Runs on the test's loop.
class TcpProxy {
 public:
  TcpProxy(uv_loop_t* loop, uint16_t upstream_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  /// The port clients connect to.
  uint16_t port() const { return port_; }

  /// Stops relaying; bytes already read are held back.
  void freeze();
  /// Stops relaying from the upstream to the clients only; those bytes are held back. After
  /// freeze(): relays what the clients send again, held bytes first, and keeps the replies held.
  void hold_replies();
  /// Relays again, held bytes first (after freeze() or hold_replies()).
  void thaw();
  /// Bytes the clients sent that are held back (frozen), over every connection.
  size_t held_from_clients() const;
  /// Closes every proxied connection at once (both sides see the socket close).
  void cut();
  /// Closes the listener and all connections (the destructor does too, and waits for them).
  void close();

  int accepted() const { return accepted_; }
  /// Bytes read from the upstream so far, over every connection (relayed or held).
  uint64_t from_upstream() const { return from_upstream_; }

 private:
  struct Pipe;
  void on_accept();
  void close_pipe(Pipe* pipe);

  uv_loop_t* loop_;
  uint16_t upstream_port_;
  uint16_t port_ = 0;
  uv_tcp_t listener_{};
  bool frozen_ = false;
  bool replies_held_ = false;
  bool closed_ = false;
  bool listener_closed_ = false;
  int accepted_ = 0;
  uint64_t from_upstream_ = 0;
  std::list<std::unique_ptr<Pipe>> pipes_;
};

}  // namespace retryloop::test
