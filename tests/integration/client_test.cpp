#include <catch2/catch.hpp>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "retryloop/amqp/frame.hpp"
#include "retryloop/client/connection.hpp"
#include "support/harness.hpp"
#include "support/tcp_proxy.hpp"

using namespace retryloop;
using namespace retryloop::client;
using retryloop::test::TestLoop;

namespace {

amqp::BasicProperties persistent() {
  amqp::BasicProperties properties;
  properties.delivery_mode = 2;
  return properties;
}

/// Publishes on a confirm channel and waits for the outcome.
PublishOutcome publish_and_wait(TestLoop& loop, Channel& channel, const std::string& exchange,
                                const std::string& routing_key, const std::string& body,
                                Mandatory mandatory = Mandatory::no,
                                const amqp::BasicProperties& properties = persistent()) {
  bool done = false;
  PublishOutcome result;
  Error immediate = channel.publish(exchange, routing_key, properties, body, mandatory,
                                    [&](const PublishOutcome& outcome) {
                                      result = outcome;
                                      done = true;
                                    });
  INFO(immediate.message());
  REQUIRE_FALSE(immediate);
  REQUIRE(loop.run_until([&] { return done; }));
  return result;
}

/// Publishes `count` messages with the bodies "0", "1", ... to `queue`, each confirmed.
void publish_numbered(TestLoop& loop, Channel& channel, const std::string& queue, int count) {
  for (int i = 0; i < count; ++i) {
    REQUIRE(publish_and_wait(loop, channel, "", queue, std::to_string(i)).ok());
  }
}

std::optional<GetResult> get_one(TestLoop& loop, Channel& channel, const std::string& queue,
                                 bool no_ack = true) {
  bool done = false;
  std::optional<GetResult> result;
  Error error;
  REQUIRE_FALSE(channel.get(queue, no_ack, [&](const Error& e, std::optional<GetResult>&& r) {
    error = e;
    result = std::move(r);
    done = true;
  }));
  REQUIRE(loop.run_until([&] { return done; }));
  INFO(error.message());
  REQUIRE_FALSE(error);
  return result;
}

}  // namespace

TEST_CASE("A client connects, declares, publishes, consumes, acks and closes cleanly",
          "[client][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  CHECK(connection->is_open());
  CHECK(connection->tuning().frame_max == 131072);
  CHECK(connection->server_properties().find("product") != nullptr);

  auto channel = test::open_channel(loop, *connection);
  std::string exchange = test::unique_name("x");
  std::string queue = test::unique_name("q");
  ExchangeOptions exchange_options;
  exchange_options.auto_delete = false;
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) {
    return channel->exchange_declare(exchange, "direct", exchange_options, cb);
  }));
  test::declare_queue(loop, *channel, queue);
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) {
    return channel->queue_bind(queue, exchange, "key", {}, cb);
  }));
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) { return channel->qos(10, cb); }));
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));

  amqp::BasicProperties properties = persistent();
  properties.content_type = "text/plain";
  properties.message_id = "m-1";
  properties.headers = amqp::FieldTable{{"attempt", int32_t{1}}};
  for (int i = 0; i < 5; ++i) {
    auto outcome = publish_and_wait(loop, *channel, exchange, "key", "hello " + std::to_string(i),
                                    Mandatory::yes, properties);
    CHECK(outcome.ok());
  }

  std::vector<Delivery> deliveries;
  std::string tag;
  bool consuming = false;
  ConsumeOptions consume_options;
  REQUIRE_FALSE(channel->consume(
      queue, consume_options,
      [&](Delivery&& delivery) {
        CHECK_FALSE(channel->ack(delivery.delivery_tag));
        deliveries.push_back(std::move(delivery));
      },
      [&](const Error& error, const std::string& consumer_tag) {
        REQUIRE_FALSE(error);
        tag = consumer_tag;
        consuming = true;
      }));
  REQUIRE(loop.run_until([&] { return deliveries.size() == 5; }));
  CHECK(consuming);
  CHECK(deliveries[0].message.body == "hello 0");
  CHECK(deliveries[4].message.body == "hello 4");
  CHECK(deliveries[0].exchange == exchange);
  CHECK(deliveries[0].routing_key == "key");
  CHECK(deliveries[0].message.properties == properties);

  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) { return channel->cancel(tag, cb); }));
  uint32_t purged = 99;
  bool deleted = false;
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, [&](const Error& e, uint32_t count) {
    CHECK_FALSE(e);
    purged = count;
    deleted = true;
  }));
  REQUIRE(loop.run_until([&] { return deleted; }));
  CHECK(purged == 0);
  REQUIRE_FALSE(test::wait(
      loop, [&](CompletionCallback cb) { return channel->exchange_delete(exchange, false, cb); }));
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) { return channel->close(cb); }));
  CHECK_FALSE(channel->is_open());
  CHECK(channel->ack(1).code == make_error_code(ClientError::closed_by_client));
  test::close(loop, connection);
  CHECK_FALSE(connection->is_open());
  CHECK(loop.drain());
}

TEST_CASE("Wrong credentials give authentication_failed with the broker's reason",
          "[client][integration]") {
  TestLoop loop;
  ConnectionOptions options;
  options.uri = parse_uri(test::broker_url());
  options.uri.password = "wrong-password";
  std::shared_ptr<Connection> connection;
  Error error = test::try_connect(loop, options, connection);
  CHECK(error.code == make_error_code(ClientError::authentication_failed));
  CHECK(error.reply_code == 403);
  CHECK(error.message().find("ACCESS_REFUSED") != std::string::npos);
  CHECK(error.message().find("wrong-password") == std::string::npos);
  CHECK(loop.drain());
}

TEST_CASE("An unknown vhost gives vhost_refused", "[client][integration]") {
  TestLoop loop;
  ConnectionOptions options;
  options.uri = parse_uri(test::broker_url());
  options.uri.vhost = "no-such-vhost";
  std::shared_ptr<Connection> connection;
  Error error = test::try_connect(loop, options, connection);
  CHECK(error.code == make_error_code(ClientError::vhost_refused));
  CHECK(error.reply_code == 530);
  CHECK(loop.drain());
}

TEST_CASE("A refused port gives connect_failed", "[client][integration]") {
  TestLoop loop;
  ConnectionOptions options;
  options.uri = parse_uri("amqp://guest:guest@127.0.0.1:1/");
  std::shared_ptr<Connection> connection;
  Error error = test::try_connect(loop, options, connection);
  CHECK(error.code == make_error_code(ClientError::connect_failed));
  CHECK(loop.drain());
}

TEST_CASE("Redeclaring a queue with other arguments reports 406 and the connection stays usable",
          "[client][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("q406");
  QueueOptions options;
  options.arguments.set("x-message-ttl", int32_t{1000});
  test::declare_queue(loop, *channel, queue, options);

  Error channel_closed;
  channel->set_close_handler([&](const Error& error) { channel_closed = error; });
  // A second operation queued behind the failing one must fail with the same error.
  QueueOptions other;
  other.arguments.set("x-message-ttl", int32_t{2000});
  Error first, second;
  int callbacks = 0;
  REQUIRE_FALSE(channel->queue_declare(queue, other, [&](const Error& e, const QueueInfo&) {
    first = e;
    ++callbacks;
  }));
  REQUIRE_FALSE(channel->qos(5, [&](const Error& e) {
    second = e;
    ++callbacks;
  }));
  REQUIRE(loop.run_until([&] { return callbacks == 2; }));
  CHECK(first.code == make_error_code(ClientError::channel_closed));
  CHECK(first.reply_code == 406);
  CHECK(first.message().find("x-message-ttl") != std::string::npos);
  CHECK(first.message().find("queue.declare") != std::string::npos);
  CHECK(second.reply_code == 406);
  CHECK(channel_closed.reply_code == 406);
  CHECK_FALSE(channel->is_open());
  // A call on the closed channel fails at once and never calls back.
  bool called = false;
  Error immediate = channel->qos(1, [&](const Error&) { called = true; });
  CHECK(immediate.reply_code == 406);

  CHECK(connection->is_open());
  auto again = test::open_channel(loop, *connection);
  test::declare_queue(loop, *again, queue, options);
  REQUIRE_FALSE(again->queue_delete(queue, false, false, {}));
  test::close(loop, connection);
  CHECK_FALSE(called);
  CHECK(loop.drain());
}

TEST_CASE("A missing queue reports 404 for passive declare, consume and get",
          "[client][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  std::string queue = test::unique_name("missing");

  auto channel = test::open_channel(loop, *connection);
  QueueOptions passive;
  passive.passive = true;
  Error declare_error;
  bool done = false;
  REQUIRE_FALSE(channel->queue_declare(queue, passive, [&](const Error& e, const QueueInfo&) {
    declare_error = e;
    done = true;
  }));
  REQUIRE(loop.run_until([&] { return done; }));
  CHECK(declare_error.reply_code == 404);
  CHECK(declare_error.message().find(queue) != std::string::npos);

  channel = test::open_channel(loop, *connection);
  Error consume_error;
  done = false;
  REQUIRE_FALSE(channel->consume(
      queue, {}, [](Delivery&&) {},
      [&](const Error& e, const std::string&) {
        consume_error = e;
        done = true;
      }));
  REQUIRE(loop.run_until([&] { return done; }));
  CHECK(consume_error.reply_code == 404);

  channel = test::open_channel(loop, *connection);
  Error get_error;
  done = false;
  REQUIRE_FALSE(channel->get(queue, true, [&](const Error& e, std::optional<GetResult>&&) {
    get_error = e;
    done = true;
  }));
  REQUIRE(loop.run_until([&] { return done; }));
  CHECK(get_error.reply_code == 404);
  test::close(loop, connection);
  CHECK(loop.drain());
}

TEST_CASE("Deleting a queue cancels its consumer and the application is told",
          "[client][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("cancel");
  test::declare_queue(loop, *channel, queue);
  std::string cancelled;
  ConsumeOptions options;
  options.on_cancel = [&](const std::string& tag) { cancelled = tag; };
  std::string tag;
  REQUIRE_FALSE(channel->consume(
      queue, options, [](Delivery&&) {},
      [&](const Error& e, const std::string& t) {
        REQUIRE_FALSE(e);
        tag = t;
      }));
  REQUIRE(loop.run_until([&] { return !tag.empty(); }));

  auto other = test::open_channel(loop, *connection);
  REQUIRE_FALSE(other->queue_delete(queue, false, false, {}));
  REQUIRE(loop.run_until([&] { return !cancelled.empty(); }));
  CHECK(cancelled == tag);
  CHECK(channel->is_open());
  test::close(loop, connection);
  CHECK(loop.drain());
}

TEST_CASE("A mandatory unroutable publish is reported as returned, never as acked",
          "[client][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("routed");
  test::declare_queue(loop, *channel, queue);
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));
  int returns_seen = 0;
  channel->set_return_handler([&](const ReturnedMessage& returned) {
    ++returns_seen;
    CHECK(returned.reply_code == 312);
    CHECK(returned.routing_key == "nowhere");
  });

  // Pipelined: routed, unroutable, routed, unroutable without mandatory, unroutable again.
  std::map<uint64_t, PublishOutcome> outcomes;
  auto record = [&](const PublishOutcome& outcome) { outcomes[outcome.sequence] = outcome; };
  REQUIRE_FALSE(channel->publish("", queue, persistent(), "a", Mandatory::yes, record));
  REQUIRE_FALSE(channel->publish("", "nowhere", persistent(), "b", Mandatory::yes, record));
  REQUIRE_FALSE(channel->publish("", queue, persistent(), "c", Mandatory::yes, record));
  REQUIRE_FALSE(channel->publish("", "nowhere", persistent(), "d", Mandatory::no, record));
  REQUIRE_FALSE(channel->publish("", "nowhere", persistent(), "b", Mandatory::yes, record));
  REQUIRE(loop.run_until([&] { return outcomes.size() == 5; }));
  CHECK(outcomes[1].status == PublishStatus::acked);
  CHECK(outcomes[2].status == PublishStatus::returned);
  CHECK(outcomes[2].error.reply_code == 312);
  CHECK(outcomes[2].error.code == make_error_code(ClientError::unroutable));
  CHECK(outcomes[3].status == PublishStatus::acked);
  CHECK(outcomes[4].status == PublishStatus::acked);  // not mandatory: the broker drops it
  CHECK(outcomes[5].status == PublishStatus::returned);
  CHECK(returns_seen == 2);
  CHECK(test::queue_depth(loop, *connection, queue) == 2);
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, {}));
  test::close(loop, connection);
  CHECK(loop.drain());
}

TEST_CASE("Ten thousand pipelined confirmed publishes are all acked, in any grouping",
          "[client][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("confirms");
  test::declare_queue(loop, *channel, queue);
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));
  constexpr int kCount = 10000;
  std::vector<int> acked(kCount + 1, 0);
  int settled = 0, failed = 0;
  std::string body(1024, 'x');
  for (int i = 0; i < kCount; ++i) {
    REQUIRE_FALSE(channel->publish("", queue, persistent(), body, Mandatory::yes,
                                   [&](const PublishOutcome& outcome) {
                                     ++settled;
                                     if (outcome.ok()) {
                                       ++acked[outcome.sequence];
                                     } else {
                                       ++failed;
                                     }
                                   }));
  }
  CHECK(channel->unconfirmed_count() == kCount);
  REQUIRE(loop.run_until([&] { return settled == kCount; }, std::chrono::seconds(60)));
  CHECK(failed == 0);
  CHECK(std::count(acked.begin() + 1, acked.end(), 1) == kCount);
  CHECK(channel->unconfirmed_count() == 0);
  CHECK(test::queue_depth(loop, *connection, queue) == kCount);
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, {}));
  test::close(loop, connection);
  CHECK(loop.drain());
}

TEST_CASE("A frame_max below the broker's minimum is raised to it and the log says so",
          "[client][integration]") {
  TestLoop loop;
  std::ostringstream log_text;
  ConnectionOptions options;
  options.uri = parse_uri(test::broker_url() + "?frame_max=4096");
  options.logger = std::make_shared<spdlog::logger>(
      "frames", std::make_shared<spdlog::sinks::ostream_sink_st>(log_text));
  auto connection = test::connect(loop, options);
  const auto version = connection->broker_version();
  REQUIRE(version);
  INFO("RabbitMQ " << version->text() << "; log: " << log_text.str());
  // RabbitMQ 4.1 and later close a connection whose tune-ok asks for less than 8192.
  const uint32_t expected = version->at_least(4, 1) ? 8192 : 4096;
  CHECK(client::broker_min_frame_max(connection->server_properties()) == expected);
  CHECK(connection->tuning().frame_max == expected);
  CHECK((log_text.str().find("frame_max 4096 raised to 8192") != std::string::npos) ==
        (expected == 8192));
  if (test::broker_version() == "4.3") CHECK(expected == 8192);
  // The connection works: the broker took the raised value.
  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("raised");
  test::declare_queue(loop, *channel, queue);
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, {}));
  test::close(loop, connection);
  CHECK(loop.drain());
}

TEST_CASE("A 10 MB message crosses a connection with frame_max 8192 intact",
          "[client][integration]") {
  TestLoop loop;
  ConnectionOptions options;
  options.uri = parse_uri(test::broker_url());
  options.frame_max = 8192;  // the smallest that every RabbitMQ lane accepts
  auto connection = test::connect(loop, options);
  CHECK(connection->tuning().frame_max == 8192);
  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("big");
  test::declare_queue(loop, *channel, queue);
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));
  std::string body(10 * 1024 * 1024, '\0');
  for (size_t i = 0; i < body.size(); ++i)
    body[i] = static_cast<char>((i * 2654435761u) >> 13);
  auto outcome = publish_and_wait(loop, *channel, "", queue, body, Mandatory::yes);
  REQUIRE(outcome.ok());
  auto got = get_one(loop, *channel, queue);
  REQUIRE(got);
  CHECK(got->message.body.size() == body.size());
  CHECK(got->message.body == body);
  CHECK(got->message_count == 0);
  CHECK_FALSE(get_one(loop, *channel, queue));  // basic.get-empty

  // Properties cannot be split across frames: headers that need a larger frame fail at once,
  // and the connection, which the broker would have closed, stays usable.
  amqp::BasicProperties big = persistent();
  big.headers = amqp::FieldTable{};
  big.headers->append("padding", std::string(9000, 'p'));
  Error error =
      channel->publish("", queue, big, "body", Mandatory::no, [](const PublishOutcome&) {});
  CHECK(error.code == make_error_code(ClientError::properties_too_large));
  CHECK(error.message().find("over the frame_max of 8192") != std::string::npos);
  REQUIRE(publish_and_wait(loop, *channel, "", queue, "after").ok());
  CHECK(get_one(loop, *channel, queue)->message.body == "after");
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, {}));
  test::close(loop, connection);
  CHECK(loop.drain());
}

TEST_CASE("Ack, nack and reject settle single and multiple deliveries", "[client][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("settle");
  test::declare_queue(loop, *channel, queue);
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));
  publish_numbered(loop, *channel, queue, 6);
  std::vector<Delivery> deliveries;
  auto consumer = test::open_channel(loop, *connection);
  REQUIRE_FALSE(
      consumer->consume(queue, {}, [&](Delivery&& d) { deliveries.push_back(std::move(d)); }, {}));
  REQUIRE(loop.run_until([&] { return deliveries.size() == 6; }));
  CHECK_FALSE(consumer->ack(deliveries[1].delivery_tag, true));           // 0 and 1
  CHECK_FALSE(consumer->reject(deliveries[2].delivery_tag, false));       // 2 dropped
  CHECK_FALSE(consumer->nack(deliveries[4].delivery_tag, true, true));    // 3, 4 back
  CHECK_FALSE(consumer->nack(deliveries[5].delivery_tag, false, false));  // 5 dropped
  REQUIRE(loop.run_until([&] { return deliveries.size() == 8; }));
  CHECK(deliveries[6].redelivered);
  CHECK(deliveries[6].message.body == "3");
  CHECK(deliveries[7].message.body == "4");
  CHECK_FALSE(consumer->ack(deliveries[7].delivery_tag, true));
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) { return consumer->close(cb); }));
  CHECK(test::queue_depth(loop, *connection, queue) == 0);

  // purge reports the count; unbind and exchange bindings work.
  for (int i = 0; i < 3; ++i)
    REQUIRE(publish_and_wait(loop, *channel, "", queue, "p").ok());
  uint32_t purged = 0;
  bool done = false;
  REQUIRE_FALSE(channel->queue_purge(queue, [&](const Error& e, uint32_t n) {
    CHECK_FALSE(e);
    purged = n;
    done = true;
  }));
  REQUIRE(loop.run_until([&] { return done; }));
  CHECK(purged == 3);
  std::string source = test::unique_name("src"), destination = test::unique_name("dst");
  ExchangeOptions temporary;
  temporary.durable = false;
  for (auto& name : {source, destination}) {
    REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) {
      return channel->exchange_declare(name, "fanout", temporary, cb);
    }));
  }
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) {
    return channel->exchange_bind(destination, source, "", {}, cb);
  }));
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) {
    return channel->queue_bind(queue, destination, "", {}, cb);
  }));
  REQUIRE(publish_and_wait(loop, *channel, source, "any", "via-e2e", Mandatory::yes).ok());
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) {
    return channel->exchange_unbind(destination, source, "", {}, cb);
  }));
  CHECK(publish_and_wait(loop, *channel, source, "any", "lost", Mandatory::yes).status ==
        PublishStatus::returned);
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) {
    return channel->queue_unbind(queue, destination, "", {}, cb);
  }));
  CHECK(publish_and_wait(loop, *channel, destination, "any", "lost", Mandatory::yes).status ==
        PublishStatus::returned);
  CHECK(test::queue_depth(loop, *connection, queue) == 1);
  for (auto& name : {source, destination}) {
    REQUIRE_FALSE(test::wait(
        loop, [&](CompletionCallback cb) { return channel->exchange_delete(name, false, cb); }));
  }
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, {}));
  test::close(loop, connection);
  CHECK(loop.drain());
}

TEST_CASE("Acks made together go out as one multiple ack that never covers an unsettled tag",
          "[client][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("coalesce");
  test::declare_queue(loop, *channel, queue);
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));
  constexpr int count = 40;
  publish_numbered(loop, *channel, queue, count);
  constexpr size_t ack_frame = 21;

  // The first message stays with the handler: the acks of all the others must not cover it.
  std::vector<Delivery> deliveries;
  auto consumer = test::open_channel(loop, *connection);
  REQUIRE_FALSE(
      consumer->consume(queue, {}, [&](Delivery&& d) { deliveries.push_back(std::move(d)); }, {}));
  REQUIRE(loop.run_until([&] { return deliveries.size() == count; }));
  for (size_t i = 1; i < deliveries.size(); ++i)
    CHECK_FALSE(consumer->ack(deliveries[i].delivery_tag));
  CHECK(connection->buffered_bytes() >= (count - 2) * ack_frame);
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) { return consumer->close(cb); }));
  std::vector<GetResult> left = test::drain_queue(loop, *connection, queue);
  REQUIRE(left.size() == 1);
  CHECK(left[0].message.body == "0");

  // In order, the acks are held as one; a reject, a nack and an ack out of order in between
  // go out on their own and are never covered twice.
  publish_numbered(loop, *channel, queue, count);
  deliveries.clear();
  consumer = test::open_channel(loop, *connection);
  REQUIRE_FALSE(
      consumer->consume(queue, {}, [&](Delivery&& d) { deliveries.push_back(std::move(d)); }, {}));
  REQUIRE(loop.run_until([&] { return deliveries.size() == count; }));
  for (int i = 0; i < 20; ++i)
    CHECK_FALSE(consumer->ack(deliveries[i].delivery_tag));
  CHECK(connection->buffered_bytes() <= 2 * ack_frame);
  CHECK_FALSE(consumer->reject(deliveries[20].delivery_tag, false));
  CHECK_FALSE(consumer->ack(deliveries[22].delivery_tag));
  CHECK_FALSE(consumer->ack(deliveries[21].delivery_tag));
  CHECK_FALSE(consumer->nack(deliveries[23].delivery_tag, false, true));  // back to the queue
  for (int i = 24; i < count; ++i)
    CHECK_FALSE(consumer->ack(deliveries[i].delivery_tag));
  REQUIRE(loop.run_until([&] { return deliveries.size() == count + 1; }));
  CHECK(deliveries[count].redelivered);
  CHECK(deliveries[count].message.body == "23");
  CHECK_FALSE(consumer->ack(deliveries[count].delivery_tag));
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) { return consumer->close(cb); }));
  CHECK(test::queue_depth(loop, *connection, queue) == 0);
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, {}));
  test::close(loop, connection);
  CHECK(loop.drain());
}

TEST_CASE(
    "Held acks go out after the ack delay, at a quarter of the prefetch, and before a "
    "multiple nack or a close",
    "[client][integration]") {
  TestLoop loop;
  auto direct = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *direct);
  std::string queue = test::unique_name("held-acks");
  test::declare_queue(loop, *channel, queue);
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));
  auto depth_becomes = [&](uint32_t depth) {  // the broker requeues once it sees the cut
    return test::eventually(loop, [&] { return test::queue_depth(loop, *direct, queue) == depth; });
  };
  test::TcpProxy proxy(loop.get(), test::broker_port());
  ConnectionOptions options;
  options.uri = parse_uri(test::broker_url());
  options.uri.host = "127.0.0.1";
  options.uri.port = proxy.port();

  // Within the delay the ack is held: a connection cut now loses it, and the broker requeues.
  // After the delay it has gone out, and the cut loses nothing.
  options.ack_delay = std::chrono::milliseconds(300);
  publish_numbered(loop, *channel, queue, 2);
  for (bool wait_out_the_delay : {false, true}) {
    INFO("waited out the delay: " << wait_out_the_delay);
    auto connection = test::connect(loop, options);
    auto consumer = test::open_channel(loop, *connection);
    std::vector<Delivery> deliveries;
    REQUIRE_FALSE(consumer->consume(queue, {},
                                    [&](Delivery&& d) { deliveries.push_back(std::move(d)); }, {}));
    REQUIRE(loop.run_until([&] { return deliveries.size() == 2; }));
    CHECK_FALSE(consumer->ack(deliveries[0].delivery_tag));
    CHECK(connection->buffered_bytes() == 0);
    // Without the wait, the loop does not run between the ack and the cut: the delay cannot end
    // in between, however slow the machine.
    if (wait_out_the_delay) {
      // Run past the delay (its timer fires before the one that ends the run), then make a round
      // trip on the same channel: the broker handles a channel's frames in order, so once the
      // declare-ok is back it has had the ack.
      loop.run_for(std::chrono::milliseconds(600));
      client::QueueOptions passive;
      passive.passive = true;
      bool declared = false;
      REQUIRE_FALSE(consumer->queue_declare(
          queue, passive, [&](const Error&, const client::QueueInfo&) { declared = true; }));
      REQUIRE(loop.run_until([&] { return declared; }));
    }
    bool lost = false;
    connection->set_lost_handler([&](const Error&) { lost = true; });
    proxy.cut();
    REQUIRE(loop.run_until([&] { return lost; }));
    CHECK(depth_becomes(wait_out_the_delay ? 1 : 2));
  }
  REQUIRE(test::drain_queue(loop, *direct, queue).size() == 1);

  // With a delay of a minute, prefetch 8 would stall after 8 deliveries if acks waited for it:
  // every 2 acks (a quarter) go out at once, so all 40 arrive well within the test's limit.
  options.ack_delay = std::chrono::minutes(1);
  publish_numbered(loop, *channel, queue, 40);
  auto connection = test::connect(loop, options);
  auto consumer = test::open_channel(loop, *connection);
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) { return consumer->qos(8, cb); }));
  int delivered = 0;
  REQUIRE_FALSE(consumer->consume(queue, {},
                                  [&](Delivery&& d) {
                                    ++delivered;
                                    CHECK_FALSE(consumer->ack(d.delivery_tag));
                                  },
                                  {}));
  REQUIRE(loop.run_until([&] { return delivered == 40; }, std::chrono::seconds(10)));
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) { return consumer->close(cb); }));
  CHECK(test::queue_depth(loop, *direct, queue) == 0);

  // A multiple nack first sends the held acks, so it requeues only what was not acked (had it
  // gone first, it would requeue all ten, and the ack after it would be refused with 406).
  publish_numbered(loop, *channel, queue, 10);
  std::vector<Delivery> deliveries;
  auto settler = test::open_channel(loop, *connection);
  REQUIRE_FALSE(
      settler->consume(queue, {}, [&](Delivery&& d) { deliveries.push_back(std::move(d)); }, {}));
  REQUIRE(loop.run_until([&] { return deliveries.size() == 10; }));
  for (int i = 0; i < 5; ++i)
    CHECK_FALSE(settler->ack(deliveries[i].delivery_tag));
  CHECK_FALSE(settler->nack(deliveries[9].delivery_tag, true, true));
  REQUIRE(loop.run_until([&] { return deliveries.size() == 15; }));
  for (size_t i = 10; i < 15; ++i) {
    CHECK(deliveries[i].redelivered);
    CHECK(deliveries[i].message.body == std::to_string(i - 5));
  }
  // Had the nack requeued all ten, the other five would have been requeued with these, ahead of
  // a marker published now: it comes next.
  REQUIRE(publish_and_wait(loop, *channel, "", queue, "marker").ok());
  REQUIRE(loop.run_until([&] { return deliveries.size() >= 16; }));
  CHECK(deliveries.size() == 16);
  CHECK(deliveries.back().message.body == "marker");

  // channel.close and connection.close send the held acks first: nothing comes back.
  for (size_t i = 10; i < deliveries.size(); ++i)
    CHECK_FALSE(settler->ack(deliveries[i].delivery_tag));
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) { return settler->close(cb); }));
  CHECK(test::queue_depth(loop, *direct, queue) == 0);
  publish_numbered(loop, *channel, queue, 3);
  deliveries.clear();
  settler = test::open_channel(loop, *connection);
  REQUIRE_FALSE(
      settler->consume(queue, {}, [&](Delivery&& d) { deliveries.push_back(std::move(d)); }, {}));
  REQUIRE(loop.run_until([&] { return deliveries.size() == 3; }));
  for (auto& d : deliveries)
    CHECK_FALSE(settler->ack(d.delivery_tag));
  test::close(loop, connection);
  CHECK(depth_becomes(0));

  REQUIRE_FALSE(channel->queue_delete(queue, false, false, {}));
  test::close(loop, direct);
  proxy.close();
  CHECK(loop.drain());
}

TEST_CASE("A peer that stops answering is declared dead after two heartbeat intervals",
          "[client][integration]") {
  TestLoop loop;
  test::TcpProxy proxy(loop.get(), test::broker_port());
  ConnectionOptions options;
  options.uri = parse_uri(test::broker_url());
  options.uri.host = "127.0.0.1";
  options.uri.port = proxy.port();
  // 3 s, not RabbitMQ's lowest 1 s: a broker on a loaded machine (the test lanes run side by
  // side) once sent none for over 2 s, and the healthy connection below was declared dead.
  options.heartbeat_seconds = 3;
  auto connection = test::connect(loop, options);
  CHECK(connection->tuning().heartbeat_seconds == 3);
  Error lost;
  bool is_lost = false;
  connection->set_lost_handler([&](const Error& error) {
    lost = error;
    is_lost = true;
  });
  auto channel = test::open_channel(loop, *connection);
  bool pending_failed = false;
  // Idle and healthy while the broker sends three heartbeats (8 bytes each; nothing else comes
  // on an idle connection), more than two intervals: they keep it alive.
  const uint64_t before_idle = proxy.from_upstream();
  REQUIRE(loop.run_until([&] { return is_lost || proxy.from_upstream() >= before_idle + 3 * 8; },
                         std::chrono::seconds(60)));
  INFO("lost while idle: " << lost.message());
  REQUIRE(connection->is_open());

  proxy.freeze();
  auto frozen_at = uv_now(loop.get());
  REQUIRE_FALSE(channel->qos(1, [&](const Error& e) { pending_failed = static_cast<bool>(e); }));
  REQUIRE(loop.run_until([&] { return is_lost; }, std::chrono::seconds(30)));
  auto detected_after = uv_now(loop.get()) - frozen_at;
  INFO("declared dead after " << detected_after << " ms");
  CHECK(lost.code == make_error_code(ClientError::heartbeat_timeout));
  CHECK(detected_after >= 3000);  // not before a whole interval of silence
  // Two intervals (checked every half interval) are 6 to 7.5 s; the rest is room for a loaded
  // machine. Without heartbeats only TCP would notice, many minutes later.
  CHECK(detected_after <= 20000);
  CHECK(pending_failed);
  CHECK_FALSE(channel->is_open());
  proxy.close();
  CHECK(loop.drain());
}

TEST_CASE("The broker's connection.close reaches the application with its reply code",
          "[client][integration][broker-wide]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  Error lost;
  bool is_lost = false;
  connection->set_lost_handler([&](const Error& error) {
    lost = error;
    is_lost = true;
  });
  Error channel_reason;
  channel->set_close_handler([&](const Error& e) { channel_reason = e; });
  REQUIRE(test::broker_ctl("close_all_connections 'test says goodbye'") == 0);
  REQUIRE(loop.run_until([&] { return is_lost; }));
  CHECK(lost.code == make_error_code(ClientError::connection_closed));
  CHECK(lost.reply_code == 320);
  CHECK(lost.message().find("test says goodbye") != std::string::npos);
  CHECK(channel_reason.reply_code == 320);
  CHECK(loop.drain());
}

TEST_CASE("A memory alarm blocks publishing and the application is told, then unblocked",
          "[client][integration][broker-wide]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("blocked");
  test::declare_queue(loop, *channel, queue);
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));
  std::vector<std::pair<bool, std::string>> events;
  connection->set_blocked_handler(
      [&](bool blocked, const std::string& reason) { events.emplace_back(blocked, reason); });

  REQUIRE(test::broker_ctl("set_vm_memory_high_watermark 0") == 0);
  struct Restore {
    ~Restore() { test::broker_ctl("set_vm_memory_high_watermark 0.4"); }
  } restore;
  bool confirmed = false;
  REQUIRE_FALSE(channel->publish("", queue, persistent(), "while blocked", Mandatory::yes,
                                 [&](const PublishOutcome& o) { confirmed = o.ok(); }));
  REQUIRE(loop.run_until([&] { return !events.empty(); }, std::chrono::seconds(20)));
  CHECK(events[0].first);
  CHECK(events[0].second.find("memory") != std::string::npos);
  CHECK(connection->is_blocked());
  loop.run_for(std::chrono::milliseconds(500));
  CHECK_FALSE(confirmed);

  REQUIRE(test::broker_ctl("set_vm_memory_high_watermark 0.4") == 0);
  REQUIRE(
      loop.run_until([&] { return events.size() >= 2 && confirmed; }, std::chrono::seconds(20)));
  CHECK_FALSE(events[1].first);
  CHECK_FALSE(connection->is_blocked());
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, {}));
  test::close(loop, connection);
  CHECK(loop.drain());
}

namespace {

/// Properties with one header "h" padded so that their content header frame is `frame_size`
/// bytes, overhead included.
amqp::BasicProperties properties_for_frame(size_t frame_size) {
  amqp::BasicProperties properties = persistent();
  properties.headers = amqp::FieldTable{};
  properties.headers->append("h", std::string());
  std::string probe;
  REQUIRE_FALSE(amqp::append_header_frame(probe, 1, 4, properties));
  properties.headers = amqp::FieldTable{};
  properties.headers->append("h", std::string(frame_size - probe.size(), 'x'));
  probe.clear();
  REQUIRE_FALSE(amqp::append_header_frame(probe, 1, 4, properties));
  REQUIRE(probe.size() == frame_size);
  return properties;
}

}  // namespace

TEST_CASE("Deliveries whose header frame RabbitMQ makes larger than frame_max are received",
          "[client][integration]") {
  TestLoop loop;
  auto publisher = test::connect(loop, test::broker_url());
  REQUIRE(publisher->tuning().frame_max == 131072);
  auto channel = test::open_channel(loop, *publisher);
  const std::string classic = test::unique_name("frame-classic");
  const std::string quorum = test::unique_name("frame-quorum");
  test::declare_queue(loop, *channel, classic);
  QueueOptions quorum_options;
  quorum_options.arguments.append("x-queue-type", std::string("quorum"));
  test::declare_queue(loop, *channel, quorum, quorum_options);
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));
  // A header frame of exactly frame_max: the largest this client publishes.
  const amqp::BasicProperties at_limit = properties_for_frame(131072);
  REQUIRE(publish_and_wait(loop, *channel, "", classic, "body", Mandatory::yes, at_limit).ok());
  REQUIRE(publish_and_wait(loop, *channel, "", quorum, "body", Mandatory::yes, at_limit).ok());

  SECTION("a consumer that agreed on a smaller frame_max gets another client's frame") {
    ConnectionOptions options;
    options.uri = parse_uri(test::broker_url() + "?frame_max=8192");
    auto small = test::connect(loop, options);
    REQUIRE(small->tuning().frame_max == 8192);
    auto small_channel = test::open_channel(loop, *small);
    auto got = get_one(loop, *small_channel, classic);
    REQUIRE(got);
    CHECK(got->message.body == "body");
    CHECK(got->message.properties.headers == at_limit.headers);
    CHECK(small->is_open());
    test::close(loop, small);
  }

  SECTION("a quorum queue's redelivery after a reject carries x-delivery-count past frame_max") {
    // A requeueing reject is a failed delivery on every version; RabbitMQ 4.3 counts only those
    // in x-delivery-count (a requeueing nack only in x-acquired-count).
    auto consumer = test::connect(loop, test::broker_url());
    auto consumer_channel = test::open_channel(loop, *consumer);
    auto first = get_one(loop, *consumer_channel, quorum, false);
    REQUIRE(first);
    REQUIRE_FALSE(consumer_channel->reject(first->delivery_tag, true));
    auto again = get_one(loop, *consumer_channel, quorum);
    REQUIRE(again);
    std::string frame;
    REQUIRE_FALSE(amqp::append_header_frame(frame, 1, 4, again->message.properties));
    CHECK(frame.size() > 131072);
    CHECK(again->message.properties.headers->find("x-delivery-count") != nullptr);
    CHECK(again->message.body == "body");
    CHECK(consumer->is_open());
    test::close(loop, consumer);
  }

  REQUIRE_FALSE(channel->queue_delete(classic, false, false, {}));
  REQUIRE_FALSE(channel->queue_delete(quorum, false, false, {}));
  test::close(loop, publisher);
  CHECK(loop.drain());
}

TEST_CASE("Same-body publishes in flight together each get their own return or ack",
          "[client][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  // A headers exchange routes on a header, so two messages can share exchange, routing key and
  // body while only one of them is routable.
  const std::string exchange = test::unique_name("match");
  const std::string queue = test::unique_name("match");
  ExchangeOptions exchange_options;
  exchange_options.durable = false;
  exchange_options.auto_delete = true;
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) {
    return channel->exchange_declare(exchange, "headers", exchange_options, cb);
  }));
  test::declare_queue(loop, *channel, queue);
  amqp::FieldTable binding;
  binding.append("x-match", std::string("all"));
  binding.append("route", std::string("yes"));
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) {
    return channel->queue_bind(queue, exchange, "", binding, cb);
  }));
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));

  amqp::BasicProperties routed = persistent();
  routed.headers = amqp::FieldTable{};
  routed.headers->append("route", std::string("yes"));
  amqp::BasicProperties unroutable = persistent();
  unroutable.headers = amqp::FieldTable{};
  unroutable.headers->append("route", std::string("no"));

  // Pairs of the same body, the routed copy first: a return matched by body alone would go to
  // the routed copy, still waiting for its ack, and report the unroutable one as acked.
  constexpr int kPairs = 50;
  std::map<uint64_t, PublishOutcome> outcomes;
  std::set<uint64_t> routed_sequences;
  auto record = [&](const PublishOutcome& outcome) { outcomes[outcome.sequence] = outcome; };
  for (int i = 0; i < kPairs; ++i) {
    const std::string body = "same body " + std::to_string(i);
    routed_sequences.insert(channel->next_publish_sequence());
    REQUIRE_FALSE(channel->publish(exchange, "", routed, body, Mandatory::yes, record));
    REQUIRE_FALSE(channel->publish(exchange, "", unroutable, body, Mandatory::yes, record));
  }
  REQUIRE(loop.run_until([&] { return outcomes.size() == 2 * kPairs; }));
  int acked = 0;
  int returned = 0;
  for (const auto& [sequence, outcome] : outcomes) {
    INFO("publish " << sequence);
    if (routed_sequences.count(sequence) != 0) {
      CHECK(outcome.status == PublishStatus::acked);
      acked += outcome.status == PublishStatus::acked;
    } else {
      CHECK(outcome.status == PublishStatus::returned);
      returned += outcome.status == PublishStatus::returned;
    }
  }
  CHECK(acked == kPairs);
  CHECK(returned == kPairs);
  CHECK(test::queue_depth(loop, *connection, queue) == uint32_t(kPairs));
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, {}));
  test::close(loop, connection);
  CHECK(loop.drain());
}
