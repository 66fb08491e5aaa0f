#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "channel_impl.hpp"
#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/frame.hpp"
#include "retryloop/amqp/rabbit_extensions.hpp"
#include "retryloop/client/connection.hpp"

namespace retryloop::client::detail {

class TlsSession;

// What a Connection is: the socket, the handshake, heartbeats and the channel table. It keeps
// itself alive while its handles are open. Its public calls are Connection's (documented there).
class ConnectionImpl : public std::enable_shared_from_this<ConnectionImpl> {
 public:
  static std::shared_ptr<ConnectionImpl> create(uv_loop_t* loop, ConnectionOptions options);
  ~ConnectionImpl();
  ConnectionImpl(const ConnectionImpl&) = delete;
  ConnectionImpl& operator=(const ConnectionImpl&) = delete;

  Error connect(ConnectCallback callback);

  Error open_channel(ChannelCallback callback);

  void close(CompletionCallback callback = {});

  void set_lost_handler(ConnectionLostHandler handler) { on_lost_ = std::move(handler); }
  void set_blocked_handler(BlockedHandler handler) { on_blocked_ = std::move(handler); }

  bool is_open() const { return state_ == State::open; }
  bool is_blocked() const { return blocked_; }
  const Tuning& tuning() const { return tuning_; }
  const amqp::FieldTable& server_properties() const { return server_properties_; }
  const Uri& uri() const { return options_.uri; }
  uv_loop_t* loop() const { return loop_; }
  spdlog::logger* logger() const { return options_.logger.get(); }
  size_t buffered_bytes() const {
    return out_.size() + writing_.size() - writing_offset_ + tls_writing_;
  }
  // ---- used by Channel ----

  /// The buffer that frames are appended to; call `flush` after appending.
  std::string& output() { return out_; }
  /// Called by a channel that starts holding an ack back: the connection calls its
  /// release_held_acks() before the next write (ack_delay 0) or when the delay is over.
  void hold_acks(uint16_t channel_id);
  /// Writes the output buffer now, or after the write in flight (or the read being handled).
  void flush();
  /// Called by a channel once it is closed and must leave the channel table.
  void release_channel(uint16_t id);
  /// Tears the connection down because of a protocol violation on a channel, telling the broker
  /// why in a connection.close with `reply_code` (0: 505, unexpected-frame).
  void fail_protocol(const Error& error, uint16_t reply_code = 0);
  /// Largest body the connection accepts from the broker.
  uint64_t max_body_size() const { return options_.max_body_size; }

 private:
  enum class State {
    idle,
    resolving,
    connecting,
    tls_handshaking,
    handshaking,
    open,
    closing,
    closed
  };
  /// Where the AMQP handshake is (State::handshaking): the method the broker sends next.
  enum class HandshakeStep { start, tune, open_ok };

  ConnectionImpl(uv_loop_t* loop, ConnectionOptions options);

  void start_resolve();
  void try_next_address();
  void on_connected(int status);
  void start_reading();
  void on_read(ssize_t nread, const uv_buf_t* buf);
  void on_socket_end(const std::string& why);
  void handle_tls_bytes(std::string_view ciphertext);
  void advance_tls_handshake();
  void handle_bytes(std::string_view bytes);
  void start_write();
  bool handle_frame(const amqp::FrameView& frame);
  /// A frame for a channel number that is not open; false when it ended the connection.
  bool unknown_channel_frame(const amqp::FrameView& frame);
  Error handle_connection_method(std::string_view payload);
  Error on_start(std::string_view payload);
  Error on_tune(std::string_view payload);
  void on_heartbeat_tick();
  void release_held_acks();
  void finish(const Error& error);
  void close_handles();
  void close_handle(uv_handle_t* handle);
  void on_handle_closed();
  template <class Method>
  void send_connection_method(const Method& method);

  uv_loop_t* loop_;
  ConnectionOptions options_;
  State state_ = State::idle;
  HandshakeStep handshake_step_ = HandshakeStep::start;
  Tuning tuning_;
  amqp::FieldTable server_properties_;
  bool blocked_ = false;

  uv_getaddrinfo_t resolve_req_{};
  addrinfo* addresses_ = nullptr;
  addrinfo* next_address_ = nullptr;
  uv_tcp_t tcp_{};
  bool tcp_initialized_ = false;
  uv_connect_t connect_req_{};
  uv_timer_t connect_timer_{};
  uv_timer_t heartbeat_timer_{};
  uv_timer_t ack_timer_{};
  uv_write_t write_req_{};
  int open_handles_ = 0;
  std::shared_ptr<ConnectionImpl> self_;

  amqp::FrameParser parser_;
  std::vector<char> read_buffer_;
  std::string out_;
  std::string writing_;
  bool write_in_flight_ = false;
  bool handling_read_ = false;
  uint64_t last_read_ms_ = 0;
  uint64_t last_write_ms_ = 0;
  uint64_t last_tick_ms_ = 0;
  bool timeout_deferred_ = false;
  std::string last_connect_error_;

  // amqps:// only: writing_ holds frames being encrypted, writing_offset_ how far; what
  // arrives is decrypted into tls_plain_ for the parser. tls_writing_ counts the encrypted bytes
  // of the write in flight.
  std::unique_ptr<TlsSession> tls_;
  size_t writing_offset_ = 0;
  std::vector<char> tls_plain_;
  size_t tls_writing_ = 0;

  std::vector<std::shared_ptr<ChannelImpl>> channels_;
  /// Channels that hold an ack back (see hold_acks).
  std::vector<uint16_t> channels_holding_acks_;

  ConnectCallback on_connect_;
  ConnectionLostHandler on_lost_;
  BlockedHandler on_blocked_;
  std::vector<CompletionCallback> on_closed_;
  Error close_error_;
};

}  // namespace retryloop::client::detail
