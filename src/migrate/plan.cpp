#include "retryloop/migrate/plan.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <utility>

#include "retryloop/topology/duration.hpp"

namespace retryloop::migrate {
namespace {

const char* to_string(Found found) {
  switch (found) {
    case Found::missing:
      return "missing";
    case Found::matches:
      return "matches";
    case Found::differs:
      return "differs";
  }
  return "missing";
}

std::optional<Found> found_from_string(const std::string& text) {
  for (Found found : {Found::missing, Found::matches, Found::differs}) {
    if (text == to_string(found)) return found;
  }
  return std::nullopt;
}

nlohmann::json to_json(const ObjectFound& object) {
  nlohmann::json out = {
      {"name", object.name}, {"found", to_string(object.found)}, {"messages", object.messages}};
  if (!object.argument.empty()) out["argument"] = object.argument;
  if (object.consumers > 0) out["consumers"] = object.consumers;
  return out;
}

std::optional<ObjectFound> object_from_json(const nlohmann::json& json, std::string& error) {
  if (!json.is_object()) {
    error = "an object of the survey is not a JSON object";
    return std::nullopt;
  }
  ObjectFound object;
  const auto name = json.find("name");
  const auto found = json.find("found");
  if (name == json.end() || !name->is_string() || found == json.end() || !found->is_string()) {
    error = "an object of the survey has no \"name\" or \"found\"";
    return std::nullopt;
  }
  object.name = name->get<std::string>();
  const auto parsed = found_from_string(found->get<std::string>());
  if (!parsed) {
    error = "\"found\" of " + object.name + " is not missing, matches or differs";
    return std::nullopt;
  }
  object.found = *parsed;
  if (auto argument = json.find("argument"); argument != json.end() && argument->is_string()) {
    object.argument = argument->get<std::string>();
  }
  if (auto messages = json.find("messages");
      messages != json.end() && messages->is_number_unsigned()) {
    object.messages = messages->get<uint64_t>();
  }
  if (auto consumers = json.find("consumers");
      consumers != json.end() && consumers->is_number_unsigned()) {
    object.consumers = consumers->get<uint32_t>();
  }
  return object;
}

nlohmann::json to_json(const std::vector<ObjectFound>& objects) {
  nlohmann::json out = nlohmann::json::array();
  for (const ObjectFound& object : objects)
    out.push_back(to_json(object));
  return out;
}

bool objects_from_json(const nlohmann::json& json, const char* key,
                       std::vector<ObjectFound>& objects, std::string& error) {
  const auto list = json.find(key);
  if (list == json.end()) return true;
  if (!list->is_array()) {
    error = std::string("\"") + key + "\" is not an array";
    return false;
  }
  for (const auto& item : *list) {
    auto object = object_from_json(item, error);
    if (!object) return false;
    objects.push_back(std::move(*object));
  }
  return true;
}

/// Builds the steps, in order.
class Planner {
 public:
  Planner(const topology::Service& service, const Survey& survey)
      : service_(service), survey_(survey) {
    topology::Topology single;
    single.services = {service};
    declare_ = topology::make_plan(single);
  }

  MigrationPlan make() {
    plan_.service = service_.name;
    for (const ObjectFound& exchange : survey_.exchanges) {
      if (exchange.found != Found::differs) continue;
      plan_.refused.push_back(
          {"exchange " + exchange.name,
           "RabbitMQ cannot change an exchange's type or arguments (" +
               (exchange.argument.empty() ? std::string("it differs") : exchange.argument) +
               " differs), and publishers and other services hold its name, so it cannot be "
               "made again behind their backs",
           "stop the publishers and the consumers that use it, delete it (rabbitmqctl "
           "delete_exchange, or the management UI), run `retryloop topology apply` with the "
           "file, and start them again"});
    }
    if (!plan_.refused.empty()) return std::move(plan_);

    // New wait queues first: a service queue made again dead-letters to them.
    for (const ObjectFound& wait : survey_.wait_queues) {
      if (wait.found == Found::missing)
        add_object(wait.name, "delay level " + level_of(wait.name) + " is new");
    }
    if (survey_.service_queue.found == Found::missing) {
      add_object(service_queue(), "the service queue is missing");
    } else if (survey_.service_queue.found == Found::differs) {
      make_again(service_queue(), survey_.service_queue, true,
                 "the service queue differs from the file" + first(survey_.service_queue));
    }
    for (const ObjectFound& wait : survey_.wait_queues) {
      if (wait.found == Found::differs) replace_level(wait);
    }
    for (const ObjectFound& stale : survey_.stale_wait_queues)
      retire_level(stale);
    if (survey_.parking_queue.found == Found::missing) {
      add_object(survey_.parking_queue.name, "the parking queue is missing");
    } else if (survey_.parking_queue.found == Found::differs) {
      make_again(survey_.parking_queue.name, survey_.parking_queue, false,
                 "the parking queue differs from the file" + first(survey_.parking_queue));
    }
    return std::move(plan_);
  }

 private:
  std::string service_queue() const { return topology::input_queue_name(service_); }

  /// The broker compares arguments one at a time and names the first that differs.
  static std::string first(const ObjectFound& found) {
    return found.argument.empty() ? std::string() : " (first: " + found.argument + ")";
  }

  std::string level_of(const std::string& queue) const {
    const std::string prefix = topology::wait_exchange_name(service_.name) + ".";
    return queue.rfind(prefix, 0) == 0 ? queue.substr(prefix.size()) : queue;
  }

  const topology::Action& declaration(const std::string& queue) const {
    for (const topology::Action& action : declare_.actions) {
      if (action.kind == topology::ActionKind::declare_queue && action.name == queue) return action;
    }
    static const topology::Action none;
    return none;
  }

  std::vector<topology::Action> bindings(const std::string& queue) const {
    std::vector<topology::Action> out;
    for (const topology::Action& action : declare_.actions) {
      if (action.kind == topology::ActionKind::bind_queue && action.name == queue) {
        out.push_back(action);
      }
    }
    return out;
  }

  static bool is_quorum(const topology::Action& declaration) {
    const amqp::FieldValue* type = declaration.arguments.find("x-queue-type");
    return type != nullptr && type->as_string() == std::string_view("quorum");
  }

  /// Whether the broker's `queue` is, or may be, a quorum queue. Only a refusal that names
  /// x-queue-type tells that the type differs: RabbitMQ compares one argument at a time, and a
  /// queue declared without x-queue-type may be refused for another one first (a quorum queue
  /// that the file makes classic, say). A classic queue is deleted with if-empty and if-unused,
  /// which RabbitMQ refuses for a quorum queue by closing the connection: so a queue is taken for
  /// classic only when that is known.
  bool broker_quorum(const std::string& queue, const ObjectFound& found) const {
    if (found.argument == "x-queue-type") return !is_quorum(declaration(queue));
    return true;
  }

  void push_delete(const std::string& queue, bool quorum, std::string why) {
    push_queue(StepKind::delete_queue, queue, std::move(why));
    plan_.steps.back().quorum = quorum;
  }

  static topology::Action renamed(topology::Action action, const std::string& name) {
    action.name = name;
    return action;
  }

  void push(StepKind kind, topology::Action action, std::string why) {
    Step step;
    step.kind = kind;
    step.action = std::move(action);
    step.queue = step.action.name;
    step.why = std::move(why);
    plan_.steps.push_back(std::move(step));
  }

  /// `binding` (of its queue) passes from `from` to it: bound, then unbound from `from` at once.
  void push_binding_move(const topology::Action& binding, const std::string& from,
                         const std::string& why) {
    push(StepKind::move_binding, binding, why);
    plan_.steps.back().target = from;
  }

  void push_queue(StepKind kind, const std::string& queue, std::string why, std::string target = {},
                  std::chrono::milliseconds delay = {}) {
    Step step;
    step.kind = kind;
    step.queue = queue;
    step.target = std::move(target);
    step.delay = delay;
    step.why = std::move(why);
    plan_.steps.push_back(std::move(step));
  }

  /// A queue the file has and the broker does not: declared and bound, as apply does.
  void add_object(const std::string& queue, const std::string& why) {
    push(StepKind::declare_queue, declaration(queue), why);
    for (const topology::Action& binding : bindings(queue))
      push(StepKind::bind_queue, binding, why);
  }

  /// Makes `queue` again with the file's arguments, its messages kept: a holding queue with those
  /// arguments takes its bindings (and, for the service queue, its consumers) while it is moved,
  /// deleted and declared again, then gives them back and is moved into it.
  void make_again(const std::string& queue, const ObjectFound& found, bool service,
                  const std::string& why) {
    const std::string holding = holding_queue_name(queue);
    const std::vector<topology::Action> binds = bindings(queue);
    push(StepKind::declare_queue, renamed(declaration(queue), holding), why);
    for (const topology::Action& binding : binds)
      push_binding_move(renamed(binding, holding), queue, why);
    if (service) push_queue(StepKind::announce, holding, why, queue);
    push_queue(StepKind::move, queue, why, holding);
    push_queue(StepKind::drain, queue, why);
    push_delete(queue, broker_quorum(queue, found), why);
    push(StepKind::declare_queue, declaration(queue), why);
    for (const topology::Action& binding : binds)
      push_binding_move(binding, holding, why);
    if (service) push_queue(StepKind::announce, std::string(), why, queue);
    push_queue(StepKind::move, holding, why, queue);
    push_queue(StepKind::drain, holding, why);
    push_delete(holding, is_quorum(declaration(queue)), why);
    // Moved out, and moved back with what came meanwhile.
    plan_.messages_to_move += 2 * found.messages;
  }

  std::chrono::milliseconds delay_of(const std::string& queue) const {
    return topology::parse_duration(level_of(queue)).value_or(std::chrono::milliseconds(0));
  }

  /// A wait queue whose arguments change: nothing is moved. Unbound, it sends each message back
  /// at its due time; a holding queue with the new arguments takes the new retries meanwhile.
  void replace_level(const ObjectFound& found) {
    const std::string why =
        "delay level " + level_of(found.name) + " differs from the file" + first(found);
    const std::string holding = holding_queue_name(found.name);
    const std::vector<topology::Action> binds = bindings(found.name);
    const std::chrono::milliseconds delay = delay_of(found.name);
    push(StepKind::declare_queue, renamed(declaration(found.name), holding), why);
    for (const topology::Action& binding : binds)
      push_binding_move(renamed(binding, holding), found.name, why);
    push_queue(StepKind::drain, found.name, why, {}, delay);
    push_delete(found.name, broker_quorum(found.name, found), why);
    push(StepKind::declare_queue, declaration(found.name), why);
    for (const topology::Action& binding : binds)
      push_binding_move(binding, holding, why);
    push_queue(StepKind::drain, holding, why, {}, delay);
    push_delete(holding, is_quorum(declaration(found.name)), why);
    if (found.messages > 0 || instances_run()) plan_.drain_time += delay;
    if (instances_run()) plan_.drain_time += delay;  // the retries the holding queue took
  }

  /// Whether the service queue had consumers at the survey: instances whose retries may reach a
  /// wait queue during the migration.
  bool instances_run() const { return survey_.service_queue.consumers > 0; }

  /// A wait queue the file no longer has: unbound, it sends each message back at its due time,
  /// and is deleted once empty.
  void retire_level(const ObjectFound& found) {
    const std::string why = "delay level " + level_of(found.name) + " is removed";
    const std::chrono::milliseconds delay = delay_of(found.name);
    topology::Action binding;
    binding.kind = topology::ActionKind::bind_queue;
    binding.role = topology::Role::wait_queue;
    binding.services = {service_.name};
    binding.name = found.name;
    binding.exchange = topology::wait_exchange_name(service_.name);
    binding.exchange_type = "direct";
    binding.routing_key = level_of(found.name);
    push(StepKind::unbind_queue, binding, why);
    push_queue(StepKind::drain, found.name, why, {}, delay);
    // Wait queues are of the service's type as the broker has it: classic when its service
    // queue is known to be.
    const bool file_quorum = service_.queue_type == topology::QueueType::quorum;
    const bool known_classic = (!file_quorum && survey_.service_queue.found == Found::matches) ||
                               (file_quorum && survey_.service_queue.argument == "x-queue-type");
    push_delete(found.name, !known_classic, why);
    if (found.messages > 0 || instances_run()) plan_.drain_time += delay;
  }

  const topology::Service& service_;
  const Survey& survey_;
  topology::Plan declare_;
  MigrationPlan plan_;
};

/// FNV-1a, 64 bits: a digest to compare, not a secret.
uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace

nlohmann::json to_json(const Survey& survey) {
  return {{"exchanges", to_json(survey.exchanges)},
          {"service_queue", to_json(survey.service_queue)},
          {"wait_queues", to_json(survey.wait_queues)},
          {"stale_wait_queues", to_json(survey.stale_wait_queues)},
          {"parking_queue", to_json(survey.parking_queue)}};
}

std::optional<Survey> survey_from_json(const nlohmann::json& json, std::string& error) {
  if (!json.is_object()) {
    error = "the survey is not a JSON object";
    return std::nullopt;
  }
  Survey survey;
  if (!objects_from_json(json, "exchanges", survey.exchanges, error) ||
      !objects_from_json(json, "wait_queues", survey.wait_queues, error) ||
      !objects_from_json(json, "stale_wait_queues", survey.stale_wait_queues, error)) {
    return std::nullopt;
  }
  for (auto [key, object] : {std::pair{"service_queue", &survey.service_queue},
                             std::pair{"parking_queue", &survey.parking_queue}}) {
    const auto found = json.find(key);
    if (found == json.end()) {
      error = std::string("the survey has no \"") + key + "\"";
      return std::nullopt;
    }
    auto parsed = object_from_json(*found, error);
    if (!parsed) return std::nullopt;
    *object = std::move(*parsed);
  }
  return survey;
}

std::string holding_queue_name(const std::string& queue) {
  return topology::holding_queue_name(queue);
}

const char* to_string(StepKind kind) {
  switch (kind) {
    case StepKind::declare_queue:
      return "declare_queue";
    case StepKind::bind_queue:
      return "bind_queue";
    case StepKind::unbind_queue:
      return "unbind_queue";
    case StepKind::move_binding:
      return "move_binding";
    case StepKind::announce:
      return "announce";
    case StepKind::move:
      return "move";
    case StepKind::drain:
      return "drain";
    case StepKind::delete_queue:
      return "delete_queue";
  }
  return "unknown";
}

MigrationPlan make_migration_plan(const topology::Service& service, const Survey& survey) {
  return Planner(service, survey).make();
}

std::string describe(const Step& step) {
  switch (step.kind) {
    case StepKind::declare_queue:
    case StepKind::bind_queue:
      return topology::describe(step.action);
    case StepKind::unbind_queue:
      return "unbind " + step.action.exchange + " -> " + step.action.name +
             (step.action.routing_key.empty() ? "" : " (" + step.action.routing_key + ")");
    case StepKind::move_binding:
      return "move binding " + step.action.exchange + " -> " + step.target +
             (step.action.routing_key.empty() ? "" : " (" + step.action.routing_key + ")") +
             " to " + step.action.name;
    case StepKind::announce:
      return step.queue.empty() ? "the instances consume " + step.target + " alone again"
                                : "the instances consume " + step.queue + " beside " + step.target;
    case StepKind::move:
      return "move " + step.queue + " -> " + step.target;
    case StepKind::drain:
      return step.delay.count() > 0
                 ? "wait until " + step.queue + " is empty (its retries come due within " +
                       topology::duration_label(step.delay) + ")"
                 : "wait until " + step.queue + " is empty and has no consumer";
    case StepKind::delete_queue:
      return "delete queue " + step.queue;
  }
  return "";
}

nlohmann::json to_json(const MigrationPlan& plan) {
  nlohmann::json steps = nlohmann::json::array();
  for (const Step& step : plan.steps) {
    nlohmann::json out = {{"step", to_string(step.kind)},
                          {"queue", step.queue},
                          {"what", describe(step)},
                          {"why", step.why}};
    if (!step.target.empty()) out["target"] = step.target;
    if (step.kind == StepKind::bind_queue || step.kind == StepKind::unbind_queue ||
        step.kind == StepKind::move_binding) {
      out["exchange"] = step.action.exchange;
      out["routing_key"] = step.action.routing_key;
    }
    if (step.kind == StepKind::declare_queue) {
      out["arguments"] = topology::to_json(step.action.arguments);
    }
    if (step.delay.count() > 0) out["delay"] = topology::duration_label(step.delay);
    steps.push_back(std::move(out));
  }
  nlohmann::json refused = nlohmann::json::array();
  for (const Refusal& refusal : plan.refused) {
    refused.push_back({{"object", refusal.object},
                       {"reason", refusal.reason},
                       {"manual_steps", refusal.manual_steps}});
  }
  return {{"service", plan.service},
          {"steps", std::move(steps)},
          {"refused", std::move(refused)},
          {"messages_to_move", plan.messages_to_move},
          {"drain_time", topology::duration_label(plan.drain_time)}};
}

std::string digest(const MigrationPlan& plan) {
  nlohmann::json what = nlohmann::json::array();
  for (const Step& step : plan.steps) {
    what.push_back({to_string(step.kind), step.queue, step.target, step.action.exchange,
                    step.action.routing_key, topology::to_json(step.action.arguments)});
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx",
                static_cast<unsigned long long>(fnv1a(plan.service + what.dump())));
  return out;
}

std::chrono::milliseconds estimate(const MigrationPlan& plan, double messages_per_second) {
  double seconds = 0;
  if (messages_per_second > 0) seconds = double(plan.messages_to_move) / messages_per_second;
  return std::chrono::milliseconds(int64_t(std::ceil(seconds * 1000))) + plan.drain_time;
}

}  // namespace retryloop::migrate
