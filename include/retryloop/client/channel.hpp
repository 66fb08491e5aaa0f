#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/properties.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/client/message.hpp"
#include "retryloop/client/publish.hpp"

namespace retryloop::client {

class Connection;

namespace detail {
class ChannelImpl;
}

using CompletionCallback = std::function<void(const Error&)>;

/// What queue.declare-ok reports.
struct QueueInfo {
  std::string name;
  uint32_t message_count = 0;
  uint32_t consumer_count = 0;
};
using QueueDeclareCallback = std::function<void(const Error&, const QueueInfo&)>;
/// Receives a message count (queue.purge-ok, queue.delete-ok).
using CountCallback = std::function<void(const Error&, uint32_t message_count)>;
using ConsumeCallback = std::function<void(const Error&, const std::string& consumer_tag)>;
/// Receives each delivery of a consumer; the handler owns the delivery it is given.
using DeliveryHandler = std::function<void(Delivery&&)>;
/// Told when the broker cancels a consumer (its queue was deleted, or it failed over).
using CancelHandler = std::function<void(const std::string& consumer_tag)>;
/// Receives the fetched message, or nullopt when the queue was empty (basic.get-empty).
using GetCallback = std::function<void(const Error&, std::optional<GetResult>&&)>;
/// Receives mandatory messages the broker returned, on a channel that is not in confirm mode or
/// in addition to the publish callback.
using ReturnHandler = std::function<void(const ReturnedMessage&)>;
/// Told once when the channel ends: broker close (with reply code), connection loss, or close().
using ChannelCloseHandler = std::function<void(const Error&)>;

struct ExchangeOptions {
  bool passive = false;
  bool durable = true;
  bool auto_delete = false;
  bool internal = false;
  amqp::FieldTable arguments;
};

struct QueueOptions {
  bool passive = false;
  bool durable = true;
  bool exclusive = false;
  bool auto_delete = false;
  amqp::FieldTable arguments;
};

struct ConsumeOptions {
  /// Empty: the broker assigns one.
  std::string consumer_tag;
  bool no_ack = false;
  bool exclusive = false;
  amqp::FieldTable arguments;
  CancelHandler on_cancel;
  /// Hands each delivery over with its properties as they arrived: `message.raw_properties` holds
  /// the property flags and list, `message.properties` stays empty, and nothing is checked until
  /// decode_properties(message) is called. For a consumer that holds many deliveries before it
  /// reads them: the wire form takes a fraction of the memory of decoded headers.
  bool raw_properties = false;
};

enum class Mandatory : bool { no = false, yes = true };

/// An AMQP channel. Created by Connection::open_channel; all calls and callbacks happen on the
/// connection's loop thread.
///
/// Calls that take a callback return an Error: when it is set the call failed at once and the
/// callback is never invoked; otherwise the callback is invoked exactly once, later. Synchronous
/// methods are sent one at a time, in call order. When the channel ends, every pending callback
/// fails with the channel's error (for a broker close: its reply code, text and method).
class Channel {
 public:
  /// Made by Connection::open_channel; a Channel is a handle that shares its channel's state.
  explicit Channel(std::shared_ptr<detail::ChannelImpl> impl);
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel();

  uint16_t id() const;
  bool is_open() const;
  /// Why the channel ended; empty while it is open.
  const Error& close_reason() const;

  Error exchange_declare(std::string_view name, std::string_view type,
                         const ExchangeOptions& options, CompletionCallback callback);
  Error exchange_delete(std::string_view name, bool if_unused, CompletionCallback callback);
  Error exchange_bind(std::string_view destination, std::string_view source,
                      std::string_view routing_key, const amqp::FieldTable& arguments,
                      CompletionCallback callback);
  Error exchange_unbind(std::string_view destination, std::string_view source,
                        std::string_view routing_key, const amqp::FieldTable& arguments,
                        CompletionCallback callback);

  Error queue_declare(std::string_view name, const QueueOptions& options,
                      QueueDeclareCallback callback);
  Error queue_bind(std::string_view queue, std::string_view exchange, std::string_view routing_key,
                   const amqp::FieldTable& arguments, CompletionCallback callback);
  Error queue_unbind(std::string_view queue, std::string_view exchange,
                     std::string_view routing_key, const amqp::FieldTable& arguments,
                     CompletionCallback callback);
  Error queue_purge(std::string_view queue, CountCallback callback);
  Error queue_delete(std::string_view queue, bool if_unused, bool if_empty, CountCallback callback);

  /// basic.qos: at most `prefetch_count` unacked deliveries (0 = no limit), per consumer.
  Error qos(uint16_t prefetch_count, CompletionCallback callback);

  /// Starts a consumer. `on_delivery` may be called as soon as the callback reports success.
  Error consume(std::string_view queue, ConsumeOptions options, DeliveryHandler on_delivery,
                ConsumeCallback callback);
  Error cancel(std::string_view consumer_tag, CompletionCallback callback);
  Error get(std::string_view queue, bool no_ack, GetCallback callback);

  /// Settles deliveries of this channel. A tag from another (or an earlier) channel must never be
  /// passed: the broker would close the channel with 406. On a closed channel these do nothing
  /// and return not_open, so a tag can never reach a channel it did not come from.
  ///
  /// Acks are held and sent as one `multiple` ack. An ack is held when every tag up to it is
  /// settled once it is made, so the multiple ack covers only what the application settled; a
  /// message still being handled is never acked by it. Held acks go out with the next write
  /// (ConnectionOptions::ack_delay 0), or after at most `ack_delay`; earlier when a quarter of
  /// the prefetch count is held (so the broker never runs out of credit waiting for them), and
  /// before a multiple nack, channel.close and connection.close. An ack out of order is sent
  /// with the next write. If the connection fails first, the broker requeues held messages, as
  /// it does every unacked one.
  Error ack(uint64_t delivery_tag, bool multiple = false);
  Error nack(uint64_t delivery_tag, bool multiple, bool requeue);
  Error reject(uint64_t delivery_tag, bool requeue);

  /// Puts the channel in confirm mode. Publishes made after this call are confirmed.
  Error confirm_select(CompletionCallback callback);
  bool in_confirm_mode() const;

  /// Publishes a message, splitting the body at frame_max. In confirm mode `on_confirm` fires
  /// exactly once with the outcome; with Mandatory::yes an unroutable message is reported as
  /// `returned`, never as `acked`. Without confirm mode `on_confirm` must be empty.
  ///
  /// A basic.return carries no sequence number. It is given to the oldest unsettled, not yet
  /// returned mandatory publish with the same exchange, routing key, encoded properties and body,
  /// compared byte for byte (so the channel keeps a copy of each mandatory message until it is
  /// confirmed). Should the broker have re-encoded the properties (RabbitMQ 3.10 and 4.0 return
  /// them as sent), the oldest with the same exchange, routing key and body is taken. Two
  /// publishes with different content never swap outcomes. Only publishes that are identical in
  /// every byte can: then one of them was routed and the other returned, the queues hold one copy
  /// that is equally a copy of either, and every outcome reported is true of the bytes that were
  /// sent.
  Error publish(std::string_view exchange, std::string_view routing_key,
                const amqp::BasicProperties& properties, std::string_view body,
                Mandatory mandatory = Mandatory::no, PublishCallback on_confirm = {});
  /// Sequence number the next publish will get in confirm mode.
  uint64_t next_publish_sequence() const;
  /// Publishes sent and not yet confirmed.
  size_t unconfirmed_count() const;

  void set_return_handler(ReturnHandler handler);
  void set_close_handler(ChannelCloseHandler handler);

  /// Closes the channel (channel.close, then close-ok). Pending operations fail with
  /// closed_by_client. `callback` fires once: with no error on close-ok, or with the reason when
  /// the connection ends first.
  Error close(CompletionCallback callback = {});

 private:
  std::shared_ptr<detail::ChannelImpl> impl_;
};

}  // namespace retryloop::client
