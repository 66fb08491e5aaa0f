// A real 3-node RabbitMQ cluster (scripts/with-broker --nodes 3): a consumer given every node in
// one URL carries on when the node it is connected to is killed, and a quorum queue loses nothing.

#include <catch2/catch.hpp>

#include <chrono>
#include <set>
#include <string>

#include "cluster_support.hpp"
#include "retryloop/client/uri.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace std::chrono_literals;

TEST_CASE(
    "A consumer given every node carries on when its node is killed, and the quorum queue loses "
    "nothing",
    "[cluster]") {
  test::TestLoop loop;
  const client::Uri all = client::parse_uri(test::broker_url());
  REQUIRE(all.hosts().size() == test::node_dirs().size());
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
  const std::string victim = test::node_on_port(all.port);
  constexpr int before = 200, after = 200;
  for (int i = 0; i < before; ++i)
    broker.publish(service.input.exchange, "key", "before-" + std::to_string(i));
  REQUIRE(loop.run_until([&] { return recorder.size() >= before; }, 60s));
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(test::broker_script(loop, "kill", victim) == 0);
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
  CHECK(test::broker_script(loop, "restart", victim) == 0);
}
