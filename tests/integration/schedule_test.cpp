// Scheduled delivery against a real broker: `retryloop send` and the Scheduler through classic and
// quorum delay levels (nothing arrives before it is due, and the message arrives whole), a queue
// gone when its message is due, a channel closed with messages awaiting their confirms,
// `retryloop schedule stats`, and outbox rows due later.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "retryloop/inbox/inbox.hpp"
#include "retryloop/outbox/outbox.hpp"
#include "retryloop/outbox/relay.hpp"
#include "retryloop/schedule/scheduler.hpp"
#include "retryloop/schedule/stats.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/consumer_fixture.hpp"
#include "support/databases.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

/// A topology file with only a schedule: `base`, `max`, `type`, for `queues`.
struct ScheduleFile {
  std::string path;
  topology::Topology topology;
  ScheduleFile(const std::string& base, const std::string& max, const std::string& type,
               const std::vector<std::string>& queues) {
    nlohmann::json file{
        {"delay_levels", {{"base", base}, {"max", max}, {"queue_type", type}, {"queues", queues}}}};
    path = (fs::temp_directory_path() / (test::unique_name("schedule") + ".json")).string();
    std::ofstream(path) << file.dump(2);
    auto parsed = topology::load_topology(path);
    REQUIRE(parsed.ok());
    topology = *parsed.topology;
  }
  ~ScheduleFile() { fs::remove(path); }
  const topology::Schedule& schedule() const { return *topology.schedule; }
};

/// What reached a queue, and when (by this process's clock, as the loop saw it).
struct Arrival {
  std::string body;
  amqp::BasicProperties properties;
  int64_t at_ms = 0;
  int64_t header(std::string_view name) const {
    const amqp::FieldValue* value = properties.headers ? properties.headers->find(name) : nullptr;
    return value && value->as_int64() ? *value->as_int64() : -1;
  }
};

/// Consumes `queue` (auto-ack) on the test loop, recording each message as it arrives.
struct Arrivals {
  std::shared_ptr<client::Channel> channel;
  std::shared_ptr<std::vector<Arrival>> seen = std::make_shared<std::vector<Arrival>>();
  Arrivals(test::TestLoop& loop, client::Connection& connection, const std::string& queue) {
    channel = test::open_channel(loop, connection);
    client::ConsumeOptions options;
    options.no_ack = true;
    bool ready = false;
    client::Error error;
    REQUIRE_FALSE(channel->consume(
        queue, options,
        [seen = seen](client::Delivery&& delivery) {
          seen->push_back({delivery.message.body, delivery.message.properties, schedule::now_ms()});
        },
        [&](const client::Error& e, const std::string&) {
          error = e;
          ready = true;
        }));
    REQUIRE(loop.run_until([&] { return ready; }));
    REQUIRE_FALSE(error);
  }
};

void apply_topology(test::TestLoop& loop, const std::shared_ptr<client::Connection>& connection,
                    const topology::Topology& t) {
  bool done = false;
  topology::Report report;
  REQUIRE_FALSE(topology::apply(connection, topology::make_plan(t), [&](const topology::Report& r) {
    report = r;
    done = true;
  }));
  REQUIRE(loop.run_until([&] { return done; }, 60s));
  for (const auto& r : report.results) {
    INFO(topology::describe(r.action) << ": " << r.error.message());
    CHECK(r.outcome != topology::Outcome::failed);
  }
  REQUIRE(report.ok());
}

std::map<std::string, nlohmann::json> json_lines(const std::string& text) {
  std::map<std::string, nlohmann::json> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line);
    out[j["message_id"].get<std::string>()] = j;
  }
  return out;
}

}  // namespace

TEST_CASE(
    "retryloop send delivers each message whole to its queue, never before it is due, through "
    "classic and quorum delay levels",
    "[schedule][integration]") {
  const std::string type = GENERATE("classic", "quorum");
  INFO(type);
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "sched.send");
  ScheduleFile file("500ms", "1h", type, {target.queue});
  apply_topology(loop, target.connection, file.topology);
  Arrivals arrivals(loop, *target.connection, target.queue);

  const int64_t asked_at = schedule::now_ms();
  // Below half the base, between levels, and at a time.
  auto delayed = test::run_retryloop({"send", "-t", file.path, "--queue", target.queue, "--delay",
                                      "200ms", "--message-id", "short", "--json", "--header",
                                      "tenant=acme", "--content-type", "text/plain", "hello"});
  INFO(delayed.err);
  REQUIRE(delayed.exit_code == 0);
  auto between = test::run_retryloop({"send", "-t", file.path, "--queue", target.queue, "--delay",
                                      "2300ms", "--message-id", "between", "--json", "body-2"});
  REQUIRE(between.exit_code == 0);
  const int64_t at = schedule::now_ms() + 1700;
  char at_text[64];
  const time_t at_seconds = at / 1000;
  std::tm tm{};
  gmtime_r(&at_seconds, &tm);
  std::snprintf(at_text, sizeof at_text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, int(at % 1000));
  auto timed = test::run_retryloop({"send", "-t", file.path, "--queue", target.queue, "--at",
                                    at_text, "--message-id", "timed", "--json", "body-3"});
  INFO(timed.err);
  REQUIRE(timed.exit_code == 0);
  // Bulk: one message a line, numbered ids.
  auto bulk = test::run_retryloop({"send", "-t", file.path, "--queue", target.queue, "--delay",
                                   "1s", "--lines", "--message-id", "bulk", "--json", "-"},
                                  60000, {}, "a\nb\n\nc\n");
  INFO(bulk.err);
  REQUIRE(bulk.exit_code == 0);
  CHECK_THAT(bulk.err, Catch::Contains("3 of 3 scheduled"));

  std::map<std::string, nlohmann::json> printed = json_lines(delayed.out);
  for (const auto& more : {between.out, timed.out, bulk.out}) {
    for (auto& [id, j] : json_lines(more))
      printed[id] = j;
  }
  REQUIRE(printed.size() == 6);
  CHECK(printed["short"]["delay_ms"] == 500);     // 200 ms rounds up to the base
  CHECK(printed["between"]["delay_ms"] == 2500);  // 2.3 s rounds up, not to the nearest
  CHECK(printed["timed"]["due_at_ms"].get<int64_t>() >= at);

  REQUIRE(loop.run_until([&] { return arrivals.seen->size() == 6; }, 30s));
  std::map<std::string, int> bodies;
  for (const Arrival& a : *arrivals.seen) {
    const std::string id = a.properties.message_id.value_or("");
    INFO(id);
    REQUIRE(printed.count(id) == 1);
    const int64_t due = printed[id]["due_at_ms"].get<int64_t>();
    CHECK(a.header(schedule::header::due_at) == due);
    CHECK(a.header(schedule::header::scheduled_at) >= asked_at);
    CHECK(a.at_ms >= due);  // never early
    CHECK(a.at_ms - due < 5000);
    ++bodies[a.body];
  }
  CHECK(bodies == std::map<std::string, int>{
                      {"hello", 1}, {"body-2", 1}, {"body-3", 1}, {"a", 1}, {"b", 1}, {"c", 1}});
  const Arrival& hello = *std::find_if(arrivals.seen->begin(), arrivals.seen->end(),
                                       [](const Arrival& a) { return a.body == "hello"; });
  CHECK(hello.properties.content_type == "text/plain");
  CHECK(*hello.properties.headers->find("tenant")->as_string() == "acme");
  CHECK(hello.properties.delivery_mode == 2);

  // Refused before anything is published: a queue the file does not name, a delay the levels
  // cannot wait, neither --delay nor --at.
  auto unknown =
      test::run_retryloop({"send", "-t", file.path, "--queue", "elsewhere", "--delay", "1s", "x"});
  CHECK(unknown.exit_code == 1);
  CHECK_THAT(unknown.err, Catch::Contains("does not receive scheduled messages"));
  auto too_long =
      test::run_retryloop({"send", "-t", file.path, "--queue", target.queue, "--delay", "2h", "x"});
  CHECK(too_long.exit_code == 1);
  CHECK_THAT(too_long.err, Catch::Contains("would arrive early"));
  auto neither = test::run_retryloop({"send", "-t", file.path, "--queue", target.queue, "x"});
  CHECK(neither.exit_code == 1);
  auto bad_time = test::run_retryloop(
      {"send", "-t", file.path, "--queue", target.queue, "--at", "tomorrow", "x"});
  CHECK(bad_time.exit_code == 1);
  CHECK_THAT(bad_time.err, Catch::Contains("is not a time"));
}

TEST_CASE(
    "The Scheduler keeps a message's properties, moves its TTL aside, and parks a message whose "
    "queue is gone in the unrouted queue",
    "[schedule][integration]") {
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "sched.lib");
  const std::string gone = test::unique_name("sched.gone");
  test::declare_queue(loop, *target.channel, gone);
  ScheduleFile file("250ms", "10m", "classic", {target.queue, gone});
  apply_topology(loop, target.connection, file.topology);
  auto channel = test::open_channel(loop, *target.connection);
  REQUIRE_FALSE(test::wait(loop, [&](auto cb) { return channel->confirm_select(cb); }));
  schedule::Scheduler scheduler(*channel, file.schedule());
  Arrivals arrivals(loop, *target.connection, target.queue);

  std::vector<schedule::ScheduleResult> results;
  auto record = [&](const schedule::ScheduleResult& r) { results.push_back(r); };
  amqp::BasicProperties properties;
  properties.message_id = "with-ttl";
  properties.expiration = "100";  // would cut the 1 s wait to 100 ms if it stayed
  properties.headers.emplace();
  properties.headers->set("x-death", amqp::FieldValue(amqp::FieldArray{}));
  REQUIRE_FALSE(scheduler.schedule_in(target.queue, properties, "ttl", 1s, record));
  REQUIRE_FALSE(scheduler.schedule_in(gone, {}, "late", 1s, record));
  REQUIRE_FALSE(scheduler.schedule_at(target.queue, {}, "now",
                                      std::chrono::system_clock::now() - 1min, record));
  CHECK(scheduler.schedule_in("elsewhere", {}, "x", 1s, record));  // refused at once
  REQUIRE(loop.run_until([&] { return results.size() == 3; }));
  for (const auto& r : results) {
    INFO(r.message_id << ": " << r.publish.error.message());
    CHECK(r.ok());
  }
  // Confirms of different queues may come in any order.
  std::map<std::string, int> ids;
  for (const auto& r : results)
    ++ids[r.message_id.size() == 32 ? "random" : r.message_id];
  CHECK(ids == std::map<std::string, int>{{"with-ttl", 1}, {"random", 2}});  // for a cancel
  CHECK(std::count_if(results.begin(), results.end(),
                      [](const auto& r) { return r.delay == 0ms; }) == 1);
  // The queue is deleted before its message is due.
  REQUIRE_FALSE(test::wait(loop, [&](auto cb) {
    return target.channel->queue_delete(gone, false, false,
                                        [cb](const client::Error& e, uint32_t) { cb(e); });
  }));

  REQUIRE(loop.run_until([&] { return arrivals.seen->size() == 2; }, 20s));
  loop.run_for(300ms);
  CHECK(arrivals.seen->size() == 2);
  for (const Arrival& a : *arrivals.seen) {
    CHECK(a.at_ms >= a.header(schedule::header::due_at));
    if (a.body != "ttl") continue;
    CHECK_FALSE(a.properties.expiration);
    CHECK(*a.properties.headers->find("retryloop-original-expiration")->as_string() == "100");
  }
  const std::string unrouted = "retryloop.delay.250ms.unrouted";
  CHECK(test::eventually(
      loop, [&] { return test::queue_depth(loop, *target.connection, unrouted) >= 1; }));
  // A message due now whose queue does not exist is returned, not kept.
  schedule::Scheduler again(*channel, file.schedule());
  std::optional<schedule::ScheduleResult> returned;
  REQUIRE_FALSE(again.schedule_in(gone, {}, "x", 0ms,
                                  [&](const schedule::ScheduleResult& r) { returned = r; }));
  REQUIRE(loop.run_until([&] { return returned.has_value(); }));
  CHECK(returned->publish.status == client::PublishStatus::returned);
  // Once the queue is back, `schedule redeliver` sends it its kept message, and only that.
  test::declare_queue(loop, *target.channel, gone);
  auto counted = test::run_retryloop({"schedule", "redeliver", "-t", file.path, "--dry-run"});
  INFO(counted.err);
  CHECK(counted.exit_code == 0);
  CHECK_THAT(counted.out, Catch::Contains(gone + ": 1 would be redelivered"));
  CHECK_THAT(counted.out, Catch::Contains(target.queue + ": 0 would be redelivered"));
  auto redelivered =
      test::run_retryloop({"schedule", "redeliver", "-t", file.path, "--queue", gone});
  INFO(redelivered.err);
  CHECK(redelivered.exit_code == 0);
  CHECK(redelivered.out == gone + ": 1 redelivered from " + unrouted + "\n");
  auto kept = test::drain_queue(loop, *target.connection, gone);
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].message.body == "late");
  CHECK(test::run_retryloop({"schedule", "redeliver", "-t", file.path, "--queue", "nope"})
            .exit_code == 1);
  REQUIRE_FALSE(test::wait(loop, [&](auto cb) {
    return target.channel->queue_delete(gone, false, false,
                                        [cb](const client::Error& e, uint32_t) { cb(e); });
  }));
  for (auto& message : test::drain_queue(loop, *target.connection, unrouted)) {
    (void)message;  // other tests' leftovers go too: the set is shared by base
  }
}

TEST_CASE(
    "retryloop schedule cancel names the queue: the same id scheduled for two queues is cancelled "
    "in one and arrives in the other",
    "[schedule][inbox][integration]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = test::database_for(label, "cancel_two");
  test::TestLoop loop;
  test::Broker broker(loop);
  const std::string retry = R"("delays": ["1s"], "max_attempts": 3)";
  const auto mail = test::make_service(test::unique_name("sched.mail"), retry);
  const auto sms = test::make_service(test::unique_name("sched.sms"), retry);
  broker.apply(mail);
  broker.apply(sms);
  ScheduleFile file("500ms", "1h", "classic", {mail.name, sms.name});
  apply_topology(loop, broker.connection, file.topology);
  std::vector<std::shared_ptr<inbox::Inbox>> inboxes;
  std::vector<std::shared_ptr<consumer::Consumer>> consumers;
  test::Recorder mailed, texted;
  for (auto [service, recorder] : {std::pair{&mail, &mailed}, std::pair{&sms, &texted}}) {
    inbox::InboxOptions options;
    options.database = database.url;
    options.consumer = service->name;
    inboxes.push_back(inbox::Inbox::create(options));
    consumers.push_back(
        test::start(loop, test::options_for(*service),
                    inboxes.back()->wrap(
                        [recorder = recorder](const consumer::Message& message, store::Database&) {
                          recorder->add(message);
                          return consumer::Outcome::ack();
                        })));
  }
  for (const auto* service : {&mail, &sms}) {
    auto sent = test::run_retryloop({"send", "-t", file.path, "--queue", service->name, "--delay",
                                     "2s", "--message-id", "reminder", service->name});
    REQUIRE(sent.exit_code == 0);
  }
  // Two queues: a cancel that names none is refused, naming them.
  auto unnamed = test::run_retryloop(
      {"schedule", "cancel", "-t", file.path, "--db", database.url, "reminder"});
  CHECK(unnamed.exit_code == 1);
  CHECK_THAT(unnamed.err,
             Catch::Contains("--queue") && Catch::Contains(mail.name + ", " + sms.name));
  auto unknown = test::run_retryloop({"schedule", "cancel", "-t", file.path, "--db", database.url,
                                      "--queue", "elsewhere", "reminder"});
  CHECK(unknown.exit_code == 1);
  CHECK_THAT(unknown.err, Catch::Contains("--queue elsewhere"));
  auto cancelled = test::run_retryloop({"schedule", "cancel", "-t", file.path, "--db", database.url,
                                        "--queue", mail.name, "reminder"});
  INFO(cancelled.err);
  CHECK(cancelled.exit_code == 0);
  CHECK(cancelled.out == "reminder: cancelled\n");
  REQUIRE(loop.run_until(
      [&] { return consumers[0]->metrics().dropped == 1 && consumers[1]->metrics().acked == 1; },
      20s));
  CHECK(mailed.of("reminder").empty());
  CHECK(texted.of("reminder").size() == 1);
  CHECK(inboxes[0]->stats().cancelled == 1);
  CHECK(inboxes[1]->stats().cancelled == 0);
  // Too late in the other queue, where the message came.
  auto late = test::run_retryloop({"schedule", "cancel", "-t", file.path, "--db", database.url,
                                   "--queue", sms.name, "reminder"});
  CHECK(late.exit_code == 3);
  CHECK_THAT(late.out, Catch::Contains("consumer " + sms.name + " received it already"));
  for (auto& consumer : consumers)
    test::stop(loop, consumer);
  broker.remove(mail);
  broker.remove(sms);
}

TEST_CASE(
    "retryloop send reports the messages awaiting their confirms when the broker closes the "
    "channel as unknown, with exit 4, not as refused: those before the one it refused are held",
    "[schedule][integration][broker-wide]") {
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "sched.closed");
  // A base of its own, so that no other test's messages are counted.
  ScheduleFile file("1190ms", "1h", "classic", {target.queue});
  apply_topology(loop, target.connection, file.topology);
  // 1024 units of the base: the messages wait in level 10 alone.
  const auto delay = std::chrono::milliseconds(1190 * 1024);
  const std::string level =
      schedule::make_scheduled_copy(file.schedule(), target.queue, {}, delay, schedule::now_ms())
          .exchange;
  REQUIRE(level ==
          topology::delay_level_name(topology::schedule_target(file.schedule(), target.queue), 10));

  // The broker's limit, lowered for this test (RabbitMQ 4 keeps the 16 MiB it started with): for
  // every client, so the test runs alone ([broker-wide]).
  REQUIRE(test::broker_ctl("eval 'application:set_env(rabbit, max_message_size, 1048576).'") == 0);
  // The level queue, suspended, takes what is routed to it but confirms nothing: the 20 messages
  // before the one over the limit await their confirms when the broker closes the channel for it.
  const std::string pid =
      "element(2, rabbit_amqqueue:lookup(rabbit_misc:r(<<\"/\">>, queue, <<\"" + level + "\">>)))";
  struct Restore {
    std::string pid;
    bool suspended = false;
    ~Restore() {
      if (suspended) test::broker_ctl("eval 'sys:resume(amqqueue:get_pid(" + pid + ")).'");
      test::broker_ctl("eval 'application:set_env(rabbit, max_message_size, 134217728).'");
    }
  } restore{pid};
  std::string out;
  REQUIRE(test::broker_ctl("eval 'sys:suspend(amqqueue:get_pid(" + pid + ")).'", &out) == 0);
  INFO(out);
  restore.suspended = true;

  // 26 lines: 20 small, one over the limit, 5 small. With a window of 23, the last 3 are not sent.
  const std::string input =
      (fs::temp_directory_path() / (test::unique_name("lines") + ".txt")).string();
  {
    std::ofstream lines(input, std::ios::binary);
    for (int k = 1; k <= 20; ++k)
      lines << "small " << k << "\n";
    lines << std::string(test::broker_is_4x() ? 17u << 20 : 2u << 20, 'x') << "\n";
    for (int k = 22; k <= 26; ++k)
      lines << "small " << k << "\n";
  }
  test::CommandRun run =
      test::run_retryloop({"send", "-t", file.path, "--queue", target.queue, "--delay",
                           std::to_string(delay.count()) + "ms", "--message-id", "closed",
                           "--lines", "--file", input, "--window", "23"});
  fs::remove(input);
  INFO(run.err);
  CHECK(run.exit_code == 4);
  CHECK(run.out.empty());
  int unknown = 0;
  for (int k = 1; k <= 23; ++k) {
    unknown += run.err.find("message closed-" + std::to_string(k) +
                            " may or may not be held: the broker closed the channel before it "
                            "was confirmed\n") != std::string::npos;
  }
  CHECK(unknown == 23);
  CHECK(run.err.find("closed-24") == std::string::npos);
  CHECK(run.err.find("refused by the broker") == std::string::npos);
  CHECK_THAT(run.err, Catch::Contains("0 scheduled, 0 refused, 23 unknown, 3 not sent, of 26 "
                                      "messages"));
  CHECK_THAT(run.err, Catch::Contains("23 messages (named above) may or may not be held: broker "
                                      "closed the channel (406 PRECONDITION_FAILED"));
  CHECK_THAT(run.err, Catch::Contains("max size"));
  CHECK_THAT(run.err, Catch::Contains("check by message id"));
  CHECK_THAT(run.err, Catch::Contains("the last 3 lines of the input were not sent"));

  // Resumed, the level holds the 20 sent before the refused one: "refused" would have been
  // wrong, and sending them again would have scheduled them twice. The broker dropped those
  // after it (RabbitMQ 4 may hold the refused one too: it routes before it checks the size).
  REQUIRE(test::broker_ctl("eval 'sys:resume(amqqueue:get_pid(" + pid + ")).'") == 0);
  restore.suspended = false;
  // Its mailbox comes before the passive declares and the gets that follow.
  CHECK(test::eventually(loop,
                         [&] { return test::queue_depth(loop, *target.connection, level) >= 20; }));
  const auto held = test::drain_queue(loop, *target.connection, level);
  std::vector<std::string> ids;
  for (const auto& message : held)
    ids.push_back(message.message.properties.message_id.value_or(""));
  INFO(ids.size() << " held");
  REQUIRE(ids.size() >= 20);
  CHECK(ids.size() <= 21);
  for (int k = 1; k <= 20; ++k)
    CHECK(std::count(ids.begin(), ids.end(), "closed-" + std::to_string(k)) == 1);
  for (int k = 22; k <= 26; ++k)
    CHECK(std::count(ids.begin(), ids.end(), "closed-" + std::to_string(k)) == 0);
}

TEST_CASE(
    "retryloop schedule stats counts each level and reads the due time at each head of classic "
    "levels",
    "[schedule][integration]") {
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "sched.stats");
  // A base of its own, so that no other test's messages are counted.
  ScheduleFile file("1130ms", "1h", "classic", {target.queue});
  apply_topology(loop, target.connection, file.topology);
  auto sent = test::run_retryloop({"send", "-t", file.path, "--queue", target.queue, "--delay",
                                   "30m", "--message-id", "far", "--json", "far"});
  REQUIRE(sent.exit_code == 0);
  const int64_t due = json_lines(sent.out)["far"]["due_at_ms"].get<int64_t>();
  auto stats = test::run_retryloop({"schedule", "stats", "-t", file.path, "--json"});
  INFO(stats.err);
  REQUIRE(stats.exit_code == 0);
  auto j = nlohmann::json::parse(stats.out);
  CHECK(j["set"] == "retryloop.delay.1130ms");
  CHECK(j["heads_read"] == true);
  CHECK(j["waiting"] == 1);
  CHECK(j["unrouted"] == 0);
  CHECK(j["queues"][target.queue] == 0);
  // 30 min is 1593 units of 1130 ms (rounded up): its highest bit is level 10.
  int holding = -1;
  for (const auto& level : j["levels"]) {
    if (level["messages"] == 1) holding = level["level"].get<int>();
  }
  CHECK(holding == 10);
  CHECK(j["levels"][10]["head_due_at"] == j["earliest_head_due_at"]);
  CHECK(j["earliest_head_due_at_ms"] == due);
  // The peek handed it back where it was.
  auto again = test::run_retryloop({"schedule", "stats", "-t", file.path});
  CHECK(again.exit_code == 0);
  CHECK_THAT(again.out, Catch::Contains("1 message waiting"));
  CHECK_THAT(again.out, !Catch::Contains("not read"));
  // Clean up the 30-minute message.
  const std::string level = j["levels"][10]["queue"].get<std::string>();
  CHECK(test::drain_queue(loop, *target.connection, level).size() == 1);
}

TEST_CASE(
    "retryloop schedule stats run 25 times leaves a message on quorum levels in its level, with "
    "no delivery count and no delivery_limit death",
    "[schedule][integration]") {
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "sched.stats.quorum");
  ScheduleFile file("1130ms", "1h", "quorum", {target.queue});
  apply_topology(loop, target.connection, file.topology);
  auto sent = test::run_retryloop({"send", "-t", file.path, "--queue", target.queue, "--delay",
                                   "30m", "--message-id", "far", "--json", "far"});
  REQUIRE(sent.exit_code == 0);
  // A monitor that runs it every minute does this in under half an hour; RabbitMQ 4.x's default
  // delivery limit of a quorum queue is 20.
  for (int run = 1; run <= 25; ++run) {
    auto stats = test::run_retryloop({"schedule", "stats", "-t", file.path, "--json"});
    INFO("run " << run << ": " << stats.err);
    REQUIRE(stats.exit_code == 0);
    if (run == 25) {
      auto j = nlohmann::json::parse(stats.out);
      CHECK(j["set"] == "retryloop.delay.1130ms.quorum");
      CHECK(j["heads_read"] == false);
      CHECK(j["earliest_head_due_at"].is_null());
      CHECK(j["waiting"] == 1);
      // 30 min is 1593 units of 1130 ms: it waits in level 10 for 19 min before level 9.
      for (const auto& level : j["levels"]) {
        INFO(level.dump());
        CHECK(level["messages"] == (level["level"] == 10 ? 1 : 0));
        CHECK(level["head_due_at"].is_null());
      }
    }
  }
  auto text = test::run_retryloop({"schedule", "stats", "-t", file.path});
  CHECK_THAT(text.out, Catch::Contains("head due: not read, as the levels are quorum queues"));
  const std::string level =
      topology::delay_level_name(topology::schedule_target(file.schedule(), target.queue), 10);
  auto held = test::drain_queue(loop, *target.connection, level);
  REQUIRE(held.size() == 1);
  const amqp::FieldTable* headers =
      held[0].message.properties.headers ? &*held[0].message.properties.headers : nullptr;
  REQUIRE(headers != nullptr);
  CHECK(headers->find("x-death") == nullptr);
  // Never handed back: no count (3.10 sends a count of 0 with every delivery).
  for (const char* count : {"x-delivery-count", "x-acquired-count"}) {
    INFO(count);
    const amqp::FieldValue* value = headers->find(count);
    CHECK((value == nullptr || value->as_int64() == int64_t(0)));
  }
  CHECK(held[0].message.body == "far");
}

TEST_CASE("An outbox row due later reaches its queue through the delay levels, not before",
          "[schedule][outbox][integration]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = test::database_for(label, "due");
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "sched.outbox");
  ScheduleFile file("500ms", "1h", "classic", {target.queue});
  apply_topology(loop, target.connection, file.topology);
  Arrivals arrivals(loop, *target.connection, target.queue);
  auto db = database.open();
  int64_t due = 0;
  {
    store::Transaction transaction(*db);
    outbox::OutboxMessage later;
    later.routing_key = target.queue;
    later.body = "later";
    later.message_id = "later";
    later.due_at_ms = due = outbox::due_in(1500ms);
    outbox::enqueue(*db, later);
    outbox::OutboxMessage unknown = later;
    unknown.routing_key = "not-scheduled";
    unknown.message_id = "unknown";
    outbox::enqueue(*db, unknown);
    outbox::OutboxMessage at_once;
    at_once.routing_key = target.queue;
    at_once.body = "at once";
    at_once.message_id = "at-once";
    outbox::enqueue(*db, at_once);
    transaction.commit();
  }
  outbox::OutboxMessage to_exchange;
  to_exchange.exchange = "amq.direct";
  to_exchange.due_at_ms = 0;
  CHECK_THROWS_WITH(outbox::enqueue(*db, to_exchange), Catch::Contains("leave exchange empty"));

  outbox::RelayOptions options;
  options.database = database.url;
  options.connection.uri = client::parse_uri(test::broker_url());
  options.poll_interval = 50ms;
  options.schedule = file.schedule();
  auto relay = outbox::Relay::create(loop.get(), options);
  bool stopped = false;
  relay->set_stopped_handler([&](const std::string&) { stopped = true; });
  REQUIRE(relay->start().empty());
  REQUIRE(loop.run_until([&] { return arrivals.seen->size() == 2; }, 20s));
  // The refused row never reached the broker: no reconnect for it.
  CHECK(relay->stats().broker_losses == 0);
  relay->stop();
  REQUIRE(loop.run_until([&] { return stopped; }));
  std::map<std::string, const Arrival*> by_body;
  for (const Arrival& a : *arrivals.seen)
    by_body[a.body] = &a;
  REQUIRE(by_body.count("later") == 1);
  CHECK(by_body["later"]->at_ms >= due);
  CHECK(by_body["later"]->header(schedule::header::due_at) >= due);
  CHECK(by_body["at once"]->at_ms < by_body["later"]->at_ms);
  auto failed = outbox::list_rows(*db, outbox::RowState::failed, 10);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].message_id == "unknown");
  CHECK_THAT(failed[0].last_error.value_or(""), Catch::Contains("does not receive scheduled"));
}

TEST_CASE(
    "retryloop schedule cancel stops a scheduled message at a retry consumer with an inbox, and "
    "the "
    "others arrive",
    "[schedule][inbox][integration]") {
  auto database = test::database_for("sqlite", "cancel");
  test::TestLoop loop;
  test::Broker broker(loop);
  const auto service = test::make_service(test::unique_name("sched.cancel"),
                                          R"("delays": ["1s"], "max_attempts": 3)");
  broker.apply(service);
  ScheduleFile file("500ms", "1h", "classic", {service.name});
  apply_topology(loop, broker.connection, file.topology);
  inbox::InboxOptions inbox_options;
  inbox_options.database = database.url;
  inbox_options.consumer = "mailer";
  auto inbox = inbox::Inbox::create(inbox_options);
  test::Recorder recorder;
  auto consumer = test::start(loop, test::options_for(service),
                              inbox->wrap([&](const consumer::Message& message, store::Database&) {
                                recorder.add(message);
                                return consumer::Outcome::ack();
                              }));
  for (const char* id : {"keep", "cancel"}) {
    auto sent = test::run_retryloop({"send", "-t", file.path, "--queue", service.name, "--delay",
                                     "2s", "--message-id", id, id});
    REQUIRE(sent.exit_code == 0);
  }
  auto cancelled =
      test::run_retryloop({"schedule", "cancel", "-t", file.path, "--db", database.url, "cancel"});
  INFO(cancelled.err);
  CHECK(cancelled.exit_code == 0);
  CHECK(cancelled.out == "cancel: cancelled\n");
  REQUIRE(loop.run_until(
      [&] { return consumer->metrics().acked + consumer->metrics().dropped == 2; }, 20s));
  CHECK(recorder.of("keep").size() == 1);
  CHECK(recorder.of("cancel").empty());
  CHECK(inbox->stats().cancelled == 1);
  CHECK(consumer->metrics().dropped == 1);
  // Too late for a message that arrived already: it says so.
  auto late =
      test::run_retryloop({"schedule", "cancel", "-t", file.path, "--db", database.url, "keep"});
  CHECK(late.exit_code == 3);
  CHECK_THAT(late.out, Catch::Contains("consumer mailer received it already"));
  test::stop(loop, consumer);
  broker.remove(service);
}
