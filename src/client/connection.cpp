#include "connection_impl.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <vector>

#include "retryloop/client/timer.hpp"
#include "retryloop/random/os_random.hpp"
#include "tls_session.hpp"

namespace retryloop::client {
namespace detail {
namespace {

constexpr size_t kReadBufferSize = 64 * 1024;
constexpr size_t kTlsPlainBufferSize = 64 * 1024;
/// Plaintext encrypted per write over TLS: bounds the session's buffers, keeps them in cache.
constexpr size_t kTlsWriteChunk = 256 * 1024;

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
    : loop_(loop), protocol_(std::move(options), *this) {
  read_buffer_.resize(kReadBufferSize);
}

ConnectionImpl::~ConnectionImpl() {
  if (addresses_ != nullptr) uv_freeaddrinfo(addresses_);
}

Error ConnectionImpl::connect(ConnectCallback callback) {
  if (state_ != State::idle) return Error(ClientError::invalid_argument, "connect called twice");
  ignore_default_sigpipe();
  if (options().uri.tls) {
    const Uri& uri = options().uri;
    const TlsOptions& tls = options().tls;
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
  for (uv_timer_t& timer : protocol_timers_) {
    uv_timer_init(loop_, &timer);
    timer.data = this;
    ++open_handles_;
  }

  uint64_t timeout_ms = static_cast<uint64_t>(
      (options().uri.connect_timeout ? *options().uri.connect_timeout : options().connect_timeout)
          .count());
  // The loop's clock is the one of its last turn: after a while of other work on this thread,
  // a timeout counted from it would end early by that while.
  uv_update_time(loop_);
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
  std::string port = std::to_string(options().uri.port);
  ++open_handles_;  // the request keeps the connection alive like a handle
  int rc = uv_getaddrinfo(
      loop_, &resolve_req_,
      [](uv_getaddrinfo_t* req, int status, addrinfo* result) {
        auto* self = static_cast<ConnectionImpl*>(req->data);
        if (self->state_ != State::resolving) {
          if (result != nullptr) uv_freeaddrinfo(result);
        } else if (status < 0) {
          self->finish(Error(ClientError::resolve_failed,
                             self->options().uri.host + ": " + uv_strerror(status)));
        } else {
          self->addresses_ = result;
          self->next_address_ = result;
          self->state_ = State::connecting;
          self->try_next_address();
        }
        req->data = nullptr;
        self->on_handle_closed();
      },
      options().uri.host.c_str(), port.c_str(), &hints);
  if (rc < 0) {
    resolve_req_.data = nullptr;
    --open_handles_;
    finish(Error(ClientError::resolve_failed, options().uri.host + ": " + uv_strerror(rc)));
  }
}

void ConnectionImpl::try_next_address() {
  if (state_ != State::connecting) return;
  if (next_address_ == nullptr) {
    finish(Error(ClientError::connect_failed, options().uri.host + ":" +
                                                  std::to_string(options().uri.port) + ": " +
                                                  last_connect_error_));
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
  start_reading();
  if (tls_) {
    state_ = State::tls_handshaking;
    last_connect_error_ = "the TLS handshake did not finish";
    advance_tls_handshake();
    return;
  }
  state_ = State::protocol;
  protocol_.start(uv_now(loop_));
}

void ConnectionImpl::advance_tls_handshake() {
  bool done = false;
  if (Error error = tls_->handshake(done)) {
    finish(error);  // sends the alert, if any
    return;
  }
  if (!done) {
    start_write();  // the handshake's next message, if any
    return;
  }
  if (auto* log = logger()) {
    log->debug("TLS with {}: {}", options().uri.redacted(), tls_->description());
    if (!tls_->verifies_peer()) {
      log->warn("TLS to {} does not verify the broker's certificate (verify_none)",
                options().uri.redacted());
    }
  }
  state_ = State::protocol;
  last_connect_error_.clear();
  protocol_.start(uv_now(loop_));
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
    auto keep_alive = shared_from_this();
    protocol_.receive(bytes, uv_now(loop_));
  }
}

void ConnectionImpl::on_socket_end(const std::string& why) {
  const ConnectionProtocol::Phase phase = protocol_.phase();
  if (phase == ConnectionProtocol::Phase::closing) {
    finish(Error(ClientError::closed_by_client));
  } else if (state_ == State::tls_handshaking) {
    finish(Error(ClientError::connection_lost, why + " during the TLS handshake"));
  } else if (phase == ConnectionProtocol::Phase::handshaking) {
    finish(Error(ClientError::connection_lost, why + " during the handshake"));
  } else {
    finish(Error(ClientError::connection_lost, why));
  }
}

void ConnectionImpl::handle_tls_bytes(std::string_view ciphertext) {
  auto keep_alive = shared_from_this();
  protocol_.heard_from_peer(uv_now(loop_));
  tls_->feed(ciphertext);
  if (state_ == State::tls_handshaking) {
    advance_tls_handshake();
    if (state_ != State::protocol) return;  // still handshaking, or failed
  }
  // Decrypt into one buffer, and hand each full buffer to the frame parser.
  for (;;) {
    size_t size = 0;
    bool closed = false;
    Error error = tls_->read(tls_plain_.data(), tls_plain_.size(), size, closed);
    if (size > 0) {
      protocol_.receive(std::string_view(tls_plain_.data(), size), uv_now(loop_));
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
  start_write();  // anything TLS itself has to answer
}

void ConnectionImpl::start_timer(ProtocolTimer timer, uint64_t delay_ms, uint64_t repeat_ms) {
  if (state_ == State::closed) return;
  uv_timer_start(
      &protocol_timers_[static_cast<size_t>(timer)],
      [](uv_timer_t* fired) {
        auto* self = static_cast<ConnectionImpl*>(fired->data);
        const auto which = static_cast<ProtocolTimer>(fired - self->protocol_timers_.data());
        self->protocol_.timer_fired(which, uv_now(self->loop_));
      },
      delay_ms, repeat_ms);
}

void ConnectionImpl::protocol_opened() {
  uv_timer_stop(&connect_timer_);
  const Tuning& tuning = protocol_.tuning();
  if (auto* log = logger()) {
    log->info("connected to {}{} (heartbeat {}s, frame_max {})", options().uri.redacted(),
              options().connection_name.empty() ? "" : " as '" + options().connection_name + "'",
              tuning.heartbeat_seconds, tuning.frame_max);
  }
  ConnectCallback callback = std::move(on_connect_);
  if (callback) callback(Error{});
}

void ConnectionImpl::protocol_blocked(bool blocked, const std::string& reason) {
  if (auto* log = logger()) {
    if (blocked) {
      log->warn("broker blocked publishing: {}", reason);
    } else {
      log->info("broker unblocked publishing");
    }
  }
  if (on_blocked_) on_blocked_(blocked, reason);
}

void ConnectionImpl::close(CompletionCallback callback) {
  switch (state_) {
    case State::idle:
      state_ = State::closed;
      [[fallthrough]];
    case State::closed:
      if (callback) callback(Error{});
      return;
    case State::resolving:
    case State::connecting:
    case State::tls_handshaking:
      if (callback) on_closed_.push_back(std::move(callback));
      finish(Error(ClientError::closed_by_client));
      return;
    case State::protocol:
      if (callback) on_closed_.push_back(std::move(callback));
      if (protocol_.phase() == ConnectionProtocol::Phase::open) {
        protocol_.close();
      } else if (protocol_.phase() != ConnectionProtocol::Phase::closing) {
        finish(Error(ClientError::closed_by_client));
      }
      return;
  }
}

void ConnectionImpl::start_write() {
  if (write_in_flight_ || !tcp_initialized_) return;
  if (state_ == State::closed || state_ == State::resolving || state_ == State::connecting) return;
  if (state_ == State::protocol) protocol_.before_write();
  std::string& out = protocol_.output();
  uv_buf_t buf;
  if (tls_) {
    // Frames wait in the output until the TLS handshake is done. Then, as in the plain path, it
    // becomes writing_, which is encrypted straight from there one chunk per write; the
    // records go out from the session's buffer.
    if (state_ != State::tls_handshaking && tls_->pending() == 0) {
      if (writing_offset_ == writing_.size()) {
        writing_.clear();
        writing_offset_ = 0;
        writing_.swap(out);
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
    if (out.empty()) return;
    writing_.swap(out);
    out.clear();
    buf = uv_buf_init(writing_.data(), static_cast<unsigned int>(writing_.size()));
  }
  write_in_flight_ = true;
  protocol_.wrote(uv_now(loop_));
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
                      self->start_write();
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
  const State previous = state_;
  const ConnectionProtocol::Phase phase = protocol_.phase();
  state_ = State::closed;
  if (error.code != make_error_code(ClientError::closed_by_client)) {
    if (auto* log = logger())
      log->warn("connection to {} ended: {}", options().uri.redacted(), error.message());
  }
  // Best effort: get a pending close or close-ok out before the socket goes; over TLS, then
  // close_notify (or the alert of a failed handshake).
  if (tcp_initialized_ && !write_in_flight_) {
    std::string_view bytes = protocol_.output();
    if (tls_) {
      if (previous == State::protocol) {
        (void)tls_->write(std::string_view(writing_).substr(writing_offset_));
        (void)tls_->write(protocol_.output());
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
  close_handles();
  protocol_.terminate(error);

  if (previous != State::protocol || phase == ConnectionProtocol::Phase::handshaking) {
    ConnectCallback callback = std::move(on_connect_);
    if (callback) callback(error);
  } else if (phase == ConnectionProtocol::Phase::open) {
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
  for (uv_timer_t& timer : protocol_timers_)
    close_handle(reinterpret_cast<uv_handle_t*>(&timer));
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
    std::vector<uint64_t> draws(attempts.order.size());
    if (std::error_code failed =
            random::fill_random(draws.data(), draws.size() * sizeof(uint64_t))) {
      return Error(failed, "cannot shuffle the hosts: getrandom failed");
    }
    // Fisher-Yates; the bias of a 64-bit draw modulo a host count is nil for any real list.
    for (size_t i = attempts.order.size(); i > 1; --i)
      std::swap(attempts.order[i - 1], attempts.order[draws[i - 1] % i]);
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
ConnectionOptions Connection::options_on_this_host() const {
  ConnectionOptions options = attempts_->options;
  options.uri = uri();
  return options;
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

namespace {

/// RabbitMQ's reply to a declare of an exclusive queue another connection holds.
constexpr uint16_t kResourceLocked = 405;

void try_queue_lock(const std::shared_ptr<Connection>& connection, const std::string& queue,
                    uint64_t give_up_at_ms, std::shared_ptr<CompletionCallback> callback) {
  std::weak_ptr<Connection> weak = connection;
  Error error = connection->open_channel(
      [weak, queue, give_up_at_ms, callback](const Error& error, std::shared_ptr<Channel> channel) {
        if (error) return (*callback)(error);
        QueueOptions lock;
        lock.durable = false;
        lock.exclusive = true;
        lock.auto_delete = true;
        Error e = channel->queue_declare(
            queue, lock,
            [weak, queue, give_up_at_ms, callback, channel](const Error& error, const QueueInfo&) {
              auto connection = weak.lock();
              if (error.reply_code != kResourceLocked || !connection ||
                  uv_now(connection->loop()) >= give_up_at_ms) {
                if (!error) (void)channel->close();  // the connection holds the queue
                return (*callback)(error);
              }
              run_after(connection->loop(), std::chrono::milliseconds(250),
                        [weak, queue, give_up_at_ms, callback] {
                          auto connection = weak.lock();
                          if (!connection || !connection->is_open()) {
                            return (*callback)(Error(ClientError::not_open));
                          }
                          try_queue_lock(connection, queue, give_up_at_ms, callback);
                        });
            });
        if (e) (*callback)(e);
      });
  if (error) (*callback)(error);
}

}  // namespace

void take_queue_lock(const std::shared_ptr<Connection>& connection, const std::string& queue,
                     std::chrono::milliseconds wait, CompletionCallback callback) {
  auto shared = std::make_shared<CompletionCallback>(std::move(callback));
  try_queue_lock(connection, queue, uv_now(connection->loop()) + uint64_t(wait.count()), shared);
}

}  // namespace retryloop::client
