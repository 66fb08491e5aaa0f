#include "retryloop/transfer/plan.hpp"

#include <algorithm>

#include "retryloop/retry/headers.hpp"
#include "retryloop/schedule/scheduler.hpp"
#include "retryloop/topology/delay_levels.hpp"

namespace retryloop::transfer {
namespace {

using std::chrono::milliseconds;

std::optional<int64_t> integer_header(const amqp::BasicProperties& properties,
                                      std::string_view name) {
  if (!properties.headers) return std::nullopt;
  const amqp::FieldValue* value = properties.headers->find(name);
  return value != nullptr ? value->as_int64() : std::nullopt;
}

/// The `x-death` entry {queue, rejected}, when there is one: its count and time (seconds).
struct Rejection {
  int64_t count = 0;
  std::optional<uint64_t> time;
};

std::optional<Rejection> rejection_in(const amqp::BasicProperties& properties,
                                      const std::string& queue) {
  if (!properties.headers) return std::nullopt;
  const amqp::FieldValue* x_death = properties.headers->find("x-death");
  const auto* entries = x_death != nullptr ? x_death->get_if<amqp::FieldArray>() : nullptr;
  if (entries == nullptr) return std::nullopt;
  for (const amqp::FieldValue& value : *entries) {
    const auto* entry = value.get_if<amqp::FieldTable>();
    if (entry == nullptr) continue;
    const amqp::FieldValue* name = entry->find("queue");
    const amqp::FieldValue* reason = entry->find("reason");
    if (name == nullptr || reason == nullptr || name->as_string() != std::string_view(queue) ||
        reason->as_string() != std::string_view("rejected")) {
      continue;
    }
    Rejection found;
    const amqp::FieldValue* count = entry->find("count");
    found.count = count != nullptr ? count->as_int64().value_or(0) : 0;
    if (const amqp::FieldValue* time = entry->find("time")) {
      if (const auto* stamp = time->get_if<amqp::Timestamp>()) found.time = stamp->seconds;
    }
    return found;
  }
  return std::nullopt;
}

/// Appends each set of `ladders` once, as deep as the deepest ladder that uses it: its levels,
/// longest first, then its unrouted queue.
void append_level_sources(std::vector<Source>& sources,
                          const std::vector<topology::Service>& ladders) {
  struct Set {
    std::string name;
    int levels = 0;
    std::vector<size_t> ladders;
  };
  std::vector<Set> sets;
  for (size_t i = 0; i < ladders.size(); ++i) {
    const std::string name = topology::delay_set_name(ladders[i]);
    auto set = std::find_if(sets.begin(), sets.end(), [&](const Set& s) { return s.name == name; });
    if (set == sets.end()) set = sets.insert(sets.end(), Set{name, 0, {}});
    set->levels = std::max(set->levels, ladders[i].retry.delay_levels->levels);
    set->ladders.push_back(i);
  }
  for (const Set& set : sets) {
    const topology::Service& ladder = ladders[set.ladders.front()];
    for (int k = set.levels - 1; k >= 0; --k) {
      sources.push_back({Source::Kind::delay_level, topology::delay_level_name(ladder, k),
                         ladder.retry.delay_levels->base * (int64_t{1} << k), k, set.ladders});
    }
    sources.push_back(
        {Source::Kind::unrouted, topology::delay_unrouted_name(ladder), {}, 0, set.ladders});
  }
}

}  // namespace

std::optional<topology::Schedule> queue_schedule(
    const std::string& queue, const std::optional<topology::Schedule>& schedule) {
  if (!schedule || std::find(schedule->queues.begin(), schedule->queues.end(), queue) ==
                       schedule->queues.end()) {
    return std::nullopt;
  }
  topology::Schedule own = *schedule;
  own.queues = {queue};
  return own;
}

std::optional<topology::Schedule> service_schedule(
    const topology::Service& service, const std::optional<topology::Schedule>& schedule) {
  return queue_schedule(topology::input_queue_name(service), schedule);
}

std::vector<std::string> unowned_scheduled_queues(const topology::Topology& topology) {
  std::vector<std::string> unowned;
  if (!topology.schedule) return unowned;
  for (const std::string& queue : topology.schedule->queues) {
    const bool owned = std::any_of(topology.services.begin(), topology.services.end(),
                                   [&](const topology::Service& service) {
                                     return topology::input_queue_name(service) == queue;
                                   });
    if (!owned && std::find(unowned.begin(), unowned.end(), queue) == unowned.end()) {
      unowned.push_back(queue);
    }
  }
  return unowned;
}

std::vector<topology::Service> level_ladders(const topology::Service& service,
                                             const std::optional<topology::Schedule>& schedule) {
  std::vector<topology::Service> ladders;
  if (service.retry.delay_levels && service.retry.mode != topology::RetryMode::in_queue) {
    ladders.push_back(service);
  }
  for (topology::Service& ladder :
       queue_level_ladders(topology::input_queue_name(service), schedule))
    ladders.push_back(std::move(ladder));
  return ladders;
}

std::vector<Source> transfer_sources(const topology::Service& service,
                                     const std::vector<topology::Service>& ladders) {
  std::vector<Source> sources;
  sources.push_back({Source::Kind::service_queue, topology::input_queue_name(service), {}, 0, {}});
  if (service.retry.mode != topology::RetryMode::in_queue) {
    std::vector<milliseconds> delays = topology::wait_delays(service);
    std::sort(delays.begin(), delays.end());
    for (milliseconds delay : delays) {
      sources.push_back(
          {Source::Kind::wait_queue, topology::wait_queue_name(service.name, delay), delay, 0, {}});
    }
  }
  append_level_sources(sources, ladders);
  sources.push_back({Source::Kind::parking, topology::parking_queue_name(service.name), {}, 0, {}});
  return sources;
}

std::vector<topology::Service> queue_level_ladders(
    const std::string& queue, const std::optional<topology::Schedule>& schedule) {
  std::vector<topology::Service> ladders;
  if (auto own = queue_schedule(queue, schedule)) {
    ladders.push_back(topology::schedule_target(*own, queue));
  }
  return ladders;
}

std::vector<Source> scheduled_queue_sources(const std::string& queue,
                                            const std::vector<topology::Service>& ladders) {
  std::vector<Source> sources;
  sources.push_back({Source::Kind::scheduled_queue, queue, {}, 0, {}});
  append_level_sources(sources, ladders);
  return sources;
}

const topology::Service* ladder_of(const std::vector<topology::Service>& ladders,
                                   const Source& source, std::string_view routing_key) {
  for (size_t i : source.ladders) {
    if (i < ladders.size() && topology::is_delay_route_of(ladders[i], routing_key)) {
      return &ladders[i];
    }
  }
  return nullptr;
}

milliseconds level_wait_bound(const topology::Service& ladder, const Source& source,
                              std::string_view routing_key) {
  const milliseconds base = ladder.retry.delay_levels->base;
  milliseconds bound = base * (int64_t{1} << source.level);
  // Word k of the routing key is bit k of the delay, lowest first (topology::delay_route).
  for (int k = 0; k < source.level && routing_key.size() >= 2; ++k) {
    if (routing_key[0] == '1') bound += base * (int64_t{1} << k);
    routing_key.remove_prefix(2);
  }
  return bound;
}

std::optional<topology::Schedule> transfer_schedule(const topology::Service& service,
                                                    milliseconds precision) {
  if (service.retry.delay_levels) return std::nullopt;
  if (service.retry.mode == topology::RetryMode::in_queue) return std::nullopt;
  const std::vector<milliseconds> delays = topology::wait_delays(service);
  if (delays.empty()) return std::nullopt;
  const milliseconds longest = *std::max_element(delays.begin(), delays.end());
  if (precision <= milliseconds(0)) precision = default_precision;
  topology::Schedule schedule;
  schedule.levels.base = precision;
  schedule.levels.levels = topology::levels_for(precision, longest);
  schedule.levels.max = longest;
  schedule.queue_type = service.queue_type;
  schedule.queues = {topology::input_queue_name(service)};
  return schedule;
}

topology::Service ladder_service(const topology::Service& service, milliseconds precision) {
  if (service.retry.delay_levels) return service;
  auto schedule = transfer_schedule(service, precision);
  if (!schedule) return service;
  return topology::schedule_target(*schedule, topology::input_queue_name(service));
}

std::optional<int64_t> due_time(const amqp::BasicProperties& properties, const Source& source,
                                const std::string& service_queue) {
  if (auto due = integer_header(properties, retry::header::retry_due); due && *due > 0) {
    return due;
  }
  if (source.kind == Source::Kind::delay_level) {
    auto due = integer_header(properties, schedule::header::due_at);
    return due && *due > 0 ? due : std::nullopt;
  }
  if (source.kind != Source::Kind::wait_queue) return std::nullopt;
  auto rejection = rejection_in(properties, service_queue);
  if (!rejection || rejection->count != 1 || !rejection->time) return std::nullopt;
  return (static_cast<int64_t>(*rejection->time) + 1) * 1000 + source.delay.count();
}

Placement place(const std::optional<int64_t>& due_ms, milliseconds whole_delay, int64_t now_ms,
                bool follow) {
  Placement placement;
  if (!due_ms) {
    placement.due_known = false;
    if (follow) {
      placement.kind = Placement::Kind::leave;
      return placement;
    }
    placement.due_ms = now_ms + whole_delay.count();
  } else {
    placement.due_ms = *due_ms;
  }
  const int64_t remaining = placement.due_ms - now_ms;
  if (remaining <= 0) {
    placement.kind = Placement::Kind::service_queue;
    return placement;
  }
  placement.kind = Placement::Kind::levels;
  placement.delay = milliseconds(remaining);
  return placement;
}

amqp::BasicProperties transfer_copy(const amqp::BasicProperties& properties, const Source& source,
                                    const std::string& service_queue,
                                    const std::string& delivery_exchange,
                                    const std::string& delivery_routing_key, uint64_t now_seconds,
                                    int64_t due_ms) {
  if (source.kind == Source::Kind::parking || source.kind == Source::Kind::scheduled_queue) {
    return properties;
  }
  if (source.kind == Source::Kind::delay_level || source.kind == Source::Kind::unrouted) {
    amqp::BasicProperties copy = properties;
    if (copy.headers) copy.headers->erase_if(retry::is_broker_header);
    return copy;
  }
  retry::AttemptInfo info =
      retry::read_attempt_info(properties, service_queue, delivery_exchange, delivery_routing_key);
  const bool retried = info.rejected > 0 || info.retries > 0;
  if (source.kind == Source::Kind::service_queue && info.rejected == 0) return properties;
  if (!retried && due_ms <= 0) return properties;
  // `attempt` is the attempt its next delivery is; make_retry_copy records the attempts made.
  info.attempt = std::max<int64_t>(info.attempt - 1, 0);
  return retry::make_retry_copy(properties, info, now_seconds,
                                due_ms > 0 ? static_cast<uint64_t>(due_ms) : 0);
}

}  // namespace retryloop::transfer
