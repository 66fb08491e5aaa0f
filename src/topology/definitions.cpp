#include "retryloop/topology/definitions.hpp"

#include <nlohmann/json.hpp>

namespace retryloop::topology {

nlohmann::json export_definitions(const Plan& plan, std::string_view vhost) {
  nlohmann::json exchanges = nlohmann::json::array();
  nlohmann::json queues = nlohmann::json::array();
  nlohmann::json bindings = nlohmann::json::array();
  const std::string host(vhost);
  for (const auto& a : plan.actions) {
    switch (a.kind) {
      case ActionKind::declare_exchange:
        exchanges.push_back({{"name", a.name},
                             {"vhost", host},
                             {"type", a.exchange_type},
                             {"durable", a.durable},
                             {"auto_delete", false},
                             {"internal", false},
                             {"arguments", to_json(a.arguments)}});
        break;
      case ActionKind::declare_queue:
        queues.push_back({{"name", a.name},
                          {"vhost", host},
                          {"durable", a.durable},
                          {"auto_delete", false},
                          {"arguments", to_json(a.arguments)}});
        break;
      case ActionKind::bind_queue:
      case ActionKind::bind_exchange:
        bindings.push_back(
            {{"source", a.exchange},
             {"vhost", host},
             {"destination", a.name},
             {"destination_type", a.kind == ActionKind::bind_queue ? "queue" : "exchange"},
             {"routing_key", a.routing_key},
             {"arguments", to_json(a.arguments)}});
        break;
      case ActionKind::check_exchange:
      case ActionKind::check_queue:
      case ActionKind::delete_queue:
      case ActionKind::delete_exchange:
        break;
    }
  }
  return nlohmann::json{{"exchanges", std::move(exchanges)},
                        {"queues", std::move(queues)},
                        {"bindings", std::move(bindings)}};
}

}  // namespace retryloop::topology
