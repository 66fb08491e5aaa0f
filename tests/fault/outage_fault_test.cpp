// The shared breaker under faults: a pause that must hold through a broker restart, a breaker
// that is open when the broker restarts, and the instance that probes for the service killed
// with SIGKILL while the dependency is down.

#include <httplib.h>
#include <signal.h>
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fault_harness.hpp"
#include "retryloop/consumer/consumer.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/consumer_fixture.hpp"

using namespace retryloop;
using namespace retryloop::test::fault;
using namespace std::chrono_literals;
using outage::State;
using test::ChildProcess;
using test::TestLoop;

namespace {

/// A topology file with one quorum service and its breaker's settings.
struct ServiceFile {
  std::string name;
  std::string json;
  std::string path;
  topology::Service service;

  ServiceFile(const std::string& prefix, const std::string& outage)
      : name(test::unique_name(prefix)),
        path((std::filesystem::temp_directory_path() / (name + ".json")).string()) {
    json = R"({"services": [{"name": ")" + name + R"(", "input": {"exchange": ")" + name +
           R"(.in", "type": "direct", "bindings": ["key"]}, "queue_type": "quorum",
           "retry": {"mode": "republish", "delays": ["200ms"], "max_attempts": 2},
           "outage": )" +
           outage + "}]}";
    const auto parsed = topology::parse_topology(json);
    REQUIRE(parsed.ok());
    service = parsed.topology->services.at(0);
    std::ofstream(path) << json;
  }
  ~ServiceFile() { std::filesystem::remove(path); }
};

int retryloop_command(const std::vector<std::string>& args, std::string* output) {
  std::vector<std::string> argv{test::built_program("retryloop")};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess child(argv, {"RETRYLOOP_URL=" + test::broker_url(), "RETRYLOOP_TOPOLOGY="});
  const int code = child.wait(60000);
  *output = child.out() + child.err();
  return code;
}

/// The demo consumer's acks by message id, with the attempt of each.
std::map<std::string, int64_t> acks_of(const std::string& output) {
  std::map<std::string, int64_t> acked;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const auto outcome = nlohmann::json::parse(line, nullptr, false);
    if (!outcome.is_object() || outcome.value("outcome", "") != "ack") continue;
    acked[outcome.value("id", "")] = outcome.value("attempt", int64_t(0));
  }
  return acked;
}

/// In-process instances of `file`'s service at concurrency 4, each calling `handler`.
std::vector<std::shared_ptr<consumer::Consumer>> start_instances(
    TestLoop& loop, const ServiceFile& file, int count,
    const std::function<consumer::Outcome(const consumer::Message&)>& handler) {
  std::vector<std::shared_ptr<consumer::Consumer>> instances;
  for (int i = 0; i < count; ++i) {
    auto options = test::options_for(file.service);
    options.concurrency = 4;
    instances.push_back(test::start(loop, options, handler));
  }
  return instances;
}

bool all_of(const std::vector<std::shared_ptr<consumer::Consumer>>& instances,
            const std::function<bool(const consumer::Consumer&)>& holds) {
  for (const auto& c : instances)
    if (!holds(*c)) return false;
  return true;
}

/// Restarts the broker (stop_app, start_app) and waits until every instance has reconnected and
/// shares its breaker again.
void restart_broker(TestLoop& loop,
                    const std::vector<std::shared_ptr<consumer::Consumer>>& instances) {
  std::string output;
  expect_ok(ctl_async(loop, {"stop_app"}, &output), output);
  expect_ok(ctl_async(loop, {"start_app"}, &output), output);
  REQUIRE(loop.run_until(
      [&] {
        return all_of(instances, [](const consumer::Consumer& c) {
          return c.metrics().reconnects >= 1 && c.breaker_shared();
        });
      },
      60s));
}

size_t count(const std::string& text, const std::string& what) {
  size_t found = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++found;
  return found;
}

}  // namespace

TEST_CASE("A service paused by hand stays paused through a broker restart, and resumes after it",
          "[fault]") {
  BrokerBackUp back_up;
  ServiceFile file("pausedrestart", R"({"ramp": {"interval": "200ms"}})");
  {
    TestLoop loop;
    test::Broker broker(loop);
    broker.apply(file.service);
  }
  TestLoop loop;
  test::Recorder calls;
  auto instances = start_instances(loop, file, 2, [&](const consumer::Message& message) {
    calls.add(message);
    return consumer::Outcome::ack();
  });
  auto all = [&](const std::function<bool(const consumer::Consumer&)>& holds) {
    return all_of(instances, holds);
  };
  REQUIRE(loop.run_until([&] { return all([](auto& c) { return c.breaker_shared(); }); }, 10s));

  std::string output;
  REQUIRE(retryloop_command({"service", "pause", "-t", file.path, file.name}, &output) == 0);
  REQUIRE(loop.run_until(
      [&] { return all([](auto& c) { return c.breaker_state() == State::paused; }); }, 5s));

  restart_broker(loop, instances);
  CHECK(all([](auto& c) { return c.breaker_state() == State::paused; }));
  {
    TestLoop publishing;
    test::Broker broker(publishing);
    for (int i = 0; i < 5; ++i)
      broker.publish(file.service.input.exchange, "key", "m-" + std::to_string(i));
  }
  loop.run_for(1500ms);
  CHECK(calls.size() == 0);

  REQUIRE(retryloop_command({"service", "resume", "-t", file.path, file.name}, &output) == 0);
  REQUIRE(loop.run_until(
      [&] {
        size_t acked = 0;
        for (const auto& c : instances)
          acked += c->metrics().acked;
        return acked == 5;
      },
      15s));
  for (const auto& call : calls.calls())
    CHECK(call.attempt == 1);
  for (auto& c : instances)
    test::stop(loop, c);
  TestLoop cleaning;
  test::Broker(cleaning).remove(file.service);
}

TEST_CASE(
    "A broker restart while the breaker is open: the instances come back open, and once the "
    "dependency is up every message is acked on its first attempt, none lost or parked",
    "[fault]") {
  BrokerBackUp back_up;
  ServiceFile file("openrestart", R"({"consecutive_unavailable": 3, "probe_interval": "500ms",
                                      "ramp": {"interval": "200ms"}})");
  {
    TestLoop loop;
    test::Broker broker(loop);
    broker.apply(file.service);
  }
  TestLoop loop;
  std::atomic<bool> up{false};
  test::Recorder calls;
  auto instances = start_instances(loop, file, 2, [&](const consumer::Message& message) {
    calls.add(message);
    return up ? consumer::Outcome::ack() : consumer::Outcome::unavailable("down");
  });
  auto all = [&](const std::function<bool(const consumer::Consumer&)>& holds) {
    return all_of(instances, holds);
  };
  auto held = [](const consumer::Consumer& c) {
    return c.breaker_state() == State::open || c.breaker_state() == State::probing;
  };
  REQUIRE(loop.run_until([&] { return all([](auto& c) { return c.breaker_shared(); }); }, 10s));
  const int messages = 20;
  {
    TestLoop publishing;
    test::Broker broker(publishing);
    for (int i = 0; i < messages; ++i)
      broker.publish(file.service.input.exchange, "key", "m-" + std::to_string(i));
  }
  REQUIRE(loop.run_until([&] { return all(held); }, 10s));

  restart_broker(loop, instances);
  // The state queue kept the trip: nobody starts at full concurrency into a dependency still down.
  CHECK(all(held));
  loop.run_for(1s);
  CHECK(all(held));

  up = true;
  const bool all_acked = loop.run_until(
      [&] {
        size_t acked = 0;
        for (const auto& c : instances)
          acked += c->metrics().acked;
        return acked == size_t(messages);
      },
      30s);
  for (const auto& c : instances) {
    UNSCOPED_INFO("instance: breaker " << outage::to_string(c->breaker_state()) << ", "
                                       << c->metrics().summary());
  }
  REQUIRE(all_acked);
  for (const auto& call : calls.calls())
    CHECK(call.attempt == 1);
  for (const auto& c : instances) {
    CHECK(c->metrics().parked() == 0);
    CHECK(c->metrics().retried == 0);
  }
  for (auto& c : instances)
    test::stop(loop, c);
  TestLoop cleaning;
  test::Broker broker(cleaning);
  CHECK(broker.depth(topology::parking_queue_name(file.name)) == 0);
  CHECK(broker.depth(topology::input_queue_name(file.service)) == 0);
  broker.remove(file.service);
}

TEST_CASE(
    "The instance probing for a service killed with SIGKILL while the dependency is down: "
    "another probes, nothing is lost, charged or parked",
    "[fault]") {
  ServiceFile file("proberkilled", R"({"consecutive_unavailable": 3, "probe_interval": "500ms"})");
  {
    TestLoop loop;
    test::Broker broker(loop);
    broker.apply(file.service);
  }
  std::atomic<bool> up{false};
  std::atomic<int> calls_while_down{0};
  httplib::Server dependency;
  dependency.Get("/charge", [&](const httplib::Request&, httplib::Response& response) {
    if (!up) ++calls_while_down;
    response.status = up ? 200 : 503;
  });
  const int port = dependency.bind_to_any_port("127.0.0.1");
  REQUIRE(port > 0);
  std::thread serving([&] { dependency.listen_after_bind(); });
  struct Joined {
    httplib::Server& server;
    std::thread& thread;
    ~Joined() {
      server.stop();
      if (thread.joinable()) thread.join();
    }
  } joined{dependency, serving};
  auto instance = [&] {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        test::built_program("examples/demo_consumer"), "--url", test::broker_url(), "--topology",
        file.path, "--service", file.name, "--concurrency", "4", "--dependency",
        "http://127.0.0.1:" + std::to_string(port) + "/charge"});
  };
  std::vector<std::unique_ptr<ChildProcess>> instances;
  for (int i = 0; i < 3; ++i)
    instances.push_back(instance());
  auto wait_for = [&](const std::function<bool()>& condition, std::chrono::seconds limit) {
    for (auto until = std::chrono::steady_clock::now() + limit;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(20ms)) {
      if (condition()) return true;
    }
    return condition();
  };
  REQUIRE(wait_for(
      [&] {
        for (const auto& p : instances)
          if (p->err().find("breaker shared") == std::string::npos) return false;
        return true;
      },
      30s));

  const int messages = 60;
  {
    TestLoop loop;
    test::Broker broker(loop);
    for (int i = 0; i < messages; ++i)
      broker.publish(file.service.input.exchange, "key", "k-" + std::to_string(i),
                     R"({"id": "k-)" + std::to_string(i) + R"("})");
  }
  // The prober is the instance whose log shows probes.
  const std::string probing = "open -> probing";
  size_t prober = instances.size();
  REQUIRE(wait_for(
      [&] {
        for (size_t i = 0; i < instances.size(); ++i)
          if (count(instances[i]->err(), probing) >= 2) prober = i;
        return prober != instances.size();
      },
      30s));
  for (size_t i = 0; i < instances.size(); ++i) {
    if (i == prober) continue;
    INFO("instance " << i << ":\n" << instances[i]->err());
    CHECK(count(instances[i]->err(), probing) == 0);
  }
  instances[prober]->signal(SIGKILL);
  CHECK(instances[prober]->wait() == 128 + SIGKILL);
  const std::string killed_output = instances[prober]->out();

  // Another instance takes the token over and probes, still once per interval for the service.
  // The calls are counted from the kill to 2 s after the takeover is seen, a window whose length
  // depends on the machine: the bound is one call per 500 ms interval of the window as it was,
  // plus 6 (what the bound of 10 allowed over the 2 s it used to assume).
  const int before = calls_while_down;
  const auto killed_at = std::chrono::steady_clock::now();
  size_t next = instances.size();
  REQUIRE(wait_for(
      [&] {
        for (size_t i = 0; i < instances.size(); ++i)
          if (i != prober && count(instances[i]->err(), probing) >= 2) next = i;
        return next != instances.size();
      },
      60s));
  std::this_thread::sleep_for(2s);
  const int after_kill = calls_while_down - before;
  const auto window = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - killed_at);
  INFO("calls while down after the kill: " << after_kill << " in " << window.count() << " ms");
  CHECK(after_kill <= int(window / 500ms) + 6);

  up = true;
  auto acked_by_all = [&] {
    std::map<std::string, int64_t> acked = acks_of(killed_output);
    for (size_t i = 0; i < instances.size(); ++i) {
      if (i == prober) continue;
      for (const auto& [id, attempt] : acks_of(instances[i]->out()))
        acked[id] = attempt;
    }
    return acked;
  };
  CHECK(wait_for([&] { return acked_by_all().size() == size_t(messages); }, 30s));
  for (size_t i = 0; i < instances.size(); ++i) {
    if (i == prober) continue;
    instances[i]->signal(SIGTERM);
    CHECK(instances[i]->wait() == 0);
  }
  const auto acked = acked_by_all();
  CHECK(acked.size() == size_t(messages));
  for (const auto& [id, attempt] : acked) {
    INFO(id);
    CHECK(attempt == 1);
  }
  TestLoop loop;
  test::Broker broker(loop);
  CHECK(broker.depth(topology::parking_queue_name(file.name)) == 0);
  CHECK(broker.depth(topology::input_queue_name(file.service)) == 0);
  broker.remove(file.service);
}
