// retryloop-history on a real broker: a message that fails twice, is parked, replayed, fails again
// and is parked again carries all five events in order, in each retry mode the broker supports
// (reject: the broker moves the retries; republish: the consumer copies them; in_queue on
// RabbitMQ 4.3: the queue holds them).

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <atomic>
#include <string>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/parking/parked_json.hpp"
#include "retryloop/parking/parking.hpp"
#include "retryloop/retry/history.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using consumer::Outcome;
using test::Broker;
using test::TestLoop;

namespace {}  // namespace

TEST_CASE(
    "A message that failed twice, was parked, replayed, failed again and parked again shows the "
    "five events in order",
    "[history][integration]") {
  std::vector<std::string> modes = {"reject", "republish"};
  if (test::broker_version() != "3.10" && test::broker_version() != "4.0")
    modes.push_back("in_queue");
  for (const std::string& mode : modes) {
    INFO(mode);
    TestLoop loop;
    Broker broker(loop);
    const bool in_queue = mode == "in_queue";
    const auto service =
        test::make_service(test::unique_name("history"),
                           R"("mode": ")" + mode + R"(", "delays": ["100ms"], "max_attempts": 3)",
                           in_queue ? R"("queue_type": "quorum")" : "");
    std::atomic<bool> second_cycle{false};
    auto c = test::start(loop, test::options_for(service), [&](const consumer::Message& m) {
      if (second_cycle) return Outcome::permanent("customer 7 does not exist");
      return Outcome::retry("downstream timeout on attempt " + std::to_string(m.attempt) +
                            "\nstack trace that the history leaves out");
    });
    broker.publish(service.input.exchange, "key", "h-1");
    REQUIRE(loop.run_until([&] { return c->metrics().parked_exhausted == 1; }, 30s));

    second_cycle = true;
    bool replayed = false;
    parking::ReplayOptions replay;
    replay.note.by = "tester@host";
    REQUIRE_FALSE(parking::replay(broker.connection, service, replay,
                                  [&](const parking::ReplayResult& result) {
                                    CHECK_FALSE(result.error);
                                    CHECK(result.progress.moved == 1);
                                    replayed = true;
                                  }));
    REQUIRE(loop.run_until([&] { return replayed && c->metrics().parked_permanent == 1; }, 30s));
    test::stop(loop, c);

    const auto parked = test::list_parked(loop, broker.connection, service);
    REQUIRE(parked.size() == 1);
    const auto& headers = parked[0].message.properties.headers;
    const retry::History history = retry::read_history(headers ? &*headers : nullptr);
    CHECK(history.malformed.empty());
    CHECK(history.older == 0);
    REQUIRE(history.entries.size() == 5);
    const auto& e = history.entries;
    std::vector<std::string> outcomes;
    std::vector<int64_t> attempts;
    for (const auto& entry : e) {
      outcomes.push_back(entry.outcome);
      attempts.push_back(entry.attempt);
    }
    CHECK(outcomes == std::vector<std::string>{"retry", "retry", "parked", "replayed", "parked"});
    CHECK(attempts == std::vector<int64_t>{1, 2, 3, 3, 1});
    if (mode == "republish") {
      // The consumer wrote each retry's entry as it copied the message.
      CHECK(e[0].error == "downstream timeout on attempt 1");
      CHECK(e[1].error == "downstream timeout on attempt 2");
      CHECK(e[0].via == "republish");
      CHECK(e[0].delay_ms == std::optional<int64_t>(100));
      CHECK(e[0].at.has_value());
      CHECK_FALSE(e[0].consumer.empty());
    } else {
      // The broker moved them: recorded when the parking copy was made, without error or time
      // (the first one's time is the broker's first x-death, in reject mode).
      CHECK(e[0].via == mode);
      CHECK(e[1].via == mode);
      CHECK(e[0].error.empty());
      CHECK(e[1].at == std::nullopt);
    }
    CHECK(e[2].reason == "exhausted");
    CHECK(e[2].error == "downstream timeout on attempt 3");
    CHECK(e[2].via == mode);
    CHECK(e[3].by == "tester@host");
    CHECK(e[3].via == "cli");
    CHECK(e[4].reason == "permanent");
    CHECK(e[4].error == "customer 7 does not exist");
    for (size_t i = 2; i < e.size(); ++i) {
      INFO(i);
      REQUIRE(e[i].at.has_value());
      if (i > 2) CHECK(*e[i].at >= *e[i - 1].at);
    }

    // As `parking list --json` shows it.
    const nlohmann::json json = parking::message_json(parked[0], retry::unix_seconds());
    REQUIRE(json["history"]["entries"].size() == 5);
    CHECK(json["history"]["entries"][3]["outcome"] == "replayed");
    CHECK(json["history"]["entries"][2]["at"].is_string());
    broker.remove(service);
  }
}
