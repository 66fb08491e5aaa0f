// The parking walk against a scripted peer: what it does when the broker's count of the queue
// cannot be trusted.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "retryloop/parking/parking.hpp"
#include "retryloop/topology/topology.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"
#include "support/scripted_peer.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using test::Received;
using test::ScriptedPeer;
using test::TestLoop;

namespace {

// A parking queue whose passive declares answer `counts` in turn (the last one from then on), whose
// basic.get gives the first of `parked` messages (or get-empty when there are none; a nack puts it
// back), and whose consumer gets the `parked` messages at once. Its first `failing_gets` gets
// close their connection, as RabbitMQ does while a quorum queue has no leader.
class ScriptedParking {
 public:
  ScriptedParking(ScriptedPeer& peer, const std::string& queue, std::vector<uint32_t> counts,
                  size_t parked, size_t failing_gets = 0)
      : peer_(peer), queue_(queue) {
    peer.script_message_counts(queue, std::move(counts));
    peer.on<amqp::BasicGet>([this, &peer, parked, failing_gets](const Received& r) {
      ++gets_;
      if (gets_ <= failing_gets) {
        amqp::ConnectionClose close;
        close.reply_code = 541;
        close.reply_text = "INTERNAL_ERROR - Cannot get a message from queue: nodedown";
        close.failing_class_id = 60;
        close.failing_method_id = 70;
        peer.send(0, close, r.connection);
        return;
      }
      if (parked == 0) {
        peer.send(r.channel, amqp::BasicGetEmpty{}, r.connection);
        return;
      }
      amqp::BasicGetOk ok;
      ok.delivery_tag = ++tag_;
      ok.message_count = uint32_t(parked - 1);
      peer.send_content(r.channel, ok, parked_message(1), "{}", r.connection);
    });
    peer.on<amqp::BasicNack>([this](const Received&) { ++nacks_; });
    peer.on<amqp::BasicConsume>([this, &peer, parked](const Received& r) {
      ++consumes_;
      amqp::BasicConsumeOk ok;
      ok.consumer_tag = "walk";
      peer.send(r.channel, ok, r.connection);
      for (size_t i = 1; i <= parked; ++i) {
        amqp::BasicDeliver deliver;
        deliver.consumer_tag = ok.consumer_tag;
        deliver.delivery_tag = ++tag_;
        peer.send_content(r.channel, deliver, parked_message(i), "{}", r.connection);
      }
    });
  }

  size_t lookups() const { return peer_.message_count_lookups(queue_); }
  size_t gets() const { return gets_; }
  size_t nacks() const { return nacks_; }
  size_t consumes() const { return consumes_; }

 private:
  static amqp::BasicProperties parked_message(size_t i) {
    amqp::BasicProperties properties;
    properties.message_id = "parked-" + std::to_string(i);
    return properties;
  }

  ScriptedPeer& peer_;
  std::string queue_;
  uint64_t tag_ = 0;  // the channel's delivery tags, gets and deliveries alike
  size_t gets_ = 0;
  size_t nacks_ = 0;
  size_t consumes_ = 0;
};

std::vector<parking::ParkedMessage> list_parked(TestLoop& loop, const ScriptedPeer& peer,
                                                const topology::Service& service) {
  auto connection = test::connect(loop, peer.url());
  auto messages = test::list_parked(loop, connection, service);
  test::close(loop, connection);
  return messages;
}

}  // namespace

TEST_CASE(
    "A parking walk counts its queue again after an answer of 0, as a quorum queue electing a "
    "leader gives, and reads what is parked, also when the basic.get that checks the 0 loses its "
    "connection (RabbitMQ's 541 while a quorum queue has no leader)",
    "[conversation][parking]") {
  const size_t failing_gets = GENERATE(0, 1);
  INFO(failing_gets << " failing gets");
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("walk", R"("delays": ["1s"], "max_attempts": 3)");
  ScriptedParking parking(peer, topology::parking_queue_name(service.name), {0, 0, 2}, 2,
                          failing_gets);

  const auto messages = list_parked(loop, peer, service);
  REQUIRE(messages.size() == 2);
  CHECK(messages[0].message_id == "parked-1");
  CHECK(messages[1].message_id == "parked-2");
  // A get whose connection closed was asked again on a new one, after a count; the get that
  // found a message put it back, and the counts went on. The walk's own connection went on.
  CHECK(parking.gets() == 1 + failing_gets);
  CHECK(parking.nacks() == 1);
  CHECK(parking.lookups() >= 3);
  CHECK(parking.consumes() == 1);
  CHECK(peer.connections() == int(2 + failing_gets));
}

TEST_CASE(
    "A parking walk reports an empty queue at once when a basic.get after its count of 0 finds "
    "it empty, without consuming",
    "[conversation][parking]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("walk", R"("delays": ["1s"], "max_attempts": 3)");
  ScriptedParking parking(peer, topology::parking_queue_name(service.name), {0}, 0);

  CHECK(list_parked(loop, peer, service).empty());
  CHECK(parking.lookups() == 1);
  CHECK(parking.gets() == 1);
  CHECK(parking.consumes() == 0);
}
