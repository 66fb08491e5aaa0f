#pragma once

#include <chrono>
#include <string>

#include "retryloop/topology/topology.hpp"

namespace retryloop::topology {

// Binary delay levels: any delay, per message, without a plugin and without head-of-line
// blocking (docs/topology.md, "Delay levels").
//
// A set of levels is shared by every service of a vhost with the same base and queue type. Its
// objects are named after `retryloop.delay.<base>` (`.quorum` added for quorum queues):
//
// - level k (k = 0 .. levels-1): a topic exchange and a queue, both `<set>.<kk>`. The queue holds
//   messages for base * 2^k (`x-message-ttl`) and then dead-letters them, routing key unchanged,
//   into level k-1's exchange (level 0: into `<set>.deliver`).
// - A message's routing key is its delay in units of the base, one word per bit, lowest bit
//   first, then its service queue's name: 5 units for queue `orders` on 4 levels is
//   `1.0.1.0.orders`. Level k's exchange sends a message whose word k is `1` into its queue
//   (binding `<k times *.>1.#`) and one whose word k is `0` on to level k-1's exchange (an
//   exchange-to-exchange binding, `<k times *.>0.#`). Since word k means the same on every level
//   count, services with different level counts share the same levels.
// - `<set>.deliver` (topic) hands the message to its service's queue, which binds it with exactly
//   as many `*` words as the service has levels, then its own name: no other queue matches, even
//   one whose name ends in this one's.
// - `<set>.unrouted` (fanout exchange and queue) is the alternate exchange of every exchange of
//   the set: a message whose service queue is gone when its delay ends waits there, never lost.
//
// The consumer publishes a retry to the exchange of its highest set bit, so a delay of n units
// passes through exactly popcount(n) queues.

/// The most levels a service may declare: 2^32 - 1 units of the base.
inline constexpr int max_delay_levels = 32;

/// The fewest levels whose longest delay, base * (2^levels - 1), reaches `max`.
int levels_for(std::chrono::milliseconds base, std::chrono::milliseconds max);

/// The longest delay the service's levels wait: DelayLevels::max, or base * (2^levels - 1);
/// zero for a service without delay levels.
std::chrono::milliseconds longest_level_delay(const Service& service);

/// The set's name, which prefixes its objects: `retryloop.delay.<base label>`, with `.quorum`
/// added for quorum services. Empty for a service without delay levels.
std::string delay_set_name(const Service& service);
/// Level k's exchange and queue: `<set>.<kk>`, two digits, e.g. `retryloop.delay.100ms.07`.
std::string delay_level_name(const Service& service, int level);
/// `<set>.deliver`: the topic exchange level 0 dead-letters into.
std::string delay_delivery_exchange_name(const Service& service);
/// `<set>.unrouted`: the alternate exchange of the set, and its queue.
std::string delay_unrouted_name(const Service& service);
/// True for names in the delay levels' namespace (`retryloop.delay.`), which services must not use.
bool is_delay_level_object(std::string_view name);

/// Level k's binding key for messages whose bit k is `bit`: `*.*.1.#` for k = 2 and bit 1.
std::string level_binding_key(int level, bool bit);
/// The service queue's binding key on `<set>.deliver`: one `*` per level, then the queue's name.
std::string delivery_binding_key(const Service& service);

/// Where and how a retry of `requested` goes through the service's levels.
struct DelayRoute {
  /// The exchange to publish to: the level of the highest set bit, or `<set>.deliver` for a delay
  /// that rounds to zero.
  std::string exchange;
  std::string routing_key;
  /// What the message will wait: `requested` rounded up to a whole number of bases, so never
  /// less than asked; a request over longest_level_delay waits longest_level_delay, rounded down.
  std::chrono::milliseconds delay{0};
  std::chrono::milliseconds requested{0};
  /// `requested` was longer than longest_level_delay.
  bool capped = false;
  /// Level queues the message passes through (bits set).
  int hops = 0;
};

/// The route of a retry that asks to wait `requested` (negative counts as zero). The service
/// must have delay levels.
DelayRoute delay_route(const Service& service, std::chrono::milliseconds requested);

/// A scheduled message's view of `queue` as a service of the schedule's levels: named `queue`,
/// consuming `queue`, republish mode with `schedule.levels`, of `schedule.queue_type`. The names
/// and the route of a scheduled message come from it (delay_set_name, delay_route, ...).
Service schedule_target(const Schedule& schedule, const std::string& queue);

/// True when `routing_key` is the routing key of a retry of this service through its delay
/// levels (delay_route): one `0` or `1` per level, then the service's input queue.
bool is_delay_route_of(const Service& service, std::string_view routing_key);

}  // namespace retryloop::topology
