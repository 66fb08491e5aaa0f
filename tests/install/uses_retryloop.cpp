// Uses one thing of each layer, through the installed headers and libraries only.
#include <retryloop/consumer/consumer.hpp>
#include <retryloop/operations/http_endpoint.hpp>
#include <retryloop/operations/prometheus.hpp>
#include <retryloop/parking/parking.hpp>
#include <retryloop/topology/declarer.hpp>
#include <retryloop/topology/topology_json.hpp>

#include <iostream>

int main() {
  auto parsed = retryloop::topology::parse_topology(
      R"({"services": [{"name": "orders", "input": {"exchange": "orders.in", "type": "direct",
          "bindings": ["order.created"]}, "retry": {"delays": ["30s"], "max_attempts": 5}}]})");
  if (!parsed.ok()) return 1;
  const auto plan = retryloop::topology::make_plan(*parsed.topology);
  const auto uri = retryloop::client::parse_uri("amqp://guest:guest@127.0.0.1:5672/%2F");
  const auto listen = retryloop::operations::parse_listen_address("9464");
  const std::string metrics = retryloop::operations::prometheus_text({});
  std::cout << plan.actions.size() << " actions for " << uri.host << ", metrics on "
            << listen.text() << "\n";
  return plan.actions.empty() || metrics.empty() ? 1 : 0;
}
