// The client against a scripted peer that plays the broker's side frame by frame: negotiation and
// refusals, channels, confirms, returns, flow control, heartbeats, cancels, closes and frame
// limits. No broker, no sleeps: each test runs the loop until what it waits for has happened.

#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/amqp/error.hpp"
#include "retryloop/amqp/rabbit_extensions.hpp"
#include "retryloop/client/connection.hpp"
#include "support/harness.hpp"
#include "support/scripted_peer.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using client::ClientError;
using client::PublishStatus;
using test::ScriptedPeer;
using test::TestLoop;

namespace {

client::ConnectionOptions options_for(const ScriptedPeer& peer) {
  client::ConnectionOptions options;
  options.uri = client::parse_uri(peer.url());
  options.connect_timeout = 10s;
  return options;
}

/// Connects to the peer; fails the test unless the connection opens.
std::shared_ptr<client::Connection> open(TestLoop& loop, client::ConnectionOptions options) {
  return test::connect(loop, std::move(options));
}
std::shared_ptr<client::Connection> open(TestLoop& loop, const ScriptedPeer& peer) {
  return open(loop, options_for(peer));
}

/// The outcome of a connect that is expected to fail.
client::Error refused(TestLoop& loop, const ScriptedPeer& peer) {
  std::shared_ptr<client::Connection> connection;
  client::Error error = test::try_connect(loop, options_for(peer), connection);
  REQUIRE(error);
  return error;
}

std::shared_ptr<client::Channel> confirm_channel(TestLoop& loop, client::Connection& connection) {
  auto channel = test::open_channel(loop, connection);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  return channel;
}

/// Publishes and records each outcome in `outcomes`, in publish order.
void publish(client::Channel& channel, std::vector<std::optional<client::PublishOutcome>>& outcomes,
             const std::string& body = "x", client::Mandatory mandatory = client::Mandatory::no) {
  const size_t index = outcomes.size();
  outcomes.emplace_back();
  REQUIRE_FALSE(channel.publish(
      "ex", "key", {}, body, mandatory,
      [&outcomes, index](const client::PublishOutcome& outcome) { outcomes[index] = outcome; }));
}

bool all_settled(const std::vector<std::optional<client::PublishOutcome>>& outcomes) {
  for (const auto& outcome : outcomes)
    if (!outcome) return false;
  return true;
}

amqp::BasicDeliver basic_deliver(const std::string& tag, uint64_t delivery_tag) {
  amqp::BasicDeliver method;
  method.consumer_tag = tag;
  method.delivery_tag = delivery_tag;
  method.exchange = "ex";
  method.routing_key = "key";
  return method;
}

}  // namespace

// ---- negotiation ------------------------------------------------------------------------------

TEST_CASE("The handshake sends PLAIN credentials, echoes the tuning and opens the vhost",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  const auto start_ok = peer.last<amqp::ConnectionStartOk>();
  CHECK(start_ok.mechanism == "PLAIN");
  CHECK(start_ok.response == std::string("\0guest\0guest", 12));
  CHECK(start_ok.client_properties.find("capabilities") != nullptr);
  const auto tune_ok = peer.last<amqp::ConnectionTuneOk>();
  CHECK(tune_ok.frame_max == 131072);
  CHECK(tune_ok.channel_max == 2047);
  CHECK(peer.last<amqp::ConnectionOpen>().virtual_host == "/");
  CHECK(connection->is_open());
  test::close(loop, connection);
  CHECK(peer.count<amqp::ConnectionClose>() == 1);
}

TEST_CASE("The client takes the smaller frame_max and channel_max of the two sides",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options limits;
  limits.frame_max = 8192;
  limits.channel_max = 16;
  ScriptedPeer peer(loop.get(), limits);
  auto connection = open(loop, peer);
  CHECK(connection->tuning().frame_max == 8192);
  CHECK(connection->tuning().channel_max == 16);
  CHECK(peer.last<amqp::ConnectionTuneOk>().frame_max == 8192);
  CHECK(peer.last<amqp::ConnectionTuneOk>().channel_max == 16);
  test::close(loop, connection);
}

TEST_CASE("A heartbeat asked for by the client wins over the broker's proposal", "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options proposal;
  proposal.heartbeat = 60;
  ScriptedPeer peer(loop.get(), proposal);
  auto options = options_for(peer);
  options.heartbeat_seconds = 0;
  auto connection = open(loop, options);
  CHECK(connection->tuning().heartbeat_seconds == 0);
  CHECK(peer.last<amqp::ConnectionTuneOk>().heartbeat == 0);
  test::close(loop, connection);
}

TEST_CASE("A broker that refuses the login fails the connect with authentication_failed",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  peer.on<amqp::ConnectionStartOk>([&](const test::Received&) {
    amqp::ConnectionClose close;
    close.reply_code = 403;
    close.reply_text = "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN";
    close.failing_class_id = 10;
    close.failing_method_id = 11;
    peer.send(0, close);
  });
  const client::Error error = refused(loop, peer);
  CHECK(error.code == make_error_code(ClientError::authentication_failed));
  CHECK(error.reply_code == 403);
  CHECK_THAT(error.message(), Catch::Contains("ACCESS_REFUSED"));
}

TEST_CASE("A broker that refuses the vhost fails the connect with vhost_refused",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  peer.on<amqp::ConnectionOpen>([&](const test::Received&) {
    amqp::ConnectionClose close;
    close.reply_code = 530;
    close.reply_text = "NOT_ALLOWED - access to vhost '/' refused for user 'guest'";
    close.failing_class_id = 10;
    close.failing_method_id = 40;
    peer.send(0, close);
  });
  const client::Error error = refused(loop, peer);
  CHECK(error.code == make_error_code(ClientError::vhost_refused));
  CHECK(error.reply_code == 530);
}

TEST_CASE("A peer that answers the handshake with an unexpected method breaks the protocol",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  peer.on<amqp::ConnectionStartOk>(
      [&](const test::Received&) { peer.send(0, amqp::ConnectionOpenOk{}); });
  const client::Error error = refused(loop, peer);
  CHECK(error.code == make_error_code(ClientError::protocol_error));
}

TEST_CASE("A peer that goes silent during the handshake fails the connect at its timeout",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  peer.on<amqp::ConnectionStartOk>([](const test::Received&) {});  // never tunes
  auto options = options_for(peer);
  options.connect_timeout = 300ms;
  std::shared_ptr<client::Connection> connection;
  const client::Error error = test::try_connect(loop, options, connection);
  CHECK(error.code == make_error_code(ClientError::connect_timeout));
}

// ---- channels ---------------------------------------------------------------------------------

TEST_CASE("Channels take the lowest free number, and a closed one's number is used again",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  auto first = test::open_channel(loop, *connection);
  auto second = test::open_channel(loop, *connection);
  CHECK(first->id() == 1);
  CHECK(second->id() == 2);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return first->close(done); }));
  auto third = test::open_channel(loop, *connection);
  CHECK(third->id() == 1);
  CHECK(peer.count<amqp::ChannelOpen>() == 3);
  CHECK(peer.count<amqp::ChannelClose>() == 1);
  test::close(loop, connection);
}

TEST_CASE("channel_max bounds the channels: one more is refused at once", "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options limits;
  limits.channel_max = 2;
  ScriptedPeer peer(loop.get(), limits);
  auto connection = open(loop, peer);
  auto a = test::open_channel(loop, *connection);
  auto b = test::open_channel(loop, *connection);
  const client::Error error = connection->open_channel([](const client::Error&, auto) {});
  CHECK(error.code == make_error_code(ClientError::channel_limit));
  test::close(loop, connection);
}

TEST_CASE("A broker's channel.close fails the pending call with its reply and is answered",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  peer.on<amqp::QueueDeclare>([&](const test::Received& r) {
    amqp::ChannelClose close;
    close.reply_code = 404;
    close.reply_text = "NOT_FOUND - no queue 'missing' in vhost '/'";
    close.failing_class_id = 50;
    close.failing_method_id = 10;
    peer.send(r.channel, close);
  });
  auto connection = open(loop, peer);
  auto channel = test::open_channel(loop, *connection);
  std::optional<client::Error> declared;
  client::QueueOptions passive;
  passive.passive = true;
  REQUIRE_FALSE(channel->queue_declare(
      "missing", passive,
      [&](const client::Error& error, const client::QueueInfo&) { declared = error; }));
  REQUIRE(loop.run_until([&] { return declared.has_value(); }));
  CHECK(declared->reply_code == 404);
  CHECK(declared->code == make_error_code(ClientError::channel_closed));
  REQUIRE(loop.run_until([&] { return peer.count<amqp::ChannelCloseOk>() == 1; }));
  CHECK_FALSE(channel->is_open());
  CHECK(channel->close_reason().reply_code == 404);
  CHECK(connection->is_open());  // the other channels go on
  auto again = test::open_channel(loop, *connection);
  CHECK(again->id() == 1);
  test::close(loop, connection);
}

TEST_CASE("Synchronous calls on a channel go out one at a time, in call order", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  std::vector<test::Received> held;
  peer.on<amqp::QueueDeclare>([&](const test::Received& r) { held.push_back(r); });
  auto connection = open(loop, peer);
  auto channel = test::open_channel(loop, *connection);
  std::vector<std::string> answered;
  for (const char* name : {"q1", "q2", "q3"}) {
    REQUIRE_FALSE(channel->queue_declare(
        name, {}, [&answered](const client::Error& error, const client::QueueInfo& info) {
          CHECK_FALSE(error);
          answered.push_back(info.name);
        }));
  }
  REQUIRE(loop.run_until([&] { return held.size() == 1; }));
  CHECK(peer.count<amqp::QueueDeclare>() == 1);  // the second waits for the first's answer
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(loop.run_until([&] { return held.size() == i + 1; }));
    amqp::QueueDeclareOk ok;
    ok.queue = held[i].as<amqp::QueueDeclare>().queue;
    peer.send(channel->id(), ok);
  }
  REQUIRE(loop.run_until([&] { return answered.size() == 3; }));
  CHECK(answered == std::vector<std::string>{"q1", "q2", "q3"});
  test::close(loop, connection);
}

// ---- publishing and confirms ------------------------------------------------------------------

TEST_CASE("A multiple ack confirms every publish up to its tag, and only those", "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options manual;
  manual.auto_confirm = false;
  ScriptedPeer peer(loop.get(), manual);
  auto connection = open(loop, peer);
  auto channel = confirm_channel(loop, *connection);
  std::vector<std::optional<client::PublishOutcome>> outcomes;
  for (int i = 0; i < 5; ++i)
    publish(*channel, outcomes);
  REQUIRE(loop.run_until([&] { return peer.last_sequence(channel->id()) == 5; }));
  amqp::BasicAck ack;
  ack.delivery_tag = 3;
  ack.multiple = true;
  peer.send(channel->id(), ack);
  REQUIRE(loop.run_until([&] { return outcomes[2].has_value(); }));
  for (int i = 0; i < 3; ++i) {
    CHECK(outcomes[i]->status == PublishStatus::acked);
    CHECK(outcomes[i]->sequence == uint64_t(i + 1));
  }
  CHECK_FALSE(outcomes[3].has_value());
  CHECK(channel->unconfirmed_count() == 2);
  ack.delivery_tag = 5;
  peer.send(channel->id(), ack);
  REQUIRE(loop.run_until([&] { return all_settled(outcomes); }));
  CHECK(channel->unconfirmed_count() == 0);
  test::close(loop, connection);
}

TEST_CASE("A nack settles its publish as nacked and the others as the broker says",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options manual;
  manual.auto_confirm = false;
  ScriptedPeer peer(loop.get(), manual);
  auto connection = open(loop, peer);
  auto channel = confirm_channel(loop, *connection);
  std::vector<std::optional<client::PublishOutcome>> outcomes;
  for (int i = 0; i < 3; ++i)
    publish(*channel, outcomes);
  REQUIRE(loop.run_until([&] { return peer.last_sequence(channel->id()) == 3; }));
  amqp::BasicNack nack;
  nack.delivery_tag = 2;
  peer.send(channel->id(), nack);
  amqp::BasicAck ack;
  ack.delivery_tag = 1;
  peer.send(channel->id(), ack);
  ack.delivery_tag = 3;
  peer.send(channel->id(), ack);
  REQUIRE(loop.run_until([&] { return all_settled(outcomes); }));
  CHECK(outcomes[0]->status == PublishStatus::acked);
  CHECK(outcomes[1]->status == PublishStatus::nacked);
  CHECK(outcomes[2]->status == PublishStatus::acked);
  test::close(loop, connection);
}

TEST_CASE("A multiple nack settles every publish up to its tag as nacked", "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options manual;
  manual.auto_confirm = false;
  ScriptedPeer peer(loop.get(), manual);
  auto connection = open(loop, peer);
  auto channel = confirm_channel(loop, *connection);
  std::vector<std::optional<client::PublishOutcome>> outcomes;
  for (int i = 0; i < 4; ++i)
    publish(*channel, outcomes);
  REQUIRE(loop.run_until([&] { return peer.last_sequence(channel->id()) == 4; }));
  amqp::BasicNack nack;
  nack.delivery_tag = 3;
  nack.multiple = true;
  peer.send(channel->id(), nack);
  REQUIRE(loop.run_until([&] { return outcomes[2].has_value(); }));
  for (int i = 0; i < 3; ++i)
    CHECK(outcomes[i]->status == PublishStatus::nacked);
  CHECK_FALSE(outcomes[3].has_value());
  test::close(loop, connection);
}

TEST_CASE("A basic.return before the confirm makes a mandatory publish returned, not acked",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options manual;
  manual.auto_confirm = false;
  ScriptedPeer peer(loop.get(), manual);
  auto connection = open(loop, peer);
  auto channel = confirm_channel(loop, *connection);
  std::vector<std::optional<client::PublishOutcome>> outcomes;
  publish(*channel, outcomes, "routed", client::Mandatory::yes);
  publish(*channel, outcomes, "unroutable", client::Mandatory::yes);
  REQUIRE(loop.run_until([&] { return peer.last_sequence(channel->id()) == 2; }));
  amqp::BasicReturn back;
  back.reply_code = 312;
  back.reply_text = "NO_ROUTE";
  back.exchange = "ex";
  back.routing_key = "key";
  peer.send_content(channel->id(), back, peer.publishes(channel->id())[1].properties.value(),
                    "unroutable");
  amqp::BasicAck ack;
  ack.delivery_tag = 2;
  ack.multiple = true;
  peer.send(channel->id(), ack);
  REQUIRE(loop.run_until([&] { return all_settled(outcomes); }));
  CHECK(outcomes[0]->status == PublishStatus::acked);
  CHECK(outcomes[1]->status == PublishStatus::returned);
  CHECK(outcomes[1]->error.reply_code == 312);
  test::close(loop, connection);
}

TEST_CASE("Two publishes with the same bytes: the return takes the oldest unsettled one",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options manual;
  manual.auto_confirm = false;
  ScriptedPeer peer(loop.get(), manual);
  auto connection = open(loop, peer);
  auto channel = confirm_channel(loop, *connection);
  std::vector<std::optional<client::PublishOutcome>> outcomes;
  publish(*channel, outcomes, "same", client::Mandatory::yes);
  publish(*channel, outcomes, "same", client::Mandatory::yes);
  REQUIRE(loop.run_until([&] { return peer.last_sequence(channel->id()) == 2; }));
  amqp::BasicReturn back;
  back.reply_code = 312;
  back.reply_text = "NO_ROUTE";
  back.exchange = "ex";
  back.routing_key = "key";
  peer.send_content(channel->id(), back, peer.publishes(channel->id())[0].properties.value(),
                    "same");
  amqp::BasicAck ack;
  ack.delivery_tag = 2;
  ack.multiple = true;
  peer.send(channel->id(), ack);
  REQUIRE(loop.run_until([&] { return all_settled(outcomes); }));
  CHECK(outcomes[0]->status == PublishStatus::returned);
  CHECK(outcomes[1]->status == PublishStatus::acked);
  test::close(loop, connection);
}

TEST_CASE("Closing the connection with publishes unconfirmed fails each of them, once",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options manual;
  manual.auto_confirm = false;
  ScriptedPeer peer(loop.get(), manual);
  auto connection = open(loop, peer);
  auto channel = confirm_channel(loop, *connection);
  std::vector<std::optional<client::PublishOutcome>> outcomes;
  for (int i = 0; i < 3; ++i)
    publish(*channel, outcomes);
  REQUIRE(loop.run_until([&] { return peer.last_sequence(channel->id()) == 3; }));
  test::close(loop, connection);
  REQUIRE(all_settled(outcomes));
  for (const auto& outcome : outcomes)
    CHECK(outcome->status == PublishStatus::failed);
}

TEST_CASE("A lost socket fails the unconfirmed publishes and tells the lost handler",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options manual;
  manual.auto_confirm = false;
  ScriptedPeer peer(loop.get(), manual);
  auto connection = open(loop, peer);
  std::optional<client::Error> lost;
  connection->set_lost_handler([&](const client::Error& error) { lost = error; });
  auto channel = confirm_channel(loop, *connection);
  std::vector<std::optional<client::PublishOutcome>> outcomes;
  publish(*channel, outcomes);
  REQUIRE(loop.run_until([&] { return peer.last_sequence(channel->id()) == 1; }));
  peer.drop();
  REQUIRE(loop.run_until([&] { return lost.has_value() && all_settled(outcomes); }));
  CHECK(lost->code == make_error_code(ClientError::connection_lost));
  CHECK(outcomes[0]->status == PublishStatus::failed);
  CHECK_FALSE(connection->is_open());
}

TEST_CASE("A body larger than frame_max goes out in frames of at most frame_max",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options small;
  small.frame_max = 4096;
  ScriptedPeer peer(loop.get(), small);
  auto options = options_for(peer);
  auto connection = open(loop, options);
  REQUIRE(connection->tuning().frame_max == 4096);
  auto channel = confirm_channel(loop, *connection);
  std::string body(4096 * 3 + 17, 'b');
  for (size_t i = 0; i < body.size(); ++i)
    body[i] = char('a' + i % 26);
  std::vector<std::optional<client::PublishOutcome>> outcomes;
  publish(*channel, outcomes, body);
  REQUIRE(loop.run_until([&] { return all_settled(outcomes); }));
  CHECK(outcomes[0]->status == PublishStatus::acked);
  const auto published = peer.publishes(channel->id());
  REQUIRE(published.size() == 1);
  CHECK(published[0].body == body);  // the peer's parser refuses frames over its limit
  test::close(loop, connection);
}

TEST_CASE("Properties that need a header frame over frame_max are refused before sending",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options small;
  small.frame_max = 4096;
  ScriptedPeer peer(loop.get(), small);
  auto connection = open(loop, peer);
  auto channel = confirm_channel(loop, *connection);
  amqp::BasicProperties big;
  big.headers.emplace();
  big.headers->set("pad", std::string(5000, 'p'));
  const client::Error error =
      channel->publish("ex", "key", big, "x", client::Mandatory::no, [](const auto&) {});
  CHECK(error.code == make_error_code(ClientError::properties_too_large));
  CHECK(peer.publishes(channel->id()).empty());
  CHECK(channel->is_open());  // nothing was sent: the channel goes on
  test::close(loop, connection);
}

// ---- consuming --------------------------------------------------------------------------------

TEST_CASE("A delivery in several body frames reaches the consumer whole", "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options small;
  small.frame_max = 4096;
  ScriptedPeer peer(loop.get(), small);
  auto connection = open(loop, peer);
  auto channel = test::open_channel(loop, *connection);
  std::vector<client::Delivery> got;
  std::optional<std::string> tag;
  REQUIRE_FALSE(channel->consume(
      "q", {}, [&](client::Delivery&& delivery) { got.push_back(std::move(delivery)); },
      [&](const client::Error& error, const std::string& consumer_tag) {
        CHECK_FALSE(error);
        tag = consumer_tag;
      }));
  REQUIRE(loop.run_until([&] { return tag.has_value(); }));
  amqp::BasicProperties properties;
  properties.message_id = "m-1";
  properties.headers.emplace();
  properties.headers->set("k", "v");
  const std::string body(10000, 'z');
  peer.send_content(channel->id(), basic_deliver(*tag, 1), properties, body);
  REQUIRE(loop.run_until([&] { return got.size() == 1; }));
  CHECK(got[0].message.body == body);
  CHECK(got[0].message.properties.message_id == std::optional<std::string>("m-1"));
  CHECK(*got[0].message.properties.headers->find("k")->as_string() == "v");
  CHECK(got[0].consumer_tag == *tag);
  CHECK(got[0].delivery_tag == 1);
  test::close(loop, connection);
}

TEST_CASE("A broker's basic.cancel tells the consumer's cancel handler", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  auto channel = test::open_channel(loop, *connection);
  std::optional<std::string> tag;
  std::optional<std::string> cancelled;
  client::ConsumeOptions options;
  options.on_cancel = [&](const std::string& consumer_tag) { cancelled = consumer_tag; };
  REQUIRE_FALSE(channel->consume(
      "q", options, [](client::Delivery&&) {},
      [&](const client::Error&, const std::string& consumer_tag) { tag = consumer_tag; }));
  REQUIRE(loop.run_until([&] { return tag.has_value(); }));
  amqp::BasicCancel cancel;
  cancel.consumer_tag = *tag;
  cancel.no_wait = true;
  peer.send(channel->id(), cancel);
  REQUIRE(loop.run_until([&] { return cancelled.has_value(); }));
  CHECK(*cancelled == *tag);
  CHECK(channel->is_open());
  test::close(loop, connection);
}

TEST_CASE("Acks made while handling one read go out as one multiple ack", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto options = options_for(peer);
  options.ack_delay = 0ms;
  auto connection = open(loop, options);
  auto channel = test::open_channel(loop, *connection);
  std::optional<std::string> tag;
  size_t handled = 0;
  REQUIRE_FALSE(channel->consume(
      "q", {},
      [&](client::Delivery&& delivery) {
        ++handled;
        CHECK_FALSE(channel->ack(delivery.delivery_tag));
      },
      [&](const client::Error&, const std::string& consumer_tag) { tag = consumer_tag; }));
  REQUIRE(loop.run_until([&] { return tag.has_value(); }));
  std::string burst;
  for (uint64_t i = 1; i <= 5; ++i) {
    (void)amqp::append_method_frame(burst, channel->id(), basic_deliver(*tag, i));
    (void)amqp::append_header_frame(burst, channel->id(), 1, {});
    amqp::append_body_frames(burst, channel->id(), "x", 131072);
  }
  peer.send_raw(burst);
  REQUIRE(loop.run_until([&] { return handled == 5 && peer.count<amqp::BasicAck>() >= 1; }));
  REQUIRE(loop.run_until([&] {
    return peer.count<amqp::BasicAck>() > 0 && peer.last<amqp::BasicAck>().delivery_tag == 5;
  }));
  const auto ack = peer.last<amqp::BasicAck>();
  CHECK(ack.multiple);
  CHECK(peer.count<amqp::BasicAck>() == 1);
  test::close(loop, connection);
}

TEST_CASE("basic.get-empty answers a get with nothing", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  peer.on<amqp::BasicGet>(
      [&](const test::Received& r) { peer.send(r.channel, amqp::BasicGetEmpty{}); });
  auto connection = open(loop, peer);
  auto channel = test::open_channel(loop, *connection);
  bool answered = false;
  REQUIRE_FALSE(channel->get(
      "q", false, [&](const client::Error& error, std::optional<client::GetResult>&& got) {
        CHECK_FALSE(error);
        CHECK_FALSE(got.has_value());
        answered = true;
      }));
  REQUIRE(loop.run_until([&] { return answered; }));
  test::close(loop, connection);
}

TEST_CASE("A frame beyond the inbound limit ends the connection as a protocol error",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options small;
  small.frame_max = 4096;
  ScriptedPeer peer(loop.get(), small);
  auto connection = open(loop, peer);
  std::optional<client::Error> lost;
  connection->set_lost_handler([&](const client::Error& error) { lost = error; });
  auto channel = test::open_channel(loop, *connection);
  // A header frame of 2 MiB: more than frame_max plus the allowance for the broker's headers.
  amqp::BasicProperties huge;
  huge.headers.emplace();
  huge.headers->set("pad", std::string(2 * 1024 * 1024, 'h'));
  std::string frames;
  amqp::BasicGetOk ok;
  ok.delivery_tag = 1;
  (void)amqp::append_method_frame(frames, channel->id(), ok);
  (void)amqp::append_header_frame(frames, channel->id(), 0, huge);
  bool answered = false;
  REQUIRE_FALSE(channel->get("q", false, [&](const client::Error&, auto&&) { answered = true; }));
  peer.send_raw(frames);
  REQUIRE(loop.run_until([&] { return lost.has_value(); }));
  CHECK(lost->code == make_error_code(ClientError::protocol_error));
  REQUIRE(loop.run_until([&] { return answered; }));  // the pending get failed with it
}

// ---- flow control, heartbeats, closes ---------------------------------------------------------

TEST_CASE("connection.blocked and unblocked reach the blocked handler", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  std::vector<std::pair<bool, std::string>> seen;
  connection->set_blocked_handler(
      [&](bool blocked, const std::string& reason) { seen.emplace_back(blocked, reason); });
  amqp::ConnectionBlocked blocked;
  blocked.reason = "low on memory";
  peer.send(0, blocked);
  REQUIRE(loop.run_until([&] { return seen.size() == 1; }));
  CHECK(connection->is_blocked());
  peer.send(0, amqp::ConnectionUnblocked{});
  REQUIRE(loop.run_until([&] { return seen.size() == 2; }));
  CHECK(seen[0] == std::make_pair(true, std::string("low on memory")));
  CHECK(seen[1].first == false);
  CHECK_FALSE(connection->is_blocked());
  test::close(loop, connection);
}

TEST_CASE("With heartbeats agreed, the client sends them while it has nothing else to send",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options beating;
  beating.heartbeat = 1;
  ScriptedPeer peer(loop.get(), beating);
  auto connection = open(loop, peer);
  CHECK(connection->tuning().heartbeat_seconds == 1);
  // The peer answers each heartbeat with one, as a live broker would.
  REQUIRE(loop.run_until(
      [&] {
        if (peer.heartbeats() > 0) peer.send_heartbeat();
        return peer.heartbeats() >= 2;
      },
      10s));
  CHECK(connection->is_open());
  test::close(loop, connection);
}

TEST_CASE("A peer that sends nothing for two heartbeat intervals is declared dead",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options beating;
  beating.heartbeat = 1;
  ScriptedPeer peer(loop.get(), beating);
  auto connection = open(loop, peer);
  std::optional<client::Error> lost;
  connection->set_lost_handler([&](const client::Error& error) { lost = error; });
  REQUIRE(loop.run_until([&] { return lost.has_value(); }, 10s));
  CHECK(lost->code == make_error_code(ClientError::heartbeat_timeout));
  CHECK_FALSE(connection->is_open());
}

TEST_CASE("A broker's connection.close is answered and reported with its reply", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  std::optional<client::Error> lost;
  connection->set_lost_handler([&](const client::Error& error) { lost = error; });
  auto channel = test::open_channel(loop, *connection);
  amqp::ConnectionClose close;
  close.reply_code = 320;
  close.reply_text = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'";
  peer.send(0, close);
  REQUIRE(loop.run_until([&] { return lost.has_value(); }));
  CHECK(lost->reply_code == 320);
  CHECK(lost->code == make_error_code(ClientError::connection_closed));
  REQUIRE(loop.run_until([&] { return peer.count<amqp::ConnectionCloseOk>() == 1; }));
  CHECK_FALSE(channel->is_open());
  CHECK(channel->close_reason().reply_code == 320);
}

TEST_CASE("Frames for a channel the client never opened end the connection", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  std::optional<client::Error> lost;
  connection->set_lost_handler([&](const client::Error& error) { lost = error; });
  amqp::BasicAck ack;
  ack.delivery_tag = 1;
  peer.send(7, ack);
  REQUIRE(loop.run_until([&] { return lost.has_value(); }));
  CHECK_FALSE(connection->is_open());
  // It told the broker why, as the protocol asks: a connection.close with a 5xx reply code.
  REQUIRE(peer.count<amqp::ConnectionClose>() == 1);
  CHECK(peer.last<amqp::ConnectionClose>().reply_code >= 500);
}

// ---- more of the same conversations -----------------------------------------------------------

TEST_CASE("A broker's channel.close with publishes unconfirmed fails them with its reply",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer::Options manual;
  manual.auto_confirm = false;
  ScriptedPeer peer(loop.get(), manual);
  auto connection = open(loop, peer);
  auto channel = confirm_channel(loop, *connection);
  std::vector<std::optional<client::PublishOutcome>> outcomes;
  publish(*channel, outcomes);
  publish(*channel, outcomes);
  REQUIRE(loop.run_until([&] { return peer.last_sequence(channel->id()) == 2; }));
  amqp::ChannelClose close;
  close.reply_code = 404;
  close.reply_text = "NOT_FOUND - no exchange 'ex' in vhost '/'";
  close.failing_class_id = 60;
  close.failing_method_id = 40;
  peer.send(channel->id(), close);
  REQUIRE(loop.run_until([&] { return all_settled(outcomes); }));
  for (const auto& outcome : outcomes) {
    CHECK(outcome->status == PublishStatus::failed);
    CHECK(outcome->error.reply_code == 404);
  }
  CHECK(connection->is_open());
  test::close(loop, connection);
}

TEST_CASE("Closing the connection fails the calls still waiting for an answer", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  peer.on<amqp::QueueDeclare>([](const test::Received&) {});  // never answered
  auto connection = open(loop, peer);
  auto channel = test::open_channel(loop, *connection);
  std::optional<client::Error> declared;
  REQUIRE_FALSE(channel->queue_declare(
      "q", {}, [&](const client::Error& error, const client::QueueInfo&) { declared = error; }));
  REQUIRE(loop.run_until([&] { return peer.count<amqp::QueueDeclare>() == 1; }));
  test::close(loop, connection);
  REQUIRE(declared.has_value());
  CHECK(declared->code == make_error_code(ClientError::closed_by_client));
}

TEST_CASE("basic.get-ok hands over the message with its properties, body and count",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  peer.on<amqp::BasicGet>([&](const test::Received& r) {
    amqp::BasicGetOk ok;
    ok.delivery_tag = 9;
    ok.redelivered = true;
    ok.exchange = "ex";
    ok.routing_key = "key";
    ok.message_count = 41;
    amqp::BasicProperties properties;
    properties.message_id = "g-1";
    properties.content_type = "text/plain";
    peer.send_content(r.channel, ok, properties, "fetched");
  });
  auto connection = open(loop, peer);
  auto channel = test::open_channel(loop, *connection);
  std::optional<client::GetResult> got;
  REQUIRE_FALSE(channel->get("q", false,
                             [&](const client::Error& error, std::optional<client::GetResult>&& r) {
                               CHECK_FALSE(error);
                               got = std::move(r);
                             }));
  REQUIRE(loop.run_until([&] { return got.has_value(); }));
  CHECK(got->delivery_tag == 9);
  CHECK(got->redelivered);
  CHECK(got->message_count == 41);
  CHECK(got->message.body == "fetched");
  CHECK(got->message.properties.content_type == std::optional<std::string>("text/plain"));
  test::close(loop, connection);
}

TEST_CASE("A delivery with an empty body needs no body frame", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  auto channel = test::open_channel(loop, *connection);
  std::optional<std::string> tag;
  std::vector<client::Delivery> got;
  REQUIRE_FALSE(channel->consume(
      "q", {}, [&](client::Delivery&& d) { got.push_back(std::move(d)); },
      [&](const client::Error&, const std::string& consumer_tag) { tag = consumer_tag; }));
  REQUIRE(loop.run_until([&] { return tag.has_value(); }));
  std::string frames;
  (void)amqp::append_method_frame(frames, channel->id(), basic_deliver(*tag, 1));
  (void)amqp::append_header_frame(frames, channel->id(), 0, {});
  (void)amqp::append_method_frame(frames, channel->id(), basic_deliver(*tag, 2));
  (void)amqp::append_header_frame(frames, channel->id(), 1, {});
  amqp::append_body_frames(frames, channel->id(), "x", 131072);
  peer.send_raw(frames);
  REQUIRE(loop.run_until([&] { return got.size() == 2; }));
  CHECK(got[0].message.body.empty());
  CHECK(got[1].message.body == "x");
  test::close(loop, connection);
}

TEST_CASE(
    "A consumer with raw_properties gets the property bytes as they came, and decoding them later "
    "gives what came, or names what is wrong and keeps the bytes",
    "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  auto channel = test::open_channel(loop, *connection);
  std::optional<std::string> tag;
  std::vector<client::Delivery> got;
  client::ConsumeOptions options;
  options.raw_properties = true;
  REQUIRE_FALSE(channel->consume(
      "q", std::move(options), [&](client::Delivery&& d) { got.push_back(std::move(d)); },
      [&](const client::Error&, const std::string& consumer_tag) { tag = consumer_tag; }));
  REQUIRE(loop.run_until([&] { return tag.has_value(); }));
  amqp::BasicProperties sent;
  sent.message_id = "m-1";
  sent.delivery_mode = 2;
  sent.headers.emplace();
  sent.headers->append("x-death", amqp::FieldArray{amqp::FieldValue(amqp::FieldTable{})});
  sent.headers->append("retryloop-retries", int64_t(2));
  peer.send_content(channel->id(), basic_deliver(*tag, 1), sent, "body");
  // flags 0x2000 (headers), then a table of 3 bytes: "k" with the unknown type letter 'Z'.
  const std::string bad_properties("\x20\x00\x00\x00\x00\x03\x01kZ", 9);
  peer.send_raw_content(channel->id(), basic_deliver(*tag, 2), bad_properties, "x");
  REQUIRE(loop.run_until([&] { return got.size() == 2; }));

  client::Message& good = got[0].message;
  std::string encoded;
  amqp::Writer writer(encoded);
  sent.encode(writer);
  CHECK(good.raw_properties == encoded);
  CHECK(good.properties == amqp::BasicProperties{});
  CHECK_FALSE(good.properties_error);
  CHECK(good.body == "body");
  CHECK_FALSE(client::decode_properties(good));
  CHECK(good.properties == sent);
  CHECK(good.raw_properties.empty());
  CHECK_FALSE(client::decode_properties(good));  // once decoded, nothing more to do
  CHECK(good.properties == sent);

  client::Message& bad = got[1].message;
  CHECK(bad.raw_properties == bad_properties);
  CHECK_FALSE(bad.properties_error);  // nothing is checked before it is decoded
  const std::error_code error = client::decode_properties(bad);
  CHECK(error);
  CHECK(bad.properties_error == error);
  CHECK(bad.raw_properties == bad_properties);
  CHECK(bad.properties == amqp::BasicProperties{});
  CHECK(bad.body == "x");
  CHECK(channel->is_open());
  test::close(loop, connection);
}

TEST_CASE("A frame with a bad frame-end byte is answered with connection.close 501",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  std::optional<client::Error> lost;
  connection->set_lost_handler([&](const client::Error& error) { lost = error; });
  std::string frame;
  amqp::append_heartbeat_frame(frame);
  frame.back() = '\x00';  // not 0xCE
  peer.send_raw(frame);
  REQUIRE(loop.run_until([&] { return lost.has_value(); }));
  CHECK(lost->code == make_error_code(ClientError::protocol_error));
  CHECK_THAT(lost->message(), Catch::Contains("frame end"));
  REQUIRE(peer.count<amqp::ConnectionClose>() == 1);
  CHECK(peer.last<amqp::ConnectionClose>().reply_code == 501);
}

TEST_CASE("A channel.close for a channel that is not open is answered, not fatal",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  amqp::ChannelClose close;
  close.reply_code = 406;
  close.reply_text = "PRECONDITION_FAILED";
  peer.send(9, close);
  peer.send(9, amqp::ChannelCloseOk{});  // a late close-ok: ignored
  REQUIRE(loop.run_until([&] { return peer.count<amqp::ChannelCloseOk>() == 1; }));
  CHECK(peer.received().back().channel == 9);
  auto channel = test::open_channel(loop, *connection);  // the connection still works
  CHECK(connection->is_open());
  test::close(loop, connection);
}

TEST_CASE("A second connection.start during the handshake breaks the protocol", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  peer.on<amqp::ConnectionStartOk>([&](const test::Received&) {
    amqp::ConnectionStart again;
    again.version_minor = 9;
    again.mechanisms = "PLAIN";
    again.locales = "en_US";
    peer.send(0, again);
  });
  const client::Error error = refused(loop, peer);
  CHECK(error.code == make_error_code(ClientError::protocol_error));
  CHECK_THAT(error.message(), Catch::Contains("connection.start"));
}

// ---- channel open and close races -------------------------------------------------------------

TEST_CASE("Channel closes that cross on the wire are each answered, and the number is reused after",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  std::vector<test::Received> closes;  // the client's channel.close, answered by the test
  peer.on<amqp::ChannelClose>([&](const test::Received& r) { closes.push_back(r); });
  auto connection = open(loop, peer);
  auto channel = test::open_channel(loop, *connection);
  REQUIRE(channel->id() == 1);
  std::optional<client::Error> closed;
  REQUIRE_FALSE(channel->close([&](const client::Error& error) { closed = error; }));
  amqp::ChannelClose crossing;  // sent before the broker read the client's close
  crossing.reply_code = 406;
  crossing.reply_text = "PRECONDITION_FAILED - crossing";
  peer.send(1, crossing);
  REQUIRE(loop.run_until(
      [&] { return closes.size() == 1 && peer.count<amqp::ChannelCloseOk>() == 1; }));
  // The client answered the broker's close; its own still waits for its close-ok, so number 1 is
  // not free yet: a new channel takes 2.
  CHECK_FALSE(closed.has_value());
  auto second = test::open_channel(loop, *connection);
  CHECK(second->id() == 2);
  peer.send(1, amqp::ChannelCloseOk{});
  REQUIRE(loop.run_until([&] { return closed.has_value(); }));
  CHECK_FALSE(*closed);
  auto third = test::open_channel(loop, *connection);
  CHECK(third->id() == 1);
  CHECK(connection->is_open());
  test::close(loop, connection);
}

TEST_CASE("Calls made on a channel whose open is refused fail with the refusal", "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  peer.on<amqp::ChannelOpen>([&](const test::Received& r) {
    amqp::ChannelClose close;
    close.reply_code = 530;
    close.reply_text = "NOT_ALLOWED - number of channels opened has reached the limit";
    close.failing_class_id = 20;
    close.failing_method_id = 10;
    peer.send(r.channel, close);
  });
  auto connection = open(loop, peer);
  std::optional<client::Error> opened;
  REQUIRE_FALSE(connection->open_channel(
      [&](const client::Error& error, std::shared_ptr<client::Channel>) { opened = error; }));
  REQUIRE(loop.run_until([&] { return opened.has_value(); }));
  CHECK(opened->reply_code == 530);
  REQUIRE(loop.run_until([&] { return peer.count<amqp::ChannelCloseOk>() == 1; }));
  CHECK(connection->is_open());
  test::close(loop, connection);
}

TEST_CASE("Many channels opened at once each get their own number and their own open-ok",
          "[conversation]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto connection = open(loop, peer);
  std::vector<std::shared_ptr<client::Channel>> channels;
  for (int i = 0; i < 20; ++i) {
    REQUIRE_FALSE(connection->open_channel(
        [&](const client::Error& error, std::shared_ptr<client::Channel> c) {
          CHECK_FALSE(error);
          channels.push_back(std::move(c));
        }));
  }
  REQUIRE(loop.run_until([&] { return channels.size() == 20; }));
  std::vector<uint16_t> ids;
  for (const auto& c : channels)
    ids.push_back(c->id());
  std::sort(ids.begin(), ids.end());
  for (uint16_t i = 0; i < 20; ++i)
    CHECK(ids[i] == i + 1);
  test::close(loop, connection);
}
