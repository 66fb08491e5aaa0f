// Quorum queues count the deliveries that go back unsettled (RabbitMQ 4.3: only the failed ones,
// not requeueing nacks), and from RabbitMQ 4.0 on they dead-letter (or, without a dead-letter
// exchange, drop) a message past a delivery limit of 20 by default. These tests hold on every
// broker lane: reading parked messages never costs one, and a message whose consumer keeps dying
// with it ends in parking with its own reason.

#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/parking/parking.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using client::Error;
using test::TestLoop;

namespace {

/// A quorum service with unique names, its topology applied; a confirm-mode channel to publish.
struct QuorumService {
  TestLoop& loop;
  test::Broker broker;
  topology::Service service;
  std::shared_ptr<client::Channel> probe;

  QuorumService(TestLoop& l, const std::string& extra)
      : loop(l),
        broker(l),
        service(test::make_service(test::unique_name("limit"),
                                   R"("mode": "reject", "delays": ["100ms"], "max_attempts": 3)",
                                   R"("queue_type": "quorum")" + extra)) {
    broker.apply(service);
  }
  ~QuorumService() { broker.remove(service); }

  /// Messages ready in `q`, on one channel kept for polling.
  uint32_t depth(const std::string& q) {
    if (!probe || !probe->is_open()) probe = test::open_channel(loop, *broker.connection);
    client::QueueOptions passive;
    passive.passive = true;
    bool done = false;
    uint32_t count = 0;
    REQUIRE_FALSE(probe->queue_declare(q, passive, [&](const Error& error, const auto& info) {
      CHECK_FALSE(error);
      count = info.message_count;
      done = true;
    }));
    REQUIRE(loop.run_until([&] { return done; }));
    return count;
  }

  /// Waits until `q` holds `n` messages. A quorum queue applies the returns of a closed channel
  /// through its log, just after the close-ok: a read right after another can find it short.
  void wait_depth(const std::string& q, uint32_t n) {
    for (int wait = 0; wait < 200 && depth(q) != n; ++wait)
      loop.run_for(50ms);
    REQUIRE(depth(q) == n);
  }

  std::string queue() const { return topology::input_queue_name(service); }
  std::string parking() const { return topology::parking_queue_name(service.name); }
  void publish(const std::string& exchange, const std::string& key, const std::string& id,
               amqp::FieldTable headers = {}) {
    amqp::BasicProperties properties;
    properties.headers = std::move(headers);
    broker.publish(exchange, key, id, "{}", std::move(properties));
  }

  std::vector<parking::ParkedMessage> list() {
    return test::list_parked(loop, broker.connection, service);
  }
};

std::vector<std::string> ids(const std::vector<parking::ParkedMessage>& messages) {
  std::vector<std::string> out;
  for (const auto& m : messages)
    out.push_back(m.message_id);
  return out;
}

}  // namespace

TEST_CASE(
    "Reading a quorum parking queue 200 times, then stats and a filtered replay, costs no parked "
    "message",
    "[parking][integration]") {
  TestLoop loop;
  QuorumService s(loop, "");
  const std::string parking = topology::parking_exchange_name(s.service.name);
  for (const char* id : {"parked-1", "parked-2"}) {
    amqp::FieldTable headers;
    headers.append("retryloop-reason", "exhausted");
    headers.append("retryloop-error", std::string("failed ") + id);
    s.publish(parking, "", id, std::move(headers));
  }

  // Each read hands both messages back once: 200 reads are ten times RabbitMQ 4.x's default limit.
  for (int read = 0; read < 200; ++read) {
    INFO("read " << read);
    s.wait_depth(s.parking(), 2);
    REQUIRE(ids(s.list()) == std::vector<std::string>{"parked-1", "parked-2"});
  }

  s.wait_depth(s.parking(), 2);
  bool done = false;
  parking::Stats stats;
  REQUIRE_FALSE(
      parking::stats(s.broker.connection, s.service, [&](const Error& error, parking::Stats st) {
        CHECK_FALSE(error);
        stats = st;
        done = true;
      }));
  REQUIRE(loop.run_until([&] { return done; }));
  CHECK(stats.depth == 2);
  CHECK(stats.by_reason["exhausted"] == 2);

  s.wait_depth(s.parking(), 2);
  parking::ReplayOptions options;
  options.filter.where = {{"retryloop-error", "failed parked-2"}};
  done = false;
  parking::ReplayResult replayed;
  REQUIRE_FALSE(parking::replay(s.broker.connection, s.service, options, [&](const auto& result) {
    replayed = result;
    done = true;
  }));
  REQUIRE(loop.run_until([&] { return done; }));
  INFO(replayed.error.message());
  CHECK_FALSE(replayed.error);
  CHECK(replayed.progress.moved == 1);
  s.wait_depth(s.parking(), 1);
  CHECK(ids(s.list()) == std::vector<std::string>{"parked-1"});
  CHECK(s.depth(s.queue()) == 1);
}

namespace {

/// How a consumer gives a message back without settling it.
enum class HandBack {
  crash,  // its channel closes while it holds the message, as when the process dies
  nack,   // basic.nack with requeue, as a graceful stop hands back what it has not started
};

/// Takes the message at the head of `s`'s queue `times` times and hands it back each time;
/// returns how often there was one to take.
int hand_back(QuorumService& s, HandBack how, int times) {
  int handed_back = 0;
  std::shared_ptr<client::Channel> taker;
  for (int i = 0; i < times; ++i) {
    if (!taker || !taker->is_open()) taker = test::open_channel(s.loop, *s.broker.connection);
    bool got = false;
    std::optional<client::GetResult> result;
    REQUIRE_FALSE(taker->get(s.queue(), false, [&](const Error& error, auto&& r) {
      CHECK_FALSE(error);
      result = std::move(r);
      got = true;
    }));
    REQUIRE(s.loop.run_until([&] { return got; }));
    if (!result) break;
    if (how == HandBack::nack) {
      REQUIRE_FALSE(taker->nack(result->delivery_tag, false, true));
    } else {
      bool closed = false;
      REQUIRE_FALSE(taker->close([&](const Error&) { closed = true; }));
      REQUIRE(s.loop.run_until([&] { return closed; }));
    }
    s.wait_depth(s.queue(), 1);
    ++handed_back;
  }
  return handed_back;
}

}  // namespace

TEST_CASE(
    "A message whose consumer died with it as often as the service's delivery limit is parked as "
    "delivery_limit without running its handler, and the broker never dead-letters it",
    "[retry][integration]") {
  TestLoop loop;
  QuorumService s(loop, R"(, "delivery_limit": 2)");
  s.publish(s.service.input.exchange, "key", "crashes-its-consumer");
  CHECK(hand_back(s, HandBack::crash, 2) == 2);

  int handled = 0;
  auto c = test::start(loop, test::options_for(s.service), [&](const consumer::Message&) {
    ++handled;
    return consumer::Outcome::ack();
  });
  const bool parked = loop.run_until([&] { return c->metrics().parked() == 1; }, 20s);
  INFO("queue " << s.depth(s.queue()) << " wait " << s.depth(s.service.name + ".wait.100ms")
                << " parking " << s.depth(s.parking()) << "; " << c->metrics().summary());
  REQUIRE(parked);
  CHECK(c->metrics().parked_delivery_limit == 1);
  CHECK(handled == 0);
  test::stop(loop, c);

  auto messages = s.list();
  REQUIRE(messages.size() == 1);
  CHECK(messages[0].message_id == "crashes-its-consumer");
  CHECK(messages[0].reason == "delivery_limit");
  CHECK(messages[0].error.find("delivered 2 times") != std::string::npos);
  CHECK(s.depth(s.queue()) == 0);
}

TEST_CASE(
    "Requeueing nacks count toward the delivery limit before RabbitMQ 4.3 only, which counts them "
    "in x-acquired-count",
    "[retry][integration]") {
  TestLoop loop;
  QuorumService s(loop, R"(, "delivery_limit": 2)");
  s.publish(s.service.input.exchange, "key", "handed-back");
  CHECK(hand_back(s, HandBack::nack, 2) == 2);

  // What the broker tells the third delivery.
  auto channel = test::open_channel(loop, *s.broker.connection);
  bool got = false;
  std::optional<client::GetResult> result;
  REQUIRE_FALSE(channel->get(s.queue(), false, [&](const Error& error, auto&& r) {
    CHECK_FALSE(error);
    result = std::move(r);
    got = true;
  }));
  REQUIRE(loop.run_until([&] { return got; }));
  REQUIRE(result);
  const retry::AttemptInfo info =
      retry::read_attempt_info(result->message.properties, s.queue(), "", "");
  const bool counts_nacks = test::broker_version() != "4.3";
  CHECK(info.delivery_count == (counts_nacks ? 2 : 0));
  const amqp::FieldValue* acquired =
      result->message.properties.headers
          ? result->message.properties.headers->find("x-acquired-count")
          : nullptr;
  CHECK((acquired != nullptr) == !counts_nacks);
  if (acquired) CHECK(acquired->as_int64() == 2);
  REQUIRE_FALSE(channel->nack(result->delivery_tag, false, true));
  s.wait_depth(s.queue(), 1);

  int handled = 0;
  auto c = test::start(loop, test::options_for(s.service), [&](const consumer::Message&) {
    ++handled;
    return consumer::Outcome::ack();
  });
  REQUIRE(loop.run_until([&] { return c->metrics().acked + c->metrics().parked() == 1; }, 20s));
  CHECK(c->metrics().parked_delivery_limit == (counts_nacks ? 1 : 0));
  CHECK(handled == (counts_nacks ? 0 : 1));
  test::stop(loop, c);
  CHECK(s.depth(s.queue()) == 0);
}
