#pragma once

#include <uv.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/client/connection.hpp"
#include "retryloop/client/detail/connection_protocol.hpp"

namespace retryloop::client::detail {

class TlsSession;

// What a Connection is on the wire: the resolve, the socket, TLS and the timers, on libuv, carrying
// a ConnectionProtocol (the AMQP protocol, without I/O). It keeps itself alive while its handles
// are open. Its public calls are Connection's (documented there).
class ConnectionImpl : public std::enable_shared_from_this<ConnectionImpl>,
                       private ProtocolTransport {
 public:
  static std::shared_ptr<ConnectionImpl> create(uv_loop_t* loop, ConnectionOptions options);
  ~ConnectionImpl() override;
  ConnectionImpl(const ConnectionImpl&) = delete;
  ConnectionImpl& operator=(const ConnectionImpl&) = delete;

  Error connect(ConnectCallback callback);

  Error open_channel(ChannelCallback callback) {
    return protocol_.open_channel(std::move(callback));
  }

  void close(CompletionCallback callback = {});

  void set_lost_handler(ConnectionLostHandler handler) { on_lost_ = std::move(handler); }
  void set_blocked_handler(BlockedHandler handler) { on_blocked_ = std::move(handler); }

  bool is_open() const { return protocol_.phase() == ConnectionProtocol::Phase::open; }
  bool is_blocked() const { return protocol_.is_blocked(); }
  const Tuning& tuning() const { return protocol_.tuning(); }
  const amqp::FieldTable& server_properties() const { return protocol_.server_properties(); }
  const Uri& uri() const { return protocol_.options().uri; }
  uv_loop_t* loop() const { return loop_; }
  spdlog::logger* logger() const { return protocol_.logger(); }
  size_t buffered_bytes() const {
    return protocol_.output().size() + writing_.size() - writing_offset_ + tls_writing_;
  }

 private:
  /// Where the transport is; from `protocol` on, the protocol's phase tells the rest.
  enum class State { idle, resolving, connecting, tls_handshaking, protocol, closed };

  ConnectionImpl(uv_loop_t* loop, ConnectionOptions options);

  // ProtocolTransport
  void output_ready() override { start_write(); }
  bool write_in_flight() const override { return write_in_flight_; }
  void start_timer(ProtocolTimer timer, uint64_t delay_ms, uint64_t repeat_ms) override;
  void protocol_opened() override;
  void protocol_ended(const Error& error) override { finish(error); }
  void protocol_blocked(bool blocked, const std::string& reason) override;

  const ConnectionOptions& options() const { return protocol_.options(); }
  void start_resolve();
  void try_next_address();
  void on_connected(int status);
  void start_reading();
  void on_read(ssize_t nread, const uv_buf_t* buf);
  void on_socket_end(const std::string& why);
  void handle_tls_bytes(std::string_view ciphertext);
  void advance_tls_handshake();
  void start_write();
  void finish(const Error& error);
  void close_handles();
  void close_handle(uv_handle_t* handle);
  void on_handle_closed();

  uv_loop_t* loop_;
  ConnectionProtocol protocol_;
  State state_ = State::idle;

  uv_getaddrinfo_t resolve_req_{};
  addrinfo* addresses_ = nullptr;
  addrinfo* next_address_ = nullptr;
  uv_tcp_t tcp_{};
  bool tcp_initialized_ = false;
  uv_connect_t connect_req_{};
  uv_timer_t connect_timer_{};
  /// The protocol's timers, indexed by ProtocolTimer.
  std::array<uv_timer_t, kProtocolTimers> protocol_timers_{};
  uv_write_t write_req_{};
  int open_handles_ = 0;
  std::shared_ptr<ConnectionImpl> self_;

  std::vector<char> read_buffer_;
  std::string writing_;
  bool write_in_flight_ = false;
  std::string last_connect_error_;

  // amqps:// only: writing_ holds frames being encrypted, writing_offset_ how far; what
  // arrives is decrypted into tls_plain_ for the protocol. tls_writing_ counts the encrypted
  // bytes of the write in flight.
  std::unique_ptr<TlsSession> tls_;
  size_t writing_offset_ = 0;
  std::vector<char> tls_plain_;
  size_t tls_writing_ = 0;

  ConnectCallback on_connect_;
  ConnectionLostHandler on_lost_;
  BlockedHandler on_blocked_;
  std::vector<CompletionCallback> on_closed_;
};

}  // namespace retryloop::client::detail
