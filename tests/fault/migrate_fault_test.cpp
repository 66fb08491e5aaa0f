// topology migrate through a broker crash: the broker killed with SIGKILL while the migration's
// holding queue stands in for the service queue, and restarted. The instance reconnects and
// follows the migration from its record, a rerun of the command finishes it, and every message
// is handled.

#include <signal.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fault_harness.hpp"
#include "retryloop/consumer/consumer.hpp"
#include "retryloop/migrate/migration.hpp"
#include "retryloop/topology/plan.hpp"
#include "support/consumer_fixture.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace retryloop::test::fault;
using test::ChildProcess;
using test::TestLoop;

TEST_CASE(
    "The broker killed with SIGKILL mid-migration and restarted: the instance reconnects and "
    "follows the migration from its record, a rerun finishes it, and every message is handled",
    "[fault]") {
  BrokerBackUp back_up;
  TestLoop loop;
  std::optional<test::Broker> broker(std::in_place, loop);
  const std::string name = test::unique_name("migrate-crash");
  const char* const retry = R"("mode": "reject", "delays": ["1s"], "max_attempts": 5)";
  const auto classic = test::make_service(name, retry, R"("queue_type": "classic")");
  const auto quorum = test::make_service(name, retry, R"("queue_type": "quorum")");
  broker->apply(classic);
  const int count = 600;
  for (int i = 0; i < count; ++i)
    broker->publish(classic.input.exchange, "key", "m-" + std::to_string(i));
  const std::string file = (std::filesystem::temp_directory_path() / (name + ".json")).string();
  std::ofstream(file) << R"({"services": [{"name": ")" << name << R"(", "queue_type": "quorum",
      "input": {"exchange": ")"
                      << name << R"(.in", "type": "direct", "bindings": ["key"]},
      "retry": {)" << retry
                      << "}}]}";

  // One instance of the old file, whose handler holds its first message until the crash: the
  // migration then waits at its drain of the service queue for the instance to settle what it
  // took from it (its settling consumer), after the announce and the move, whatever the
  // machine's speed.
  test::Recorder handled;
  test::Gate gate;
  consumer::ConsumerOptions options = test::options_for(classic);
  options.handler_on_loop = false;
  options.prefetch = 10;
  auto instance = test::start(loop, options, [&handled, &gate](const consumer::Message& message) {
    handled.add(message);
    gate.pass(std::chrono::seconds(120));
    return consumer::Outcome::ack();
  });

  std::string output;
  {
    ChildProcess first({test::built_program("retryloop"), "topology", "migrate", file, "--url",
                        test::broker_url()});
    const std::string draining = "wait until " + name + " is empty and has no consumer";
    REQUIRE(poll_until(
        loop, std::chrono::seconds(60),
        [&] { return first.out().find(draining) != std::string::npos || !first.running(); },
        std::chrono::milliseconds(20)));
    INFO(first.out() << first.err());
    REQUIRE(first.running());
    broker.reset();  // its connection dies with the broker
    // RabbitMQ 3.10 writes a new quorum queue's Ra registration lazily, and one created moments
    // before a crash (the holding queue) can come back without a leader: have it written now.
    expect_ok(
        ctl_async(loop,
                  {"eval", "ok = dets:sync(ra_directory_reverse), ok = dets:sync(ra_log_meta)."},
                  &output),
        output);
    expect_ok(broker_script_async(loop, "kill", &output), output);
    CHECK(first.wait(60000) != 0);
  }
  gate.open();
  expect_ok(broker_script_async(loop, "restart", &output), output);

  // The instance reconnects and reads the record: the holding queue. The rerun finishes.
  broker.emplace(loop);
  std::string printed;
  const int code = run_async(
      loop,
      {test::built_program("retryloop"), "topology", "migrate", file, "--url", test::broker_url()},
      std::chrono::seconds(120), &printed);
  INFO(printed);
  REQUIRE(code == 0);
  CHECK(printed.find("migrated") != std::string::npos);

  auto all_handled = [&] {
    std::map<std::string, int> seen;
    for (const auto& call : handled.calls())
      ++seen[call.id];
    return seen.size() == size_t(count);
  };
  CHECK(poll_until(loop, std::chrono::seconds(90), all_handled));
  CHECK(instance->metrics().reconnects >= 1);
  CHECK(instance->state() == consumer::ConsumerState::consuming);
  // What the crash left unsettled (acks a classic queue had not written yet) comes again: at
  // least once, never lost. Nothing is parked, and the second copies still in the queue once
  // every message was handled are handled too (63 of them were, on a loaded machine).
  CHECK(instance->metrics().parked() == 0);
  CHECK(poll_until(loop, std::chrono::seconds(60),
                   [&] { return broker->depth(topology::input_queue_name(quorum)) == 0; }));
  test::stop(loop, instance);
  std::filesystem::remove(file);
  broker->remove(quorum);
}
