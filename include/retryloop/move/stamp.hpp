#pragma once

#include <string>
#include <string_view>

#include "retryloop/amqp/properties.hpp"

namespace retryloop::move {

/// A name for a message that is the same each time the message is read, for a stamp that a rerun
/// of a killed move gives its copy again: "id-" and 32 hex digits, the first 128 bits of the
/// SHA-256 of its message id, its other properties and headers, and its body. The broker's
/// redelivery counts (`x-delivery-count`, `x-acquired-count`), which a quorum queue adds when a
/// killed move's deliveries return, are left out, and so is the header `stamp_header`.
///
/// Empty for a message without a message id: two such messages may have the same bytes, and a
/// stamp made of the bytes alone would take them for one. Two messages with the same id and the
/// same bytes are one message to it, as they are to an inbox. Empty too when the properties
/// cannot be encoded.
std::string stable_stamp(const amqp::BasicProperties& properties, std::string_view body,
                         std::string_view stamp_header);

}  // namespace retryloop::move
