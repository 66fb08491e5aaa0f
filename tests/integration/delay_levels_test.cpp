// Delays the handler chooses, against a real broker: Outcome::retry_after through the delay
// levels, levels shared by services whose queue names overlap, a backoff with a retry budget,
// exceptions mapped to outcomes, and the levels' objects as apply, verify and parking stats see
// them.

#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/parking/error.hpp"
#include "retryloop/parking/parking.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/plan.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using consumer::Outcome;
using test::Broker;
using test::header;
using test::make_service;
using test::options_for;
using test::Recorder;
using test::start;
using test::stop;
using test::TestLoop;

namespace {

std::chrono::milliseconds gap(const test::Call& a, const test::Call& b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b.at - a.at);
}

/// The queues a retry expired from on its way back (its x-death), in any order.
std::set<std::string> expired_from(const test::Call& call) {
  return {call.death_queues.begin(), call.death_queues.end()};
}

std::set<std::string> levels(const topology::Service& service, std::initializer_list<int> ks) {
  std::set<std::string> names;
  for (int k : ks)
    names.insert(topology::delay_level_name(service, k));
  return names;
}

}  // namespace

TEST_CASE(
    "A handler that says \"try again in 17 s\" sees the message again 17 s later, on classic "
    "and quorum delay levels",
    "[delay-levels][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const std::string retry =
      R"("mode": "republish", "delays": ["1s"], "max_attempts": 5,
         "delay_levels": {"base": "100ms", "max": "1h"})";
  const auto classic = make_service(test::unique_name("after17"), retry);
  const auto quorum =
      make_service(test::unique_name("after17q"), retry, R"("queue_type": "quorum")");
  Recorder recorder;
  auto handler = [&](const consumer::Message& m) {
    recorder.add(m);
    return m.attempt == 1 ? Outcome::retry_after(17s, "HTTP 429, Retry-After: 17") : Outcome::ack();
  };
  auto c1 = start(loop, options_for(classic), handler);
  auto c2 = start(loop, options_for(quorum), handler);
  broker.publish(classic.input.exchange, "key", "classic-17");
  broker.publish(quorum.input.exchange, "key", "quorum-17");
  REQUIRE(
      loop.run_until([&] { return c1->metrics().acked == 1 && c2->metrics().acked == 1; }, 40s));
  stop(loop, c1);
  stop(loop, c2);
  for (const auto* service : {&classic, &quorum}) {
    const std::string id = service == &classic ? "classic-17" : "quorum-17";
    auto calls = recorder.of(id);
    REQUIRE(calls.size() == 2);
    CHECK(calls[1].attempt == 2);
    // 17 s is 170 units of 100 ms, 0b10101010: four levels, of 0.2, 0.8, 3.2 and 12.8 s, and
    // it expired from exactly those, so it waited 17 s and no longer.
    CHECK(calls[1].death_queue.rfind("retryloop.delay.100ms", 0) == 0);
    CHECK(expired_from(calls[1]) == levels(*service, {1, 3, 5, 7}));
    const auto waited = gap(calls[0], calls[1]);
    INFO(id << " came back after " << waited.count() << " ms");
    CHECK(waited >= 17s);
  }
}

TEST_CASE(
    "A retry through the delay levels never comes back before it asked, below half the base or "
    "between levels",
    "[delay-levels][integration]") {
  TestLoop loop;
  Broker broker(loop);
  // A base of its own; 30 ms once rounded to the nearest base, 0: an immediate retry.
  const auto service = make_service(test::unique_name("roundup"), R"("mode": "republish",
      "delays": ["1s"], "max_attempts": 3, "delay_levels": {"base": "200ms", "levels": 4})");
  const std::map<std::string, std::chrono::milliseconds> asked = {{"short", 30ms},
                                                                  {"between", 250ms}};
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return m.attempt == 1 ? Outcome::retry_after(asked.at(std::string(m.message_id())), "busy")
                          : Outcome::ack();
  });
  for (const auto& [id, delay] : asked)
    broker.publish(service.input.exchange, "key", id);
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 2; }, 20s));
  stop(loop, c);
  for (const auto& [id, delay] : asked) {
    auto calls = recorder.of(id);
    REQUIRE(calls.size() == 2);
    const auto waited = gap(calls[0], calls[1]);
    INFO(id << " asked " << delay.count() << " ms, came back after " << waited.count() << " ms");
    // Rounded up to the base: 200 ms (level 0) and 400 ms (level 1), and no longer.
    const bool is_short = id == "short";
    CHECK(waited >= (is_short ? 200ms : 400ms));
    CHECK(expired_from(calls[1]) == levels(service, {is_short ? 0 : 1}));
  }
}

TEST_CASE("Services sharing delay levels each get back only their own retries, in delay order",
          "[delay-levels][integration]") {
  TestLoop loop;
  Broker broker(loop);
  // A base of its own, so that this test alone uses the set and its unrouted queue.
  const std::string name = test::unique_name("shared");
  const auto orders = make_service(name, R"("mode": "republish", "delays": ["1s"],
      "max_attempts": 3, "delay_levels": {"base": "25ms", "levels": 8})");
  // Its queue's name ends in the first one's, and it has more levels.
  const auto other = make_service("x." + name, R"("mode": "republish", "delays": ["1s"],
      "max_attempts": 3, "delay_levels": {"base": "25ms", "levels": 12})");
  // In units of 25 ms: a 96 (levels 5, 6), b 12 (2, 3), c 48 (4, 5), d none; m, a marker sent
  // after the others are back, 124, every level any of them took.
  std::map<std::string, std::chrono::milliseconds> asked = {
      {"a", 2400ms}, {"b", 300ms}, {"c", 1200ms}, {"d", 0ms}, {"m", 3100ms}};
  std::mutex mutex;
  std::map<std::string, std::vector<std::string>> seen;  // queue -> ids, in arrival order
  auto handler_for = [&](const std::string& queue) {
    return [&, queue](const consumer::Message& m) {
      const std::string id(m.message_id());
      {
        std::lock_guard<std::mutex> lock(mutex);
        seen[queue].push_back(id + "#" + std::to_string(m.attempt));
      }
      if (m.attempt > 1) return Outcome::ack();
      throw consumer::RetryAfterError(asked.at(id.substr(id.size() - 1)), "busy");
    };
  };
  auto c1 = start(loop, options_for(orders), handler_for("orders"));
  auto c2 = start(loop, options_for(other), handler_for("other"));
  for (const std::string suffix : {"a", "b", "c", "d"}) {
    broker.publish(orders.input.exchange, "key", "o-" + suffix);
    broker.publish(other.input.exchange, "key", "x-" + suffix);
  }
  REQUIRE(
      loop.run_until([&] { return c1->metrics().acked == 4 && c2->metrics().acked == 4; }, 20s));
  // The markers' retries take every level the others took, from the highest down, each queue in
  // order: a copy routed to the wrong service on the way would be ahead of them.
  broker.publish(orders.input.exchange, "key", "o-m");
  broker.publish(other.input.exchange, "key", "x-m");
  REQUIRE(
      loop.run_until([&] { return c1->metrics().acked == 5 && c2->metrics().acked == 5; }, 20s));
  stop(loop, c1);
  stop(loop, c2);
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [queue, prefix] :
       std::map<std::string, std::string>{{"orders", "o-"}, {"other", "x-"}}) {
    const auto& ids = seen[queue];
    INFO(queue);
    REQUIRE(ids.size() == 10);
    std::vector<std::string> retries;
    for (const auto& id : ids) {
      CHECK(id.rfind(prefix, 0) == 0);
      if (id.substr(id.size() - 2) == "#2") retries.push_back(id.substr(0, id.size() - 2));
    }
    CHECK(retries == std::vector<std::string>{prefix + "d", prefix + "b", prefix + "c",
                                              prefix + "a", prefix + "m"});
  }
  CHECK(broker.depth(topology::delay_unrouted_name(orders)) == 0);
}

TEST_CASE("A backoff over the delay levels stops at the retry budget and parks the message",
          "[delay-levels][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("budget"), R"("mode": "republish",
      "max_attempts": 100, "max_retry_duration": "6s",
      "delay_levels": {"base": "50ms", "max": "10m"},
      "backoff": {"initial": "200ms", "max": "800ms", "multiplier": 2, "jitter": 0})");
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return Outcome::retry("still down");
  });
  broker.publish(service.input.exchange, "key", "budget-1");
  REQUIRE(loop.run_until([&] { return c->metrics().parked_exhausted == 1; }, 20s));
  stop(loop, c);
  auto calls = recorder.of("budget-1");
  // 200, 400, 800, 800, ... ms: the budget (6 s, counted in whole seconds) ends it after about
  // nine attempts, far below max_attempts. Four attempts take 1.4 s and the budget is spent
  // from the first one: a slow machine's late deliveries cost attempts, not the first four.
  REQUIRE(calls.size() >= 4);
  CHECK(calls.size() <= 11);
  CHECK(gap(calls[0], calls[1]) >= 200ms);
  CHECK(gap(calls[1], calls[2]) >= 400ms);
  CHECK(gap(calls[2], calls[3]) >= 800ms);
  CHECK(gap(calls[0], calls[1]) < gap(calls[2], calls[3]));
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 1);
  const amqp::FieldValue* error = header(parked[0], "retryloop-error");
  REQUIRE(error != nullptr);
  const std::string text(*error->as_string());
  CHECK(text.rfind("still down\n", 0) == 0);
  CHECK_THAT(text, Catch::Contains("max_retry_duration 6s"));
}

TEST_CASE("Apply declares the delay levels and verify finds them matching",
          "[delay-levels][topology][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("levelsverify"), R"("mode": "republish",
      "delays": ["1s"], "max_attempts": 3, "delay_levels": {"base": "7ms", "levels": 5})");
  topology::Topology t;
  t.services.push_back(service);
  const topology::Plan plan = topology::make_plan(t);
  broker.apply(service);
  std::optional<topology::Report> report;
  REQUIRE_FALSE(
      topology::verify(broker.connection, plan, [&](const topology::Report& r) { report = r; }));
  REQUIRE(loop.run_until([&] { return report.has_value(); }, 20s));
  CHECK(report->ok());
  size_t levels = 0;
  for (const auto& r : report->results) {
    if (r.action.role == topology::Role::delay_queue &&
        r.action.kind == topology::ActionKind::declare_queue) {
      ++levels;
      CHECK(r.outcome == topology::Outcome::matches);
    }
  }
  CHECK(levels == 5 + 1);  // the levels and the unrouted queue

  // The parking tool counts them with the service's queues.
  std::optional<parking::Stats> stats;
  REQUIRE_FALSE(parking::stats(broker.connection, service,
                               [&](const client::Error& error, const parking::Stats& s) {
                                 CHECK_FALSE(error);
                                 stats = s;
                               }));
  REQUIRE(loop.run_until([&] { return stats.has_value(); }, 20s));
  CHECK(stats->loop_depths.count("retryloop.delay.7ms.04") == 1);
  CHECK(stats->loop_depths.count("retryloop.delay.7ms.unrouted") == 1);
  CHECK(stats->loop_depths.count(topology::input_queue_name(service)) == 1);
}

TEST_CASE(
    "Retries that found no queue wait in the levels' unrouted queue, and replay with "
    "--unrouted-retries sends back only the service's own",
    "[delay-levels][parking][integration]") {
  TestLoop loop;
  Broker broker(loop);
  // A base of its own, so that this test alone uses the set and its unrouted queue.
  const auto service = make_service(test::unique_name("unrouted"), R"("mode": "republish",
      "delays": ["1s"], "max_attempts": 3, "delay_levels": {"base": "11ms", "levels": 4})");
  broker.apply(service);
  const std::string queue = topology::input_queue_name(service);
  const std::string unrouted = topology::delay_unrouted_name(service);
  const std::string deliver = topology::delay_delivery_exchange_name(service);
  // The service's queue is gone when its retries' delays end (a redeploy): they go unrouted, with
  // a retry of another queue.
  bool deleted = false;
  REQUIRE_FALSE(broker.channel->queue_delete(
      queue, false, false, [&](const client::Error& error, uint32_t) { deleted = !error; }));
  REQUIRE(loop.run_until([&] { return deleted; }));
  broker.publish(deliver, topology::delay_route(service, 0ms).routing_key, "mine-1");
  broker.publish(deliver, "0.0.0.0.other." + queue, "theirs");
  broker.publish(deliver, topology::delay_route(service, 55ms).routing_key, "mine-2");
  CHECK(broker.depth(unrouted) == 3);

  broker.apply(service);  // the queue is back
  std::optional<parking::ReplayResult> result;
  parking::ReplayOptions options;
  options.unrouted_retries = true;
  REQUIRE_FALSE(parking::replay(broker.connection, service, options,
                                [&](const parking::ReplayResult& r) { result = r; }));
  REQUIRE(loop.run_until([&] { return result.has_value(); }, 20s));
  CHECK_FALSE(result->error);
  CHECK(result->progress.moved == 2);
  CHECK(result->progress.skipped == 1);
  auto back = broker.drain(queue);
  REQUIRE(back.size() == 2);
  CHECK(back[0].message.properties.message_id == "mine-1");
  CHECK(back[1].message.properties.message_id == "mine-2");
  auto left = broker.drain(unrouted);
  REQUIRE(left.size() == 1);
  CHECK(left[0].message.properties.message_id == "theirs");

  // A service without delay levels has no such queue: refused before anything is read.
  const auto plain = make_service(test::unique_name("plain"), R"("delays": ["1s"],
      "max_attempts": 3)");
  client::Error refused = parking::replay(broker.connection, plain, options, {});
  CHECK(refused.code == parking::make_error_code(parking::ParkingError::no_delay_levels));
}
