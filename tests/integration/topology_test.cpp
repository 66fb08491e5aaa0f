#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/consumer/shared_breaker.hpp"
#include "retryloop/migrate/driver.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/definitions.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/harness.hpp"
#include "support/tcp_proxy.hpp"
#include "support/topology.hpp"

using namespace retryloop;
using client::Channel;
using client::Connection;
using client::Error;
using test::TestLoop;
using topology::ActionKind;
using topology::ActionResult;
using topology::DeleteOptions;
using topology::describe;
using topology::export_definitions;
using topology::format_value;
using topology::make_delete_plan;
using topology::make_plan;
using topology::Plan;
using topology::Report;
using topology::ReportCallback;
using topology::Role;
using topology::split_into_lanes;
using topology::Topology;
using topology::VerifyOptions;

namespace {

/// One service with unique names: input exchange `<name>.in` (direct, key `<name>`).
std::string service_json(const std::string& name, const std::string& retry,
                         const std::string& extra = "", const std::string& exchange = "") {
  std::string x = exchange.empty() ? name + ".in" : exchange;
  return R"({"name": ")" + name + R"(", "input": {"exchange": ")" + x +
         R"(", "type": "direct", "bindings": ["key"]}, "retry": {)" + retry + "}" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

Topology parse(const std::string& services) {
  return parse_valid_topology(R"({"services": [)" + services + "]}");
}

using Runner =
    std::function<Error(const std::shared_ptr<Connection>&, const Plan&, ReportCallback)>;

Report run(TestLoop& loop, const std::shared_ptr<Connection>& connection, const Plan& plan,
           const Runner& runner) {
  bool done = false;
  int calls = 0;
  Report out;
  Error immediate = runner(connection, plan, [&](const Report& report) {
    out = report;
    done = true;
    ++calls;
  });
  INFO(immediate.message());
  REQUIRE_FALSE(immediate);
  REQUIRE(loop.run_until([&] { return done; }));
  loop.run_for(std::chrono::milliseconds(20));
  CHECK(calls == 1);
  return out;
}

Report run_apply(TestLoop& loop, const std::shared_ptr<Connection>& c, const Plan& plan) {
  return run(loop, c, plan, [](auto& conn, auto& p, auto cb) { return apply(conn, p, cb); });
}
Report run_verify(TestLoop& loop, const std::shared_ptr<Connection>& c, const Plan& plan,
                  VerifyOptions options = {}) {
  return run(loop, c, plan,
             [options](auto& conn, auto& p, auto cb) { return verify(conn, p, cb, options); });
}
Report run_delete(TestLoop& loop, const std::shared_ptr<Connection>& c, const Plan& plan,
                  DeleteOptions options) {
  return run(loop, c, plan,
             [options](auto& conn, auto& p, auto cb) { return remove(conn, p, options, cb); });
}

std::string dump(const Report& report) {
  std::string out;
  for (const auto& r : report.results) {
    out += std::string(to_string(r.outcome)) + " " + describe(r.action);
    if (r.drift)
      out += " [" + r.drift->argument + ": " + r.drift->wanted + " vs " + r.drift->actual + "]";
    if (r.error) out += " (" + r.error.message() + ")";
    out += "\n";
  }
  if (report.connection_error) out += "connection: " + report.connection_error.message() + "\n";
  return out;
}

const ActionResult& result_for(const Report& report, ActionKind kind, const std::string& name) {
  for (const auto& r : report.results) {
    if (r.action.kind == kind && r.action.name == name) return r;
  }
  FAIL("no result for " << name);
  throw std::logic_error("unreachable");
}

/// Message counts by passive declare, on one channel reopened after a 404 (the harness's
/// queue_depth opens a new channel per call, too many for polling).
class Probe {
 public:
  Probe(TestLoop& loop, std::shared_ptr<Connection> connection)
      : loop_(loop), connection_(std::move(connection)) {}
  ~Probe() {
    if (channel_ && channel_->is_open()) (void)channel_->close();
  }

  /// Messages ready in `queue`; nullopt when it does not exist.
  std::optional<uint32_t> depth(const std::string& queue) {
    if (!channel_ || !channel_->is_open()) channel_ = test::open_channel(loop_, *connection_);
    client::QueueOptions options;
    options.passive = true;
    bool done = false;
    Error result;
    uint32_t count = 0;
    REQUIRE_FALSE(
        channel_->queue_declare(queue, options, [&](const Error& e, const client::QueueInfo& info) {
          result = e;
          count = info.message_count;
          done = true;
        }));
    REQUIRE(loop_.run_until([&] { return done; }));
    if (result) {
      CHECK(result.reply_code == 404);
      return std::nullopt;
    }
    return count;
  }

  /// Polls until `queue` holds `expected` messages or `timeout` passes; returns the last count.
  uint32_t wait_for(const std::string& queue, uint32_t expected,
                    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    uint32_t last = 0;
    while (true) {
      last = depth(queue).value_or(0);
      if (last == expected || std::chrono::steady_clock::now() >= deadline) return last;
      loop_.run_for(std::chrono::milliseconds(25));
    }
  }

 private:
  TestLoop& loop_;
  std::shared_ptr<Connection> connection_;
  std::shared_ptr<Channel> channel_;
};

/// Whether a queue exists, by passive declare on a fresh channel.
bool queue_exists(TestLoop& loop, Connection& connection, const std::string& queue) {
  auto channel = test::open_channel(loop, connection);
  client::QueueOptions options;
  options.passive = true;
  bool done = false;
  Error result;
  REQUIRE_FALSE(
      channel->queue_declare(queue, options, [&](const Error& e, const client::QueueInfo&) {
        result = e;
        done = true;
      }));
  REQUIRE(loop.run_until([&] { return done; }));
  if (result) CHECK(result.reply_code == 404);
  if (!result) (void)channel->close();
  return !result;
}

bool exchange_exists(TestLoop& loop, Connection& connection, const std::string& exchange) {
  auto channel = test::open_channel(loop, connection);
  client::ExchangeOptions options;
  options.passive = true;
  Error result = test::wait(loop, [&](client::CompletionCallback cb) {
    return channel->exchange_declare(exchange, "direct", options, cb);
  });
  if (result) CHECK(result.reply_code == 404);
  if (!result) (void)channel->close();
  return !result;
}

void delete_queue(TestLoop& loop, Connection& connection, const std::string& queue) {
  auto channel = test::open_channel(loop, connection);
  bool done = false;
  Error result;
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, [&](const Error& e, uint32_t) {
    result = e;
    done = true;
  }));
  REQUIRE(loop.run_until([&] { return done; }));
  INFO(result.message());
  REQUIRE_FALSE(result);
  (void)channel->close();
}

void delete_exchange(TestLoop& loop, Connection& connection, const std::string& exchange) {
  auto channel = test::open_channel(loop, connection);
  Error result = test::wait(loop, [&](client::CompletionCallback cb) {
    return channel->exchange_delete(exchange, false, cb);
  });
  INFO(result.message());
  CHECK_FALSE(result);
  (void)channel->close();
}

void publish(TestLoop& loop, Channel& channel, const std::string& exchange,
             const std::string& routing_key, const std::string& body) {
  amqp::BasicProperties properties;
  properties.delivery_mode = 2;
  properties.message_id = body;
  bool done = false;
  client::PublishOutcome outcome;
  REQUIRE_FALSE(channel.publish(exchange, routing_key, properties, body, client::Mandatory::yes,
                                [&](const client::PublishOutcome& o) {
                                  outcome = o;
                                  done = true;
                                }));
  REQUIRE(loop.run_until([&] { return done; }));
  INFO(outcome.error.message());
  REQUIRE(outcome.ok());
}

std::optional<client::GetResult> get(TestLoop& loop, Channel& channel, const std::string& queue) {
  bool done = false;
  std::optional<client::GetResult> out;
  Error error;
  REQUIRE_FALSE(
      channel.get(queue, false, [&](const Error& e, std::optional<client::GetResult>&& r) {
        error = e;
        out = std::move(r);
        done = true;
      }));
  REQUIRE(loop.run_until([&] { return done; }));
  INFO(error.message());
  REQUIRE_FALSE(error);
  return out;
}

/// The x-death entry for (queue, reason), or nullptr.
const amqp::FieldTable* x_death(const amqp::BasicProperties& properties, const std::string& queue,
                                const std::string& reason) {
  if (!properties.headers) return nullptr;
  const amqp::FieldValue* deaths = properties.headers->find("x-death");
  if (deaths == nullptr) return nullptr;
  const auto* array = deaths->get_if<amqp::FieldArray>();
  if (array == nullptr) return nullptr;
  for (const auto& entry : *array) {
    const auto* table = entry.get_if<amqp::FieldTable>();
    if (table == nullptr) continue;
    const auto* q = table->find("queue");
    const auto* r = table->find("reason");
    if (q && r && q->as_string() == queue && r->as_string() == reason) return table;
  }
  return nullptr;
}

size_t declares(const Plan& plan) {
  size_t n = 0;
  for (const auto& a : plan.actions) {
    n += a.kind == ActionKind::declare_exchange || a.kind == ActionKind::declare_queue;
  }
  return n;
}

size_t binds(const Plan& plan) {
  size_t n = 0;
  for (const auto& a : plan.actions)
    n += a.kind == ActionKind::bind_queue;
  return n;
}

}  // namespace

TEST_CASE("Applying a topology twice creates it once and then finds it all existing",
          "[topology][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  std::string a = test::unique_name("orders");
  std::string b = test::unique_name("audit");
  Plan plan = make_plan(parse(
      service_json(a, R"("delays": ["30s"], "max_attempts": 5)",
                   R"("parking": {"max_length": 1000, "ttl": "14d"})", a + ".shared") +
      ", " +
      service_json(b, R"("mode": "republish", "delays": ["1s", "10s", "1m"], "max_attempts": 5)",
                   R"("queue_type": "quorum", "parking": {"max_length": 10})", a + ".shared")));

  Report first = run_apply(loop, connection, plan);
  INFO(dump(first));
  CHECK(first.ok());
  CHECK(first.count(topology::Outcome::created) == declares(plan));
  CHECK(first.count(topology::Outcome::bound) == binds(plan));
  CHECK(first.count(topology::Outcome::existed) == 0);

  Report second = run_apply(loop, connection, plan);
  INFO(dump(second));
  CHECK(second.ok());
  CHECK(second.count(topology::Outcome::created) == 0);
  CHECK(second.count(topology::Outcome::existed) == declares(plan));
  CHECK(second.count(topology::Outcome::bound) == binds(plan));
  CHECK(result_for(second, ActionKind::declare_queue, b).messages == 0u);

  run_delete(
      loop, connection,
      make_delete_plan(parse(
          service_json(a, R"("delays": ["30s"], "max_attempts": 5)", "", a + ".shared") + ", " +
          service_json(b,
                       R"("mode": "republish", "delays": ["1s", "10s", "1m"], "max_attempts": 5)",
                       "", a + ".shared"))),
      {true, true});
  delete_exchange(loop, *connection, a + ".shared");
  test::close(loop, connection);
}

TEST_CASE(
    "Twelve services applied on parallel lanes, with shared delay levels, are each created "
    "once, verify, and route their retries",
    "[topology][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  const std::string prefix = test::unique_name("lanes");
  std::string services;
  for (int k = 0; k < 12; ++k) {
    const std::string retry = k % 2 == 0
                                  ? R"("mode": "republish", "delays": ["1s"], "max_attempts": 5,
                        "delay_levels": {"base": "100ms", "levels": 4})"
                                  : R"("delays": ["30s"], "max_attempts": 5)";
    services += (k == 0 ? "" : ", ") + service_json(prefix + "." + std::to_string(k), retry,
                                                    k % 3 == 0 ? R"("queue_type": "quorum")" : "");
  }
  Topology topology = parse(services);
  Plan plan = make_plan(topology);
  REQUIRE(split_into_lanes(plan).lanes.size() == 12);

  Report first = run_apply(loop, connection, plan);
  INFO(dump(first));
  CHECK(first.ok());
  CHECK(first.count(topology::Outcome::created) + first.count(topology::Outcome::existed) ==
        declares(plan));
  CHECK(first.count(topology::Outcome::bound) >= binds(plan));
  Report verified = run_verify(loop, connection, plan);
  INFO(dump(verified));
  CHECK(verified.ok());
  CHECK(verified.count(topology::Outcome::matches) == declares(plan));

  // Each service's queue is bound where the plan says: a message to its input exchange arrives.
  auto channel = test::open_channel(loop, *connection);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  for (int k : {0, 5, 11}) {
    const std::string name = prefix + "." + std::to_string(k);
    test::publish_confirmed(loop, *channel, name + ".in", "key", {}, "hello");
    CHECK(test::drain_queue(loop, *connection, name).size() == 1);
  }
  run_delete(loop, connection, make_delete_plan(topology), {true, true});
  for (int k = 0; k < 12; ++k)
    delete_exchange(loop, *connection, prefix + "." + std::to_string(k) + ".in");
  test::close(loop, connection);
}

TEST_CASE("Verify passes after apply, creates nothing, and names drifted arguments",
          "[topology][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  std::string name = test::unique_name("verify");
  Topology t = parse(service_json(name, R"("delays": ["30s"], "max_attempts": 5)"));
  Plan plan = make_plan(t);
  REQUIRE(run_apply(loop, connection, plan).ok());

  Report clean = run_verify(loop, connection, plan);
  INFO(dump(clean));
  CHECK(clean.ok());
  CHECK(clean.count(topology::Outcome::matches) == declares(plan));
  CHECK(clean.count(topology::Outcome::not_checked) == binds(plan));

  // Behind the tool's back: the wait queue gets another TTL, the parking queue goes away.
  const std::string wait = name + ".wait.30s";
  delete_queue(loop, *connection, wait);
  auto channel = test::open_channel(loop, *connection);
  client::QueueOptions other;
  other.arguments.append("x-message-ttl", int32_t{60000});
  other.arguments.append("x-dead-letter-exchange", "");
  other.arguments.append("x-dead-letter-routing-key", name);
  test::declare_queue(loop, *channel, wait, other);
  delete_queue(loop, *connection, name + ".parking");

  Report drifted = run_verify(loop, connection, plan);
  INFO(dump(drifted));
  CHECK_FALSE(drifted.ok());
  const ActionResult& w = result_for(drifted, ActionKind::declare_queue, wait);
  CHECK(w.outcome == topology::Outcome::drifted);
  REQUIRE(w.drift);
  CHECK(w.drift->argument == "x-message-ttl");
  CHECK(w.drift->wanted == "30000");
  CHECK(w.drift->actual == "60000");
  CHECK(w.error.reply_code == 406);
  CHECK(result_for(drifted, ActionKind::declare_queue, name + ".parking").outcome ==
        topology::Outcome::missing);
  // Everything after the 406 and the 404 was still checked.
  CHECK(result_for(drifted, ActionKind::declare_queue, name).outcome == topology::Outcome::matches);
  CHECK(drifted.count(topology::Outcome::not_run) == 0);
  // Verify created nothing.
  CHECK_FALSE(queue_exists(loop, *connection, name + ".parking"));

  run_delete(loop, connection, make_delete_plan(t), {true, true});
  delete_exchange(loop, *connection, name + ".in");
  test::close(loop, connection);
}

/// The plan as a release without queue versions and default delivery limits declared it, with
/// wait queues that dead-letter through the default exchange.
static Plan as_older_release(Plan plan) {
  for (auto& action : plan.actions) {
    if (action.older_arguments) action.arguments = *action.older_arguments;
    for (const auto& name : action.defaults)
      action.arguments.erase(name);
    action.defaults.clear();
  }
  return plan;
}

static void check_older_queues(
    const std::string& queue_type,
    const std::string& retry = R"("delays": ["30s"], "max_attempts": 5)") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  std::string name = test::unique_name("older");
  Topology t = parse(service_json(name, retry, R"("queue_type": ")" + queue_type + R"(")"));
  Plan plan = make_plan(t);
  REQUIRE(run_apply(loop, connection, as_older_release(plan)).ok());

  for (const Report& report :
       {run_apply(loop, connection, plan), run_verify(loop, connection, plan)}) {
    INFO(dump(report));
    CHECK(report.ok());
    CHECK(report.count(topology::Outcome::created) == 0);
    for (const auto& r : report.results) {
      INFO(describe(r.action));
      CHECK(r.outcome != topology::Outcome::drifted);
      std::vector<std::string> missing;
      for (const auto& drift : r.defaults_missing) {
        missing.push_back(drift.argument);
        CHECK(drift.actual == "(not set)");
        CHECK(drift.wanted == format_value(*r.action.arguments.find(drift.argument)));
      }
      CHECK(missing == r.action.defaults);
      CHECK(r.older_form ==
            (r.action.kind == ActionKind::declare_queue && r.action.role == Role::wait_queue));
    }
  }
  if (queue_type == "classic") {
    CHECK(result_for(run_verify(loop, connection, plan), ActionKind::declare_queue, name)
              .defaults_missing.at(0)
              .argument == "x-queue-version");
  }

  run_delete(loop, connection, make_delete_plan(t), {true, true});
  delete_exchange(loop, *connection, name + ".in");
  test::close(loop, connection);
}

TEST_CASE(
    "Classic queues an older release declared without x-queue-version, and wait queues that "
    "dead-letter straight to the service queue, are used as they are, and apply and verify say "
    "so",
    "[topology][integration]") {
  check_older_queues("classic");
}

TEST_CASE(
    "Quorum queues an older release declared without x-delivery-limit, and wait queues that "
    "dead-letter straight to the service queue, are used as they are, and apply and verify say "
    "so",
    "[topology][integration]") {
  check_older_queues("quorum");
}

TEST_CASE(
    "Quorum delay levels an older release declared without x-delivery-limit are used as they "
    "are, and apply and verify say so",
    "[topology][integration]") {
  // A base of its own: no other test shares these levels.
  const std::string retry = R"("mode": "republish", "delays": ["5s"], "max_attempts": 5,
                               "delay_levels": {"base": "1170ms", "levels": 3})";
  check_older_queues("quorum", retry);
  // The levels were among the queues checked: they lack the limit, and stay as they are.
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  Topology t = parse(service_json(test::unique_name("older"), retry, R"("queue_type": "quorum")"));
  Report verified = run_verify(loop, connection, make_plan(t));
  const ActionResult& level =
      result_for(verified, ActionKind::declare_queue, "retryloop.delay.1170ms.quorum.02");
  REQUIRE(level.defaults_missing.size() == 1);
  CHECK(level.defaults_missing[0].argument == "x-delivery-limit");
  test::close(loop, connection);
}

TEST_CASE(
    "Verify without comparing arguments only looks objects up: it creates nothing, needs no "
    "configure permission, and does not see drift",
    "[topology][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  std::string name = test::unique_name("passive");
  Topology t = parse(service_json(name, R"("delays": ["30s"], "max_attempts": 5)"));
  Plan plan = make_plan(t);
  REQUIRE(run_apply(loop, connection, plan).ok());

  // The wait queue drifts and the parking queue goes away.
  const std::string wait = name + ".wait.30s";
  delete_queue(loop, *connection, wait);
  auto channel = test::open_channel(loop, *connection);
  client::QueueOptions other;
  other.arguments.append("x-message-ttl", int64_t{60000});
  test::declare_queue(loop, *channel, wait, other);
  (void)channel->close();
  delete_queue(loop, *connection, name + ".parking");

  // A user that may read and write but not configure anything.
  std::string user = test::unique_name("reader");
  REQUIRE(test::broker_ctl("add_user '" + user + "' reader-password") == 0);
  REQUIRE(test::broker_ctl("set_permissions -p / '" + user + "' '' '.*' '.*'") == 0);
  client::ConnectionOptions options;
  options.uri = client::parse_uri(test::broker_url());
  options.uri.user = user;
  options.uri.password = "reader-password";
  auto reader = test::connect(loop, options);

  Report passive = run_verify(loop, reader, plan, VerifyOptions{false});
  INFO(dump(passive));
  CHECK_FALSE(passive.ok());
  CHECK(result_for(passive, ActionKind::declare_queue, wait).outcome == topology::Outcome::exists);
  CHECK(result_for(passive, ActionKind::declare_queue, name + ".parking").outcome ==
        topology::Outcome::missing);
  CHECK(passive.count(topology::Outcome::exists) == declares(plan) - 1);
  CHECK(passive.count(topology::Outcome::failed) == 0);
  CHECK(passive.count(topology::Outcome::drifted) == 0);
  CHECK(passive.count(topology::Outcome::not_checked) == binds(plan));
  CHECK(result_for(passive, ActionKind::declare_queue, name).exists == std::optional<bool>(true));
  CHECK_FALSE(queue_exists(loop, *connection, name + ".parking"));

  // Comparing arguments declares, which this user may not do: each existing object fails with
  // 403 and says it was found; the missing one is still missing.
  Report compared = run_verify(loop, reader, plan);
  INFO(dump(compared));
  const ActionResult& q = result_for(compared, ActionKind::declare_queue, name);
  CHECK(q.outcome == topology::Outcome::failed);
  CHECK(q.exists == std::optional<bool>(true));
  CHECK(q.error.reply_code == 403);
  CHECK(result_for(compared, ActionKind::declare_queue, name + ".parking").outcome ==
        topology::Outcome::missing);
  CHECK(compared.count(topology::Outcome::failed) == declares(plan) - 1);

  test::close(loop, reader);
  CHECK(test::broker_ctl("delete_user '" + user + "'") == 0);
  run_delete(loop, connection, make_delete_plan(t), {true, true});
  delete_exchange(loop, *connection, name + ".in");
  test::close(loop, connection);
}

TEST_CASE(
    "Apply reports each 406 with the argument, goes on with a new channel, and changes "
    "nothing",
    "[topology][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  std::string name = test::unique_name("drift");
  Topology t = parse(service_json(name, R"("delays": ["5s"], "max_attempts": 5)",
                                  R"("parking": {"max_length": 100})"));
  Plan plan = make_plan(t);

  // Someone declared two of the objects differently before.
  auto channel = test::open_channel(loop, *connection);
  client::QueueOptions parking;
  parking.arguments.append("x-max-length", int32_t{5});
  test::declare_queue(loop, *channel, name + ".parking", parking);
  test::declare_queue(loop, *channel, name, {});

  Report report = run_apply(loop, connection, plan);
  INFO(dump(report));
  CHECK_FALSE(report.ok());
  CHECK(report.count(topology::Outcome::drifted) == 2);
  const ActionResult& p = result_for(report, ActionKind::declare_queue, name + ".parking");
  REQUIRE(p.drift);
  // RabbitMQ checks its arguments in its own order; either difference names the argument.
  CHECK((p.drift->argument == "x-max-length" || p.drift->argument == "x-overflow"));
  const ActionResult& q = result_for(report, ActionKind::declare_queue, name);
  REQUIRE(q.drift);
  CHECK(q.drift->argument.rfind("x-dead-letter-", 0) == 0);
  CHECK(q.drift->actual == "(not set)");
  // The rest of the plan ran.
  CHECK(result_for(report, ActionKind::declare_queue, name + ".wait.5s").outcome ==
        topology::Outcome::created);
  CHECK(result_for(report, ActionKind::declare_exchange, name + ".in").outcome ==
        topology::Outcome::created);
  CHECK(report.count(topology::Outcome::not_run) == 0);
  CHECK(report.count(topology::Outcome::failed) == 0);

  // The queues keep what they had: nothing was deleted or redeclared.
  std::string listing;
  REQUIRE(test::broker_ctl("list_queues -q name arguments", &listing) == 0);
  bool seen = false;
  std::istringstream lines(listing);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name + ".parking\t", 0) == 0) {
      seen = true;
      CHECK(line.find("x-max-length\",5") != std::string::npos);
      CHECK(line.find("x-overflow") == std::string::npos);
    }
  }
  CHECK(seen);

  run_delete(loop, connection, make_delete_plan(t), {true, true});
  delete_exchange(loop, *connection, name + ".in");
  test::close(loop, connection);
}

TEST_CASE("An exchange with \"declare\": false must exist and is never declared",
          "[topology][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  std::string name = test::unique_name("owned");
  std::string exchange = test::unique_name("elsewhere");
  std::string service = R"({"name": ")" + name + R"(", "input": {"exchange": ")" + exchange +
                        R"(", "type": "topic", "declare": false, "bindings": ["a.#"]}, )" +
                        R"("retry": {"delays": ["1s"], "max_attempts": 2}})";
  Topology t = parse(service);
  Plan plan = make_plan(t);

  Report missing = run_apply(loop, connection, plan);
  INFO(dump(missing));
  CHECK_FALSE(missing.ok());
  CHECK(result_for(missing, ActionKind::check_exchange, exchange).outcome ==
        topology::Outcome::missing);
  CHECK_FALSE(exchange_exists(loop, *connection, exchange));

  auto channel = test::open_channel(loop, *connection);
  REQUIRE_FALSE(test::wait(loop, [&](client::CompletionCallback cb) {
    return channel->exchange_declare(exchange, "topic", {}, cb);
  }));
  Report present = run_apply(loop, connection, plan);
  INFO(dump(present));
  CHECK(present.ok());
  CHECK(result_for(present, ActionKind::check_exchange, exchange).outcome ==
        topology::Outcome::existed);
  Report verified = run_verify(loop, connection, plan);
  CHECK(verified.ok());
  // Never declared, so verify cannot compare its type: it only says that it exists.
  CHECK(result_for(verified, ActionKind::check_exchange, exchange).outcome ==
        topology::Outcome::exists);

  run_delete(loop, connection, make_delete_plan(t), {true, true});
  CHECK(exchange_exists(loop, *connection, exchange));
  REQUIRE_FALSE(test::wait(loop, [&](client::CompletionCallback cb) {
    return channel->exchange_delete(exchange, false, cb);
  }));
  test::close(loop, connection);
}

TEST_CASE("Exported definitions imported into an empty vhost give objects verify accepts",
          "[topology][integration]") {
  std::string vhost = test::unique_name("vhost");
  REQUIRE(test::broker_ctl("add_vhost '" + vhost + "'") == 0);
  REQUIRE(test::broker_ctl("set_permissions -p '" + vhost + "' guest '.*' '.*' '.*'") == 0);

  std::string a = test::unique_name("exported");
  std::string b = test::unique_name("quorum");
  std::string headers =
      R"({"name": ")" + b + R"(", "queue_type": "quorum", "input": {"exchange": ")" + b +
      R"(.in", "type": "headers", "bindings": [{"match": "any", "headers": )" +
      R"({"kind": "charge", "version": 2, "urgent": true}}]}, "retry": {"mode": )" +
      R"("republish", "delays": ["5s", "1m"], "max_attempts": 4}, )" +
      R"("parking": {"max_length": 50, "ttl": "7d"}})";
  Topology t = parse(service_json(a, R"("delays": ["30s"], "max_attempts": 5)",
                                  R"("parking": {"max_length": 1000, "ttl": "14d"})") +
                     ", " + headers);
  Plan plan = make_plan(t);
  // In the broker's directory: rabbitmqctl may run in a root of its own that sees only that.
  auto file = std::filesystem::path(test::broker_dir()) / (vhost + ".json");
  {
    std::ofstream out(file);
    out << export_definitions(plan, vhost).dump(2);
  }
  std::string output;
  int rc = test::broker_ctl("import_definitions '" + file.string() + "'", &output);
  std::filesystem::remove(file);
  INFO(output);
  REQUIRE(rc == 0);

  TestLoop loop;
  client::ConnectionOptions options;
  options.uri = client::parse_uri(test::broker_url());
  options.uri.vhost = vhost;
  auto connection = test::connect(loop, options);
  // The import runs asynchronously in the broker.
  Report report;
  for (int i = 0; i < 100; ++i) {
    report = run_verify(loop, connection, plan);
    if (report.ok()) break;
    loop.run_for(std::chrono::milliseconds(100));
  }
  INFO(dump(report));
  CHECK(report.ok());
  CHECK(report.count(topology::Outcome::matches) == declares(plan));

  // Apply agrees too: all existing, and no second copy of any binding (their arguments are
  // compared with their types, and int64 is what the import made).
  Report applied = run_apply(loop, connection, plan);
  INFO(dump(applied));
  CHECK(applied.ok());
  CHECK(applied.count(topology::Outcome::created) == 0);
  std::string bindings;
  REQUIRE(test::broker_ctl("list_bindings -q -p '" + vhost + "' source_name destination_name",
                           &bindings) == 0);
  size_t lines = 0;
  std::istringstream in(bindings);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(b + ".in\t", 0) == 0) ++lines;
  }
  CHECK(lines == 1);

  test::close(loop, connection);
  CHECK(test::broker_ctl("delete_vhost '" + vhost + "'") == 0);
}

namespace {

/// What a consumer that shares its breaker declares (the objects of Role::breaker), with a signal
/// in the state queue as a paused service leaves it.
void declare_breaker(TestLoop& loop, client::Connection& connection, const std::string& service) {
  auto channel = test::open_channel(loop, connection);
  REQUIRE_FALSE(test::wait(loop, [&](client::CompletionCallback cb) {
    consumer::declare_shared_breaker(channel, service, cb);
    return Error{};
  }));
  REQUIRE_FALSE(
      test::wait(loop, [&](client::CompletionCallback cb) { return channel->confirm_select(cb); }));
  publish(loop, *channel, topology::breaker_exchange_name(service), "", "a signal");
  (void)channel->close();
}

/// What a consumer that follows migrations declares (the objects of Role::migration), with a
/// record in the record queue and the queue of what its moves back copied, as a migration killed
/// mid-way leaves them.
void declare_migration(TestLoop& loop, client::Connection& connection, const std::string& service) {
  auto channel = test::open_channel(loop, connection);
  REQUIRE_FALSE(test::wait(loop, [&](client::CompletionCallback cb) {
    return migrate::declare_record_objects(channel, service, cb);
  }));
  test::declare_queue(loop, *channel, migrate::settling_queue_name(service), {});
  test::declare_queue(loop, *channel, topology::migration_copied_queue_name(service), {});
  REQUIRE_FALSE(
      test::wait(loop, [&](client::CompletionCallback cb) { return channel->confirm_select(cb); }));
  publish(loop, *channel, migrate::record_queue_name(service), "", "a record");
  (void)channel->close();
}

void check_delete_refuses(const std::string& queue_type) {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  std::string name = test::unique_name("delete");
  Topology t = parse(service_json(name, R"("delays": ["30s"], "max_attempts": 5)",
                                  R"("queue_type": ")" + queue_type + R"(")"));
  REQUIRE(run_apply(loop, connection, make_plan(t)).ok());
  declare_breaker(loop, *connection, name);
  declare_migration(loop, *connection, name);
  Plan plan = make_delete_plan(t);

  // Without --yes: nothing goes.
  Report dry = run_delete(loop, connection, plan, {false, false});
  INFO(dump(dry));
  CHECK(dry.ok());
  CHECK(dry.count(topology::Outcome::would_delete) == plan.actions.size());
  CHECK(queue_exists(loop, *connection, name));

  auto channel = test::open_channel(loop, *connection);
  REQUIRE_FALSE(
      test::wait(loop, [&](client::CompletionCallback cb) { return channel->confirm_select(cb); }));
  publish(loop, *channel, name + ".parking", "", "parked");

  Report refused = run_delete(loop, connection, plan, {true, false});
  INFO(dump(refused));
  CHECK_FALSE(refused.ok());
  const ActionResult& parking = result_for(refused, ActionKind::delete_queue, name + ".parking");
  CHECK(parking.outcome == topology::Outcome::not_empty);
  CHECK(parking.messages == 1u);
  CHECK(refused.count(topology::Outcome::kept) == plan.actions.size() - 1);
  CHECK(refused.count(topology::Outcome::deleted) == 0);
  CHECK(queue_exists(loop, *connection, name));
  CHECK(queue_exists(loop, *connection, name + ".parking"));
  CHECK(exchange_exists(loop, *connection, name + ".wait"));
  CHECK(Probe(loop, connection).depth(name + ".parking") == 1u);

  Report forced = run_delete(loop, connection, plan, {true, true});
  INFO(dump(forced));
  CHECK(forced.ok());
  CHECK(forced.count(topology::Outcome::deleted) == plan.actions.size());
  CHECK_FALSE(queue_exists(loop, *connection, name + ".parking"));
  CHECK_FALSE(exchange_exists(loop, *connection, name + ".wait"));
  // The input exchange stays.
  CHECK(exchange_exists(loop, *connection, name + ".in"));

  Report again = run_delete(loop, connection, plan, {true, false});
  CHECK(again.ok());
  CHECK(again.count(topology::Outcome::absent) == plan.actions.size());

  // Empty queues go without --force, and so do the breaker's and a migration's, whatever they
  // hold.
  REQUIRE(run_apply(loop, connection, make_plan(t)).ok());
  declare_breaker(loop, *connection, name);
  declare_migration(loop, *connection, name);
  Report empty = run_delete(loop, connection, plan, {true, false});
  INFO(dump(empty));
  CHECK(empty.ok());
  CHECK(empty.count(topology::Outcome::deleted) == plan.actions.size());
  CHECK(connection->is_open());

  REQUIRE_FALSE(test::wait(loop, [&](client::CompletionCallback cb) {
    return channel->exchange_delete(name + ".in", false, cb);
  }));
  test::close(loop, connection);
}

}  // namespace

TEST_CASE("Delete refuses while a queue holds messages, unless forced", "[topology][integration]") {
  check_delete_refuses("classic");
}

TEST_CASE("Delete refuses for quorum queues too, which RabbitMQ cannot delete if-empty",
          "[topology][integration]") {
  check_delete_refuses("quorum");
}

TEST_CASE("Delete refuses while a consumer is attached", "[topology][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  std::string name = test::unique_name("consumed");
  Topology t = parse(service_json(name, R"("delays": ["30s"], "max_attempts": 5)"));
  REQUIRE(run_apply(loop, connection, make_plan(t)).ok());
  auto channel = test::open_channel(loop, *connection);
  bool consuming = false;
  REQUIRE_FALSE(channel->consume(
      name, {}, [](client::Delivery&&) {},
      [&](const Error& e, const std::string&) {
        REQUIRE_FALSE(e);
        consuming = true;
      }));
  REQUIRE(loop.run_until([&] { return consuming; }));
  Report refused = run_delete(loop, connection, make_delete_plan(t), {true, false});
  INFO(dump(refused));
  CHECK(result_for(refused, ActionKind::delete_queue, name).outcome == topology::Outcome::in_use);
  CHECK(queue_exists(loop, *connection, name));
  (void)channel->close();
  run_delete(loop, connection, make_delete_plan(t), {true, true});
  delete_exchange(loop, *connection, name + ".in");
  test::close(loop, connection);
}

TEST_CASE("A connection lost midway ends the run once, with the rest not run",
          "[topology][integration]") {
  TestLoop loop;
  test::TcpProxy proxy(loop.get(), client::parse_uri(test::broker_url()).port);
  client::ConnectionOptions options;
  options.uri = client::parse_uri(test::broker_url());
  options.uri.host = "127.0.0.1";
  options.uri.port = proxy.port();
  auto connection = test::connect(loop, options);
  std::string name = test::unique_name("lost");
  Topology t = parse(service_json(name, R"("delays": ["30s"], "max_attempts": 5)"));
  Plan plan = make_plan(t);

  bool done = false;
  int calls = 0;
  Report report;
  REQUIRE_FALSE(apply(connection, plan, [&](const Report& r) {
    report = r;
    done = true;
    ++calls;
  }));
  proxy.cut();
  REQUIRE(loop.run_until([&] { return done; }));
  loop.run_for(std::chrono::milliseconds(50));
  INFO(dump(report));
  CHECK(calls == 1);
  CHECK(report.connection_error);
  CHECK_FALSE(report.ok());
  CHECK(report.results.back().outcome == topology::Outcome::not_run);
  CHECK(report.count(topology::Outcome::not_run) >= 1);

  // Starting on a closed connection fails at once, and the callback is never called.
  Error immediate = apply(connection, plan, [&](const Report&) { ++calls; });
  CHECK(immediate.code == client::ClientError::not_open);
  loop.run_for(std::chrono::milliseconds(20));
  CHECK(calls == 1);

  // Clean up what may have been declared before the cut.
  auto direct = test::connect(loop, test::broker_url());
  run_delete(loop, direct, make_delete_plan(t), {true, true});
  if (exchange_exists(loop, *direct, name + ".in")) delete_exchange(loop, *direct, name + ".in");
  test::close(loop, direct);
}

namespace {

/// The retry loop with a plain client, for a classic or quorum service.
void check_loop_isolation(const std::string& queue_type) {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  std::string exchange = test::unique_name("shared");
  std::string a = test::unique_name("failing");
  std::string b = test::unique_name("bystander");
  std::string extra = R"("queue_type": ")" + queue_type + R"(")";
  Topology t =
      parse(service_json(a, R"("delays": ["400ms"], "max_attempts": 5)", extra, exchange) + ", " +
            service_json(b, R"("delays": ["30s"], "max_attempts": 5)", extra, exchange));
  REQUIRE(run_apply(loop, connection, make_plan(t)).ok());

  auto channel = test::open_channel(loop, *connection);
  REQUIRE_FALSE(
      test::wait(loop, [&](client::CompletionCallback cb) { return channel->confirm_select(cb); }));
  Probe probe(loop, connection);
  const std::string wait = a + ".wait.400ms";
  publish(loop, *channel, exchange, "key", "m1");
  REQUIRE(probe.wait_for(a, 1) == 1);
  REQUIRE(probe.wait_for(b, 1) == 1);

  // A fails the message: reject without requeue. It spends 400 ms in the wait queue, too short
  // to be sure to see it there; its x-death below tells where it has been.
  auto first = get(loop, *channel, a);
  REQUIRE(first);
  CHECK(first->message.body == "m1");
  const auto rejected_at = std::chrono::steady_clock::now();
  REQUIRE_FALSE(channel->reject(first->delivery_tag, false));

  // After the TTL it is back in A, and only in A (B is checked again after m2, below: a copy
  // routed to B with this one would have arrived by then).
  REQUIRE(probe.wait_for(a, 1) == 1);
  const auto back_after = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - rejected_at);
  INFO("back after " << back_after.count() << " ms");
  CHECK(back_after >= std::chrono::milliseconds(400));  // not before the wait queue's TTL
  CHECK(probe.depth(b) == 1u);
  CHECK(probe.depth(wait) == 0u);
  CHECK(probe.depth(a + ".parking") == 0u);
  auto again = get(loop, *channel, a);
  REQUIRE(again);
  CHECK(again->message.body == "m1");
  CHECK(again->message.properties.message_id == std::optional<std::string>("m1"));
  const amqp::FieldTable* rejected = x_death(again->message.properties, a, "rejected");
  REQUIRE(rejected != nullptr);
  CHECK(rejected->find("count")->as_int64() == 1);
  CHECK(x_death(again->message.properties, wait, "expired") != nullptr);
  REQUIRE_FALSE(channel->ack(again->delivery_tag));

  // With the wait queue gone, a rejected message is parked instead of dropped.
  delete_queue(loop, *connection, wait);
  publish(loop, *channel, exchange, "key", "m2");
  REQUIRE(probe.wait_for(a, 1) == 1);
  auto second = get(loop, *channel, a);
  REQUIRE(second);
  CHECK(second->message.body == "m2");
  REQUIRE_FALSE(channel->reject(second->delivery_tag, false));
  REQUIRE(probe.wait_for(a + ".parking", 1) == 1);
  CHECK(probe.depth(a) == 0u);
  auto parked = get(loop, *channel, a + ".parking");
  REQUIRE(parked);
  CHECK(parked->message.body == "m2");
  REQUIRE_FALSE(channel->ack(parked->delivery_tag));
  CHECK(probe.depth(b) == 2u);

  (void)channel->close();
  run_delete(loop, connection, make_delete_plan(t), {true, true});
  auto cleanup = test::open_channel(loop, *connection);
  REQUIRE_FALSE(test::wait(loop, [&](client::CompletionCallback cb) {
    return cleanup->exchange_delete(exchange, false, cb);
  }));
  test::close(loop, connection);
}

}  // namespace

TEST_CASE(
    "A rejected message comes back after the delay to its own queue only, and is parked "
    "when its wait queue is gone",
    "[topology][integration]") {
  check_loop_isolation("classic");
}

TEST_CASE("The same loop holds for quorum queues with at-least-once dead-lettering",
          "[topology][integration]") {
  check_loop_isolation("quorum");
}
