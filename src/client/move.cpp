#include "retryloop/client/move.hpp"

#include "retryloop/client/channel.hpp"

namespace retryloop::client {

Error move_delivery(Channel& publish_channel, const std::shared_ptr<Channel>& delivery_channel,
                    uint64_t delivery_tag, const CopyTarget& copy, MoveCallback done) {
  return publish_channel.publish(
      copy.exchange, copy.routing_key, copy.properties, copy.body, Mandatory::yes,
      [delivery_channel, delivery_tag, done = std::move(done)](const PublishOutcome& outcome) {
        Error ack_error;
        if (outcome.ok()) ack_error = delivery_channel->ack(delivery_tag);
        done(outcome, ack_error);
      });
}

}  // namespace retryloop::client
