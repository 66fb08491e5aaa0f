#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "retryloop/amqp/properties.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/client/publish.hpp"

namespace retryloop::client {
class Channel;
}  // namespace retryloop::client

namespace retryloop::retry {

/// Where a delivery's copy goes, and what it carries.
struct CopyTarget {
  std::string_view exchange;
  std::string_view routing_key;
  const amqp::BasicProperties& properties;
  std::string_view body;
};

/// Told once what became of a move: the copy's publish outcome, and when it was confirmed, the
/// error of the ack of the original (empty: acked, the move is done).
using MoveCallback =
    std::function<void(const client::PublishOutcome& copy, const client::Error& ack_error)>;

/// Moves a delivery the one way that never loses it: publishes its copy (mandatory) on
/// `publish_channel`, which must be in confirm mode, and acks the original on
/// `delivery_channel` only once the broker confirmed the copy and did not return it. Nacked,
/// returned or failed, the original stays unacked, for the caller to try again or give back.
/// Returns an error when the publish could not start; then `done` never fires.
client::Error move_delivery(client::Channel& publish_channel,
                            const std::shared_ptr<client::Channel>& delivery_channel,
                            uint64_t delivery_tag, const CopyTarget& copy, MoveCallback done);

}  // namespace retryloop::retry
