#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/client/channel.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/client/loop.hpp"
#include "retryloop/client/uri.hpp"

namespace spdlog {
class logger;
}

namespace retryloop::client {

namespace detail {
struct ConnectionAttempts;
}

/// TLS settings for `amqps://` URIs (ignored for `amqp://`). Each unset field takes the URI's
/// query option (`cacertfile`, `verify`, `server_name_indication`, `certfile`, `keyfile`), else
/// the default below.
struct TlsOptions {
  /// PEM file with the CA certificates that may sign the broker's certificate. Default: the
  /// system's trust store (OpenSSL's default paths). A file that cannot be read fails connect()
  /// at once with tls_failed.
  std::optional<std::string> ca_file;
  /// Whether to check the broker's certificate: its chain up to a trusted CA, and that it names
  /// `server_name`. Default: on. Off only when set to false here or by `verify=verify_none`,
  /// and then anyone between the client and the broker can read and change the traffic.
  std::optional<bool> verify_peer;
  /// The name the certificate must carry, also sent as SNI (an IP address is checked against
  /// the certificate's IP entries and not sent). Default: the URI's host.
  std::optional<std::string> server_name;
  /// The client's own certificate (PEM; a chain may follow it) and its private key (PEM, not
  /// encrypted), for a broker that asks for one (mutual TLS: `ssl_options.verify = verify_peer`,
  /// and with `fail_if_no_peer_cert = true` it refuses a client without one). Both or neither.
  /// Default: none. A file that cannot be read, or a key that does not match the certificate,
  /// fails connect() at once with tls_failed, naming the file.
  std::optional<std::string> cert_file;
  std::optional<std::string> key_file;
};

/// A RabbitMQ release, as its `connection.start` names it in the server property `version`.
struct BrokerVersion {
  unsigned major = 0;
  unsigned minor = 0;
  unsigned patch = 0;

  /// Whether this release is `major.minor` or later.
  bool at_least(unsigned major_, unsigned minor_) const {
    return major != major_ ? major > major_ : minor >= minor_;
  }
  std::string text() const;
};

/// The version the broker announced in its server properties; nullopt when it names none, or a
/// text that does not start with `MAJOR.MINOR`.
std::optional<BrokerVersion> broker_version(const amqp::FieldTable& server_properties);

/// The smallest frame_max the broker accepts in `connection.tune-ok`: 8192 for RabbitMQ 4.1 and
/// later (a smaller one closes the connection during the handshake), else the protocol's 4096.
uint32_t broker_min_frame_max(const amqp::FieldTable& server_properties);

struct ConnectionOptions {
  Uri uri;
  /// Used when `uri.tls` is set (amqps://).
  TlsOptions tls;
  /// Heartbeat to ask for, in seconds; 0 turns heartbeats off. Unset: the URI's `heartbeat`, or
  /// else whatever the broker proposes (RabbitMQ: 60).
  std::optional<uint16_t> heartbeat_seconds;
  /// Largest frame to ask for (the broker may lower it); 0: the URI's value or 131072. A value
  /// below the broker's minimum (broker_min_frame_max) is raised to it, with a warning in the log.
  uint32_t frame_max = 0;
  /// Most channels to ask for; 0: the URI's value or 2047.
  uint16_t channel_max = 0;
  /// Limit for resolving, connecting, the TLS handshake and the AMQP handshake together.
  std::chrono::milliseconds connect_timeout{30000};
  /// Largest message body accepted from the broker; larger ones end the connection with
  /// message_too_large instead of allocating without bound.
  uint64_t max_body_size = 512ull * 1024 * 1024;
  /// How long a channel may hold an ack back to send it with the acks after it, as one
  /// `multiple` ack (see Channel::ack). 0: held acks go out with the next write, which merges
  /// only the acks made while handling one read.
  std::chrono::milliseconds ack_delay{1};
  /// Shown in the broker's connection list.
  std::string connection_name;
  /// Where the library logs; nullptr: nowhere.
  std::shared_ptr<spdlog::logger> logger;
};

/// What the handshake agreed on.
struct Tuning {
  uint16_t channel_max = 0;
  uint32_t frame_max = 0;
  uint16_t heartbeat_seconds = 0;
};

using ConnectCallback = std::function<void(const Error&)>;
using ChannelCallback = std::function<void(const Error&, std::shared_ptr<Channel>)>;
/// Told once when an open connection ends for any reason other than close(): broker close
/// (reply code and text), heartbeat timeout, socket error or protocol error.
using ConnectionLostHandler = std::function<void(const Error&)>;
/// Told when the broker blocks (`blocked` true, with its reason) or unblocks publishers.
using BlockedHandler = std::function<void(bool blocked, const std::string& reason)>;

/// An AMQP 0-9-1 connection over libuv. Create it with `create`, then `connect`.
///
/// Threading: every call and every callback happens on the loop's thread.
/// Lifetime: the connection keeps itself alive while its libuv handles are open, so dropping
/// the last shared_ptr before close() completes is safe; the loop does not end until the
/// connection is closed (by close(), the broker or a failure). Callbacks may destroy channels
/// or call close() from inside.
class Connection {
 public:
  static std::shared_ptr<Connection> create(uv_loop_t* loop, ConnectionOptions options);
  /// Made by create(); a Connection is a handle that shares its connection's state.
  explicit Connection(std::shared_ptr<detail::ConnectionAttempts> attempts);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// Resolves, connects, runs the TLS handshake (amqps://), authenticates with PLAIN and opens
  /// the vhost. With several hosts in the URI (`uri.other_hosts`), it tries them in the URI's
  /// `host_order`, moving to the next when a host does not resolve, refuses the connection,
  /// times out, fails the TLS handshake, closes or breaks the connection before it is open, or
  /// breaks the protocol; a refused login or vhost stops at once, as they would on every node.
  /// Each host gets the whole connect timeout. The final error names every host tried. `callback`
  /// fires once: empty Error when the connection is open, otherwise why it failed
  /// (authentication_failed, vhost_refused, connect_failed, connect_timeout, tls_failed with the
  /// certificate problem, ...). When connect() itself returns an error (called twice, a CA file
  /// that cannot be read), the callback never fires.
  ///
  /// Process-wide effect: SIGPIPE is set to ignored when it still has its default disposition,
  /// so that a broker that resets the connection mid-write ends the connection with an error
  /// instead of killing the process (libuv does not prevent SIGPIPE on Linux). A handler the
  /// application installed is left as it is.
  Error connect(ConnectCallback callback);

  /// Opens a channel on the lowest free channel number.
  Error open_channel(ChannelCallback callback);

  /// Closes gracefully: connection.close, wait for close-ok (bounded), close the socket. Every
  /// channel's pending operations fail with closed_by_client. `callback` fires when the socket
  /// is closed. Safe to call in any state and more than once.
  void close(CompletionCallback callback = {});

  void set_lost_handler(ConnectionLostHandler handler);
  void set_blocked_handler(BlockedHandler handler);

  bool is_open() const;
  bool is_blocked() const;
  const Tuning& tuning() const;
  const amqp::FieldTable& server_properties() const;
  /// The broker's version, from server_properties().
  std::optional<BrokerVersion> broker_version() const;
  /// The URI of the host this connection is on (or tried last): the options' URI with that one
  /// host.
  const Uri& uri() const;
  /// The options this connection was made with, its URI narrowed to uri(): what a second
  /// connection to the same node is made with.
  ConnectionOptions options_on_this_host() const;
  uv_loop_t* loop() const;
  spdlog::logger* logger() const;
  /// Bytes waiting to be written to the socket (grows while the broker blocks us); over TLS,
  /// the frames not yet encrypted plus the encrypted bytes being written.
  size_t buffered_bytes() const;

 private:
  std::shared_ptr<detail::ConnectionAttempts> attempts_;
};

/// Looks `queue` up with a passive declare on a channel of its own, closed afterwards (a missing
/// queue closes the channel it is declared on, so that no other channel is disturbed). `callback`
/// gets the error (404 when the queue is missing) or the queue's counts. It is called exactly
/// once, also when the lookup cannot start (then before this returns).
void look_up_queue(const std::shared_ptr<Connection>& connection, const std::string& queue,
                   QueueDeclareCallback callback);

/// Takes a run lock: declares `queue` exclusive (and auto-delete, not durable) on a channel of its
/// own, so that the connection holds it until it closes and another connection's declare is
/// refused with 405 RESOURCE_LOCKED. A lock another connection holds is tried again every 250 ms
/// for `wait`: a run that has just ended (killed, or its connection lost) frees it once the broker
/// has seen its connection close, a moment later on RabbitMQ 4. `callback` gets nothing on
/// success, the 405 once `wait` is over, or any other error; it is called exactly once, also when
/// the first try cannot start (then before this returns).
void take_queue_lock(const std::shared_ptr<Connection>& connection, const std::string& queue,
                     std::chrono::milliseconds wait, CompletionCallback callback);

}  // namespace retryloop::client
