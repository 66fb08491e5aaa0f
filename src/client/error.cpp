#include "retryloop/client/error.hpp"

#include <string_view>

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
      case ClientError::consumer_cancelled:
        return "the broker cancelled the consumer";
      case ClientError::properties_too_large:
        return "the properties need a content header frame larger than frame_max";
    }
    return "unknown client error";
  }
};

/// What `method` needs on a `kind` ("queue" or "exchange") named `name` that the broker refused.
std::string permission_for(std::string_view method, std::string_view kind,
                           const std::string& name) {
  const std::string on = " permission on " + std::string(kind) + " '" + name + "'";
  const bool queue = kind == "queue";
  if (method == "basic.consume" || method == "basic.get" || method == "queue.purge") {
    return "read" + on;
  }
  if (method == "basic.publish") return "write" + on;
  if (method == "queue.delete" || method == "exchange.delete") return "configure" + on;
  if (method == "queue.bind" || method == "queue.unbind") {
    return (queue ? "write" : "read") + on;
  }
  if (method == "exchange.bind" || method == "exchange.unbind") {
    return "write" + on + " (as the destination) or read (as the source)";
  }
  if (method == "queue.declare") {
    return queue ? "configure" + on + " (and read, for a new queue with a dead-letter exchange)"
                 : "write" + on + " (the dead-letter exchange of a new queue)";
  }
  if (method == "exchange.declare") {
    return "configure" + on +
           " (and read, for a new exchange with an alternate exchange; or write, when it is "
           "the alternate exchange of a new exchange)";
  }
  return {};
}

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
  const std::string needed = needed_permission();
  if (!needed.empty()) text += ", which needs " + needed;
  return text;
}

std::string Error::needed_permission() const {
  if (reply_code != 403 || class_id == 0) return {};
  const char* method = amqp::method_name(class_id, method_id);
  if (method == nullptr) return {};
  // RabbitMQ 3.10: "ACCESS_REFUSED - access to queue 'q' in vhost '/' refused for user 'u'".
  // Later versions start with the permission ("read access to ..."): nothing to add then.
  constexpr std::string_view access_to = "access to ";
  const size_t at = reply_text.find(access_to);
  if (at == std::string::npos) return {};
  const std::string_view before = std::string_view(reply_text).substr(0, at);
  for (std::string_view word : {"configure ", "write ", "read "}) {
    if (before.size() >= word.size() && before.substr(before.size() - word.size()) == word) {
      return {};
    }
  }
  const std::string_view rest = std::string_view(reply_text).substr(at + access_to.size());
  for (std::string_view kind : {"queue", "exchange"}) {
    const std::string prefix = std::string(kind) + " '";
    if (rest.substr(0, prefix.size()) != prefix) continue;
    const size_t end = rest.find("' in vhost '", prefix.size());
    if (end == std::string_view::npos) return {};
    return permission_for(method, kind,
                          std::string(rest.substr(prefix.size(), end - prefix.size())));
  }
  return {};
}

}  // namespace retryloop::client
