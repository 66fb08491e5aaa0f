#include "retryloop/client/detail/connection_protocol.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "channel_impl.hpp"
#include "retryloop/amqp/rabbit_extensions.hpp"

namespace retryloop::client::detail {
namespace {

using amqp::FrameType;

constexpr uint32_t kDefaultFrameMax = 131072;
constexpr uint16_t kDefaultChannelMax = 2047;
constexpr uint64_t kCloseTimeoutMs = 5000;

/// Negotiates a limit where 0 means "no limit": the smaller of the two non-zero values.
template <class T>
T negotiate_limit(T client, T server) {
  if (client == 0) return server;
  if (server == 0) return client;
  return std::min(client, server);
}

bool has_mechanism(std::string_view mechanisms, std::string_view wanted) {
  while (!mechanisms.empty()) {
    size_t space = mechanisms.find(' ');
    if (mechanisms.substr(0, space) == wanted) return true;
    if (space == std::string_view::npos) break;
    mechanisms.remove_prefix(space + 1);
  }
  return false;
}

amqp::FieldTable client_properties(const std::string& connection_name) {
  amqp::FieldTable capabilities;
  capabilities.append("publisher_confirms", true);
  capabilities.append("consumer_cancel_notify", true);
  capabilities.append("connection.blocked", true);
  capabilities.append("basic.nack", true);
  capabilities.append("authentication_failure_close", true);
  capabilities.append("exchange_exchange_bindings", true);
  capabilities.append("per_consumer_qos", true);
  amqp::FieldTable properties;
  properties.append("product", "retryloop");
  properties.append("version", "0.1.0");
  properties.append("platform", "C++17/libuv");
  properties.append("information", "delayed retries on RabbitMQ");
  properties.append("capabilities", std::move(capabilities));
  if (!connection_name.empty()) properties.append("connection_name", connection_name);
  return properties;
}

}  // namespace

ConnectionProtocol::ConnectionProtocol(const ConnectionOptions& options,
                                       ProtocolTransport& transport)
    : options_(options), transport_(transport), parser_(kDefaultFrameMax) {}

ConnectionProtocol::~ConnectionProtocol() = default;

void ConnectionProtocol::start(uint64_t now_ms) {
  phase_ = Phase::handshaking;
  last_read_ms_ = now_ms;
  out_.append(amqp::kProtocolHeader.data(), amqp::kProtocolHeader.size());
  flush();
}

void ConnectionProtocol::receive(std::string_view bytes, uint64_t now_ms) {
  last_read_ms_ = now_ms;
  handling_read_ = true;
  std::error_code ec =
      parser_.feed(bytes, [this](const amqp::FrameView& frame) { return handle_frame(frame); });
  handling_read_ = false;
  if (phase_ == Phase::closed) return;
  if (ec) {
    std::string text = ec.message();
    if (ec == amqp::CodecError::frame_too_large) {
      text += " (a frame of " + std::to_string(parser_.refused_frame_size()) +
              " bytes; frames up to " + std::to_string(parser_.max_frame_size()) +
              " bytes are accepted, frame_max " + std::to_string(tuning_.frame_max) + ")";
    }
    // A frame that cannot be read at all: frame-error (501) in the connection.close.
    fail_protocol(Error(ClientError::protocol_error, std::move(text)), 501);
    return;
  }
  flush();
}

bool ConnectionProtocol::handle_frame(const amqp::FrameView& frame) {
  if (frame.channel == 0) {
    if (frame.type == FrameType::heartbeat) return true;
    if (frame.type != FrameType::method) {
      fail_protocol(Error(ClientError::protocol_error, "content frame on channel 0"));
      return false;
    }
    if (Error error = handle_connection_method(frame.payload)) {
      fail_protocol(error);
      return false;
    }
    return phase_ != Phase::closed;
  }
  if (phase_ == Phase::closing) return true;  // discarded until close-ok
  if (phase_ != Phase::open) {
    fail_protocol(Error(ClientError::protocol_error, "channel frame before the connection opened"));
    return false;
  }
  std::shared_ptr<ChannelImpl> channel =
      frame.channel < channels_.size() ? channels_[frame.channel] : nullptr;
  if (!channel) return unknown_channel_frame(frame);
  if (Error error = channel->handle_frame(frame)) {
    fail_protocol(error);
    return false;
  }
  return phase_ != Phase::closed;
}

bool ConnectionProtocol::unknown_channel_frame(const amqp::FrameView& frame) {
  // As the well-kept clients do: a channel.close is answered, a late channel.close-ok ignored,
  // content dropped; any other method on a channel that is not open is a channel error.
  if (frame.type != FrameType::method) {
    if (auto* log = logger()) log->warn("dropping a frame for unknown channel {}", frame.channel);
    return true;
  }
  amqp::MethodId id;
  if (auto ec = amqp::peek_method_id(frame.payload, id)) {
    fail_protocol(Error(ec));
    return false;
  }
  if (id.key() == amqp::method_key<amqp::ChannelClose>()) {
    amqp::append_method_frame(out_, frame.channel, amqp::ChannelCloseOk{});
    flush();
    return true;
  }
  if (id.key() == amqp::method_key<amqp::ChannelCloseOk>()) return true;
  const char* name = amqp::method_name(id.class_id, id.method_id);
  fail_protocol(
      Error(ClientError::protocol_error, std::string(name ? name : "a method") + " on channel " +
                                             std::to_string(frame.channel) + ", which is not open"),
      504);
  return false;
}

template <class Method>
void ConnectionProtocol::send_connection_method(const Method& method) {
  amqp::append_method_frame(out_, 0, method);
  flush();
}

Error ConnectionProtocol::handle_connection_method(std::string_view payload) {
  amqp::MethodId id;
  if (auto ec = amqp::peek_method_id(payload, id)) return Error(ec);
  switch (id.key()) {
    // The handshake's methods come once each, in order: start, tune, open-ok.
    case amqp::method_key<amqp::ConnectionStart>(): {
      if (phase_ != Phase::handshaking || handshake_step_ != HandshakeStep::start) break;
      Error error = on_start(payload);
      if (!error) handshake_step_ = HandshakeStep::tune;
      return error;
    }
    case amqp::method_key<amqp::ConnectionTune>(): {
      if (phase_ != Phase::handshaking || handshake_step_ != HandshakeStep::tune) break;
      Error error = on_tune(payload);
      if (!error) handshake_step_ = HandshakeStep::open_ok;
      return error;
    }
    case amqp::method_key<amqp::ConnectionOpenOk>(): {
      if (phase_ != Phase::handshaking || handshake_step_ != HandshakeStep::open_ok) break;
      on_open_ok();
      return {};
    }
    case amqp::method_key<amqp::ConnectionClose>(): {
      amqp::ConnectionClose m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      send_connection_method(amqp::ConnectionCloseOk{});
      ClientError code = ClientError::connection_closed;
      if (phase_ == Phase::handshaking) {
        if (m.reply_code == 403) code = ClientError::authentication_failed;
        if (m.reply_code == 530) code = ClientError::vhost_refused;
      }
      Error error(code, m.reply_text);
      error.reply_code = m.reply_code;
      error.class_id = m.failing_class_id;
      error.method_id = m.failing_method_id;
      transport_.protocol_ended(error);
      return {};
    }
    case amqp::method_key<amqp::ConnectionCloseOk>():
      if (phase_ != Phase::closing) break;
      transport_.protocol_ended(Error(ClientError::closed_by_client));
      return {};
    case amqp::method_key<amqp::ConnectionBlocked>(): {
      amqp::ConnectionBlocked m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      blocked_ = true;
      if (auto* log = logger()) log->warn("broker blocked publishing: {}", m.reason);
      transport_.protocol_blocked(true, m.reason);
      return {};
    }
    case amqp::method_key<amqp::ConnectionUnblocked>():
      blocked_ = false;
      if (auto* log = logger()) log->info("broker unblocked publishing");
      transport_.protocol_blocked(false, std::string());
      return {};
    default:
      break;
  }
  const char* name = amqp::method_name(id.class_id, id.method_id);
  return Error(ClientError::protocol_error,
               std::string("unexpected ") + (name ? name : "unknown method") + " on channel 0");
}

Error ConnectionProtocol::on_start(std::string_view payload) {
  amqp::ConnectionStart start;
  if (auto ec = amqp::decode_method_frame(payload, start)) return Error(ec);
  if (start.version_major != 0 || start.version_minor != 9) {
    return Error(ClientError::protocol_error, "broker speaks AMQP " +
                                                  std::to_string(start.version_major) + "-" +
                                                  std::to_string(start.version_minor));
  }
  if (!has_mechanism(start.mechanisms, "PLAIN")) {
    return Error(ClientError::authentication_failed,
                 "broker does not offer PLAIN authentication (offers: " + start.mechanisms + ")");
  }
  server_properties_ = std::move(start.server_properties);
  amqp::ConnectionStartOk ok;
  ok.client_properties = client_properties(options_.connection_name);
  ok.mechanism = "PLAIN";
  ok.response.reserve(options_.uri.user.size() + options_.uri.password.size() + 2);
  ok.response.push_back('\0');
  ok.response += options_.uri.user;
  ok.response.push_back('\0');
  ok.response += options_.uri.password;
  ok.locale = "en_US";
  if (auto ec = amqp::append_method_frame(out_, 0, ok)) {
    return Error(ClientError::invalid_argument, "connection.start-ok: " + ec.message());
  }
  flush();
  return {};
}

Error ConnectionProtocol::on_tune(std::string_view payload) {
  amqp::ConnectionTune tune;
  if (auto ec = amqp::decode_method_frame(payload, tune)) return Error(ec);
  const Uri& uri = options_.uri;
  uint16_t channel_max = options_.channel_max != 0 ? options_.channel_max
                                                   : uri.channel_max.value_or(kDefaultChannelMax);
  uint32_t frame_max =
      options_.frame_max != 0 ? options_.frame_max : uri.frame_max.value_or(kDefaultFrameMax);
  tuning_.channel_max = negotiate_limit<uint16_t>(channel_max, tune.channel_max);
  if (tuning_.channel_max == 0) tuning_.channel_max = 65535;
  tuning_.frame_max = negotiate_limit<uint32_t>(frame_max, tune.frame_max);
  if (tuning_.frame_max == 0) tuning_.frame_max = 0xFFFFFFFFu;
  const uint32_t min_frame_max = broker_min_frame_max(server_properties_);
  if (tuning_.frame_max < min_frame_max) {
    if (auto* log = logger(); log && frame_max < min_frame_max) {
      const auto version = client::broker_version(server_properties_);
      log->warn("frame_max {} raised to {}: the broker{} accepts no smaller frames", frame_max,
                min_frame_max, version ? " (RabbitMQ " + version->text() + ")" : std::string());
    }
    tuning_.frame_max = min_frame_max;
  }
  std::optional<uint16_t> heartbeat =
      options_.heartbeat_seconds ? options_.heartbeat_seconds : uri.heartbeat_seconds;
  if (!heartbeat) {
    tuning_.heartbeat_seconds = tune.heartbeat;
  } else if (*heartbeat == 0) {
    tuning_.heartbeat_seconds = 0;  // the application turned heartbeats off
  } else {
    tuning_.heartbeat_seconds = negotiate_limit<uint16_t>(*heartbeat, tune.heartbeat);
  }

  amqp::ConnectionTuneOk ok;
  ok.channel_max = tuning_.channel_max;
  ok.frame_max = tuning_.frame_max;
  ok.heartbeat = tuning_.heartbeat_seconds;
  amqp::append_method_frame(out_, 0, ok);
  parser_.set_max_frame_size(amqp::inbound_frame_limit(tune.frame_max, tuning_.frame_max));
  channels_.assign(size_t{tuning_.channel_max} + 1, nullptr);

  amqp::ConnectionOpen open;
  open.virtual_host = uri.vhost;
  if (auto ec = amqp::append_method_frame(out_, 0, open)) {
    return Error(ClientError::invalid_argument, "vhost name: " + ec.message());
  }
  flush();
  return {};
}

void ConnectionProtocol::on_open_ok() {
  phase_ = Phase::open;
  if (tuning_.heartbeat_seconds > 0) {
    const uint64_t interval = tuning_.heartbeat_seconds * 500ull;
    transport_.start_timer(ProtocolTimer::heartbeat, interval, interval);
  }
  transport_.protocol_opened();
}

void ConnectionProtocol::timer_fired(ProtocolTimer timer, uint64_t now_ms) {
  switch (timer) {
    case ProtocolTimer::heartbeat:
      on_heartbeat_tick(now_ms);
      return;
    case ProtocolTimer::ack_delay:
      ack_timer_running_ = false;
      release_held_acks();
      flush();
      return;
    case ProtocolTimer::close:
      if (phase_ == Phase::closing) transport_.protocol_ended(Error(ClientError::closed_by_client));
      return;
  }
}

void ConnectionProtocol::on_heartbeat_tick(uint64_t now) {
  if (phase_ != Phase::open && phase_ != Phase::closing) return;
  uint64_t interval_ms = tuning_.heartbeat_seconds * 1000ull;
  // Ticks come every half interval. One that comes a whole interval or more after the last means
  // the loop itself stalled; libuv runs timers before it reads, so what the broker sent meanwhile
  // is still unread. Then the next tick, after a read, decides (once: a loop that stalls on every
  // tick still finds a dead peer).
  const bool loop_stalled = last_tick_ms_ != 0 && now - last_tick_ms_ >= interval_ms;
  last_tick_ms_ = now;
  if (now - last_read_ms_ < 2 * interval_ms) {
    timeout_deferred_ = false;
  } else if (loop_stalled && !timeout_deferred_) {
    timeout_deferred_ = true;
  } else {
    transport_.protocol_ended(
        Error(ClientError::heartbeat_timeout,
              "nothing received for " + std::to_string((now - last_read_ms_) / 1000) + " s"));
    return;
  }
  if (now - last_write_ms_ >= interval_ms / 2 && out_.empty() && !transport_.write_in_flight()) {
    amqp::append_heartbeat_frame(out_);
    flush();
  }
}

Error ConnectionProtocol::open_channel(ChannelCallback callback) {
  if (phase_ != Phase::open) return close_error_ ? close_error_ : Error(ClientError::not_open);
  uint16_t id = 0;
  for (size_t i = 1; i < channels_.size(); ++i) {
    if (!channels_[i]) {
      id = static_cast<uint16_t>(i);
      break;
    }
  }
  if (id == 0) return Error(ClientError::channel_limit);
  auto channel = std::make_shared<ChannelImpl>(this, id);
  channels_[id] = channel;
  channel->open([channel, callback = std::move(callback)](const Error& error) {
    if (callback) callback(error, error ? nullptr : std::make_shared<Channel>(channel));
  });
  return {};
}

void ConnectionProtocol::release_channel(uint16_t id) {
  if (id < channels_.size()) channels_[id].reset();
}

void ConnectionProtocol::fail_protocol(const Error& error, uint16_t reply_code) {
  if (phase_ == Phase::closed) return;
  if (auto* log = logger()) log->error("protocol error: {}", error.message());
  if (phase_ == Phase::open || phase_ == Phase::handshaking) {
    amqp::ConnectionClose close;
    close.reply_code = reply_code != 0 ? reply_code : 505;
    close.reply_text = error.message().substr(0, 255);
    amqp::append_method_frame(out_, 0, close);
  }
  transport_.protocol_ended(error);
}

void ConnectionProtocol::hold_acks(uint16_t channel_id) {
  channels_holding_acks_.push_back(channel_id);
  if (options_.ack_delay.count() > 0 && !ack_timer_running_) {
    ack_timer_running_ = true;
    transport_.start_timer(ProtocolTimer::ack_delay,
                           static_cast<uint64_t>(options_.ack_delay.count()), 0);
  }
}

void ConnectionProtocol::release_held_acks() {
  for (uint16_t id : channels_holding_acks_) {
    if (id < channels_.size() && channels_[id]) channels_[id]->release_held_acks();
  }
  channels_holding_acks_.clear();
}

void ConnectionProtocol::flush() {
  if (handling_read_) return;  // written once the whole read is handled
  transport_.output_ready();
}

void ConnectionProtocol::before_write() {
  if (options_.ack_delay.count() == 0) release_held_acks();
}

void ConnectionProtocol::close() {
  if (phase_ != Phase::open) return;
  release_held_acks();
  amqp::ConnectionClose close;
  close.reply_code = 200;
  close.reply_text = "Goodbye";
  amqp::append_method_frame(out_, 0, close);
  phase_ = Phase::closing;
  flush();
  transport_.start_timer(ProtocolTimer::close, kCloseTimeoutMs, 0);
}

void ConnectionProtocol::terminate(const Error& error) {
  if (phase_ == Phase::closed) return;
  phase_ = Phase::closed;
  close_error_ = error;
  out_.clear();
  std::vector<std::shared_ptr<ChannelImpl>> channels;
  for (auto& channel : channels_) {
    if (channel) channels.push_back(std::move(channel));
  }
  channels_.clear();
  for (auto& channel : channels)
    channel->terminate(error);
}

}  // namespace retryloop::client::detail
