// topology migrate against a real broker: a classic service made quorum with messages waiting,
// retries waiting in its wait queue and messages parked; a migration stopped mid-way and run
// again; a second migration refused while one runs; a change that is refused.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "retryloop/client/channel.hpp"
#include "retryloop/migrate/driver.hpp"
#include "retryloop/topology/plan.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using test::Broker;
using test::make_service;
using test::TestLoop;

namespace {

const char* const retry_2s = R"("mode": "reject", "delays": ["2s"], "max_attempts": 3)";

struct Run {
  client::Error error;
  bool refused = false;
  bool finished = false;
  size_t steps_done = 0;
  size_t steps = 0;
  uint64_t moved = 0;
};

Run run_driver(TestLoop& loop, Broker& broker, const topology::Service& service,
               migrate::MoveFunction mover) {
  Run run;
  migrate::DriverOptions options;
  options.move = std::move(mover);
  options.consumers_grace = 5s;
  migrate::Driver::start(
      broker.connection, service, std::move(options), {},
      [&](const client::Error& error, const migrate::Migration* migration, bool refused) {
        run.error = error;
        run.refused = refused;
        if (migration != nullptr) {
          run.steps_done = migration->current_index();
          run.steps = migration->plan().steps.size();
          run.moved = migration->record().moved;
        }
        run.finished = true;
      });
  REQUIRE(loop.run_until([&] { return run.finished; }, 120s));
  return run;
}

/// Declares `queue` with `options` on a channel of its own; the broker's answer.
client::Error declare(TestLoop& loop, Broker& broker, const std::string& queue,
                      const client::QueueOptions& options) {
  bool done = false;
  client::Error result;
  std::shared_ptr<client::Channel> channel;
  REQUIRE_FALSE(broker.connection->open_channel(
      [&](const client::Error& error, std::shared_ptr<client::Channel> opened) {
        REQUIRE_FALSE(error);
        channel = std::move(opened);
        REQUIRE_FALSE(channel->queue_declare(
            queue, options, [&](const client::Error& error, const client::QueueInfo&) {
              result = error;
              done = true;
            }));
      }));
  REQUIRE(loop.run_until([&] { return done; }));
  if (channel->is_open()) static_cast<void>(channel->close());
  return result;
}

/// Whether `queue` exists with `arguments` (a declare with them; a 406 says no).
bool declared_with(TestLoop& loop, Broker& broker, const std::string& queue,
                   const amqp::FieldTable& arguments) {
  client::QueueOptions options;
  options.arguments = arguments;
  return !declare(loop, broker, queue, options);
}

/// Whether `queue` exists (a passive declare).
bool exists(TestLoop& loop, Broker& broker, const std::string& queue) {
  client::QueueOptions passive;
  passive.passive = true;
  return !declare(loop, broker, queue, passive);
}

amqp::FieldTable declared_arguments(const topology::Service& service, const std::string& queue) {
  for (const topology::Action& action : topology::make_plan(topology::Topology{{service}}).actions)
    if (action.kind == topology::ActionKind::declare_queue && action.name == queue)
      return action.arguments;
  FAIL("no declaration of " << queue);
  return {};
}

std::string header(const client::GetResult& got, const std::string& name) {
  if (!got.message.properties.headers) return {};
  const amqp::FieldValue* value = got.message.properties.headers->find(name);
  if (value == nullptr || !value->as_string()) return {};
  return std::string(*value->as_string());
}

}  // namespace

TEST_CASE(
    "A classic service made quorum keeps every waiting message in order, stamped once, every "
    "parked message with its headers, and its retries come back no earlier than due",
    "[migrate][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const std::string name = test::unique_name("migrate");
  const auto classic = make_service(name, retry_2s, R"("queue_type": "classic")");
  const auto quorum = make_service(name, retry_2s, R"("queue_type": "quorum")");
  broker.apply(classic);
  const int waiting = 300;
  for (int i = 0; i < waiting; ++i)
    broker.publish(classic.input.exchange, "key", "m-" + std::to_string(i),
                   "body-" + std::to_string(i));
  // A retry waiting in the wait queue: due 2 s after it went in.
  broker.publish(topology::wait_exchange_name(name), "2s", "retry-1");
  amqp::BasicProperties parked_properties;
  parked_properties.headers.emplace().set("retryloop-reason", amqp::FieldValue("exhausted"));
  parked_properties.headers->set("retryloop-error", amqp::FieldValue("payments said no"));
  for (int i = 0; i < 5; ++i) {
    broker.publish(topology::parking_exchange_name(name), "", "p-" + std::to_string(i), "parked",
                   parked_properties);
  }

  const Run run = run_driver(loop, broker, quorum, migrate::mover());
  INFO(run.error.message());
  REQUIRE_FALSE(run.error);
  CHECK(run.steps_done == run.steps);
  CHECK(run.moved >= 2 * waiting);

  const std::string queue = topology::input_queue_name(quorum);
  CHECK(declared_with(loop, broker, queue, declared_arguments(quorum, queue)));
  CHECK_FALSE(exists(loop, broker, migrate::holding_queue_name(queue)));
  // The retry came back from its wait queue when its TTL ended (the broker's x-death says so),
  // into the service queue or the holding queue, and was moved on with the rest, once.
  std::vector<client::GetResult> messages = broker.drain(queue);
  REQUIRE(messages.size() == size_t(waiting) + 1);
  int retries = 0;
  for (const auto& got : messages) {
    if (got.message.properties.message_id.value_or("") != "retry-1") continue;
    ++retries;
    const amqp::FieldValue* deaths =
        got.message.properties.headers ? got.message.properties.headers->find("x-death") : nullptr;
    REQUIRE(deaths != nullptr);
    const auto* entry = deaths->get_if<amqp::FieldArray>()->front().get_if<amqp::FieldTable>();
    REQUIRE(entry != nullptr);
    CHECK(entry->find("reason")->as_string() == std::string_view("expired"));
  }
  CHECK(retries == 1);
  std::set<std::string> stamps;
  int next = 0;
  for (const auto& got : messages) {
    const std::string id = got.message.properties.message_id.value_or("");
    if (id == "retry-1") continue;
    CHECK(id == "m-" + std::to_string(next));
    CHECK(got.message.body == "body-" + std::to_string(next));
    ++next;
    const std::string stamp = header(got, std::string(migrate::stamp_header));
    CHECK_FALSE(stamp.empty());
    stamps.insert(stamp);
  }
  CHECK(stamps.size() == size_t(waiting));
  std::vector<client::GetResult> parked = broker.drain(topology::parking_queue_name(name));
  REQUIRE(parked.size() == 5);
  for (const auto& got : parked) {
    CHECK(header(got, "retryloop-reason") == "exhausted");
    CHECK(header(got, "retryloop-error") == "payments said no");
    CHECK(got.message.body == "parked");
  }
  broker.remove(quorum);
}

TEST_CASE(
    "A migration stopped at its move is finished by a second run, from its record, with nothing "
    "lost and nothing twice",
    "[migrate][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const std::string name = test::unique_name("migrate-resume");
  const auto classic = make_service(name, retry_2s, R"("queue_type": "classic")");
  const auto quorum = make_service(name, retry_2s, R"("queue_type": "quorum")");
  broker.apply(classic);
  for (int i = 0; i < 200; ++i)
    broker.publish(classic.input.exchange, "key", "m-" + std::to_string(i));

  // The first run's connection is lost at its first move: the steps before it are recorded.
  migrate::MoveFunction lost = [](auto&&, const std::string&, const std::string&,
                                  const std::string&, bool, auto done) {
    done(client::Error(client::ClientError::connection_lost, "lost at the move"), {});
    return client::Error{};
  };
  const Run first = run_driver(loop, broker, quorum, lost);
  REQUIRE(first.error);
  CHECK(first.steps_done > 0);
  CHECK(first.steps_done < first.steps);
  const std::string queue = topology::input_queue_name(quorum);
  CHECK(broker.depth(queue) == 200);  // unbound, its messages still there

  const Run second = run_driver(loop, broker, quorum, migrate::mover());
  INFO(second.error.message());
  REQUIRE_FALSE(second.error);
  CHECK(second.steps_done == second.steps);
  CHECK(declared_with(loop, broker, queue, declared_arguments(quorum, queue)));
  std::vector<client::GetResult> messages = broker.drain(queue);
  REQUIRE(messages.size() == 200);
  std::set<std::string> ids;
  for (const auto& got : messages)
    ids.insert(got.message.properties.message_id.value_or(""));
  CHECK(ids.size() == 200);

  // Run again once finished: nothing differs any more.
  const Run third = run_driver(loop, broker, quorum, migrate::mover());
  CHECK_FALSE(third.error);
  CHECK(third.steps == 0);
  broker.remove(quorum);
}

TEST_CASE("A second migration of a service is refused while one runs", "[migrate][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const std::string name = test::unique_name("migrate-lock");
  const auto classic = make_service(name, retry_2s, R"("queue_type": "classic")");
  const auto quorum = make_service(name, retry_2s, R"("queue_type": "quorum")");
  broker.apply(classic);
  // Another connection holds the service's lock, as a running migration does.
  TestLoop other_loop;
  Broker other(other_loop);
  bool locked = false;
  client::QueueOptions lock;
  lock.durable = false;
  lock.exclusive = true;
  lock.auto_delete = true;
  REQUIRE_FALSE(other.channel->queue_declare(
      migrate::lock_queue_name(name), lock,
      [&](const client::Error& error, const client::QueueInfo&) { locked = !error; }));
  REQUIRE(other_loop.run_until([&] { return locked; }));

  const Run run = run_driver(loop, broker, quorum, migrate::mover());
  REQUIRE(run.error);
  CHECK_THAT(run.error.message(), Catch::Contains("another `retryloop topology migrate`"));
  CHECK(broker.depth(topology::input_queue_name(classic)) == 0);
  broker.remove(quorum);
}

TEST_CASE("An input exchange of another type is refused, and nothing is changed",
          "[migrate][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const std::string name = test::unique_name("migrate-refused");
  const auto direct = make_service(name, retry_2s, R"("queue_type": "classic")");
  broker.apply(direct);
  topology::Service topic = make_service(name, retry_2s, R"("queue_type": "quorum")");
  topic.input.type = topology::ExchangeType::topic;
  const Run run = run_driver(loop, broker, topic, migrate::mover());
  CHECK(run.refused);
  CHECK(run.steps == 0);
  const std::string queue = topology::input_queue_name(direct);
  CHECK(declared_with(loop, broker, queue, declared_arguments(direct, queue)));
  broker.remove(direct);
}

TEST_CASE(
    "topology migrate prints its plan with --dry-run, as JSON too, changes nothing then, migrates "
    "when run, and apply points at it when it finds drift",
    "[migrate][integration][cli]") {
  TestLoop loop;
  Broker broker(loop);
  const std::string name = test::unique_name("migrate-cli");
  const auto classic = make_service(name, retry_2s, R"("queue_type": "classic")");
  const auto quorum = make_service(name, retry_2s, R"("queue_type": "quorum")");
  broker.apply(classic);
  for (int i = 0; i < 30; ++i)
    broker.publish(classic.input.exchange, "key", "m-" + std::to_string(i));
  const std::string file = (std::filesystem::temp_directory_path() / (name + ".json")).string();
  std::ofstream(file) << R"({"services": [{"name": ")" << name << R"(", "queue_type": "quorum",
      "input": {"exchange": ")"
                      << name << R"(.in", "type": "direct", "bindings": ["key"]},
      "retry": {)" << retry_2s
                      << "}}]}";

  test::CommandRun applied = test::run_retryloop({"topology", "apply", file});
  INFO(applied.out << applied.err);
  CHECK(applied.exit_code == 3);
  CHECK_THAT(applied.err, Catch::Contains("topology migrate FILE --dry-run"));

  test::CommandRun dry = test::run_retryloop({"topology", "migrate", file, "--dry-run"});
  INFO(dry.out << dry.err);
  REQUIRE(dry.exit_code == 0);
  CHECK_THAT(dry.out, Catch::Contains("60 messages to move"));
  CHECK_THAT(dry.out, Catch::Contains("move " + name + " -> " + name + ".migrating"));
  CHECK_THAT(dry.out, Catch::Contains("the service queue differs from the file"));
  test::CommandRun json = test::run_retryloop({"topology", "migrate", file, "--dry-run", "--json"});
  REQUIRE(json.exit_code == 0);
  const auto parsed = nlohmann::json::parse(json.out);
  REQUIRE(parsed["services"].size() == 1);
  CHECK(parsed["services"][0]["messages_to_move"] == 60);
  CHECK(parsed["services"][0]["steps"].size() > 10);
  CHECK(broker.depth(topology::input_queue_name(classic)) == 30);  // nothing changed

  test::CommandRun run = test::run_retryloop({"topology", "migrate", file}, 120000);
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  CHECK_THAT(run.out, Catch::Contains("migrated"));
  test::CommandRun verified = test::run_retryloop({"topology", "verify", file});
  INFO(verified.out << verified.err);
  CHECK(verified.exit_code == 0);
  CHECK(broker.depth(topology::input_queue_name(quorum)) == 30);
  test::CommandRun again = test::run_retryloop({"topology", "migrate", file});
  CHECK(again.exit_code == 0);
  CHECK_THAT(again.out, Catch::Contains("nothing to migrate"));
  std::filesystem::remove(file);
  broker.remove(quorum);
}
