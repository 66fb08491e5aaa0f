// Delay levels: the topology file's keys, their validation, the shared objects of a plan, and
// the route of a retry, checked by following the plan's bindings the way a topic exchange does.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "retryloop/topology/definitions.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/topology.hpp"

using namespace retryloop;
using namespace retryloop::topology;
using namespace std::chrono_literals;

namespace {

std::string service_json_with_queue(const std::string& name, const std::string& queue,
                                    const std::string& retry, const std::string& type = "classic") {
  return R"({"name": ")" + name + R"(", "queue": ")" + queue + R"(", "queue_type": ")" + type +
         R"(", "input": {"exchange": "shop.in", "type": "topic", "bindings": ["#"]}, "retry": )" +
         retry + "}";
}

std::string first_error(const std::string& text) {
  ParseResult result = parse_topology(text);
  REQUIRE_FALSE(result.ok());
  return result.messages().front();
}

const std::string levels_retry =
    R"({"mode": "republish", "delays": ["1s"], "max_attempts": 5,
        "delay_levels": {"base": "100ms", "levels": 10}})";

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t end = text.find('.', start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

bool topic_match(const std::vector<std::string>& pattern, size_t p,
                 const std::vector<std::string>& key, size_t k) {
  if (p == pattern.size()) return k == key.size();
  if (pattern[p] == "#") {
    for (size_t skip = k; skip <= key.size(); ++skip) {
      if (topic_match(pattern, p + 1, key, skip)) return true;
    }
    return false;
  }
  if (k == key.size()) return false;
  return (pattern[p] == "*" || pattern[p] == key[k]) && topic_match(pattern, p + 1, key, k + 1);
}

/// The broker, as far as the plan's objects go: topic and fanout routing through queue and
/// exchange bindings, alternate exchanges, and queues that dead-letter after their TTL.
struct Broker {
  struct Edge {
    bool to_exchange;
    std::string destination;
    std::string key;
  };
  std::map<std::string, std::vector<Edge>> bindings;
  std::map<std::string, std::string> exchange_type;
  std::map<std::string, std::string> alternate;
  std::map<std::string, amqp::FieldTable> queue_arguments;

  explicit Broker(const Plan& plan) {
    for (const auto& a : plan.actions) {
      switch (a.kind) {
        case ActionKind::declare_exchange:
          exchange_type[a.name] = a.exchange_type;
          if (auto ae = a.arguments.find("alternate-exchange")) {
            alternate[a.name] = std::string(*ae->as_string());
          }
          break;
        case ActionKind::declare_queue:
        case ActionKind::check_queue:
          queue_arguments[a.name] = a.arguments;
          break;
        case ActionKind::bind_queue:
          bindings[a.exchange].push_back({false, a.name, a.routing_key});
          break;
        case ActionKind::bind_exchange:
          bindings[a.exchange].push_back({true, a.name, a.routing_key});
          break;
        default:
          break;
      }
    }
  }

  std::set<std::string> route(const std::string& exchange, const std::string& key) const {
    std::set<std::string> queues;
    route_into(exchange, key, queues);
    if (queues.empty() && alternate.count(exchange))
      route_into(alternate.at(exchange), key, queues);
    return queues;
  }

  void route_into(const std::string& exchange, const std::string& key,
                  std::set<std::string>& queues) const {
    auto it = bindings.find(exchange);
    if (it == bindings.end()) return;
    for (const auto& edge : it->second) {
      const bool match =
          exchange_type.at(exchange) == "fanout" || topic_match(words(edge.key), 0, words(key), 0);
      if (!match) continue;
      if (edge.to_exchange) {
        route_into(edge.destination, key, queues);
      } else {
        queues.insert(edge.destination);
      }
    }
  }

  /// Follows a message from `exchange` until it rests in a queue without a TTL; returns that
  /// queue, the time it waited and the queues it passed.
  struct Journey {
    std::string queue;
    std::chrono::milliseconds waited{0};
    int hops = 0;
  };
  Journey deliver(std::string exchange, const std::string& key) const {
    Journey journey;
    for (int step = 0; step < 100; ++step) {
      auto queues = route(exchange, key);
      REQUIRE(queues.size() == 1);
      const std::string queue = *queues.begin();
      const amqp::FieldTable& arguments = queue_arguments.at(queue);
      const amqp::FieldValue* ttl = arguments.find("x-message-ttl");
      if (!is_delay_level_object(queue) || ttl == nullptr) {
        journey.queue = queue;
        return journey;
      }
      journey.waited += std::chrono::milliseconds(*ttl->as_int64());
      ++journey.hops;
      exchange = std::string(*arguments.find("x-dead-letter-exchange")->as_string());
    }
    FAIL("the message never came to rest");
    return journey;
  }
};

}  // namespace

TEST_CASE("Delay levels are read as a base with a level count or a maximum", "[delay-levels]") {
  auto t = parse_valid_topology(R"({"services": [)" +
                                service_json_with_queue("a", "a", levels_retry) + "]}");
  const Service& s = t.services[0];
  REQUIRE(s.retry.delay_levels);
  CHECK(s.retry.delay_levels->base == 100ms);
  CHECK(s.retry.delay_levels->levels == 10);
  CHECK(longest_level_delay(s) == 102300ms);

  auto with_max = parse_valid_topology(
      R"({"services": [)" +
      service_json_with_queue("a", "a",
                              R"({"mode": "republish", "delays": ["1s"], "max_attempts": 5,
                       "max_retry_duration": "2h", "delay_levels": {"base": "1s", "max": "1h"}})") +
      "]}");
  const Service& m = with_max.services[0];
  CHECK(m.retry.delay_levels->levels == 12);  // 2^12 - 1 = 4095 s >= 3600 s > 2^11 - 1
  CHECK(longest_level_delay(m) == 1h);
  CHECK(m.retry.max_retry_duration == 2h);
}

TEST_CASE("Delay level mistakes are named", "[delay-levels]") {
  auto file = [](const std::string& retry, const std::string& queue = "a") {
    return R"({"services": [)" + service_json_with_queue("a", queue, retry) + "]}";
  };
  CHECK_THAT(first_error(file(R"({"mode": "reject", "delays": ["1s"], "max_attempts": 2,
                                 "delay_levels": {"base": "1s", "levels": 4}})")),
             Catch::Contains("needs \"mode\": \"republish\""));
  CHECK_THAT(first_error(file(R"({"mode": "republish", "delays": ["1s"], "max_attempts": 2,
                                 "delay_levels": {"base": "1s", "levels": 4, "max": "5s"}})")),
             Catch::Contains("either \"levels\" or \"max\", not both"));
  CHECK_THAT(first_error(file(R"({"mode": "republish", "delays": ["1s"], "max_attempts": 2,
                                 "delay_levels": {"base": "1s"}})")),
             Catch::Contains("give \"max\""));
  CHECK_THAT(first_error(file(R"({"mode": "republish", "delays": ["1s"], "max_attempts": 2,
                                 "delay_levels": {"base": "1s", "levels": 40}})")),
             Catch::Contains("1 to 32"));
  CHECK_THAT(first_error(file(R"({"mode": "republish", "delays": ["1s"], "max_attempts": 2,
                                 "delay_levels": {"base": "1s", "levels": 24}})")),
             Catch::Contains("largest TTL RabbitMQ accepts"));
  CHECK_THAT(first_error(file(R"({"mode": "republish", "delays": ["1s"], "max_attempts": 2,
                                 "delay_levels": {"base": "1s", "levels": 4}})",
                              "a.*.b")),
             Catch::Contains("wildcard"));
  CHECK_THAT(first_error(file(R"({"mode": "republish", "max_attempts": 2,
                                 "backoff": {"initial": "1s", "max": "1m"}})")),
             Catch::Contains("add \"delay_levels\""));
  CHECK_THAT(first_error(file(R"({"mode": "republish", "max_attempts": 2,
                                 "delay_levels": {"base": "1s", "levels": 4},
                                 "backoff": {"initial": "1s", "max": "1m"}})")),
             Catch::Contains("longer than the delay levels wait (at most 15s)"));
  CHECK_THAT(first_error(file(R"({"mode": "republish", "max_attempts": 2,
                                 "delay_levels": {"base": "1s", "levels": 8},
                                 "backoff": {"initial": "1s", "max": "1m", "jitter": 2}})")),
             Catch::Contains("backoff.jitter (service \"a\"): must be from 0 to 1"));
  CHECK_THAT(first_error(file(R"({"mode": "republish", "max_attempts": 2, "delays": ["1s"],
                                 "delay_levels": {"base": "1s", "levels": 8},
                                 "backoff": {"initial": "1s", "max": "1m"}})")),
             Catch::Contains("either \"delays\" or \"backoff\""));
  CHECK_THAT(
      first_error(R"({"services": [)" +
                  service_json_with_queue("retryloop.delay.1s.00", "q", levels_retry) + "]}"),
      Catch::Contains("shared delay levels"));
}

TEST_CASE("Services with the same base and queue type share one set of delay levels",
          "[delay-levels]") {
  const std::string longer = R"({"mode": "republish", "delays": ["1s"], "max_attempts": 5,
                                 "delay_levels": {"base": "100ms", "levels": 14}})";
  auto t = parse_valid_topology(R"({"services": [)" +
                                service_json_with_queue("a", "orders", levels_retry) + "," +
                                service_json_with_queue("b", "x.orders", longer) + "," +
                                service_json_with_queue("c", "c", levels_retry, "quorum") + "]}");
  Plan plan = make_plan(t);
  std::map<std::string, int> declared;
  std::map<std::pair<ActionKind, std::string>, int> times;
  for (const auto& a : plan.actions) {
    if (a.kind == ActionKind::declare_queue || a.kind == ActionKind::declare_exchange) {
      ++declared[a.name];
      ++times[{a.kind, a.name}];
    }
  }
  for (const auto& [object, count] : times)
    CHECK(count == 1);
  // The set has as many levels as its largest user.
  CHECK(declared.count("retryloop.delay.100ms.13"));
  CHECK_FALSE(declared.count("retryloop.delay.100ms.14"));
  CHECK(declared.count("retryloop.delay.100ms.quorum.09"));
  CHECK_FALSE(declared.count("retryloop.delay.100ms.quorum.10"));

  for (const auto& a : plan.actions) {
    if (a.name == "retryloop.delay.100ms.03" && a.kind == ActionKind::declare_queue) {
      CHECK(a.services == std::vector<std::string>{"a", "b"});
      CHECK(a.arguments.find("x-message-ttl")->as_int64() == 800);
      CHECK(*a.arguments.find("x-dead-letter-exchange")->as_string() == "retryloop.delay.100ms.02");
      CHECK(a.arguments.find("x-dead-letter-routing-key") == nullptr);
      CHECK(a.arguments.find("x-delivery-limit") == nullptr);
    }
    if (a.name == "retryloop.delay.100ms.quorum.00" && a.kind == ActionKind::declare_queue) {
      CHECK(*a.arguments.find("x-queue-type")->as_string() == "quorum");
      // A message past RabbitMQ 4.x's default limit of 20 would drop to the level below, early.
      CHECK(a.arguments.find("x-delivery-limit")->as_int64() == broker_delivery_limit);
      CHECK(a.defaults == std::vector<std::string>{"x-delivery-limit"});
      CHECK(*a.arguments.find("x-dead-letter-strategy")->as_string() == "at-least-once");
      CHECK(*a.arguments.find("x-dead-letter-exchange")->as_string() ==
            "retryloop.delay.100ms.quorum.deliver");
      CHECK(a.arguments.find("x-quorum-initial-group-size") == nullptr);
    }
  }

  // Exported definitions carry the exchange-to-exchange bindings.
  auto definitions = export_definitions(plan, "/");
  int to_exchange = 0;
  for (const auto& b : definitions["bindings"]) {
    if (b["destination_type"] == "exchange") ++to_exchange;
  }
  CHECK(to_exchange == 14 + 10);
}

TEST_CASE("A retry through the delay levels waits its delay and comes back to its own queue only",
          "[delay-levels]") {
  const std::string longer = R"({"mode": "republish", "delays": ["1s"], "max_attempts": 5,
                                 "delay_levels": {"base": "100ms", "levels": 14}})";
  auto t = parse_valid_topology(R"({"services": [)" +
                                service_json_with_queue("a", "orders", levels_retry) + "," +
                                service_json_with_queue("b", "x.orders", longer) + "]}");
  Broker broker(make_plan(t));
  std::mt19937 random(7);
  for (const Service& s : t.services) {
    const auto longest = longest_level_delay(s);
    std::vector<std::chrono::milliseconds> asks = {0ms,    40ms, 50ms,    100ms,         149ms,
                                                   1700ms, 17s,  longest, longest + 1ms, 10h};
    for (int k = 0; k < 200; ++k)
      asks.push_back(std::chrono::milliseconds(random() % (longest.count() + 1)));
    for (auto ask : asks) {
      INFO(s.name << " asks " << ask.count() << " ms");
      DelayRoute route = delay_route(s, ask);
      CHECK(route.capped == (ask > longest));
      if (!route.capped) {
        CHECK(route.delay >= ask);  // never back before it asked
        CHECK(route.delay - ask < s.retry.delay_levels->base);
      }
      CHECK(route.delay <= longest);
      auto journey = broker.deliver(route.exchange, route.routing_key);
      CHECK(journey.queue == input_queue_name(s));
      CHECK(journey.waited == route.delay);
      CHECK(journey.hops == route.hops);
      // An unrouted retry is known for its service's by its routing key, and only for its own.
      for (const Service& other : t.services)
        CHECK(is_delay_route_of(other, route.routing_key) == (other.name == s.name));
    }
  }
  CHECK_FALSE(is_delay_route_of(t.services[0], "0.1.0.1.0.1.0.1.0.orders"));  // a word short
  CHECK_FALSE(is_delay_route_of(t.services[0], "0.1.0.1.0.1.0.1.0.2.orders"));
  CHECK_FALSE(is_delay_route_of(t.services[0], "0.1.0.1.0.1.0.1.0.0.x.orders"));
  CHECK_FALSE(is_delay_route_of(t.services[0], ""));
  // 17 s on a 100 ms base: 170 = 0b10101010, four levels.
  DelayRoute route = delay_route(t.services[0], 17s);
  CHECK(route.routing_key == "0.1.0.1.0.1.0.1.0.0.orders");
  CHECK(route.exchange == "retryloop.delay.100ms.07");
  CHECK(route.hops == 4);
  // Rounded up, never to the nearest: below half the base, between levels, above the maximum.
  auto second = parse_valid_topology(
      R"({"services": [)" +
      service_json_with_queue("c", "orders",
                              R"({"mode": "republish", "delays": ["1s"], "max_attempts": 5,
                                      "delay_levels": {"base": "1s", "max": "1h"}})") +
      "]}");
  const Service& by_second = second.services[0];
  CHECK(delay_route(by_second, 300ms).delay == 1s);
  CHECK(delay_route(by_second, 1ms).delay == 1s);
  CHECK(delay_route(by_second, 0ms).delay == 0s);
  CHECK(delay_route(by_second, 4200ms).delay == 5s);
  CHECK(delay_route(by_second, 4000ms).delay == 4s);
  CHECK(delay_route(by_second, 1h).delay == 1h);
  CHECK_FALSE(delay_route(by_second, 1h).capped);
  CHECK(delay_route(by_second, 1h + 1ms).capped);
  CHECK(delay_route(by_second, 1h + 1ms).delay == 1h);
  // A queue gone when the delay ends: its message waits in the set's unrouted queue.
  CHECK(broker.route("retryloop.delay.100ms.deliver", "0.0.0.0.0.0.0.0.0.0.gone") ==
        std::set<std::string>{"retryloop.delay.100ms.unrouted"});
}

TEST_CASE("A topology file's own delay levels schedule messages for the queues it names",
          "[delay-levels][schedule]") {
  auto t = parse_valid_topology(
      R"({"delay_levels": {"base": "100ms", "max": "1h", "queues": ["orders", "mail", "x.orders"]},
          "services": [)" +
      service_json_with_queue("a", "orders", levels_retry) + "]}");
  REQUIRE(t.schedule);
  CHECK(t.schedule->levels.levels == levels_for(100ms, 1h));
  const Plan plan = make_plan(t);
  // One set: the service's 10 levels and the schedule's 16 share it, as deep as the deepest.
  int level_queues = 0;
  int checks = 0;
  for (const auto& a : plan.actions) {
    if (a.kind == ActionKind::declare_queue && is_delay_level_object(a.name) &&
        a.arguments.find("x-message-ttl")) {
      ++level_queues;
    }
    if (a.kind == ActionKind::check_queue) {
      ++checks;
      CHECK(a.role == Role::scheduled_queue);
      CHECK(a.services.empty());
    }
  }
  CHECK(level_queues == t.schedule->levels.levels);
  CHECK(checks == 2);  // mail and x.orders: no service declares them
  Broker broker(plan);
  std::mt19937 random(11);
  for (const std::string queue : {"orders", "mail", "x.orders"}) {
    const Service target = schedule_target(*t.schedule, queue);
    const auto longest = longest_level_delay(target);
    CHECK(longest == 1h);
    std::vector<std::chrono::milliseconds> asks = {0ms, 1ms, 40ms, 100ms, 101ms, 90s, 1h};
    for (int k = 0; k < 100; ++k)
      asks.push_back(std::chrono::milliseconds(random() % (longest.count() + 1)));
    for (auto ask : asks) {
      INFO(queue << " asks " << ask.count() << " ms");
      DelayRoute route = delay_route(target, ask);
      CHECK_FALSE(route.capped);
      CHECK(route.delay >= ask);
      CHECK(route.delay - ask < 100ms);
      auto journey = broker.deliver(route.exchange, route.routing_key);
      CHECK(journey.queue == queue);
      CHECK(journey.waited == route.delay);
    }
    CHECK(delay_route(target, 2h).capped);
    CHECK(delay_route(target, 2h).delay == 1h);
  }
  // The schedule alone: a file may have no services.
  auto alone = parse_valid_topology(
      R"({"delay_levels": {"base": "1s", "levels": 3, "queue_type": "quorum",
                           "queues": ["mail"]}})");
  const Plan alone_plan = make_plan(alone);
  Broker alone_broker(alone_plan);
  const Service mail = schedule_target(*alone.schedule, "mail");
  CHECK(delay_set_name(mail) == "retryloop.delay.1s.quorum");
  CHECK(alone_broker.deliver(delay_route(mail, 5s).exchange, delay_route(mail, 5s).routing_key)
            .waited == 5s);
  for (const auto& a : alone_plan.actions) {
    if (a.kind != ActionKind::declare_queue) continue;
    INFO(a.name);
    CHECK(a.arguments.find("x-queue-type") != nullptr);
  }
  // Exported as definitions, the checked queue is not declared.
  auto definitions = export_definitions(alone_plan, "/");
  for (const auto& queue : definitions["queues"])
    CHECK(queue["name"] != "mail");
}

TEST_CASE("Schedule mistakes are named", "[delay-levels][schedule]") {
  CHECK(first_error(R"({"delay_levels": {"base": "1s", "max": "1h"}})") ==
        "delay_levels.queues: is missing; this key is required");
  CHECK(first_error(R"({"delay_levels": {"base": "1s", "max": "1h", "queues": []}})") ==
        "delay_levels.queues: lists no queues; name the queues that may receive scheduled "
        "messages");
  CHECK(first_error(R"({"delay_levels": {"base": "1s", "max": "1h", "queues": ["a", "a"]}})") ==
        "delay_levels.queues[1]: lists \"a\" twice");
  CHECK(first_error(R"({"delay_levels": {"base": "1s", "max": "1h", "queues": [3]}})") ==
        "delay_levels.queues[0]: must be a queue name, not a number");
  CHECK(first_error(R"({"delay_levels": {"base": "0s", "max": "1h", "queues": ["a"]}})") ==
        "delay_levels.base: must be longer than zero");
  CHECK(first_error(R"({"delay_levels": {"base": "1s", "max": "1h", "queues": ["a.*"]}})")
            .find("wildcard") != std::string::npos);
  CHECK(first_error(R"({"delay_levels": {"base": "1s", "max": "1h", "queue": ["a"]}})")
            .find("queue") != std::string::npos);
  CHECK(first_error(R"({"delay_levels": {"base": "1s", "max": "1h", "queues": ["s.parking"]},
                        "services": [)" +
                    service_json_with_queue("s", "s", levels_retry) + "]}") ==
        "delay_levels.queues[0]: \"s.parking\" is the parking queue of service \"s\"; replay "
        "parked messages with `retryloop parking replay` instead");
  CHECK(first_error(R"({})").find("services") != std::string::npos);
}
