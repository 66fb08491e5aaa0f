#include "retryloop/client/error.hpp"

#include "retryloop/amqp/methods.hpp"

namespace retryloop::client {
namespace {

class ClientCategory : public std::error_category {
 public:
  const char* name() const noexcept override { return "amqp client"; }
  std::string message(int value) const override {
    switch (static_cast<ClientError>(value)) {
      case ClientError::resolve_failed:
        return "host name did not resolve";
      case ClientError::connect_failed:
        return "TCP connection refused or failed";
      case ClientError::connect_timeout:
        return "connection did not open within the connect timeout";
      case ClientError::authentication_failed:
        return "broker refused the user name or password";
      case ClientError::vhost_refused:
        return "broker refused access to the virtual host";
      case ClientError::protocol_error:
        return "peer violated the AMQP protocol";
      case ClientError::connection_lost:
        return "connection lost";
      case ClientError::heartbeat_timeout:
        return "no heartbeat from the broker for two intervals";
      case ClientError::connection_closed:
        return "broker closed the connection";
      case ClientError::channel_closed:
        return "broker closed the channel";
      case ClientError::closed_by_client:
        return "closed by the application";
      case ClientError::not_open:
        return "connection or channel is not open";
      case ClientError::invalid_argument:
        return "invalid argument";
      case ClientError::channel_limit:
        return "no free channel number (channel_max reached)";
      case ClientError::not_in_confirm_mode:
        return "publish callback given on a channel without confirm mode";
      case ClientError::message_too_large:
        return "message body larger than the allowed maximum";
      case ClientError::tls_failed:
        return "TLS handshake or certificate verification failed";
      case ClientError::unroutable:
        return "broker returned the message: no queue is bound for its routing key";
      case ClientError::not_found:
        return "not found";
      case ClientError::topology_drift:
        return "topology drift";
      case ClientError::consumer_cancelled:
        return "the broker cancelled the consumer";
    }
    return "unknown client error";
  }
};

}  // namespace

const std::error_category& client_category() noexcept {
  static const ClientCategory category;
  return category;
}

std::error_code make_error_code(ClientError e) noexcept {
  return {static_cast<int>(e), client_category()};
}

std::string Error::message() const {
  if (!code) return "ok";
  std::string text = code.message();
  if (reply_code != 0) {
    text += " (" + std::to_string(reply_code);
    if (!reply_text.empty()) text += " " + reply_text;
    text += ")";
  } else if (!reply_text.empty()) {
    text += ": " + reply_text;
  }
  if (class_id != 0) {
    const char* method = amqp::method_name(class_id, method_id);
    text += " in ";
    text += method ? method : (std::to_string(class_id) + "." + std::to_string(method_id));
  }
  return text;
}

}  // namespace retryloop::client
