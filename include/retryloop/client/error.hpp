#pragma once

#include <cstdint>
#include <string>
#include <system_error>

namespace retryloop::client {

/// Errors of the transport and protocol state machine. Server-initiated closes carry the
/// server's reply code and text in Error as well. The layers above have codes of their own
/// (consumer::ConsumerError, parking::ParkingError) in the same Error.
enum class ClientError {
  resolve_failed = 1,     ///< the host name did not resolve
  connect_failed,         ///< no address accepted the TCP connection
  connect_timeout,        ///< the handshake did not finish within the connect timeout
  authentication_failed,  ///< the broker refused the user name or password
  vhost_refused,          ///< the broker refused access to the virtual host
  protocol_error,         ///< the peer broke the protocol (bad frame, unexpected method)
  connection_lost,        ///< the socket closed or failed without a connection.close
  heartbeat_timeout,      ///< nothing arrived for two heartbeat intervals
  connection_closed,      ///< the broker closed the connection (reply code in Error)
  channel_closed,         ///< the broker closed the channel (reply code in Error)
  closed_by_client,       ///< the application closed the channel or connection
  not_open,               ///< the operation needs an open connection or channel
  invalid_argument,       ///< an argument cannot be sent (name too long, bad option)
  channel_limit,          ///< every channel number allowed by channel_max is in use
  not_in_confirm_mode,    ///< a publish callback was given on a channel without confirms
  message_too_large,      ///< a body larger than the configured or broker limit
  tls_failed,             ///< the TLS handshake or certificate verification failed
  unroutable,             ///< the broker returned a mandatory message: no queue matched
  consumer_cancelled,     ///< the broker cancelled a consumer (its queue was deleted)
  properties_too_large,   ///< a publish's properties need a header frame over frame_max
};

const std::error_category& client_category() noexcept;
std::error_code make_error_code(ClientError e) noexcept;

/// The result of an operation. Empty (false) on success. When the broker closed a channel or
/// the connection, `reply_code`, `reply_text` and the failing method's ids say why (for example
/// 406 PRECONDITION_FAILED for queue.declare).
struct [[nodiscard]] Error {
  std::error_code code;
  uint16_t reply_code = 0;
  std::string reply_text;
  uint16_t class_id = 0;
  uint16_t method_id = 0;

  Error() = default;
  Error(std::error_code c, std::string text = {})  // NOLINT: implicit by design
      : code(c), reply_text(std::move(text)) {}
  Error(ClientError c, std::string text = {})
      : code(make_error_code(c)), reply_text(std::move(text)) {}

  explicit operator bool() const { return static_cast<bool>(code); }

  /// One line for logs and users: the error, the reply code and text, the method that failed
  /// when the broker named one, and for a 403 the permission that method needs.
  std::string message() const;

  /// For a 403 ACCESS_REFUSED whose text names the resource but not the permission (RabbitMQ
  /// 3.10 says "access to queue 'q' in vhost '/' refused for user 'u'"): what the failed method
  /// needs on that resource, for example "read permission on queue 'q'". Empty otherwise.
  std::string needed_permission() const;
};

}  // namespace retryloop::client

namespace std {
template <>
struct is_error_code_enum<retryloop::client::ClientError> : true_type {};
}  // namespace std
