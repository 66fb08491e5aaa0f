#pragma once

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

#include "retryloop/amqp/field_table.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::topology {

enum class ActionKind {
  declare_exchange,  ///< exchange.declare (type, durable, arguments)
  check_exchange,    ///< an input exchange with "declare": false: must exist, never declared
  declare_queue,     ///< queue.declare (durable, arguments)
  check_queue,       ///< a scheduled queue no service declares: must exist, never declared
  bind_queue,        ///< queue.bind `name` to `exchange` with `routing_key` and `arguments`
  bind_exchange,     ///< exchange.bind: destination exchange `name` to source `exchange`
  delete_queue,      ///< queue.delete (used by delete plans only)
  delete_exchange,   ///< exchange.delete (used by delete plans only)
};

/// What an object is for in its service's loop.
enum class Role {
  input_exchange,
  input_queue,
  wait_exchange,
  wait_queue,
  parking_exchange,
  parking_queue,
  /// The shared delay levels (delay_levels.hpp): their exchanges and bindings, and their queues.
  delay_exchange,
  delay_queue,
  /// A queue that receives scheduled messages (Topology::schedule), and its binding to the levels.
  scheduled_queue,
  /// The vhost's audit stream (Topology::audit).
  audit_stream,
  /// The objects through which a service's instances share one breaker (docs/outage.md): the
  /// consumers declare them, and only a delete plan names them. What they hold is never precious
  /// (the last signal, a probe token), so a careful delete refuses only while they have consumers.
  breaker,
  /// The objects through which a service's instances follow a migration (docs/migrate.md): the
  /// record's exchange and queue and the settling queue. The migrator declares them (the consumers
  /// the exchange and the settling queue too), and only a delete plan names them; as for the
  /// breaker's, a careful delete refuses only while they have consumers.
  migration,
};

/// One broker operation with everything it sends. Integer arguments are AMQP `l` (int64), the
/// type `rabbitmqctl import_definitions` gives them, so that applied and imported objects are
/// the same (docs/topology.md, "Argument types").
struct Action {
  ActionKind kind = ActionKind::declare_queue;
  Role role = Role::input_queue;
  /// The services the object belongs to (several for a shared input exchange).
  std::vector<std::string> services;
  /// The exchange (declare/check/delete exchange, the destination of bind_exchange) or the queue
  /// (declare/bind/delete queue).
  std::string name;
  /// direct, topic, fanout or headers: of the exchange (declare/check), or of the source exchange
  /// (bind_queue, bind_exchange).
  std::string exchange_type;
  /// bind_queue, bind_exchange: the source exchange.
  std::string exchange;
  /// bind_queue, bind_exchange.
  std::string routing_key;
  bool durable = true;
  /// declare_exchange, declare_queue, bind_queue; for delete_queue, the arguments the queue is
  /// declared with (its `x-queue-type` decides how it can be deleted).
  amqp::FieldTable arguments;
  /// Names of arguments in `arguments` that retryloop gives the objects it creates but does not
  /// require of an existing one (`x-queue-version`, a default `x-delivery-limit`): an object
  /// declared without them, as older releases did, is used as it is, and apply and verify say
  /// so (ActionResult::defaults_missing). Changing them on a live queue takes a policy.
  std::vector<std::string> defaults;
  /// Wait queues: the arguments older releases declared them with (dead-lettering through the
  /// default exchange straight to Q, which drops a retry whose Q is gone). An existing queue in
  /// that form is used as it is, and apply and verify say so (ActionResult::older_form).
  std::optional<amqp::FieldTable> older_arguments;
};

/// Ordered so that every object an action refers to is declared by an earlier action: per
/// service, the parking exchange, queue and binding, then the wait exchange (its alternate
/// exchange is the parking exchange), the wait queues and their bindings, then its set of delay
/// levels (the first time a service uses it, with as many levels as its largest user), then the
/// input exchange, the input queue (dead-lettering to the wait exchange), its bindings, its
/// binding to the wait exchange under its own name, which brings the retries back, and last its
/// binding to the delay levels' delivery exchange. An input exchange or a set of delay levels
/// shared by several services appears once. The schedule comes last: its set of delay levels when
/// no service uses it, then each scheduled queue's binding to its delivery exchange (after a check
/// that the queue exists, for a queue no service declares). Schedule actions have no services.
struct Plan {
  std::vector<Action> actions;
};

/// The declare plan of a valid topology (validate() finds nothing). Pure: no broker.
Plan make_plan(const Topology& topology);

/// What `topology delete` removes, in the order it removes it: per service, the input queue, the
/// wait queues, the wait exchange, the shared breaker's objects (Role::breaker), the parking queue
/// and the parking exchange. Input exchanges and delay levels are never deleted (publishers and
/// other services, maybe of other files, may use them); deleting the input queue removes its
/// binding to the delay levels.
Plan make_delete_plan(const Topology& topology);

/// A declare plan cut into parts that can run at once, on channels of their own. `first` runs
/// before the rest: the objects several services share (an input exchange, a set of delay levels)
/// and whatever those refer to. Then the `lanes` may run concurrently: each holds the actions of
/// services that share no other object, so that every action still comes after the actions that
/// declare the objects it names (the exchange and queue of a binding, a dead-letter or alternate
/// exchange), as in the plan. Each part keeps plan order; every action is in exactly one part.
struct PlanLanes {
  std::vector<size_t> first;
  std::vector<std::vector<size_t>> lanes;
};
PlanLanes split_into_lanes(const Plan& plan);

const char* to_string(ActionKind kind);
const char* to_string(Role role);

/// "exchange orders.in", "queue orders.wait.30s", "binding orders.in -> orders (order.*)".
std::string describe(const Action& action);

/// An argument value as text: numbers and strings as they are, "" for the empty string.
std::string format_value(const amqp::FieldValue& value);

/// A service's breaker in one line, for `topology plan` and `verify`: "breaker: opens after 5
/// unavailable in a row; probes every 5s; ramps from 2, doubling every 2s" (and the failure-rate
/// trip when the settings have one). The breaker is the consumer's, not the broker's: it is in no
/// plan action and no export.
std::string describe_outage(const outage::Settings& settings);
/// The same as JSON: {"consecutive_unavailable": 5, "failure_rate": null, "probe_interval":
/// "5s", "ramp": {"interval": "2s"}}, durations as the file writes them.
nlohmann::json outage_json(const outage::Settings& settings);

/// The plan as JSON (`topology plan --json`): {"actions": [{"action": "declare_queue", ...}]}.
/// Arguments become JSON numbers, strings and booleans.
nlohmann::json to_json(const Plan& plan);
/// A field table of numbers, strings and booleans as a JSON object (other types as strings).
nlohmann::json to_json(const amqp::FieldTable& table);

}  // namespace retryloop::topology
