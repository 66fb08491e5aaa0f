#include "retryloop/topology/delay_levels.hpp"

#include <algorithm>
#include <cstdio>

#include "retryloop/topology/duration.hpp"

namespace retryloop::topology {

namespace {

constexpr std::string_view namespace_prefix = "retryloop.delay.";

/// 2^levels - 1 units, without overflow for up to 63 levels.
int64_t all_bits(int levels) {
  if (levels <= 0) return 0;
  return static_cast<int64_t>((uint64_t(1) << std::min(levels, 62)) - 1);
}

std::string stars(int count) {
  std::string out;
  out.reserve(size_t(count) * 2);
  for (int k = 0; k < count; ++k)
    out += "*.";
  return out;
}

}  // namespace

int levels_for(std::chrono::milliseconds base, std::chrono::milliseconds max) {
  if (base.count() <= 0) return 0;
  int levels = 1;
  while (levels < 62 && base.count() * all_bits(levels) < max.count())
    ++levels;
  return levels;
}

std::chrono::milliseconds longest_level_delay(const Service& service) {
  const auto& levels = service.retry.delay_levels;
  if (!levels || levels->base.count() <= 0) return std::chrono::milliseconds(0);
  const int64_t units = all_bits(levels->levels);
  const int64_t longest =
      units > INT64_MAX / levels->base.count() ? INT64_MAX : units * levels->base.count();
  return std::chrono::milliseconds(levels->max ? std::min(levels->max->count(), longest) : longest);
}

std::string delay_set_name(const Service& service) {
  if (!service.retry.delay_levels) return {};
  std::string name =
      std::string(namespace_prefix) + duration_label(service.retry.delay_levels->base);
  if (service.queue_type == QueueType::quorum) name += ".quorum";
  return name;
}

std::string delay_level_name(const Service& service, int level) {
  char digits[16];
  std::snprintf(digits, sizeof digits, "%02d", level);
  return delay_set_name(service) + "." + digits;
}

std::string delay_delivery_exchange_name(const Service& service) {
  return delay_set_name(service) + ".deliver";
}

std::string delay_unrouted_name(const Service& service) {
  return delay_set_name(service) + ".unrouted";
}

bool is_delay_level_object(std::string_view name) {
  return name.substr(0, namespace_prefix.size()) == namespace_prefix;
}

std::string level_binding_key(int level, bool bit) {
  return stars(level) + (bit ? "1.#" : "0.#");
}

std::string delivery_binding_key(const Service& service) {
  const int levels = service.retry.delay_levels ? service.retry.delay_levels->levels : 0;
  return stars(levels) + input_queue_name(service);
}

DelayRoute delay_route(const Service& service, std::chrono::milliseconds requested) {
  DelayRoute route;
  route.requested = requested;
  const DelayLevels& levels = *service.retry.delay_levels;
  const int64_t base = levels.base.count();
  const auto longest = longest_level_delay(service);
  int64_t units = 0;
  if (requested > longest) {
    route.capped = true;
    units = longest.count() / base;
  } else if (requested.count() > 0) {
    // Up, never to the nearest: a retry must not come back before it asked to. Fits the levels,
    // which reach at least `longest`.
    units = requested.count() / base + (requested.count() % base != 0 ? 1 : 0);
  }
  route.delay = std::chrono::milliseconds(units * base);
  int highest = -1;
  for (int k = 0; k < levels.levels; ++k) {
    const bool bit = ((uint64_t(units) >> k) & 1U) != 0;
    route.routing_key += bit ? "1." : "0.";
    if (bit) {
      highest = k;
      ++route.hops;
    }
  }
  route.routing_key += input_queue_name(service);
  route.exchange =
      highest < 0 ? delay_delivery_exchange_name(service) : delay_level_name(service, highest);
  return route;
}

Service schedule_target(const Schedule& schedule, const std::string& queue) {
  Service target;
  target.name = queue;
  target.queue = queue;
  target.queue_type = schedule.queue_type;
  target.retry.mode = RetryMode::republish;
  target.retry.delay_levels = schedule.levels;
  return target;
}

bool is_delay_route_of(const Service& service, std::string_view routing_key) {
  if (!service.retry.delay_levels) return false;
  for (int k = 0; k < service.retry.delay_levels->levels; ++k) {
    if (routing_key.size() < 2 || (routing_key[0] != '0' && routing_key[0] != '1') ||
        routing_key[1] != '.') {
      return false;
    }
    routing_key.remove_prefix(2);
  }
  return routing_key == input_queue_name(service);
}

}  // namespace retryloop::topology
