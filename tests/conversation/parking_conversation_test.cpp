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

// A parking queue whose passive declares answer `counts` in turn (the last one from then on), and
// whose consumer gets `parked` messages at once.
class ScriptedParking {
 public:
  ScriptedParking(ScriptedPeer& peer, const std::string& queue, std::vector<uint32_t> counts,
                  size_t parked)
      : peer_(peer), queue_(queue) {
    peer.script_message_counts(queue, std::move(counts));
    peer.on<amqp::BasicConsume>([this, &peer, parked](const Received& r) {
      ++consumes_;
      amqp::BasicConsumeOk ok;
      ok.consumer_tag = "walk";
      peer.send(r.channel, ok, r.connection);
      for (size_t i = 1; i <= parked; ++i) {
        amqp::BasicDeliver deliver;
        deliver.consumer_tag = ok.consumer_tag;
        deliver.delivery_tag = i;
        amqp::BasicProperties properties;
        properties.message_id = "parked-" + std::to_string(i);
        peer.send_content(r.channel, deliver, properties, "{}", r.connection);
      }
    });
  }

  size_t lookups() const { return peer_.message_count_lookups(queue_); }
  size_t consumes() const { return consumes_; }

 private:
  ScriptedPeer& peer_;
  std::string queue_;
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
    "leader gives, and reads what is parked",
    "[conversation][parking]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("walk", R"("delays": ["1s"], "max_attempts": 3)");
  ScriptedParking parking(peer, topology::parking_queue_name(service.name), {0, 0, 2}, 2);

  const auto messages = list_parked(loop, peer, service);
  REQUIRE(messages.size() == 2);
  CHECK(messages[0].message_id == "parked-1");
  CHECK(messages[1].message_id == "parked-2");
  CHECK(parking.consumes() == 1);
}

TEST_CASE("A parking walk reports an empty queue once its count stays 0, without consuming",
          "[conversation][parking]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("walk", R"("delays": ["1s"], "max_attempts": 3)");
  ScriptedParking parking(peer, topology::parking_queue_name(service.name), {0}, 0);

  CHECK(list_parked(loop, peer, service).empty());
  CHECK(parking.lookups() == 5);
  CHECK(parking.consumes() == 0);
}
