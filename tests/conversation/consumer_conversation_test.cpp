// The retry consumer against a scripted peer: its session (declare, consume, settle), each
// outcome on the wire, a copy that waits for its confirm before the original is acked, a
// reconnect that declares again, a result that comes back after its channel died, which must
// never be settled on the new channel, what a stop waits for, and the parking-depth alert.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "retryloop/amqp/rabbit_extensions.hpp"
#include "retryloop/consumer/consumer.hpp"
#include "retryloop/retry/history.hpp"
#include "retryloop/topology/topology.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"
#include "support/scripted_peer.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using consumer::Outcome;
using test::Received;
using test::ScriptedPeer;
using test::TestLoop;

namespace {

/// As test::options_for, with the peer for a broker.
consumer::ConsumerOptions peer_options(const ScriptedPeer& peer, const topology::Service& service) {
  consumer::ConsumerOptions options;
  options.service = service;
  options.connection.uri = client::parse_uri(peer.url());
  options.handler_on_loop = true;
  options.recovery = consumer::Backoff{100ms, 1000ms, 2.0, 0.1};
  // The conversations here are about one consumer's own channels; sharing the breaker and
  // following migrations open others (tested against real brokers in
  // tests/integration/outage_test.cpp and migrate_test.cpp).
  options.share_breaker = false;
  options.follow_migrations = false;
  return options;
}

/// The consumer's consume channel and tag, once it consumes.
struct Consuming {
  int connection = 0;
  uint16_t channel = 0;
  std::string tag;
};

Consuming consuming(const ScriptedPeer& peer) {
  for (auto it = peer.received().rbegin(); it != peer.received().rend(); ++it) {
    if (it->is<amqp::BasicConsume>()) {
      const auto consume = it->as<amqp::BasicConsume>();
      return {it->connection, it->channel,
              consume.consumer_tag.empty() ? peer.last_consumer_tag() : consume.consumer_tag};
    }
  }
  FAIL("the consumer never sent basic.consume");
  return {};
}

/// Sends one delivery to the consumer.
void deliver(ScriptedPeer& peer, const Consuming& at, uint64_t delivery_tag, const std::string& id,
             amqp::BasicProperties properties = {}) {
  amqp::BasicDeliver method;
  method.consumer_tag = at.tag;
  method.delivery_tag = delivery_tag;
  method.exchange = "svc.in";
  method.routing_key = "key";
  properties.message_id = id;
  peer.send_content(at.channel, method, properties, "{}", at.connection);
}

/// The settlement the consumer sent for `delivery_tag` on the consume channel `at`: "ack",
/// "reject", "nack" or "".
std::string settlement(const ScriptedPeer& peer, const Consuming& at, uint64_t delivery_tag) {
  for (const auto& r : peer.received()) {
    if (r.connection != at.connection || r.channel != at.channel) continue;
    if (r.is<amqp::BasicAck>()) {
      const auto ack = r.as<amqp::BasicAck>();
      if (ack.delivery_tag == delivery_tag || (ack.multiple && ack.delivery_tag > delivery_tag))
        return "ack";
    }
    if (r.is<amqp::BasicReject>() && r.as<amqp::BasicReject>().delivery_tag == delivery_tag)
      return "reject";
    if (r.is<amqp::BasicNack>() && r.as<amqp::BasicNack>().delivery_tag == delivery_tag)
      return "nack";
  }
  return "";
}

/// A consumer of service "svc" whose handler runs on a worker thread and holds its message until
/// `gate` opens; `running` is true while it is held.
struct GatedConsumer {
  test::Gate gate;
  std::atomic<bool> running{false};
  std::shared_ptr<consumer::Consumer> consumer;
};

std::unique_ptr<GatedConsumer> start_gated(TestLoop& loop, const ScriptedPeer& peer) {
  auto gated = std::make_unique<GatedConsumer>();
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  auto options = peer_options(peer, service);
  options.handler_on_loop = false;
  GatedConsumer* held = gated.get();
  gated->consumer = test::start(loop, options, [held](const consumer::Message&) {
    held->running = true;
    held->gate.pass();
    held->running = false;
    return Outcome::ack();
  });
  return gated;
}

}  // namespace

TEST_CASE("The consumer declares its topology, sets its prefetch and consumes its queue",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  auto c = test::start(loop, peer_options(peer, service),
                       [](const consumer::Message&) { return Outcome::ack(); });
  CHECK(peer.count<amqp::ExchangeDeclare>() >= 3);  // input, wait, parking
  CHECK(peer.count<amqp::QueueDeclare>() >= 3);     // input, wait, parking
  CHECK(peer.count<amqp::BasicQos>() >= 1);
  CHECK(peer.last<amqp::BasicConsume>().queue == "svc");
  CHECK_FALSE(peer.last<amqp::BasicConsume>().no_ack);
  test::stop(loop, c);
  CHECK(peer.count<amqp::BasicCancel>() == 1);
}

TEST_CASE("Each outcome reaches the wire as its settlement", "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  auto c = test::start(loop, peer_options(peer, service), [](const consumer::Message& m) {
    const std::string id(m.message_id());
    if (id == "ack") return Outcome::ack();
    if (id == "retry") return Outcome::retry("down");
    return Outcome::drop("not ours");
  });
  const Consuming at = consuming(peer);
  deliver(peer, at, 1, "ack");
  deliver(peer, at, 2, "retry");
  deliver(peer, at, 3, "drop");
  REQUIRE(loop.run_until([&] {
    return settlement(peer, at, 1) == "ack" && settlement(peer, at, 2) != "" &&
           settlement(peer, at, 3) == "ack";
  }));
  CHECK(settlement(peer, at, 2) == "reject");  // reject mode: into the wait queue
  for (const auto& r : peer.received()) {
    if (r.is<amqp::BasicReject>()) CHECK_FALSE(r.as<amqp::BasicReject>().requeue);
  }
  const auto metrics = c->metrics();
  CHECK(metrics.acked == 1);
  CHECK(metrics.retried == 1);
  CHECK(metrics.dropped == 1);
  test::stop(loop, c);
}

TEST_CASE("A parking copy is confirmed before its original is acked, and carries its history",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer::Options manual;
  manual.auto_confirm = false;
  ScriptedPeer peer(loop.get(), manual);
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  auto c = test::start(loop, peer_options(peer, service), [](const consumer::Message&) {
    return Outcome::permanent("customer 7 does not exist");
  });
  const Consuming at = consuming(peer);
  deliver(peer, at, 1, "m-1");
  Received copy;
  REQUIRE(loop.run_until([&] {
    for (const auto& r : peer.received()) {
      if (r.is<amqp::BasicPublish>() && r.as<amqp::BasicPublish>().exchange == "svc.parking") {
        copy = r;
        return true;
      }
    }
    return false;
  }));
  CHECK(copy.as<amqp::BasicPublish>().mandatory);
  CHECK(settlement(peer, at, 1).empty());  // nothing settles it before the confirm
  const retry::History history = retry::read_history(&*copy.properties->headers);
  REQUIRE(history.entries.size() == 1);
  CHECK(history.entries[0].outcome == "parked");
  CHECK(history.entries[0].reason == "permanent");
  CHECK(history.entries[0].error == "customer 7 does not exist");
  amqp::BasicAck ack;
  ack.delivery_tag = peer.last_sequence(copy.channel, copy.connection);
  peer.send(copy.channel, ack, copy.connection);
  REQUIRE(loop.run_until([&] { return settlement(peer, at, 1) == "ack"; }));
  CHECK(c->metrics().parked_permanent == 1);
  test::stop(loop, c);
}

TEST_CASE("A returned parking copy leaves the original unsettled and is published again",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer::Options manual;
  manual.auto_confirm = false;
  ScriptedPeer peer(loop.get(), manual);
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  auto options = peer_options(peer, service);
  options.publish_retry = consumer::Backoff{10ms, 10ms, 1.0, 0.0};
  auto c = test::start(loop, options,
                       [](const consumer::Message&) { return Outcome::permanent("bad"); });
  const Consuming at = consuming(peer);
  deliver(peer, at, 1, "m-1");
  auto parking_copies = [&] {
    std::vector<Received> out;
    for (const auto& r : peer.received()) {
      if (r.is<amqp::BasicPublish>() && r.as<amqp::BasicPublish>().exchange == "svc.parking")
        out.push_back(r);
    }
    return out;
  };
  REQUIRE(loop.run_until([&] { return parking_copies().size() == 1; }));
  const Received first = parking_copies()[0];
  amqp::BasicReturn back;
  back.reply_code = 312;
  back.reply_text = "NO_ROUTE";
  back.exchange = "svc.parking";
  back.routing_key = first.as<amqp::BasicPublish>().routing_key;
  peer.send_content(first.channel, back, *first.properties, first.body, first.connection);
  amqp::BasicAck ack;
  ack.delivery_tag = peer.last_sequence(first.channel, first.connection);
  peer.send(first.channel, ack, first.connection);
  REQUIRE(loop.run_until([&] { return parking_copies().size() == 2; }));
  // The same copy, property for property, though it waited in wire form for its confirm.
  const Received again = parking_copies()[1];
  REQUIRE(again.properties);
  CHECK(*again.properties == *first.properties);
  CHECK(again.body == first.body);
  CHECK(first.properties->headers->find("retryloop-history") != nullptr);
  CHECK(settlement(peer, at, 1).empty());
  CHECK(c->metrics().publish_failures == 1);
  ack.delivery_tag = peer.last_sequence(first.channel, first.connection);
  peer.send(first.channel, ack, first.connection);
  REQUIRE(loop.run_until([&] { return settlement(peer, at, 1) == "ack"; }));
  test::stop(loop, c);
}

TEST_CASE(
    "In in_queue mode a forged retryloop-retries near the largest count is parked, not retried "
    "forever",
    "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer::Options options_43;
  options_43.version = "4.3.6";
  ScriptedPeer peer(loop.get(), options_43);
  const auto service = test::make_service("svc",
                                          R"("mode": "in_queue", "delays": ["1s"], )"
                                          R"("max_attempts": 3)",
                                          R"("queue_type": "quorum")");
  int handled = 0;
  auto c = test::start(loop, peer_options(peer, service), [&handled](const consumer::Message&) {
    ++handled;
    return Outcome::retry("down");
  });
  const Consuming at = consuming(peer);
  amqp::BasicProperties forged;
  forged.headers.emplace();
  forged.headers->append("retryloop-retries", std::numeric_limits<int64_t>::max() - 1);
  forged.headers->append("x-delivery-count", int64_t(1));
  deliver(peer, at, 1, "forged", forged);
  REQUIRE(loop.run_until([&] { return !settlement(peer, at, 1).empty(); }));
  CHECK(settlement(peer, at, 1) == "ack");
  CHECK(handled == 0);
  const auto copy = peer.last<amqp::BasicPublish>();
  CHECK(copy.exchange == "svc.parking");
  CHECK(c->metrics().parked_delivery_limit == 1);
  test::stop(loop, c);
}

TEST_CASE("After a lost connection the consumer connects again, declares again and consumes",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  auto c = test::start(loop, peer_options(peer, service),
                       [](const consumer::Message&) { return Outcome::ack(); });
  const size_t declares = peer.count<amqp::QueueDeclare>();
  peer.drop();
  REQUIRE(loop.run_until([&] { return peer.count<amqp::BasicConsume>() == 2; }));
  CHECK(peer.count<amqp::QueueDeclare>() >= 2 * declares);
  CHECK(c->metrics().reconnects == 1);
  const Consuming at = consuming(peer);
  deliver(peer, at, 1, "after");
  REQUIRE(loop.run_until([&] { return settlement(peer, at, 1) == "ack"; }));
  test::stop(loop, c);
}

TEST_CASE("A result that comes back after its channel died is not settled on the new one",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  auto options = peer_options(peer, service);
  options.handler_on_loop = false;  // on a worker thread, held by the gate
  test::Gate gate;
  std::atomic<int> calls{0};
  auto c = test::start(loop, options, [&](const consumer::Message&) {
    if (calls++ == 0) gate.pass();
    return Outcome::ack();
  });
  const Consuming before = consuming(peer);
  deliver(peer, before, 1, "held");
  REQUIRE(loop.run_until([&] { return calls.load() == 1; }));
  peer.drop();
  REQUIRE(loop.run_until([&] { return peer.count<amqp::BasicConsume>() == 2; }));
  gate.open();
  REQUIRE(loop.run_until([&] { return c->metrics().abandoned == 1; }));
  const Consuming after = consuming(peer);
  // Delivery tag 1 on the new channel belongs to another message: the old result must not ack it.
  CHECK(settlement(peer, after, 1).empty());
  deliver(peer, after, 1, "fresh");
  REQUIRE(loop.run_until([&] { return settlement(peer, after, 1) == "ack"; }));
  CHECK(c->metrics().acked == 1);
  test::stop(loop, c);
}

TEST_CASE("A broker's basic.cancel of the consumer makes it consume again",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  auto c = test::start(loop, peer_options(peer, service),
                       [](const consumer::Message&) { return Outcome::ack(); });
  const Consuming at = consuming(peer);
  amqp::BasicCancel cancel;
  cancel.consumer_tag = at.tag;
  cancel.no_wait = true;
  peer.send(at.channel, cancel, at.connection);
  REQUIRE(loop.run_until([&] { return peer.count<amqp::BasicConsume>() == 2; }, 10s));
  const Consuming again = consuming(peer);
  deliver(peer, again, 1, "after-cancel");
  REQUIRE(loop.run_until([&] { return settlement(peer, again, 1) == "ack"; }));
  test::stop(loop, c);
}

TEST_CASE("While the broker blocks publishing, a parking copy waits and goes out on unblock",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  auto c = test::start(loop, peer_options(peer, service),
                       [](const consumer::Message&) { return Outcome::permanent("bad"); });
  const Consuming at = consuming(peer);
  amqp::ConnectionBlocked blocked;
  blocked.reason = "low on disk";
  for (int connection = 1; connection <= peer.connections(); ++connection)
    peer.send(0, blocked, connection);
  REQUIRE(loop.run_until([&] { return c->is_blocked(); }));
  deliver(peer, at, 1, "m-1");
  // The handler runs on the loop as the delivery arrives: a copy would go out right then.
  REQUIRE(loop.run_until([&] { return c->metrics().delivered == 1; }));
  size_t copies = 0;
  for (const auto& r : peer.received())
    copies += r.is<amqp::BasicPublish>() ? 1 : 0;
  CHECK(copies == 0);
  for (int connection = 1; connection <= peer.connections(); ++connection)
    peer.send(0, amqp::ConnectionUnblocked{}, connection);
  REQUIRE(loop.run_until([&] { return settlement(peer, at, 1) == "ack"; }));
  CHECK(c->metrics().parked_permanent == 1);
  test::stop(loop, c);
}

TEST_CASE("A message an asynchronous handler has not settled stays unsettled until it does",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  auto options = peer_options(peer, service);
  options.concurrency = 10;
  std::vector<consumer::Settle> held;
  auto c =
      test::start(loop, options,
                  consumer::AsyncHandler([&](const consumer::Message& m, consumer::Settle settle) {
                    if (m.message_id() == "marker") return settle(Outcome::ack());
                    held.push_back(std::move(settle));
                  }));
  const Consuming at = consuming(peer);
  deliver(peer, at, 1, "held-1");
  deliver(peer, at, 2, "held-2");
  deliver(peer, at, 3, "marker");
  // The marker, handled after them, is settled at once: by then, anything that settled the
  // others by itself would have.
  REQUIRE(loop.run_until([&] { return settlement(peer, at, 3) == "ack"; }));
  REQUIRE(held.size() == 2);
  CHECK(settlement(peer, at, 1).empty());
  CHECK(settlement(peer, at, 2).empty());
  CHECK(c->in_flight() == 2);
  held[1](Outcome::ack());
  held[0](Outcome::ack());
  REQUIRE(loop.run_until(
      [&] { return settlement(peer, at, 1) == "ack" && settlement(peer, at, 2) == "ack"; }));
  CHECK(c->in_flight() == 0);
  test::stop(loop, c);
}

TEST_CASE(
    "A delivery waiting for its handler is decoded only when the handler would start: one whose "
    "properties cannot be decoded is parked then, or goes back with the others at a stop",
    "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  std::vector<std::string> handled;
  std::vector<consumer::Settle> held;
  auto c = test::start(loop, peer_options(peer, service),
                       consumer::AsyncHandler([&](const consumer::Message& m, consumer::Settle s) {
                         handled.emplace_back(m.message_id());
                         held.push_back(std::move(s));
                       }));
  const Consuming at = consuming(peer);
  deliver(peer, at, 1, "first");
  // flags 0x2000 (headers), then a table of 3 bytes: "k" with the unknown type letter 'Z'.
  const std::string undecodable("\x20\x00\x00\x00\x00\x03\x01kZ", 9);
  amqp::BasicDeliver second;
  second.consumer_tag = at.tag;
  second.delivery_tag = 2;
  peer.send_raw_content(at.channel, second, undecodable, "{}", at.connection);
  deliver(peer, at, 3, "third");
  // Concurrency 1: the first one's handler holds the others back.
  REQUIRE(loop.run_until([&] { return c->metrics().delivered == 3; }));
  REQUIRE(held.size() == 1);

  SECTION("its turn comes") {
    held[0](Outcome::ack());
    REQUIRE(loop.run_until([&] {
      return c->metrics().parked_poison == 1 && settlement(peer, at, 2) == "ack" &&
             held.size() == 2;
    }));
    held[1](Outcome::ack());
    REQUIRE(loop.run_until([&] { return settlement(peer, at, 3) == "ack"; }));
    CHECK(handled == std::vector<std::string>{"first", "third"});
    test::stop(loop, c);
  }
  SECTION("a stop comes first") {
    bool stopped = false;
    c->set_stopped_handler([&](const client::Error&) { stopped = true; });
    c->stop(30s);
    held[0](Outcome::ack());
    REQUIRE(loop.run_until([&] { return stopped; }));
    CHECK(settlement(peer, at, 1) == "ack");
    CHECK(settlement(peer, at, 2) == "nack");
    CHECK(settlement(peer, at, 3) == "nack");
    CHECK(c->metrics().parked_poison == 0);
    CHECK(peer.count<amqp::BasicPublish>() == 0);
    CHECK(handled == std::vector<std::string>{"first"});
  }
}

TEST_CASE("A graceful stop closes nothing until its running handler has returned and settled",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto gated = start_gated(loop, peer);
  auto& c = gated->consumer;
  const Consuming at = consuming(peer);
  // After the cancel-ok, a channel.flow that the client answers as it reads it: once its
  // flow-ok is here, the client has handled the cancel-ok, and any close that made came first.
  peer.on<amqp::BasicCancel>([&](const Received& r) {
    amqp::BasicCancelOk ok;
    ok.consumer_tag = r.as<amqp::BasicCancel>().consumer_tag;
    peer.send(r.channel, ok, r.connection);
    amqp::ChannelFlow flow;
    flow.active = true;
    peer.send(r.channel, flow, r.connection);
  });
  deliver(peer, at, 1, "slow");
  REQUIRE(loop.run_until([&] { return gated->running.load(); }));
  bool stopped = false;
  c->set_stopped_handler([&](const client::Error&) { stopped = true; });
  c->stop(30s);
  REQUIRE(loop.run_until([&] {
    return peer.count<amqp::ChannelFlowOk>() == 1 || peer.count<amqp::ConnectionClose>() != 0;
  }));
  const size_t before_gate = peer.received().size();
  gated->gate.open();
  REQUIRE(loop.run_until([&] { return stopped; }));

  const auto& frames = peer.received();
  auto first = [&](size_t from, auto&& matches) {
    for (size_t i = from; i < frames.size(); ++i) {
      if (matches(frames[i])) return i;
    }
    return frames.size();
  };
  auto is_close = [](const Received& r) {
    return r.is<amqp::ChannelClose>() || r.is<amqp::ConnectionClose>();
  };
  const size_t cancel = first(0, [](const Received& r) { return r.is<amqp::BasicCancel>(); });
  const size_t close = first(cancel, is_close);
  const size_t ack = first(cancel, [&](const Received& r) {
    return r.connection == at.connection && r.channel == at.channel && r.is<amqp::BasicAck>();
  });
  REQUIRE(cancel < before_gate);
  CHECK(close >= before_gate);  // nothing closed while the handler ran
  CHECK(ack < close);           // its ack went out on the open channel
  CHECK(settlement(peer, at, 1) == "ack");
  CHECK(peer.count<amqp::ConnectionClose>() == 2);
}

TEST_CASE("After stop_now the connections close at once, and stopped waits for the handler",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  auto gated = start_gated(loop, peer);
  auto& c = gated->consumer;
  const Consuming at = consuming(peer);
  deliver(peer, at, 1, "slow");
  REQUIRE(loop.run_until([&] { return gated->running.load(); }));
  bool stopped = false;
  bool running_when_stopped = true;
  c->set_stopped_handler([&](const client::Error&) {
    running_when_stopped = gated->running.load();
    stopped = true;
  });
  c->stop_now();
  // Both connections closed, sockets and all, while the handler still runs.
  REQUIRE(loop.run_until([&] { return !peer.connected(); }));
  CHECK(peer.count<amqp::ConnectionClose>() == 2);
  CHECK_FALSE(stopped);
  gated->gate.open();
  REQUIRE(loop.run_until([&] { return stopped; }));
  CHECK_FALSE(running_when_stopped);
  CHECK(settlement(peer, at, 1).empty());  // its result came after the close: dropped
}

TEST_CASE("The parking alert fires when the depth rises above the threshold, once per crossing",
          "[conversation][consumer]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service = test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)");
  const std::string parking = topology::parking_queue_name(service.name);
  // What the consumer's lookups of the parking queue find, in turn, once the test counts them.
  const std::vector<uint32_t> depths = {2, 3, 3, 0, 3};
  auto options = peer_options(peer, service);
  options.parking_alert_threshold = 2;
  options.parking_check_interval = 1ms;
  std::vector<consumer::ParkingDepthEvent> alerts;
  std::vector<size_t> alerted_at;  // the lookup whose answer each alert came of
  options.on_parking_depth = [&](const consumer::ParkingDepthEvent& event) {
    alerts.push_back(event);
    alerted_at.push_back(peer.message_count_lookups(parking));
  };
  auto c = test::start(loop, options, [](const consumer::Message&) { return Outcome::ack(); });
  peer.script_message_counts(parking, depths);
  // One lookup at a time: the sixth goes out only after the answer to the fifth was handled.
  REQUIRE(loop.run_until([&] { return peer.message_count_lookups(parking) == 6; }));
  // Above at 3 (not at 2), not again while it stays above, again after it fell back to 0.
  CHECK(alerted_at == std::vector<size_t>{2, 5});
  REQUIRE(alerts.size() == 2);
  for (const auto& alert : alerts) {
    CHECK(alert.depth == 3);
    CHECK(alert.threshold == 2);
    CHECK(alert.queue == parking);
    CHECK(alert.service == service.name);
  }
  test::stop(loop, c);
}

TEST_CASE(
    "While its breaker is open the consumer keeps its consumer (a cancel would make the broker "
    "return deliveries in flight) and settles none of the deliveries it holds, and after a probe "
    "succeeds it acks them",
    "[conversation][consumer][outage]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service =
      test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)",
                         R"("outage": {"consecutive_unavailable": 2, "probe_interval": "200ms"})");
  bool up = false;
  int calls = 0;
  auto c = test::start(loop, peer_options(peer, service), [&](const consumer::Message&) {
    ++calls;
    return up ? Outcome::ack() : Outcome::unavailable("payments: connection refused");
  });
  const Consuming at = consuming(peer);
  for (uint64_t tag = 1; tag <= 3; ++tag)
    deliver(peer, at, tag, "m-" + std::to_string(tag));
  REQUIRE(loop.run_until([&] { return c->breaker_state() == outage::State::open; }));
  CHECK(calls == 2);  // the first delivery, run again once: two unavailable in a row

  loop.run_for(700ms);  // probes: the held first delivery, once per 200 ms
  CHECK(calls >= 3);
  CHECK(calls <= 2 + 4);
  CHECK(c->held() == 3);
  for (uint64_t tag = 1; tag <= 3; ++tag)
    CHECK(settlement(peer, at, tag).empty());
  CHECK(peer.count<amqp::BasicConsume>() == 1);

  up = true;
  REQUIRE(loop.run_until([&] { return settlement(peer, at, 3) == "ack"; }));
  CHECK(peer.count<amqp::BasicConsume>() == 1);
  CHECK(peer.count<amqp::BasicCancel>() == 0);
  for (uint64_t tag = 1; tag <= 2; ++tag)
    CHECK(settlement(peer, at, tag) == "ack");
  CHECK(peer.count<amqp::BasicNack>() == 0);
  CHECK(peer.count<amqp::BasicReject>() == 0);
  CHECK(c->metrics().retried == 0);
  test::stop(loop, c);
}

TEST_CASE(
    "A probe delivery that is parked before its handler runs (its properties cannot be decoded) "
    "frees the probe: the next delivery probes, and the breaker closes",
    "[conversation][consumer][outage]") {
  TestLoop loop;
  ScriptedPeer peer(loop.get());
  const auto service =
      test::make_service("svc", R"("delays": ["5s"], "max_attempts": 3)",
                         R"("outage": {"probe_interval": "200ms", "ramp": {"interval": "100ms"}})");
  std::vector<std::string> handled;
  auto c = test::start(loop, peer_options(peer, service), [&](const consumer::Message& message) {
    handled.emplace_back(message.message_id());
    return Outcome::ack();
  });
  const Consuming at = consuming(peer);
  // Paused, the deliveries wait; resumed, the first in line is the probe.
  c->pause();
  REQUIRE(c->breaker_state() == outage::State::paused);
  // flags 0x2000 (headers), then a table of 3 bytes: "k" with the unknown type letter 'Z'.
  const std::string undecodable("\x20\x00\x00\x00\x00\x03\x01kZ", 9);
  amqp::BasicDeliver poison;
  poison.consumer_tag = at.tag;
  poison.delivery_tag = 1;
  peer.send_raw_content(at.channel, poison, undecodable, "{}", at.connection);
  deliver(peer, at, 2, "good");
  REQUIRE(loop.run_until([&] { return c->metrics().delivered == 2; }));
  c->resume();
  REQUIRE(loop.run_until(
      [&] { return settlement(peer, at, 2) == "ack" && settlement(peer, at, 1) == "ack"; }));
  CHECK(c->metrics().parked_poison == 1);
  CHECK(handled == std::vector<std::string>{"good"});
  REQUIRE(loop.run_until([&] { return c->breaker_state() == outage::State::closed; }));
  test::stop(loop, c);
}
