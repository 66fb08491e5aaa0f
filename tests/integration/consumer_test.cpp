// The retry consumer against a real broker: the loop, its limits, parking, and what happens when
// things go wrong. The broker's queue contents are checked at the end of every test.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "retryloop/amqp/frame.hpp"
#include "retryloop/consumer/consumer.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using client::Error;
using consumer::Consumer;
using consumer::Outcome;
using test::Broker;
using test::Call;
using test::make_service;
using test::options_for;
using test::Recorder;
using test::start;
using test::stop;
using test::TestLoop;

namespace {

std::string header_string(const client::GetResult& message, const std::string& name) {
  const amqp::FieldValue* value = message.message.properties.headers->find(name);
  REQUIRE(value != nullptr);
  REQUIRE(value->as_string());
  return std::string(*value->as_string());
}

int64_t header_int(const client::GetResult& message, const std::string& name) {
  const amqp::FieldValue* value = message.message.properties.headers->find(name);
  REQUIRE(value != nullptr);
  REQUIRE(value->as_int64());
  return *value->as_int64();
}

std::string encoded_without_headers(amqp::BasicProperties properties) {
  properties.headers.reset();
  std::string out;
  REQUIRE_FALSE(amqp::append_header_frame(out, 1, 0, properties));
  return out;
}

/// Fails `fail_times` times (by attempt), then acks; the count comes from the message id
/// `<anything>:<fail_times>`; ids starting with "permanent" or "poison" give those outcomes.
Outcome scripted(const consumer::Message& message) {
  std::string_view id = message.message_id();
  if (id.substr(0, 9) == "permanent") return Outcome::permanent("no such customer");
  if (id.substr(0, 6) == "poison") return Outcome::poison("cannot decode the body");
  size_t colon = id.rfind(':');
  int64_t fail_times =
      colon == std::string_view::npos ? 0 : std::stoll(std::string(id.substr(colon + 1)));
  if (message.attempt <= fail_times) {
    return Outcome::retry("failure " + std::to_string(message.attempt));
  }
  return Outcome::ack();
}

}  // namespace

TEST_CASE(
    "Reject mode with max_attempts 3 runs the handler 3 times a delay apart, then parks it "
    "byte-identical",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("rj"),
                                    R"("mode": "reject", "delays": ["300ms"], "max_attempts": 3)");
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return Outcome::retry("upstream said 503 on attempt " + std::to_string(m.attempt));
  });

  amqp::BasicProperties properties;
  properties.content_type = "application/octet-stream";
  properties.content_encoding = "identity";
  properties.correlation_id = "corr-1";
  properties.priority = 3;
  properties.timestamp = 1700000000;
  properties.type = "order.created";
  properties.app_id = "shop";
  amqp::FieldTable headers;
  headers.append("tenant", "acme");
  headers.append("small", int16_t(-7));
  headers.append("raw", amqp::ByteArray{std::string("\x00\xff", 2)});
  headers.append("latin1", std::string("caf\xe9 \xc3("));  // long string, not UTF-8
  properties.headers = headers;
  const std::string body("\x00\x01binary\xff\xfe", 10);
  broker.publish(service.input.exchange, "key", "m-1", body, properties);

  const std::string parking = topology::parking_queue_name(service.name);
  REQUIRE(loop.run_until([&] { return c->metrics().parked_exhausted == 1; }, 30s));

  auto calls = recorder.of("m-1");
  REQUIRE(calls.size() == 3);
  for (size_t i = 0; i < calls.size(); ++i)
    CHECK(calls[i].attempt == int64_t(i) + 1);
  for (size_t i = 1; i < calls.size(); ++i) {
    auto gap = std::chrono::duration_cast<std::chrono::milliseconds>(calls[i].at - calls[i - 1].at);
    INFO("gap before attempt " << i + 1 << ": " << gap.count() << " ms");
    CHECK(test::came_back_after(calls[i - 1], calls[i], 300ms));  // never back before its delay
    // Not late either: it came back by the expiry of the 300 ms wait queue's head.
    CHECK(calls[i].death_queue == topology::wait_queue_name(service.name, 300ms));
  }
  stop(loop, c);

  auto parked = broker.drain(parking);
  REQUIRE(parked.size() == 1);
  const auto& p = parked[0];
  CHECK(p.message.body == body);
  CHECK(encoded_without_headers(p.message.properties) == encoded_without_headers([&] {
          auto expected = properties;
          expected.message_id = "m-1";
          expected.delivery_mode = 2;
          return expected;
        }()));
  CHECK(header_string(p, "retryloop-reason") == "exhausted");
  CHECK(header_int(p, "retryloop-attempts") == 3);
  CHECK(header_string(p, "retryloop-error") == "upstream said 503 on attempt 3");
  CHECK(header_string(p, "retryloop-queue") == topology::input_queue_name(service));
  CHECK(header_string(p, "retryloop-original-exchange") == service.input.exchange);
  CHECK(header_string(p, "retryloop-original-routing-key") == "key");
  CHECK_FALSE(header_string(p, "retryloop-consumer").empty());
  // The application's headers pass through with their type letters.
  const amqp::FieldTable& h = *p.message.properties.headers;
  CHECK(*h.find("tenant") == amqp::FieldValue("acme"));
  CHECK(*h.find("small") == amqp::FieldValue(int16_t(-7)));
  CHECK(*h.find("raw") == amqp::FieldValue(amqp::ByteArray{std::string("\x00\xff", 2)}));
  CHECK(*h.find("latin1") == amqp::FieldValue(std::string("caf\xe9 \xc3(")));

  CHECK(broker.depth(topology::input_queue_name(service)) == 0);
  CHECK(broker.depth(topology::wait_queue_name(service.name, 300ms)) == 0);
  auto metrics = c->metrics();
  CHECK(metrics.delivered == 3);
  CHECK(metrics.retried == 2);
  CHECK(metrics.acked == 0);
}

TEST_CASE("Republish mode walks the backoff tiers and the attempt count survives republishing",
          "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service =
      make_service(test::unique_name("rp"),
                   R"("mode": "republish", "delays": ["100ms", "300ms", "1s"], "max_attempts": 5)");
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return Outcome::retry("attempt " + std::to_string(m.attempt) + " failed");
  });
  broker.publish(service.input.exchange, "key", "m-1", R"({"order": 1})");
  REQUIRE(loop.run_until([&] { return c->metrics().parked_exhausted == 1; }, 60s));
  stop(loop, c);

  auto calls = recorder.of("m-1");
  REQUIRE(calls.size() == 5);
  CHECK(calls[0].death_queue.empty());
  const std::vector<std::chrono::milliseconds> delays = {100ms, 300ms, 1000ms, 1000ms};
  for (size_t i = 1; i < calls.size(); ++i) {
    CHECK(calls[i].attempt == int64_t(i) + 1);
    // The tier, exactly: the copy came back by the expiry of this attempt's delay's wait queue,
    // so not late either.
    CHECK(calls[i].death_queue == topology::wait_queue_name(service.name, delays[i - 1]));
    auto gap = std::chrono::duration_cast<std::chrono::milliseconds>(calls[i].at - calls[i - 1].at);
    INFO("gap before attempt " << i + 1 << ": " << gap.count() << " ms");
    // Never back before its tier's delay.
    CHECK(test::came_back_after(calls[i - 1], calls[i], delays[i - 1]));
  }
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 1);
  CHECK(header_int(parked[0], "retryloop-attempts") == 5);
  CHECK(header_int(parked[0], "retryloop-retries") == 4);
  CHECK(header_string(parked[0], "retryloop-original-exchange") == service.input.exchange);
  CHECK(header_string(parked[0], "retryloop-original-routing-key") == "key");
  // Each copy was stripped before it was republished: only the last wait queue's expiry is there.
  const amqp::FieldValue* x_death = parked[0].message.properties.headers->find("x-death");
  REQUIRE(x_death != nullptr);
  const amqp::FieldArray& deaths = *x_death->get_if<amqp::FieldArray>();
  REQUIRE(deaths.size() == 1);
  CHECK(*deaths[0].get_if<amqp::FieldTable>()->find("count")->as_int64() == 1);
  CHECK(*deaths[0].get_if<amqp::FieldTable>()->find("queue")->as_string() ==
        topology::wait_queue_name(service.name, 1000ms));
  CHECK(parked[0].message.body == R"({"order": 1})");
  for (auto delay : {100ms, 300ms, 1000ms}) {
    CHECK(broker.depth(topology::wait_queue_name(service.name, delay)) == 0);
  }
}

TEST_CASE("Permanent and poison outcomes park on the first attempt", "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("pp"),
                                    R"("mode": "reject", "delays": ["5s"], "max_attempts": 5)");
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return scripted(m);
  });
  broker.publish(service.input.exchange, "key", "permanent-1", "{}");
  broker.publish(service.input.exchange, "key", "poison-1", "\x01not json");
  REQUIRE(loop.run_until([&] { return c->metrics().parked() == 2; }, 10s));
  stop(loop, c);
  CHECK(recorder.size() == 2);
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 2);
  std::map<std::string, std::string> reasons;
  for (const auto& p : parked) {
    reasons[*p.message.properties.message_id] = header_string(p, "retryloop-reason");
    CHECK(header_int(p, "retryloop-attempts") == 1);
  }
  CHECK(reasons ==
        std::map<std::string, std::string>{{"permanent-1", "permanent"}, {"poison-1", "poison"}});
  CHECK(c->metrics().parked_permanent == 1);
  CHECK(c->metrics().parked_poison == 1);
}

TEST_CASE(
    "A second queue on the input exchange gets each message exactly once, however many "
    "retries",
    "[retry][integration]") {
  const std::string mode = GENERATE(std::string("reject"), std::string("republish"));
  INFO("mode " << mode);
  TestLoop loop;
  Broker broker(loop);
  const auto service =
      make_service(test::unique_name("iso"),
                   R"("mode": ")" + mode + R"(", "delays": ["100ms"], "max_attempts": 4)");
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return scripted(m);
  });
  const std::string audit = test::unique_name("audit");
  test::declare_queue(loop, *broker.channel, audit);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) {
    return broker.channel->queue_bind(audit, service.input.exchange, "key", {}, done);
  }));

  std::set<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    std::string id = "m" + std::to_string(i) + ":2";  // fails twice, then acks
    ids.insert(id);
    broker.publish(service.input.exchange, "key", id, "{}");
  }
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 5; }, 10s));
  // A marker through the same exchange, published now, is queued behind any stray copy, in the
  // service queue and in the audit queue alike: once the consumer has handled it, a stray copy
  // would have been handled (or be in the audit queue) before it.
  broker.publish(service.input.exchange, "key", "marker", "{}");
  ids.insert("marker");
  REQUIRE(loop.run_until([&] { return recorder.of("marker").size() == 1; }, 30s));
  stop(loop, c);

  CHECK(recorder.size() == 15 + 1);  // three calls for each message, one for the marker
  auto copies = broker.drain(audit);
  std::multiset<std::string> seen;
  for (const auto& m : copies)
    seen.insert(*m.message.properties.message_id);
  CHECK(seen == std::multiset<std::string>(ids.begin(), ids.end()));
  CHECK(broker.depth(topology::input_queue_name(service)) == 0);
  CHECK(broker.depth(topology::parking_queue_name(service.name)) == 0);
}

TEST_CASE(
    "A forged x-death neither crashes nor loops: the message is handled once and parked as "
    "poison if it fails",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("forged"),
                                    R"("mode": "reject", "delays": ["100ms"], "max_attempts": 3)");
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    if (m.message_id() == "marker") return m.attempt == 1 ? Outcome::retry("once") : Outcome::ack();
    return m.message_id().substr(0, 3) == "ack" ? Outcome::ack() : Outcome::retry("down");
  });
  const std::string queue = topology::input_queue_name(service);
  auto forge = [&](const std::string& id, amqp::FieldValue x_death) {
    amqp::BasicProperties properties;
    properties.headers = amqp::FieldTable{{"x-death", std::move(x_death)}};
    broker.publish("", queue, id, "{}", properties);
  };
  amqp::FieldTable string_count{{"count", amqp::FieldValue("7")},
                                {"reason", amqp::FieldValue("rejected")},
                                {"queue", amqp::FieldValue(queue)}};
  forge("retry-string-count", amqp::FieldArray{amqp::FieldValue(string_count)});
  forge("retry-not-array", amqp::FieldValue("x"));
  forge("ack-string-count", amqp::FieldArray{amqp::FieldValue(string_count)});

  REQUIRE(loop.run_until([&] { return c->metrics().parked_poison == 2 && c->metrics().acked == 1; },
                         10s));
  // A marker retried once goes through the wait queue after anything the forged messages sent
  // there (or back to their queue): its second attempt comes after any second call of theirs.
  broker.publish("", queue, "marker", "{}");
  REQUIRE(loop.run_until([&] { return recorder.of("marker").size() == 2; }, 30s));
  stop(loop, c);
  size_t forged_calls = 0;
  for (const auto& call : recorder.calls()) {
    if (call.id == "marker") continue;
    ++forged_calls;
    CHECK(call.attempt == 1);
  }
  CHECK(forged_calls == 3);  // once each: no loop
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 2);
  for (const auto& p : parked) {
    CHECK(header_string(p, "retryloop-reason") == "poison");
    CHECK_THAT(header_string(p, "retryloop-error"),
               Catch::StartsWith("cannot count attempts: x-death"));
  }
  CHECK(broker.depth(queue) == 0);
}

TEST_CASE("A parking copy the broker refuses leaves the original unacked and not lost",
          "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("full"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 2)",
                                    R"("parking": {"max_length": 1})");
  auto options = options_for(service);
  options.publish_retry = consumer::Backoff{100ms, 200ms, 2.0, 0.0};
  auto c = start(loop, options, scripted);
  const std::string parking = topology::parking_queue_name(service.name);
  const std::string queue = topology::input_queue_name(service);
  broker.publish(parking, "", "already-parked", "{}");  // the parking queue is now full

  broker.publish(service.input.exchange, "key", "permanent-1", "{}");
  REQUIRE(loop.run_until([&] { return c->metrics().publish_failures >= 2; }, 10s));
  CHECK(c->metrics().parked() == 0);
  CHECK(c->in_flight() == 1);
  CHECK(broker.depth(parking) == 1);

  // Stopped while the copy keeps failing: the original goes back to its queue.
  bool stopped = false;
  c->set_stopped_handler([&](const Error&) { stopped = true; });
  c->stop(300ms);
  REQUIRE(loop.run_until([&] { return stopped; }));
  CHECK(broker.depth(queue) == 1);

  // Room in parking again: a new consumer parks it, once.
  CHECK(broker.drain(parking).size() == 1);
  auto again = start(loop, options, scripted);
  REQUIRE(loop.run_until([&] { return again->metrics().parked_permanent == 1; }, 10s));
  stop(loop, again);
  auto parked = broker.drain(parking);
  REQUIRE(parked.size() == 1);
  CHECK(*parked[0].message.properties.message_id == "permanent-1");
  CHECK(broker.depth(queue) == 0);
}

TEST_CASE("A graceful stop lets 50 slow handlers finish and settles all of them",
          "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("graceful"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  auto options = options_for(service);
  options.handler_on_loop = false;  // the consumer's worker threads: they may block
  options.concurrency = 50;
  options.prefetch = 100;
  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  // The handlers are held until the stop has begun: none can finish (and free its slot for one
  // of the other 10) before the test stops the consumer, however slowly the 50 start.
  test::Gate gate;
  broker.apply(service);
  for (int i = 0; i < 60; ++i) {
    broker.publish("", topology::input_queue_name(service), "slow-" + std::to_string(i), "{}");
  }
  auto c = Consumer::create(loop.get(), options, [&](const consumer::Message&) {
    ++started;
    gate.pass();
    std::this_thread::sleep_for(100ms);
    ++finished;
    return Outcome::ack();
  });
  bool stopped = false;
  int finished_when_stopped = -1;
  Error stop_error(client::ClientError::not_open, "not stopped");
  c->set_stopped_handler([&](const Error& error) {
    stop_error = error;
    finished_when_stopped = finished;
    stopped = true;
  });
  REQUIRE_FALSE(c->start());
  REQUIRE(loop.run_until([&] { return started == 50; }, 30s));
  c->stop(20s);
  gate.open();
  REQUIRE(loop.run_until([&] { return stopped; }, 30s));
  // It waited for all 50 (that it closes nothing before: the conversation tests).
  CHECK(finished_when_stopped == 50);
  CHECK_FALSE(stop_error);
  CHECK(started == 50);
  CHECK(finished == 50);
  CHECK(c->metrics().acked == 50);
  CHECK(c->metrics().abandoned == 0);
  // The 10 whose handlers had not started went back to the queue, unharmed.
  CHECK(broker.depth(topology::input_queue_name(service)) == 10);
}

TEST_CASE(
    "With concurrency 1 on the worker threads, handlers run one at a time in delivery order, and a "
    "stop hands back every message whose handler had not started",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("inorder"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  auto options = options_for(service);
  options.handler_on_loop = false;
  options.concurrency = 1;
  options.prefetch = 200;
  broker.apply(service);
  const int messages = 300;
  for (int i = 0; i < messages; ++i)
    broker.publish("", topology::input_queue_name(service), std::to_string(i), "{}");
  std::atomic<int> active{0};
  std::atomic<int> most_at_once{0};
  std::mutex mutex;
  std::vector<int> handled;
  test::Gate gate;
  auto c = Consumer::create(loop.get(), options, [&](const consumer::Message& m) {
    const int now = ++active;
    if (now > most_at_once) most_at_once = now;
    size_t count = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      handled.push_back(std::stoi(std::string(m.message_id())));
      count = handled.size();
    }
    if (count == 150) gate.pass();  // the 150th waits until the stop has begun
    --active;
    return Outcome::ack();
  });
  bool stopped = false;
  c->set_stopped_handler([&](const Error&) { stopped = true; });
  REQUIRE_FALSE(c->start());
  REQUIRE(loop.run_until(
      [&] {
        std::lock_guard<std::mutex> lock(mutex);
        return handled.size() == 150;
      },
      30s));
  c->stop(20s);
  gate.open();
  REQUIRE(loop.run_until([&] { return stopped; }, 30s));
  CHECK(most_at_once == 1);
  std::lock_guard<std::mutex> lock(mutex);
  REQUIRE(handled.size() == 150);
  for (int i = 0; i < 150; ++i)
    CHECK(handled[size_t(i)] == i);
  CHECK(c->metrics().acked == 150);
  // The rest went back to the queue: handed to the workers ahead or still waiting, none lost.
  CHECK(broker.depth(topology::input_queue_name(service)) == uint32_t(messages - 150));
}

TEST_CASE(
    "Queues the consumer finds with other arguments stop it with each queue and argument named",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("drift"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  test::declare_queue(loop, *broker.channel, topology::input_queue_name(service));  // no DLX
  const std::string wait_queue = topology::wait_queue_name(service.name, 1s);
  test::declare_queue(loop, *broker.channel, wait_queue);  // no TTL
  auto c = Consumer::create(loop.get(), options_for(service), scripted);
  bool stopped = false;
  bool ready = false;
  Error error;
  c->set_ready_handler([&] { ready = true; });
  c->set_stopped_handler([&](const Error& e) {
    error = e;
    stopped = true;
  });
  REQUIRE_FALSE(c->start());
  REQUIRE(loop.run_until([&] { return stopped; }, 10s));
  CHECK_FALSE(ready);
  REQUIRE(error);
  CHECK_THAT(error.message(), Catch::Contains("x-dead-letter-exchange"));
  CHECK_THAT(error.message(), Catch::Contains(topology::input_queue_name(service)));
  CHECK_THAT(error.message(), Catch::Contains(wait_queue + " exists with other arguments"));
  CHECK(c->metrics().reconnects == 0);
  broker.remove(service);
}

TEST_CASE("A consumer whose queue is deleted is cancelled by the broker and recovers by itself",
          "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("cancel"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return Outcome::ack();
  });
  const std::string queue = topology::input_queue_name(service);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) {
    return broker.channel->queue_delete(queue, false, false,
                                        [done](const Error& e, uint32_t) { done(e); });
  }));
  REQUIRE(loop.run_until([&] { return c->metrics().reconnects == 1 && c->is_consuming(); }, 10s));
  broker.publish(service.input.exchange, "key", "after-recovery", "{}");
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 1; }, 10s));
  stop(loop, c);
  CHECK(recorder.of("after-recovery").size() == 1);
}

TEST_CASE(
    "Closing every connection from the broker mid-stream recovers by itself and loses "
    "nothing",
    "[retry][integration][broker-wide]") {
  TestLoop loop;
  auto broker = std::make_unique<Broker>(loop);
  const auto service =
      make_service(test::unique_name("closeall"),
                   R"("mode": "republish", "delays": ["200ms"], "max_attempts": 3)");
  std::set<std::string> acked;
  auto options = options_for(service);
  options.prefetch = 50;
  auto c = start(loop, options, [&](const consumer::Message& m) {
    Outcome outcome = scripted(m);
    if (outcome.kind == consumer::OutcomeKind::ack) acked.insert(std::string(m.message_id()));
    return outcome;
  });
  std::set<std::string> expected_acked;
  std::set<std::string> expected_parked;
  for (int i = 0; i < 600; ++i) {
    std::string id;
    if (i % 10 == 0) {
      id = "permanent-" + std::to_string(i);
      expected_parked.insert(id);
    } else {
      id = "m" + std::to_string(i) + (i % 3 == 0 ? ":1" : ":0");
      expected_acked.insert(id);
    }
    broker->publish(service.input.exchange, "key", id, std::string(200, 'x'));
  }
  REQUIRE(loop.run_until([&] { return c->metrics().delivered >= 100; }, 10s));
  broker.reset();  // its connection would be closed too
  REQUIRE(test::broker_ctl("close_all_connections 'test: connection reset'") == 0);
  // Quiet means: recovered, nothing in memory, nothing left in the loop's queues.
  Broker after(loop);
  const std::string queue = topology::input_queue_name(service);
  const std::string wait = topology::wait_queue_name(service.name, 200ms);
  CHECK(test::eventually(
      loop,
      [&] {
        return c->is_consuming() && c->in_flight() == 0 && after.depth(queue) == 0 &&
               after.depth(wait) == 0 && acked.size() == expected_acked.size();
      },
      60s, 200ms));
  CHECK(c->metrics().reconnects >= 1);
  stop(loop, c);

  CHECK(acked == expected_acked);
  std::set<std::string> parked;
  for (const auto& p : after.drain(topology::parking_queue_name(service.name))) {
    parked.insert(*p.message.properties.message_id);
  }
  CHECK(parked == expected_parked);
  CHECK(after.depth(queue) == 0);
  CHECK(after.depth(topology::wait_queue_name(service.name, 200ms)) == 0);
}

TEST_CASE("Under a memory alarm acks keep flowing while retry copies wait, and resume after it",
          "[retry][integration][broker-wide]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(
      test::unique_name("alarm"), R"("mode": "republish", "delays": ["200ms"], "max_attempts": 3)");
  broker.apply(service);
  for (int i = 0; i < 40; ++i) {
    broker.publish("", topology::input_queue_name(service),
                   "m" + std::to_string(i) + (i % 2 == 0 ? ":1" : ":0"), "{}");
  }
  REQUIRE(test::broker_ctl("set_vm_memory_high_watermark 0") == 0);
  struct Restore {
    ~Restore() { test::broker_ctl("set_vm_memory_high_watermark 0.4"); }
  } restore;

  auto c = start(loop, options_for(service), scripted);
  // The consuming connection never publishes, so the alarm does not stop its acks.
  // Blocked once it publishes the first copy: the broker has stopped reading that connection.
  REQUIRE(loop.run_until(
      [&] { return c->metrics().acked == 20 && c->metrics().delivered == 40 && c->is_blocked(); },
      10s));
  CHECK(c->metrics().retried == 0);
  CHECK(c->in_flight() == 20);  // unacked, their copies held back

  REQUIRE(test::broker_ctl("set_vm_memory_high_watermark 0.4") == 0);
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 40; }, 20s));
  CHECK(c->metrics().retried == 20);
  CHECK(c->metrics().reconnects == 0);
  stop(loop, c);
  CHECK(broker.depth(topology::input_queue_name(service)) == 0);
  CHECK(broker.depth(topology::parking_queue_name(service.name)) == 0);
}

TEST_CASE("The parking hooks tell of each parked message and of the depth crossing its threshold",
          "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("alert"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  auto options = options_for(service);
  std::vector<consumer::ParkedEvent> parked;
  std::vector<consumer::ParkingDepthEvent> alerts;
  options.on_parked = [&](const consumer::ParkedEvent& event) { parked.push_back(event); };
  options.parking_alert_threshold = 2;
  options.parking_check_interval = 200ms;
  options.on_parking_depth = [&](const consumer::ParkingDepthEvent& event) {
    alerts.push_back(event);
  };
  auto c = start(loop, options, scripted);
  const std::string parking = topology::parking_queue_name(service.name);

  broker.publish(service.input.exchange, "key", "permanent-1", "{}");
  broker.publish(service.input.exchange, "key", "permanent-2", "{}");
  REQUIRE(loop.run_until([&] { return parked.size() == 2; }, 10s));
  CHECK(parked[0].message_id == "permanent-1");
  CHECK(parked[0].reason == consumer::ParkReason::permanent);
  CHECK(parked[0].error == "no such customer");
  CHECK(parked[0].attempts == 1);

  // The depth as the broker counts it: the first alert is of 3, since 2 is not above 2. When it
  // fires again after the depth fell back, and only then, is checked against a scripted depth in
  // the conversation tests.
  broker.publish(service.input.exchange, "key", "poison-3", "x");
  REQUIRE(loop.run_until([&] { return alerts.size() == 1; }, 10s));
  CHECK(alerts[0].depth == 3);
  CHECK(alerts[0].threshold == 2);
  CHECK(alerts[0].queue == parking);
  stop(loop, c);
  CHECK(alerts.size() == 1);
  CHECK(broker.drain(parking).size() == 3);
}

TEST_CASE(
    "A message whose headers nest 1,000 deep is parked as poison, bytes kept, and the queue "
    "goes on",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("deep"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  Recorder recorder;
  auto c = start(loop, options_for(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return Outcome::ack();
  });
  const std::string queue = topology::input_queue_name(service);
  // pika, an independent client, builds what retryloop's own encoder refuses to.
  test::ChildProcess pika({"/usr/bin/python3", "-c", R"(
import sys, pika
sys.setrecursionlimit(100000)
deep = inner = {}
for _ in range(1000):
    inner["d"] = {}
    inner = inner["d"]
connection = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
channel = connection.channel()
channel.confirm_delivery()
channel.basic_publish("", sys.argv[2], b"deep \x00\xff body",
                      pika.BasicProperties(message_id="deep", delivery_mode=2, headers=deep),
                      mandatory=True)
connection.close()
)",
                           test::broker_url(), queue});
  REQUIRE(pika.wait() == 0);
  broker.publish(service.input.exchange, "key", "after-deep", "{}");

  REQUIRE(loop.run_until([&] { return c->metrics().parked_poison == 1 && c->metrics().acked == 1; },
                         60s));
  stop(loop, c);
  CHECK(c->metrics().reconnects == 0);
  CHECK(recorder.size() == 1);  // the handler never saw the undecodable one
  CHECK(recorder.of("after-deep").size() == 1);
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 1);
  CHECK(parked[0].message.body == std::string("deep \x00\xff body", 12));
  CHECK(header_string(parked[0], "retryloop-reason") == "poison");
  CHECK_THAT(header_string(parked[0], "retryloop-error"), Catch::Contains("nest"));
  const amqp::FieldValue* raw =
      parked[0].message.properties.headers->find("retryloop-raw-properties");
  REQUIRE(raw != nullptr);
  REQUIRE(raw->get_if<amqp::ByteArray>() != nullptr);
  // The original properties, message id and all 1,000 levels, are there byte for byte.
  const std::string& bytes = raw->get_if<amqp::ByteArray>()->bytes;
  CHECK(bytes.size() > 1000 * 6);
  CHECK(bytes.find("deep") != std::string::npos);
  CHECK(parked[0].message.properties.delivery_mode == 2);
}

namespace {

/// A consumer of `service` whose connections agree on frame_max 8192 (the smallest that every
/// RabbitMQ lane accepts), so that copies of ordinary messages can pass the limit.
consumer::ConsumerOptions small_frames(const topology::Service& service) {
  consumer::ConsumerOptions options = options_for(service);
  options.connection.uri = client::parse_uri(test::broker_url() + "?frame_max=8192");
  return options;
}

amqp::BasicProperties with_padding(size_t size) {
  amqp::BasicProperties properties;
  properties.headers = amqp::FieldTable{};
  properties.headers->append("padding", std::string(size, 'p'));
  return properties;
}

}  // namespace

TEST_CASE("A parking copy over frame_max is parked with retryloop-error shortened to fit",
          "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("fit"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  const std::string why(4000, 'e');
  auto c = start(loop, small_frames(service),
                 [&](const consumer::Message&) { return Outcome::permanent(why); });
  broker.publish(service.input.exchange, "key", "m-fit", "body", with_padding(6000));
  REQUIRE(loop.run_until([&] { return c->metrics().parked_permanent == 1; }, 20s));
  const auto metrics = c->metrics();
  stop(loop, c);
  CHECK(metrics.reconnects == 0);
  CHECK(metrics.copies_too_large == 0);
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 1);
  const std::string error = header_string(parked[0], "retryloop-error");
  CHECK(error.size() < why.size());
  CHECK(error.size() > 0);
  CHECK(why.compare(0, error.size(), error) == 0);
  CHECK(header_string(parked[0], "padding") == std::string(6000, 'p'));
  CHECK(parked[0].message.body == "body");
  CHECK(broker.depth(topology::input_queue_name(service)) == 0);
}

TEST_CASE(
    "In republish mode a retry copy over frame_max retries by reject and a parking copy is parked "
    "without its headers",
    "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(
      test::unique_name("big"), R"("mode": "republish", "delays": ["300ms"], "max_attempts": 3)");
  Recorder recorder;
  auto c = start(loop, small_frames(service), [&](const consumer::Message& m) {
    recorder.add(m);
    return m.message_id() == "m-retry" ? Outcome::retry("later") : Outcome::permanent("never");
  });
  // Headers of 10000 bytes: within the publisher's frame_max, over the consumer's.
  broker.publish(service.input.exchange, "key", "m-retry", "body-1", with_padding(10000));
  broker.publish(service.input.exchange, "key", "m-park", "body-2", with_padding(10000));
  broker.publish(service.input.exchange, "key", "m-after", "body-3");
  REQUIRE(loop.run_until(
      [&] { return c->metrics().parked_exhausted == 1 && c->metrics().parked_permanent == 2; },
      30s));
  const auto metrics = c->metrics();
  stop(loop, c);
  CHECK(metrics.reconnects == 0);
  CHECK(metrics.retried == 2);
  CHECK(metrics.copies_too_large == 4);  // two retries and two parkings
  const auto retries = recorder.of("m-retry");
  REQUIRE(retries.size() == 3);
  for (size_t i = 0; i < retries.size(); ++i)
    CHECK(retries[i].attempt == int64_t(i) + 1);
  CHECK(recorder.of("m-park").size() == 1);
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 3);
  std::map<std::string, client::GetResult> by_id;
  for (auto& p : parked)
    by_id[std::string(*p.message.properties.message_id)] = p;
  for (const char* id : {"m-retry", "m-park"}) {
    INFO(id);
    REQUIRE(by_id.count(id) == 1);
    CHECK(by_id[id].message.properties.headers->find("padding") == nullptr);
    CHECK(header_string(by_id[id], "retryloop-error").find("headers were removed") !=
          std::string::npos);
  }
  CHECK(header_string(by_id["m-retry"], "retryloop-reason") == "exhausted");
  CHECK(header_int(by_id["m-retry"], "retryloop-attempts") == 3);
  CHECK(by_id["m-retry"].message.body == "body-1");
  CHECK(by_id["m-park"].message.body == "body-2");
  CHECK(broker.depth(topology::input_queue_name(service)) == 0);
}

TEST_CASE("In reject mode a parking copy that cannot fit frame_max is parked without its headers",
          "[retry][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("bare"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  auto c = start(loop, small_frames(service),
                 [&](const consumer::Message&) { return Outcome::permanent("never"); });
  amqp::BasicProperties properties = with_padding(10000);
  properties.correlation_id = "corr-1";
  broker.publish(service.input.exchange, "key", "m-bare", "body", properties);
  REQUIRE(loop.run_until([&] { return c->metrics().parked_permanent == 1; }, 20s));
  const auto metrics = c->metrics();
  stop(loop, c);
  CHECK(metrics.reconnects == 0);
  CHECK(metrics.copies_too_large == 1);
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 1);
  CHECK(parked[0].message.body == "body");
  CHECK(parked[0].message.properties.correlation_id == std::string("corr-1"));
  CHECK(parked[0].message.properties.headers->find("padding") == nullptr);
  CHECK(header_string(parked[0], "retryloop-reason") == "permanent");
  CHECK(header_string(parked[0], "retryloop-error").find("headers were removed") !=
        std::string::npos);
  CHECK(broker.depth(topology::input_queue_name(service)) == 0);
}
