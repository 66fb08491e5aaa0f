#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/frame.hpp"
#include "retryloop/client/connection.hpp"

namespace retryloop::client::detail {

class ChannelImpl;

/// The timers a connection's protocol asks its transport for.
enum class ProtocolTimer {
  /// Every half heartbeat interval, from connection.open-ok on.
  heartbeat,
  /// Once, `ack_delay` after a channel began to hold acks back.
  ack_delay,
  /// Once, when the client's connection.close has waited too long for its close-ok.
  close
};
/// How many ProtocolTimer values there are (a transport may keep its timers in an array).
inline constexpr size_t kProtocolTimers = static_cast<size_t>(ProtocolTimer::close) + 1;

/// What the protocol asks of the transport that carries its bytes: writes, timers, and the ends
/// of the connection. Every call happens inside a call into the protocol.
class ProtocolTransport {
 public:
  virtual ~ProtocolTransport() = default;
  /// output() has bytes to write: now, or after the write in flight.
  virtual void output_ready() = 0;
  /// True while a write is in flight (a heartbeat is due only when nothing is being written).
  virtual bool write_in_flight() const = 0;
  /// Calls timer_fired(timer, ...) after `delay_ms`, then every `repeat_ms` (0: once). Starting
  /// a running timer restarts it; the timers end with the connection.
  virtual void start_timer(ProtocolTimer timer, uint64_t delay_ms, uint64_t repeat_ms) = 0;
  /// connection.open-ok arrived: the connection is open.
  virtual void protocol_opened() = 0;
  /// The protocol ends the connection with `error` (the broker's close, the close-ok of the
  /// client's own, a protocol error, a missed heartbeat): the transport sends what output()
  /// holds if it can, closes the socket and calls terminate(error).
  virtual void protocol_ended(const Error& error) = 0;
  /// connection.blocked (true, with the broker's reason) or connection.unblocked (false).
  virtual void protocol_blocked(bool blocked, const std::string& reason) = 0;
};

/// A connection's AMQP protocol without I/O: the handshake, the channel table, heartbeats,
/// blocking and the close, driven by the bytes and the time its transport hands it, and
/// answering with bytes in output() and calls on the transport. It includes no libuv and no
/// OpenSSL; the unit tests drive it with bytes alone.
class ConnectionProtocol {
 public:
  /// Where the protocol is: idle until start(), then the handshake, open, closing (the
  /// client's connection.close sent), and closed.
  enum class Phase { idle, handshaking, open, closing, closed };

  ConnectionProtocol(const ConnectionOptions& options, ProtocolTransport& transport);
  ~ConnectionProtocol();
  ConnectionProtocol(const ConnectionProtocol&) = delete;
  ConnectionProtocol& operator=(const ConnectionProtocol&) = delete;

  // ---- driven by the transport ----

  /// The byte stream is up (after TLS, if any): sends the protocol header.
  void start(uint64_t now_ms);
  /// Bytes from the broker, at `now_ms`.
  void receive(std::string_view bytes, uint64_t now_ms);
  /// Something arrived at `now_ms` that is not yet protocol bytes (a TLS record in part).
  void heard_from_peer(uint64_t now_ms) { last_read_ms_ = now_ms; }
  void timer_fired(ProtocolTimer timer, uint64_t now_ms);
  /// Called before the transport looks at output() to write it: acks held back with no delay
  /// join it.
  void before_write();
  /// The transport began a write at `now_ms` (a heartbeat is due only after a quiet while).
  void wrote(uint64_t now_ms) { last_write_ms_ = now_ms; }
  /// The connection ended with `error`: the channels end with it. Idempotent.
  void terminate(const Error& error);

  // ---- the application's calls (Connection's) ----

  Error open_channel(ChannelCallback callback);
  /// Sends connection.close; the close timer bounds the wait for its close-ok. Only when open.
  void close();

  Phase phase() const { return phase_; }
  bool is_blocked() const { return blocked_; }
  const Tuning& tuning() const { return tuning_; }
  const amqp::FieldTable& server_properties() const { return server_properties_; }
  spdlog::logger* logger() const { return options_.logger.get(); }
  const ConnectionOptions& options() const { return options_; }

  // ---- used by the channels ----

  /// The bytes to be written; call flush() after appending.
  std::string& output() { return out_; }
  const std::string& output() const { return out_; }
  /// Asks the transport to write output(), unless a read is being handled (then after it).
  void flush();
  /// Called by a channel that starts holding an ack back: its release_held_acks() is called
  /// before the next write (ack_delay 0) or when the delay is over.
  void hold_acks(uint16_t channel_id);
  /// Called by a channel once it is closed and must leave the channel table.
  void release_channel(uint16_t id);
  /// Ends the connection because of a protocol violation, telling the broker why in a
  /// connection.close with `reply_code` (0: 505, unexpected-frame).
  void fail_protocol(const Error& error, uint16_t reply_code = 0);
  /// Largest body the connection accepts from the broker.
  uint64_t max_body_size() const { return options_.max_body_size; }

 private:
  /// Where the handshake is: the method the broker sends next.
  enum class HandshakeStep { start, tune, open_ok };

  bool handle_frame(const amqp::FrameView& frame);
  /// A frame for a channel number that is not open; false when it ended the connection.
  bool unknown_channel_frame(const amqp::FrameView& frame);
  Error handle_connection_method(std::string_view payload);
  Error on_start(std::string_view payload);
  Error on_tune(std::string_view payload);
  void on_open_ok();
  void on_heartbeat_tick(uint64_t now_ms);
  void release_held_acks();
  template <class Method>
  void send_connection_method(const Method& method);

  ConnectionOptions options_;
  ProtocolTransport& transport_;
  Phase phase_ = Phase::idle;
  HandshakeStep handshake_step_ = HandshakeStep::start;
  Tuning tuning_;
  amqp::FieldTable server_properties_;
  bool blocked_ = false;
  Error close_error_;

  amqp::FrameParser parser_;
  std::string out_;
  bool handling_read_ = false;
  uint64_t last_read_ms_ = 0;
  uint64_t last_write_ms_ = 0;
  uint64_t last_tick_ms_ = 0;
  bool timeout_deferred_ = false;

  std::vector<std::shared_ptr<ChannelImpl>> channels_;
  /// Channels that hold an ack back (see hold_acks), and whether the ack_delay timer runs.
  std::vector<uint16_t> channels_holding_acks_;
  bool ack_timer_running_ = false;
};

}  // namespace retryloop::client::detail
