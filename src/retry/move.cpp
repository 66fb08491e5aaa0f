#include "retryloop/retry/move.hpp"

#include "retryloop/client/channel.hpp"

namespace retryloop::retry {

client::Error move_delivery(client::Channel& publish_channel,
                            const std::shared_ptr<client::Channel>& delivery_channel,
                            uint64_t delivery_tag, const CopyTarget& copy, MoveCallback done) {
  return publish_channel.publish(copy.exchange, copy.routing_key, copy.properties, copy.body,
                                 client::Mandatory::yes,
                                 [delivery_channel, delivery_tag,
                                  done = std::move(done)](const client::PublishOutcome& outcome) {
                                   client::Error ack_error;
                                   if (outcome.ok())
                                     ack_error = delivery_channel->ack(delivery_tag);
                                   done(outcome, ack_error);
                                 });
}

}  // namespace retryloop::retry
