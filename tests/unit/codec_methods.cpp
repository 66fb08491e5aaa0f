#include <catch2/catch.hpp>

#include <cstring>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "codec_support.hpp"
#include "retryloop/amqp/frame.hpp"
#include "retryloop/amqp/methods.hpp"

using namespace retryloop::amqp;
using retryloop::amqp::test::from_hex;
using retryloop::amqp::test::to_hex;

namespace {

template <class M, class Fill>
AnyMethod sample(Fill fill) {
  M m;
  fill(m);
  return m;
}

template <class M>
AnyMethod sample() {
  return M{};
}

// One instance of every method with every field set away from its default, so that a field
// the codec drops or misplaces shows up as a difference.
std::vector<AnyMethod> every_method() {
  return {
      sample<ConnectionStart>([](ConnectionStart& m) {
        m.version_major = 0xA1;
        m.version_minor = 0xA2;
        m.server_properties = FieldTable{{"server-properties", FieldValue(int64_t{-3})}};
        m.mechanisms = "mechanisms";
        m.locales = "locales";
      }),
      sample<ConnectionStartOk>([](ConnectionStartOk& m) {
        m.client_properties = FieldTable{{"client-properties", FieldValue(int64_t{-1})}};
        m.mechanism = "mechanism";
        m.response = "response";
        m.locale = "locale";
      }),
      sample<ConnectionSecure>([](ConnectionSecure& m) { m.challenge = "challenge"; }),
      sample<ConnectionSecureOk>([](ConnectionSecureOk& m) { m.response = "response"; }),
      sample<ConnectionTune>([](ConnectionTune& m) {
        m.channel_max = 0xB001;
        m.frame_max = 0xC0000002u;
        m.heartbeat = 0xB003;
      }),
      sample<ConnectionTuneOk>([](ConnectionTuneOk& m) {
        m.channel_max = 0xB001;
        m.frame_max = 0xC0000002u;
        m.heartbeat = 0xB003;
      }),
      sample<ConnectionOpen>([](ConnectionOpen& m) {
        m.virtual_host = "virtual-host";
        m.reserved_1 = "reserved-1";
        m.reserved_2 = true;
      }),
      sample<ConnectionOpenOk>([](ConnectionOpenOk& m) { m.reserved_1 = "reserved-1"; }),
      sample<ConnectionClose>([](ConnectionClose& m) {
        m.reply_code = 0xB001;
        m.reply_text = "reply-text";
        m.failing_class_id = 0xB003;
        m.failing_method_id = 0xB004;
      }),
      sample<ConnectionCloseOk>(),
      sample<ChannelOpen>([](ChannelOpen& m) { m.reserved_1 = "reserved-1"; }),
      sample<ChannelOpenOk>([](ChannelOpenOk& m) { m.reserved_1 = "reserved-1"; }),
      sample<ChannelFlow>([](ChannelFlow& m) { m.active = true; }),
      sample<ChannelFlowOk>([](ChannelFlowOk& m) { m.active = true; }),
      sample<ChannelClose>([](ChannelClose& m) {
        m.reply_code = 0xB001;
        m.reply_text = "reply-text";
        m.failing_class_id = 0xB003;
        m.failing_method_id = 0xB004;
      }),
      sample<ChannelCloseOk>(),
      sample<ExchangeDeclare>([](ExchangeDeclare& m) {
        m.reserved_1 = 0xB001;
        m.exchange = "exchange";
        m.type = "type";
        m.passive = true;
        m.durable = true;
        m.auto_delete = true;
        m.internal = true;
        m.no_wait = true;
        m.arguments = FieldTable{{"arguments", FieldValue(int64_t{-9})}};
      }),
      sample<ExchangeDeclareOk>(),
      sample<ExchangeDelete>([](ExchangeDelete& m) {
        m.reserved_1 = 0xB001;
        m.exchange = "exchange";
        m.if_unused = true;
        m.no_wait = true;
      }),
      sample<ExchangeDeleteOk>(),
      sample<ExchangeBind>([](ExchangeBind& m) {
        m.reserved_1 = 0xB001;
        m.destination = "destination";
        m.source = "source";
        m.routing_key = "routing-key";
        m.no_wait = true;
        m.arguments = FieldTable{{"arguments", FieldValue(int64_t{-6})}};
      }),
      sample<ExchangeBindOk>(),
      sample<ExchangeUnbind>([](ExchangeUnbind& m) {
        m.reserved_1 = 0xB001;
        m.destination = "destination";
        m.source = "source";
        m.routing_key = "routing-key";
        m.no_wait = true;
        m.arguments = FieldTable{{"arguments", FieldValue(int64_t{-6})}};
      }),
      sample<ExchangeUnbindOk>(),
      sample<QueueDeclare>([](QueueDeclare& m) {
        m.reserved_1 = 0xB001;
        m.queue = "queue";
        m.passive = true;
        m.durable = true;
        m.exclusive = true;
        m.auto_delete = true;
        m.no_wait = true;
        m.arguments = FieldTable{{"arguments", FieldValue(int64_t{-8})}};
      }),
      sample<QueueDeclareOk>([](QueueDeclareOk& m) {
        m.queue = "queue";
        m.message_count = 0xC0000002u;
        m.consumer_count = 0xC0000003u;
      }),
      sample<QueueBind>([](QueueBind& m) {
        m.reserved_1 = 0xB001;
        m.queue = "queue";
        m.exchange = "exchange";
        m.routing_key = "routing-key";
        m.no_wait = true;
        m.arguments = FieldTable{{"arguments", FieldValue(int64_t{-6})}};
      }),
      sample<QueueBindOk>(),
      sample<QueueUnbind>([](QueueUnbind& m) {
        m.reserved_1 = 0xB001;
        m.queue = "queue";
        m.exchange = "exchange";
        m.routing_key = "routing-key";
        m.arguments = FieldTable{{"arguments", FieldValue(int64_t{-5})}};
      }),
      sample<QueueUnbindOk>(),
      sample<QueuePurge>([](QueuePurge& m) {
        m.reserved_1 = 0xB001;
        m.queue = "queue";
        m.no_wait = true;
      }),
      sample<QueuePurgeOk>([](QueuePurgeOk& m) { m.message_count = 0xC0000001u; }),
      sample<QueueDelete>([](QueueDelete& m) {
        m.reserved_1 = 0xB001;
        m.queue = "queue";
        m.if_unused = true;
        m.if_empty = true;
        m.no_wait = true;
      }),
      sample<QueueDeleteOk>([](QueueDeleteOk& m) { m.message_count = 0xC0000001u; }),
      sample<BasicQos>([](BasicQos& m) {
        m.prefetch_size = 0xC0000001u;
        m.prefetch_count = 0xB002;
        m.global = true;
      }),
      sample<BasicQosOk>(),
      sample<BasicConsume>([](BasicConsume& m) {
        m.reserved_1 = 0xB001;
        m.queue = "queue";
        m.consumer_tag = "consumer-tag";
        m.no_local = true;
        m.no_ack = true;
        m.exclusive = true;
        m.no_wait = true;
        m.arguments = FieldTable{{"arguments", FieldValue(int64_t{-8})}};
      }),
      sample<BasicConsumeOk>([](BasicConsumeOk& m) { m.consumer_tag = "consumer-tag"; }),
      sample<BasicCancel>([](BasicCancel& m) {
        m.consumer_tag = "consumer-tag";
        m.no_wait = true;
      }),
      sample<BasicCancelOk>([](BasicCancelOk& m) { m.consumer_tag = "consumer-tag"; }),
      sample<BasicPublish>([](BasicPublish& m) {
        m.reserved_1 = 0xB001;
        m.exchange = "exchange";
        m.routing_key = "routing-key";
        m.mandatory = true;
        m.immediate = true;
      }),
      sample<BasicReturn>([](BasicReturn& m) {
        m.reply_code = 0xB001;
        m.reply_text = "reply-text";
        m.exchange = "exchange";
        m.routing_key = "routing-key";
      }),
      sample<BasicDeliver>([](BasicDeliver& m) {
        m.consumer_tag = "consumer-tag";
        m.delivery_tag = 0xD000000000000002ULL;
        m.redelivered = true;
        m.exchange = "exchange";
        m.routing_key = "routing-key";
      }),
      sample<BasicGet>([](BasicGet& m) {
        m.reserved_1 = 0xB001;
        m.queue = "queue";
        m.no_ack = true;
      }),
      sample<BasicGetOk>([](BasicGetOk& m) {
        m.delivery_tag = 0xD000000000000001ULL;
        m.redelivered = true;
        m.exchange = "exchange";
        m.routing_key = "routing-key";
        m.message_count = 0xC0000005u;
      }),
      sample<BasicGetEmpty>([](BasicGetEmpty& m) { m.reserved_1 = "reserved-1"; }),
      sample<BasicAck>([](BasicAck& m) {
        m.delivery_tag = 0xD000000000000001ULL;
        m.multiple = true;
      }),
      sample<BasicReject>([](BasicReject& m) {
        m.delivery_tag = 0xD000000000000001ULL;
        m.requeue = true;
      }),
      sample<BasicRecoverAsync>([](BasicRecoverAsync& m) { m.requeue = true; }),
      sample<BasicRecover>([](BasicRecover& m) { m.requeue = true; }),
      sample<BasicRecoverOk>(),
      sample<BasicNack>([](BasicNack& m) {
        m.delivery_tag = 0xD000000000000001ULL;
        m.multiple = true;
        m.requeue = true;
      }),
      sample<TxSelect>(),
      sample<TxSelectOk>(),
      sample<TxCommit>(),
      sample<TxCommitOk>(),
      sample<TxRollback>(),
      sample<TxRollbackOk>(),
      sample<ConfirmSelect>([](ConfirmSelect& m) { m.nowait = true; }),
      sample<ConfirmSelectOk>(),
  };
}

std::string frame_of(const AnyMethod& method, uint16_t channel = 1) {
  std::string out;
  std::error_code ec =
      std::visit([&](const auto& m) { return append_method_frame(out, channel, m); }, method);
  REQUIRE_FALSE(ec);
  return out;
}

template <class M>
std::string frame_of_method(const M& m, uint16_t channel = 1) {
  std::string out;
  REQUIRE_FALSE(append_method_frame(out, channel, m));
  return out;
}

template <class M>
M decode_golden(std::string_view hex) {
  std::string frame = from_hex(hex);
  std::error_code ec;
  auto frames = test::parse_frames(frame, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(frames.size() == 1);
  REQUIRE(frames[0].type == FrameType::method);
  AnyMethod any;
  REQUIRE_FALSE(decode_method(frames[0].payload, any));
  REQUIRE(std::holds_alternative<M>(any));
  M typed;
  REQUIRE_FALSE(decode_method_frame(frames[0].payload, typed));
  CHECK(typed == std::get<M>(any));
  // Decoding and encoding again gives the broker's bytes back.
  CHECK(to_hex(frame_of_method(typed, frames[0].channel)) == to_hex(frame));
  return typed;
}

}  // namespace

TEST_CASE("Every generated method round-trips through a frame", "[codec]") {
  std::vector<AnyMethod> methods = every_method();
  std::set<size_t> covered;
  for (const AnyMethod& method : methods)
    covered.insert(method.index());
  REQUIRE(covered.size() == std::variant_size_v<AnyMethod>);
  REQUIRE(methods.size() == std::variant_size_v<AnyMethod>);

  for (const AnyMethod& method : methods) {
    std::visit(
        [&](const auto& m) {
          using M = std::decay_t<decltype(m)>;
          CAPTURE(M::name);
          std::string frame = frame_of(method, 5);
          std::error_code ec;
          auto frames = test::parse_frames(frame, ec);
          REQUIRE_FALSE(ec);
          REQUIRE(frames.size() == 1);
          CHECK(frames[0].channel == 5);

          AnyMethod decoded;
          REQUIRE_FALSE(decode_method(frames[0].payload, decoded));
          REQUIRE(decoded.index() == method.index());
          CHECK(std::get<M>(decoded) == m);
          CHECK_FALSE(std::get<M>(decoded) != m);
          CHECK(frame_of(decoded, 5) == frame);

          M typed;
          REQUIRE_FALSE(decode_method_frame(frames[0].payload, typed));
          CHECK(typed == m);

          // A default-constructed method differs unless the method has no fields.
          if (frames[0].payload.size() > 4) CHECK(M{} != m);
          M empty;
          AnyMethod empty_back;
          REQUIRE_FALSE(decode_method(test::payload_of(frame_of_method(empty)), empty_back));
          CHECK(std::get<M>(empty_back) == empty);

          const char* name = method_name(M::class_id, M::method_id);
          REQUIRE(name != nullptr);
          CHECK(std::string(name) == M::name);
        },
        method);
  }
}

TEST_CASE("Every generated method cut short at any byte fails as truncated", "[codec]") {
  for (const AnyMethod& method : every_method()) {
    std::string payload = test::payload_of(frame_of(method));
    CAPTURE(to_hex(payload.substr(0, 4)));
    for (size_t n = 0; n < payload.size(); ++n) {
      AnyMethod decoded;
      std::error_code ec = decode_method(std::string_view(payload).substr(0, n), decoded);
      if (ec != CodecError::truncated) {
        CAPTURE(n);
        CHECK(ec == CodecError::truncated);
      }
    }
  }
}

TEST_CASE("Every generated method with a byte too many fails with trailing bytes", "[codec]") {
  for (const AnyMethod& method : every_method()) {
    std::string payload = test::payload_of(frame_of(method)) + '\0';
    CAPTURE(to_hex(payload.substr(0, 4)));
    AnyMethod decoded;
    CHECK(decode_method(payload, decoded) == CodecError::trailing_bytes);
  }
}

TEST_CASE("connection.start from RabbitMQ 3.10 decodes and re-encodes to the same bytes",
          "[codec]") {
  auto start = decode_golden<ConnectionStart>(test::kConnectionStart310);
  CHECK(start.version_major == 0);
  CHECK(start.version_minor == 9);
  CHECK(start.mechanisms == "PLAIN AMQPLAIN");
  CHECK(start.locales == "en_US");
  const FieldTable& props = start.server_properties;
  CHECK(props.find("product")->as_string() == "RabbitMQ");
  CHECK(props.find("version")->as_string() == "3.10.8");
  const FieldTable* capabilities = props.find("capabilities")->get_if<FieldTable>();
  REQUIRE(capabilities != nullptr);
  for (const char* capability : {"publisher_confirms", "basic.nack", "consumer_cancel_notify",
                                 "connection.blocked", "authentication_failure_close"}) {
    CAPTURE(capability);
    REQUIRE(capabilities->find(capability) != nullptr);
    CHECK(*capabilities->find(capability)->get_if<bool>());
  }
}

TEST_CASE("connection.tune from RabbitMQ 3.10 carries its defaults", "[codec]") {
  auto tune = decode_golden<ConnectionTune>(test::kConnectionTune310);
  CHECK(tune.channel_max == 2047);
  CHECK(tune.frame_max == 131072);
  CHECK(tune.heartbeat == 60);
}

TEST_CASE("queue.declare-ok from RabbitMQ 3.10 decodes", "[codec]") {
  auto ok = decode_golden<QueueDeclareOk>(test::kQueueDeclareOk310);
  CHECK(ok.queue == "rl.wait");
  CHECK(ok.message_count == 0);
  CHECK(ok.consumer_count == 0);
}

TEST_CASE("basic.deliver from RabbitMQ 3.10 decodes", "[codec]") {
  auto deliver = decode_golden<BasicDeliver>(test::kBasicDeliver310);
  CHECK(deliver.consumer_tag == "ctag-1");
  CHECK(deliver.delivery_tag == 3);
  CHECK_FALSE(deliver.redelivered);
  CHECK(deliver.exchange == "");
  CHECK(deliver.routing_key == "rl.work");
}

TEST_CASE("A publisher confirm from RabbitMQ 3.10 is a basic.ack", "[codec]") {
  auto ack = decode_golden<BasicAck>(test::kBasicAckConfirm310);
  CHECK(ack.delivery_tag == 1);
  CHECK_FALSE(ack.multiple);
}

TEST_CASE("basic.ack with multiple encodes as pika does", "[codec]") {
  BasicAck ack;
  ack.delivery_tag = 7;
  ack.multiple = true;
  CHECK(to_hex(frame_of_method(ack)) == to_hex(from_hex(test::kBasicAckMultiple)));
  CHECK(decode_golden<BasicAck>(test::kBasicAckMultiple) == ack);
}

TEST_CASE("basic.publish encodes as pika does", "[codec]") {
  BasicPublish publish;
  publish.exchange = "orders.in";
  publish.routing_key = "order.created";
  publish.mandatory = true;
  CHECK(to_hex(frame_of_method(publish)) == to_hex(from_hex(test::kBasicPublish)));
  CHECK(decode_golden<BasicPublish>(test::kBasicPublish) == publish);
}

TEST_CASE("queue.declare with arguments encodes as pika does", "[codec]") {
  QueueDeclare declare;
  declare.queue = "orders.wait.30s";
  declare.durable = true;
  declare.arguments = FieldTable{{"x-message-ttl", FieldValue(int32_t{30000})},
                                 {"x-dead-letter-exchange", FieldValue("")},
                                 {"x-dead-letter-routing-key", FieldValue("orders")}};
  CHECK(to_hex(frame_of_method(declare)) == to_hex(from_hex(test::kQueueDeclareWithArguments)));
  CHECK(decode_golden<QueueDeclare>(test::kQueueDeclareWithArguments) == declare);
}

TEST_CASE("Consecutive bits pack into one octet from the least significant bit", "[codec]") {
  QueueDeclare q;
  auto bits_of = [](const QueueDeclare& m) {
    std::string payload = test::payload_of(frame_of_method(m));
    // ids (4), reserved-1 (2), queue (1 + 0), then the bits
    return static_cast<uint8_t>(payload[7]);
  };
  CHECK(bits_of(q) == 0x00);
  q.passive = true;
  CHECK(bits_of(q) == 0x01);
  q = QueueDeclare{};
  q.durable = true;
  CHECK(bits_of(q) == 0x02);
  q = QueueDeclare{};
  q.exclusive = true;
  CHECK(bits_of(q) == 0x04);
  q = QueueDeclare{};
  q.auto_delete = true;
  CHECK(bits_of(q) == 0x08);
  q = QueueDeclare{};
  q.no_wait = true;
  CHECK(bits_of(q) == 0x10);

  BasicNack nack;
  nack.delivery_tag = 1;
  nack.requeue = true;
  CHECK(to_hex(test::payload_of(frame_of_method(nack))) ==
        "003c0078"
        "0000000000000001"
        "02");
  nack.multiple = true;
  CHECK(to_hex(test::payload_of(frame_of_method(nack))) ==
        "003c0078"
        "0000000000000001"
        "03");

  ExchangeDeclare x;
  x.passive = x.durable = x.auto_delete = x.internal = x.no_wait = true;
  std::string payload = test::payload_of(frame_of_method(x));
  CHECK(to_hex(payload) ==
        "0028000a"
        "0000"
        "00"
        "00"
        "1f"
        "00000000");
}

TEST_CASE("Bits on the wire beyond a method's fields are ignored", "[codec]") {
  // basic.ack with every bit of the flags octet set decodes as multiple only.
  AnyMethod any;
  REQUIRE_FALSE(decode_method(from_hex("003c0050 0000000000000009 ff"), any));
  CHECK(std::get<BasicAck>(any).multiple);
  CHECK(std::get<BasicAck>(any).delivery_tag == 9);
}

TEST_CASE("connection.close carries the failing method's ids apart from its own", "[codec]") {
  ConnectionClose close;
  close.reply_code = kNotFound;
  close.reply_text = "NOT_FOUND - no queue 'q'";
  close.failing_class_id = QueueDeclare::class_id;
  close.failing_method_id = QueueDeclare::method_id;
  std::string payload = test::payload_of(frame_of_method(close));
  CHECK(to_hex(payload.substr(0, 6)) ==
        "000a0032"
        "0194");
  CHECK(to_hex(payload.substr(payload.size() - 4)) == "0032000a");
  CHECK(ConnectionClose::class_id == 10);
  CHECK(ConnectionClose::method_id == 50);
  CHECK(ChannelClose::class_id == 20);
  CHECK(ChannelClose::method_id == 40);
}

TEST_CASE("Unknown class or method ids are reported as unknown methods", "[codec]") {
  AnyMethod any;
  CHECK(decode_method(from_hex("000a 0063"), any) == CodecError::unknown_method);
  CHECK(decode_method(from_hex("0046 000a"), any) == CodecError::unknown_method);
  CHECK(decode_method(from_hex("0000 0000"), any) == CodecError::unknown_method);
  CHECK(decode_method(from_hex("000a"), any) == CodecError::truncated);
  CHECK(method_name(10, 99) == nullptr);
  CHECK(method_name(0, 0) == nullptr);
  CHECK(std::string(method_name(60, 120)) == "basic.nack");
  CHECK(std::string(method_name(40, 51)) == "exchange.unbind-ok");
}

TEST_CASE("decode_method_frame refuses a payload of another method", "[codec]") {
  BasicAck ack;
  std::string payload = test::payload_of(frame_of_method(BasicNack{}));
  CHECK(decode_method_frame(payload, ack) == CodecError::unexpected_frame);
  CHECK(decode_method_frame(std::string_view("\x00", 1), ack) == CodecError::truncated);
}

TEST_CASE("Method structs know their ids, names and whether they are synchronous", "[codec]") {
  static_assert(QueueDeclare::class_id == 50 && QueueDeclare::method_id == 10);
  static_assert(QueueDeclare::synchronous && !QueueDeclare::has_content);
  static_assert(BasicPublish::has_content && !BasicPublish::synchronous);
  static_assert(BasicDeliver::has_content && BasicReturn::has_content);
  static_assert(BasicGetOk::has_content && BasicGetOk::synchronous);
  static_assert(!BasicAck::synchronous && !BasicNack::synchronous);
  static_assert(!ChannelFlowOk::synchronous);
  static_assert(ConfirmSelect::class_id == 85 && ConfirmSelectOk::method_id == 11);
  static_assert(ExchangeUnbindOk::class_id == 40 && ExchangeUnbindOk::method_id == 51);
  static_assert(std::variant_size_v<AnyMethod> == 60);
  CHECK(std::string(QueueDeclare::name) == "queue.declare");
  CHECK(std::string(BasicRecoverAsync::name) == "basic.recover-async");
}

TEST_CASE("Reply code constants follow the spec", "[codec]") {
  static_assert(kReplySuccess == 200);
  static_assert(kContentTooLarge == 311);
  static_assert(kNoConsumers == 313);
  static_assert(kConnectionForced == 320);
  static_assert(kAccessRefused == 403);
  static_assert(kNotFound == 404);
  static_assert(kResourceLocked == 405);
  static_assert(kPreconditionFailed == 406);
  static_assert(kFrameError == 501);
  static_assert(kChannelError == 504);
  static_assert(kUnexpectedFrame == 505);
  static_assert(kResourceError == 506);
  static_assert(kNotAllowed == 530);
  static_assert(kInternalError == 541);
  SUCCEED("checked at compile time");
}

TEST_CASE("A method short string over 255 bytes fails and leaves the buffer as it was", "[codec]") {
  BasicPublish publish;
  publish.routing_key = std::string(256, 'r');
  std::string out = "keep";
  CHECK(append_method_frame(out, 1, publish) == CodecError::string_too_long);
  CHECK(out == "keep");
  publish.routing_key.resize(255);
  CHECK_FALSE(append_method_frame(out, 1, publish));
}
