// The consumer and its service's breaker against a real broker: a dependency that is down trips
// it, nothing is charged or parked because of the outage, the dependency gets one call per probe
// interval, and the service ramps back once it answers. Each lane's broker: on 3.10 and 4.0 a
// quorum queue counts every requeue, so a requeue anywhere here would show as a redelivery.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/topology/plan.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using consumer::Outcome;
using outage::State;
using test::Broker;
using test::make_service;
using test::options_for;
using test::Recorder;
using test::start;
using test::stop;
using test::TestLoop;

namespace {

/// Calls a handler made while the dependency was down, and whether it was up.
struct Dependency {
  std::atomic<bool> up{false};
  std::atomic<int> calls_while_down{0};

  Outcome call() {
    if (up) return Outcome::ack();
    ++calls_while_down;
    return Outcome::unavailable("payments: connection refused");
  }
};

bool has_event(const std::vector<outage::Event>& events, State to, outage::Reason reason) {
  for (const auto& event : events)
    if (event.to == to && event.reason == reason) return true;
  return false;
}

/// The breaker's events, recorded on the loop thread.
consumer::ConsumerOptions recording(consumer::ConsumerOptions options,
                                    std::vector<outage::Event>& events) {
  options.on_breaker = [&events](const outage::Event& event) { events.push_back(event); };
  return options;
}

}  // namespace

TEST_CASE(
    "A dependency that is down trips the breaker: no message is charged, requeued or parked, it "
    "gets one call per probe interval, and the service ramps back up once it answers",
    "[outage][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(
      test::unique_name("outage"), R"("mode": "republish", "delays": ["200ms"], "max_attempts": 2)",
      R"("queue_type": "quorum", "outage": {"consecutive_unavailable": 3,
          "probe_interval": "400ms", "ramp": {"interval": "300ms"}})");
  std::vector<outage::Event> events;
  auto options = recording(options_for(service), events);
  // On the worker pool, which takes up to 8 + 32 deliveries ahead of a free worker: those that
  // have not started when the breaker opens must not run.
  options.handler_on_loop = false;
  options.concurrency = 8;
  options.prefetch = 100;
  Dependency dependency;
  Recorder calls;
  broker.apply(service);
  const int messages = 60;
  for (int i = 0; i < messages; ++i)
    broker.publish(service.input.exchange, "key", "m-" + std::to_string(i));
  auto c = start(loop, options, [&](const consumer::Message& message) {
    calls.add(message);
    std::this_thread::sleep_for(5ms);
    return dependency.call();
  });

  REQUIRE(loop.run_until([&] { return c->breaker_state() != State::closed; }, 10s));
  CHECK(has_event(events, State::open, outage::Reason::consecutive_unavailable));
  // The calls of the trip: the 3 that tripped it, and on each of the 8 workers the one it ran
  // and at most one it took before the loop collected the results; none of the other deliveries
  // handed to the pool ahead of a free worker.
  REQUIRE(loop.run_until([&] { return c->handlers_running() == 0; }, 10s));
  const int at_trip = dependency.calls_while_down;
  CHECK(at_trip <= 3 + 2 * 8);
  loop.run_for(2000ms);
  const int while_open = dependency.calls_while_down - at_trip;
  INFO("calls while open: " << while_open);
  CHECK(while_open >= 2);  // it probes
  CHECK(while_open <= 2000 / 400 + 1);
  CHECK(c->metrics().parked() == 0);
  CHECK(c->metrics().retried == 0);
  // Held by the consumer, or never delivered: the breaker opened before the broker sent them.
  CHECK(c->held() + broker.depth(topology::input_queue_name(service)) == size_t(messages));

  dependency.up = true;
  REQUIRE(loop.run_until([&] { return c->metrics().acked == size_t(messages); }, 20s));
  REQUIRE(loop.run_until([&] { return c->breaker_state() == State::closed; }, 10s));
  CHECK(has_event(events, State::probing, outage::Reason::probe_due));
  CHECK(has_event(events, State::open, outage::Reason::probe_failed));
  CHECK(has_event(events, State::ramping, outage::Reason::probe_succeeded));
  // The ramp: 2, then 4 at once, then the concurrency (8), closed.
  std::vector<int> limits;
  for (const auto& event : events)
    if (event.to == State::ramping || event.to == State::closed) limits.push_back(event.limit);
  CHECK(limits == std::vector<int>{2, 4, 8});
  CHECK(c->breaker_stats().trips >= 1);
  CHECK(c->breaker_stats().probes >= 3);

  // Nothing was charged: every call was the message's first attempt, no message went through a
  // wait queue or back to its queue, and parking is empty.
  for (const auto& call : calls.calls()) {
    INFO(call.id);
    CHECK(call.attempt == 1);
    CHECK(call.death_queues.empty());
    CHECK_FALSE(call.redelivered);
  }
  CHECK(c->metrics().retried == 0);
  CHECK(c->metrics().parked() == 0);
  CHECK(c->metrics().held_unavailable >= size_t(at_trip));
  stop(loop, c);
  CHECK(broker.depth(topology::parking_queue_name(service.name)) == 0);
  broker.remove(service);
}

TEST_CASE(
    "A handler that never succeeded and classifies nothing trips the breaker on its failure rate, "
    "and a poison message still parks during the outage",
    "[outage][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(
      test::unique_name("rate"), R"("mode": "republish", "delays": ["300ms"], "max_attempts": 20)",
      R"("outage": {"failure_rate": {"threshold": 0.5, "window": "5s", "minimum_calls": 4},
          "probe_interval": "400ms", "ramp": {"interval": "200ms"}})");
  std::vector<outage::Event> events;
  auto options = recording(options_for(service), events);
  options.concurrency = 4;
  std::atomic<bool> up{false};
  std::atomic<int> calls_while_down{0};
  auto c = start(loop, options, [&](const consumer::Message& message) {
    if (message.message_id() == "poison") return Outcome::poison("not JSON");
    if (up) return Outcome::ack();
    ++calls_while_down;
    return Outcome::retry("payments answered 500");  // not classified as unavailable
  });
  broker.publish(service.input.exchange, "key", "poison");
  for (int i = 0; i < 10; ++i)
    broker.publish(service.input.exchange, "key", "m-" + std::to_string(i));

  REQUIRE(loop.run_until([&] { return c->breaker_state() != State::closed; }, 10s));
  CHECK(has_event(events, State::open, outage::Reason::failure_rate));
  REQUIRE(loop.run_until([&] { return c->metrics().parked_poison == 1; }, 10s));
  const int at_trip = calls_while_down;
  loop.run_for(1600ms);
  CHECK(calls_while_down - at_trip <= 1600 / 400 + 1);

  up = true;
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 10; }, 20s));
  CHECK(c->metrics().parked_exhausted == 0);
  CHECK(c->metrics().parked() == 1);
  stop(loop, c);
  broker.remove(service);
}

TEST_CASE(
    "With a probe function, no message reaches the handler while the breaker is open: the probe "
    "is called once per interval instead",
    "[outage][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(
      test::unique_name("probe"), R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)",
      R"("outage": {"consecutive_unavailable": 2, "probe_interval": "300ms"})");
  std::vector<outage::Event> events;
  auto options = recording(options_for(service), events);
  std::atomic<int> probes{0};
  Dependency dependency;
  options.probe = [&] {
    ++probes;
    return dependency.up.load();
  };
  auto c = start(loop, options, [&](const consumer::Message&) { return dependency.call(); });
  for (int i = 0; i < 5; ++i)
    broker.publish(service.input.exchange, "key", "m-" + std::to_string(i));
  REQUIRE(loop.run_until([&] { return c->breaker_state() != State::closed; }, 10s));
  const int at_trip = dependency.calls_while_down;
  loop.run_for(1500ms);
  CHECK(dependency.calls_while_down == at_trip);
  CHECK(probes >= 2);
  CHECK(probes <= 1500 / 300 + 1);

  dependency.up = true;
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 5; }, 10s));
  CHECK(c->metrics().retried == 0);
  CHECK(c->metrics().parked() == 0);
  stop(loop, c);
  broker.remove(service);
}

TEST_CASE(
    "A consumer paused by hand takes no delivery until resumed, then starts with one call and "
    "ramps",
    "[outage][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("pause"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)",
                                    R"("outage": {"ramp": {"interval": "200ms"}})");
  std::vector<outage::Event> events;
  auto options = recording(options_for(service), events);
  options.concurrency = 4;
  Recorder calls;
  auto c = start(loop, options, [&](const consumer::Message& message) {
    calls.add(message);
    return Outcome::ack();
  });
  c->pause();
  CHECK(c->breaker_state() == State::paused);
  loop.run_for(300ms);  // the cancel reaches the broker
  for (int i = 0; i < 6; ++i)
    broker.publish(service.input.exchange, "key", "m-" + std::to_string(i));
  loop.run_for(1000ms);
  CHECK(calls.size() == 0);
  CHECK(broker.depth(topology::input_queue_name(service)) == 6);

  c->resume();
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 6; }, 10s));
  REQUIRE(loop.run_until([&] { return c->breaker_state() == State::closed; }, 10s));
  CHECK(has_event(events, State::paused, outage::Reason::paused));
  CHECK(has_event(events, State::probing, outage::Reason::resumed));
  CHECK(has_event(events, State::ramping, outage::Reason::probe_succeeded));
  for (const auto& call : calls.calls())
    CHECK_FALSE(call.redelivered);
  stop(loop, c);
  broker.remove(service);
}
