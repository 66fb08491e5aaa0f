#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "retryloop/amqp/frame.hpp"
#include "retryloop/amqp/methods.hpp"
#include "retryloop/client/channel.hpp"
#include "retryloop/client/detail/ack_ledger.hpp"
#include "retryloop/client/detail/confirm_tracker.hpp"

namespace retryloop::client::detail {

class ConnectionImpl;

// What a Channel is: the protocol state of one channel, owned by its connection's table and by
// every Channel handle given out for it. Its public calls are Channel's (documented there).
class ChannelImpl : public std::enable_shared_from_this<ChannelImpl> {
 public:
  ChannelImpl(ConnectionImpl* connection, uint16_t id);
  ChannelImpl(const ChannelImpl&) = delete;
  ChannelImpl& operator=(const ChannelImpl&) = delete;
  ~ChannelImpl();

  uint16_t id() const { return id_; }
  bool is_open() const { return state_ == State::open; }
  /// Why the channel ended; empty while it is open.
  const Error& close_reason() const { return close_reason_; }

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
  bool in_confirm_mode() const { return confirm_mode_; }

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
  uint64_t next_publish_sequence() const { return confirms_.next_sequence(); }
  /// Publishes sent and not yet confirmed.
  size_t unconfirmed_count() const { return confirms_.unconfirmed(); }

  void set_return_handler(ReturnHandler handler) { on_return_ = std::move(handler); }
  void set_close_handler(ChannelCloseHandler handler) { on_close_ = std::move(handler); }

  /// Closes the channel (channel.close, then close-ok). Pending operations fail with
  /// closed_by_client. `callback` fires once: with no error on close-ok, or with the reason when
  /// the connection ends first.
  Error close(CompletionCallback callback = {});

  // ---- used by Connection ----

  /// Sends channel.open; `callback` fires when open-ok arrives.
  void open(CompletionCallback callback);
  /// Appends the held ack, if any, to the output: the connection is about to write, or the
  /// ack delay is over. Never calls back into the connection.
  void release_held_acks();
  /// Handles one frame for this channel; returns a protocol error to tear the connection down.
  Error handle_frame(const amqp::FrameView& frame);
  /// Fails everything pending with `reason`; the channel is dead afterwards.
  void terminate(const Error& reason);

 private:
  enum class State { opening, open, closing, closed };
  enum class ContentKind { none, deliver, get, returned };

  using ReplyHandler = std::function<void(const Error&, std::string_view payload)>;
  struct Rpc {
    std::string frame;
    uint32_t reply_key = 0;
    ReplyHandler on_reply;
    GetCallback on_get;  ///< set instead of on_reply for basic.get
  };
  template <class Method>
  Error call(const Method& method, uint32_t reply_key, ReplyHandler on_reply,
             GetCallback on_get = {});
  template <class Method>
  Error call_simple(const Method& method, uint32_t reply_key, CompletionCallback callback);
  template <class Method>
  Error send_async(const Method& method);
  void send_next_rpc();
  Rpc pop_rpc();
  Error handle_method(std::string_view payload);
  Error handle_content_header(std::string_view payload);
  Error handle_content_body(std::string_view payload);
  void dispatch_content();
  void handle_confirm(uint64_t tag, bool multiple, bool ack);
  void send_held_ack();
  void handle_return(ReturnedMessage&& returned);
  void reply_to_close(const amqp::ChannelClose& close);
  Error check_open() const;

  ConnectionImpl* connection_;
  uint16_t id_;
  State state_ = State::opening;
  Error close_reason_;
  std::deque<Rpc> rpcs_;
  bool rpc_in_flight_ = false;

  std::unordered_map<std::string, std::pair<DeliveryHandler, CancelHandler>> consumers_;

  ContentKind content_kind_ = ContentKind::none;
  bool awaiting_header_ = false;
  uint64_t body_remaining_ = 0;
  Delivery delivery_;
  GetResult get_result_;
  ReturnedMessage returned_;
  /// The encoded property list of the message being returned, as the broker sent it.
  std::string returned_properties_;
  amqp::ContentHeader header_;

  bool confirm_mode_ = false;
  detail::ConfirmTracker confirms_;

  detail::AckLedger acks_;
  /// Listed: the connection will call release_held_acks().
  bool listed_as_holding_acks_ = false;
  /// From the last qos(); 0: no limit.
  uint16_t prefetch_ = 0;

  ReturnHandler on_return_;
  ChannelCloseHandler on_close_;
  CompletionCallback on_closed_by_client_;
};

}  // namespace retryloop::client::detail
