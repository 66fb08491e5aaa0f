// The consumer as a separate process (examples/demo_consumer): killed with SIGKILL mid-stream and
// started again, it loses nothing; SIGTERM stops it gracefully.

#include <signal.h>
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using test::ChildProcess;
using test::TestLoop;

namespace {

/// A topology file in the temp directory, removed on scope exit.
struct TopologyFile {
  std::string path;
  topology::Service service;

  TopologyFile(const std::string& name, const std::string& retry) {
    const std::string json =
        R"({"services": [{"name": ")" + name + R"(", "input": {"exchange": ")" + name +
        R"(.in", "type": "direct", "bindings": ["key"]}, "retry": {)" + retry + "}}]}";
    path = (std::filesystem::temp_directory_path() / (name + ".json")).string();
    std::ofstream(path) << json;
    topology::ParseResult parsed = topology::parse_topology(json);
    REQUIRE(parsed.ok());
    service = parsed.topology->services.at(0);
  }
  ~TopologyFile() { std::filesystem::remove(path); }
};

ChildProcess demo_consumer(const TopologyFile& file, const std::string& concurrency) {
  return ChildProcess({test::built_program("examples/demo_consumer"), "--url", test::broker_url(),
                       "--topology", file.path, "--service", file.service.name, "--concurrency",
                       concurrency});
}

size_t count_lines(const std::string& text) {
  return size_t(std::count(text.begin(), text.end(), '\n'));
}

/// Ids that demo_consumer printed with outcome "ack".
std::set<std::string> acked_ids(const std::string& output) {
  std::set<std::string> ids;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    auto json = nlohmann::json::parse(line, nullptr, false);
    if (json.is_object() && json.value("outcome", "") == "ack" && json["id"].is_string()) {
      ids.insert(json["id"].get<std::string>());
    }
  }
  return ids;
}

}  // namespace

TEST_CASE("A consumer killed with SIGKILL mid-stream and started again loses nothing",
          "[retry][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  TopologyFile file(test::unique_name("killed"),
                    R"("mode": "reject", "delays": ["200ms"], "max_attempts": 3)");
  const topology::Service& service = file.service;
  bool applied = false;
  REQUIRE_FALSE(topology::apply(connection, topology::make_plan(topology::Topology{{service}}),
                                [&](const topology::Report& report) {
                                  CHECK(report.ok());
                                  applied = true;
                                }));
  REQUIRE(loop.run_until([&] { return applied; }));

  // 1,000 messages: most succeed, some after a failure, some exhaust, some are permanent or
  // poison. Each handler call takes 10 ms, so that the stream lasts seconds and the kill lands
  // mid-stream, also when the test is slow to see the first 300 lines.
  std::set<std::string> expect_acked;
  std::map<std::string, std::string> expect_parked;  // message id -> reason
  for (int i = 0; i < 1000; ++i) {
    const std::string id = "k-" + std::to_string(i);
    std::string body;
    if (i % 20 == 0) {
      body = "poison " + id;
      expect_parked[id] = "poison";
    } else if (i % 20 == 1) {
      body = R"({"id": ")" + id + R"(", "permanent": "no such customer", "sleep_ms": 10})";
      expect_parked[id] = "permanent";
    } else if (i % 20 == 2) {
      body = R"({"id": ")" + id + R"(", "fail_times": 9, "sleep_ms": 10})";
      expect_parked[id] = "exhausted";
    } else {
      body = R"({"id": ")" + id + R"(", "fail_times": )" + std::to_string(i % 5 == 0 ? 1 : 0) +
             R"(, "sleep_ms": 10})";
      expect_acked.insert(id);
    }
    amqp::BasicProperties properties;
    properties.message_id = id;
    properties.delivery_mode = 2;
    test::publish_confirmed(loop, *channel, service.input.exchange, "key", properties, body);
  }

  std::string first_output;
  {
    ChildProcess first = demo_consumer(file, "4");
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (count_lines(first.out()) < 300 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(5ms);
    }
    REQUIRE(count_lines(first.out()) >= 300);
    first.signal(SIGKILL);
    CHECK(first.wait() == 128 + SIGKILL);
    first_output = first.out();
  }
  INFO("lines before the kill: " << count_lines(first_output));
  CHECK(count_lines(first_output) < 1100);  // killed mid-stream, not after the end

  ChildProcess second = demo_consumer(file, "4");
  const std::string queue = topology::input_queue_name(service);
  const std::string wait = topology::wait_queue_name(service.name, 200ms);
  const std::string parking = topology::parking_queue_name(service.name);
  bool quiet = false;
  for (auto until = std::chrono::steady_clock::now() + 60s;
       !quiet && std::chrono::steady_clock::now() < until;) {
    loop.run_for(300ms);
    quiet = test::queue_depth(loop, *connection, queue) == 0 &&
            test::queue_depth(loop, *connection, wait) == 0 &&
            test::queue_depth(loop, *connection, parking) >= expect_parked.size();
  }
  CHECK(quiet);
  loop.run_for(500ms);
  second.signal(SIGTERM);
  CHECK(second.wait() == 0);  // graceful stop on SIGTERM
  INFO(second.err());

  std::set<std::string> acked = acked_ids(first_output);
  for (const auto& id : acked_ids(second.out()))
    acked.insert(id);
  std::set<std::string> missing;
  for (const auto& id : expect_acked)
    if (acked.count(id) == 0) missing.insert(id);
  CHECK(missing.empty());

  std::map<std::string, std::string> parked;
  std::map<std::string, size_t> copies_of;
  size_t parked_copies = 0;
  for (const auto& m : test::drain_queue(loop, *connection, parking)) {
    ++parked_copies;
    ++copies_of[*m.message.properties.message_id];
    parked[*m.message.properties.message_id] =
        std::string(*m.message.properties.headers->find("retryloop-reason")->as_string());
  }
  CHECK(parked == expect_parked);
  // At-least-once: a message whose parking copy the broker had confirmed but whose ack had not
  // reached it at the kill is parked again. Its copy outlives its handler, so the bound is what
  // the consumer held at the kill (its prefetch, 200), not the 4 handlers; and with one kill, no
  // message is parked more than twice.
  INFO("parked twice: " << parked_copies - expect_parked.size());
  CHECK(parked_copies <= expect_parked.size() + 200);
  for (const auto& [id, copies] : copies_of) {
    INFO(id);
    CHECK(copies <= 2);
  }
  CHECK(test::queue_depth(loop, *connection, queue) == 0);
  test::close(loop, connection);
}
