// The retry consumer against a real broker, continued: per-message TTLs, attempt counts across a
// change of mode, delay tiers side by side, drop, asynchronous handlers, and handlers that outlive
// a stop.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using client::Error;
using consumer::Consumer;
using consumer::Outcome;
using test::TestLoop;
using Clock = std::chrono::steady_clock;
using test::Broker;
using test::Call;
using test::header;
using test::make_service;
using test::options_for;
using test::Recorder;
using test::start;
using test::stop;

namespace {}  // namespace

TEST_CASE("A parked message does not keep its expiration: it stays in parking past its TTL",
          "[retry][parking][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("ttlpark"),
                                    R"("mode": "reject", "delays": ["5s"], "max_attempts": 3)");
  auto c = start(loop, options_for(service),
                 [](const consumer::Message&) { return Outcome::permanent("no such customer"); });
  amqp::BasicProperties properties;
  properties.expiration = "1000";
  broker.publish(service.input.exchange, "key", "ttl-1", "{}", properties);
  REQUIRE(loop.run_until([&] { return c->metrics().parked_permanent == 1; }, 10s));
  stop(loop, c);
  loop.run_for(1500ms);  // past the message's own TTL

  const std::string parking = topology::parking_queue_name(service.name);
  REQUIRE(broker.depth(parking) == 1);
  auto parked = broker.drain(parking);
  REQUIRE(parked.size() == 1);
  CHECK_FALSE(parked[0].message.properties.expiration);
  const amqp::FieldValue* kept = header(parked[0], "retryloop-original-expiration");
  REQUIRE(kept != nullptr);
  CHECK(kept->as_string() == std::optional<std::string_view>("1000"));
}

TEST_CASE(
    "A republished retry waits its tier's whole delay, however short the message's own "
    "expiration",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service =
      make_service(test::unique_name("ttlwait"),
                   R"("mode": "republish", "delays": ["1500ms"], "max_attempts": 3)");
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return m.attempt == 1 ? Outcome::retry("once") : Outcome::ack();
  });
  amqp::BasicProperties properties;
  properties.expiration = "200";
  broker.publish(service.input.exchange, "key", "ttl-2", "{}", properties);
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 1; }, 10s));
  stop(loop, c);

  auto calls = recorder.of("ttl-2");
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].expiration == std::optional<std::string>("200"));
  CHECK_FALSE(calls[1].expiration);
  const auto gap = std::chrono::duration_cast<std::chrono::milliseconds>(calls[1].at - calls[0].at);
  INFO("retried after " << gap.count() << " ms");
  CHECK(test::came_back_after(calls[0], calls[1], 1500ms));
}

TEST_CASE(
    "A republish-mode retry of a message the broker had rejected before never lowers its "
    "attempt count",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service =
      make_service(test::unique_name("switch"),
                   R"("mode": "republish", "delays": ["100ms"], "max_attempts": 4)");
  broker.apply(service);
  const std::string queue = topology::input_queue_name(service);
  // As RabbitMQ leaves it after two rejections while the service was in reject mode.
  amqp::FieldTable death{{"count", amqp::FieldValue(int64_t(2))},
                         {"reason", amqp::FieldValue("rejected")},
                         {"queue", amqp::FieldValue(queue)},
                         {"exchange", amqp::FieldValue(service.input.exchange)},
                         {"routing-keys", amqp::FieldArray{amqp::FieldValue("key")}}};
  amqp::BasicProperties properties;
  properties.headers = amqp::FieldTable{{"x-death", amqp::FieldArray{amqp::FieldValue(death)}}};
  broker.publish("", queue, "switched", "{}", properties);

  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    if (m.message_id() == "marker") return m.attempt == 1 ? Outcome::retry("once") : Outcome::ack();
    return Outcome::retry("still down");
  });
  REQUIRE(loop.run_until([&] { return c->metrics().parked_exhausted == 1; }, 10s));
  // A marker retried once waits in the same tier after any copy "switched" sent there: its
  // second attempt comes after any further call of "switched".
  broker.publish("", queue, "marker");
  REQUIRE(loop.run_until([&] { return recorder.of("marker").size() == 2; }, 30s));
  stop(loop, c);

  std::vector<int64_t> attempts;
  for (const auto& call : recorder.of("switched"))
    attempts.push_back(call.attempt);
  CHECK(attempts == std::vector<int64_t>{3, 4});
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 1);
  CHECK(header(parked[0], "retryloop-attempts")->as_int64() == std::optional<int64_t>(4));
}

TEST_CASE(
    "A message on a short delay tier comes back while another waits in a long tier, not "
    "after it",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  // The long tier outlasts any wait of the test: "long" stays in it until the test drains it.
  const auto service =
      make_service(test::unique_name("tiers"),
                   R"("mode": "republish", "delays": ["200ms", "1h"], "max_attempts": 5)");
  Recorder recorder;
  // "long" fails twice (its second retry waits an hour), "short" once (it waits 200 ms).
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    const int64_t fails = m.message_id() == "long" ? 2 : 1;
    return m.attempt <= fails ? Outcome::retry("not yet") : Outcome::ack();
  });
  broker.publish(service.input.exchange, "key", "long");
  // Counted as retried once the copy in the long tier is confirmed.
  REQUIRE(loop.run_until([&] { return c->metrics().retried == 2; }, 10s));
  const std::string long_tier = topology::wait_queue_name(service.name, 1h);
  REQUIRE(broker.depth(long_tier) == 1);
  broker.publish(service.input.exchange, "key", "short");
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 1; }, 15s));
  stop(loop, c);

  auto short_calls = recorder.of("short");
  REQUIRE(short_calls.size() == 2);
  // The short retry came back while the long one, ahead of it, still waits in its tier.
  CHECK(recorder.of("long").size() == 2);
  CHECK(broker.drain(long_tier).size() == 1);
  const auto short_gap =
      std::chrono::duration_cast<std::chrono::milliseconds>(short_calls[1].at - short_calls[0].at);
  INFO("short retry after " << short_gap.count() << " ms");
  CHECK(test::came_back_after(short_calls[0], short_calls[1], 200ms));
}

TEST_CASE("A dropped message is acked, counted and gone from every queue", "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("drop"),
                                    R"("mode": "reject", "delays": ["100ms"], "max_attempts": 3)");
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    if (m.message_id() == "marker") return m.attempt == 1 ? Outcome::retry("once") : Outcome::ack();
    return Outcome::drop("a duplicate of an order already handled");
  });
  broker.publish(service.input.exchange, "key", "dup-1");
  REQUIRE(loop.run_until([&] { return c->metrics().dropped == 1; }, 10s));
  // A marker retried once: had the dropped message been retried (or handed back), it would have
  // been handled again before the marker's second attempt, which waits behind it in the tier.
  broker.publish(service.input.exchange, "key", "marker");
  REQUIRE(loop.run_until([&] { return recorder.of("marker").size() == 2; }, 30s));
  stop(loop, c);
  CHECK(recorder.of("dup-1").size() == 1);
  const auto metrics = c->metrics();
  CHECK(metrics.dropped == 1);
  CHECK(metrics.acked == 1);    // the marker
  CHECK(metrics.retried == 1);  // the marker
  CHECK(metrics.parked() == 0);
  CHECK(metrics.reconnects == 0);
  CHECK(broker.depth(topology::input_queue_name(service)) == 0);
  CHECK(broker.depth(topology::wait_queue_name(service.name, 100ms)) == 0);
  CHECK(broker.depth(topology::parking_queue_name(service.name)) == 0);
}

TEST_CASE("An asynchronous handler settles later on the loop, with each outcome",
          "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("async"),
                                    R"("mode": "reject", "delays": ["100ms"], "max_attempts": 3)");
  std::map<std::string, std::vector<consumer::Settle>> settles;
  std::map<std::string, int64_t> attempts;
  auto options = options_for(service);
  options.concurrency = 10;  // an unsettled message keeps its slot
  auto c = start(loop, options,
                 consumer::AsyncHandler([&](const consumer::Message& m, consumer::Settle settle) {
                   if (m.message_id() == "marker") return settle(Outcome::ack());
                   settles[std::string(m.message_id())].push_back(std::move(settle));
                   attempts[std::string(m.message_id())] = m.attempt;
                 }));
  for (const char* id : {"ack", "retry", "permanent", "poison", "drop"})
    broker.publish(service.input.exchange, "key", id);
  REQUIRE(loop.run_until([&] { return settles.size() == 5; }, 10s));
  // A marker settled at once, after them: had any of the five settled by itself, it would have
  // been settled by the time the marker is.
  broker.publish(service.input.exchange, "key", "marker");
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 1 && c->in_flight() == 5; }, 10s));
  CHECK(c->metrics().retried == 0);
  CHECK(c->metrics().parked() == 0);
  CHECK(c->metrics().dropped == 0);

  // Settled later, from a timer on the loop.
  uv_timer_t timer;
  uv_timer_init(loop.get(), &timer);
  timer.data = &settles;
  uv_timer_start(
      &timer,
      [](uv_timer_t* t) {
        auto& all = *static_cast<std::map<std::string, std::vector<consumer::Settle>>*>(t->data);
        all["ack"][0](Outcome::ack());
        all["retry"][0](Outcome::retry("later"));
        all["permanent"][0](Outcome::permanent("no such customer"));
        all["poison"][0](Outcome::poison("cannot decode"));
        all["drop"][0](Outcome::drop("duplicate"));
        uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
      },
      50, 0);
  REQUIRE(loop.run_until([&] { return settles["retry"].size() == 2; }, 10s));
  CHECK(attempts["retry"] == 2);
  settles["retry"][1](Outcome::ack());
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 3 && c->in_flight() == 0; }, 10s));
  stop(loop, c);

  const auto metrics = c->metrics();
  CHECK(metrics.retried == 1);
  CHECK(metrics.parked_permanent == 1);
  CHECK(metrics.parked_poison == 1);
  CHECK(metrics.dropped == 1);
  CHECK(metrics.reconnects == 0);
  std::map<std::string, std::string> reasons;
  for (const auto& p : broker.drain(topology::parking_queue_name(service.name))) {
    reasons[*p.message.properties.message_id] =
        std::string(*header(p, "retryloop-reason")->as_string());
  }
  CHECK(reasons ==
        std::map<std::string, std::string>{{"permanent", "permanent"}, {"poison", "poison"}});
  CHECK(broker.depth(topology::input_queue_name(service)) == 0);
}

TEST_CASE("An asynchronous settle called twice counts once, and the second call is ignored",
          "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("twice"),
                                    R"("mode": "reject", "delays": ["100ms"], "max_attempts": 3)");
  int calls = 0;
  auto c = start(loop, options_for(service),
                 consumer::AsyncHandler([&](const consumer::Message&, consumer::Settle settle) {
                   ++calls;
                   settle(Outcome::ack());
                   settle(Outcome::permanent("too late"));  // ignored
                   settle(Outcome::ack());                  // ignored: no double ack (406)
                 }));
  broker.publish(service.input.exchange, "key", "once");
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 1; }, 10s));
  // A second message, settled the same way, after the first: a second ack of the first would
  // have closed the channel (406) before the broker delivered this one, and a parking copy of
  // it would have been confirmed by then.
  broker.publish(service.input.exchange, "key", "marker");
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 2; }, 30s));
  stop(loop, c);
  CHECK(calls == 2);
  CHECK(c->metrics().acked == 2);
  CHECK(c->metrics().parked() == 0);
  CHECK(c->metrics().reconnects == 0);
  CHECK(broker.depth(topology::parking_queue_name(service.name)) == 0);
  CHECK(broker.depth(topology::input_queue_name(service)) == 0);
}

TEST_CASE(
    "An exception from an asynchronous handler counts as a retry, PermanentError as "
    "permanent, and never after it settled",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("athrow"),
                                    R"("mode": "reject", "delays": ["100ms"], "max_attempts": 3)");
  std::map<std::string, std::vector<int64_t>> attempts;
  auto c = start(loop, options_for(service),
                 consumer::AsyncHandler([&](const consumer::Message& m, consumer::Settle settle) {
                   const std::string id(m.message_id());
                   attempts[id].push_back(m.attempt);
                   if ((id == "throws" || id == "marker") && m.attempt == 1)
                     throw std::runtime_error("timeout");
                   if (id == "permanent") throw consumer::PermanentError("no such customer");
                   if (id == "settled-then-throws") {
                     settle(Outcome::ack());
                     throw std::runtime_error("after the settle");
                   }
                   settle(Outcome::ack());
                 }));
  for (const char* id : {"throws", "permanent", "settled-then-throws"})
    broker.publish(service.input.exchange, "key", id);
  REQUIRE(loop.run_until(
      [&] { return c->metrics().acked == 2 && c->metrics().parked_permanent == 1; }, 10s));
  // A marker that throws once, as "throws" did: a retry of "settled-then-throws" would have gone
  // through the wait queue before the marker's, and been called again before its second attempt.
  broker.publish(service.input.exchange, "key", "marker");
  REQUIRE(loop.run_until([&] { return attempts["marker"].size() == 2; }, 30s));
  stop(loop, c);
  CHECK(attempts["throws"] == std::vector<int64_t>{1, 2});
  CHECK(attempts["permanent"] == std::vector<int64_t>{1});
  CHECK(attempts["settled-then-throws"] == std::vector<int64_t>{1});
  CHECK(c->metrics().retried == 1 + 1);         // and the marker's
  CHECK(c->metrics().handler_errors == 3 + 1);  // and the marker's
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 1);
  CHECK(*parked[0].message.properties.message_id == "permanent");
  CHECK(header(parked[0], "retryloop-error")->as_string() ==
        std::optional<std::string_view>("no such customer"));
}

TEST_CASE("A handler still running at stop_now has returned before the stopped handler fires",
          "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("stopnow"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  auto options = options_for(service);
  options.handler_on_loop = false;
  std::atomic<bool> running{false};
  std::atomic<int> finished{0};
  test::Gate gate;  // the handler runs until the test opens it: still running at stop_now
  auto c = start(loop, options, [&](const consumer::Message&) {
    running = true;
    gate.pass();
    running = false;
    ++finished;
    return Outcome::ack();
  });
  broker.publish(service.input.exchange, "key", "slow");
  REQUIRE(loop.run_until([&] { return running.load(); }, 10s));

  bool stopped = false;
  bool running_when_stopped = true;
  size_t counted_when_stopped = 99;
  c->set_stopped_handler([&](const Error&) {
    running_when_stopped = running.load();
    counted_when_stopped = c->handlers_running();
    stopped = true;
  });
  c->stop_now();
  // The connections are closed at once: the broker has put the message back in its queue, while
  // stopped still waits for the handler.
  REQUIRE(test::eventually(loop,
                           [&] { return broker.depth(topology::input_queue_name(service)) == 1; }));
  CHECK_FALSE(stopped);
  CHECK(finished == 0);
  gate.open();
  REQUIRE(loop.run_until([&] { return stopped; }, 15s));
  CHECK_FALSE(running_when_stopped);
  CHECK(finished == 1);
  CHECK(counted_when_stopped == 0);
  // Its result came after the close: dropped, and the message is back in its queue.
  CHECK(c->metrics().acked == 0);
  CHECK(broker.depth(topology::input_queue_name(service)) == 1);
}

TEST_CASE(
    "A handler that outlives handler_exit_timeout is reported after stopped and can be waited "
    "for",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("stuck"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  auto options = options_for(service);
  options.handler_on_loop = false;
  options.handler_exit_timeout = 200ms;
  std::atomic<bool> running{false};
  test::Gate gate;  // the handler runs until the test opens it, long after handler_exit_timeout
  auto c = start(loop, options, [&](const consumer::Message&) {
    running = true;
    gate.pass();
    running = false;
    return Outcome::ack();
  });
  broker.publish(service.input.exchange, "key", "stuck");
  REQUIRE(loop.run_until([&] { return running.load(); }, 10s));

  bool stopped = false;
  const auto stop_at = Clock::now();
  c->set_stopped_handler([&](const Error&) { stopped = true; });
  c->stop_now();
  REQUIRE(loop.run_until([&] { return stopped; }, 15s));
  // Not held until the handler returns: stopped came while it still runs.
  CHECK(running.load());
  CHECK(c->handlers_running() == 1);
  CHECK_FALSE(c->wait_for_handlers(1ms));
  gate.open();
  CHECK(c->wait_for_handlers(20s));
  CHECK_FALSE(running.load());
  CHECK(c->handlers_running() == 0);
  INFO("waited "
       << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stop_at).count()
       << " ms in all");
  CHECK(broker.depth(topology::input_queue_name(service)) == 1);
}
