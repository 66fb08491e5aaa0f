// topology migrate against a real broker: a classic service made quorum with messages waiting,
// retries waiting in its wait queue and messages parked; the same with the service's instances
// handling throughout, some of them started from the file before the migration; a migration
// stopped mid-way and run again; a second migration refused while one runs; a change that is
// refused.

#include <httplib.h>
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "retryloop/client/channel.hpp"
#include "retryloop/client/timer.hpp"
#include "retryloop/consumer/consumer.hpp"
#include "retryloop/migrate/driver.hpp"
#include "retryloop/topology/plan.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"
#include "support/tcp_proxy.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using test::Broker;
using test::make_service;
using test::TestLoop;

namespace {

const char* const retry_2s = R"("mode": "reject", "delays": ["2s"], "max_attempts": 3)";

struct DriverRun {
  client::Error error;
  bool refused = false;
  bool finished = false;
  size_t steps_done = 0;
  size_t steps = 0;
  uint64_t moved = 0;
  /// DriverEvents::moving: how often it came, and what it said last of each move.
  size_t moving_calls = 0;
  std::vector<std::pair<uint64_t, uint64_t>> last_moving;
};

/// Whether the broker refused a new quorum queue because it could not form its Raft cluster in
/// time (541 ... cluster_not_formed): RabbitMQ 4.0 does so when the machine is loaded, and closes
/// the connection. The migration stops there and its error says to run it again.
bool quorum_queue_not_formed(const client::Error& error) {
  return error.message().find("cluster_not_formed") != std::string::npos;
}

DriverRun run_driver_once(TestLoop& loop, Broker& broker, const topology::Service& service,
                          migrate::MoveFunction mover, DriverRun run);

/// Runs the migration to its end; run again, as its error says, when the broker could not form a
/// new quorum queue in time (at most three runs).
DriverRun run_driver(TestLoop& loop, Broker& broker, const topology::Service& service,
                     migrate::MoveFunction mover) {
  DriverRun run = run_driver_once(loop, broker, service, mover, DriverRun{});
  for (int again = 0; again < 2 && quorum_queue_not_formed(run.error); ++again) {
    WARN("the broker could not form a new quorum queue in time; the migration is run again: "
         << run.error.message());
    broker.connection = test::connect(loop, test::broker_url());
    broker.channel = test::open_channel(loop, *broker.connection);
    REQUIRE_FALSE(
        test::wait(loop, [&](auto done) { return broker.channel->confirm_select(done); }));
    run.error = {};
    run.finished = false;
    run = run_driver_once(loop, broker, service, mover, std::move(run));
  }
  return run;
}

DriverRun run_driver_once(TestLoop& loop, Broker& broker, const topology::Service& service,
                          migrate::MoveFunction mover, DriverRun run) {
  migrate::DriverOptions options;
  options.move = std::move(mover);
  options.consumers_grace = 5s;
  migrate::DriverEvents events;
  events.moving = [&run](const migrate::Migration&, const migrate::Step&, uint64_t moved,
                         uint64_t total) {
    if (run.moving_calls++ == 0 || moved < run.last_moving.back().first) {
      run.last_moving.emplace_back(moved, total);
    } else {
      run.last_moving.back() = {moved, total};
    }
  };
  migrate::Driver::start(
      broker.connection, service, std::move(options), std::move(events),
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

/// Declares `queue` with `options` on a channel of its own; the broker's answer, and in `info`
/// (when given) what it said of the queue.
client::Error declare(TestLoop& loop, Broker& broker, const std::string& queue,
                      const client::QueueOptions& options, client::QueueInfo* info = nullptr) {
  bool done = false;
  client::Error result;
  std::shared_ptr<client::Channel> channel;
  REQUIRE_FALSE(broker.connection->open_channel(
      [&](const client::Error& error, std::shared_ptr<client::Channel> opened) {
        REQUIRE_FALSE(error);
        channel = std::move(opened);
        REQUIRE_FALSE(channel->queue_declare(
            queue, options, [&](const client::Error& error, const client::QueueInfo& answer) {
              result = error;
              if (info != nullptr) *info = answer;
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

/// The messages `queue` holds, or nullopt when it does not exist (one passive declare, so that a
/// queue deleted meanwhile is not an error).
std::optional<uint32_t> depth_if_there(TestLoop& loop, Broker& broker, const std::string& queue) {
  client::QueueOptions passive;
  passive.passive = true;
  client::QueueInfo info;
  if (declare(loop, broker, queue, passive, &info)) return std::nullopt;
  return info.message_count;
}

amqp::FieldTable declared_arguments(const topology::Service& service, const std::string& queue) {
  for (const topology::Action& action : topology::make_plan(topology::Topology{{service}}).actions)
    if (action.kind == topology::ActionKind::declare_queue && action.name == queue)
      return action.arguments;
  FAIL("no declaration of " << queue);
  return {};
}

/// A topology file in which service `name` (as make_service makes it, retry_2s) is quorum.
std::string quorum_file(const std::string& name) {
  const std::string file = (std::filesystem::temp_directory_path() / (name + ".json")).string();
  std::ofstream(file) << R"({"services": [{"name": ")" << name << R"(", "queue_type": "quorum",
      "input": {"exchange": ")"
                      << name << R"(.in", "type": "direct", "bindings": ["key"]},
      "retry": {)" << retry_2s
                      << "}}]}";
  return file;
}

std::string string_header(const client::GetResult& got, const std::string& name) {
  if (!got.message.properties.headers) return {};
  const amqp::FieldValue* value = got.message.properties.headers->find(name);
  if (value == nullptr || !value->as_string()) return {};
  return std::string(*value->as_string());
}

/// Publishes messages `first`..`last` - 1 to `service`'s input exchange, one every `every`, each
/// confirmed, from the test's loop (while the test runs the loop for something else).
struct SteadyPublisher {
  Broker& broker;
  std::string exchange;
  int next = 0;
  int last = 0;
  std::chrono::milliseconds every{0};
  size_t confirmed = 0;
  size_t failed = 0;

  void start() {
    client::run_after(broker.loop.get(), every, [this] { step(); });
  }
  void step() {
    amqp::BasicProperties properties;
    properties.message_id = "m-" + std::to_string(next);
    properties.delivery_mode = 2;
    const client::Error error =
        broker.channel->publish(exchange, "key", properties, "{}", client::Mandatory::yes,
                                [this](const client::PublishOutcome& outcome) {
                                  ++confirmed;
                                  if (!outcome.ok()) ++failed;
                                });
    if (error) ++failed, ++confirmed;
    if (++next < last) start();
  }
};

}  // namespace

TEST_CASE(
    "A classic service made quorum while two instances handle loses no message, counts each "
    "retry's attempts across the holding queue, never stops handling for 5 s, and instances of "
    "the old file and the new one started afterwards run",
    "[migrate][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const std::string name = test::unique_name("migrate-live");
  const char* const retry = R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)";
  const auto classic = make_service(name, retry, R"("queue_type": "classic")");
  const auto quorum = make_service(name, retry, R"("queue_type": "quorum")");
  broker.apply(classic);
  // A backlog the instances take a few seconds to work through, so that the migration moves one.
  const int preloaded = 1500;
  for (int i = 0; i < preloaded; ++i)
    broker.publish(classic.input.exchange, "key", "m-" + std::to_string(i));

  // Every tenth message fails its first attempt; each takes 2 ms on one of 2 workers.
  test::Recorder handled;
  auto handler = [&handled](const consumer::Message& message) {
    handled.add(message);
    std::this_thread::sleep_for(2ms);
    const std::string id(message.message_id());
    if (message.attempt == 1 && id.size() > 2 && id.back() == '7') {
      return consumer::Outcome::retry("fails once");
    }
    return consumer::Outcome::ack();
  };
  auto instance_options = [&](const topology::Service& service) {
    consumer::ConsumerOptions options = test::options_for(service);
    options.handler_on_loop = false;
    options.concurrency = 2;
    options.prefetch = 20;
    return options;
  };
  std::vector<std::shared_ptr<consumer::Consumer>> instances;
  instances.push_back(test::start(loop, instance_options(classic), handler));
  instances.push_back(test::start(loop, instance_options(classic), handler));

  // Publishers go on through the migration: 600 more, one every 5 ms.
  SteadyPublisher publisher{broker, classic.input.exchange, preloaded, preloaded + 600, 5ms};
  publisher.start();
  const auto began = std::chrono::steady_clock::now();
  const DriverRun run = run_driver(loop, broker, quorum, migrate::mover());
  const auto ended = std::chrono::steady_clock::now();
  INFO(run.error.message());
  REQUIRE_FALSE(run.error);
  CHECK(run.steps_done == run.steps);
  REQUIRE(loop.run_until([&] { return publisher.next == publisher.last; }, 60s));
  REQUIRE(loop.run_until([&] { return publisher.confirmed == size_t(600); }, 60s));
  CHECK(publisher.failed == 0);

  // Every message is acked: each id once at least, the tenths at their second attempt.
  const int total = preloaded + 600;
  auto acked = [&] {
    std::map<std::string, int64_t> last_attempt;
    for (const test::Call& call : handled.calls())
      last_attempt[call.id] = std::max(last_attempt[call.id], call.attempt);
    size_t done = 0;
    for (const auto& [id, attempt] : last_attempt)
      done += id.back() == '7' ? attempt >= 2 : attempt >= 1;
    return done;
  };
  REQUIRE(loop.run_until([&] { return acked() == size_t(total); }, 90s));
  // A duplicate still to come is in the service queue, its wait queue or an instance's hands:
  // counted once all are empty.
  const std::string service_queue = topology::input_queue_name(quorum);
  const std::string wait_queue = topology::wait_queue_name(name, 1s);
  REQUIRE(test::eventually(loop, [&] {
    for (const auto& instance : instances)
      if (instance->in_flight() != 0) return false;
    return broker.depth(service_queue) == 0 && broker.depth(wait_queue) == 0;
  }));
  std::map<std::string, std::vector<int64_t>> attempts;
  for (const test::Call& call : handled.calls())
    attempts[call.id].push_back(call.attempt);
  CHECK(attempts.size() == size_t(total));
  // A message published while a binding passes between the queues (from its bind on one to its
  // unbind on the other: one round trip, longer where the broker writes bindings to disk, as
  // RabbitMQ 4.3 does) reaches both and is handled twice; so does a retry that comes due while
  // the wait exchange's binding passes. So duplicates are allowed, but only those: first
  // attempts in runs of consecutive publishes, one per binding move of the input exchange (there
  // are 2), each at most 1 s of the publisher's 200 a second, never of a message that waited in
  // the queue (the mover moves those once); and a few returning retries.
  std::vector<int> twice;
  size_t retries_twice = 0;
  std::string twice_seen;
  for (const auto& [id, seen] : attempts) {
    INFO(id);
    const size_t wanted = id.back() == '7' ? 2 : 1;
    if (seen.size() > wanted) {
      std::string list;
      for (int64_t attempt : seen)
        list += " " + std::to_string(attempt);
      twice_seen += " " + id + ":" + list;
      if (std::count(seen.begin(), seen.end(), 1) > 1) {
        twice.push_back(std::stoi(id.substr(2)));
      } else {
        ++retries_twice;
      }
    }
    CHECK(*std::max_element(seen.begin(), seen.end()) == int64_t(wanted));
  }
  std::sort(twice.begin(), twice.end());
  size_t runs = 0;
  size_t longest_run = 0;
  for (size_t i = 0, begin = 0; i < twice.size(); ++i) {
    if (i == 0 || twice[i] - twice[i - 1] > 2) ++runs, begin = i;
    longest_run = std::max(longest_run, size_t(twice[i] - twice[begin] + 1));
  }
  INFO("handled more than once (attempts):" << twice_seen);
  CHECK(runs <= 2);
  CHECK(longest_run <= 200);
  for (const int index : twice)
    CHECK(index >= preloaded);
  CHECK(retries_twice <= 10);
  for (const auto& instance : instances)
    CHECK(instance->metrics().parked() == 0);

  // The longest time without a handler call while the migration ran and a message waited: until
  // every message had its first attempt (after that, the retries come back when their delay ends,
  // and a slow machine's migration can outlast the work).
  std::vector<test::Call> calls = handled.calls();
  std::sort(calls.begin(), calls.end(),
            [](const test::Call& a, const test::Call& b) { return a.at < b.at; });
  std::set<std::string> first_attempts;
  auto work_ended = ended;
  for (const test::Call& call : calls) {
    if (call.attempt == 1) first_attempts.insert(call.id);
    if (first_attempts.size() == size_t(total)) {
      work_ended = std::min(ended, call.at);
      break;
    }
  }
  std::vector<std::chrono::steady_clock::time_point> times;
  for (const test::Call& call : calls)
    if (call.at >= began && call.at <= work_ended) times.push_back(call.at);
  REQUIRE(times.size() > 2);
  std::chrono::steady_clock::duration gap = times.front() - began;
  std::chrono::steady_clock::time_point gap_began = began;
  for (size_t i = 1; i < times.size(); ++i) {
    if (times[i] - times[i - 1] > gap) {
      gap = times[i] - times[i - 1];
      gap_began = times[i - 1];
    }
  }
  auto ms = [](std::chrono::steady_clock::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  INFO("longest gap " << ms(gap) << " ms, from " << ms(gap_began - began)
                      << " ms into a migration of " << ms(ended - began)
                      << " ms, the last first attempt at " << ms(work_ended - began) << " ms");
  CHECK(gap < 5s);

  const std::string queue = topology::input_queue_name(quorum);
  CHECK(declared_with(loop, broker, queue, declared_arguments(quorum, queue)));
  CHECK_FALSE(exists(loop, broker, migrate::holding_queue_name(queue)));
  for (const auto& instance : instances)
    CHECK(instance->state() == consumer::ConsumerState::consuming);

  // Instances of either file started now run on what the migration made.
  instances.push_back(test::start(loop, instance_options(quorum), handler));
  instances.push_back(test::start(loop, instance_options(classic), handler));
  for (int i = 0; i < 40; ++i)
    broker.publish(classic.input.exchange, "key", "after-" + std::to_string(i));
  REQUIRE(loop.run_until(
      [&] {
        for (int i = 0; i < 40; ++i)
          if (handled.of("after-" + std::to_string(i)).empty()) return false;
        return true;
      },
      30s));
  CHECK(instances[2]->metrics().acked > 0);
  CHECK(instances[3]->metrics().acked > 0);
  for (const auto& instance : instances)
    test::stop(loop, instance);
  broker.remove(quorum);
}

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

  // The driver's own mover, which tells how far each move is.
  const DriverRun run = run_driver(loop, broker, quorum, migrate::MoveFunction{});
  INFO(run.error.message());
  REQUIRE_FALSE(run.error);
  CHECK(run.steps_done == run.steps);
  CHECK(run.moved >= 2 * waiting);
  CHECK(run.moving_calls >= 2 * size_t(waiting));
  // Out of the service queue and back: each move ends with all it found at its start.
  bool whole_moves = false;
  for (const auto& [moved, total] : run.last_moving)
    whole_moves = whole_moves || (total >= size_t(waiting) && moved >= total);
  CHECK(whole_moves);

  const std::string queue = topology::input_queue_name(quorum);
  CHECK(declared_with(loop, broker, queue, declared_arguments(quorum, queue)));
  CHECK_FALSE(exists(loop, broker, migrate::holding_queue_name(queue)));
  // The retry came back from its wait queue when its TTL ended (the broker's x-death says so),
  // into the service queue or the holding queue, and was moved on with the rest: once, or twice
  // when its TTL ended while a binding passed from one queue to the other (docs/migrate.md).
  std::vector<client::GetResult> messages = broker.drain(queue);
  REQUIRE(messages.size() >= size_t(waiting) + 1);
  REQUIRE(messages.size() <= size_t(waiting) + 2);
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
  CHECK(retries == int(messages.size()) - waiting);
  std::set<std::string> stamps;
  int next = 0;
  for (const auto& got : messages) {
    const std::string id = got.message.properties.message_id.value_or("");
    if (id == "retry-1") continue;
    CHECK(id == "m-" + std::to_string(next));
    CHECK(got.message.body == "body-" + std::to_string(next));
    ++next;
    const std::string stamp = string_header(got, std::string(migrate::stamp_header));
    CHECK_FALSE(stamp.empty());
    stamps.insert(stamp);
  }
  CHECK(stamps.size() == size_t(waiting));
  std::vector<client::GetResult> parked = broker.drain(topology::parking_queue_name(name));
  REQUIRE(parked.size() == 5);
  for (const auto& got : parked) {
    CHECK(string_header(got, "retryloop-reason") == "exhausted");
    CHECK(string_header(got, "retryloop-error") == "payments said no");
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
  migrate::MoveFunction lost = [](auto&&, const migrate::MoveRequest&, auto done) {
    done(client::Error(client::ClientError::connection_lost, "lost at the move"), {});
    return client::Error{};
  };
  const DriverRun first = run_driver(loop, broker, quorum, lost);
  REQUIRE(first.error);
  CHECK(first.steps_done > 0);
  CHECK(first.steps_done < first.steps);
  const std::string queue = topology::input_queue_name(quorum);
  CHECK(broker.depth(queue) == 200);  // unbound, its messages still there

  const DriverRun second = run_driver(loop, broker, quorum, migrate::mover());
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
  const DriverRun third = run_driver(loop, broker, quorum, migrate::mover());
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

  const DriverRun run = run_driver(loop, broker, quorum, migrate::mover());
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
  const DriverRun run = run_driver(loop, broker, topic, migrate::mover());
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
  const std::string file = quorum_file(name);

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

  // On a terminal (script(1) gives it one) the move's line carries a bar as it goes.
  test::ChildProcess on_terminal({"/usr/bin/script", "-qec",
                                  test::built_program("retryloop") + " topology migrate " + file +
                                      " --url '" + test::broker_url() + "'",
                                  "/dev/null"});
  const int code = on_terminal.wait(120000);
  INFO(on_terminal.out() << on_terminal.err());
  REQUIRE(code == 0);
  CHECK_THAT(on_terminal.out(), Catch::Contains("migrated"));
  CHECK_THAT(on_terminal.out(), Catch::Contains("] 100% 30 of 30"));
  CHECK_THAT(on_terminal.out(), Catch::Contains("\r\033[K"));
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

namespace {

/// Where a run of the driver is stopped: its connection cut as a step begins (`before`: nothing
/// of the step reached the broker), or once the step's operation has reached it, its reply held
/// back (`after`: done on the broker, not recorded). The lock goes with the connection, as with
/// a SIGKILL.
enum class CutAt { before, after };

DriverRun run_cut_at(TestLoop& loop, const topology::Service& service, size_t step, CutAt at) {
  test::TcpProxy proxy(loop.get(), client::parse_uri(test::broker_url()).port);
  client::ConnectionOptions connect;
  connect.uri = client::parse_uri(test::broker_url());
  connect.uri.port = proxy.port();
  auto connection = test::connect(loop, connect);
  DriverRun run;
  bool cutting = false;
  bool cut = false;
  migrate::DriverOptions options;
  options.move = migrate::mover();
  options.consumers_grace = 5s;
  migrate::DriverEvents events;
  events.step_started = [&](const migrate::Migration& migration, const migrate::Step&) {
    if (cutting || migration.current_index() + 1 != step) return;
    cutting = true;
    if (at == CutAt::before) {
      proxy.cut();
      cut = true;
      return;
    }
    proxy.hold_replies();
    // The operation is sent once this returns; a loopback round trip later it is done.
    client::run_after(loop.get(), 300ms, [&] {
      proxy.cut();
      cut = true;
    });
  };
  migrate::Driver::start(
      connection, service, std::move(options), std::move(events),
      [&](const client::Error& error, const migrate::Migration* migration, bool refused) {
        run.error = error;
        run.refused = refused;
        if (migration != nullptr) {
          run.steps_done = migration->current_index();
          run.steps = migration->plan().steps.size();
        }
        run.finished = true;
      });
  REQUIRE(loop.run_until([&] { return run.finished && (!cutting || cut); }, 120s));
  return run;
}

}  // namespace

TEST_CASE(
    "A migration whose connection is lost as each of its steps begins, and once each step is "
    "done on the broker but not recorded, is finished by the next run, every message once, and "
    "service status and verify name it meanwhile",
    "[migrate][integration][cli]") {
  TestLoop loop;
  Broker broker(loop);
  const std::string name = test::unique_name("migrate-cut");
  const auto classic = make_service(name, retry_2s, R"("queue_type": "classic")");
  const auto quorum = make_service(name, retry_2s, R"("queue_type": "quorum")");
  broker.apply(classic);
  const int waiting = 200;
  for (int i = 0; i < waiting; ++i)
    broker.publish(classic.input.exchange, "key", "m-" + std::to_string(i));
  for (int i = 0; i < 3; ++i)
    broker.publish(topology::parking_exchange_name(name), "", "p-" + std::to_string(i));
  const std::string file = quorum_file(name);

  // Run k is cut at step k (before it, then after it), and the next run goes on from the record.
  size_t cuts = 0;
  size_t steps = 0;
  for (size_t step = 1; steps == 0 || step <= steps; ++step) {
    for (const CutAt at : {CutAt::before, CutAt::after}) {
      // Each run waits for the lock the run cut before it held, which the broker frees once it
      // has seen that connection close (a moment later on RabbitMQ 4).
      const DriverRun run = run_cut_at(loop, quorum, step, at);
      INFO("step " << step << (at == CutAt::before ? " before" : " after") << ": "
                   << run.error.message());
      REQUIRE(run.error);  // every run is cut short
      REQUIRE(run.steps > 0);
      steps = run.steps;
      CHECK(run.steps_done + 1 >= step);  // it went on from where the last one stopped
      ++cuts;
    }
    if (step == 6) {
      // Mid-way, what an operator sees.
      test::CommandRun status = test::run_retryloop({"service", "status", "-t", file, name});
      INFO(status.out << status.err);
      CHECK(status.exit_code == 0);
      CHECK_THAT(status.out, Catch::Contains("migrating: migration "));
      CHECK_THAT(status.out, Catch::Contains("topology migrate " + file + " --service " + name));
      test::CommandRun json =
          test::run_retryloop({"service", "status", "-t", file, name, "--json"});
      REQUIRE(json.exit_code == 0);
      CHECK(nlohmann::json::parse(json.out)["migrating"] == true);
      test::CommandRun verified = test::run_retryloop({"topology", "verify", file});
      INFO(verified.out << verified.err);
      CHECK_THAT(verified.err, Catch::Contains("service " + name + " is migrating"));
      // The console's breaker badge says so too.
      const std::string token = "migrate-token-0123456789abcdef";
      const std::string token_file = file + ".token";
      std::ofstream(token_file) << token << "\n";
      test::ChildProcess console(
          {test::built_program("retryloop"), "parking", "serve", "-t", file, name, "--url",
           test::broker_url(), "--listen", "127.0.0.1:0", "--token-file", token_file,
           "--allow-counted-reads"},  // mid-migration its parking queue is the old one
          {"RETRYLOOP_CONSOLE_TOKEN="});
      const int port = test::console_port(console);
      INFO(console.out() + console.err());
      REQUIRE(port != 0);
      httplib::Client http("127.0.0.1", port);
      nlohmann::json migrating;
      CHECK(test::eventually(loop, [&] {
        auto state = http.Get("/api/state", {{"X-Retryloop-Token", token}});
        if (!state || state->status != 200) return false;
        migrating = nlohmann::json::parse(state->body).value("migrating", nlohmann::json());
        return migrating.is_object();
      }));
      CHECK(migrating["next_step"] == 5);  // cut as its step 6 began, twice
      std::filesystem::remove(token_file);
    }
  }
  CHECK(steps > 10);
  CHECK(cuts == 2 * steps);
  const DriverRun last = run_driver(loop, broker, quorum, migrate::mover());
  INFO(last.error.message());
  REQUIRE_FALSE(last.error);
  CHECK(last.steps_done == last.steps);

  const std::string queue = topology::input_queue_name(quorum);
  CHECK(declared_with(loop, broker, queue, declared_arguments(quorum, queue)));
  CHECK_FALSE(exists(loop, broker, migrate::holding_queue_name(queue)));
  std::map<std::string, int> copies;
  for (const auto& got : broker.drain(queue))
    ++copies[got.message.properties.message_id.value_or("")];
  CHECK(copies.size() == size_t(waiting));
  for (const auto& [id, count] : copies) {
    INFO(id);
    CHECK(count == 1);
  }
  CHECK(broker.drain(topology::parking_queue_name(name)).size() == 3);
  test::CommandRun status = test::run_retryloop({"service", "status", "-t", file, name, "--json"});
  REQUIRE(status.exit_code == 0);
  CHECK(nlohmann::json::parse(status.out)["migrating"] == false);
  std::filesystem::remove(file);
  broker.remove(quorum);
}

namespace {

/// When kill_and_rerun kills the migration (the queues' depths looked at every 5 ms).
enum class KillWhen {
  /// once a fifth of the service queue has been copied into the holding queue;
  moving_out,
  /// once a tenth of the holding queue has been copied back into the service queue made again.
  moving_back,
};

/// Migrates a classic service of 20,000 messages to quorum, SIGKILLs the command at `when`, runs
/// it again, and checks that every message is in the service queue: exactly once after a kill
/// while moving out, at most the mover's window twice after one while moving back.
void kill_and_rerun(KillWhen when) {
  TestLoop loop;
  Broker broker(loop);
  const std::string name = test::unique_name("migrate-kill");
  const auto classic = make_service(name, retry_2s, R"("queue_type": "classic")");
  const auto quorum = make_service(name, retry_2s, R"("queue_type": "quorum")");
  broker.apply(classic);
  // Enough messages that the move takes a while, each with an id, all published before it.
  constexpr int kMessages = 20000;
  test::publish_numbered(loop, *broker.channel, classic.input.exchange, "key", kMessages, "m-");

  const std::string file = quorum_file(name);
  const std::string queue = topology::input_queue_name(quorum);
  const std::string holding = migrate::holding_queue_name(queue);
  // A connect timeout of 60 s, a bound on a hang: on a loaded machine RabbitMQ 3.10 once stood
  // still for 10 s here, and the rerun's connection did not open within the default.
  const std::string url = test::broker_url() + "?connection_timeout=60000";
  const std::vector<std::string> command{
      test::built_program("retryloop"), "topology", "migrate", file, "--url", url};
  {
    test::ChildProcess first(command);
    // Moved out once the service queue has been seen empty or gone beside the holding queue:
    // from the first move's end to the move back's start it is (drained, deleted, declared
    // again, its bindings given back), several recorded steps.
    bool moved_out = false;
    REQUIRE(test::eventually(
        loop,
        [&] {
          const std::optional<uint32_t> held = depth_if_there(loop, broker, holding);
          if (!held) return false;
          if (when == KillWhen::moving_out) return *held >= kMessages / 5;
          const uint64_t depth = depth_if_there(loop, broker, queue).value_or(0);
          moved_out = moved_out || depth == 0;
          return moved_out && depth >= uint64_t(kMessages / 10);
        },
        120s, 5ms));
    REQUIRE(first.running());
    first.signal(SIGKILL);
    first.wait();
  }
  // Copies confirmed whose originals were not yet acked: in both queues, once the broker has put
  // the killed run's unacked originals back.
  int in_both = 0;
  CHECK(test::eventually(loop, [&] {
    in_both = int(broker.depth(queue)) + int(broker.depth(holding)) - kMessages;
    return in_both >= 0;
  }));

  test::CommandRun second;
  for (int run = 0; run < 3; ++run) {
    second = test::run_retryloop({"topology", "migrate", file, "--url", url}, 300000);
    if (second.err.find("cluster_not_formed") == std::string::npos) break;
    WARN("the broker could not form a new quorum queue in time; run again: " << second.err);
  }
  INFO(second.out << second.err);
  REQUIRE(second.exit_code == 0);
  CHECK_FALSE(exists(loop, broker, holding));
  CHECK_FALSE(exists(loop, broker, topology::migration_copied_queue_name(name)));

  std::map<std::string, int> copies;
  for (const auto& got : broker.drain(queue))
    ++copies[got.message.properties.message_id.value_or("")];
  const test::IdCounts counts = test::count_ids(copies, "m-", kMessages);
  CHECK(counts.missing == 0);
  if (when == KillWhen::moving_out) {
    CHECK(counts.repeated == 0);
    CHECK(copies.size() == size_t(kMessages));
    WARN(in_both << " messages were in both queues after the kill; each came back once");
  } else {
    // Copied into the service queue, whose instances may have handled them already, and not
    // yet recorded: the rerun cannot tell those originals from messages still to move
    // (docs/migrate.md, "Resuming"). The record makes them at most the mover's window.
    CHECK(counts.repeated <= 500);
    CHECK(counts.more_than_twice == 0);
    WARN(in_both << " messages were in both queues after the kill; " << counts.repeated
                 << " came back twice");
  }
  std::filesystem::remove(file);
  broker.remove(quorum);
}

}  // namespace

TEST_CASE(
    "A migration killed with SIGKILL mid-move and run again leaves every message in the service "
    "queue exactly once",
    "[migrate][integration][broker-wide]") {
  kill_and_rerun(KillWhen::moving_out);
}

TEST_CASE(
    "A migration killed with SIGKILL while it moves the messages back and run again leaves every "
    "message in the service queue, at most the mover's window of them twice",
    "[migrate][integration][broker-wide]") {
  kill_and_rerun(KillWhen::moving_back);
}
