#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace retryloop::client {

/// One broker address.
struct Endpoint {
  std::string host;
  uint16_t port = 0;

  /// `host:port`, with an IPv6 host in brackets.
  std::string text() const;
  bool operator==(const Endpoint& other) const { return host == other.host && port == other.port; }
};

/// In which order a connection tries the hosts of a URI.
enum class HostOrder {
  in_order,  ///< as written: the first host that accepts the connection wins
  shuffled,  ///< in a random order at each connect, to spread clients over a cluster's nodes
};

/// A parsed AMQP URI: `amqp[s]://user:pass@host:port/vhost?heartbeat=10&frame_max=131072`.
/// Defaults follow RabbitMQ's URI spec: guest/guest, localhost, port 5672 (5671 for amqps),
/// vhost "/" when the path is absent or empty ("amqp://h/" means vhost "/", as in pika and
/// amqp091-go). Components are percent-decoded, so vhost "/" may also be written `%2F`.
///
/// Several hosts, for the nodes of a cluster, are separated by commas:
/// `amqp://user:pass@h1:5672,h2:5673,h3/vhost` (a host without a port gets the scheme's). The
/// first is `host` and `port`, the others `other_hosts`; a connection tries them in turn (see
/// Connection::connect). `host_order=shuffled` in the query shuffles them at each connect.
struct Uri {
  bool tls = false;
  std::string host = "localhost";
  uint16_t port = 5672;
  std::vector<Endpoint> other_hosts;
  HostOrder host_order = HostOrder::in_order;
  std::string user = "guest";
  std::string password = "guest";
  std::string vhost = "/";
  /// Query options; unset ones keep the connection's defaults.
  std::optional<uint16_t> heartbeat_seconds;
  std::optional<uint32_t> frame_max;
  std::optional<uint16_t> channel_max;
  std::optional<std::chrono::milliseconds> connect_timeout;
  /// TLS query options: `cacertfile=PATH`, `verify=verify_none|verify_peer`,
  /// `server_name_indication=HOST`, and for a client certificate `certfile=PATH` and
  /// `keyfile=PATH`.
  std::optional<std::string> ca_file;
  std::optional<std::string> cert_file;
  std::optional<std::string> key_file;
  std::optional<bool> verify_peer;
  std::optional<std::string> server_name;

  /// The URI with the password replaced by `***`, for logs and messages.
  std::string redacted() const;
  /// Every host: `host`:`port` first, then `other_hosts`.
  std::vector<Endpoint> hosts() const;
  /// The same URI with only `endpoint` as its host.
  Uri with_only(const Endpoint& endpoint) const;
  /// The same hosts with `endpoint` moved to the end: the order for reconnecting after a
  /// connection to `endpoint` was lost. Unchanged when `endpoint` is not among them.
  Uri with_last(const Endpoint& endpoint) const;
};

/// Parses an AMQP URI. Throws std::invalid_argument with a message naming the part at fault
/// (never echoing the password).
Uri parse_uri(std::string_view text);

}  // namespace retryloop::client
