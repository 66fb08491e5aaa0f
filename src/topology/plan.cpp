#include "retryloop/topology/plan.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/duration.hpp"

namespace retryloop::topology {

namespace {

// Integers go out as int64 ('l'): what import_definitions stores, and wide enough for every TTL.
amqp::FieldValue integer(int64_t value) {
  return amqp::FieldValue(value);
}

/// The queue type; classic queues are version 2 (the only version from RabbitMQ 4.0 on, and
/// twice as fast to consume from on 3.10), as a default an existing version 1 queue keeps. A
/// quorum queue's initial replica count is also a default: it tells only how the queue began, so
/// a queue declared without it is used as it is (verify --management compares the members).
void add_queue_type(const Service& service, Action& queue) {
  if (service.queue_type == QueueType::quorum) {
    queue.arguments.append("x-queue-type", "quorum");
    if (service.replicas) {
      queue.arguments.append("x-quorum-initial-group-size", integer(*service.replicas));
      queue.defaults.push_back("x-quorum-initial-group-size");
    }
  } else {
    queue.arguments.append("x-queue-version", integer(2));
    queue.defaults.push_back("x-queue-version");
  }
}

/// The queue type of an object shared by services (the delay levels): as add_queue_type, without
/// an initial replica count, which the services sharing it may set differently.
void add_shared_queue_type(QueueType type, Action& queue) {
  if (type == QueueType::quorum) {
    queue.arguments.append("x-queue-type", "quorum");
  } else {
    queue.arguments.append("x-queue-version", integer(2));
    queue.defaults.push_back("x-queue-version");
  }
}

/// A quorum queue's delivery limit, which the broker never reaches (broker_delivery_limit).
void add_delivery_limit(const Service& service, Action& queue) {
  if (service.queue_type != QueueType::quorum) return;
  queue.arguments.append("x-delivery-limit", integer(broker_delivery_limit));
  queue.defaults.push_back("x-delivery-limit");
}

/// Quorum queues dead-letter at-least-once only with reject-publish overflow; classic queues
/// cannot (their dead-lettering is at-most-once, which the wait exchange's alternate exchange
/// makes up for).
void add_safe_dead_lettering(const Service& service, amqp::FieldTable& arguments) {
  if (service.queue_type != QueueType::quorum) return;
  arguments.append("x-dead-letter-strategy", "at-least-once");
  arguments.append("x-overflow", "reject-publish");
}

Action exchange_action(const Service& service, Role role, std::string name, std::string type) {
  Action a;
  a.kind = ActionKind::declare_exchange;
  a.role = role;
  a.services = {service.name};
  a.name = std::move(name);
  a.exchange_type = std::move(type);
  return a;
}

Action queue_action(const Service& service, Role role, std::string name) {
  Action a;
  a.kind = ActionKind::declare_queue;
  a.role = role;
  a.services = {service.name};
  a.name = std::move(name);
  return a;
}

Action binding_action(const Service& service, Role role, std::string queue_name,
                      std::string exchange_name, std::string exchange_type, std::string routing_key,
                      amqp::FieldTable arguments = {}) {
  Action a;
  a.exchange_type = std::move(exchange_type);
  a.kind = ActionKind::bind_queue;
  a.role = role;
  a.services = {service.name};
  a.name = std::move(queue_name);
  a.exchange = std::move(exchange_name);
  a.routing_key = std::move(routing_key);
  a.arguments = std::move(arguments);
  return a;
}

amqp::FieldTable headers_arguments(const Binding& binding) {
  amqp::FieldTable arguments;
  arguments.append("x-match", to_string(binding.match));
  for (const auto& [name, value] : binding.headers) {
    std::visit([&, &name = name](const auto& v) { arguments.append(name, amqp::FieldValue(v)); },
               value);
  }
  return arguments;
}

Action exchange_binding_action(const Service& service, Role role, std::string destination,
                               std::string source, std::string routing_key) {
  Action a = binding_action(service, role, std::move(destination), std::move(source), "topic",
                            std::move(routing_key));
  a.kind = ActionKind::bind_exchange;
  return a;
}

/// The objects of a set of delay levels (delay_levels.hpp), `levels` deep, for `users`.
void add_delay_levels(const Service& s, int levels, const std::vector<std::string>& users,
                      Plan& plan) {
  const size_t first = plan.actions.size();
  const std::string unrouted = delay_unrouted_name(s);
  const std::string deliver = delay_delivery_exchange_name(s);
  plan.actions.push_back(exchange_action(s, Role::delay_exchange, unrouted, "fanout"));
  Action unrouted_queue = queue_action(s, Role::delay_queue, unrouted);
  add_shared_queue_type(s.queue_type, unrouted_queue);
  add_delivery_limit(s, unrouted_queue);
  plan.actions.push_back(std::move(unrouted_queue));
  plan.actions.push_back(
      binding_action(s, Role::delay_queue, unrouted, unrouted, "fanout", std::string()));
  Action deliver_exchange = exchange_action(s, Role::delay_exchange, deliver, "topic");
  deliver_exchange.arguments.append("alternate-exchange", unrouted);
  plan.actions.push_back(std::move(deliver_exchange));
  const int64_t base = s.retry.delay_levels->base.count();
  for (int k = 0; k < levels; ++k) {
    const std::string level = delay_level_name(s, k);
    const std::string below = k == 0 ? deliver : delay_level_name(s, k - 1);
    Action exchange = exchange_action(s, Role::delay_exchange, level, "topic");
    exchange.arguments.append("alternate-exchange", unrouted);
    plan.actions.push_back(std::move(exchange));
    Action queue = queue_action(s, Role::delay_queue, level);
    add_shared_queue_type(s.queue_type, queue);
    // Nothing of retryloop's hands a level's message back, but a message past a delivery limit
    // would be dead-lettered to the level below, early: the limit is one the broker never reaches.
    add_delivery_limit(s, queue);
    queue.arguments.append("x-message-ttl", integer(base << k));
    // No dead-letter routing key: the message keeps its own, which spells the lower bits.
    queue.arguments.append("x-dead-letter-exchange", below);
    add_safe_dead_lettering(s, queue.arguments);
    plan.actions.push_back(std::move(queue));
    plan.actions.push_back(
        binding_action(s, Role::delay_queue, level, level, "topic", level_binding_key(k, true)));
    plan.actions.push_back(exchange_binding_action(s, Role::delay_exchange, below, level,
                                                   level_binding_key(k, false)));
  }
  for (size_t i = first; i < plan.actions.size(); ++i)
    plan.actions[i].services = users;
}

/// The schedule's actions (Plan): its set of delay levels unless a service declared it, then
/// for each scheduled queue a check that it exists (unless a service declares it) and its binding.
void add_schedule(const Topology& topology, const Service& levels,
                  std::map<std::string, int>& set_levels, std::map<std::string, bool>& set_done,
                  Plan& plan) {
  const std::string set = delay_set_name(levels);
  const size_t first = plan.actions.size();
  if (!set_done[set]) {
    set_done[set] = true;
    add_delay_levels(levels, set_levels[set], {}, plan);
  }
  for (const std::string& queue : topology.schedule->queues) {
    const Service target = schedule_target(*topology.schedule, queue);
    const std::string key = delivery_binding_key(target);
    const Service* owner = nullptr;
    for (const Service& s : topology.services) {
      if (input_queue_name(s) == queue) owner = &s;
    }
    if (owner != nullptr && owner->retry.delay_levels && delay_set_name(*owner) == set &&
        delivery_binding_key(*owner) == key) {
      continue;  // the service's own binding to the levels already brings it there
    }
    if (owner == nullptr) {
      Action check = queue_action(target, Role::scheduled_queue, queue);
      check.kind = ActionKind::check_queue;
      plan.actions.push_back(std::move(check));
    }
    plan.actions.push_back(binding_action(target, Role::scheduled_queue, queue,
                                          delay_delivery_exchange_name(target), "topic", key));
  }
  for (size_t i = first; i < plan.actions.size(); ++i)
    plan.actions[i].services.clear();
}

}  // namespace

Plan make_plan(const Topology& topology) {
  Plan plan;
  // Input exchanges, shared or not: which services use each, and whether any declares it.
  std::map<std::string, std::vector<std::string>> users;
  std::map<std::string, bool> declared_by_any;
  for (const auto& s : topology.services) {
    users[s.input.exchange].push_back(s.name);
    declared_by_any[s.input.exchange] = declared_by_any[s.input.exchange] || s.input.declare;
  }
  std::map<std::string, bool> input_done;
  // Delay level sets: the most levels any service asks of each, and its users.
  std::map<std::string, int> set_levels;
  std::map<std::string, std::vector<std::string>> set_users;
  for (const auto& s : topology.services) {
    if (!s.retry.delay_levels) continue;
    int& levels = set_levels[delay_set_name(s)];
    levels = std::max(levels, s.retry.delay_levels->levels);
    set_users[delay_set_name(s)].push_back(s.name);
  }
  std::optional<Service> schedule_levels;
  if (topology.schedule) {
    schedule_levels = schedule_target(*topology.schedule, std::string());
    int& levels = set_levels[delay_set_name(*schedule_levels)];
    levels = std::max(levels, topology.schedule->levels.levels);
  }
  std::map<std::string, bool> set_done;

  for (const auto& s : topology.services) {
    const std::string& q = input_queue_name(s);
    const std::string parking = parking_exchange_name(s.name);
    const std::string wait = wait_exchange_name(s.name);
    const auto delays = wait_delays(s);

    // Parking: the end of the line, so it exists before anything can route to it.
    plan.actions.push_back(exchange_action(s, Role::parking_exchange, parking, "fanout"));
    Action parking_queue = queue_action(s, Role::parking_queue, parking_queue_name(s.name));
    add_queue_type(s, parking_queue);
    add_delivery_limit(s, parking_queue);
    if (s.parking.max_length) {
      parking_queue.arguments.append("x-max-length", integer(*s.parking.max_length));
      parking_queue.arguments.append("x-overflow", "reject-publish");
    }
    if (s.parking.ttl) {
      parking_queue.arguments.append("x-message-ttl", integer(s.parking.ttl->count()));
    }
    plan.actions.push_back(std::move(parking_queue));
    plan.actions.push_back(binding_action(s, Role::parking_queue, parking_queue_name(s.name),
                                          parking, "fanout", std::string()));

    // Wait: a retry that finds no wait queue goes to parking through the alternate exchange.
    Action wait_exchange = exchange_action(s, Role::wait_exchange, wait, "direct");
    wait_exchange.arguments.append("alternate-exchange", parking);
    plan.actions.push_back(std::move(wait_exchange));
    for (auto delay : delays) {
      const std::string name = wait_queue_name(s.name, delay);
      Action wait_queue = queue_action(s, Role::wait_queue, name);
      add_queue_type(s, wait_queue);
      wait_queue.arguments.append("x-message-ttl", integer(delay.count()));
      // Back through the wait exchange with Q's name as the key: only Q's own binding matches,
      // so no other queue sees the retry, and while Q is gone the alternate exchange parks it.
      wait_queue.arguments.append("x-dead-letter-exchange", wait);
      wait_queue.arguments.append("x-dead-letter-routing-key", q);
      add_safe_dead_lettering(s, wait_queue.arguments);
      wait_queue.older_arguments = wait_queue.arguments;
      wait_queue.older_arguments->set("x-dead-letter-exchange", "");
      plan.actions.push_back(std::move(wait_queue));
      plan.actions.push_back(
          binding_action(s, Role::wait_queue, name, wait, "direct", duration_label(delay)));
    }

    if (s.retry.delay_levels && !set_done[delay_set_name(s)]) {
      set_done[delay_set_name(s)] = true;
      add_delay_levels(s, set_levels[delay_set_name(s)], set_users[delay_set_name(s)], plan);
    }

    // Input.
    if (!input_done[s.input.exchange]) {
      input_done[s.input.exchange] = true;
      Action input =
          exchange_action(s, Role::input_exchange, s.input.exchange, to_string(s.input.type));
      if (!declared_by_any[s.input.exchange]) input.kind = ActionKind::check_exchange;
      input.services = users[s.input.exchange];
      plan.actions.push_back(std::move(input));
    }
    Action input_queue = queue_action(s, Role::input_queue, q);
    add_queue_type(s, input_queue);
    add_delivery_limit(s, input_queue);
    input_queue.arguments.append("x-dead-letter-exchange", wait);
    if (!s.retry.delays.empty()) {
      input_queue.arguments.append("x-dead-letter-routing-key",
                                   duration_label(s.retry.delays.front()));
    }
    add_safe_dead_lettering(s, input_queue.arguments);
    if (s.retry.mode == RetryMode::in_queue) {
      // Only failed deliveries (a reject, a consumer that died with the message) wait; a nack,
      // with which a stopping consumer hands back what it has not started, does not.
      const auto& delays = s.retry.delays;
      input_queue.arguments.append("x-delayed-retry-type", "failed");
      input_queue.arguments.append("x-delayed-retry-min", integer(delays.front().count()));
      input_queue.arguments.append("x-delayed-retry-max", integer(delays.back().count()));
    }
    plan.actions.push_back(std::move(input_queue));
    const std::string type = to_string(s.input.type);
    if (s.input.type == ExchangeType::fanout) {
      plan.actions.push_back(
          binding_action(s, Role::input_queue, q, s.input.exchange, type, std::string()));
    }
    for (const auto& binding : s.input.bindings) {
      if (s.input.type == ExchangeType::headers) {
        plan.actions.push_back(binding_action(s, Role::input_queue, q, s.input.exchange, type,
                                              std::string(), headers_arguments(binding)));
      } else {
        plan.actions.push_back(
            binding_action(s, Role::input_queue, q, s.input.exchange, type, binding.routing_key));
      }
    }
    // The way back from the wait queues.
    if (!delays.empty()) {
      plan.actions.push_back(binding_action(s, Role::input_queue, q, wait, "direct", q));
    }
    // The way back from the delay levels.
    if (s.retry.delay_levels) {
      plan.actions.push_back(binding_action(s, Role::input_queue, q,
                                            delay_delivery_exchange_name(s), "topic",
                                            delivery_binding_key(s)));
    }
  }
  if (topology.schedule) add_schedule(topology, *schedule_levels, set_levels, set_done, plan);
  if (topology.audit) {
    Action stream;
    stream.kind = ActionKind::declare_queue;
    stream.role = Role::audit_stream;
    stream.name = audit_stream_name();
    stream.arguments.append("x-queue-type", "stream");
    const auto seconds =
        std::chrono::duration_cast<std::chrono::seconds>(topology.audit->max_age).count();
    stream.arguments.append("x-max-age", std::to_string(std::max<int64_t>(seconds, 1)) + "s");
    plan.actions.push_back(std::move(stream));
  }
  return plan;
}

Plan make_delete_plan(const Topology& topology) {
  // Each object keeps the arguments it is declared with (a quorum queue must be deleted without
  // if-empty / if-unused, which RabbitMQ refuses for quorum queues with a connection error).
  std::map<std::string, amqp::FieldTable> queue_arguments;
  for (const auto& a : make_plan(topology).actions) {
    if (a.kind == ActionKind::declare_queue) queue_arguments[a.name] = a.arguments;
  }
  Plan plan;
  for (const auto& s : topology.services) {
    auto remove = [&](ActionKind kind, Role role, std::string name) {
      Action a;
      a.kind = kind;
      a.role = role;
      a.services = {s.name};
      if (kind == ActionKind::delete_queue) a.arguments = queue_arguments[name];
      a.name = std::move(name);
      plan.actions.push_back(std::move(a));
    };
    // Q first: once it is gone nothing new enters the loop; parking, the most precious, last.
    remove(ActionKind::delete_queue, Role::input_queue, input_queue_name(s));
    for (auto delay : wait_delays(s)) {
      remove(ActionKind::delete_queue, Role::wait_queue, wait_queue_name(s.name, delay));
    }
    remove(ActionKind::delete_exchange, Role::wait_exchange, wait_exchange_name(s.name));
    // The instances queue first: while an instance runs, it is in use and the deletion stops.
    remove(ActionKind::delete_queue, Role::breaker, breaker_instances_queue_name(s.name));
    remove(ActionKind::delete_queue, Role::breaker, breaker_token_queue_name(s.name));
    plan.actions.back().arguments.append("x-queue-type", "quorum");
    remove(ActionKind::delete_queue, Role::breaker, breaker_state_queue_name(s.name));
    remove(ActionKind::delete_exchange, Role::breaker, breaker_exchange_name(s.name));
    // The settling queue first: an instance consumes it while it leaves a queue mid-migration.
    remove(ActionKind::delete_queue, Role::migration, migration_settling_queue_name(s.name));
    remove(ActionKind::delete_queue, Role::migration, migration_copied_queue_name(s.name));
    remove(ActionKind::delete_queue, Role::migration, migration_record_name(s.name));
    remove(ActionKind::delete_exchange, Role::migration, migration_record_name(s.name));
    remove(ActionKind::delete_queue, Role::parking_queue, parking_queue_name(s.name));
    remove(ActionKind::delete_exchange, Role::parking_exchange, parking_exchange_name(s.name));
  }
  return plan;
}

const char* to_string(ActionKind kind) {
  switch (kind) {
    case ActionKind::declare_exchange:
      return "declare_exchange";
    case ActionKind::check_exchange:
      return "check_exchange";
    case ActionKind::declare_queue:
      return "declare_queue";
    case ActionKind::check_queue:
      return "check_queue";
    case ActionKind::bind_queue:
      return "bind_queue";
    case ActionKind::bind_exchange:
      return "bind_exchange";
    case ActionKind::delete_queue:
      return "delete_queue";
    case ActionKind::delete_exchange:
      return "delete_exchange";
  }
  return "?";
}

const char* to_string(Role role) {
  switch (role) {
    case Role::input_exchange:
      return "input exchange";
    case Role::input_queue:
      return "input queue";
    case Role::wait_exchange:
      return "wait exchange";
    case Role::wait_queue:
      return "wait queue";
    case Role::parking_exchange:
      return "parking exchange";
    case Role::parking_queue:
      return "parking queue";
    case Role::delay_exchange:
      return "delay exchange";
    case Role::delay_queue:
      return "delay queue";
    case Role::scheduled_queue:
      return "scheduled queue";
    case Role::audit_stream:
      return "audit stream";
    case Role::breaker:
      return "breaker";
    case Role::migration:
      return "migration";
  }
  return "?";
}

std::string format_value(const amqp::FieldValue& value) {
  if (auto text = value.as_string()) {
    return text->empty() ? std::string("\"\"") : std::string(*text);
  }
  if (auto number = value.as_int64()) return std::to_string(*number);
  if (const bool* b = value.get_if<bool>()) return *b ? "true" : "false";
  return to_json(amqp::FieldTable{{"v", value}})["v"].dump();
}

namespace {

/// The objects an action names, as "e:NAME" (exchange) or "q:NAME" (queue): the one it declares,
/// checks or binds first, then those it refers to.
std::vector<std::string> objects_named(const Action& a) {
  const bool queue = a.kind == ActionKind::declare_queue || a.kind == ActionKind::bind_queue ||
                     a.kind == ActionKind::delete_queue || a.kind == ActionKind::check_queue;
  std::vector<std::string> names{(queue ? "q:" : "e:") + a.name};
  if (a.kind == ActionKind::bind_queue || a.kind == ActionKind::bind_exchange) {
    names.push_back("e:" + a.exchange);
  }
  for (const char* argument : {"x-dead-letter-exchange", "alternate-exchange"}) {
    const amqp::FieldValue* value = a.arguments.find(argument);
    if (value == nullptr) continue;
    auto exchange = value->as_string();
    if (exchange && !exchange->empty()) names.push_back("e:" + std::string(*exchange));
  }
  return names;
}

bool declares(const Action& a) {
  return a.kind == ActionKind::declare_exchange || a.kind == ActionKind::declare_queue ||
         a.kind == ActionKind::check_exchange || a.kind == ActionKind::check_queue;
}

}  // namespace

PlanLanes split_into_lanes(const Plan& plan) {
  const size_t count = plan.actions.size();
  std::vector<std::vector<std::string>> names(count);
  std::map<std::string, size_t> declared_by;
  for (size_t i = 0; i < count; ++i) {
    names[i] = objects_named(plan.actions[i]);
    if (declares(plan.actions[i])) declared_by.emplace(names[i].front(), i);
  }
  // Shared objects go first, with every object they refer to, however far down that goes.
  std::vector<bool> first(count, false);
  std::vector<size_t> pending;
  for (size_t i = 0; i < count; ++i) {
    if (plan.actions[i].services.size() != 1) {
      first[i] = true;
      pending.push_back(i);
    }
  }
  while (!pending.empty()) {
    const size_t i = pending.back();
    pending.pop_back();
    for (const auto& name : names[i]) {
      auto it = declared_by.find(name);
      if (it != declared_by.end() && !first[it->second]) {
        first[it->second] = true;
        pending.push_back(it->second);
      }
    }
  }
  // The other actions: two that name the same object (other than one declared first) share a
  // lane. Union-find over actions, by the first action to name each object.
  std::vector<size_t> parent(count);
  for (size_t i = 0; i < count; ++i)
    parent[i] = i;
  auto root = [&parent](size_t i) {
    while (parent[i] != i)
      i = parent[i] = parent[parent[i]];
    return i;
  };
  std::map<std::string, size_t> named_by;
  for (size_t i = 0; i < count; ++i) {
    if (first[i]) continue;
    for (const auto& name : names[i]) {
      auto declarer = declared_by.find(name);
      if (declarer != declared_by.end() && first[declarer->second]) continue;
      auto [it, inserted] = named_by.emplace(name, i);
      if (!inserted) parent[root(i)] = root(it->second);
    }
  }
  PlanLanes lanes;
  std::map<size_t, size_t> lane_of_root;
  for (size_t i = 0; i < count; ++i) {
    if (first[i]) {
      lanes.first.push_back(i);
      continue;
    }
    auto [it, inserted] = lane_of_root.emplace(root(i), lanes.lanes.size());
    if (inserted) lanes.lanes.emplace_back();
    lanes.lanes[it->second].push_back(i);
  }
  return lanes;
}

std::string describe(const Action& action) {
  switch (action.kind) {
    case ActionKind::declare_exchange:
    case ActionKind::check_exchange:
    case ActionKind::delete_exchange:
      return "exchange " + action.name;
    case ActionKind::declare_queue:
    case ActionKind::check_queue:
    case ActionKind::delete_queue:
      return "queue " + action.name;
    case ActionKind::bind_exchange:
      return "binding " + action.exchange + " -> exchange " + action.name + " (" +
             action.routing_key + ")";
    case ActionKind::bind_queue: {
      std::string out = "binding " + action.exchange + " -> " + action.name;
      if (action.exchange_type == "fanout") return out;
      if (action.exchange_type == "headers") {
        std::string match;
        std::string headers;
        for (const auto& entry : action.arguments) {
          if (entry.name == "x-match") {
            match = format_value(entry.value);
          } else {
            headers += (headers.empty() ? "" : ", ") + entry.name + "=" + format_value(entry.value);
          }
        }
        return out + " (" + match + ": " + headers + ")";
      }
      return out + " (" + (action.routing_key.empty() ? "\"\"" : action.routing_key) + ")";
    }
  }
  return action.name;
}

nlohmann::json to_json(const amqp::FieldTable& table) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& entry : table) {
    const amqp::FieldValue& v = entry.value;
    if (auto text = v.as_string()) {
      out[entry.name] = std::string(*text);
    } else if (auto number = v.as_int64()) {
      out[entry.name] = *number;
    } else if (const bool* b = v.get_if<bool>()) {
      out[entry.name] = *b;
    } else if (const double* d = v.get_if<double>()) {
      out[entry.name] = *d;
    } else if (const float* f = v.get_if<float>()) {
      out[entry.name] = *f;
    } else if (const auto* nested = v.get_if<amqp::FieldTable>()) {
      out[entry.name] = to_json(*nested);
    } else {
      out[entry.name] = std::string("(type ") + v.type_letter() + ")";
    }
  }
  return out;
}

nlohmann::json to_json(const Plan& plan) {
  nlohmann::json actions = nlohmann::json::array();
  for (const auto& a : plan.actions) {
    nlohmann::json j;
    j["action"] = to_string(a.kind);
    j["role"] = to_string(a.role);
    j["services"] = a.services;
    switch (a.kind) {
      case ActionKind::declare_exchange:
        j["exchange"] = a.name;
        j["type"] = a.exchange_type;
        j["durable"] = a.durable;
        j["arguments"] = to_json(a.arguments);
        break;
      case ActionKind::check_exchange:
        j["exchange"] = a.name;
        j["type"] = a.exchange_type;
        break;
      case ActionKind::declare_queue:
        j["queue"] = a.name;
        j["durable"] = a.durable;
        j["arguments"] = to_json(a.arguments);
        break;
      case ActionKind::bind_exchange:
        j["destination"] = a.name;
        j["exchange"] = a.exchange;
        j["exchange_type"] = a.exchange_type;
        j["routing_key"] = a.routing_key;
        break;
      case ActionKind::bind_queue:
        j["queue"] = a.name;
        j["exchange"] = a.exchange;
        j["exchange_type"] = a.exchange_type;
        j["routing_key"] = a.routing_key;
        j["arguments"] = to_json(a.arguments);
        break;
      case ActionKind::check_queue:
      case ActionKind::delete_queue:
        j["queue"] = a.name;
        break;
      case ActionKind::delete_exchange:
        j["exchange"] = a.name;
        break;
    }
    actions.push_back(std::move(j));
  }
  return nlohmann::json{{"actions", std::move(actions)}};
}

std::string describe_outage(const outage::Settings& settings) {
  std::string text = "breaker: opens after " + std::to_string(settings.consecutive_unavailable) +
                     " unavailable in a row";
  if (settings.failure_rate) {
    const outage::FailureRate& rate = *settings.failure_rate;
    char percent[32];
    std::snprintf(percent, sizeof percent, "%g%%", rate.threshold * 100.0);
    text += " or at " + std::string(percent) + " failed of at least " +
            std::to_string(rate.minimum_calls) + " calls in " + duration_label(rate.window);
  }
  text += "; probes every " + duration_label(settings.probe_interval) +
          "; ramps from an eighth of the concurrency (at least 2), doubling every " +
          duration_label(settings.ramp.interval);
  return text;
}

nlohmann::json outage_json(const outage::Settings& settings) {
  nlohmann::json out = {{"consecutive_unavailable", settings.consecutive_unavailable},
                        {"failure_rate", nullptr},
                        {"probe_interval", duration_label(settings.probe_interval)},
                        {"ramp", {{"interval", duration_label(settings.ramp.interval)}}}};
  if (settings.failure_rate) {
    out["failure_rate"] = {{"threshold", settings.failure_rate->threshold},
                           {"window", duration_label(settings.failure_rate->window)},
                           {"minimum_calls", settings.failure_rate->minimum_calls}};
  }
  return out;
}

}  // namespace retryloop::topology
