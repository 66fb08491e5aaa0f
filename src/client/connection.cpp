#include "connection_impl.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <random>
#include <vector>

#include "tls_session.hpp"

namespace retryloop::client {
namespace detail {
namespace {

using amqp::FrameType;

template <class Method>
constexpr uint32_t key_of() {
  return (uint32_t{Method::class_id} << 16) | Method::method_id;
}

constexpr size_t kReadBufferSize = 64 * 1024;
constexpr size_t kTlsPlainBufferSize = 64 * 1024;
/// Plaintext encrypted per write over TLS: bounds the session's buffers, keeps them in cache.
constexpr size_t kTlsWriteChunk = 256 * 1024;
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

/// A write to a socket the peer has reset raises SIGPIPE, whose default action kills the process,
/// and libuv does not prevent that on Linux. Ignore it when it still has its default disposition;
/// leave alone a handler (or an ignore) the application installed.
void ignore_default_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

std::shared_ptr<ConnectionImpl> ConnectionImpl::create(uv_loop_t* loop, ConnectionOptions options) {
  return std::shared_ptr<ConnectionImpl>(new ConnectionImpl(loop, std::move(options)));
}

ConnectionImpl::ConnectionImpl(uv_loop_t* loop, ConnectionOptions options)
    : loop_(loop), options_(std::move(options)), parser_(kDefaultFrameMax) {
  read_buffer_.resize(kReadBufferSize);
}

ConnectionImpl::~ConnectionImpl() {
  if (addresses_ != nullptr) uv_freeaddrinfo(addresses_);
}

Error ConnectionImpl::connect(ConnectCallback callback) {
  if (state_ != State::idle) return Error(ClientError::invalid_argument, "connect called twice");
  ignore_default_sigpipe();
  if (options_.uri.tls) {
    const Uri& uri = options_.uri;
    const TlsOptions& tls = options_.tls;
    detail::TlsSettings settings;
    settings.ca_file = tls.ca_file.value_or(uri.ca_file.value_or(std::string()));
    settings.cert_file = tls.cert_file.value_or(uri.cert_file.value_or(std::string()));
    settings.key_file = tls.key_file.value_or(uri.key_file.value_or(std::string()));
    settings.verify_peer = tls.verify_peer.value_or(uri.verify_peer.value_or(true));
    settings.server_name = tls.server_name.value_or(uri.server_name.value_or(uri.host));
    if (settings.server_name.empty()) settings.server_name = uri.host;
    bool ipv6 = uri.host.find(':') != std::string::npos;
    settings.peer = (ipv6 ? "[" + uri.host + "]" : uri.host) + ":" + std::to_string(uri.port);
    if (Error error = detail::TlsSession::create(settings, tls_)) return error;
    tls_plain_.resize(kTlsPlainBufferSize);
  }
  on_connect_ = std::move(callback);
  self_ = shared_from_this();

  uv_timer_init(loop_, &connect_timer_);
  connect_timer_.data = this;
  ++open_handles_;
  uv_timer_init(loop_, &heartbeat_timer_);
  heartbeat_timer_.data = this;
  ++open_handles_;
  uv_timer_init(loop_, &ack_timer_);
  ack_timer_.data = this;
  ++open_handles_;

  uint64_t timeout_ms = static_cast<uint64_t>(
      (options_.uri.connect_timeout ? *options_.uri.connect_timeout : options_.connect_timeout)
          .count());
  uv_timer_start(
      &connect_timer_,
      [](uv_timer_t* timer) {
        auto* self = static_cast<ConnectionImpl*>(timer->data);
        self->finish(Error(ClientError::connect_timeout, self->last_connect_error_));
      },
      timeout_ms, 0);
  start_resolve();
  return {};
}

void ConnectionImpl::start_resolve() {
  state_ = State::resolving;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  resolve_req_.data = this;
  std::string port = std::to_string(options_.uri.port);
  ++open_handles_;  // the request keeps the connection alive like a handle
  int rc = uv_getaddrinfo(
      loop_, &resolve_req_,
      [](uv_getaddrinfo_t* req, int status, addrinfo* result) {
        auto* self = static_cast<ConnectionImpl*>(req->data);
        if (self->state_ != State::resolving) {
          if (result != nullptr) uv_freeaddrinfo(result);
        } else if (status < 0) {
          self->finish(Error(ClientError::resolve_failed,
                             self->options_.uri.host + ": " + uv_strerror(status)));
        } else {
          self->addresses_ = result;
          self->next_address_ = result;
          self->state_ = State::connecting;
          self->try_next_address();
        }
        req->data = nullptr;
        self->on_handle_closed();
      },
      options_.uri.host.c_str(), port.c_str(), &hints);
  if (rc < 0) {
    resolve_req_.data = nullptr;
    --open_handles_;
    finish(Error(ClientError::resolve_failed, options_.uri.host + ": " + uv_strerror(rc)));
  }
}

void ConnectionImpl::try_next_address() {
  if (state_ != State::connecting) return;
  if (next_address_ == nullptr) {
    finish(Error(
        ClientError::connect_failed,
        options_.uri.host + ":" + std::to_string(options_.uri.port) + ": " + last_connect_error_));
    return;
  }
  const addrinfo* address = next_address_;
  next_address_ = next_address_->ai_next;
  uv_tcp_init(loop_, &tcp_);
  tcp_.data = this;
  tcp_initialized_ = true;
  ++open_handles_;
  uv_tcp_nodelay(&tcp_, 1);
  connect_req_.data = this;
  int rc =
      uv_tcp_connect(&connect_req_, &tcp_, address->ai_addr, [](uv_connect_t* req, int status) {
        static_cast<ConnectionImpl*>(req->data)->on_connected(status);
      });
  if (rc < 0) on_connected(rc);
}

void ConnectionImpl::on_connected(int status) {
  if (state_ != State::connecting) return;  // torn down meanwhile; the handle is closing
  if (status < 0) {
    last_connect_error_ = uv_strerror(status);
    tcp_initialized_ = false;
    uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), [](uv_handle_t* handle) {
      auto* self = static_cast<ConnectionImpl*>(handle->data);
      self->try_next_address();
      self->on_handle_closed();
    });
    return;
  }
  last_read_ms_ = uv_now(loop_);
  start_reading();
  if (tls_) {
    state_ = State::tls_handshaking;
    last_connect_error_ = "the TLS handshake did not finish";
    advance_tls_handshake();
    return;
  }
  state_ = State::handshaking;
  out_.append(amqp::kProtocolHeader.data(), amqp::kProtocolHeader.size());
  flush();
}

void ConnectionImpl::advance_tls_handshake() {
  bool done = false;
  if (Error error = tls_->handshake(done)) {
    finish(error);  // sends the alert, if any
    return;
  }
  if (!done) {
    flush();  // the handshake's next message, if any
    return;
  }
  if (auto* log = logger()) {
    log->debug("TLS with {}: {}", options_.uri.redacted(), tls_->description());
    if (!tls_->verifies_peer()) {
      log->warn("TLS to {} does not verify the broker's certificate (verify_none)",
                options_.uri.redacted());
    }
  }
  state_ = State::handshaking;
  last_connect_error_.clear();
  out_.append(amqp::kProtocolHeader.data(), amqp::kProtocolHeader.size());
  flush();
}

void ConnectionImpl::start_reading() {
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&tcp_),
      [](uv_handle_t* handle, size_t, uv_buf_t* buf) {
        auto* self = static_cast<ConnectionImpl*>(handle->data);
        *buf = uv_buf_init(self->read_buffer_.data(),
                           static_cast<unsigned int>(self->read_buffer_.size()));
      },
      [](uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
        static_cast<ConnectionImpl*>(stream->data)->on_read(nread, buf);
      });
}

void ConnectionImpl::on_read(ssize_t nread, const uv_buf_t* buf) {
  if (nread == 0) return;
  if (nread < 0) {
    if (state_ == State::closed) return;
    on_socket_end(nread == UV_EOF ? "broker closed the socket"
                                  : uv_strerror(static_cast<int>(nread)));
    return;
  }
  std::string_view bytes(buf->base, static_cast<size_t>(nread));
  if (tls_) {
    handle_tls_bytes(bytes);
  } else {
    handle_bytes(bytes);
  }
}

void ConnectionImpl::on_socket_end(const std::string& why) {
  if (state_ == State::closing) {
    finish(Error(ClientError::closed_by_client));
  } else if (state_ == State::tls_handshaking) {
    finish(Error(ClientError::connection_lost, why + " during the TLS handshake"));
  } else if (state_ == State::handshaking) {
    finish(Error(ClientError::connection_lost, why + " during the handshake"));
  } else {
    finish(Error(ClientError::connection_lost, why));
  }
}

void ConnectionImpl::handle_tls_bytes(std::string_view ciphertext) {
  auto keep_alive = shared_from_this();
  last_read_ms_ = uv_now(loop_);
  tls_->feed(ciphertext);
  if (state_ == State::tls_handshaking) {
    advance_tls_handshake();
    if (state_ != State::handshaking) return;  // still handshaking, or failed
  }
  // Decrypt into one buffer, and hand each full buffer to the frame parser.
  for (;;) {
    size_t size = 0;
    bool closed = false;
    Error error = tls_->read(tls_plain_.data(), tls_plain_.size(), size, closed);
    if (size > 0) {
      handle_bytes(std::string_view(tls_plain_.data(), size));
      if (state_ == State::closed) return;
    }
    if (error) {
      finish(error);
      return;
    }
    if (closed) {
      on_socket_end("broker ended the TLS session");
      return;
    }
    if (size < tls_plain_.size()) break;
  }
  flush();  // anything TLS itself has to answer
}

void ConnectionImpl::handle_bytes(std::string_view bytes) {
  auto keep_alive = shared_from_this();
  last_read_ms_ = uv_now(loop_);
  handling_read_ = true;
  std::error_code ec =
      parser_.feed(bytes, [this](const amqp::FrameView& frame) { return handle_frame(frame); });
  handling_read_ = false;
  if (state_ == State::closed) return;
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

bool ConnectionImpl::handle_frame(const amqp::FrameView& frame) {
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
    return state_ != State::closed;
  }
  if (state_ == State::closing) return true;  // discarded until close-ok
  if (state_ != State::open) {
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
  return state_ != State::closed;
}

bool ConnectionImpl::unknown_channel_frame(const amqp::FrameView& frame) {
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
  if (id.key() == key_of<amqp::ChannelClose>()) {
    amqp::append_method_frame(out_, frame.channel, amqp::ChannelCloseOk{});
    flush();
    return true;
  }
  if (id.key() == key_of<amqp::ChannelCloseOk>()) return true;
  const char* name = amqp::method_name(id.class_id, id.method_id);
  fail_protocol(
      Error(ClientError::protocol_error, std::string(name ? name : "a method") + " on channel " +
                                             std::to_string(frame.channel) + ", which is not open"),
      504);
  return false;
}

template <class Method>
void ConnectionImpl::send_connection_method(const Method& method) {
  amqp::append_method_frame(out_, 0, method);
  flush();
}

Error ConnectionImpl::handle_connection_method(std::string_view payload) {
  amqp::MethodId id;
  if (auto ec = amqp::peek_method_id(payload, id)) return Error(ec);
  switch (id.key()) {
    // The handshake's methods come once each, in order: start, tune, open-ok.
    case key_of<amqp::ConnectionStart>(): {
      if (state_ != State::handshaking || handshake_step_ != HandshakeStep::start) break;
      Error error = on_start(payload);
      if (!error) handshake_step_ = HandshakeStep::tune;
      return error;
    }
    case key_of<amqp::ConnectionTune>(): {
      if (state_ != State::handshaking || handshake_step_ != HandshakeStep::tune) break;
      Error error = on_tune(payload);
      if (!error) handshake_step_ = HandshakeStep::open_ok;
      return error;
    }
    case key_of<amqp::ConnectionOpenOk>(): {
      if (state_ != State::handshaking || handshake_step_ != HandshakeStep::open_ok) break;
      state_ = State::open;
      uv_timer_stop(&connect_timer_);
      if (tuning_.heartbeat_seconds > 0) {
        uint64_t interval = tuning_.heartbeat_seconds * 500ull;
        uv_timer_start(
            &heartbeat_timer_,
            [](uv_timer_t* timer) {
              static_cast<ConnectionImpl*>(timer->data)->on_heartbeat_tick();
            },
            interval, interval);
      }
      if (auto* log = logger()) {
        log->info("connected to {}{} (heartbeat {}s, frame_max {})", options_.uri.redacted(),
                  options_.connection_name.empty() ? "" : " as '" + options_.connection_name + "'",
                  tuning_.heartbeat_seconds, tuning_.frame_max);
      }
      ConnectCallback callback = std::move(on_connect_);
      if (callback) callback(Error{});
      return {};
    }
    case key_of<amqp::ConnectionClose>(): {
      amqp::ConnectionClose m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      send_connection_method(amqp::ConnectionCloseOk{});
      ClientError code = ClientError::connection_closed;
      if (state_ == State::handshaking) {
        if (m.reply_code == 403) code = ClientError::authentication_failed;
        if (m.reply_code == 530) code = ClientError::vhost_refused;
      }
      Error error(code, m.reply_text);
      error.reply_code = m.reply_code;
      error.class_id = m.failing_class_id;
      error.method_id = m.failing_method_id;
      finish(error);
      return {};
    }
    case key_of<amqp::ConnectionCloseOk>():
      if (state_ != State::closing) break;
      finish(Error(ClientError::closed_by_client));
      return {};
    case key_of<amqp::ConnectionBlocked>(): {
      amqp::ConnectionBlocked m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      blocked_ = true;
      if (auto* log = logger()) log->warn("broker blocked publishing: {}", m.reason);
      if (on_blocked_) on_blocked_(true, m.reason);
      return {};
    }
    case key_of<amqp::ConnectionUnblocked>():
      blocked_ = false;
      if (auto* log = logger()) log->info("broker unblocked publishing");
      if (on_blocked_) on_blocked_(false, std::string());
      return {};
    default:
      break;
  }
  const char* name = amqp::method_name(id.class_id, id.method_id);
  return Error(ClientError::protocol_error,
               std::string("unexpected ") + (name ? name : "unknown method") + " on channel 0");
}

Error ConnectionImpl::on_start(std::string_view payload) {
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

Error ConnectionImpl::on_tune(std::string_view payload) {
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

void ConnectionImpl::on_heartbeat_tick() {
  if (state_ != State::open && state_ != State::closing) return;
  uint64_t now = uv_now(loop_);
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
    finish(Error(ClientError::heartbeat_timeout,
                 "nothing received for " + std::to_string((now - last_read_ms_) / 1000) + " s"));
    return;
  }
  if (now - last_write_ms_ >= interval_ms / 2 && out_.empty() && !write_in_flight_) {
    amqp::append_heartbeat_frame(out_);
    flush();
  }
}

Error ConnectionImpl::open_channel(ChannelCallback callback) {
  if (state_ != State::open) return close_error_ ? close_error_ : Error(ClientError::not_open);
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

void ConnectionImpl::release_channel(uint16_t id) {
  if (id < channels_.size()) channels_[id].reset();
}

void ConnectionImpl::fail_protocol(const Error& error, uint16_t reply_code) {
  if (state_ == State::closed) return;
  if (auto* log = logger()) log->error("protocol error: {}", error.message());
  if (state_ == State::open || state_ == State::handshaking) {
    amqp::ConnectionClose close;
    close.reply_code = reply_code != 0 ? reply_code : 505;
    close.reply_text = error.message().substr(0, 255);
    amqp::append_method_frame(out_, 0, close);
  }
  finish(error);
}

void ConnectionImpl::close(CompletionCallback callback) {
  switch (state_) {
    case State::idle:
      state_ = State::closed;
      [[fallthrough]];
    case State::closed:
      if (callback) callback(Error{});
      return;
    case State::closing:
      if (callback) on_closed_.push_back(std::move(callback));
      return;
    case State::resolving:
    case State::connecting:
    case State::tls_handshaking:
    case State::handshaking:
      if (callback) on_closed_.push_back(std::move(callback));
      finish(Error(ClientError::closed_by_client));
      return;
    case State::open: {
      if (callback) on_closed_.push_back(std::move(callback));
      release_held_acks();
      amqp::ConnectionClose close;
      close.reply_code = 200;
      close.reply_text = "Goodbye";
      amqp::append_method_frame(out_, 0, close);
      state_ = State::closing;
      flush();
      uv_timer_start(
          &connect_timer_,
          [](uv_timer_t* timer) {
            static_cast<ConnectionImpl*>(timer->data)->finish(Error(ClientError::closed_by_client));
          },
          kCloseTimeoutMs, 0);
      return;
    }
  }
}

void ConnectionImpl::flush() {
  if (handling_read_) return;  // written once the whole read is handled
  start_write();
}

void ConnectionImpl::hold_acks(uint16_t channel_id) {
  channels_holding_acks_.push_back(channel_id);
  if (options_.ack_delay.count() > 0 &&
      !uv_is_active(reinterpret_cast<uv_handle_t*>(&ack_timer_))) {
    uv_timer_start(
        &ack_timer_,
        [](uv_timer_t* timer) {
          auto* self = static_cast<ConnectionImpl*>(timer->data);
          self->release_held_acks();
          self->flush();
        },
        static_cast<uint64_t>(options_.ack_delay.count()), 0);
  }
}

void ConnectionImpl::release_held_acks() {
  for (uint16_t id : channels_holding_acks_) {
    if (id < channels_.size() && channels_[id]) channels_[id]->release_held_acks();
  }
  channels_holding_acks_.clear();
}

void ConnectionImpl::start_write() {
  if (write_in_flight_ || !tcp_initialized_) return;
  if (state_ == State::closed || state_ == State::resolving || state_ == State::connecting) return;
  if (options_.ack_delay.count() == 0) release_held_acks();
  uv_buf_t buf;
  if (tls_) {
    // Frames wait in out_ until the TLS handshake is done. Then, as in the plain path, out_
    // becomes writing_, which is encrypted straight from there one chunk per write; the
    // records go out from the session's buffer.
    if (state_ != State::tls_handshaking && tls_->pending() == 0) {
      if (writing_offset_ == writing_.size()) {
        writing_.clear();
        writing_offset_ = 0;
        writing_.swap(out_);
      }
      size_t size = std::min(kTlsWriteChunk, writing_.size() - writing_offset_);
      if (size > 0) {
        if (Error error = tls_->write(std::string_view(writing_).substr(writing_offset_, size))) {
          finish(error);
          return;
        }
        writing_offset_ += size;
      }
    }
    if (tls_->pending() == 0) return;
    std::string_view records = tls_->take_pending();
    tls_writing_ = records.size();
    buf = uv_buf_init(const_cast<char*>(records.data()), static_cast<unsigned int>(records.size()));
  } else {
    if (out_.empty()) return;
    writing_.swap(out_);
    out_.clear();
    buf = uv_buf_init(writing_.data(), static_cast<unsigned int>(writing_.size()));
  }
  write_in_flight_ = true;
  last_write_ms_ = uv_now(loop_);
  write_req_.data = this;
  int rc = uv_write(&write_req_, reinterpret_cast<uv_stream_t*>(&tcp_), &buf, 1,
                    [](uv_write_t* req, int status) {
                      auto* self = static_cast<ConnectionImpl*>(req->data);
                      self->write_in_flight_ = false;
                      if (!self->tls_) self->writing_.clear();
                      self->tls_writing_ = 0;
                      if (status < 0) {
                        if (self->state_ != State::closed) {
                          self->finish(Error(ClientError::connection_lost,
                                             std::string("write failed: ") + uv_strerror(status)));
                        }
                        return;
                      }
                      self->flush();
                    });
  if (rc < 0) {
    write_in_flight_ = false;
    if (!tls_) writing_.clear();
    tls_writing_ = 0;
    finish(Error(ClientError::connection_lost, std::string("write failed: ") + uv_strerror(rc)));
  }
}

void ConnectionImpl::finish(const Error& error) {
  if (state_ == State::closed) return;
  auto keep_alive = shared_from_this();
  State previous = state_;
  state_ = State::closed;
  close_error_ = error;
  if (error.code != make_error_code(ClientError::closed_by_client)) {
    if (auto* log = logger())
      log->warn("connection to {} ended: {}", options_.uri.redacted(), error.message());
  }
  // Best effort: get a pending close or close-ok out before the socket goes; over TLS, then
  // close_notify (or the alert of a failed handshake).
  if (tcp_initialized_ && !write_in_flight_) {
    std::string_view bytes = out_;
    if (tls_) {
      if (previous == State::handshaking || previous == State::open || previous == State::closing) {
        (void)tls_->write(std::string_view(writing_).substr(writing_offset_));
        (void)tls_->write(out_);
      }
      tls_->shutdown();
      bytes = tls_->take_pending();
    }
    if (!bytes.empty()) {
      uv_buf_t buf =
          uv_buf_init(const_cast<char*>(bytes.data()), static_cast<unsigned int>(bytes.size()));
      uv_try_write(reinterpret_cast<uv_stream_t*>(&tcp_), &buf, 1);
    }
  }
  out_.clear();
  close_handles();

  std::vector<std::shared_ptr<ChannelImpl>> channels;
  for (auto& channel : channels_) {
    if (channel) channels.push_back(std::move(channel));
  }
  channels_.clear();
  for (auto& channel : channels)
    channel->terminate(error);

  if (previous == State::resolving || previous == State::connecting ||
      previous == State::tls_handshaking || previous == State::handshaking) {
    ConnectCallback callback = std::move(on_connect_);
    if (callback) callback(error);
  } else if (previous == State::open) {
    ConnectionLostHandler handler = std::move(on_lost_);
    if (handler) handler(error);
  }
  std::vector<CompletionCallback> closed = std::move(on_closed_);
  for (auto& callback : closed)
    callback(Error{});
}

void ConnectionImpl::close_handle(uv_handle_t* handle) {
  if (uv_is_closing(handle)) return;
  uv_close(handle,
           [](uv_handle_t* h) { static_cast<ConnectionImpl*>(h->data)->on_handle_closed(); });
}

void ConnectionImpl::close_handles() {
  if (resolve_req_.data != nullptr) {
    uv_cancel(reinterpret_cast<uv_req_t*>(&resolve_req_));
  }
  close_handle(reinterpret_cast<uv_handle_t*>(&connect_timer_));
  close_handle(reinterpret_cast<uv_handle_t*>(&heartbeat_timer_));
  close_handle(reinterpret_cast<uv_handle_t*>(&ack_timer_));
  if (tcp_initialized_) {
    tcp_initialized_ = false;
    close_handle(reinterpret_cast<uv_handle_t*>(&tcp_));
  }
}

void ConnectionImpl::on_handle_closed() {
  if (--open_handles_ == 0) {
    // The last handle is closed: drop the self-reference (this may destroy the connection).
    std::shared_ptr<ConnectionImpl> self = std::move(self_);
  }
}

}  // namespace detail

namespace detail {

// A connection's hosts and the attempt in progress: a ConnectionImpl connects to one host, and
// when it fails in a way another node may not, the next host gets a fresh ConnectionImpl.
struct ConnectionAttempts {
  uv_loop_t* loop = nullptr;
  ConnectionOptions options;
  std::shared_ptr<ConnectionImpl> current;
  std::vector<Endpoint> order;
  size_t next = 0;
  std::string failures;  // the hosts tried so far and why each failed
  ConnectionLostHandler on_lost;
  BlockedHandler on_blocked;
  bool connecting = false;
  bool closing = false;
};

namespace {

// Failures another node of a cluster may not have; a refused login or vhost, or the
// application's own close, would be the same everywhere.
bool another_host_may_answer(const Error& error) {
  if (error.code.category() != client_category()) return false;
  switch (static_cast<ClientError>(error.code.value())) {
    case ClientError::resolve_failed:
    case ClientError::connect_failed:
    case ClientError::connect_timeout:
    case ClientError::tls_failed:
    case ClientError::connection_lost:
    case ClientError::connection_closed:
    case ClientError::protocol_error:
    case ClientError::heartbeat_timeout:
      return true;
    default:
      return false;
  }
}

std::shared_ptr<ConnectionImpl> make_attempt(ConnectionAttempts& attempts,
                                             const Endpoint& endpoint) {
  ConnectionOptions options = attempts.options;
  options.uri = attempts.options.uri.with_only(endpoint);
  auto impl = ConnectionImpl::create(attempts.loop, std::move(options));
  if (attempts.on_lost) impl->set_lost_handler(attempts.on_lost);
  if (attempts.on_blocked) impl->set_blocked_handler(attempts.on_blocked);
  attempts.current = impl;
  return impl;
}

Error connect_next(const std::shared_ptr<ConnectionAttempts>& attempts,
                   std::shared_ptr<ConnectCallback> callback) {
  const Endpoint endpoint = attempts->order[attempts->next++];
  auto impl = make_attempt(*attempts, endpoint);
  // The callback holds the attempts until it fires (once), and no longer.
  return impl->connect([attempts, endpoint, callback](const Error& error) {
    const bool more = attempts->next < attempts->order.size();
    if (error && more && !attempts->closing && another_host_may_answer(error)) {
      attempts->failures += (attempts->failures.empty() ? "" : "; ") + error.message();
      if (auto* log = attempts->current->logger()) {
        log->info("trying {} (host {} of {}) after {}: {}", attempts->order[attempts->next].text(),
                  attempts->next + 1, attempts->order.size(), endpoint.text(), error.message());
      }
      if (Error next = connect_next(attempts, callback)) (*callback)(next);
      return;
    }
    attempts->connecting = false;
    if (error && !attempts->failures.empty() && error.reply_code == 0) {
      Error all = error;
      all.reply_text += "; tried before: " + attempts->failures;
      return (*callback)(all);
    }
    (*callback)(error);
  });
}

}  // namespace
}  // namespace detail

std::shared_ptr<Connection> Connection::create(uv_loop_t* loop, ConnectionOptions options) {
  auto attempts = std::make_shared<detail::ConnectionAttempts>();
  attempts->loop = loop;
  attempts->options = std::move(options);
  attempts->order = attempts->options.uri.hosts();
  // Until connect() picks a host, the handle answers for the first.
  detail::make_attempt(*attempts, attempts->order.front());
  return std::make_shared<Connection>(std::move(attempts));
}
Connection::Connection(std::shared_ptr<detail::ConnectionAttempts> attempts)
    : attempts_(std::move(attempts)) {}
Connection::~Connection() = default;

Error Connection::connect(ConnectCallback callback) {
  auto& attempts = *attempts_;
  if (attempts.connecting || attempts.next != 0 || attempts.closing) {
    return Error(ClientError::invalid_argument, "connect called twice");
  }
  if (attempts.options.uri.host_order == HostOrder::shuffled) {
    std::shuffle(attempts.order.begin(), attempts.order.end(),
                 std::mt19937(std::random_device{}()));
  }
  attempts.connecting = true;
  Error error =
      detail::connect_next(attempts_, std::make_shared<ConnectCallback>(std::move(callback)));
  if (error) attempts.connecting = false;
  return error;
}
Error Connection::open_channel(ChannelCallback callback) {
  return attempts_->current->open_channel(std::move(callback));
}
void Connection::close(CompletionCallback callback) {
  attempts_->closing = true;
  attempts_->current->close(std::move(callback));
}
void Connection::set_lost_handler(ConnectionLostHandler handler) {
  attempts_->on_lost = handler;
  attempts_->current->set_lost_handler(std::move(handler));
}
void Connection::set_blocked_handler(BlockedHandler handler) {
  attempts_->on_blocked = handler;
  attempts_->current->set_blocked_handler(std::move(handler));
}
bool Connection::is_open() const {
  return attempts_->current->is_open();
}
bool Connection::is_blocked() const {
  return attempts_->current->is_blocked();
}
const Tuning& Connection::tuning() const {
  return attempts_->current->tuning();
}
const amqp::FieldTable& Connection::server_properties() const {
  return attempts_->current->server_properties();
}

std::optional<BrokerVersion> Connection::broker_version() const {
  return client::broker_version(server_properties());
}

std::string BrokerVersion::text() const {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::optional<BrokerVersion> broker_version(const amqp::FieldTable& server_properties) {
  const amqp::FieldValue* value = server_properties.find("version");
  const std::optional<std::string_view> text = value ? value->as_string() : std::nullopt;
  if (!text) return std::nullopt;
  BrokerVersion version;
  unsigned* parts[] = {&version.major, &version.minor, &version.patch};
  size_t at = 0;
  for (size_t part = 0; part < 3; ++part) {
    const size_t start = at;
    unsigned number = 0;
    while (at < text->size() && std::isdigit(static_cast<unsigned char>((*text)[at])) &&
           at - start < 6) {
      number = number * 10 + static_cast<unsigned>((*text)[at] - '0');
      ++at;
    }
    if (at == start) {
      if (part < 2) return std::nullopt;  // MAJOR.MINOR at least
      break;
    }
    *parts[part] = number;
    if (at >= text->size() || (*text)[at] != '.') {
      if (part < 1) return std::nullopt;
      break;
    }
    ++at;
  }
  return version;
}

uint32_t broker_min_frame_max(const amqp::FieldTable& server_properties) {
  const auto version = broker_version(server_properties);
  return version && version->at_least(4, 1) ? 8192 : amqp::kFrameMinSize;
}

const Uri& Connection::uri() const {
  return attempts_->current->uri();
}
uv_loop_t* Connection::loop() const {
  return attempts_->current->loop();
}
spdlog::logger* Connection::logger() const {
  return attempts_->current->logger();
}
size_t Connection::buffered_bytes() const {
  return attempts_->current->buffered_bytes();
}

void look_up_queue(const std::shared_ptr<Connection>& connection, const std::string& queue,
                   QueueDeclareCallback callback) {
  auto shared = std::make_shared<QueueDeclareCallback>(std::move(callback));
  Error error = connection->open_channel(
      [queue, shared](const Error& error, std::shared_ptr<Channel> channel) {
        if (error) return (*shared)(error, QueueInfo{});
        QueueOptions passive;
        passive.passive = true;
        Error e = channel->queue_declare(
            queue, passive, [channel, shared](const Error& error, const QueueInfo& info) {
              if (!error) (void)channel->close();
              (*shared)(error, info);
            });
        if (e) (*shared)(e, QueueInfo{});
      });
  if (error) (*shared)(error, QueueInfo{});
}

}  // namespace retryloop::client
