#include "retryloop/client/message.hpp"

#include "retryloop/amqp/frame.hpp"

namespace retryloop::client {

std::error_code decode_properties(Message& message) {
  if (message.raw_properties.empty() || message.properties_error) return message.properties_error;
  if (auto error = amqp::decode_properties(message.raw_properties, message.properties)) {
    message.properties = amqp::BasicProperties{};
    message.properties_error = error;
    return error;
  }
  std::string().swap(message.raw_properties);
  return {};
}

std::error_code decode_properties(std::string_view flags_and_list, amqp::BasicProperties& out) {
  return amqp::decode_properties(flags_and_list, out);
}

}  // namespace retryloop::client
