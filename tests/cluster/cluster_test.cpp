// A real 3-node RabbitMQ cluster (scripts/with-broker --nodes 3): a consumer given every node in
// one URL carries on when the node it is connected to is killed, and a quorum queue loses nothing.

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "retryloop/client/uri.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> node_dirs() {
  const char* dirs = std::getenv("RETRYLOOP_TEST_NODE_DIRS");
  if (dirs == nullptr)
    FAIL("RETRYLOOP_TEST_NODE_DIRS is not set: run through scripts/with-broker --nodes 3");
  std::vector<std::string> out;
  std::istringstream in(dirs);
  for (std::string dir; in >> dir;)
    out.push_back(dir);
  return out;
}

// The directory of the node listening on `port` (its broker.env names its AMQP port).
std::string node_on_port(uint16_t port) {
  for (const auto& dir : node_dirs()) {
    test::ChildProcess read(
        {"/bin/sh", "-c", ". '" + dir + "/broker.env' && echo $RETRYLOOP_TEST_AMQP_PORT"});
    read.wait(10000);
    if (std::stoi(read.out()) == port) return dir;
  }
  FAIL("no node listens on port " << port);
  return {};
}

int broker_script(test::TestLoop& loop, const std::string& command, const std::string& dir) {
  test::ChildProcess script({std::string(RETRYLOOP_SOURCE_DIR) + "/scripts/broker", command, dir});
  REQUIRE(loop.run_until([&] { return !script.running(); }, 180s));
  INFO(script.out() << script.err());
  return script.wait(1000);
}

}  // namespace

TEST_CASE(
    "A consumer given every node carries on when its node is killed, and the quorum queue loses "
    "nothing",
    "[cluster]") {
  test::TestLoop loop;
  const client::Uri all = client::parse_uri(test::broker_url());
  REQUIRE(all.hosts().size() == node_dirs().size());
  REQUIRE(all.hosts().size() >= 3);
  test::Broker broker(loop);
  const auto service =
      test::make_service(test::unique_name("cl"), R"("delays": ["200ms"], "max_attempts": 3)",
                         R"("queue_type": "quorum")");
  broker.apply(service);
  test::Recorder recorder;
  auto options = test::options_for(service);
  options.connection.uri = all;
  auto consumer = test::start(loop, options, [&](const consumer::Message& message) {
    recorder.add(message);
    return consumer::Outcome::ack();
  });

  // In order, the consumer's connections (and the publisher's) are on the first host: its node
  // is the one to kill.
  REQUIRE(consumer->metrics().reconnects == 0);
  const std::string victim = node_on_port(all.port);
  constexpr int before = 200, after = 200;
  for (int i = 0; i < before; ++i)
    broker.publish(service.input.exchange, "key", "before-" + std::to_string(i));
  REQUIRE(loop.run_until([&] { return recorder.size() >= before; }, 60s));
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(broker_script(loop, "kill", victim) == 0);
  REQUIRE(loop.run_until([&] { return consumer->metrics().reconnects >= 1; }, 120s));
  const auto back_in = std::chrono::steady_clock::now() - killed_at;
  WARN("consuming again " << std::chrono::duration_cast<std::chrono::milliseconds>(back_in).count()
                          << " ms after the node was killed");

  test::Broker survivor_side(loop);  // on the first host that answers: another node
  for (int i = 0; i < after; ++i)
    survivor_side.publish(service.input.exchange, "key", "after-" + std::to_string(i));
  REQUIRE(loop.run_until([&] { return recorder.size() >= before + after; }, 60s));
  std::set<std::string> ids;
  for (const auto& call : recorder.calls())
    ids.insert(call.id);
  CHECK(ids.size() == static_cast<size_t>(before + after));  // each once at least, none lost
  test::stop(loop, consumer);
  CHECK(broker_script(loop, "restart", victim) == 0);
}
