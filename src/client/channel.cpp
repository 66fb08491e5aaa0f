#include "channel_impl.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/client/detail/connection_protocol.hpp"

namespace retryloop::client {
namespace detail {
namespace {

using amqp::FrameType;

constexpr size_t kMaxBodyReserve = 64 * 1024 * 1024;
/// Acks held at most, on a channel with no prefetch limit.
constexpr uint32_t kHeldAcksWithoutPrefetch = 256;

Error protocol_error(std::string text) {
  return Error(ClientError::protocol_error, std::move(text));
}

}  // namespace

ChannelImpl::ChannelImpl(ConnectionProtocol* connection, uint16_t id)
    : connection_(connection), id_(id) {}

ChannelImpl::~ChannelImpl() = default;

Error ChannelImpl::check_open() const {
  if (state_ != State::open || connection_ == nullptr) {
    return close_reason_ ? close_reason_ : Error(ClientError::not_open);
  }
  return {};
}

template <class Method>
Error ChannelImpl::call(const Method& method, uint32_t reply_key, ReplyHandler on_reply,
                        GetCallback on_get) {
  if (auto error = check_open()) return error;
  Rpc rpc;
  if (auto ec = amqp::append_method_frame(rpc.frame, id_, method)) {
    return Error(ClientError::invalid_argument, std::string(Method::name) + ": " + ec.message());
  }
  rpc.reply_key = reply_key;
  rpc.on_reply = std::move(on_reply);
  rpc.on_get = std::move(on_get);
  rpcs_.push_back(std::move(rpc));
  send_next_rpc();
  return {};
}

template <class Method>
Error ChannelImpl::call_simple(const Method& method, uint32_t reply_key,
                               CompletionCallback callback) {
  return call(method, reply_key,
              [callback = std::move(callback)](const Error& error, std::string_view) {
                if (callback) callback(error);
              });
}

template <class Method>
Error ChannelImpl::send_async(const Method& method) {
  if (auto error = check_open()) return error;
  if (auto ec = amqp::append_method_frame(connection_->output(), id_, method)) {
    return Error(ClientError::invalid_argument, std::string(Method::name) + ": " + ec.message());
  }
  connection_->flush();
  return {};
}

void ChannelImpl::send_next_rpc() {
  if (rpc_in_flight_ || rpcs_.empty() || connection_ == nullptr) return;
  rpc_in_flight_ = true;
  std::string frame = std::move(rpcs_.front().frame);
  connection_->output().append(frame);
  connection_->flush();
}

ChannelImpl::Rpc ChannelImpl::pop_rpc() {
  Rpc rpc = std::move(rpcs_.front());
  rpcs_.pop_front();
  rpc_in_flight_ = false;
  send_next_rpc();
  return rpc;
}

void ChannelImpl::open(CompletionCallback callback) {
  Rpc rpc;
  amqp::append_method_frame(rpc.frame, id_, amqp::ChannelOpen{});
  rpc.reply_key = amqp::method_key<amqp::ChannelOpenOk>();
  rpc.on_reply = [this, callback = std::move(callback)](const Error& error, std::string_view) {
    if (!error) state_ = State::open;
    if (callback) callback(error);
  };
  rpcs_.push_back(std::move(rpc));
  send_next_rpc();
}

Error ChannelImpl::exchange_declare(std::string_view name, std::string_view type,
                                    const ExchangeOptions& options, CompletionCallback callback) {
  amqp::ExchangeDeclare m;
  m.exchange = name;
  m.type = type;
  m.passive = options.passive;
  m.durable = options.durable;
  m.auto_delete = options.auto_delete;
  m.internal = options.internal;
  m.arguments = options.arguments;
  return call_simple(m, amqp::method_key<amqp::ExchangeDeclareOk>(), std::move(callback));
}

Error ChannelImpl::exchange_delete(std::string_view name, bool if_unused,
                                   CompletionCallback callback) {
  amqp::ExchangeDelete m;
  m.exchange = name;
  m.if_unused = if_unused;
  return call_simple(m, amqp::method_key<amqp::ExchangeDeleteOk>(), std::move(callback));
}

Error ChannelImpl::exchange_bind(std::string_view destination, std::string_view source,
                                 std::string_view routing_key, const amqp::FieldTable& arguments,
                                 CompletionCallback callback) {
  amqp::ExchangeBind m;
  m.destination = destination;
  m.source = source;
  m.routing_key = routing_key;
  m.arguments = arguments;
  return call_simple(m, amqp::method_key<amqp::ExchangeBindOk>(), std::move(callback));
}

Error ChannelImpl::exchange_unbind(std::string_view destination, std::string_view source,
                                   std::string_view routing_key, const amqp::FieldTable& arguments,
                                   CompletionCallback callback) {
  amqp::ExchangeUnbind m;
  m.destination = destination;
  m.source = source;
  m.routing_key = routing_key;
  m.arguments = arguments;
  return call_simple(m, amqp::method_key<amqp::ExchangeUnbindOk>(), std::move(callback));
}

Error ChannelImpl::queue_declare(std::string_view name, const QueueOptions& options,
                                 QueueDeclareCallback callback) {
  amqp::QueueDeclare m;
  m.queue = name;
  m.passive = options.passive;
  m.durable = options.durable;
  m.exclusive = options.exclusive;
  m.auto_delete = options.auto_delete;
  m.arguments = options.arguments;
  return call(m, amqp::method_key<amqp::QueueDeclareOk>(),
              [callback = std::move(callback)](const Error& error, std::string_view payload) {
                QueueInfo info;
                if (error) {
                  if (callback) callback(error, info);
                  return;
                }
                amqp::QueueDeclareOk ok;
                if (auto ec = amqp::decode_method_frame(payload, ok)) {
                  if (callback) callback(Error(ec), info);
                  return;
                }
                info.name = std::move(ok.queue);
                info.message_count = ok.message_count;
                info.consumer_count = ok.consumer_count;
                if (callback) callback(Error{}, info);
              });
}

Error ChannelImpl::queue_bind(std::string_view queue, std::string_view exchange,
                              std::string_view routing_key, const amqp::FieldTable& arguments,
                              CompletionCallback callback) {
  amqp::QueueBind m;
  m.queue = queue;
  m.exchange = exchange;
  m.routing_key = routing_key;
  m.arguments = arguments;
  return call_simple(m, amqp::method_key<amqp::QueueBindOk>(), std::move(callback));
}

Error ChannelImpl::queue_unbind(std::string_view queue, std::string_view exchange,
                                std::string_view routing_key, const amqp::FieldTable& arguments,
                                CompletionCallback callback) {
  amqp::QueueUnbind m;
  m.queue = queue;
  m.exchange = exchange;
  m.routing_key = routing_key;
  m.arguments = arguments;
  return call_simple(m, amqp::method_key<amqp::QueueUnbindOk>(), std::move(callback));
}

namespace {
template <class OkMethod>
auto count_reply(CountCallback callback) {
  return [callback = std::move(callback)](const Error& error, std::string_view payload) {
    if (error) {
      if (callback) callback(error, 0);
      return;
    }
    OkMethod ok;
    auto ec = amqp::decode_method_frame(payload, ok);
    if (callback) callback(ec ? Error(ec) : Error{}, ok.message_count);
  };
}
}  // namespace

Error ChannelImpl::queue_purge(std::string_view queue, CountCallback callback) {
  amqp::QueuePurge m;
  m.queue = queue;
  return call(m, amqp::method_key<amqp::QueuePurgeOk>(),
              count_reply<amqp::QueuePurgeOk>(std::move(callback)));
}

Error ChannelImpl::queue_delete(std::string_view queue, bool if_unused, bool if_empty,
                                CountCallback callback) {
  amqp::QueueDelete m;
  m.queue = queue;
  m.if_unused = if_unused;
  m.if_empty = if_empty;
  return call(m, amqp::method_key<amqp::QueueDeleteOk>(),
              count_reply<amqp::QueueDeleteOk>(std::move(callback)));
}

Error ChannelImpl::qos(uint16_t prefetch_count, CompletionCallback callback) {
  amqp::BasicQos m;
  m.prefetch_count = prefetch_count;
  Error error = call_simple(m, amqp::method_key<amqp::BasicQosOk>(), std::move(callback));
  if (!error) prefetch_ = prefetch_count;
  return error;
}

Error ChannelImpl::consume(std::string_view queue, ConsumeOptions options,
                           DeliveryHandler on_delivery, ConsumeCallback callback) {
  amqp::BasicConsume m;
  m.queue = queue;
  m.consumer_tag = options.consumer_tag;
  m.no_ack = options.no_ack;
  m.exclusive = options.exclusive;
  m.arguments = std::move(options.arguments);
  return call(m, amqp::method_key<amqp::BasicConsumeOk>(),
              [this, on_delivery = std::move(on_delivery), on_cancel = std::move(options.on_cancel),
               raw_properties = options.raw_properties,
               callback = std::move(callback)](const Error& error, std::string_view payload) {
                if (error) {
                  if (callback) callback(error, std::string());
                  return;
                }
                amqp::BasicConsumeOk ok;
                if (auto ec = amqp::decode_method_frame(payload, ok)) {
                  if (callback) callback(Error(ec), std::string());
                  return;
                }
                consumers_[ok.consumer_tag] = {on_delivery, on_cancel, raw_properties};
                if (callback) callback(Error{}, ok.consumer_tag);
              });
}

Error ChannelImpl::cancel(std::string_view consumer_tag, CompletionCallback callback) {
  amqp::BasicCancel m;
  m.consumer_tag = consumer_tag;
  return call(m, amqp::method_key<amqp::BasicCancelOk>(),
              [this, tag = std::string(consumer_tag), callback = std::move(callback)](
                  const Error& error, std::string_view) {
                if (!error) consumers_.erase(tag);
                if (callback) callback(error);
              });
}

Error ChannelImpl::get(std::string_view queue, bool no_ack, GetCallback callback) {
  amqp::BasicGet m;
  m.queue = queue;
  m.no_ack = no_ack;
  return call(m, amqp::method_key<amqp::BasicGetOk>(), {}, std::move(callback));
}

Error ChannelImpl::ack(uint64_t delivery_tag, bool multiple) {
  if (auto error = check_open()) return error;
  if (!acks_.ack(delivery_tag, multiple)) {
    amqp::BasicAck m;
    m.delivery_tag = delivery_tag;
    return send_async(m);
  }
  if (!listed_as_holding_acks_) {
    listed_as_holding_acks_ = true;
    connection_->hold_acks(id_);
  }
  const uint32_t limit =
      prefetch_ == 0 ? kHeldAcksWithoutPrefetch : std::max<uint32_t>(1, prefetch_ / 4u);
  if (acks_.held() >= limit) send_held_ack();
  connection_->flush();
  return {};
}

Error ChannelImpl::nack(uint64_t delivery_tag, bool multiple, bool requeue) {
  if (multiple) send_held_ack();  // or the nack would cover tags the application acked
  amqp::BasicNack m;
  m.delivery_tag = delivery_tag;
  m.multiple = multiple;
  m.requeue = requeue;
  Error error = send_async(m);
  if (!error) acks_.settled_elsewhere(delivery_tag, multiple);
  return error;
}

Error ChannelImpl::reject(uint64_t delivery_tag, bool requeue) {
  amqp::BasicReject m;
  m.delivery_tag = delivery_tag;
  m.requeue = requeue;
  Error error = send_async(m);
  if (!error) acks_.settled_elsewhere(delivery_tag, false);
  return error;
}

void ChannelImpl::release_held_acks() {
  listed_as_holding_acks_ = false;
  send_held_ack();
}

void ChannelImpl::send_held_ack() {
  // Every tag up to the held one is settled, so `multiple` acks exactly the held acks.
  const auto through = acks_.take_held();
  if (!through) return;
  amqp::BasicAck m;
  m.delivery_tag = *through;
  m.multiple = true;
  if (state_ == State::open) amqp::append_method_frame(connection_->output(), id_, m);
}

Error ChannelImpl::confirm_select(CompletionCallback callback) {
  if (confirm_mode_) return Error(ClientError::invalid_argument, "already in confirm mode");
  Error error = call_simple(amqp::ConfirmSelect{}, amqp::method_key<amqp::ConfirmSelectOk>(),
                            std::move(callback));
  // The broker numbers publishes from the moment it handles confirm.select, which is before any
  // publish sent after this call.
  if (!error) confirm_mode_ = true;
  return error;
}

Error ChannelImpl::publish(std::string_view exchange, std::string_view routing_key,
                           const amqp::BasicProperties& properties, std::string_view body,
                           Mandatory mandatory, PublishCallback on_confirm) {
  if (auto error = check_open()) return error;
  if (on_confirm && !confirm_mode_) return Error(ClientError::not_in_confirm_mode);
  std::string& out = connection_->output();
  size_t rollback = out.size();
  amqp::BasicPublish m;
  m.exchange = exchange;
  m.routing_key = routing_key;
  m.mandatory = mandatory == Mandatory::yes;
  std::error_code ec = amqp::append_method_frame(out, id_, m);
  const size_t header_start = out.size();
  if (!ec) ec = amqp::append_header_frame(out, id_, body.size(), properties);
  if (ec) {
    out.resize(rollback);
    return Error(ClientError::invalid_argument, std::string("basic.publish: ") + ec.message());
  }
  // Unlike the body, the properties cannot be split: a larger frame would make the broker close
  // the whole connection.
  const size_t header_size = out.size() - header_start;
  const uint32_t frame_max = connection_->tuning().frame_max;
  if (frame_max != 0 && header_size > frame_max) {
    out.resize(rollback);
    return Error(ClientError::properties_too_large,
                 "basic.publish: the properties and headers take a " + std::to_string(header_size) +
                     "-byte frame, over the frame_max of " + std::to_string(frame_max) +
                     " bytes agreed with the broker");
  }
  amqp::append_body_frames(out, id_, body, frame_max);
  if (confirm_mode_) {
    std::string identity;
    if (m.mandatory) {
      const size_t properties_start =
          header_start + amqp::kFrameHeaderSize + amqp::kContentHeaderFixedSize;
      identity = detail::publish_identity(
          exchange, routing_key,
          std::string_view(out).substr(properties_start,
                                       header_start + header_size - 1 - properties_start),
          body);
    }
    confirms_.add(std::move(on_confirm), m.mandatory, std::move(identity));
  }
  connection_->flush();
  return {};
}

Error ChannelImpl::close(CompletionCallback callback) {
  if (state_ == State::closing || state_ == State::closed || connection_ == nullptr) {
    return close_reason_ ? close_reason_ : Error(ClientError::not_open);
  }
  send_held_ack();
  amqp::ChannelClose m;
  m.reply_code = 200;
  m.reply_text = "Goodbye";
  if (auto ec = amqp::append_method_frame(connection_->output(), id_, m)) return Error(ec);
  state_ = State::closing;
  content_kind_ = ContentKind::none;  // the rest of a message being received is discarded
  on_closed_by_client_ = std::move(callback);
  connection_->flush();
  return {};
}

Error ChannelImpl::handle_frame(const amqp::FrameView& frame) {
  auto self = shared_from_this();
  if (state_ == State::closing && frame.type != FrameType::method) return {};
  switch (frame.type) {
    case FrameType::method:
      if (content_kind_ != ContentKind::none) {
        return protocol_error("method frame arrived while a message's content was expected");
      }
      return handle_method(frame.payload);
    case FrameType::header:
      if (content_kind_ == ContentKind::none || !awaiting_header_) {
        return protocol_error("content header frame without a content method");
      }
      return handle_content_header(frame.payload);
    case FrameType::body:
      if (content_kind_ == ContentKind::none || awaiting_header_) {
        return protocol_error("content body frame without a content header");
      }
      return handle_content_body(frame.payload);
    case FrameType::heartbeat:
      return protocol_error("heartbeat frame on a channel other than 0");
  }
  return protocol_error("unknown frame type");
}

Error ChannelImpl::handle_method(std::string_view payload) {
  amqp::MethodId id;
  if (auto ec = amqp::peek_method_id(payload, id)) return Error(ec);
  const uint32_t key = id.key();

  if (state_ == State::closing && key != amqp::method_key<amqp::ChannelClose>() &&
      key != amqp::method_key<amqp::ChannelCloseOk>()) {
    return {};  // after channel.close, everything but close and close-ok is discarded
  }

  switch (key) {
    case amqp::method_key<amqp::BasicDeliver>(): {
      amqp::BasicDeliver m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      delivery_.consumer_tag = std::move(m.consumer_tag);
      delivery_.delivery_tag = m.delivery_tag;
      delivery_.redelivered = m.redelivered;
      delivery_.exchange = std::move(m.exchange);
      delivery_.routing_key = std::move(m.routing_key);
      // Content frames follow their method with no other method between them, so the entry
      // cannot go away before dispatch_content().
      auto consumer = consumers_.find(delivery_.consumer_tag);
      delivering_ = consumer != consumers_.end() ? &consumer->second : nullptr;
      content_kind_ = ContentKind::deliver;
      awaiting_header_ = true;
      return {};
    }
    case amqp::method_key<amqp::BasicAck>(): {
      amqp::BasicAck m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      handle_confirm(m.delivery_tag, m.multiple, true);
      return {};
    }
    case amqp::method_key<amqp::BasicNack>(): {
      amqp::BasicNack m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      handle_confirm(m.delivery_tag, m.multiple, false);
      return {};
    }
    case amqp::method_key<amqp::BasicReturn>(): {
      amqp::BasicReturn m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      returned_ = ReturnedMessage{};
      returned_.reply_code = m.reply_code;
      returned_.reply_text = std::move(m.reply_text);
      returned_.exchange = std::move(m.exchange);
      returned_.routing_key = std::move(m.routing_key);
      content_kind_ = ContentKind::returned;
      awaiting_header_ = true;
      return {};
    }
    case amqp::method_key<amqp::BasicGetOk>(): {
      if (!rpc_in_flight_ || rpcs_.front().reply_key != amqp::method_key<amqp::BasicGetOk>()) {
        return protocol_error("basic.get-ok without a basic.get");
      }
      amqp::BasicGetOk m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      get_result_ = GetResult{};
      get_result_.delivery_tag = m.delivery_tag;
      get_result_.redelivered = m.redelivered;
      get_result_.exchange = std::move(m.exchange);
      get_result_.routing_key = std::move(m.routing_key);
      get_result_.message_count = m.message_count;
      content_kind_ = ContentKind::get;
      awaiting_header_ = true;
      return {};
    }
    case amqp::method_key<amqp::BasicGetEmpty>(): {
      if (!rpc_in_flight_ || rpcs_.front().reply_key != amqp::method_key<amqp::BasicGetOk>()) {
        return protocol_error("basic.get-empty without a basic.get");
      }
      Rpc rpc = pop_rpc();
      if (rpc.on_get) rpc.on_get(Error{}, std::nullopt);
      return {};
    }
    case amqp::method_key<amqp::BasicCancel>(): {
      amqp::BasicCancel m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      if (!m.no_wait) {
        amqp::BasicCancelOk ok;
        ok.consumer_tag = m.consumer_tag;
        amqp::append_method_frame(connection_->output(), id_, ok);
        connection_->flush();
      }
      auto it = consumers_.find(m.consumer_tag);
      if (it == consumers_.end()) return {};
      CancelHandler on_cancel = std::move(it->second.on_cancel);
      consumers_.erase(it);
      if (auto* log = connection_->logger()) {
        log->warn("broker cancelled consumer {} on channel {}", m.consumer_tag, id_);
      }
      if (on_cancel) on_cancel(m.consumer_tag);
      return {};
    }
    case amqp::method_key<amqp::ChannelClose>(): {
      amqp::ChannelClose m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      if (state_ == State::closing) {
        // The two closes crossed: each side answers the other's and waits for the close-ok of
        // its own, as RabbitMQ does. The number stays taken until ours is answered, so that
        // the late close-ok cannot reach a new channel with the same number.
        amqp::append_method_frame(connection_->output(), id_, amqp::ChannelCloseOk{});
        connection_->flush();
        return {};
      }
      reply_to_close(m);
      return {};
    }
    case amqp::method_key<amqp::ChannelCloseOk>(): {
      if (state_ != State::closing) return protocol_error("channel.close-ok without channel.close");
      CompletionCallback callback = std::move(on_closed_by_client_);
      ConnectionProtocol* connection = connection_;
      terminate(Error(ClientError::closed_by_client));
      connection->release_channel(id_);
      if (callback) callback(Error{});
      return {};
    }
    case amqp::method_key<amqp::ChannelFlow>(): {
      amqp::ChannelFlow m;
      if (auto ec = amqp::decode_method_frame(payload, m)) return Error(ec);
      amqp::ChannelFlowOk ok;
      ok.active = m.active;
      amqp::append_method_frame(connection_->output(), id_, ok);
      connection_->flush();
      return {};
    }
    default:
      break;
  }

  if (rpc_in_flight_ && rpcs_.front().reply_key == key) {
    Rpc rpc = pop_rpc();
    if (rpc.on_reply) rpc.on_reply(Error{}, payload);
    return {};
  }
  const char* name = amqp::method_name(id.class_id, id.method_id);
  return protocol_error(std::string("unexpected ") + (name ? name : "unknown method") +
                        " on channel " + std::to_string(id_));
}

void ChannelImpl::reply_to_close(const amqp::ChannelClose& close) {
  amqp::append_method_frame(connection_->output(), id_, amqp::ChannelCloseOk{});
  connection_->flush();
  Error reason(ClientError::channel_closed, close.reply_text);
  reason.reply_code = close.reply_code;
  reason.class_id = close.failing_class_id;
  reason.method_id = close.failing_method_id;
  // Debug only: the error reaches every pending callback, and a 404 from a passive declare is
  // an expected answer, not a problem.
  if (auto* log = connection_->logger()) {
    log->debug("broker closed channel {}: {}", id_, reason.message());
  }
  ConnectionProtocol* connection = connection_;
  terminate(reason);
  connection->release_channel(id_);
}

Error ChannelImpl::handle_content_header(std::string_view payload) {
  amqp::Reader fixed(payload);
  const uint16_t class_id = fixed.u16();
  const uint16_t weight = fixed.u16();
  const uint64_t body_size = fixed.u64();
  if (!fixed.ok()) return Error(fixed.error());
  if (class_id != amqp::BasicPublish::class_id || weight != 0) {
    return Error(make_error_code(amqp::CodecError::bad_content_header));
  }
  if (body_size > connection_->max_body_size()) {
    return Error(ClientError::message_too_large,
                 "broker sent a body of " + std::to_string(body_size) + " bytes");
  }
  Message* target = content_kind_ == ContentKind::deliver ? &delivery_.message
                    : content_kind_ == ContentKind::get   ? &get_result_.message
                                                          : &returned_.message;
  const std::string_view property_bytes = payload.substr(amqp::kContentHeaderFixedSize);
  target->properties_error = {};
  target->raw_properties.clear();
  // Without even the property flags there is nothing to keep: that fails to decode now.
  if (content_kind_ == ContentKind::deliver && delivering_ != nullptr &&
      delivering_->raw_properties && !property_bytes.empty()) {
    target->raw_properties.assign(property_bytes);
  } else if (auto error = amqp::decode_properties(property_bytes, target->properties)) {
    // The frame is sound but its property list is not: the message is handed on with its
    // properties as raw bytes, so that one undecodable message cannot stall its queue by closing
    // the connection again and again.
    if (auto* log = connection_->logger()) {
      log->warn("channel {}: a message's properties cannot be decoded ({}); passed on as bytes",
                id_, error.message());
    }
    target->properties = amqp::BasicProperties{};
    target->properties_error = error;
    target->raw_properties.assign(property_bytes);
  }
  if (content_kind_ == ContentKind::returned) returned_properties_.assign(property_bytes);
  target->body.clear();
  target->body.reserve(std::min<uint64_t>(body_size, kMaxBodyReserve));
  body_remaining_ = body_size;
  awaiting_header_ = false;
  if (body_remaining_ == 0) dispatch_content();
  return {};
}

Error ChannelImpl::handle_content_body(std::string_view payload) {
  if (payload.size() > body_remaining_) {
    return protocol_error("content body frames are longer than the header's body size");
  }
  Message* target = content_kind_ == ContentKind::deliver ? &delivery_.message
                    : content_kind_ == ContentKind::get   ? &get_result_.message
                                                          : &returned_.message;
  target->body.append(payload.data(), payload.size());
  body_remaining_ -= payload.size();
  if (body_remaining_ == 0) dispatch_content();
  return {};
}

void ChannelImpl::dispatch_content() {
  ContentKind kind = content_kind_;
  content_kind_ = ContentKind::none;
  switch (kind) {
    case ContentKind::deliver: {
      ConsumerEntry* consumer = std::exchange(delivering_, nullptr);
      if (consumer == nullptr || !consumer->on_delivery) {
        // A delivery for a consumer we do not know: hand it back rather than hold it forever.
        if (auto* log = connection_->logger()) {
          log->warn("delivery for unknown consumer {} on channel {} requeued",
                    delivery_.consumer_tag, id_);
        }
        (void)nack(delivery_.delivery_tag, false, true);
        delivery_ = Delivery{};
        return;
      }
      Delivery delivery = std::move(delivery_);
      delivery_ = Delivery{};
      consumer->on_delivery(std::move(delivery));
      return;
    }
    case ContentKind::get: {
      Rpc rpc = pop_rpc();
      GetResult result = std::move(get_result_);
      get_result_ = GetResult{};
      if (rpc.on_get) rpc.on_get(Error{}, std::move(result));
      return;
    }
    case ContentKind::returned: {
      ReturnedMessage returned = std::move(returned_);
      returned_ = ReturnedMessage{};
      handle_return(std::move(returned));
      return;
    }
    case ContentKind::none:
      return;
  }
}

void ChannelImpl::handle_return(ReturnedMessage&& returned) {
  if (confirm_mode_) {
    // Returns come in publish order, each before its own ack, and the broker returns a message
    // with the properties it was given; see publish() for why this match is exact.
    Error error(ClientError::unroutable, returned.reply_text);
    error.reply_code = returned.reply_code;
    (void)confirms_.returned(detail::publish_identity(returned.exchange, returned.routing_key,
                                                      returned_properties_, returned.message.body),
                             returned_properties_.size(), std::move(error));
  }
  returned_properties_.clear();
  if (on_return_) on_return_(returned);
}

void ChannelImpl::handle_confirm(uint64_t tag, bool multiple, bool ack) {
  auto ready = confirm_mode_ ? confirms_.confirm(tag, multiple, ack) : std::nullopt;
  if (!ready) {
    if (auto* log = connection_->logger()) {
      log->warn("ignoring confirm for unknown publish {} on channel {}", tag, id_);
    }
    return;
  }
  auto self = shared_from_this();
  for (auto& [callback, outcome] : *ready)
    callback(outcome);
}

void ChannelImpl::terminate(const Error& reason) {
  if (state_ == State::closed) return;
  auto self = shared_from_this();
  state_ = State::closed;
  close_reason_ = reason;
  connection_ = nullptr;
  content_kind_ = ContentKind::none;
  delivering_ = nullptr;
  consumers_.clear();
  acks_.drop_held();  // the broker requeues what they would have acked

  std::deque<Rpc> rpcs = std::move(rpcs_);
  rpcs_.clear();
  rpc_in_flight_ = false;
  auto failed = confirms_.fail_all(reason);

  for (auto& rpc : rpcs) {
    if (rpc.on_get) {
      rpc.on_get(reason, std::nullopt);
    } else if (rpc.on_reply) {
      rpc.on_reply(reason, {});
    }
  }
  for (auto& [callback, outcome] : failed)
    callback(outcome);
  CompletionCallback on_closed_by_client = std::move(on_closed_by_client_);
  if (on_closed_by_client) on_closed_by_client(reason);
  ChannelCloseHandler on_close = std::move(on_close_);
  if (on_close) on_close(reason);
}

}  // namespace detail

Channel::Channel(std::shared_ptr<detail::ChannelImpl> impl) : impl_(std::move(impl)) {}
Channel::~Channel() = default;

uint16_t Channel::id() const {
  return impl_->id();
}
bool Channel::is_open() const {
  return impl_->is_open();
}
const Error& Channel::close_reason() const {
  return impl_->close_reason();
}
Error Channel::exchange_declare(std::string_view name, std::string_view type,
                                const ExchangeOptions& options, CompletionCallback callback) {
  return impl_->exchange_declare(name, type, options, std::move(callback));
}
Error Channel::exchange_delete(std::string_view name, bool if_unused, CompletionCallback callback) {
  return impl_->exchange_delete(name, if_unused, std::move(callback));
}
Error Channel::exchange_bind(std::string_view destination, std::string_view source,
                             std::string_view routing_key, const amqp::FieldTable& arguments,
                             CompletionCallback callback) {
  return impl_->exchange_bind(destination, source, routing_key, arguments, std::move(callback));
}
Error Channel::exchange_unbind(std::string_view destination, std::string_view source,
                               std::string_view routing_key, const amqp::FieldTable& arguments,
                               CompletionCallback callback) {
  return impl_->exchange_unbind(destination, source, routing_key, arguments, std::move(callback));
}
Error Channel::queue_declare(std::string_view name, const QueueOptions& options,
                             QueueDeclareCallback callback) {
  return impl_->queue_declare(name, options, std::move(callback));
}
Error Channel::queue_bind(std::string_view queue, std::string_view exchange,
                          std::string_view routing_key, const amqp::FieldTable& arguments,
                          CompletionCallback callback) {
  return impl_->queue_bind(queue, exchange, routing_key, arguments, std::move(callback));
}
Error Channel::queue_unbind(std::string_view queue, std::string_view exchange,
                            std::string_view routing_key, const amqp::FieldTable& arguments,
                            CompletionCallback callback) {
  return impl_->queue_unbind(queue, exchange, routing_key, arguments, std::move(callback));
}
Error Channel::queue_purge(std::string_view queue, CountCallback callback) {
  return impl_->queue_purge(queue, std::move(callback));
}
Error Channel::queue_delete(std::string_view queue, bool if_unused, bool if_empty,
                            CountCallback callback) {
  return impl_->queue_delete(queue, if_unused, if_empty, std::move(callback));
}
Error Channel::qos(uint16_t prefetch_count, CompletionCallback callback) {
  return impl_->qos(prefetch_count, std::move(callback));
}
Error Channel::consume(std::string_view queue, ConsumeOptions options, DeliveryHandler on_delivery,
                       ConsumeCallback callback) {
  return impl_->consume(queue, std::move(options), std::move(on_delivery), std::move(callback));
}
Error Channel::cancel(std::string_view consumer_tag, CompletionCallback callback) {
  return impl_->cancel(consumer_tag, std::move(callback));
}
Error Channel::get(std::string_view queue, bool no_ack, GetCallback callback) {
  return impl_->get(queue, no_ack, std::move(callback));
}
Error Channel::ack(uint64_t delivery_tag, bool multiple) {
  return impl_->ack(delivery_tag, multiple);
}
Error Channel::nack(uint64_t delivery_tag, bool multiple, bool requeue) {
  return impl_->nack(delivery_tag, multiple, requeue);
}
Error Channel::reject(uint64_t delivery_tag, bool requeue) {
  return impl_->reject(delivery_tag, requeue);
}
Error Channel::confirm_select(CompletionCallback callback) {
  return impl_->confirm_select(std::move(callback));
}
bool Channel::in_confirm_mode() const {
  return impl_->in_confirm_mode();
}
Error Channel::publish(std::string_view exchange, std::string_view routing_key,
                       const amqp::BasicProperties& properties, std::string_view body,
                       Mandatory mandatory, PublishCallback on_confirm) {
  return impl_->publish(exchange, routing_key, properties, body, mandatory, std::move(on_confirm));
}
uint64_t Channel::next_publish_sequence() const {
  return impl_->next_publish_sequence();
}
size_t Channel::unconfirmed_count() const {
  return impl_->unconfirmed_count();
}
void Channel::set_return_handler(ReturnHandler handler) {
  impl_->set_return_handler(std::move(handler));
}
void Channel::set_close_handler(ChannelCloseHandler handler) {
  impl_->set_close_handler(std::move(handler));
}
Error Channel::close(CompletionCallback callback) {
  return impl_->close(std::move(callback));
}

}  // namespace retryloop::client
