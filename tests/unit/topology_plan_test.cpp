#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/definitions.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/topology.hpp"

using namespace retryloop;
using topology::ActionKind;
using topology::broker_needed;
using topology::describe;
using topology::describe_outage;
using topology::export_definitions;
using topology::format_value;
using topology::load_topology;
using topology::make_plan;
using topology::outage_json;
using topology::parse_inequivalent_arg;
using topology::parse_topology;
using topology::ParseResult;
using topology::Plan;
using topology::PlanLanes;
using topology::Role;
using topology::split_into_lanes;
using topology::to_json;
using topology::Topology;
using topology::unsupported_by_broker;

namespace {

Topology load_valid(const std::string& file) {
  auto path = std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "topology" /
              "valid" / file;
  ParseResult result = load_topology(path.string());
  REQUIRE(result.ok());
  return *result.topology;
}

std::string service_json(
    const std::string& name, const std::string& extra,
    const std::string& retry = R"("delays": ["30s"], "max_attempts": 5)",
    const std::string& input =
        R"("exchange": "orders.in", "type": "direct", "bindings": ["orders"])") {
  return R"({"name": ")" + name + R"(", "input": {)" + input + R"(}, "retry": {)" + retry + "}" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

std::string one(const std::string& service) {
  return R"({"services": [)" + service + "]}";
}

/// "kind name" for each action, the shape of a plan at a glance.
std::vector<std::string> outline(const Plan& plan) {
  std::vector<std::string> out;
  for (const auto& a : plan.actions) {
    std::string line = std::string(to_string(a.kind)) + " " + a.name;
    if (a.kind == ActionKind::bind_queue) line += " <- " + a.exchange + " " + a.routing_key;
    out.push_back(line);
  }
  return out;
}

const topology::Action& find(const Plan& plan, ActionKind kind, const std::string& name) {
  for (const auto& a : plan.actions) {
    if (a.kind == kind && a.name == name) return a;
  }
  FAIL("no " << to_string(kind) << " " << name);
  throw std::logic_error("unreachable");
}

/// name=value(type letter) for each argument, in order.
std::vector<std::string> args(const amqp::FieldTable& table) {
  std::vector<std::string> out;
  for (const auto& e : table) {
    out.push_back(e.name + "=" + format_value(e.value) + "(" + e.value.type_letter() + ")");
  }
  return out;
}

using Strings = std::vector<std::string>;

}  // namespace

TEST_CASE("A classic reject-mode service declares parking, then wait, then input", "[topology]") {
  Plan plan = make_plan(parse_valid_topology(one(service_json("orders", ""))));
  CHECK(outline(plan) == Strings{
                             "declare_exchange orders.parking",
                             "declare_queue orders.parking",
                             "bind_queue orders.parking <- orders.parking ",
                             "declare_exchange orders.wait",
                             "declare_queue orders.wait.30s",
                             "bind_queue orders.wait.30s <- orders.wait 30s",
                             "declare_exchange orders.in",
                             "declare_queue orders",
                             "bind_queue orders <- orders.in orders",
                             "bind_queue orders <- orders.wait orders",
                         });
  CHECK(find(plan, ActionKind::declare_exchange, "orders.parking").exchange_type == "fanout");
  CHECK(args(find(plan, ActionKind::declare_queue, "orders.parking").arguments) ==
        Strings{"x-queue-version=2(l)"});

  const topology::Action& wait_exchange = find(plan, ActionKind::declare_exchange, "orders.wait");
  CHECK(wait_exchange.exchange_type == "direct");
  CHECK(args(wait_exchange.arguments) == Strings{"alternate-exchange=orders.parking(S)"});

  CHECK(args(find(plan, ActionKind::declare_queue, "orders.wait.30s").arguments) ==
        Strings{"x-queue-version=2(l)", "x-message-ttl=30000(l)",
                "x-dead-letter-exchange=orders.wait(S)", "x-dead-letter-routing-key=orders(S)"});
  CHECK(args(find(plan, ActionKind::declare_queue, "orders").arguments) ==
        Strings{"x-queue-version=2(l)", "x-dead-letter-exchange=orders.wait(S)",
                "x-dead-letter-routing-key=30s(S)"});
  CHECK(find(plan, ActionKind::declare_exchange, "orders.in").exchange_type == "direct");
  for (const auto& a : plan.actions) {
    CHECK(a.durable);
    CHECK(a.services == Strings{"orders"});
  }
}

TEST_CASE(
    "The wait queue dead-letters through the wait exchange to the service's own queue, not to "
    "the input exchange",
    "[topology]") {
  Plan plan =
      make_plan(parse_valid_topology(one(service_json("orders", R"("queue": "orders.v2")"))));
  const topology::Action& wait = find(plan, ActionKind::declare_queue, "orders.wait.30s");
  CHECK(format_value(*wait.arguments.find("x-dead-letter-exchange")) == "orders.wait");
  CHECK(format_value(*wait.arguments.find("x-dead-letter-routing-key")) == "orders.v2");
  CHECK(find(plan, ActionKind::declare_queue, "orders.v2").arguments.size() == 3);
  // Only Q is bound under its own name, so the retry reaches Q alone, and parking (the wait
  // exchange's alternate exchange) while Q is gone.
  const topology::Action& back = plan.actions.back();
  CHECK(back.kind == ActionKind::bind_queue);
  CHECK(back.name == "orders.v2");
  CHECK(back.exchange == "orders.wait");
  CHECK(back.routing_key == "orders.v2");
  // The form older releases declared, which an existing wait queue may still have.
  REQUIRE(wait.older_arguments);
  CHECK(args(*wait.older_arguments) == Strings{"x-queue-version=2(l)", "x-message-ttl=30000(l)",
                                               "x-dead-letter-exchange=\"\"(S)",
                                               "x-dead-letter-routing-key=orders.v2(S)"});
  CHECK_FALSE(find(plan, ActionKind::declare_queue, "orders.v2").older_arguments);
}

TEST_CASE(
    "Republish mode gets one wait queue per distinct delay, and the queue's dead-letter key is "
    "the first delay",
    "[topology]") {
  Plan plan = make_plan(parse_valid_topology(one(service_json(
      "orders", "",
      R"("mode": "republish", "delays": ["1s", "10s", "1000ms", "1m"], "max_attempts": 9)"))));
  CHECK(outline(plan) == Strings{
                             "declare_exchange orders.parking",
                             "declare_queue orders.parking",
                             "bind_queue orders.parking <- orders.parking ",
                             "declare_exchange orders.wait",
                             "declare_queue orders.wait.1s",
                             "bind_queue orders.wait.1s <- orders.wait 1s",
                             "declare_queue orders.wait.10s",
                             "bind_queue orders.wait.10s <- orders.wait 10s",
                             "declare_queue orders.wait.1m",
                             "bind_queue orders.wait.1m <- orders.wait 1m",
                             "declare_exchange orders.in",
                             "declare_queue orders",
                             "bind_queue orders <- orders.in orders",
                             "bind_queue orders <- orders.wait orders",
                         });
  CHECK(format_value(*find(plan, ActionKind::declare_queue, "orders.wait.1m")
                          .arguments.find("x-message-ttl")) == "60000");
  CHECK(format_value(*find(plan, ActionKind::declare_queue, "orders")
                          .arguments.find("x-dead-letter-routing-key")) == "1s");
}

TEST_CASE("Quorum services get quorum queues with at-least-once dead-lettering", "[topology]") {
  Plan plan = make_plan(parse_valid_topology(one(service_json(
      "orders", R"("queue_type": "quorum", "parking": {"max_length": 100, "ttl": "7d"})",
      R"("mode": "republish", "delays": ["5s", "1m"], "max_attempts": 4)"))));
  CHECK(args(find(plan, ActionKind::declare_queue, "orders").arguments) ==
        Strings{"x-queue-type=quorum(S)", "x-delivery-limit=1000000(l)",
                "x-dead-letter-exchange=orders.wait(S)", "x-dead-letter-routing-key=5s(S)",
                "x-dead-letter-strategy=at-least-once(S)", "x-overflow=reject-publish(S)"});
  CHECK(args(find(plan, ActionKind::declare_queue, "orders.wait.1m").arguments) ==
        Strings{"x-queue-type=quorum(S)", "x-message-ttl=60000(l)",
                "x-dead-letter-exchange=orders.wait(S)", "x-dead-letter-routing-key=orders(S)",
                "x-dead-letter-strategy=at-least-once(S)", "x-overflow=reject-publish(S)"});
  // The parking queue dead-letters nowhere: no strategy, overflow only for its length limit,
  // and, like the service queue, a delivery limit the broker never reaches.
  CHECK(args(find(plan, ActionKind::declare_queue, "orders.parking").arguments) ==
        Strings{"x-queue-type=quorum(S)", "x-delivery-limit=1000000(l)", "x-max-length=100(l)",
                "x-overflow=reject-publish(S)", "x-message-ttl=604800000(l)"});
}

TEST_CASE(
    "Queue versions and delivery limits are defaults an existing queue may lack, and the file's "
    "delivery limit is the consumer's, not the queue's",
    "[topology]") {
  Plan classic = make_plan(parse_valid_topology(one(service_json("orders", ""))));
  for (const auto& a : classic.actions) {
    INFO(describe(a));
    CHECK(a.defaults ==
          (a.kind == ActionKind::declare_queue ? Strings{"x-queue-version"} : Strings{}));
  }

  Plan quorum =
      make_plan(parse_valid_topology(one(service_json("orders", R"("queue_type": "quorum")"))));
  CHECK(find(quorum, ActionKind::declare_queue, "orders").defaults == Strings{"x-delivery-limit"});
  CHECK(find(quorum, ActionKind::declare_queue, "orders.parking").defaults ==
        Strings{"x-delivery-limit"});
  CHECK(find(quorum, ActionKind::declare_queue, "orders.wait.30s").defaults.empty());
  CHECK(find(quorum, ActionKind::declare_queue, "orders.wait.30s")
            .arguments.find("x-delivery-limit") == nullptr);

  Plan explicit_limit = make_plan(parse_valid_topology(
      one(service_json("orders", R"("queue_type": "quorum", "delivery_limit": 5)"))));
  const topology::Action& q = find(explicit_limit, ActionKind::declare_queue, "orders");
  CHECK(q.defaults == Strings{"x-delivery-limit"});
  CHECK(format_value(*q.arguments.find("x-delivery-limit")) == "1000000");
}

TEST_CASE(
    "A quorum service's replicas become every one of its queues' initial group size, a default an "
    "existing queue may lack",
    "[topology]") {
  Plan plan = make_plan(parse_valid_topology(
      one(service_json("orders", R"("queue_type": "quorum", "replicas": 3)"))));
  size_t queues = 0;
  for (const auto& a : plan.actions) {
    if (a.kind != ActionKind::declare_queue) continue;
    INFO(describe(a));
    ++queues;
    const amqp::FieldValue* size = a.arguments.find("x-quorum-initial-group-size");
    REQUIRE(size != nullptr);
    CHECK(size->type_letter() == 'l');
    CHECK(format_value(*size) == "3");
    CHECK(std::count(a.defaults.begin(), a.defaults.end(), "x-quorum-initial-group-size") == 1);
  }
  CHECK(queues == 3);  // input, wait, parking

  Plan without =
      make_plan(parse_valid_topology(one(service_json("orders", R"("queue_type": "quorum")"))));
  for (const auto& a : without.actions) {
    CHECK(a.arguments.find("x-quorum-initial-group-size") == nullptr);
  }
}

TEST_CASE("Parking limits refuse new messages rather than drop old ones", "[topology]") {
  Plan plan = make_plan(
      parse_valid_topology(one(service_json("orders", R"("parking": {"max_length": 1000000})"))));
  CHECK(args(find(plan, ActionKind::declare_queue, "orders.parking").arguments) ==
        Strings{"x-queue-version=2(l)", "x-max-length=1000000(l)", "x-overflow=reject-publish(S)"});
  Plan ttl_only =
      make_plan(parse_valid_topology(one(service_json("orders", R"("parking": {"ttl": "14d"})"))));
  CHECK(args(find(ttl_only, ActionKind::declare_queue, "orders.parking").arguments) ==
        Strings{"x-queue-version=2(l)", "x-message-ttl=1209600000(l)"});
}

TEST_CASE(
    "An in_queue service's input queue holds its own retries (x-delayed-retry-*): no wait queue",
    "[topology]") {
  Plan plan = make_plan(load_valid("in_queue.json"));
  const topology::Action& q = find(plan, ActionKind::declare_queue, "invoices");
  const auto q_args = args(q.arguments);
  for (const char* wanted :
       {"x-delayed-retry-type=failed(S)", "x-delayed-retry-min=1000(l)",
        "x-delayed-retry-max=30000(l)", "x-queue-type=quorum(S)", "x-delivery-limit=1000000(l)"}) {
    INFO(wanted);
    CHECK(std::find(q_args.begin(), q_args.end(), wanted) != q_args.end());
  }
  for (const auto& a : plan.actions) {
    INFO(describe(a));
    CHECK(a.role != Role::wait_queue);
  }
  CHECK(unsupported_by_broker(q, client::BrokerVersion{4, 3, 0}).empty());
  CHECK(unsupported_by_broker(q, std::nullopt).empty());
  CHECK_THAT(unsupported_by_broker(q, client::BrokerVersion{4, 0, 5}),
             Catch::Contains("needs RabbitMQ 4.3 or later") &&
                 Catch::Contains("the broker is RabbitMQ 4.0.5"));
  CHECK(unsupported_by_broker(find(plan, ActionKind::declare_queue, "invoices.parking"),
                              client::BrokerVersion{3, 10, 8})
            .empty());
  CHECK(broker_needed(load_valid("in_queue.json").services.front()) ==
        std::pair<unsigned, unsigned>{4, 3});
  CHECK(broker_needed(load_valid("minimal.json").services.front()) ==
        std::pair<unsigned, unsigned>{0, 0});
}

TEST_CASE("No plan ever sets x-expires or drop-head, and integers are always int64", "[topology]") {
  Plan plan = make_plan(load_valid("all_features.json"));
  for (const auto& a : plan.actions) {
    INFO(describe(a));
    CHECK(a.arguments.find("x-expires") == nullptr);
    if (const auto* overflow = a.arguments.find("x-overflow")) {
      CHECK(format_value(*overflow) == "reject-publish");
    }
    for (const auto& e : a.arguments) {
      if (e.value.as_int64() && !e.value.as_string()) CHECK(e.value.type_letter() == 'l');
    }
  }
}

TEST_CASE(
    "No plan needs what RabbitMQ 4.3 refuses: transient queues, x-queue-mode, classic queue "
    "version 1",
    "[topology]") {
  // RabbitMQ 4.3 refuses transient non-exclusive queues, x-queue-mode and x-queue-version 1 (and
  // global QoS, which Channel::qos cannot send). Every valid example and every shipped topology
  // file, so that a new option cannot bring one back unnoticed.
  std::vector<std::filesystem::path> files;
  const auto root = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  for (const auto& dir : {root / "tests" / "data" / "topology" / "valid", root / "topology"}) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() == ".json") files.push_back(entry.path());
    }
  }
  REQUIRE(files.size() >= 8);
  size_t objects = 0;
  for (const auto& file : files) {
    INFO(file.filename().string());
    ParseResult result = load_topology(file.string());
    REQUIRE(result.ok());
    for (const auto& a : make_plan(*result.topology).actions) {
      if (a.kind != ActionKind::declare_queue && a.kind != ActionKind::declare_exchange) continue;
      INFO(describe(a));
      ++objects;
      CHECK(a.durable);
      CHECK(a.arguments.find("x-queue-mode") == nullptr);
      if (const auto* version = a.arguments.find("x-queue-version")) {
        CHECK(version->as_int64() == 2);
      }
    }
  }
  CHECK(objects > 50);
}

TEST_CASE("Every exchange a plan refers to is declared (or checked) before it is used",
          "[topology]") {
  for (const char* file : {"all_features.json", "minimal.json", "unicode_names.json"}) {
    INFO(file);
    Plan plan = make_plan(load_valid(file));
    std::set<std::string> exchanges;
    std::set<std::string> queues;
    for (const auto& a : plan.actions) {
      INFO(describe(a));
      switch (a.kind) {
        case ActionKind::declare_exchange:
        case ActionKind::check_exchange:
          CHECK(exchanges.insert(a.name).second);  // once only
          if (const auto* ae = a.arguments.find("alternate-exchange")) {
            CHECK(exchanges.count(std::string(*ae->as_string())) == 1);
          }
          break;
        case ActionKind::declare_queue: {
          CHECK(queues.insert(a.name).second);
          const auto* dlx_value = a.arguments.find("x-dead-letter-exchange");
          std::string dlx = dlx_value ? std::string(*dlx_value->as_string()) : std::string();
          if (!dlx.empty()) CHECK(exchanges.count(dlx) == 1);
          break;
        }
        case ActionKind::bind_queue:
          CHECK(exchanges.count(a.exchange) == 1);
          CHECK(queues.count(a.name) == 1);
          break;
        default:
          FAIL("a declare plan has no deletes");
      }
    }
  }
}

TEST_CASE("An input exchange shared by services is declared once, for all of them", "[topology]") {
  Plan plan = make_plan(load_valid("all_features.json"));
  size_t count = 0;
  for (const auto& a : plan.actions) {
    if (a.kind == ActionKind::declare_exchange && a.name == "shop.events") {
      ++count;
      CHECK(a.services == Strings{"orders", "audit"});
      CHECK(a.exchange_type == "topic");
      CHECK(a.role == Role::input_exchange);
    }
  }
  CHECK(count == 1);
  const topology::Action& audit_bind = find(plan, ActionKind::bind_queue, "audit");
  CHECK(audit_bind.exchange == "shop.events");
  CHECK(audit_bind.routing_key == "#");
}

TEST_CASE("An exchange with \"declare\": false is only checked for", "[topology]") {
  Plan plan = make_plan(load_valid("all_features.json"));
  const topology::Action& check = find(plan, ActionKind::check_exchange, "amq.topic");
  CHECK(check.exchange_type == "topic");
  CHECK(check.services == Strings{"ledger"});
  for (const auto& a : plan.actions) {
    CHECK_FALSE((a.kind == ActionKind::declare_exchange && a.name == "amq.topic"));
  }
  const topology::Action& bind = find(plan, ActionKind::bind_queue, "ledger");
  CHECK(bind.exchange == "amq.topic");
  CHECK(bind.routing_key == "ledger.entry");
}

TEST_CASE("A shared exchange declared by one service and not another is declared", "[topology]") {
  Topology t = parse_valid_topology(
      R"({"services": [)" +
      service_json("a", "", R"("delays": ["1s"], "max_attempts": 2)",
                   R"("exchange": "x", "type": "direct", "declare": false, "bindings": ["a"])") +
      ", " +
      service_json("b", "", R"("delays": ["1s"], "max_attempts": 2)",
                   R"("exchange": "x", "type": "direct", "bindings": ["b"])") +
      "]}");
  Plan plan = make_plan(t);
  const topology::Action& x = find(plan, ActionKind::declare_exchange, "x");
  CHECK(x.services == Strings{"a", "b"});
}

TEST_CASE("A fanout input is bound once, without a routing key", "[topology]") {
  Plan plan = make_plan(
      parse_valid_topology(one(service_json("mailer", "", R"("delays": ["1m"], "max_attempts": 2)",
                                            R"("exchange": "notifications", "type": "fanout")"))));
  const topology::Action& bind = find(plan, ActionKind::bind_queue, "mailer");
  CHECK(bind.exchange == "notifications");
  CHECK(bind.routing_key.empty());
  CHECK(bind.arguments.empty());
  CHECK(find(plan, ActionKind::declare_exchange, "notifications").exchange_type == "fanout");
}

TEST_CASE("A headers input is bound with x-match and typed header values", "[topology]") {
  Plan plan = make_plan(parse_valid_topology(
      one(service_json("payments", "", R"("delays": ["1m"], "max_attempts": 2)",
                       R"("exchange": "payments.in", "type": "headers", "bindings": [
          {"match": "any", "headers": {"kind": "charge", "version": 2, "urgent": true}},
          {"headers": {"kind": "refund"}}])"))));
  std::vector<const topology::Action*> binds;
  for (const auto& a : plan.actions) {
    if (a.kind == ActionKind::bind_queue && a.name == "payments" && a.exchange == "payments.in")
      binds.push_back(&a);
  }
  REQUIRE(binds.size() == 2);
  CHECK(binds[0]->routing_key.empty());
  CHECK(binds[0]->exchange_type == "headers");
  // nlohmann keeps object keys sorted, so headers come in name order.
  CHECK(args(binds[0]->arguments) ==
        Strings{"x-match=any(S)", "kind=charge(S)", "urgent=true(t)", "version=2(l)"});
  CHECK(args(binds[1]->arguments) == Strings{"x-match=all(S)", "kind=refund(S)"});
  CHECK(describe(*binds[0]) ==
        "binding payments.in -> payments (any: kind=charge, urgent=true, "
        "version=2)");
}

TEST_CASE("Actions describe themselves for people", "[topology]") {
  Plan plan = make_plan(parse_valid_topology(one(service_json("orders", ""))));
  CHECK(describe(plan.actions[0]) == "exchange orders.parking");
  CHECK(describe(plan.actions[1]) == "queue orders.parking");
  CHECK(describe(plan.actions[2]) == "binding orders.parking -> orders.parking");
  CHECK(describe(plan.actions[5]) == "binding orders.wait -> orders.wait.30s (30s)");
  CHECK(to_string(plan.actions[4].role) == std::string("wait queue"));
}

TEST_CASE("The delete plan removes queues and derived exchanges, never the input exchange",
          "[topology]") {
  Plan plan = make_delete_plan(parse_valid_topology(
      one(service_json("orders", R"("queue": "orders.v2")",
                       R"("mode": "republish", "delays": ["1s", "1m"], "max_attempts": 3)"))));
  CHECK(outline(plan) ==
        Strings{"delete_queue orders.v2", "delete_queue orders.wait.1s",
                "delete_queue orders.wait.1m", "delete_exchange orders.wait",
                "delete_queue orders.breaker.instances", "delete_queue orders.breaker.token",
                "delete_queue orders.breaker.state", "delete_exchange orders.breaker",
                "delete_queue orders.migration.settling", "delete_queue orders.migration.copied",
                "delete_queue orders.migration", "delete_exchange orders.migration",
                "delete_queue orders.parking", "delete_exchange orders.parking"});
  for (const auto& a : plan.actions) {
    const bool breaker = a.name.rfind("orders.breaker", 0) == 0;
    const bool migration = a.name.rfind("orders.migration", 0) == 0;
    CHECK((a.role == Role::breaker) == breaker);
    CHECK((a.role == Role::migration) == migration);
  }
  // The token queue is a quorum queue whatever the service's queues are.
  CHECK(format_value(*plan.actions[5].arguments.find("x-queue-type")) == "quorum");
}

TEST_CASE("A delete plan knows which queues are quorum queues", "[topology]") {
  Plan plan = make_delete_plan(
      parse_valid_topology(one(service_json("orders", R"("queue_type": "quorum")"))));
  for (const auto& a : plan.actions) {
    INFO(describe(a));
    // The breaker's and a migration's own types, whatever the service's.
    if (a.role == Role::breaker || a.role == Role::migration) continue;
    if (a.kind == ActionKind::delete_queue) {
      REQUIRE(a.arguments.find("x-queue-type") != nullptr);
      CHECK(format_value(*a.arguments.find("x-queue-type")) == "quorum");
    } else {
      CHECK(a.arguments.empty());
    }
  }
  Plan classic = make_delete_plan(parse_valid_topology(one(service_json("orders", ""))));
  for (const auto& a : classic.actions) {
    if (a.role != Role::breaker && a.role != Role::migration) {
      CHECK(a.arguments.find("x-queue-type") == nullptr);
    }
  }
}

TEST_CASE("The plan as JSON lists every action with its arguments", "[topology]") {
  Plan plan = make_plan(
      parse_valid_topology(one(service_json("orders", R"("parking": {"max_length": 5})"))));
  nlohmann::json j = to_json(plan);
  REQUIRE(j["actions"].size() == plan.actions.size());
  const auto& parking = j["actions"][1];
  CHECK(parking["action"] == "declare_queue");
  CHECK(parking["queue"] == "orders.parking");
  CHECK(parking["role"] == "parking queue");
  CHECK(parking["durable"] == true);
  CHECK(parking["arguments"]["x-max-length"] == 5);
  CHECK(parking["arguments"]["x-overflow"] == "reject-publish");
  const auto& bind = j["actions"][5];
  CHECK(bind["action"] == "bind_queue");
  CHECK(bind["exchange"] == "orders.wait");
  CHECK(bind["routing_key"] == "30s");
  CHECK(j["actions"][3]["type"] == "direct");
  CHECK(j["actions"][4]["arguments"]["x-message-ttl"] == 30000);
}

TEST_CASE("Exported definitions hold the plan's objects in the chosen vhost", "[topology]") {
  Plan plan = make_plan(load_valid("all_features.json"));
  nlohmann::json d = export_definitions(plan, "staging");
  size_t exchanges = 0, queues = 0, bindings = 0;
  for (const auto& a : plan.actions) {
    exchanges += a.kind == ActionKind::declare_exchange;
    queues += a.kind == ActionKind::declare_queue;
    bindings += a.kind == ActionKind::bind_queue;
  }
  CHECK(d["exchanges"].size() == exchanges);
  CHECK(d["queues"].size() == queues);
  CHECK(d["bindings"].size() == bindings);
  for (const auto& section : {"exchanges", "queues", "bindings"}) {
    for (const auto& item : d[section])
      CHECK(item["vhost"] == "staging");
  }
  for (const auto& e : d["exchanges"])
    CHECK(e["name"] != "amq.topic");
  bool found_ledger_binding = false;
  for (const auto& b : d["bindings"]) {
    if (b["destination"] == "ledger" && b["source"] == "amq.topic") {
      found_ledger_binding = true;
      CHECK(b["destination_type"] == "queue");
    }
  }
  CHECK(found_ledger_binding);
  for (const auto& q : d["queues"]) {
    if (q["name"] == "payments.wait.5s") {
      CHECK(q["durable"] == true);
      CHECK(q["auto_delete"] == false);
      CHECK(q["arguments"]["x-message-ttl"].is_number_integer());
      CHECK(q["arguments"]["x-queue-type"] == "quorum");
      CHECK(q["arguments"]["x-dead-letter-exchange"] == "payments.wait");
    }
  }
}

TEST_CASE("RabbitMQ's inequivalent-argument text is parsed into argument and values",
          "[topology]") {
  auto drift = parse_inequivalent_arg(
      "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'orders.wait.30s' in "
      "vhost '/': received '30000' but current is '60000'");
  REQUIRE(drift);
  CHECK(drift->argument == "x-message-ttl");
  CHECK(drift->wanted == "30000");
  CHECK(drift->actual == "60000");

  drift = parse_inequivalent_arg(
      "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'p' in vhost 'v': "
      "received the value '5' of type 'long' but current is none");
  REQUIRE(drift);
  CHECK(drift->argument == "x-max-length");
  CHECK(drift->wanted == "5");
  CHECK(drift->actual == "(not set)");

  drift = parse_inequivalent_arg(
      "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'o.wait' in "
      "vhost '/': received none but current is the value 'o.parking' of type 'longstr'");
  REQUIRE(drift);
  CHECK(drift->argument == "alternate-exchange");
  CHECK(drift->wanted == "(not set)");
  CHECK(drift->actual == "o.parking");

  drift = parse_inequivalent_arg(
      "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': received "
      "'true' but current is 'false'");
  REQUIRE(drift);
  CHECK(drift->argument == "durable");

  CHECK_FALSE(parse_inequivalent_arg("PRECONDITION_FAILED - unknown delivery tag 1"));
  CHECK_FALSE(parse_inequivalent_arg(""));
  CHECK_FALSE(parse_inequivalent_arg("inequivalent arg 'x"));
}

namespace {

/// Checks what split_into_lanes promises: every action in exactly one part, and each action after
/// the action that declares each object it names, in the same part or in `first`.
void check_lanes(const Plan& plan, const PlanLanes& lanes) {
  std::map<std::string, size_t> declared_by;
  for (size_t i = 0; i < plan.actions.size(); ++i) {
    const topology::Action& a = plan.actions[i];
    if (a.kind == ActionKind::declare_queue) declared_by.emplace("q:" + a.name, i);
    if (a.kind == ActionKind::declare_exchange || a.kind == ActionKind::check_exchange) {
      declared_by.emplace("e:" + a.name, i);
    }
  }
  std::map<size_t, int> part_of;  // -1: first
  for (size_t i : lanes.first)
    CHECK(part_of.emplace(i, -1).second);
  for (size_t k = 0; k < lanes.lanes.size(); ++k) {
    CHECK_FALSE(lanes.lanes[k].empty());
    CHECK(std::is_sorted(lanes.lanes[k].begin(), lanes.lanes[k].end()));
    for (size_t i : lanes.lanes[k])
      CHECK(part_of.emplace(i, int(k)).second);
  }
  CHECK(std::is_sorted(lanes.first.begin(), lanes.first.end()));
  REQUIRE(part_of.size() == plan.actions.size());
  for (size_t i = 0; i < plan.actions.size(); ++i) {
    const topology::Action& a = plan.actions[i];
    std::vector<std::string> named;
    if (a.kind == ActionKind::bind_queue) named = {"q:" + a.name, "e:" + a.exchange};
    if (a.kind == ActionKind::bind_exchange) named = {"e:" + a.name, "e:" + a.exchange};
    for (const char* argument : {"x-dead-letter-exchange", "alternate-exchange"}) {
      if (const amqp::FieldValue* v = a.arguments.find(argument)) {
        if (!v->as_string()->empty()) named.push_back("e:" + std::string(*v->as_string()));
      }
    }
    for (const auto& name : named) {
      auto it = declared_by.find(name);
      if (it == declared_by.end()) continue;
      INFO(describe(a) << " names " << name);
      CHECK(it->second < i);
      const int declarer_part = part_of[it->second];
      CHECK((declarer_part == -1 || declarer_part == part_of[i]));
    }
  }
}

}  // namespace

TEST_CASE("Services that share nothing fall into lanes of their own, and shared objects go first",
          "[topology]") {
  auto own_input = [](const std::string& name) {
    return R"("exchange": ")" + name + R"(.in", "type": "direct", "bindings": ["k"])";
  };
  const std::string retry = R"("mode": "republish", "delays": ["1s", "10s"], "max_attempts": 5)";
  SECTION("three services with their own input exchanges: three lanes, nothing first") {
    Plan plan = make_plan(
        parse_valid_topology(R"({"services": [)" + service_json("a", "", retry, own_input("a")) +
                             ", " + service_json("b", "", retry, own_input("b")) + ", " +
                             service_json("c", "", retry, own_input("c")) + "]}"));
    PlanLanes lanes = split_into_lanes(plan);
    CHECK(lanes.first.empty());
    CHECK(lanes.lanes.size() == 3);
    check_lanes(plan, lanes);
  }
  SECTION("a shared input exchange and shared delay levels go first; the services still apart") {
    const std::string levels = R"("mode": "republish", "delays": ["1s"], "max_attempts": 5,
        "delay_levels": {"base": "100ms", "levels": 6})";
    Plan plan = make_plan(parse_valid_topology(
        R"({"services": [)" + service_json("a", "", levels) + ", " + service_json("b", "", levels) +
        ", " + service_json("c", "", retry, own_input("c")) + "]}"));
    PlanLanes lanes = split_into_lanes(plan);
    std::set<std::string> first;
    for (size_t i : lanes.first)
      first.insert(describe(plan.actions[i]));
    CHECK(first.count("exchange orders.in") == 1);
    CHECK(first.count("exchange retryloop.delay.100ms.deliver") == 1);
    CHECK(lanes.lanes.size() == 3);
    check_lanes(plan, lanes);
  }
  SECTION("every plan of the valid examples keeps its order within the parts") {
    for (const char* file : {"minimal.json", "all_features.json", "longest_names.json"}) {
      INFO(file);
      Plan plan = make_plan(load_valid(file));
      check_lanes(plan, split_into_lanes(plan));
    }
  }
}

TEST_CASE(
    "The plan shows each service's breaker in one line, with the failure-rate trip when "
    "the file asks for it",
    "[topology][outage]") {
  auto defaults = parse_topology(one(service_json("orders", "")));
  REQUIRE(defaults.ok());
  CHECK(describe_outage(defaults.topology->services[0].outage) ==
        "breaker: opens after 5 unavailable in a row; probes every 5s; ramps from an eighth of the "
        "concurrency (at least 2), doubling every 2s");
  nlohmann::json json = outage_json(defaults.topology->services[0].outage);
  CHECK(json["consecutive_unavailable"] == 5);
  CHECK(json["failure_rate"].is_null());
  CHECK(json["probe_interval"] == "5s");

  auto rate = parse_topology(one(service_json(
      "orders", R"("outage": {"consecutive_unavailable": 3, "failure_rate": {"threshold": 0.25},
                   "probe_interval": "1s", "ramp": {"interval": "500ms"}})")));
  REQUIRE(rate.ok());
  CHECK(
      describe_outage(rate.topology->services[0].outage) ==
      "breaker: opens after 3 unavailable in a row or at 25% failed of at least 20 calls in "
      "10s; probes every 1s; ramps from an eighth of the concurrency (at least 2), doubling every "
      "500ms");
  json = outage_json(rate.topology->services[0].outage);
  CHECK(json["failure_rate"]["threshold"] == 0.25);
  CHECK(json["failure_rate"]["window"] == "10s");
  CHECK(json["failure_rate"]["minimum_calls"] == 20);
  CHECK(json["ramp"]["interval"] == "500ms");
}

TEST_CASE("The breaker settings change neither the plan nor the exported definitions",
          "[topology][outage]") {
  auto plain = parse_topology(one(service_json("orders", "")));
  auto tuned = parse_topology(
      one(service_json("orders", R"("outage": {"failure_rate": {}, "probe_interval": "1s"})")));
  REQUIRE(plain.ok());
  REQUIRE(tuned.ok());
  const Plan plain_plan = make_plan(*plain.topology);
  const Plan tuned_plan = make_plan(*tuned.topology);
  CHECK(to_json(plain_plan) == to_json(tuned_plan));
  CHECK(export_definitions(plain_plan, "/") == export_definitions(tuned_plan, "/"));
}
