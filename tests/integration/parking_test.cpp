// The parking tools against a real broker: list, stats, replay and purge, through the library
// and through the retryloop command.

#include <httplib.h>
#include <signal.h>
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/parking/audit.hpp"
#include "retryloop/parking/parked_message.hpp"
#include "retryloop/parking/parking.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/harness.hpp"
#include "support/http_clients.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using client::Error;
using test::ChildProcess;
using test::TestLoop;

namespace {

/// A service with unique names, its topology applied, and its topology file on disk.
struct ParkedService {
  TestLoop& loop;
  std::shared_ptr<client::Connection> connection;
  std::shared_ptr<client::Channel> channel;
  topology::Service service;
  std::string file;
  std::string parking;
  std::string queue;

  ParkedService(TestLoop& l, const std::string& prefix, const std::string& queue_type = "classic")
      : loop(l) {
    const std::string name = test::unique_name(prefix);
    const std::string json = R"({"services": [{"name": ")" + name + R"(", "queue_type": ")" +
                             queue_type + R"(", "input": {"exchange": ")" + name +
                             R"(.in", "type": "direct", "bindings": ["key"]}, "retry": )" +
                             R"({"mode": "reject", "delays": ["100ms"], "max_attempts": 3}}]})";
    file = (std::filesystem::temp_directory_path() / (name + ".json")).string();
    std::ofstream(file) << json;
    service = topology::parse_topology(json).topology->services.at(0);
    parking = topology::parking_queue_name(service.name);
    queue = topology::input_queue_name(service);
    connection = test::connect(loop, test::broker_url());
    channel = test::open_channel(loop, *connection);
    REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
    bool applied = false;
    REQUIRE_FALSE(topology::apply(connection, topology::make_plan(topology::Topology{{service}}),
                                  [&](const topology::Report& report) {
                                    CHECK(report.ok());
                                    applied = true;
                                  }));
    REQUIRE(loop.run_until([&] { return applied; }));
  }
  ~ParkedService() {
    std::filesystem::remove(file);
    if (connection->is_open()) test::close(loop, connection);
  }

  /// Parks `count` messages as the consumer would (`id-<i>` unless `id_of` names them, reason by
  /// `reason_of`, parked at 1700000000 + i), with an x-death saying they failed twice in the
  /// service queue; pipelined, all confirmed.
  void park(size_t count, const std::function<std::string(size_t)>& reason_of,
            size_t body_size = 64, const std::function<std::string(size_t)>& id_of = {}) {
    size_t confirmed = 0;
    size_t failed = 0;
    for (size_t i = 0; i < count; ++i) {
      amqp::BasicProperties properties;
      properties.message_id = id_of ? id_of(i) : "id-" + std::to_string(i);
      properties.delivery_mode = 2;
      properties.content_type = "application/json";
      amqp::FieldTable death{{"count", amqp::FieldValue(int64_t(2))},
                             {"reason", amqp::FieldValue("rejected")},
                             {"queue", amqp::FieldValue(queue)},
                             {"exchange", amqp::FieldValue(service.input.exchange)}};
      amqp::FieldTable headers;
      headers.append("app", "kept");
      headers.append("x-death", amqp::FieldArray{amqp::FieldValue(death)});
      headers.append("x-first-death-queue", queue);
      // An empty reason: parked by the broker (the wait exchange's alternate exchange).
      if (!reason_of(i).empty()) headers.append("retryloop-reason", reason_of(i));
      headers.append("retryloop-attempts", int64_t(3));
      headers.append("retryloop-error", "boom " + std::to_string(i % 3) + "\nstack");
      headers.append("retryloop-queue", queue);
      headers.append("retryloop-parked-at", amqp::Timestamp{uint64_t(1700000000 + i)});
      properties.headers = std::move(headers);
      std::string body = R"({"n": )" + std::to_string(i) + "}";
      body.resize(std::max(body.size(), body_size), ' ');
      REQUIRE_FALSE(channel->publish(parking, "", properties, body, client::Mandatory::yes,
                                     [&](const client::PublishOutcome& o) {
                                       ++confirmed;
                                       if (!o.ok()) ++failed;
                                     }));
      if (channel->unconfirmed_count() >= 1000) {
        REQUIRE(loop.run_until([&] { return channel->unconfirmed_count() < 500; }));
      }
    }
    REQUIRE(loop.run_until([&] { return confirmed == count; }, 60s));
    REQUIRE(failed == 0);
  }

  std::vector<parking::ParkedMessage> list(size_t limit = 0) {
    bool done = false;
    std::vector<parking::ParkedMessage> out;
    parking::ListOptions options;
    options.limit = limit;
    REQUIRE_FALSE(parking::list(connection, service, options,
                                [&](const Error& error, std::vector<parking::ParkedMessage> m) {
                                  INFO(error.message());
                                  CHECK_FALSE(error);
                                  out = std::move(m);
                                  done = true;
                                }));
    REQUIRE(loop.run_until([&] { return done; }, 60s));
    return out;
  }

  parking::ReplayResult replay(parking::ReplayOptions options) {
    bool done = false;
    parking::ReplayResult out;
    REQUIRE_FALSE(parking::replay(connection, service, std::move(options),
                                  [&](const parking::ReplayResult& result) {
                                    out = result;
                                    done = true;
                                  }));
    REQUIRE(loop.run_until([&] { return done; }, 120s));
    INFO(out.error.message());
    CHECK_FALSE(out.error);
    return out;
  }

  uint32_t depth(const std::string& q) { return test::queue_depth(loop, *connection, q); }

  std::vector<std::string> ids(const std::vector<parking::ParkedMessage>& messages) {
    std::vector<std::string> out;
    for (const auto& m : messages)
      out.push_back(m.message_id);
    return out;
  }

  ChildProcess cli(std::vector<std::string> args) {
    std::vector<std::string> argv = {test::built_program("retryloop"), "parking"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"-t", file, service.name, "--url", test::broker_url()});
    return ChildProcess(argv);
  }
};

}  // namespace

TEST_CASE("list shows the same messages in the same order twice and leaves the depth as it was",
          "[parking][integration]") {
  TestLoop loop;
  ParkedService s(loop, "list");
  s.park(1200, [](size_t i) { return i % 2 ? "exhausted" : "poison"; });
  auto first = s.list();
  auto second = s.list();
  REQUIRE(first.size() == 1200);
  CHECK(s.ids(first) == s.ids(second));
  for (size_t i = 0; i < first.size(); ++i) {
    CHECK(first[i].message_id == "id-" + std::to_string(i));
    CHECK(first[i].position == i);
  }
  CHECK(first[3].reason == "exhausted");
  CHECK(first[3].attempts == 3);
  CHECK(first[3].error == "boom 0\nstack");
  CHECK(first[3].parked_at == 1700000003u);
  CHECK(s.depth(s.parking) == 1200);
  auto head = s.list(5);
  CHECK(s.ids(head) == std::vector<std::string>{"id-0", "id-1", "id-2", "id-3", "id-4"});
  CHECK(s.depth(s.parking) == 1200);
  CHECK(s.ids(s.list()) == s.ids(first));
}

TEST_CASE(
    "list and a dry run print messages as they read them, in order, aligned past the "
    "first thousand rows",
    "[parking][integration][cli]") {
  TestLoop loop;
  ParkedService s(loop, "stream");
  s.park(1200, [](size_t i) { return i % 2 ? "exhausted" : "poison"; });
  auto text = s.cli({"list"});
  REQUIRE(text.wait() == 0);
  std::istringstream lines(text.out());
  std::vector<std::string> rows;
  for (std::string line; std::getline(lines, line);)
    rows.push_back(line);
  REQUIRE(rows.size() == 1201);
  CHECK(rows[0].rfind("#", 0) == 0);
  // Row 1200 (past the rows that set the widths) starts its id where row 1 does.
  CHECK(rows[1].find("id-0 ") == rows[1200].find("id-1199"));
  CHECK(rows[1200].rfind("1200 ", 0) == 0);

  // The library hands each message over as it reads it and keeps none.
  std::vector<std::string> seen;
  bool done = false;
  parking::ListOptions options;
  options.on_message = [&](parking::ParkedMessage& m) { seen.push_back(m.message_id); };
  REQUIRE_FALSE(
      parking::list(s.connection, s.service, options,
                    [&](const client::Error& error, std::vector<parking::ParkedMessage> kept) {
                      CHECK_FALSE(error);
                      CHECK(kept.empty());
                      done = true;
                    }));
  REQUIRE(loop.run_until([&] { return done; }, 30s));
  REQUIRE(seen.size() == 1200);
  CHECK(seen.front() == "id-0");
  CHECK(seen.back() == "id-1199");

  auto dry = s.cli({"replay", "--dry-run", "--json", "--where", "retryloop-reason=poison"});
  REQUIRE(dry.wait() == 0);
  const std::string dry_lines = dry.out();
  CHECK(std::count(dry_lines.begin(), dry_lines.end(), '\n') == 600);
  CHECK(s.depth(s.parking) == 1200);
}

TEST_CASE("Replaying 10,000 parked messages delivers each once, fresh, and empties parking",
          "[parking][integration]") {
  TestLoop loop;
  ParkedService s(loop, "replay");
  const size_t count = 10000;
  s.park(count, [](size_t) { return "exhausted"; });

  std::map<std::string, int> handled;
  std::vector<int64_t> attempts;
  bool headers_fresh = true;
  bool marker_handled = false;
  consumer::ConsumerOptions options;
  options.service = s.service;
  options.connection.uri = client::parse_uri(test::broker_url());
  options.handler_on_loop = true;
  auto c = consumer::Consumer::create(loop.get(), options, [&](const consumer::Message& m) {
    if (m.message_id() == "marker") {
      marker_handled = true;
      return consumer::Outcome::ack();
    }
    ++handled[std::string(m.message_id())];
    attempts.push_back(m.attempt);
    const amqp::FieldTable& h = m.headers();
    if (h.find("x-death") || h.find("x-first-death-queue") || h.find("retryloop-reason") ||
        h.find("retryloop-attempts") || h.find("retryloop-error") ||
        h.find("retryloop-parked-at") || !h.find("app") || h.find("retryloop-replays") == nullptr ||
        *h.find("retryloop-replays")->as_int64() != 1) {
      headers_fresh = false;
    }
    return consumer::Outcome::ack();
  });
  bool ready = false;
  c->set_ready_handler([&] { ready = true; });
  REQUIRE_FALSE(c->start());
  REQUIRE(loop.run_until([&] { return ready; }));

  auto result = s.replay({});
  CHECK(result.progress.moved == count);
  CHECK(result.progress.skipped == 0);
  CHECK(result.progress.failed == 0);
  REQUIRE(loop.run_until([&] { return c->metrics().acked == count; }, 60s));
  // Every copy the replay made was confirmed before it reported, so a marker published now is
  // queued behind any duplicate: once it is handled, a duplicate would have been handled too.
  amqp::BasicProperties marker;
  marker.message_id = "marker";
  test::publish_confirmed(loop, *s.channel, "", s.queue, marker, "{}");
  REQUIRE(loop.run_until([&] { return marker_handled; }, 30s));
  bool stopped = false;
  c->set_stopped_handler([&](const Error&) { stopped = true; });
  c->stop(5s);
  REQUIRE(loop.run_until([&] { return stopped; }));

  CHECK(handled.size() == count);
  size_t duplicates = 0;
  for (const auto& [id, times] : handled)
    duplicates += times != 1;
  CHECK(duplicates == 0);
  CHECK(headers_fresh);
  // Fresh on RabbitMQ 3.10 too: its old x-death said two failures, the consumer counts none.
  CHECK(std::all_of(attempts.begin(), attempts.end(), [](int64_t a) { return a == 1; }));
  CHECK(s.depth(s.parking) == 0);
  CHECK(s.depth(s.queue) == 0);
}

TEST_CASE("replay --where moves only the matching messages and keeps the others in order",
          "[parking][integration]") {
  TestLoop loop;
  ParkedService s(loop, "where");
  s.park(900, [](size_t i) { return i % 3 == 0 ? "poison" : "exhausted"; });
  parking::ReplayOptions options;
  options.filter.where.push_back({"retryloop-reason", "poison"});
  auto result = s.replay(options);
  CHECK(result.progress.moved == 300);
  CHECK(result.progress.skipped == 600);

  auto moved = test::drain_queue(loop, *s.connection, s.queue);
  REQUIRE(moved.size() == 300);
  for (size_t k = 0; k < moved.size(); ++k) {
    CHECK(*moved[k].message.properties.message_id == "id-" + std::to_string(k * 3));
  }
  std::vector<std::string> expected;
  for (size_t i = 0; i < 900; ++i)
    if (i % 3 != 0) expected.push_back("id-" + std::to_string(i));
  CHECK(s.ids(s.list()) == expected);

  SECTION("--limit and --older-than narrow it further") {
    parking::ReplayOptions narrower;
    narrower.limit = 10;
    narrower.filter.older_than = std::chrono::hours(24);  // parked in 2023: all match
    CHECK(s.replay(narrower).progress.moved == 10);
    CHECK(s.depth(s.parking) == 590);
    CHECK(s.list(1)[0].message_id == expected[10]);
  }
}

TEST_CASE(
    "A replay that keeps more messages than one channel holds moves the rest and keeps "
    "every kept message in order",
    "[parking][integration]") {
  // 9,900 kept messages: the walker holds them on three channels (4,096 each), and the acks of
  // the copies after the first 4,096 go out on the later channels.
  TestLoop loop;
  ParkedService s(loop, "many.kept");
  s.park(10000, [](size_t i) { return i % 100 == 99 ? "poison" : "exhausted"; });
  parking::ReplayOptions options;
  options.filter.where.push_back({"retryloop-reason", "poison"});
  auto result = s.replay(options);
  CHECK_FALSE(result.error);
  CHECK(result.progress.moved == 100);
  CHECK(result.progress.skipped == 9900);
  CHECK(result.progress.failed == 0);

  auto moved = test::drain_queue(loop, *s.connection, s.queue);
  REQUIRE(moved.size() == 100);
  for (size_t k = 0; k < moved.size(); ++k) {
    CHECK(*moved[k].message.properties.message_id == "id-" + std::to_string(k * 100 + 99));
  }
  // The walker ends once the broker counts the kept messages back: the depth is right at once.
  CHECK(s.depth(s.parking) == 9900);
  std::vector<std::string> expected;
  for (size_t i = 0; i < 10000; ++i)
    if (i % 100 != 99) expected.push_back("id-" + std::to_string(i));
  CHECK(s.ids(s.list()) == expected);
}

TEST_CASE(
    "replay --reason unrouted moves what the broker parked, and a quorum parking queue keeps "
    "exactly the rest",
    "[parking][integration]") {
  // The kept messages are held unacked until the walk's channel closes; RabbitMQ 3.10 quorum
  // queues dropped the last moved ones' acks when the close came at once, so those were parked
  // and replayed both.
  TestLoop loop;
  ParkedService s(loop, "unrouted", "quorum");
  s.park(90, [](size_t i) { return i < 46 ? "exhausted" : ""; });
  REQUIRE(test::eventually(loop, [&] { return s.depth(s.parking) >= 90; }));
  const auto all = s.list();
  REQUIRE(all.size() == 90);
  CHECK(all[0].reason == "exhausted");
  CHECK(all[60].reason == parking::unrouted_reason);
  parking::ReplayOptions options;
  options.filter.reasons = {parking::unrouted_reason};
  options.window = 1000;
  auto result = s.replay(options);
  CHECK(result.progress.moved == 44);
  CHECK(result.progress.skipped == 46);
  std::vector<std::string> kept;
  for (size_t i = 0; i < 46; ++i)
    kept.push_back("id-" + std::to_string(i));
  // Quorum queues count a returned message back only just after the close: wait for them. A moved
  // one handed back too would come back with them; the second more lets it show.
  CHECK(test::eventually(loop, [&] { return s.depth(s.parking) >= 46; }));
  loop.run_for(1s);
  auto left = s.ids(s.list());
  std::sort(left.begin(), left.end());
  std::sort(kept.begin(), kept.end());
  CHECK(left == kept);
  CHECK(test::drain_queue(loop, *s.connection, s.queue).size() == 44);
}

TEST_CASE("An edit takes the parked message with the id and the parked time it is given",
          "[parking][integration]") {
  TestLoop loop;
  ParkedService s(loop, "pedit");
  s.park(
      3, [](size_t) { return "exhausted"; }, 64, [](size_t) { return std::string("twin"); });
  auto edit = [&](std::optional<uint64_t> parked_at) {
    parking::EditOptions options;
    options.message_id = "twin";
    options.parked_at = parked_at;
    options.body = "fixed";
    bool done = false;
    parking::EditResult out;
    REQUIRE_FALSE(
        parking::edit(s.connection, s.service, options, [&](const parking::EditResult& result) {
          out = result;
          done = true;
        }));
    REQUIRE(loop.run_until([&] { return done; }, 60s));
    INFO(out.error.message());
    CHECK_FALSE(out.error);
    return out;
  };

  const auto missed = edit(uint64_t{1600000000});  // no twin was parked then
  CHECK_FALSE(missed.found);
  CHECK_FALSE(missed.sent);
  CHECK(s.depth(s.parking) == 3);

  const auto second = edit(uint64_t{1700000001});
  CHECK(second.found);
  CHECK(second.sent);
  CHECK(second.original_removed);
  std::vector<uint64_t> left;
  for (const auto& m : s.list())
    left.push_back(m.parked_at.value_or(0));
  CHECK(left == std::vector<uint64_t>{1700000000, 1700000002});
  auto copies = test::drain_queue(loop, *s.connection, s.queue);
  REQUIRE(copies.size() == 1);
  CHECK(copies[0].message.body == "fixed");
}

TEST_CASE("replay --dry-run and purge without --yes change nothing",
          "[parking][integration][cli]") {
  TestLoop loop;
  ParkedService s(loop, "dry");
  s.park(50, [](size_t i) { return i < 20 ? "poison" : "permanent"; });
  auto before = s.ids(s.list());

  auto dry = s.cli({"replay", "--dry-run", "--where", "retryloop-reason=poison"});
  CHECK(dry.wait() == 0);
  CHECK_THAT(dry.err(), Catch::Contains("20 messages would move"));
  CHECK_THAT(dry.out(), Catch::Contains("id-19"));
  CHECK_THAT(dry.out(), !Catch::Contains("id-20"));

  auto purge = s.cli({"purge", "--where", "retryloop-reason=permanent"});
  CHECK(purge.wait() == 1);
  CHECK_THAT(purge.err(), Catch::Contains("would delete 30 messages"));

  CHECK(s.ids(s.list()) == before);
  CHECK(s.depth(s.queue) == 0);

  auto really = s.cli({"purge", "--yes", "--where", "retryloop-reason=permanent"});
  CHECK(really.wait() == 0);
  CHECK_THAT(really.out(), Catch::Contains("deleted 30 messages"));
  CHECK(s.ids(s.list()) == std::vector<std::string>(before.begin(), before.begin() + 20));
}

TEST_CASE("stats --fail-above exits 5 only above the threshold, and counts by reason and error",
          "[parking][integration][cli]") {
  TestLoop loop;
  ParkedService s(loop, "stats");
  s.park(30, [](size_t i) { return i < 10 ? "poison" : "exhausted"; });
  auto at = s.cli({"stats", "--fail-above", "30"});
  CHECK(at.wait() == 0);
  auto above = s.cli({"stats", "--fail-above", "29"});
  CHECK(above.wait() == 5);
  CHECK_THAT(above.err(), Catch::Contains("parking depth 30 is above 29"));

  auto json = s.cli({"stats", "--json"});
  REQUIRE(json.wait() == 0);
  auto stats = nlohmann::json::parse(json.out());
  CHECK(stats["depth"] == 30);
  CHECK(stats["by_reason"]["poison"] == 10);
  CHECK(stats["by_reason"]["exhausted"] == 20);
  CHECK(stats["by_error"].size() == 3);  // "boom 0", "boom 1", "boom 2": first lines only
  CHECK(stats["by_error"][0]["count"] == 10);
  // One cause: the numbers masked.
  REQUIRE(stats["by_cause"].size() == 1);
  CHECK(stats["by_cause"][0]["cause"] == "boom <n>");
  CHECK(stats["by_cause"][0]["count"] == 30);
  CHECK(stats["by_cause"][0]["distinct"] == 3);
  CHECK(stats["oldest_parked_at"] == "2023-11-14T22:13:20Z");
  auto text = s.cli({"stats"});
  REQUIRE(text.wait() == 0);
  CHECK_THAT(text.out(), Catch::Contains("by cause") && Catch::Contains("boom <n>"));
  auto exact = s.cli({"stats", "--exact"});
  REQUIRE(exact.wait() == 0);
  CHECK_THAT(exact.out(), Catch::Contains("boom 1") && !Catch::Contains("boom <n>"));
  auto by_cause = s.cli({"replay", "--dry-run", "--cause", "boom <n>", "--reason", "poison"});
  REQUIRE(by_cause.wait() == 0);
  CHECK_THAT(by_cause.err(), Catch::Contains("10 messages would move"));
  auto other_cause = s.cli({"replay", "--dry-run", "--cause", "boom 1"});
  REQUIRE(other_cause.wait() == 0);
  CHECK_THAT(other_cause.err(), Catch::Contains("0 messages would move"));
  CHECK(stats["loop_depths"][s.queue] == 0);

  auto list = s.cli({"list", "--json", "--limit", "2"});
  REQUIRE(list.wait() == 0);
  std::istringstream lines(list.out());
  std::string line;
  REQUIRE(std::getline(lines, line));
  auto first = nlohmann::json::parse(line);
  CHECK(first["message_id"] == "id-0");
  CHECK(first["reason"] == "poison");
  CHECK(first["headers"]["app"] == "kept");
  CHECK(first["body_encoding"] == "utf-8");
  CHECK(s.depth(s.parking) == 30);
}

TEST_CASE("stats with a filter counts only the matching messages and keeps the first of them",
          "[parking][integration]") {
  TestLoop loop;
  ParkedService s(loop, "statsfilter");
  s.park(30, [](size_t i) { return i < 10 ? "poison" : "exhausted"; });

  parking::StatsOptions options;
  options.filter.error_first_line = "boom 1";  // ids 1, 4, 7, ...: 10 of them
  options.filter.parked_from = 1700000000 + 5;
  options.keep = 3;
  options.loop_depths = false;
  bool done = false;
  parking::Stats stats;
  uint64_t last_scanned = 0;
  REQUIRE_FALSE(parking::stats(
      s.connection, s.service, options,
      [&](const Error& error, const parking::Stats& result) {
        CHECK_FALSE(error);
        stats = result;
        done = true;
      },
      [&](const parking::Progress& progress) { last_scanned = progress.scanned; }));
  REQUIRE(loop.run_until([&] { return done; }, 60s));
  CHECK(stats.depth == 30);
  CHECK(stats.scanned == 30);
  CHECK(last_scanned == 30);
  CHECK(stats.matched == 8);  // 7, 10, ..., 28
  CHECK(stats.by_reason == std::map<std::string, uint64_t>{{"poison", 1}, {"exhausted", 7}});
  REQUIRE(stats.by_error.size() == 1);
  CHECK(stats.by_error[0] == std::make_pair(std::string("boom 1"), uint64_t(8)));
  CHECK(stats.oldest_parked_at == uint64_t(1700000007));
  CHECK(s.ids(stats.messages) == std::vector<std::string>{"id-7", "id-10", "id-13"});
  CHECK(stats.loop_depths.empty());
  CHECK(s.depth(s.parking) == 30);
  CHECK(s.ids(s.list()).size() == 30);
}

TEST_CASE("stats keeps at most kept_body_bytes of each kept body, whole characters, and the size",
          "[parking][integration]") {
  TestLoop loop;
  ParkedService s(loop, "statsbody");
  s.park(
      2, [](size_t) { return "poison"; }, 4096);
  amqp::BasicProperties properties;
  properties.message_id = "text";
  const std::string text =
      std::string(999, 'a') + "\xC3\xA9\xC3\xA9";  // 999 + two 2-byte characters
  test::publish_confirmed(loop, *s.channel, s.parking, "", properties, text);

  parking::StatsOptions options;
  options.keep = 3;
  options.kept_body_bytes = 1000;
  options.loop_depths = false;
  bool done = false;
  parking::Stats stats;
  REQUIRE_FALSE(parking::stats(s.connection, s.service, options,
                               [&](const Error& error, parking::Stats result) {
                                 CHECK_FALSE(error);
                                 stats = std::move(result);
                                 done = true;
                               }));
  REQUIRE(loop.run_until([&] { return done; }, 60s));
  REQUIRE(stats.messages.size() == 3);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(stats.messages[i].body_size == 4096);
    CHECK(stats.messages[i].message.body.size() == 1000);
    CHECK(stats.messages[i].message.body.rfind(R"({"n": )" + std::to_string(i) + "}", 0) == 0);
  }
  CHECK(stats.messages[2].body_size == text.size());
  CHECK(stats.messages[2].message.body == std::string(999, 'a'));  // not half of an é
  CHECK(s.list().at(0).message.body.size() == 4096);
}

TEST_CASE("replay killed with SIGKILL halfway loses nothing and duplicates at most its window",
          "[parking][integration][cli]") {
  TestLoop loop;
  ParkedService s(loop, "killreplay");
  const size_t count = 15000;
  const size_t window = 100;
  s.park(
      count, [](size_t) { return "exhausted"; }, 1024);

  auto replay = s.cli({"replay", "--window", std::to_string(window)});
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (s.depth(s.queue) < count / 4 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  replay.signal(SIGKILL);
  CHECK(replay.wait() == 128 + SIGKILL);
  // The broker requeues what the dead replay held once it sees the connection gone, which takes
  // what it takes on a loaded machine: wait until its consumer is gone from the parking queue
  // (the held messages go back in the same step) and every message is accounted for again.
  CHECK(test::eventually(
      loop,
      [&] {
        const client::QueueInfo parking = test::queue_info(loop, *s.connection, s.parking);
        return parking.consumer_count == 0 && parking.message_count + s.depth(s.queue) >= count;
      },
      60s));

  const uint32_t moved = s.depth(s.queue);
  const uint32_t parked = s.depth(s.parking);
  INFO("moved " << moved << ", still parked " << parked);
  CHECK(moved > 0);
  CHECK(parked > 0);  // really halfway
  CHECK(moved + parked >= count);
  CHECK(moved + parked <= count + window);

  std::map<std::string, int> seen;
  for (const auto& m : test::drain_queue(loop, *s.connection, s.queue)) {
    ++seen[*m.message.properties.message_id];
  }
  for (const auto& m : test::drain_queue(loop, *s.connection, s.parking)) {
    ++seen[*m.message.properties.message_id];
  }
  CHECK(seen.size() == count);
  size_t duplicates = 0;
  for (const auto& [id, times] : seen)
    duplicates += size_t(times - 1);
  CHECK(duplicates <= window);
}

TEST_CASE(
    "replay --to QUEUE moves parked messages to that queue only, fresh and without an "
    "expiration",
    "[parking][integration][cli]") {
  TestLoop loop;
  ParkedService s(loop, "replayto");
  s.park(20, [](size_t) { return "exhausted"; });
  // Parked with a per-message TTL (by an older version, or by hand), long enough that the
  // replay reads it before it expires in parking however loaded the machine is.
  amqp::BasicProperties ttl;
  ttl.message_id = "with-ttl";
  ttl.delivery_mode = 2;
  ttl.expiration = "60000";
  test::publish_confirmed(loop, *s.channel, s.parking, "", ttl, "{}");
  // A plain queue: it dead-letters nowhere, so an expired copy would be gone.
  const std::string target = test::unique_name("replayto.target");
  test::declare_queue(loop, *s.channel, target);

  auto missing = s.cli({"replay", "--to", target + ".missing"});
  CHECK(missing.wait() == 3);
  CHECK_THAT(missing.err(), Catch::Contains(target + ".missing"));
  CHECK(s.depth(s.parking) == 21);

  auto replay = s.cli({"replay", "--to", target});
  CHECK(replay.wait() == 0);
  INFO(replay.err());
  CHECK(s.depth(s.parking) == 0);
  CHECK(s.depth(s.queue) == 0);  // the service's own queue got nothing

  // Each copy carries no expiration (checked below), so none can expire in the target queue.
  auto moved = test::drain_queue(loop, *s.connection, target);
  REQUIRE(moved.size() == 21);
  std::set<std::string> ids;
  for (const auto& m : moved) {
    ids.insert(*m.message.properties.message_id);
    const amqp::FieldTable& h = *m.message.properties.headers;
    CHECK(h.find("retryloop-reason") == nullptr);
    CHECK(h.find("x-death") == nullptr);
    CHECK(h.find("retryloop-replays")->as_int64() == std::optional<int64_t>(1));
    CHECK_FALSE(m.message.properties.expiration);
  }
  CHECK(ids.size() == 21);
  CHECK(ids.count("with-ttl") == 1);
  for (const auto& m : moved) {
    if (*m.message.properties.message_id != "with-ttl") continue;
    const amqp::FieldValue* kept =
        m.message.properties.headers->find("retryloop-original-expiration");
    REQUIRE(kept != nullptr);
    CHECK(kept->as_string() == std::optional<std::string_view>("60000"));
  }
}

TEST_CASE(
    "replay never has more copies awaiting confirms than its window, also across consumer "
    "restarts",
    "[parking][integration]") {
  TestLoop loop;
  ParkedService s(loop, "window");
  const size_t count = 3000;
  const uint16_t window = 20;
  // Ten that move, ten that stay (held until the end, they make the walker restart its
  // consumer with ten copies maybe in flight), then a window's worth that move, and again.
  s.park(count, [](size_t i) { return i % 40 >= 10 && i % 40 < 20 ? "permanent" : "exhausted"; });
  parking::ReplayOptions options;
  options.window = window;
  options.filter.where.push_back({"retryloop-reason", "exhausted"});
  uint64_t most_in_flight = 0;
  bool done = false;
  parking::ReplayResult result;
  REQUIRE_FALSE(parking::replay(
      s.connection, s.service, options,
      [&](const parking::ReplayResult& r) {
        result = r;
        done = true;
      },
      nullptr,
      [&](const parking::Progress& p) {
        // Read, minus kept, settled and refused: copies published and not yet confirmed.
        most_in_flight = std::max(most_in_flight, p.scanned - p.skipped - p.moved - p.failed);
      }));
  REQUIRE(loop.run_until([&] { return done; }, 120s));
  INFO(result.error.message());
  CHECK_FALSE(result.error);
  CHECK(result.progress.moved == 2250);
  CHECK(result.progress.skipped == 750);
  INFO("most copies in flight at once: " << most_in_flight);
  CHECK(most_in_flight > 0);
  CHECK(most_in_flight <= window);
  CHECK(s.depth(s.queue) == 2250);
  // The messages replay kept are handed back when its channel closes; RabbitMQ 4.x may count
  // them only just after the close-ok.
  test::eventually(loop, [&] { return s.depth(s.parking) >= 750; });
  CHECK(s.depth(s.parking) == 750);
}

namespace {

/// `retryloop parking serve` for a quorum service whose parking queue the test declared itself.
struct ServedQueue {
  TestLoop& loop;
  std::string name = test::unique_name("servelimit");
  std::string file;
  std::shared_ptr<client::Connection> connection;

  ServedQueue(TestLoop& l, amqp::FieldTable parking_arguments) : loop(l) {
    file = (std::filesystem::temp_directory_path() / (name + ".json")).string();
    std::ofstream(file) << R"({"services": [{"name": ")" + name +
                               R"(", "queue_type": "quorum", "input": {"exchange": ")" + name +
                               R"(.in", "type": "direct", "bindings": ["key"]}, "retry": )" +
                               R"({"mode": "reject", "delays": ["100ms"], "max_attempts": 3}}]})";
    connection = test::connect(loop, test::broker_url());
    auto channel = test::open_channel(loop, *connection);
    client::QueueOptions options;
    options.arguments = std::move(parking_arguments);
    options.arguments.set("x-queue-type", "quorum");
    test::declare_queue(loop, *channel, topology::parking_queue_name(name), options);
  }
  ~ServedQueue() {
    auto channel = test::open_channel(loop, *connection);
    (void)test::wait(loop, [&](auto done) {
      return channel->queue_delete(topology::parking_queue_name(name), false, false,
                                   [done](const Error& error, uint32_t) { done(error); });
    });
    test::close(loop, connection);
    std::filesystem::remove(file);
  }

  ChildProcess serve(std::vector<std::string> args, const std::string& listen = "127.0.0.1:0") {
    std::vector<std::string> argv = {test::built_program("retryloop"),
                                     "parking",
                                     "serve",
                                     "-t",
                                     file,
                                     name,
                                     "--url",
                                     test::broker_url(),
                                     "--listen",
                                     listen};
    argv.insert(argv.end(), args.begin(), args.end());
    return ChildProcess(argv, {"RETRYLOOP_CONSOLE_TOKEN="});
  }
};

}  // namespace

TEST_CASE(
    "parking serve refuses a quorum parking queue whose delivery limit scans could reach, unless "
    "--allow-counted-reads",
    "[parking][integration][cli]") {
  TestLoop loop;
  SECTION("declared with another limit: drift, on every version") {
    ServedQueue queue(loop, amqp::FieldTable{{"x-delivery-limit", amqp::FieldValue(int64_t(20))}});
    ChildProcess console = queue.serve({});
    CHECK(console.wait() == 3);
    INFO(console.err());
    CHECK_THAT(console.err(),
               Catch::Contains("x-delivery-limit: the file wants 1000000, the broker has 20"));
    CHECK_THAT(console.err(), Catch::Contains("--allow-counted-reads"));
    CHECK(console.out().find("open") == std::string::npos);
  }
  SECTION("declared without a limit: RabbitMQ 4 gives it 20; 3.x none") {
    ServedQueue queue(loop, {});
    ChildProcess console = queue.serve({});
    if (test::broker_is_4x()) {
      CHECK(console.wait() == 3);
      INFO(console.err());
      CHECK_THAT(console.err(), Catch::Contains("declared without x-delivery-limit"));
      CHECK_THAT(console.err(), Catch::Contains("\"delivery-limit\": 1000000"));
      CHECK_THAT(console.err(), Catch::Contains("--allow-counted-reads"));
    } else {
      CHECK(console_port(console) != 0);
      console.signal(SIGTERM);
      CHECK(console.wait() == 0);
    }
  }
  SECTION("--allow-counted-reads serves it; the token comes from --token-file and is not shown") {
    ServedQueue queue(loop, {});
    const std::string token = "file-token-0123456789abcdef";
    const std::string token_file = queue.file + ".token";
    std::ofstream(token_file) << token << "\n";
    ChildProcess console = queue.serve({"--allow-counted-reads", "--token-file", token_file});
    const int port = console_port(console);
    INFO(console.out() + console.err());
    REQUIRE(port != 0);
    CHECK(console.out().find(token) == std::string::npos);
    httplib::Client http("127.0.0.1", port);
    auto refused = http.Get("/api/state", {{"X-Retryloop-Token", token + "x"}});
    REQUIRE(refused);
    CHECK(refused->status == 403);
    auto state = http.Get("/api/state", {{"X-Retryloop-Token", token}});
    REQUIRE(state);
    CHECK(state->status == 200);
    CHECK(nlohmann::json::parse(state->body).at("parking_queue") ==
          topology::parking_queue_name(queue.name));
    console.signal(SIGTERM);
    CHECK(console.wait() == 0);

    ChildProcess both = queue.serve({"--token-file", token_file, "--token", token});
    CHECK(both.wait() == 1);
    CHECK_THAT(both.err(), Catch::Contains("give the token one way"));
    std::ofstream(token_file) << "short\n";
    ChildProcess short_token = queue.serve({"--allow-counted-reads", "--token-file", token_file});
    CHECK(short_token.wait() == 1);
    CHECK_THAT(short_token.err(), Catch::Contains("at least 16"));
    std::filesystem::remove(token_file);
  }
}

namespace {

const std::string kConsoleToken = "limits-token-0123456789abcdef";

/// A request to the console at `port` with its token, as bytes; `headers` end with CRLF.
std::string console_request(int port, const std::string& method, const std::string& path,
                            const std::string& headers = "", const std::string& body = "") {
  return method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
         "\r\nX-Retryloop-Token: " + kConsoleToken + "\r\nConnection: close\r\n" + headers +
         "\r\n" + body;
}

/// Waits up to a minute for `condition`, without a loop to run.
bool within_a_minute(const std::function<bool()>& condition) {
  for (auto until = std::chrono::steady_clock::now() + 60s; !condition();) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

}  // namespace

TEST_CASE(
    "The console answers while 300 idle and 12 slow clients are connected, and closes each of "
    "them once its request time is up",
    "[parking][integration][cli][http]") {
  TestLoop loop;
  ServedQueue queue(loop, {});
  ChildProcess console = queue.serve({"--allow-counted-reads", "--token", kConsoleToken});
  const int port = console_port(console);
  INFO(console.out() + console.err());
  REQUIRE(port != 0);
  test::IdleClients idle(uint16_t(port), 300);
  test::SlowClients slow(uint16_t(port), 12, 1s);
  REQUIRE(within_a_minute([&] { return slow.bytes_sent() >= 12; }));  // each has begun
  const std::string whoami =
      test::http_exchange(uint16_t(port), console_request(port, "GET", "/api/whoami"));
  CHECK(test::http_status(whoami) == 200);
  // Answered before the console's own deadline closed any of them: it waited for none.
  CHECK(idle.still_open() == 300);
  CHECK(slow.closed_by_server() == 0);
  // Then the deadline closes them: a request begun gets 408, an idle connection nothing.
  CHECK(within_a_minute([&] { return slow.closed_by_server() == 12; }));
  CHECK(slow.first_answer() == "HTTP/1.1 408 Request Timeout");
  CHECK(within_a_minute([&] { return idle.still_open() == 0; }));
  console.signal(SIGTERM);
  CHECK(console.wait() == 0);
}

TEST_CASE(
    "The console refuses a body over 1 MiB however it is framed, answers a POST without a body "
    "at once, and a second console on its port exits 1",
    "[parking][integration][cli][http]") {
  TestLoop loop;
  ServedQueue queue(loop, {});
  ChildProcess console = queue.serve({"--allow-counted-reads", "--token", kConsoleToken});
  const int port = console_port(console);
  INFO(console.out() + console.err());
  REQUIRE(port != 0);
  const std::string json = "Content-Type: application/json\r\n";
  const std::string big(4 << 20, ' ');

  const std::string sized = test::http_exchange(
      uint16_t(port),
      console_request(port, "POST", "/api/note",
                      json + "Content-Length: " + std::to_string(big.size()) + "\r\n", big));
  CHECK(test::http_status(sized) == 413);
  std::string chunks;
  for (size_t at = 0; at < big.size(); at += 65536)
    chunks += "10000\r\n" + big.substr(at, 65536) + "\r\n";
  chunks += "0\r\n\r\n";
  const std::string chunked = test::http_exchange(
      uint16_t(port),
      console_request(port, "POST", "/api/note", json + "Transfer-Encoding: chunked\r\n", chunks));
  CHECK(test::http_status(chunked) == 413);
  CHECK_THAT(test::http_body(chunked), Catch::Contains("larger than 1 MiB"));
  CHECK_THAT(chunked, Catch::Contains("Content-Security-Policy: default-src 'none'"));

  // No Content-Length and no chunks: no body, said at once (not after a read timeout).
  const std::string empty =
      test::http_exchange(uint16_t(port), console_request(port, "POST", "/api/note", json));
  CHECK(test::http_status(empty) == 400);
  CHECK_THAT(test::http_body(empty), Catch::Contains("the request has no body"));

  ChildProcess second = queue.serve({"--allow-counted-reads", "--token", kConsoleToken + "x"},
                                    "127.0.0.1:" + std::to_string(port));
  CHECK(second.wait() == 1);
  CHECK_THAT(second.err(), Catch::Contains("cannot listen on 127.0.0.1:" + std::to_string(port)));
  console.signal(SIGTERM);
  CHECK(console.wait() == 0);
}

namespace {

/// Adds the vhost's audit stream to `s`'s topology file and declares it.
void declare_audit_stream(TestLoop& loop, ParkedService& s) {
  std::string json;
  {
    std::ifstream in(s.file);
    json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  json = R"({"audit": {}, )" + json.substr(1);  // every file of the vhost: the same retention
  std::ofstream(s.file) << json;
  const auto parsed = topology::parse_topology(json);
  REQUIRE(parsed.ok());
  topology::Topology audit_only;
  audit_only.audit = parsed.topology->audit;
  bool applied = false;
  REQUIRE_FALSE(topology::apply(s.connection, topology::make_plan(audit_only),
                                [&](const topology::Report& report) {
                                  CHECK(report.ok());
                                  applied = true;
                                }));
  REQUIRE(loop.run_until([&] { return applied; }));
}

}  // namespace

TEST_CASE(
    "With a file that declares the audit stream, parking replay and purge record who, what and "
    "how many before and after, and the console's reader reads them back",
    "[parking][audit][integration]") {
  TestLoop loop;
  ParkedService s(loop, "audit");
  declare_audit_stream(loop, s);
  const uint64_t since = retry::unix_milliseconds();

  s.park(6, [](size_t i) { return i < 4 ? "exhausted" : "poison"; });
  auto replay = s.cli({"replay", "--reason", "exhausted"});
  const int replayed = replay.wait();
  INFO(replay.err());
  REQUIRE(replayed == 0);
  auto dry = s.cli({"purge"});  // only counts: not recorded
  CHECK(dry.wait() == 1);
  auto purge = s.cli({"purge", "--yes"});
  const int purged = purge.wait();
  INFO(purge.err());
  REQUIRE(purged == 0);

  std::vector<parking::AuditRecord> records;
  auto reader = parking::AuditReader::start(
      s.connection, since - 1000, std::nullopt,
      [&](parking::AuditRecord&& record) {
        if (record.service == s.service.name) records.push_back(std::move(record));
      },
      [](const client::Error& error) { FAIL(error.message()); });
  REQUIRE(loop.run_until([&] { return records.size() >= 4; }, 20s));
  loop.run_for(300ms);
  reader->stop();
  REQUIRE(records.size() == 4);
  CHECK(records[0].action == "replay");
  CHECK(records[0].state == "started");
  CHECK(records[1].action == "replay");
  CHECK(records[1].state == "done");
  CHECK(records[1].id == records[0].id);
  CHECK(records[1].done == std::optional<uint64_t>(4));
  CHECK(records[1].filter == nlohmann::json{{"reasons", {"exhausted"}}});
  CHECK(records[1].via == "cli");
  CHECK(records[1].who == parking::command_line_user());
  CHECK(records[2].action == "purge");
  CHECK(records[2].state == "started");
  CHECK(records[3].state == "done");
  CHECK(records[3].done == std::optional<uint64_t>(2));
  CHECK(records[3].at_ms >= records[2].at_ms);
  CHECK(records[0].offset < records[3].offset);
}

TEST_CASE(
    "An edit through the console's API that changes only the body sends a copy with every header "
    "of the parked message in its AMQP type: table, byte array, timestamp, decimal, x-tenant-id",
    "[parking][console][integration]") {
  TestLoop loop;
  ParkedService s(loop, "cedit");
  amqp::FieldTable tenant{{"region", amqp::FieldValue("eu")},
                          {"tier", amqp::FieldValue(int32_t(2))}};
  amqp::FieldTable headers;
  headers.append("x-tenant-id", "tenant-7");
  headers.append("tenant", tenant);
  headers.append("signature", amqp::ByteArray{std::string("\x00\xff\x01sig", 6)});
  headers.append("sent-at", amqp::Timestamp{1700000123});
  headers.append("price", amqp::Decimal{2, 1999});
  headers.append("small", int8_t(-5));
  headers.append("retryloop-reason", "poison");
  headers.append("retryloop-parked-at", amqp::Timestamp{1700000000});
  amqp::BasicProperties properties;
  properties.message_id = "typed-1";
  properties.headers = headers;
  bool confirmed = false;
  REQUIRE_FALSE(s.channel->publish(s.parking, "", properties, "not json", client::Mandatory::yes,
                                   [&](const client::PublishOutcome& outcome) {
                                     CHECK(outcome.ok());
                                     confirmed = true;
                                   }));
  REQUIRE(loop.run_until([&] { return confirmed; }));

  const std::string token = "edit-token-0123456789abcdef";
  const std::string token_file = s.file + ".token";
  std::ofstream(token_file) << token << "\n";
  ChildProcess console({test::built_program("retryloop"), "parking", "serve", "-t", s.file,
                        s.service.name, "--url", test::broker_url(), "--listen", "127.0.0.1:0",
                        "--token-file", token_file, "--rescan-after", "0s"},
                       {"RETRYLOOP_CONSOLE_TOKEN="});
  const int port = console_port(console);
  INFO(console.out() + console.err());
  REQUIRE(port != 0);
  httplib::Client http("127.0.0.1", port);
  const httplib::Headers auth = {{"X-Retryloop-Token", token}};
  auto post = [&](const nlohmann::json& body) {
    auto answer = http.Post("/api/edit", auth, body.dump(), "application/json");
    REQUIRE(answer);
    return std::make_pair(answer->status, nlohmann::json::parse(answer->body));
  };

  // Refused with a clear error, nothing done.
  int status = 0;
  nlohmann::json refused;
  std::tie(status, refused) =
      post({{"message_id", "typed-1"}, {"headers", nlohmann::json::object()}});
  CHECK(status == 400);
  CHECK_THAT(refused.at("error").get<std::string>(), Catch::Contains("set_headers"));
  std::tie(status, refused) =
      post({{"message_id", "typed-1"}, {"set_headers", {{"retryloop-reason", "fixed"}}}});
  CHECK(status == 400);
  CHECK_THAT(refused.at("error").get<std::string>(), Catch::Contains("retryloop-reason"));
  std::tie(status, refused) =
      post({{"message_id", "typed-1"}, {"set_headers", {{std::string(256, 'h'), "x"}}}});
  CHECK(status == 400);
  CHECK_THAT(refused.at("error").get<std::string>(), Catch::Contains("at most 255"));
  std::tie(status, refused) =
      post({{"message_id", "typed-1"}, {"set_headers", {{"tenant", {{"region", "us"}}}}}});
  CHECK(status == 400);
  CHECK_THAT(refused.at("error").get<std::string>(), Catch::Contains("tenant must be"));

  nlohmann::json started;
  std::tie(status, started) = post({{"message_id", "typed-1"}, {"body", "{\"fixed\": true}"}});
  REQUIRE(status == 200);
  const uint64_t job_id = started.at("job");
  nlohmann::json job;
  REQUIRE(test::eventually(loop, [&] {
    auto state = http.Get("/api/state", auth);
    if (!state || state->status != 200) return false;
    job = nlohmann::json::parse(state->body).at("job");
    return job.is_object() && job.at("id") == job_id &&
           (job.at("state") == "done" || job.at("state") == "failed");
  }));
  INFO(job.dump());
  CHECK(job.at("state") == "done");
  CHECK(job.at("outcome") == "sent");
  // RabbitMQ 4 sorts a message's headers by name: only the names are checked, not their order.
  auto kept = job.at("kept_not_editable").get<std::vector<std::string>>();
  std::sort(kept.begin(), kept.end());
  CHECK(kept == std::vector<std::string>{"price", "sent-at", "signature", "tenant"});
  console.signal(SIGTERM);
  CHECK(console.wait() == 0);
  std::filesystem::remove(token_file);

  auto copies = test::drain_queue(loop, *s.connection, s.queue);
  REQUIRE(copies.size() == 1);
  CHECK(copies[0].message.body == "{\"fixed\": true}");
  const auto& copy = copies[0].message.properties;
  REQUIRE(copy.headers);
  CHECK(copy.message_id == job.at("new_message_id").get<std::string>());
  for (const auto& entry : headers) {
    INFO(entry.name);
    const amqp::FieldValue* kept = copy.headers->find(entry.name);
    if (entry.name.rfind("retryloop-", 0) == 0) {
      CHECK(kept == nullptr);  // parking headers: gone, as in a replay
      continue;
    }
    REQUIRE(kept != nullptr);
    CHECK(kept->type_letter() == entry.value.type_letter());
    CHECK(*kept == entry.value);
  }
  CHECK(s.depth(s.parking) == 0);
}

TEST_CASE(
    "A console starts and serves over audit records nested 500,000 deep or too large, counts "
    "them, and shows forged records as unverified and signed ones as verified",
    "[parking][audit][integration][cli]") {
  TestLoop loop;
  ParkedService s(loop, "auditbad");
  declare_audit_stream(loop, s);
  const std::string key_file = s.file + ".key";
  std::ofstream(key_file) << std::string(64, 'a') << "\n";
  const std::string token_file = s.file + ".token";
  const std::string token = "audit-token-0123456789abcdef";
  std::ofstream(token_file) << token << "\n";

  // What anyone with write on the default exchange can append: a record whose filter nests
  // 500,000 levels, a small one nested 10,000 levels, one larger than a record may be, and
  // records that say who they like.
  amqp::BasicProperties properties;
  properties.delivery_mode = 2;
  const size_t depth = 500'000;
  test::publish_confirmed(loop, *s.channel, "", topology::audit_stream_name(), properties,
                          R"({"id": "deep", "action": "note", "service": ")" + s.service.name +
                              R"(", "filter": )" + std::string(depth, '[') +
                              std::string(depth, ']') + "}");
  test::publish_confirmed(loop, *s.channel, "", topology::audit_stream_name(), properties,
                          R"({"id": "deep-and-small", "action": "note", "filter": )" +
                              std::string(10'000, '[') + std::string(10'000, ']') + "}");
  test::publish_confirmed(loop, *s.channel, "", topology::audit_stream_name(), properties,
                          R"({"id": "large", "action": "note", "service": ")" + s.service.name +
                              R"(", "note": ")" +
                              std::string(parking::max_audit_record_bytes, 'n') + R"("})");
  const auto forged = [&](const std::string& id) {
    return R"({"id": ")" + id + R"(", "action": "purge", "state": "done", "who": "mallory", )" +
           R"("service": ")" + s.service.name + R"(", "verified": true, "at_ms": )" +
           std::to_string(retry::unix_milliseconds()) + "}";
  };
  test::publish_confirmed(loop, *s.channel, "", topology::audit_stream_name(), properties,
                          forged("unsigned"));
  amqp::BasicProperties wrongly_signed = properties;
  wrongly_signed.headers = amqp::FieldTable{};
  wrongly_signed.headers->append(parking::audit_signature_header,
                                 parking::audit_signature(std::string(64, 'b'), forged("wrong")));
  test::publish_confirmed(loop, *s.channel, "", topology::audit_stream_name(), wrongly_signed,
                          forged("wrong"));
  // A purge of the command line, signed with the consoles' key.
  s.park(2, [](size_t) { return "poison"; });
  auto purge = s.cli({"purge", "--yes", "--audit-key", key_file});
  INFO(purge.err());
  REQUIRE(purge.wait() == 0);

  ChildProcess console({test::built_program("retryloop"), "parking", "serve", "-t", s.file,
                        s.service.name, "--url", test::broker_url(), "--listen", "127.0.0.1:0",
                        "--token-file", token_file, "--audit-key", key_file},
                       {"RETRYLOOP_CONSOLE_TOKEN="});
  const int port = console_port(console);
  INFO(console.out() + console.err());
  REQUIRE(port != 0);
  httplib::Client http("127.0.0.1", port);
  const httplib::Headers auth = {{"X-Retryloop-Token", token}};
  nlohmann::json audit;
  // Every record of this test read back: the purge's two and the two forged ones.
  const auto mine = [&] {
    std::vector<nlohmann::json> out;
    for (const auto& record : audit["records"]) {
      if (record["service"] == s.service.name) out.push_back(record);
    }
    return out;
  };
  CHECK(test::eventually(loop, [&] {
    auto got = http.Get("/api/audit?limit=1000", auth);
    if (!got || got->status != 200) return false;
    audit = nlohmann::json::parse(got->body);
    return mine().size() >= 4;
  }));
  INFO(audit.dump());
  CHECK(console.running());
  CHECK(audit["signed"] == true);
  CHECK(audit["skipped"].get<uint64_t>() >= 3);
  CHECK(audit["skipped_last"].is_string());
  size_t verified = 0;
  size_t unverified = 0;
  for (const auto& record : mine()) {
    if (record["who"] == "mallory") {
      CHECK(record["verified"] == false);
      ++unverified;
    } else {
      CHECK(record["action"] == "purge");
      CHECK(record["via"] == "cli");
      CHECK(record["verified"] == true);
      ++verified;
    }
  }
  CHECK(verified == 2);
  CHECK(unverified == 2);
  auto metrics = http.Get("/metrics", auth);
  REQUIRE(metrics);
  CHECK_THAT(metrics->body, Catch::Contains("retryloop_console_audit_skipped_total " +
                                            audit["skipped"].dump() + "\n"));
  console.signal(SIGTERM);
  CHECK(console.wait() == 0);
  // One line in the log for every record skipped, however many.
  const std::string log = console.err();
  const size_t first = log.find("skipped a record");
  CHECK(first != std::string::npos);
  CHECK(log.find("skipped a record", first + 1) == std::string::npos);
  std::filesystem::remove(key_file);
  std::filesystem::remove(token_file);
}
