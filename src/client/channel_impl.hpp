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

class ConnectionProtocol;

// What a Channel is: the protocol state of one channel, owned by its connection's table and by
// every Channel handle given out for it. Its public calls are Channel's (documented there).
class ChannelImpl : public std::enable_shared_from_this<ChannelImpl> {
 public:
  ChannelImpl(ConnectionProtocol* connection, uint16_t id);
  ChannelImpl(const ChannelImpl&) = delete;
  ChannelImpl& operator=(const ChannelImpl&) = delete;
  ~ChannelImpl();

  uint16_t id() const { return id_; }
  bool is_open() const { return state_ == State::open; }
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

  Error qos(uint16_t prefetch_count, CompletionCallback callback);

  Error consume(std::string_view queue, ConsumeOptions options, DeliveryHandler on_delivery,
                ConsumeCallback callback);
  Error cancel(std::string_view consumer_tag, CompletionCallback callback);
  Error get(std::string_view queue, bool no_ack, GetCallback callback);

  Error ack(uint64_t delivery_tag, bool multiple = false);
  Error nack(uint64_t delivery_tag, bool multiple, bool requeue);
  Error reject(uint64_t delivery_tag, bool requeue);

  Error confirm_select(CompletionCallback callback);
  bool in_confirm_mode() const { return confirm_mode_; }

  Error publish(std::string_view exchange, std::string_view routing_key,
                const amqp::BasicProperties& properties, std::string_view body,
                Mandatory mandatory = Mandatory::no, PublishCallback on_confirm = {});
  uint64_t next_publish_sequence() const { return confirms_.next_sequence(); }
  size_t unconfirmed_count() const { return confirms_.unconfirmed(); }

  void set_return_handler(ReturnHandler handler) { on_return_ = std::move(handler); }
  void set_close_handler(ChannelCloseHandler handler) { on_close_ = std::move(handler); }

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

  ConnectionProtocol* connection_;
  uint16_t id_;
  State state_ = State::opening;
  Error close_reason_;
  std::deque<Rpc> rpcs_;
  bool rpc_in_flight_ = false;

  struct ConsumerEntry {
    DeliveryHandler on_delivery;
    CancelHandler on_cancel;
    /// ConsumeOptions::raw_properties
    bool raw_properties = false;
  };
  std::unordered_map<std::string, ConsumerEntry> consumers_;
  /// The consumer of the delivery being received; nullptr when its tag is unknown.
  ConsumerEntry* delivering_ = nullptr;

  ContentKind content_kind_ = ContentKind::none;
  bool awaiting_header_ = false;
  uint64_t body_remaining_ = 0;
  Delivery delivery_;
  GetResult get_result_;
  ReturnedMessage returned_;
  /// The encoded property list of the message being returned, as the broker sent it.
  std::string returned_properties_;

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
