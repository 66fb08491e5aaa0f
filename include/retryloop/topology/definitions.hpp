#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string_view>

#include "retryloop/topology/plan.hpp"

namespace retryloop::topology {

/// RabbitMQ definitions (the format of `rabbitmqctl export_definitions` and
/// `import_definitions`) for the objects of a declare plan, in virtual host `vhost`:
/// {"exchanges": [...], "queues": [...], "bindings": [...]}. Importing them gives the same objects
/// that apply() declares; integer arguments are JSON numbers, which RabbitMQ stores as `long`.
/// The virtual host must exist before the import. Exchanges with "declare": false are left out
/// (their bindings are not), since they belong to someone else.
nlohmann::json export_definitions(const Plan& plan, std::string_view vhost);

}  // namespace retryloop::topology
