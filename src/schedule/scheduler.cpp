#include "retryloop/schedule/scheduler.hpp"
#include "retryloop/random/os_random.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>

#include "retryloop/retry/headers.hpp"
#include "retryloop/topology/duration.hpp"

namespace retryloop::schedule {

namespace {

/// Default delivery mode of a scheduled message that sets none: persistent, so that it outlives
/// a broker restart while it waits.
constexpr uint8_t persistent = 2;

std::string queue_list(const topology::Schedule& schedule) {
  std::string out;
  for (const auto& queue : schedule.queues)
    out += (out.empty() ? "" : ", ") + queue;
  return out;
}

/// `delay` rounded up to whole seconds; unlike std::chrono::ceil, it cannot overflow.
std::chrono::milliseconds whole_seconds_up(std::chrono::milliseconds delay) {
  const int64_t ms = delay.count();
  const int64_t seconds = ms / 1000 + (ms % 1000 > 0 ? 1 : 0);
  return seconds > INT64_MAX / 1000 ? delay : std::chrono::milliseconds(seconds * 1000);
}

}  // namespace

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ScheduledCopy make_scheduled_copy(const topology::Schedule& schedule, const std::string& queue,
                                  const amqp::BasicProperties& properties,
                                  std::chrono::milliseconds delay, int64_t now_ms) {
  if (std::find(schedule.queues.begin(), schedule.queues.end(), queue) == schedule.queues.end()) {
    throw std::invalid_argument("queue \"" + queue +
                                "\" does not receive scheduled messages; the topology file's "
                                "delay_levels.queues names " +
                                queue_list(schedule));
  }
  const topology::Service target = topology::schedule_target(schedule, queue);
  const topology::DelayRoute route = topology::delay_route(target, delay);
  if (route.capped) {
    throw std::invalid_argument(
        "a delay of " + topology::duration_label(whole_seconds_up(delay)) +
        " is longer than the delay levels' " +
        topology::duration_label(topology::longest_level_delay(target)) +
        ", so the message would arrive early; raise delay_levels.max in the topology file");
  }
  ScheduledCopy copy;
  copy.delay = route.delay;
  copy.scheduled_at_ms = now_ms;
  copy.due_at_ms = now_ms + route.delay.count();
  if (route.hops == 0) {
    copy.routing_key = queue;  // the default exchange: a missing queue is returned
  } else {
    copy.exchange = route.exchange;
    copy.routing_key = route.routing_key;
  }
  copy.properties = properties;
  if (!copy.properties.delivery_mode) copy.properties.delivery_mode = persistent;
  amqp::FieldTable& headers =
      copy.properties.headers ? *copy.properties.headers : copy.properties.headers.emplace();
  headers.erase_if([](const std::string& name) { return retry::is_death_header(name); });
  if (copy.properties.expiration) {
    if (headers.find(retry::header::original_expiration) == nullptr) {
      headers.set(std::string(retry::header::original_expiration), *copy.properties.expiration);
    }
    copy.properties.expiration.reset();
  }
  headers.set(std::string(header::scheduled_at), copy.scheduled_at_ms);
  headers.set(std::string(header::due_at), copy.due_at_ms);
  return copy;
}

std::chrono::milliseconds longest_schedule_delay(const topology::Schedule& schedule) {
  return topology::longest_level_delay(topology::schedule_target(schedule, std::string()));
}

Scheduler::Scheduler(client::Channel& channel, topology::Schedule schedule)
    : channel_(channel), schedule_(std::move(schedule)) {}

client::Error Scheduler::schedule_in(const std::string& queue, amqp::BasicProperties properties,
                                     std::string_view body, std::chrono::milliseconds delay,
                                     ScheduleCallback done) {
  if (!properties.message_id || properties.message_id->empty()) {
    std::error_code no_id;
    properties.message_id = random::random_id(no_id);
    if (no_id) {
      return client::Error(no_id, "cannot draw a message id from the operating system (getrandom)");
    }
  }
  ScheduledCopy copy;
  try {
    copy = make_scheduled_copy(schedule_, queue, properties, delay, now_ms());
  } catch (const std::invalid_argument& e) {
    return client::Error(client::ClientError::invalid_argument, e.what());
  }
  auto result = std::make_shared<ScheduleResult>();
  result->message_id = *copy.properties.message_id;
  result->delay = copy.delay;
  result->due_at_ms = copy.due_at_ms;
  return channel_.publish(copy.exchange, copy.routing_key, copy.properties, body,
                          client::Mandatory::yes,
                          [result, done = std::move(done)](const client::PublishOutcome& outcome) {
                            result->publish = outcome;
                            done(*result);
                          });
}

client::Error Scheduler::schedule_at(const std::string& queue, amqp::BasicProperties properties,
                                     std::string_view body,
                                     std::chrono::system_clock::time_point at,
                                     ScheduleCallback done) {
  const auto delay =
      std::chrono::ceil<std::chrono::milliseconds>(at - std::chrono::system_clock::now());
  return schedule_in(queue, std::move(properties), body, delay, std::move(done));
}

}  // namespace retryloop::schedule
