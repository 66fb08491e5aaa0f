// retryloop outbox init|list|stats|retry|purge|relay as an operator runs them, on SQLite and on
// PostgreSQL: outputs, JSON, exit codes, and the relay as a process stopped by a signal.

#include <httplib.h>
#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "retryloop/outbox/outbox.hpp"
#include "support/databases.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;

namespace {

test::CommandRun outbox_command(const std::vector<std::string>& args) {
  std::vector<std::string> argv{test::built_program("retryloop"), "outbox"};
  argv.insert(argv.end(), args.begin(), args.end());
  test::ChildProcess child(argv, {"RETRYLOOP_DB="});
  test::CommandRun run;
  run.exit_code = child.wait();
  run.out = child.out();
  run.err = child.err();
  return run;
}

}  // namespace

TEST_CASE("retryloop outbox init, list, stats, retry and purge do what an operator expects",
          "[outbox][cli]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = test::database_for(label, "cli");
  auto run = outbox_command({"init", "--db", database.url});
  CHECK(run.exit_code == 0);
  CHECK_THAT(run.out, Catch::Contains("nothing to do"));

  auto db = database.open();
  {
    store::Transaction transaction(*db);
    for (const char* body : {"a", "b", "c"}) {
      outbox::OutboxMessage message;
      message.exchange = "orders";
      message.routing_key = "order.created";
      message.body = body;
      message.message_id = std::string("m-") + body;
      outbox::enqueue(*db, message);
    }
    transaction.commit();
  }
  auto rows = outbox::list_rows(*db, std::nullopt, 10);
  db->execute(
      "UPDATE retryloop_outbox SET state = 'failed', attempts = 1, last_error = 'returned by the "
      "broker: NO_ROUTE' WHERE id IN ($1, $2)",
      {rows[0].id, rows[1].id});

  run = outbox_command({"list", "--db", database.url});
  CHECK(run.exit_code == 0);
  CHECK_THAT(run.out, Catch::Contains("m-a") && Catch::Contains("m-b") &&
                          Catch::Contains("NO_ROUTE") && !Catch::Contains("m-c"));
  run = outbox_command({"list", "--db", database.url, "--state", "all", "--json"});
  CHECK(run.exit_code == 0);
  std::istringstream lines(run.out);
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    auto row = nlohmann::json::parse(line);
    CHECK(row["exchange"] == "orders");
    CHECK(row["body"] == std::string(1, static_cast<char>('a' + count)));
  }
  CHECK(count == 3);
  run = outbox_command({"stats", "--db", database.url, "--json"});
  auto stats = nlohmann::json::parse(run.out);
  CHECK(stats["pending"] == 1);
  CHECK(stats["failed"] == 2);

  run = outbox_command({"retry", "--db", database.url, "--id", std::to_string(rows[0].id)});
  CHECK(run.exit_code == 0);
  CHECK_THAT(run.out, Catch::Contains("1 failed row back to pending"));
  run = outbox_command({"purge", "--db", database.url, "--all"});
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.err, Catch::Contains("--yes"));
  run = outbox_command({"purge", "--db", database.url, "--all", "--yes"});
  CHECK(run.exit_code == 0);
  CHECK_THAT(run.out, Catch::Contains("deleted 1 failed row"));
  CHECK(outbox::stats(*db).pending == 2);
  CHECK(outbox::stats(*db).failed == 0);

  run = outbox_command({"retry", "--db", database.url});
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.err, Catch::Contains("--id N") && Catch::Contains("--all"));
  run = outbox_command({"list", "--db", database.url, "--state", "sent"});
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.err, Catch::Contains("pending, failed, published, all"));
}

TEST_CASE("retryloop outbox refuses a database without its tables, naming init", "[outbox][cli]") {
  auto path = std::filesystem::temp_directory_path() / (test::unique_name("cli-missing") + ".db");
  auto run = outbox_command({"stats", "--db", "sqlite:" + path.string()});
  CHECK(run.exit_code == 3);
  CHECK_THAT(run.err, Catch::Contains("retryloop outbox init"));
  CHECK_FALSE(std::filesystem::exists(path));  // a read-only command creates no file

  run = outbox_command({"relay", "--db", test::postgres_url() + "?options=-csearch_path%3Dnone",
                        "--url", test::broker_url()});
  CHECK(run.exit_code == 3);
  CHECK_THAT(run.err, Catch::Contains("retryloop outbox init"));

  run = outbox_command({"stats", "--db", "postgresql://nobody@127.0.0.1:1/x?connect_timeout=2"});
  CHECK(run.exit_code == 4);
  run = outbox_command({"stats", "--db", "oracle://x"});
  CHECK(run.exit_code == 1);
}

TEST_CASE("retryloop outbox relay publishes until SIGTERM, then says what it did",
          "[outbox][cli]") {
  auto database = test::fresh_postgres("cli_relay");
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.cli");
  auto& connection = target.connection;
  const std::string& queue = target.queue;
  auto db = database.open();
  {
    store::Transaction transaction(*db);
    for (int i = 0; i < 300; ++i) {
      outbox::OutboxMessage message;
      message.routing_key = queue;
      message.body = std::to_string(i);
      outbox::enqueue(*db, message);
    }
    transaction.commit();
  }
  test::ChildProcess relay({test::built_program("retryloop"), "outbox", "relay", "--db",
                            database.url, "--url", test::broker_url(), "--metrics-listen",
                            "127.0.0.1:0"});
  REQUIRE(
      test::eventually(loop, [&] { return test::queue_depth(loop, *connection, queue) == 300; }));
  // The counters and the table's state for Prometheus, on the port it picked.
  std::smatch port;
  const std::string log = relay.err();
  REQUIRE(std::regex_search(log, port,
                            std::regex("operations endpoint on http://127\\.0\\.0\\.1:(\\d+)/")));
  std::string metrics;
  CHECK(test::eventually(loop, [&] {
    httplib::Client client("127.0.0.1", std::stoi(port[1]));
    auto reply = client.Get("/metrics");
    metrics = reply ? reply->body : "";
    return metrics.find("retryloop_outbox_published_total 300\n") != std::string::npos;
  }));
  INFO(metrics);
  CHECK_THAT(metrics, Catch::Contains("retryloop_outbox_rows{state=\"failed\"} 0") &&
                          Catch::Contains("retryloop_outbox_oldest_pending_age_seconds"));
  relay.signal(SIGTERM);
  CHECK(relay.wait() == 0);
  CHECK_THAT(relay.err(), Catch::Contains("published 300"));
  CHECK(outbox::stats(*db).pending == 0);

  // --until-idle drains what is there and exits by itself.
  {
    store::Transaction transaction(*db);
    outbox::OutboxMessage message;
    message.routing_key = queue;
    message.body = "last";
    outbox::enqueue(*db, message);
    transaction.commit();
  }
  test::ChildProcess drain({test::built_program("retryloop"), "outbox", "relay", "--db",
                            database.url, "--url", test::broker_url(), "--until-idle"});
  CHECK(drain.wait() == 0);
  CHECK(test::queue_depth(loop, *connection, queue) == 301);
}
