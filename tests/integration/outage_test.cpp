// The consumer and its service's breaker against a real broker: a dependency that is down trips
// it, nothing is charged or parked because of the outage, the dependency gets one call per probe
// interval, and the service ramps back once it answers; a consumer killed while open loses
// nothing. Each lane's broker: on 3.10 and 4.0 a quorum queue counts every requeue, so a requeue
// anywhere here would show as a redelivery.

#include <httplib.h>
#include <signal.h>
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using consumer::Outcome;
using outage::State;
using test::Broker;
using test::CommandRun;
using test::make_service;
using test::options_for;
using test::Recorder;
using test::start;
using test::stop;
using test::TestLoop;

namespace {

/// Calls a handler made while the dependency was down, when each began, and whether it was up.
struct Dependency {
  std::atomic<bool> up{false};
  std::atomic<int> calls_while_down{0};

  Outcome call() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      began.push_back(std::chrono::steady_clock::now());
    }
    if (up) return Outcome::ack();
    ++calls_while_down;
    return Outcome::unavailable("payments: connection refused");
  }

  /// The calls that began after `at`.
  int calls_after(std::chrono::steady_clock::time_point at) {
    std::lock_guard<std::mutex> lock(mutex);
    return int(std::count_if(began.begin(), began.end(), [&](auto t) { return t > at; }));
  }

  std::mutex mutex;
  std::vector<std::chrono::steady_clock::time_point> began;
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
  // When the listener first heard of the open breaker: after the consumer took back what the
  // pool had not started.
  std::optional<std::chrono::steady_clock::time_point> opened;
  options.on_breaker = [&opened, record = options.on_breaker](const outage::Event& event) {
    record(event);
    if (event.to == State::open && !opened) opened = std::chrono::steady_clock::now();
  };
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
  REQUIRE(opened);
  CHECK(has_event(events, State::open, outage::Reason::consecutive_unavailable));
  // None of the deliveries handed to the pool ahead of a free worker runs once the breaker has
  // opened: at most each of the 8 workers finishes the one it had taken, and a probe may be due.
  // (How many ran before the loop collected the 3 that tripped it depends on how busy the machine
  // is.)
  REQUIRE(loop.run_until([&] { return c->handlers_running() == 0; }, 10s));
  const int at_trip = dependency.calls_while_down;
  CHECK(dependency.calls_after(*opened) <= 8 + int(c->breaker_stats().probes));
  // It probes: for at least 2 s, and until it has probed twice (its timers run late on a loaded
  // machine), at most once per interval of the window as it was.
  const auto open_from = std::chrono::steady_clock::now();
  const bool probed = test::eventually(
      loop,
      [&] {
        return dependency.calls_while_down - at_trip >= 2 &&
               std::chrono::steady_clock::now() - open_from >= 2000ms;
      },
      60s);
  const int while_open = dependency.calls_while_down - at_trip;
  const auto window = std::chrono::steady_clock::now() - open_from;
  INFO("calls while open: " << while_open << " in "
                            << std::chrono::duration_cast<std::chrono::milliseconds>(window).count()
                            << " ms");
  CHECK(probed);
  CHECK(while_open <= int(window / 400ms) + 1);
  CHECK(c->metrics().parked() == 0);
  CHECK(c->metrics().retried == 0);
  // Held by the consumer, or never delivered: the breaker opened before the broker sent them; or
  // the probe's, running now.
  CHECK(test::eventually(loop, [&] {
    return c->held() + c->handlers_running() + broker.depth(topology::input_queue_name(service)) ==
           size_t(messages);
  }));

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
  const auto open_from = std::chrono::steady_clock::now();
  loop.run_for(1600ms);
  // At most once per interval of the window as it was (a loaded machine may stretch it).
  CHECK(calls_while_down - at_trip <=
        int((std::chrono::steady_clock::now() - open_from) / 400ms) + 1);

  up = true;
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 10; }, 20s));
  CHECK(c->metrics().parked_exhausted == 0);
  CHECK(c->metrics().parked() == 1);
  stop(loop, c);
  broker.remove(service);
}

TEST_CASE(
    "With a probe function no message reaches the handler while the breaker is open, and the "
    "probe is called once per interval instead",
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
  // For at least 1.5 s, and until it has probed twice (its timers run late on a loaded machine):
  // no handler call, and at most one probe per interval of the window as it was.
  const auto open_from = std::chrono::steady_clock::now();
  const bool probed = test::eventually(
      loop, [&] { return probes >= 2 && std::chrono::steady_clock::now() - open_from >= 1500ms; },
      60s);
  const auto window = std::chrono::steady_clock::now() - open_from;
  CHECK(probed);
  CHECK(dependency.calls_while_down == at_trip);
  CHECK(probes <= int(window / 300ms) + 1);

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
  for (int i = 0; i < 6; ++i)
    broker.publish(service.input.exchange, "key", "m-" + std::to_string(i));
  const auto published = std::chrono::steady_clock::now();
  // Held, unsettled, by the consumer (up to its prefetch), or still in the queue: waited for, as
  // a delivery on its way is neither yet.
  CHECK(test::eventually(
      loop, [&] { return c->held() + broker.depth(topology::input_queue_name(service)) == 6; }));
  // And none reaches the handler, over a second at least.
  const auto second = published + 1000ms;
  if (std::chrono::steady_clock::now() < second) {
    loop.run_for(std::chrono::duration_cast<std::chrono::milliseconds>(
        second - std::chrono::steady_clock::now()));
  }
  CHECK(calls.size() == 0);
  CHECK(c->held() + broker.depth(topology::input_queue_name(service)) == 6);

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

TEST_CASE(
    "A consumer process killed with SIGKILL while its breaker is open loses nothing and charges "
    "nothing, and started again once the dependency answers it acks every message on its first "
    "attempt",
    "[outage][integration][process]") {
  TestLoop loop;
  Broker broker(loop);
  const std::string name = test::unique_name("killedopen");
  const std::string json = R"({"services": [{"name": ")" + name + R"(", "input": {"exchange": ")" +
                           name + R"(.in", "type": "direct", "bindings": ["key"]},
      "queue_type": "quorum",
      "retry": {"mode": "republish", "delays": ["200ms"], "max_attempts": 2},
      "outage": {"consecutive_unavailable": 3, "probe_interval": "300ms"}}]})";
  const auto parsed = topology::parse_topology(json);
  REQUIRE(parsed.ok());
  const topology::Service service = parsed.topology->services.at(0);
  const std::string file = (std::filesystem::temp_directory_path() / (name + ".json")).string();
  std::ofstream(file) << json;
  broker.apply(service);

  // The dependency: 503 while down (demo_consumer takes it as unavailable), 200 once up.
  std::atomic<bool> up{false};
  std::atomic<int> calls{0};
  httplib::Server dependency;
  dependency.Get("/charge", [&](const httplib::Request&, httplib::Response& response) {
    ++calls;
    response.status = up ? 200 : 503;
  });
  const int port = dependency.bind_to_any_port("127.0.0.1");
  REQUIRE(port > 0);
  std::thread serving([&] { dependency.listen_after_bind(); });
  // Stopped and joined however the test ends: a failed REQUIRE must not leave a joinable thread.
  struct Joined {
    httplib::Server& server;
    std::thread& thread;
    ~Joined() {
      server.stop();
      if (thread.joinable()) thread.join();
    }
  } joined{dependency, serving};
  auto consumer_process = [&] {
    return std::make_unique<test::ChildProcess>(std::vector<std::string>{
        test::built_program("examples/demo_consumer"), "--url", test::broker_url(), "--topology",
        file, "--service", name, "--concurrency", "4", "--dependency",
        "http://127.0.0.1:" + std::to_string(port) + "/charge"});
  };

  const int messages = 50;
  for (int i = 0; i < messages; ++i)
    broker.publish(service.input.exchange, "key", "k-" + std::to_string(i),
                   R"({"id": "k-)" + std::to_string(i) + R"("})");
  {
    auto first = consumer_process();
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (first->err().find("breaker closed -> open") == std::string::npos &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(10ms);
    }
    REQUIRE(first->err().find("breaker closed -> open") != std::string::npos);
    // Killed once it has probed (a loaded machine may take a while to).
    while (first->err().find("open -> probing") == std::string::npos &&
           std::chrono::steady_clock::now() < until + 30s) {
      std::this_thread::sleep_for(10ms);
    }
    REQUIRE(first->err().find("open -> probing") != std::string::npos);
    first->signal(SIGKILL);
    CHECK(first->wait() == 128 + SIGKILL);
  }
  // Every message is back in its queue: none in a wait queue, none parked.
  const std::string queue = topology::input_queue_name(service);
  const auto settled = [&](uint32_t depth) {
    for (auto until = std::chrono::steady_clock::now() + 30s;
         std::chrono::steady_clock::now() < until; loop.run_for(200ms)) {
      if (broker.depth(queue) == depth) return true;
    }
    return false;
  };
  REQUIRE(settled(uint32_t(messages)));
  CHECK(broker.depth(topology::wait_queue_name(service.name, 200ms)) == 0);
  CHECK(broker.depth(topology::parking_queue_name(service.name)) == 0);

  up = true;
  auto second = consumer_process();
  // What the second process acked, by id, and the attempts it acked them at.
  const auto acks = [&] {
    std::map<std::string, int64_t> acked;
    std::istringstream lines(second->out());
    for (std::string line; std::getline(lines, line);) {
      const auto outcome = nlohmann::json::parse(line, nullptr, false);
      if (!outcome.is_object() || outcome.value("outcome", "") != "ack") continue;
      acked[outcome.value("id", "")] = outcome.value("attempt", int64_t(0));
    }
    return acked;
  };
  for (auto until = std::chrono::steady_clock::now() + 30s;
       acks().size() < size_t(messages) && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(50ms);
  }
  second->signal(SIGTERM);
  CHECK(second->wait() == 0);
  const auto acked = acks();
  CHECK(acked.size() == size_t(messages));
  for (const auto& [id, attempt] : acked) {
    INFO(id);
    CHECK(attempt == 1);
  }
  // The process's last acks reach the queue after it has exited: what this connection reads can
  // come first.
  CHECK(test::eventually(loop, [&] { return broker.depth(queue) == 0; }));
  CHECK(broker.depth(topology::parking_queue_name(service.name)) == 0);
  std::filesystem::remove(file);
  broker.remove(service);
}

namespace {

/// A topology file naming `service`, for the service commands.
struct ServiceFile {
  std::string path;
  explicit ServiceFile(const std::string& service)
      : path((std::filesystem::temp_directory_path() / (service + ".json")).string()) {
    std::ofstream(path) << R"({"services": [{"name": ")" << service
                        << R"(", "input": {"exchange": ")" << service
                        << R"(.in", "type": "direct", "bindings": ["key"]},)"
                        << R"( "retry": {"delays": ["1s"], "max_attempts": 3}}]})";
  }
  ~ServiceFile() { std::filesystem::remove(path); }
};

/// Each instance's events, in order.
struct Instances {
  std::vector<std::shared_ptr<consumer::Consumer>> consumers;
  std::vector<std::vector<outage::Event>> events;

  explicit Instances(size_t count) : events(count) {}

  bool all(const std::function<bool(const consumer::Consumer&)>& holds) const {
    for (const auto& c : consumers)
      if (!holds(*c)) return false;
    return true;
  }
  bool all_shared() const {
    return all([](const consumer::Consumer& c) { return c.breaker_shared(); });
  }
  bool all_in(State state) const {
    return all([state](const consumer::Consumer& c) { return c.breaker_state() == state; });
  }
  size_t acked() const {
    size_t total = 0;
    for (const auto& c : consumers)
      total += c->metrics().acked;
    return total;
  }
};

}  // namespace

TEST_CASE(
    "Three instances share one breaker: one trips and the others stop within a second, one "
    "probes for all, and all ramp when it succeeds",
    "[outage][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(
      test::unique_name("shared"), R"("mode": "republish", "delays": ["200ms"], "max_attempts": 2)",
      R"("queue_type": "quorum", "outage": {"consecutive_unavailable": 3,
          "probe_interval": "1s", "ramp": {"interval": "300ms"}})");
  broker.apply(service);
  // The first instance's path to the dependency fails first; the others' calls still succeed.
  std::atomic<bool> first_cut{true};
  Dependency dependency;
  dependency.up = true;
  std::atomic<int> calls_while_down{0};
  Instances instances(3);
  Recorder calls;
  for (size_t i = 0; i < 3; ++i) {
    auto options = recording(options_for(service), instances.events[i]);
    options.concurrency = 4;
    options.prefetch = 10;
    instances.consumers.push_back(start(loop, options, [&, i](const consumer::Message& message) {
      calls.add(message);
      if (i == 0 && first_cut) {
        ++calls_while_down;
        return Outcome::unavailable("payments: connection refused");
      }
      if (!dependency.up) ++calls_while_down;
      return dependency.call();
    }));
  }
  REQUIRE(loop.run_until([&] { return instances.all_shared(); }, 10s));

  const int messages = 90;
  for (int i = 0; i < messages; ++i)
    broker.publish(service.input.exchange, "key", "m-" + std::to_string(i));
  REQUIRE(loop.run_until([&] { return instances.all_in(State::open); }, 10s));
  const auto& first = instances.events[0];
  REQUIRE(has_event(first, State::open, outage::Reason::consecutive_unavailable));
  std::chrono::milliseconds tripped{0};
  for (const auto& event : first)
    if (event.to == State::open) tripped = event.at;
  for (size_t i = 1; i < 3; ++i) {
    INFO("instance " << i);
    CHECK(instances.consumers[i]->breaker_stats().trips == 0);
    CHECK(has_event(instances.events[i], State::open, outage::Reason::opened_elsewhere));
    for (const auto& event : instances.events[i]) {
      if (event.reason != outage::Reason::opened_elsewhere) continue;
      const auto took = event.at - tripped;
      INFO("stopped " << took.count() << " ms after the first instance tripped");
      CHECK(took.count() < 1000);
    }
  }

  // The whole dependency is down now: for at least 4 s, and until the service has probed twice
  // (the probes' timers run late on a loaded machine), one probe per second of the window as it
  // was, for the whole service.
  dependency.up = false;
  first_cut = false;
  const int at_trip = calls_while_down;
  const auto open_from = std::chrono::steady_clock::now();
  const bool probed_twice = test::eventually(
      loop,
      [&] {
        return calls_while_down - at_trip >= 2 &&
               std::chrono::steady_clock::now() - open_from >= 4000ms;
      },
      60s);
  const int while_open = calls_while_down - at_trip;
  const auto window = std::chrono::steady_clock::now() - open_from;
  INFO("calls while open, all instances together: "
       << while_open << " in "
       << std::chrono::duration_cast<std::chrono::milliseconds>(window).count() << " ms");
  CHECK(probed_twice);
  CHECK(while_open <= int(window / 1000ms) + 1);
  int probing_instances = 0;
  for (const auto& events : instances.events)
    if (has_event(events, State::probing, outage::Reason::probe_due)) ++probing_instances;
  CHECK(probing_instances == 1);

  dependency.up = true;
  REQUIRE(loop.run_until([&] { return instances.acked() == size_t(messages); }, 30s));
  REQUIRE(loop.run_until([&] { return instances.all_in(State::closed); }, 10s));
  int probed = 0;
  for (size_t i = 0; i < 3; ++i) {
    const auto& events = instances.events[i];
    if (has_event(events, State::ramping, outage::Reason::probe_succeeded)) {
      ++probed;
    } else {
      INFO("instance " << i);
      CHECK(has_event(events, State::ramping, outage::Reason::recovered_elsewhere));
    }
    CHECK(instances.consumers[i]->metrics().parked() == 0);
    CHECK(instances.consumers[i]->metrics().retried == 0);
  }
  CHECK(probed == 1);
  for (const auto& call : calls.calls()) {
    INFO(call.id);
    CHECK(call.attempt == 1);
    CHECK_FALSE(call.redelivered);
  }
  for (auto& c : instances.consumers)
    stop(loop, c);
  CHECK(broker.depth(topology::parking_queue_name(service.name)) == 0);
  broker.remove(service);
}

TEST_CASE(
    "retryloop service pause stops every instance and holds for an instance started later, "
    "status shows it, and resume lets them all run again",
    "[outage][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("opspause"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)",
                                    R"("outage": {"ramp": {"interval": "200ms"}})");
  broker.apply(service);
  ServiceFile file(service.name);
  Instances instances(3);
  Recorder calls;
  auto handler = [&](const consumer::Message& message) {
    calls.add(message);
    return Outcome::ack();
  };
  auto options_of = [&](size_t i) {
    auto options = recording(options_for(service), instances.events[i]);
    options.concurrency = 4;
    return options;
  };
  for (size_t i = 0; i < 2; ++i)
    instances.consumers.push_back(start(loop, options_of(i), handler));
  REQUIRE(loop.run_until([&] { return instances.all_shared(); }, 10s));

  CommandRun paused = test::run_retryloop(
      {"service", "pause", "-t", file.path, service.name, "--reason", "deploy"});
  INFO(paused.out << paused.err);
  REQUIRE(paused.exit_code == 0);
  CHECK_THAT(paused.out, Catch::Contains("paused"));
  REQUIRE(loop.run_until([&] { return instances.all_in(State::paused); }, 5s));

  // An instance started while paused joins paused.
  instances.consumers.push_back(start(loop, options_of(2), handler));
  REQUIRE(loop.run_until([&] { return instances.all_shared(); }, 10s));
  CHECK(instances.consumers[2]->breaker_state() == State::paused);
  for (int i = 0; i < 6; ++i)
    broker.publish(service.input.exchange, "key", "m-" + std::to_string(i));
  loop.run_for(1500ms);
  CHECK(calls.size() == 0);

  CommandRun status =
      test::run_retryloop({"service", "status", "-t", file.path, service.name, "--json"});
  INFO(status.out << status.err);
  REQUIRE(status.exit_code == 0);
  const auto json = nlohmann::json::parse(status.out);
  CHECK(json["state"] == "paused");
  CHECK(json["instances"] == 3);
  CHECK(json["last_signal"]["reason"] == "deploy");

  // The console shows it too, and follows the resume below as it happens.
  const std::string token = "outage-token-0123456789abcdef";
  const std::string token_file = file.path + ".token";
  std::ofstream(token_file) << token << "\n";
  test::ChildProcess console(
      {test::built_program("retryloop"), "parking", "serve", "-t", file.path, service.name, "--url",
       test::broker_url(), "--listen", "127.0.0.1:0", "--token-file", token_file},
      {"RETRYLOOP_CONSOLE_TOKEN="});
  const int port = test::console_port(console);
  INFO(console.out() + console.err());
  REQUIRE(port != 0);
  httplib::Client http("127.0.0.1", port);
  const httplib::Headers auth = {{"X-Retryloop-Token", token}};
  auto console_breaker = [&] {
    auto state = http.Get("/api/state", auth);
    if (!state || state->status != 200) return nlohmann::json();
    return nlohmann::json::parse(state->body).value("breaker", nlohmann::json());
  };
  nlohmann::json shown;
  REQUIRE(test::eventually(loop, [&] {
    shown = console_breaker();
    return shown.is_object() && shown["state"] == "paused" && shown["instances"] == 3;
  }));
  CHECK(shown["signal"]["reason"] == "deploy");
  CHECK(shown["signal"]["kind"] == "paused");

  CommandRun resumed = test::run_retryloop({"service", "resume", "-t", file.path, service.name});
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE(loop.run_until([&] { return instances.acked() == 6; }, 15s));
  REQUIRE(loop.run_until([&] { return instances.all_in(State::closed); }, 10s));
  int probed = 0;
  for (const auto& events : instances.events) {
    CHECK(has_event(events, State::paused, outage::Reason::paused));
    if (has_event(events, State::probing, outage::Reason::resumed) ||
        has_event(events, State::probing, outage::Reason::probe_due)) {
      ++probed;
    }
  }
  CHECK(probed == 1);
  for (const auto& call : calls.calls())
    CHECK_FALSE(call.redelivered);

  CommandRun after = test::run_retryloop({"service", "status", "-t", file.path, service.name});
  INFO(after.out << after.err);
  CHECK(after.exit_code == 0);
  CHECK_THAT(after.out, Catch::Contains(": closed"));
  REQUIRE(test::eventually(loop, [&] {
    shown = console_breaker();
    return shown.is_object() && shown["state"] == "closed";
  }));
  // The console listens on a queue of its own: it is not counted as an instance.
  CHECK(shown["instances"] == 3);
  console.signal(SIGTERM);
  CHECK(console.wait() == 0);
  std::filesystem::remove(token_file);
  for (auto& c : instances.consumers)
    stop(loop, c);
  broker.remove(service);
}

TEST_CASE(
    "An instance started while its service is paused runs no handler, not even for the messages "
    "delivered to it before it has read the service's state",
    "[outage][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("startpaused"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)",
                                    R"("outage": {"ramp": {"interval": "200ms"}})");
  broker.apply(service);
  ServiceFile file(service.name);
  CommandRun paused = test::run_retryloop({"service", "pause", "-t", file.path, service.name});
  INFO(paused.out << paused.err);
  REQUIRE(paused.exit_code == 0);
  const size_t messages = 20;
  for (size_t i = 0; i < messages; ++i)
    broker.publish(service.input.exchange, "key", "m-" + std::to_string(i));
  std::atomic<int> calls{0};
  auto options = options_for(service);
  options.concurrency = 8;
  options.prefetch = 50;
  auto c = start(loop, options, [&](const consumer::Message&) {
    ++calls;
    return Outcome::ack();
  });
  REQUIRE(loop.run_until([&] { return c->breaker_shared() && c->held() == messages; }, 15s));
  CHECK(c->breaker_state() == State::paused);
  CHECK(calls == 0);

  CommandRun resumed = test::run_retryloop({"service", "resume", "-t", file.path, service.name});
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE(loop.run_until([&] { return c->metrics().acked == messages; }, 15s));
  CHECK(calls == int(messages));
  // Closed once its ramp is over (200 ms steps), and the service's state says so once the signal
  // the instance sends then has reached it.
  REQUIRE(loop.run_until([&] { return c->breaker_state() == State::closed; }, 15s));
  CommandRun status;
  CHECK(test::eventually(loop, [&] {
    status = test::run_retryloop({"service", "status", "-t", file.path, service.name});
    return status.out.find(": closed") != std::string::npos;
  }));
  INFO(status.out << status.err);
  CHECK_THAT(status.out, Catch::Contains(": closed"));
  stop(loop, c);
  broker.remove(service);
}

TEST_CASE(
    "retryloop service resume on a service that is not paused sends nothing and says so, and its "
    "instances go on handling",
    "[outage][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(test::unique_name("notpaused"),
                                    R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  broker.apply(service);
  ServiceFile file(service.name);
  Instances instances(2);
  for (size_t i = 0; i < 2; ++i) {
    instances.consumers.push_back(start(loop, recording(options_for(service), instances.events[i]),
                                        [](const consumer::Message&) { return Outcome::ack(); }));
  }
  REQUIRE(loop.run_until([&] { return instances.all_shared(); }, 10s));

  CommandRun resumed = test::run_retryloop({"service", "resume", "-t", file.path, service.name});
  INFO(resumed.out << resumed.err);
  CHECK(resumed.exit_code == 0);
  CHECK_THAT(resumed.out, Catch::Contains("is not paused"));
  const size_t messages = 10;
  for (size_t i = 0; i < messages; ++i)
    broker.publish(service.input.exchange, "key", "m-" + std::to_string(i));
  REQUIRE(loop.run_until([&] { return instances.acked() == messages; }, 10s));
  for (const auto& events : instances.events)
    CHECK(events.empty());  // never open, never probing
  CommandRun status =
      test::run_retryloop({"service", "status", "-t", file.path, service.name, "--json"});
  INFO(status.out << status.err);
  REQUIRE(status.exit_code == 0);
  const auto json = nlohmann::json::parse(status.out);
  CHECK(json["state"] == "closed");
  CHECK(json["tokens_waiting"] == 0);
  for (auto& c : instances.consumers)
    stop(loop, c);
  broker.remove(service);
}

TEST_CASE(
    "The only instance of a service, stopped during an outage and started again, takes the probe "
    "token that waits for it and probes within a probe interval",
    "[outage][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(
      test::unique_name("restartopen"), R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)",
      R"("outage": {"consecutive_unavailable": 2, "probe_interval": "2s",
          "ramp": {"interval": "200ms"}})");
  broker.apply(service);
  Dependency dependency;
  auto handler = [&](const consumer::Message&) { return dependency.call(); };
  std::vector<outage::Event> first_events;
  auto first = start(loop, recording(options_for(service), first_events), handler);
  REQUIRE(loop.run_until([&] { return first->breaker_shared(); }, 10s));
  for (int i = 0; i < 5; ++i)
    broker.publish(service.input.exchange, "key", "m-" + std::to_string(i));
  REQUIRE(loop.run_until([&] { return first->breaker_state() == State::open; }, 10s));
  // Its token is delivered to it, the only consumer of the token queue, and goes back to the
  // queue when it stops.
  stop(loop, first);

  std::vector<outage::Event> events;
  auto restarted = start(loop, recording(options_for(service), events), handler);
  REQUIRE(loop.run_until([&] { return restarted->breaker_shared(); }, 10s));
  const auto joined = std::chrono::steady_clock::now();
  CHECK(restarted->breaker_state() == State::open);
  REQUIRE(loop.run_until(
      [&] { return has_event(events, State::probing, outage::Reason::probe_due); }, 30s));
  const auto waited = std::chrono::steady_clock::now() - joined;
  INFO("first probe " << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
                      << " ms after it joined");
  // One probe interval (2 s), and slack for a loaded machine; a token lost at the restart is
  // published again only after 3 intervals + 2 s (8 s).
  CHECK(waited < 5s);
  dependency.up = true;
  REQUIRE(loop.run_until([&] { return restarted->metrics().acked == 5; }, 20s));
  CHECK(restarted->metrics().parked() == 0);
  stop(loop, restarted);
  broker.remove(service);
}
