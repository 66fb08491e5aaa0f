// The in_queue retry mode: a quorum queue's own delayed retry (RabbitMQ 4.3) holds a failed
// message back, with no wait queue and no dead-lettering. On 4.3 it retries, parks and guards
// against crash loops; on every older lane it is refused before anything is declared, since the
// broker would keep the argument and ignore it.

#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/consumer/error.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using client::Error;
using consumer::Outcome;
using test::Broker;
using test::header;
using test::Recorder;
using test::TestLoop;

namespace {

bool has_delayed_retry() {
  return test::broker_version() != "3.10" && test::broker_version() != "4.0";
}

topology::Service in_queue_service(const std::string& prefix, const std::string& retry) {
  return test::make_service(test::unique_name(prefix), R"("mode": "in_queue", )" + retry,
                            R"("queue_type": "quorum")");
}

/// Deletes the service's objects however the test ends.
struct Cleanup {
  Broker& broker;
  const topology::Service& service;
  ~Cleanup() { broker.remove(service); }
};

}  // namespace

TEST_CASE(
    "In in_queue mode the quorum queue holds each failed delivery for the step times its failures, "
    "then the message is parked with its attempts, on RabbitMQ 4.3",
    "[retry][integration][in-queue]") {
  if (!has_delayed_retry()) return;  // the next test covers the older lanes
  TestLoop loop;
  Broker broker(loop);
  const auto service = in_queue_service("iq", R"("delays": ["300ms", "500ms"], "max_attempts": 4)");
  Cleanup cleanup{broker, service};
  Recorder recorder;
  auto c = test::start(loop, test::options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return Outcome::retry("attempt " + std::to_string(m.attempt) + " failed");
  });
  broker.publish(service.input.exchange, "key", "m-1", R"({"order": 1})");
  REQUIRE(loop.run_until([&] { return c->metrics().parked_exhausted == 1; }, 30s));
  const auto metrics = c->metrics();
  test::stop(loop, c);

  const auto calls = recorder.of("m-1");
  REQUIRE(calls.size() == 4);
  // Waits of 300 ms x 1, 300 ms x 2 capped at 500 ms, then 500 ms.
  const std::vector<std::chrono::milliseconds> waits = {300ms, 500ms, 500ms};
  for (size_t i = 0; i < calls.size(); ++i) {
    CHECK(calls[i].attempt == int64_t(i) + 1);
    CHECK(calls[i].death_queue.empty());  // never dead-lettered
    if (i == 0) continue;
    const auto gap =
        std::chrono::duration_cast<std::chrono::milliseconds>(calls[i].at - calls[i - 1].at);
    INFO("gap before attempt " << i + 1 << ": " << gap.count() << " ms");
    // Never back before its delay.
    CHECK(test::came_back_after(calls[i - 1], calls[i], waits[i - 1]));
  }
  // Not late either: each retry asked the broker for its delay, as counted here, and the broker
  // holds the message for it (the gaps are not measured against the machine's clock).
  CHECK(metrics.retried == 3);
  CHECK(metrics.delivered == 4);
  CHECK(metrics.retried_by_delay == std::map<std::string, uint64_t>{{"300ms", 1}, {"500ms", 2}});

  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 1);
  CHECK(parked[0].message.body == R"({"order": 1})");
  CHECK(*header(parked[0], "retryloop-reason")->as_string() == "exhausted");
  CHECK(*header(parked[0], "retryloop-attempts")->as_int64() == 4);
  CHECK(*header(parked[0], "retryloop-error")->as_string() == "attempt 4 failed");
  // The broker's counters stay behind: a replayed copy starts again from its own count.
  CHECK(header(parked[0], "x-delivery-count") == nullptr);
  CHECK(header(parked[0], "x-acquired-count") == nullptr);
  CHECK(broker.depth(topology::input_queue_name(service)) == 0);
}

TEST_CASE(
    "In in_queue mode a message whose consumers die with it is parked as delivery_limit once its "
    "failed deliveries pass max_attempts, on RabbitMQ 4.3",
    "[retry][integration][in-queue]") {
  if (!has_delayed_retry()) return;
  TestLoop loop;
  Broker broker(loop);
  const auto service = in_queue_service("iqcrash", R"("delays": ["10ms"], "max_attempts": 2)");
  Cleanup cleanup{broker, service};
  broker.apply(service);
  broker.publish(service.input.exchange, "key", "crashes");
  // Two consumers die holding it: two failed deliveries, held back 10 and 20 ms each time.
  for (int i = 0; i < 2; ++i) {
    auto taker = test::open_channel(loop, *broker.connection);
    std::optional<client::GetResult> got;
    for (int tries = 0; tries < 200 && !got; ++tries) {  // held back 10 or 20 ms after a failure
      bool answered = false;
      REQUIRE_FALSE(
          taker->get(topology::input_queue_name(service), false, [&](const Error& error, auto&& r) {
            CHECK_FALSE(error);
            got = std::move(r);
            answered = true;
          }));
      REQUIRE(loop.run_until([&] { return answered; }));
      if (!got) loop.run_for(50ms);
    }
    REQUIRE(got);
    bool closed = false;
    REQUIRE_FALSE(taker->close([&](const Error&) { closed = true; }));
    REQUIRE(loop.run_until([&] { return closed; }));
  }
  int handled = 0;
  auto c = test::start(loop, test::options_for(service), [&](const consumer::Message&) {
    ++handled;
    return Outcome::ack();
  });
  REQUIRE(loop.run_until([&] { return c->metrics().parked() == 1; }, 20s));
  CHECK(c->metrics().parked_delivery_limit == 1);
  CHECK(handled == 0);
  test::stop(loop, c);
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 1);
  CHECK(*header(parked[0], "retryloop-reason")->as_string() == "delivery_limit");
  CHECK_THAT(std::string(*header(parked[0], "retryloop-error")->as_string()),
             Catch::Contains("failed 2 deliveries"));
}

TEST_CASE(
    "The in_queue mode is refused, naming the broker's version, where RabbitMQ has no delayed "
    "retry, before anything is declared",
    "[retry][integration][in-queue]") {
  if (has_delayed_retry()) return;  // the tests above cover 4.3
  TestLoop loop;
  Broker broker(loop);
  const auto service = in_queue_service("iqold", R"("delays": ["1s"], "max_attempts": 3)");
  Cleanup cleanup{broker, service};

  // The consumer stops at once, fatally, without declaring.
  auto c = consumer::Consumer::create(loop.get(), test::options_for(service),
                                      [](const consumer::Message&) { return Outcome::ack(); });
  bool stopped = false;
  Error error;
  c->set_stopped_handler([&](const Error& e) {
    error = e;
    stopped = true;
  });
  REQUIRE_FALSE(c->start());
  REQUIRE(loop.run_until([&] { return stopped; }, 10s));
  CHECK(error.code == make_error_code(consumer::ConsumerError::broker_too_old));
  CHECK_THAT(error.message(),
             Catch::Contains("needs RabbitMQ 4.3 or later") &&
                 Catch::Contains("the broker is RabbitMQ " + test::broker_version() + "."));
  CHECK(c->metrics().reconnects == 0);

  // topology apply declares everything else and reports the input queue refused.
  bool done = false;
  topology::Report report;
  REQUIRE_FALSE(topology::apply(broker.connection,
                                topology::make_plan(topology::Topology{{service}}),
                                [&](const topology::Report& r) {
                                  report = r;
                                  done = true;
                                }));
  REQUIRE(loop.run_until([&] { return done; }));
  CHECK_FALSE(report.ok());
  bool refused = false;
  for (const auto& result : report.results) {
    if (result.action.kind != topology::ActionKind::declare_queue ||
        result.action.name != topology::input_queue_name(service)) {
      continue;
    }
    refused = true;
    CHECK(result.outcome == topology::Outcome::failed);
    CHECK_THAT(result.error.message(), Catch::Contains("x-delayed-retry-type") &&
                                           Catch::Contains("every retry would come back at once"));
  }
  CHECK(refused);
  // Never declared: nothing would hold its retries back.
  auto probe = test::open_channel(loop, *broker.connection);
  client::QueueOptions passive;
  passive.passive = true;
  bool looked = false;
  Error lookup;
  REQUIRE_FALSE(probe->queue_declare(topology::input_queue_name(service), passive,
                                     [&](const Error& e, const client::QueueInfo&) {
                                       lookup = e;
                                       looked = true;
                                     }));
  REQUIRE(loop.run_until([&] { return looked; }));
  CHECK(lookup.reply_code == 404);
}
