#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "retryloop/amqp/properties.hpp"

namespace retryloop::client {

/// Properties and body of a message, as published or as received. The properties are decoded
/// faithfully (type letters and header order kept), so re-publishing them gives the same bytes.
struct Message {
  amqp::BasicProperties properties;
  std::string body;
  /// Set when the broker delivered properties this client cannot decode although the frame
  /// itself is sound (headers nested past the codec's limit, an unknown type letter): then
  /// `properties` is empty and `raw_properties` holds the property flags and list exactly as
  /// they arrived. The connection stays open; the application decides what to do (the retry
  /// consumer parks such a message as poison).
  std::error_code properties_error;
  /// The property flags and list as they arrived, when they could not be decoded (above) or are
  /// not decoded yet (ConsumeOptions::raw_properties); empty otherwise.
  std::string raw_properties;
};

/// Decodes properties kept in wire form (ConsumeOptions::raw_properties) into
/// `message.properties` and empties `raw_properties`. When they cannot be decoded, sets
/// `properties_error` and keeps the bytes, as for a message the channel could not decode. Does
/// nothing to a message whose properties are decoded already, or failed before. Returns
/// `properties_error`.
std::error_code decode_properties(Message& message);
/// Decodes a property flags and list in wire form (Message::raw_properties) into `out`; every
/// byte must be part of them.
std::error_code decode_properties(std::string_view flags_and_list, amqp::BasicProperties& out);

/// A message pushed to a consumer (basic.deliver).
struct Delivery {
  std::string consumer_tag;
  uint64_t delivery_tag = 0;
  bool redelivered = false;
  std::string exchange;
  std::string routing_key;
  Message message;
};

/// A message fetched with basic.get.
struct GetResult {
  uint64_t delivery_tag = 0;
  bool redelivered = false;
  std::string exchange;
  std::string routing_key;
  uint32_t message_count = 0;  ///< messages left in the queue after this one
  Message message;
};

/// A mandatory message the broker could not route (basic.return).
struct ReturnedMessage {
  uint16_t reply_code = 0;
  std::string reply_text;
  std::string exchange;
  std::string routing_key;
  Message message;
};

}  // namespace retryloop::client
