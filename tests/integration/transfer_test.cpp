// `retryloop topology transfer` between two brokers: the test broker (old) and the one
// RETRYLOOP_TARGET_URL names (new), which `scripts/with-broker --as-target` starts.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>

#include "retryloop/migrate/driver.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/schedule/scheduler.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/topology.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "retryloop/transfer/transfer.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using retryloop::test::TestLoop;

namespace {

std::string target_url() {
  const char* url = std::getenv("RETRYLOOP_TARGET_URL");
  INFO(
      "the transfer tests need a second broker: scripts/with-broker --as-target ... -- "
      "scripts/with-broker ... -- CMD");
  REQUIRE(url != nullptr);
  return url;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// A topology file named after the first of `names`, with a reject-mode service of `delay` for
/// each, and, when `scheduled` names queues, a schedule of 5 levels of base 1 s delivering to them.
std::string services_file(const std::vector<std::string>& names, const std::string& delay,
                          const std::vector<std::string>& scheduled = {}) {
  const std::string file =
      (std::filesystem::temp_directory_path() / (names.front() + ".json")).string();
  std::ofstream out(file);
  out << "{";
  if (!scheduled.empty()) {
    out << R"("delay_levels": {"base": "1s", "levels": 5, "queues": [)";
    for (size_t i = 0; i < scheduled.size(); ++i)
      out << (i == 0 ? "\"" : ", \"") << scheduled[i] << "\"";
    out << "]}, ";
  }
  out << R"("services": [)";
  for (size_t i = 0; i < names.size(); ++i) {
    out << (i == 0 ? "" : ", ") << R"({"name": ")" << names[i] << R"(", "input": {"exchange": ")"
        << names[i] << R"(.in", "type": "direct", "bindings": ["key"]},
        "retry": {"mode": "reject", "delays": [")"
        << delay << R"("], "max_attempts": 5}})";
  }
  out << "]}";
  return file;
}

/// A topology file with one reject-mode service of `delay`.
std::string service_file(const std::string& name, const std::string& delay) {
  return services_file({name}, delay);
}

amqp::BasicProperties with_id(const std::string& id) {
  amqp::BasicProperties properties;
  properties.message_id = id;
  properties.delivery_mode = 2;
  return properties;
}

/// Takes `count` messages from `queue` with basic.get and rejects each (requeue=false): in a
/// reject-mode service queue, each dead-letters into the wait queue.
void reject(TestLoop& loop, client::Channel& channel, const std::string& queue, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    std::optional<client::GetResult> got;
    REQUIRE_FALSE(test::wait(loop, [&](client::CompletionCallback done) {
      return channel.get(
          queue, false,
          [&, done](const client::Error& error, std::optional<client::GetResult>&& r) {
            got = std::move(r);
            done(error);
          });
    }));
    REQUIRE(got);
    REQUIRE_FALSE(channel.reject(got->delivery_tag, false));
  }
}

/// Applies the file on the old broker (the test broker) and on the new one, as the first step of
/// a blue-green move does.
void apply_on_both(const std::string& file, const std::string& new_url) {
  REQUIRE(test::run_retryloop({"topology", "apply", file}).exit_code == 0);
  REQUIRE(test::run_retryloop({"topology", "apply", file, "--url", new_url}).exit_code == 0);
}

/// Deletes the file's objects, messages and all, from both brokers, then the file.
void delete_from_both(const std::string& file, const std::string& new_url) {
  CHECK(test::run_retryloop({"topology", "delete", file, "--yes", "--force", "--url", new_url})
            .exit_code == 0);
  CHECK(test::run_retryloop({"topology", "delete", file, "--yes", "--force"}).exit_code == 0);
  std::filesystem::remove(file);
}

/// The environment of a `retryloop` started as a test::ChildProcess: the test broker is the old.
std::vector<std::string> old_broker_environment() {
  return {"RETRYLOOP_URL=" + test::broker_url(), "RETRYLOOP_TOPOLOGY="};
}

}  // namespace

TEST_CASE(
    "topology transfer moves a reject-mode service to another broker: nothing lost, no "
    "retry back early, the parking queue intact",
    "[transfer]") {
  TestLoop loop;
  const std::string name = test::unique_name("transfer");
  const std::string file = service_file(name, "6s");
  const std::string queue = name;
  const std::string wait = topology::wait_queue_name(name, 6s);
  const std::string parking = topology::parking_queue_name(name);
  const std::string new_url = target_url();
  REQUIRE(test::run_retryloop({"topology", "apply", file}).exit_code == 0);

  auto old_broker = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *old_broker);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  test::publish_numbered(loop, *channel, name + ".in", "key", 40, "m");
  // m0..m4 round the loop once and are back in the service queue, behind m39, with an x-death.
  reject(loop, *channel, queue, 5);
  REQUIRE(test::eventually(
      loop, [&] { return test::queue_depth(loop, *old_broker, queue) == 40; }, 30s));
  // m5..m34 wait; m35..m39 and m0..m4 stay in the service queue.
  reject(loop, *channel, queue, 30);
  // Dead-lettering is asynchronous: the rejections reach the wait queue a moment later.
  REQUIRE(test::eventually(
      loop, [&] { return test::queue_depth(loop, *old_broker, wait) == 30; }, 30s));
  amqp::FieldTable parked_headers;
  parked_headers.append(std::string(retry::header::reason), std::string("exhausted"));
  parked_headers.append(std::string(retry::header::error), std::string("it broke"));
  amqp::BasicProperties parked = with_id("p1");
  parked.headers = parked_headers;
  test::publish_confirmed(loop, *channel, "", parking, parked, "parked body");

  test::CommandRun run =
      test::run_retryloop({"topology", "transfer", file, "--to", new_url, "--json"}, 120000);
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  const nlohmann::json result = nlohmann::json::parse(run.out);
  const nlohmann::json& service = result["services"][0];
  CHECK(service["result"] == "transferred");
  CHECK(service["moved"] == 41);
  std::map<std::string, nlohmann::json> reads;
  for (const auto& read : service["reads"])
    reads[read["queue"].get<std::string>()] = read;
  CHECK(reads[queue]["moved"] == 10);  // m35..m39 and m0..m4 were back in the service queue
  CHECK(reads[wait]["moved"] == 30);
  // Through the levels, or straight back when the move came after their due time.
  CHECK(reads[wait]["to_levels"].get<int>() + reads[wait]["to_queue"].get<int>() == 30);
  CHECK(reads[wait]["due_unknown"] == 0);
  CHECK(reads[parking]["moved"] == 1);

  // The old broker holds nothing more.
  for (const std::string& q : {queue, wait, parking})
    CHECK(test::queue_depth(loop, *old_broker, q) == 0);

  // On the new broker: the service queue's 10 at once, then each retry at its due time.
  auto new_broker = test::connect(loop, new_url);
  std::map<std::string, int64_t> arrived;
  std::map<std::string, amqp::BasicProperties> properties;
  REQUIRE(test::eventually(
      loop,
      [&] {
        for (auto& got : test::drain_queue(loop, *new_broker, queue)) {
          arrived[*got.message.properties.message_id] = now_ms();
          properties[*got.message.properties.message_id] = got.message.properties;
        }
        return arrived.size() >= 40;
      },
      60s, 20ms));
  CHECK(arrived.size() == 40);
  int64_t latest_lateness = 0;
  for (int i = 5; i < 35; ++i) {
    const std::string id = "m" + std::to_string(i);
    INFO(id);
    REQUIRE(arrived.count(id) == 1);
    const auto* due = properties[id].headers->find(retry::header::retry_due);
    REQUIRE(due != nullptr);
    // Never early; late by the levels' precision and the broker's hops, not by a whole delay.
    CHECK(arrived[id] >= *due->as_int64());
    latest_lateness = std::max(latest_lateness, arrived[id] - *due->as_int64());
    // One attempt made: the next is the second, on the new broker too.
    CHECK(retry::read_attempt_info(properties[id], queue, "", queue).attempt == 2);
  }
  for (int i = 0; i < 5; ++i) {
    const std::string id = "m" + std::to_string(i);
    CHECK(retry::read_attempt_info(properties[id], queue, "", queue).attempt == 2);
  }
  WARN("the moved retries came back at most " << latest_lateness << " ms after their due time");

  const auto parked_now = test::drain_queue(loop, *new_broker, parking);
  REQUIRE(parked_now.size() == 1);
  CHECK(parked_now[0].message.body == "parked body");
  CHECK(parked_now[0].message.properties.headers->find(retry::header::error)->as_string() ==
        std::string_view("it broke"));

  test::close(loop, new_broker);
  test::close(loop, old_broker);
  delete_from_both(file, new_url);
}

namespace {

/// A topology file with two republish-mode services, `name` and `name`-b, whose retries wait in
/// delay levels of base 1 s (4 levels), and a schedule of 5 levels of the same base, delivering
/// to both: their messages share the same level queues.
std::string levelled_file(const std::string& name, const std::string& queue_type) {
  const std::string file = (std::filesystem::temp_directory_path() / (name + ".json")).string();
  std::ofstream out(file);
  out << R"({"delay_levels": {"base": "1s", "levels": 5, "queue_type": ")" << queue_type
      << R"(", "queues": [")" << name << R"(", ")" << name << R"(-b"]}, "services": [)";
  for (const std::string& service : {name, name + "-b"}) {
    out << (service == name ? "" : ", ") << R"({"name": ")" << service << R"(", "queue_type": ")"
        << queue_type << R"(", "input": {"exchange": ")" << service
        << R"(.in", "type": "direct", "bindings": ["key"]},
        "retry": {"mode": "republish", "delays": ["5s"], "max_attempts": 5,
                  "delay_levels": {"base": "1s", "levels": 4}}})";
  }
  out << "]}";
  return file;
}

/// Publishes to the old broker a retry of `service` through its delay levels, as the consumer
/// does (confirmed, its due time in retryloop-retry-due).
void publish_level_retry(TestLoop& loop, client::Channel& channel, const topology::Service& service,
                         const std::string& id, std::chrono::milliseconds delay) {
  const topology::DelayRoute route = topology::delay_route(service, delay);
  amqp::BasicProperties properties = with_id(id);
  const int64_t due = now_ms() + delay.count();
  properties.headers = amqp::FieldTable{};
  properties.headers->set(std::string(retry::header::retries), int64_t{1});
  properties.headers->set(std::string(retry::header::retry_due), due);
  test::publish_confirmed(loop, channel, route.exchange, route.routing_key, properties, id);
}

/// The due time a message says it has: retryloop-retry-due, or retryloop-due-at.
int64_t said_due(const client::GetResult& got) {
  for (const char* name : {"retryloop-retry-due", "retryloop-due-at"}) {
    if (const amqp::FieldValue* due = test::header(got, name)) return due->as_int64().value_or(0);
  }
  return 0;
}

/// Reads `queue` until `count` messages have arrived: when each came, by message id.
std::map<std::string, int64_t> arrivals(TestLoop& loop, client::Connection& connection,
                                        const std::string& queue, size_t count,
                                        std::map<std::string, int64_t>& due) {
  std::map<std::string, int64_t> arrived;
  REQUIRE(test::eventually(
      loop,
      [&] {
        for (auto& got : test::drain_queue(loop, connection, queue)) {
          const std::string id = got.message.properties.message_id.value_or("");
          arrived[id] = now_ms();
          due[id] = said_due(got);
        }
        return arrived.size() >= count;
      },
      60s, 20ms));
  return arrived;
}

}  // namespace

TEST_CASE(
    "topology transfer moves the retries and the scheduled messages a service has in shared "
    "delay levels with their due times, and its unrouted retries, and leaves other queues' where "
    "they are",
    "[transfer]") {
  const std::string type = GENERATE("classic", "quorum");
  INFO(type);
  TestLoop loop;
  const std::string name = test::unique_name("transfer-levels");
  const std::string other = name + "-b";
  const std::string file = levelled_file(name, type);
  const std::string new_url = target_url();
  REQUIRE(test::run_retryloop({"topology", "apply", file}).exit_code == 0);

  topology::Service service;
  service.name = name;
  service.queue_type =
      type == "quorum" ? topology::QueueType::quorum : topology::QueueType::classic;
  service.retry.mode = topology::RetryMode::republish;
  service.retry.delay_levels = topology::DelayLevels{1s, 4, std::nullopt};
  topology::Service other_service = service;
  other_service.name = other;

  auto old_broker = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *old_broker);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  // Six retries of the service, due in 8 to 13 s, and three of the other.
  for (int i = 0; i < 6; ++i)
    publish_level_retry(loop, *channel, service, "r" + std::to_string(i),
                        std::chrono::seconds(8 + i));
  for (int i = 0; i < 3; ++i)
    publish_level_retry(loop, *channel, other_service, "b" + std::to_string(i), 8s);
  // Three messages scheduled for the service, through its 5-level schedule, and one for the other.
  for (int i = 0; i < 3; ++i) {
    test::CommandRun sent = test::run_retryloop({"send", "-t", file, "--queue", name, "--delay",
                                                 std::to_string(10 + i) + "s", "--message-id",
                                                 "s" + std::to_string(i), "scheduled"});
    INFO(sent.err);
    REQUIRE(sent.exit_code == 0);
  }
  REQUIRE(test::run_retryloop({"send", "-t", file, "--queue", other, "--delay", "10s",
                               "--message-id", "bs", "scheduled"})
              .exit_code == 0);
  // Two retries of the service and one of the other whose service queue was gone when they came
  // due, in the set's unrouted queue (published to its fanout exchange with their level routes).
  const std::string unrouted = topology::delay_unrouted_name(service);
  const auto publish_unrouted = [&](const topology::Service& to, const std::string& id) {
    amqp::BasicProperties properties = with_id(id);
    properties.headers = amqp::FieldTable{};
    properties.headers->set(std::string(retry::header::retries), int64_t{1});
    properties.headers->set(std::string(retry::header::retry_due), now_ms() - 1000);
    test::publish_confirmed(loop, *channel, unrouted, topology::delay_route(to, 3s).routing_key,
                            properties, id);
  };
  publish_unrouted(service, "u0");
  publish_unrouted(service, "u1");
  publish_unrouted(other_service, "bu");

  test::CommandRun run = test::run_retryloop(
      {"topology", "transfer", file, "--to", new_url, "--service", name, "--json"}, 120000);
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  const nlohmann::json parsed = nlohmann::json::parse(run.out);
  const nlohmann::json& result = parsed["services"][0];
  CHECK(result["result"] == "transferred");
  uint64_t from_levels = 0, from_unrouted = 0;
  uint64_t others = 0, unrouted_others = 0;
  for (const auto& read : result["reads"]) {
    if (read["kind"] == "unrouted retries") {
      from_unrouted += read["moved"].get<uint64_t>();
      unrouted_others += read["others"].get<uint64_t>();
    }
    if (read["kind"] != "delay level") continue;
    from_levels += read["moved"].get<uint64_t>();
    others += read["others"].get<uint64_t>();
  }
  // All nine from the levels (none was due yet); the others' four were read at least once each
  // (one that passed to a shorter level during the transfer is read there again). The two
  // unrouted retries of the service, and not the other's.
  CHECK(result["moved"] == 11);
  CHECK(from_levels == 9);
  CHECK(others >= 4);
  CHECK(from_unrouted == 2);
  CHECK(unrouted_others >= 1);

  // On the new broker: each of the service's eleven no earlier than it was due.
  auto new_broker = test::connect(loop, new_url);
  std::map<std::string, int64_t> due;
  const auto arrived = arrivals(loop, *new_broker, name, 11, due);
  CHECK(arrived.size() == 11);
  CHECK(arrived.count("u0") == 1);
  CHECK(arrived.count("u1") == 1);
  int64_t latest = 0;
  for (const auto& [id, at] : arrived) {
    INFO(id);
    REQUIRE(due[id] > 0);
    CHECK(at >= due[id]);
    latest = std::max(latest, at - due[id]);
  }
  WARN(type << " levels: the service's moved messages came at most " << latest
            << " ms after their due time");

  // On the old broker: the other service's four, where they were, and on time; none of the
  // service's.
  std::map<std::string, int64_t> other_due;
  const auto stayed = arrivals(loop, *old_broker, other, 4, other_due);
  CHECK(stayed.size() == 4);
  for (const auto& [id, at] : stayed) {
    INFO(id);
    CHECK(at >= other_due[id]);
  }
  CHECK(test::queue_depth(loop, *old_broker, name) == 0);
  // The other's unrouted retry is still where it was; none of the service's is.
  std::set<std::string> still_unrouted;
  for (const auto& got : test::drain_queue(loop, *old_broker, unrouted))
    still_unrouted.insert(got.message.properties.message_id.value_or(""));
  CHECK(still_unrouted.count("bu") == 1);
  CHECK(still_unrouted.count("u0") == 0);

  test::close(loop, new_broker);
  test::close(loop, old_broker);
  CHECK(test::run_retryloop(
            {"topology", "delete", file, "--yes", "--force", "--url", new_url, "--service", name})
            .exit_code == 0);
  CHECK(test::run_retryloop({"topology", "delete", file, "--yes", "--force"}).exit_code == 0);
  std::filesystem::remove(file);
}

TEST_CASE(
    "A second transfer of a service is refused while one runs, and a new broker that "
    "differs from the file is refused before anything moves",
    "[transfer]") {
  TestLoop loop;
  const std::string name = test::unique_name("transfer-lock");
  const std::string file = service_file(name, "5s");
  const std::string new_url = target_url();
  REQUIRE(test::run_retryloop({"topology", "apply", file}).exit_code == 0);

  // The new broker has the service queue with another delay: refused, nothing moved.
  const std::string other = service_file(name + "-other", "9s");
  {
    std::ifstream in(other);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string from = name + "-other";
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at))
      text.replace(at, from.size(), name);
    std::ofstream(other) << text;
  }
  REQUIRE(test::run_retryloop({"topology", "apply", other, "--url", new_url}).exit_code == 0);
  test::CommandRun drift = test::run_retryloop({"topology", "transfer", file, "--to", new_url});
  CHECK(drift.exit_code == 3);
  CHECK(drift.err.find("topology migrate") != std::string::npos);
  CHECK(test::run_retryloop({"topology", "delete", other, "--yes", "--force", "--url", new_url})
            .exit_code == 0);
  std::filesystem::remove(other);

  auto old_broker = test::connect(loop, test::broker_url());
  auto holder = test::open_channel(loop, *old_broker);
  client::QueueOptions lock;
  lock.durable = false;
  lock.exclusive = true;
  lock.auto_delete = true;
  test::declare_queue(loop, *holder, transfer::lock_queue_name(name), lock);
  test::CommandRun locked = test::run_retryloop({"topology", "transfer", file, "--to", new_url});
  CHECK(locked.exit_code == 3);
  CHECK(locked.err.find("another `retryloop topology transfer` of " + name + " is running") !=
        std::string::npos);
  test::close(loop, old_broker);
  delete_from_both(file, new_url);
}

TEST_CASE(
    "topology transfer runs over TLS: amqps to the old broker, and to the new one where it "
    "listens with TLS, client certificates given in the URLs",
    "[transfer]") {
  TestLoop loop;
  const std::string name = test::unique_name("transfer-tls");
  const std::string file = service_file(name, "6s");
  const std::string wait = topology::wait_queue_name(name, 6s);
  const std::string parking = topology::parking_queue_name(name);
  const std::string new_url = target_url();
  const char* old_tls = std::getenv("RETRYLOOP_TEST_AMQPS_URL");
  REQUIRE(old_tls != nullptr);
  const char* new_tls = std::getenv("RETRYLOOP_TARGET_AMQPS_URL");
  // A cluster of the test scripts has no TLS listener: the new side is plain AMQP then.
  const std::string to = new_tls != nullptr && *new_tls != '\0' ? new_tls : new_url;
  WARN("the new broker over " << (to == new_url ? "plain AMQP (a cluster)" : "TLS"));
  apply_on_both(file, new_url);

  auto old_broker = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *old_broker);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  test::publish_numbered(loop, *channel, name + ".in", "key", 20, "m");
  reject(loop, *channel, name, 4);
  REQUIRE(test::eventually(
      loop, [&] { return test::queue_depth(loop, *old_broker, wait) == 4; }, 30s));
  test::publish_confirmed(loop, *channel, "", parking, with_id("p1"), "parked body");

  test::CommandRun run = test::run_retryloop(
      {"topology", "transfer", file, "--url", old_tls, "--to", to, "--json"}, 120000);
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  const nlohmann::json result = nlohmann::json::parse(run.out);
  CHECK(result["services"][0]["result"] == "transferred");
  CHECK(result["services"][0]["moved"] == 21);
  for (const std::string& q : {name, wait, parking})
    CHECK(test::queue_depth(loop, *old_broker, q) == 0);

  auto new_broker = test::connect(loop, new_url);
  std::map<std::string, int> copies;
  REQUIRE(test::eventually(
      loop,
      [&] {
        for (auto& got : test::drain_queue(loop, *new_broker, name))
          ++copies[got.message.properties.message_id.value_or("")];
        return copies.size() >= 20;
      },
      60s, 20ms));
  const test::IdCounts counts = test::count_ids(copies, "m", 20);
  CHECK(counts.missing == 0);
  CHECK(counts.extra_copies == 0);
  CHECK(test::drain_queue(loop, *new_broker, parking).size() == 1);

  test::close(loop, new_broker);
  test::close(loop, old_broker);
  delete_from_both(file, new_url);
}

TEST_CASE(
    "topology transfer moves a scheduled queue that no service declares: its messages, the ones "
    "the levels hold for it with their due times, and its unrouted ones, but not before its "
    "owner has declared it on the new broker",
    "[transfer]") {
  TestLoop loop;
  const std::string name = test::unique_name("transfer-mail");
  const std::string mail = name + "-mail";
  const std::string new_url = target_url();
  // A service, and a schedule that delivers to a queue no service declares.
  const std::string file = services_file({name}, "5s", {mail});
  auto old_broker = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *old_broker);
  client::QueueOptions durable;
  durable.durable = true;
  test::declare_queue(loop, *channel, mail, durable);  // its owner declares it
  REQUIRE(test::run_retryloop({"topology", "apply", file}).exit_code == 0);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));

  // Two messages in the queue, three scheduled for it, one in the set's unrouted queue.
  for (const std::string id : {"q0", "q1"})
    test::publish_confirmed(loop, *channel, "", mail, with_id(id), id);
  for (int i = 0; i < 3; ++i) {
    // Due well after the runs below, so that none comes due on the old broker before the move.
    test::CommandRun sent = test::run_retryloop({"send", "-t", file, "--queue", mail, "--delay",
                                                 std::to_string(20 + i) + "s", "--message-id",
                                                 "s" + std::to_string(i), "scheduled"});
    INFO(sent.err);
    REQUIRE(sent.exit_code == 0);
  }
  topology::Schedule schedule;
  schedule.levels = topology::DelayLevels{1s, 5, std::nullopt};
  schedule.queues = {mail};
  const topology::Service ladder = topology::schedule_target(schedule, mail);
  amqp::BasicProperties unrouted = with_id("u0");
  unrouted.headers = amqp::FieldTable{};
  unrouted.headers->set(std::string(schedule::header::due_at), now_ms() - 1000);
  test::publish_confirmed(loop, *channel, topology::delay_unrouted_name(ladder),
                          topology::delay_route(ladder, 3s).routing_key, unrouted, "u0");

  // --queue names a queue no service declares: the service's is refused.
  test::CommandRun usage =
      test::run_retryloop({"topology", "transfer", file, "--to", new_url, "--queue", name});
  CHECK(usage.exit_code == 1);
  CHECK(usage.err.find("use --service " + name) != std::string::npos);
  // The new broker lacks the queue: refused, and nothing moved.
  test::CommandRun refused =
      test::run_retryloop({"topology", "transfer", file, "--to", new_url, "--queue", mail});
  INFO(refused.out << refused.err);
  CHECK(refused.exit_code == 3);
  CHECK(refused.err.find(mail + " must exist on the new broker") != std::string::npos);
  CHECK(test::queue_depth(loop, *old_broker, mail) == 2);

  auto new_broker = test::connect(loop, new_url);
  auto new_channel = test::open_channel(loop, *new_broker);
  test::declare_queue(loop, *new_channel, mail, durable);
  // Neither --service nor --queue: the service, then the queue.
  test::CommandRun run =
      test::run_retryloop({"topology", "transfer", file, "--to", new_url, "--json"}, 120000);
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  const nlohmann::json parsed = nlohmann::json::parse(run.out);
  REQUIRE(parsed["services"].size() == 1);
  REQUIRE(parsed["queues"].size() == 1);
  const nlohmann::json& result = parsed["queues"][0];
  CHECK(result["queue"] == mail);
  CHECK(result["result"] == "transferred");
  CHECK(result["moved"] == 6);

  std::map<std::string, int64_t> due;
  const auto arrived = arrivals(loop, *new_broker, mail, 6, due);
  CHECK(arrived.size() == 6);
  for (const std::string id : {"q0", "q1", "s0", "s1", "s2", "u0"}) {
    INFO(id);
    REQUIRE(arrived.count(id) == 1);
    CHECK(arrived.at(id) >= due[id]);
  }
  CHECK(due["s2"] > 0);
  CHECK(test::queue_depth(loop, *old_broker, mail) == 0);
  CHECK(test::queue_depth(loop, *old_broker, topology::delay_unrouted_name(ladder)) == 0);

  for (auto* connection : {&old_broker, &new_broker}) {
    auto cleanup = test::open_channel(loop, **connection);
    CHECK_FALSE(test::wait(loop, [&](auto done) {
      return cleanup->queue_delete(mail, false, false,
                                   [done](const client::Error& error, uint32_t) { done(error); });
    }));
  }
  test::close(loop, new_broker);
  test::close(loop, old_broker);
  delete_from_both(file, new_url);
}

TEST_CASE(
    "A transfer killed with SIGKILL mid-move and run again finishes: every message on the new "
    "broker, a copy twice at most for the move window, nothing left on the old one",
    "[transfer]") {
  TestLoop loop;
  const std::string name = test::unique_name("transfer-kill");
  const std::string file = service_file(name, "6s");
  const std::string queue = name;
  const std::string wait = topology::wait_queue_name(name, 6s);
  const std::string parking = topology::parking_queue_name(name);
  const std::string new_url = target_url();
  // Applied on the new broker first, as in a blue-green move, so its depth can be watched.
  apply_on_both(file, new_url);

  // Enough messages that the move takes a while, all published before it starts.
  constexpr int kMessages = 20000;
  auto old_broker = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *old_broker);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  test::publish_numbered(loop, *channel, name + ".in", "key", kMessages, "m");
  // Ten retries wait in the wait queue, and one message is parked.
  reject(loop, *channel, queue, 10);
  amqp::FieldTable parked_headers;
  parked_headers.append(std::string(retry::header::reason), std::string("exhausted"));
  amqp::BasicProperties parked = with_id("p1");
  parked.headers = parked_headers;
  test::publish_confirmed(loop, *channel, "", parking, parked, "parked body");

  const std::vector<std::string> transfer{
      test::built_program("retryloop"), "topology", "transfer", file, "--to", new_url, "--json"};
  const std::vector<std::string> env = old_broker_environment();
  auto new_broker = test::connect(loop, new_url);
  {
    test::ChildProcess first(transfer, env);
    // Killed once a fifth of the service queue has reached the new broker.
    REQUIRE(test::eventually(
        loop, [&] { return test::queue_depth(loop, *new_broker, queue) >= kMessages / 5; }, 120s,
        5ms));
    REQUIRE(first.running());
    first.signal(SIGKILL);
    first.wait();
  }
  const uint32_t left = test::queue_depth(loop, *old_broker, queue);
  INFO("left in the old service queue after the kill: " << left);
  REQUIRE(left > 0);

  test::ChildProcess second(transfer, env);
  const int status = second.wait(180000);
  INFO(second.out() << second.err());
  REQUIRE(status == 0);
  const nlohmann::json result = nlohmann::json::parse(second.out());
  CHECK(result["services"][0]["result"] == "transferred");

  for (const std::string& q : {queue, wait, parking})
    CHECK(test::queue_depth(loop, *old_broker, q) == 0);

  // Every message at least once; a copy confirmed whose original was not yet acked when the
  // first run was killed comes twice, and there are at most the move window's worth of those,
  // each with the stamp of its first copy, so that an inbox keyed on it drops the second.
  std::map<std::string, int> copies;
  std::map<std::string, std::set<std::string>> stamps;
  REQUIRE(test::eventually(
      loop,
      [&] {
        for (auto& got : test::drain_queue(loop, *new_broker, queue)) {
          const std::string id = got.message.properties.message_id.value_or("");
          ++copies[id];
          const amqp::FieldValue* stamp = test::header(got, std::string(transfer::stamp_header));
          stamps[id].insert(stamp != nullptr && stamp->as_string()
                                ? std::string(*stamp->as_string())
                                : std::string());
        }
        return copies.size() >= size_t(kMessages);
      },
      60s, 20ms));
  int stamped_twice = 0;
  for (const auto& [id, seen] : stamps) {
    if (seen.size() != 1 || seen.begin()->empty()) ++stamped_twice;
  }
  CHECK(stamped_twice == 0);
  const test::IdCounts counts = test::count_ids(copies, "m", kMessages);
  CHECK(counts.missing == 0);
  CHECK(counts.more_than_twice == 0);
  CHECK(copies.size() == size_t(kMessages));
  CHECK(counts.extra_copies <= 500);
  WARN("killed with " << left << " of " << kMessages << " messages left in the old service queue; "
                      << counts.extra_copies << " moved twice");
  const auto parked_now = test::drain_queue(loop, *new_broker, parking);
  REQUIRE(parked_now.size() == 1);
  CHECK(parked_now[0].message.body == "parked body");

  test::close(loop, new_broker);
  test::close(loop, old_broker);
  delete_from_both(file, new_url);
}

TEST_CASE(
    "topology transfer --follow moves what a publisher not yet switched sends to the old broker "
    "until Ctrl-C, which starts no other service, and ends by itself once the old queues have "
    "been empty for --settle",
    "[transfer]") {
  TestLoop loop;
  const std::string name = test::unique_name("transfer-follow");
  // Two services: Ctrl-C during the first's --follow ends the run without starting the second.
  const std::string file = services_file({name, name + "-b"}, "6s");
  const std::string queue = name;
  const std::string new_url = target_url();
  apply_on_both(file, new_url);
  auto old_broker = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *old_broker);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  test::publish_numbered(loop, *channel, name + ".in", "key", 20, "m");

  const std::vector<std::string> env = old_broker_environment();
  auto new_broker = test::connect(loop, new_url);
  {
    // A settle time no test waits for: Ctrl-C ends this one.
    test::ChildProcess follow({test::built_program("retryloop"), "topology", "transfer", file,
                               "--to", new_url, "--follow", "--settle", "1h", "--json"},
                              env);
    REQUIRE(test::eventually(
        loop, [&] { return test::queue_depth(loop, *new_broker, queue) >= 20; }, 60s, 20ms));
    // The publisher is not switched yet: what it sends to the old broker moves too.
    for (int i = 20; i < 50; ++i)
      test::publish_confirmed(loop, *channel, name + ".in", "key", with_id("m" + std::to_string(i)),
                              "{}");
    REQUIRE(test::eventually(
        loop, [&] { return test::queue_depth(loop, *new_broker, queue) >= 50; }, 60s, 20ms));
    REQUIRE(follow.running());
    follow.signal(SIGINT);
    const int status = follow.wait(60000);
    INFO(follow.out() << follow.err());
    REQUIRE(status == 0);
    const nlohmann::json result = nlohmann::json::parse(follow.out());
    REQUIRE(result["services"].size() == 1);  // the second service was not started
    const nlohmann::json& service = result["services"][0];
    CHECK(service["result"] == "interrupted");
    CHECK(service["moved"] == 50);
    CHECK(service["passes"].get<int>() >= 2);
  }
  CHECK(test::queue_depth(loop, *old_broker, queue) == 0);
  std::set<std::string> ids;
  for (const auto& got : test::drain_queue(loop, *new_broker, queue))
    ids.insert(got.message.properties.message_id.value_or(""));
  CHECK(ids.size() == 50);

  // Nothing left to move: --follow ends by itself once the queues have been empty for --settle.
  test::CommandRun settled = test::run_retryloop(
      {"topology", "transfer", file, "--to", new_url, "--follow", "--settle", "2s", "--json"},
      120000);
  INFO(settled.out << settled.err);
  REQUIRE(settled.exit_code == 0);
  const nlohmann::json again = nlohmann::json::parse(settled.out);
  REQUIRE(again["services"].size() == 2);
  CHECK(again["services"][0]["result"] == "transferred");
  CHECK(again["services"][0]["moved"] == 0);
  CHECK(again["services"][1]["result"] == "transferred");
  CHECK(again["services"][0]["passes"].get<int>() >= 2);

  test::close(loop, new_broker);
  test::close(loop, old_broker);
  delete_from_both(file, new_url);
}

namespace {

/// Starts a migration of `file`'s service on the broker at `url` and stops it at its first move,
/// as a lost connection would: its record says it is unfinished.
void leave_a_migration_unfinished(const std::string& file, const std::string& url) {
  TestLoop loop;
  const topology::ParseResult parsed = topology::load_topology(file);
  REQUIRE(parsed.ok());
  auto connection = test::connect(loop, url);
  migrate::MoveFunction lost = [](auto&&, const migrate::MoveRequest&, auto done) {
    done(client::Error(client::ClientError::connection_lost, "lost at the move"), {});
    return client::Error{};
  };
  migrate::DriverOptions options;
  options.move = std::move(lost);
  bool ended = false;
  client::Error error;
  migrate::Driver::start(connection, parsed.topology->services.front(), std::move(options), {},
                         [&](const client::Error& e, const migrate::Migration*, bool) {
                           error = e;
                           ended = true;
                         });
  REQUIRE(loop.run_until([&] { return ended; }, 120s));
  REQUIRE(error);
  test::close(loop, connection);
}

}  // namespace

TEST_CASE(
    "topology transfer refuses a service whose migration is unfinished on either broker, and "
    "moves it once the migration is finished",
    "[transfer]") {
  TestLoop loop;
  const std::string name = test::unique_name("transfer-migrating");
  const std::string file = service_file(name, "2s");
  const std::string new_url = target_url();
  apply_on_both(file, new_url);
  auto old_broker = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *old_broker);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  test::publish_numbered(loop, *channel, name + ".in", "key", 10, "m");

  // The same service made quorum, its migration stopped half way on the new broker, then on the
  // old one.
  const std::string quorum = (std::filesystem::temp_directory_path() / (name + "-q.json")).string();
  {
    std::ifstream in(file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find(R"("input")"), 7, R"("queue_type": "quorum", "input")");
    std::ofstream(quorum) << text;
  }
  for (const std::string broker : {"new", "old"}) {
    const bool on_new = broker == "new";
    leave_a_migration_unfinished(quorum, on_new ? new_url : test::broker_url());
    for (const bool dry_run : {false, true}) {
      std::vector<std::string> args{"topology", "transfer", quorum, "--to", new_url};
      if (dry_run) args.push_back("--dry-run");
      const test::CommandRun refused = test::run_retryloop(args);
      INFO(broker << " broker, dry run " << dry_run << ": " << refused.out << refused.err);
      // The dry run looks at the old broker only.
      if (dry_run && on_new) {
        CHECK(refused.exit_code == 0);
        continue;
      }
      CHECK(refused.exit_code == 3);
      CHECK_THAT(refused.err, Catch::Contains("the " + broker +
                                              " broker has an unfinished "
                                              "migration") &&
                                  Catch::Contains("nothing was moved"));
    }
    CHECK(test::queue_depth(loop, *old_broker, name) == 10);  // a stopped move keeps them
    std::vector<std::string> finish{"topology", "migrate", quorum};
    if (on_new) finish.insert(finish.end(), {"--url", new_url});
    const test::CommandRun migrated = test::run_retryloop(finish, 120000);
    INFO(migrated.out << migrated.err);
    REQUIRE(migrated.exit_code == 0);
  }

  const test::CommandRun moved =
      test::run_retryloop({"topology", "transfer", quorum, "--to", new_url, "--json"}, 120000);
  INFO(moved.out << moved.err);
  REQUIRE(moved.exit_code == 0);
  CHECK(nlohmann::json::parse(moved.out)["services"][0]["moved"] == 10);
  auto new_broker = test::connect(loop, new_url);
  CHECK(test::queue_depth(loop, *new_broker, name) == 10);
  test::close(loop, new_broker);
  test::close(loop, old_broker);
  delete_from_both(quorum, new_url);
  std::filesystem::remove(file);
}
