#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace retryloop::client {

/// A parsed AMQP URI: `amqp[s]://user:pass@host:port/vhost?heartbeat=10&frame_max=131072`.
/// Defaults follow RabbitMQ's URI spec: guest/guest, localhost, port 5672 (5671 for amqps),
/// vhost "/" when the path is absent or empty ("amqp://h/" means vhost "/", as in pika and
/// amqp091-go). Components are percent-decoded, so vhost "/" may also be written `%2F`.
struct Uri {
  bool tls = false;
  std::string host = "localhost";
  uint16_t port = 5672;
  std::string user = "guest";
  std::string password = "guest";
  std::string vhost = "/";
  /// Query options; unset ones keep the connection's defaults.
  std::optional<uint16_t> heartbeat_seconds;
  std::optional<uint32_t> frame_max;
  std::optional<uint16_t> channel_max;
  std::optional<std::chrono::milliseconds> connect_timeout;
  /// TLS query options: `cacertfile=PATH`, `verify=verify_none|verify_peer`,
  /// `server_name_indication=HOST`.
  std::optional<std::string> ca_file;
  std::optional<bool> verify_peer;
  std::optional<std::string> server_name;

  /// The URI with the password replaced by `***`, for logs and messages.
  std::string redacted() const;
};

/// Parses an AMQP URI. Throws std::invalid_argument with a message naming the part at fault
/// (never echoing the password).
Uri parse_uri(std::string_view text);

}  // namespace retryloop::client
