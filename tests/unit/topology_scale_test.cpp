#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <string>

#include "retryloop/topology/definitions.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology.hpp"
#include "retryloop/topology/topology_json.hpp"

using namespace retryloop::topology;

namespace {

constexpr size_t many_bindings = 350'000;

Service service_with(ExchangeType type) {
  Service service;
  service.name = "orders";
  service.input.exchange = "orders.in";
  service.input.type = type;
  service.retry.delays = {std::chrono::seconds(30)};
  service.retry.max_attempts = 5;
  return service;
}

/// A file of one service with `count` direct bindings, the last the same as the first.
std::string file_with_bindings(size_t count) {
  std::string bindings;
  bindings.reserve(count * 16);
  for (size_t k = 0; k + 1 < count; ++k)
    bindings += "\"order." + std::to_string(k) + "\",";
  bindings += "\"order.0\"";
  return R"({"services": [{"name": "orders", "input": {"exchange": "orders.in", "type": "direct",)"
         R"( "bindings": [)" +
         bindings + R"(]}, "retry": {"delays": ["30s"], "max_attempts": 5}}]})";
}

}  // namespace

// Validation, plan and export run in `plan`, `apply`, `verify`, `export`, every consumer's start
// and the console: they must take time in proportion to the bindings, not to their square. These
// tests only finish in reasonable time when that holds; bench/topology_scale.py measures it.
TEST_CASE("A file of 350,000 direct bindings is validated, with its one duplicate found",
          "[topology]") {
  ParseResult result = parse_topology(file_with_bindings(many_bindings), "big.json");
  REQUIRE(result.errors.size() == 1);
  CHECK(result.errors.front().path ==
        "services[0].input.bindings[" + std::to_string(many_bindings - 1) + "]");
  CHECK_THAT(result.errors.front().message,
             Catch::Contains("duplicate binding \"order.0\" (same as bindings[0])"));
}

TEST_CASE("350,000 headers bindings are validated, the same headers in another order found",
          "[topology]") {
  Topology topology;
  topology.services.push_back(service_with(ExchangeType::headers));
  auto& bindings = topology.services.front().input.bindings;
  for (size_t k = 0; k < many_bindings; ++k) {
    Binding binding;
    binding.headers = {{"kind", std::string("order")}, {"n", int64_t(k)}};
    bindings.push_back(std::move(binding));
  }
  Binding reordered;
  reordered.headers = {{"n", int64_t(7)}, {"kind", std::string("order")}};
  bindings.push_back(reordered);
  auto errors = validate(topology);
  REQUIRE(errors.size() == 1);
  CHECK(errors.front().path == "services[0].input.bindings[" + std::to_string(many_bindings) + "]");
  CHECK_THAT(errors.front().message, Catch::Contains("same as bindings[7]"));
}

TEST_CASE("A topology of 350,000 bindings is planned, split into lanes and exported",
          "[topology]") {
  Topology topology;
  topology.services.push_back(service_with(ExchangeType::topic));
  for (size_t k = 0; k < many_bindings; ++k) {
    topology.services.front().input.bindings.push_back(
        {"order." + std::to_string(k) + ".*", HeadersMatch::all, {}});
  }
  REQUIRE(validate(topology).empty());
  const Plan plan = make_plan(topology);
  size_t binds = 0;
  for (const auto& action : plan.actions)
    binds += action.kind == ActionKind::bind_queue ? 1 : 0;
  CHECK(binds >= many_bindings);
  const PlanLanes lanes = split_into_lanes(plan);
  size_t placed = lanes.first.size();
  for (const auto& lane : lanes.lanes)
    placed += lane.size();
  CHECK(placed == plan.actions.size());
  const nlohmann::json definitions = export_definitions(plan, "/");
  CHECK(definitions["bindings"].size() >= many_bindings);
}
