#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "retryloop/outage/settings.hpp"

namespace retryloop::topology {

// The model of a topology file: plain values, no JSON and no AMQP types. A file is read into it
// by parse_topology (topology_json.hpp); make_plan (plan.hpp) turns it into broker actions.

enum class QueueType { classic, quorum };
enum class ExchangeType { direct, topic, fanout, headers };
enum class RetryMode {
  /// The consumer rejects (requeue=false); the broker dead-letters the message through the wait
  /// queue and back. Exactly one delay.
  reject,
  /// The consumer publishes a copy to the wait exchange with the delay's routing key, waits for
  /// the confirm, then acks. One or more delays; the last one repeats.
  republish,
  /// Quorum queues on RabbitMQ 4.3 and later: the consumer rejects with requeue, and the queue
  /// itself holds the message back (its delayed retry, `x-delayed-retry-*`) for the first delay
  /// times the number of failed deliveries so far, at most the second delay: no wait queue, no
  /// dead-lettering. One delay (a fixed one) or two (the step and the cap).
  in_queue,
};
/// `x-match` of a headers binding.
enum class HeadersMatch { all, any };

/// A value a headers binding matches; integers are sent as AMQP `l` (int64).
using HeaderValue = std::variant<std::string, int64_t, bool>;

/// How the service queue is bound to its input exchange. Direct and topic exchanges use
/// `routing_key`; headers exchanges use `match` and `headers` (the routing key is ignored).
struct Binding {
  std::string routing_key;
  HeadersMatch match = HeadersMatch::all;
  std::vector<std::pair<std::string, HeaderValue>> headers;

  friend bool operator==(const Binding& a, const Binding& b) {
    return a.routing_key == b.routing_key && a.match == b.match && a.headers == b.headers;
  }
};

/// The exchange publishers send the service's messages to.
struct Input {
  std::string exchange;
  ExchangeType type = ExchangeType::direct;
  /// false: the exchange belongs to someone else; it is only checked for, never declared.
  bool declare = true;
  /// A fanout binding takes no routing key, so fanout inputs have none here (one binding is made).
  std::vector<Binding> bindings;
};

/// Binary delay levels (republish mode): a chain of wait queues where level k holds a message
/// for base * 2^k, so that any delay up to base * (2^levels - 1) takes at most `levels` hops
/// and no queue ever holds messages of different delays (no head-of-line blocking). A message's
/// routing key spells its delay in bits; see delay_levels.hpp for the objects and the routing.
struct DelayLevels {
  /// The precision: every delay is rounded to a whole number of it.
  std::chrono::milliseconds base{0};
  /// How many levels: 1 to max_delay_levels, and base * 2^(levels-1) at most max_ttl.
  int levels = 0;
  /// The longest delay a handler may ask for; longer ones are cut to it (and the log says so).
  /// nullopt: base * (2^levels - 1), all the levels can spell.
  std::optional<std::chrono::milliseconds> max;
};

/// Capped exponential backoff with jitter over the delay levels, for Outcome::retry: the delay
/// after failed attempt k is min(initial * multiplier^(k-1), max), moved by up to +/- jitter of
/// itself, then rounded to the levels' base.
struct RetryBackoff {
  std::chrono::milliseconds initial{0};
  std::chrono::milliseconds max{0};
  double multiplier = 2.0;
  /// 0 to 1: 0.2 spreads each delay over [0.8 d, 1.2 d].
  double jitter = 0.2;
};

struct Retry {
  RetryMode mode = RetryMode::reject;
  /// reject: exactly one. republish: the delay before retry k is delays[min(k-1, last)]. May be
  /// empty in republish mode when `backoff` gives the delays instead. in_queue: the step and,
  /// when given, the cap: the delay before retry k is min(delays[0] * k, delays[1]).
  std::vector<std::chrono::milliseconds> delays;
  /// Handler attempts before the message is parked (the first delivery counts as one).
  int max_attempts = 1;
  /// The retry budget: a failed message whose first failure is at least this long ago is parked
  /// as `exhausted`, whatever its attempt count. nullopt: no budget.
  std::optional<std::chrono::milliseconds> max_retry_duration;
  /// Republish mode: the delay levels that Outcome::retry_after (and `backoff`) wait in.
  std::optional<DelayLevels> delay_levels;
  /// Republish mode with delay levels: plain retries wait this backoff in the levels instead of
  /// the `delays` tiers.
  std::optional<RetryBackoff> backoff;
};

struct Parking {
  /// `x-max-length` with `x-overflow=reject-publish`: a full parking queue refuses new messages
  /// (the consumer then keeps them) and never drops the oldest.
  std::optional<int64_t> max_length;
  /// `x-message-ttl` of the parking queue: parked messages are dropped after this long.
  std::optional<std::chrono::milliseconds> ttl;
};

/// Service::delivery_limit when the file sets none: RabbitMQ 4.x's own default for quorum queues.
constexpr int64_t default_delivery_limit = 20;

/// The `x-delivery-limit` of every quorum queue retryloop consumes or reads: so high that the
/// broker never acts on it. Past its limit the broker dead-letters a message: from the service
/// queue into the wait queue and back, where RabbitMQ drops it as a dead-letter cycle (no
/// rejection in it), and from the parking queue, which dead-letters nowhere, straight to the
/// floor (every read of a parked message counts). Without the argument 4.x applies a limit of 20;
/// -1 means unlimited only from 4.0 on, while 3.x drops the message at its first return.
constexpr int64_t broker_delivery_limit = 1000000;

/// One service: an input queue and its retry loop. Every other name is derived from `name`.
struct Service {
  std::string name;
  /// The input queue; parse_topology sets it to `name` when the file leaves it out. Empty here
  /// also means `name` (see input_queue_name).
  std::string queue;
  QueueType queue_type = QueueType::classic;
  /// Quorum queues only: a delivery that this many earlier deliveries of the same message went
  /// back unsettled (consumer crashes, stalls, requeues; the broker's `x-delivery-count`) is
  /// parked by the consumer, reason `delivery_limit`, without running its handler. The queue's
  /// own limit is broker_delivery_limit. nullopt: default_delivery_limit.
  std::optional<int64_t> delivery_limit;
  /// Quorum queues only: how many nodes of a cluster hold each of the service's queues when it is
  /// first declared (`x-quorum-initial-group-size`). nullopt: RabbitMQ's default, every node of
  /// the cluster then (at most its quorum_cluster_size). Membership changes afterwards only with
  /// `rabbitmq-queues grow|shrink|add_member`; `topology verify --management` compares it.
  std::optional<int64_t> replicas;
  Input input;
  Retry retry;
  Parking parking;
  /// The service's breaker (the file's `outage` object, docs/outage.md). A file without one gets
  /// the defaults: the breaker trips on unavailable outcomes only.
  outage::Settings outage;
};

/// Vhost-wide delay levels for scheduled delivery: the top-level `delay_levels` of a topology
/// file. A producer schedules a message for one of `queues` (schedule/scheduler.hpp,
/// `retryloop send`, an outbox row with a due time); it waits in the levels and then goes to that
/// queue. The levels are the same objects a service with the same base and queue type uses.
struct Schedule {
  DelayLevels levels;
  /// The type of the level queues; quorum keeps scheduled messages through the loss of a node.
  QueueType queue_type = QueueType::classic;
  /// The queues that may receive scheduled messages: a service's input queue, or a queue someone
  /// else declares (it must exist; it is bound to the levels but never declared or deleted).
  std::vector<std::string> queues;
};

/// The vhost's audit trail: a stream that the parking console and the parking commands append a
/// record of each action to (who, when, what, how many), and that the console reads back. The
/// top-level `audit` of a topology file.
struct Audit {
  /// How long records are kept (the stream's `x-max-age`, in whole seconds).
  std::chrono::milliseconds max_age = std::chrono::hours(24 * 365);
};

struct Topology {
  std::vector<Service> services;
  /// The file's top-level `audit`, when it has one.
  std::optional<Audit> audit{};
  /// The file's top-level `delay_levels`, when it has one.
  std::optional<Schedule> schedule{};
};

/// One problem found in a topology file or model.
struct TopologyError {
  /// The service it concerns, when known.
  std::string service;
  /// Where: `services[1].retry.delays[0]`; empty for the file as a whole.
  std::string path;
  std::string message;
  /// 1-based position, for malformed JSON only (0 otherwise).
  size_t line = 0;
  size_t column = 0;
};

/// "services[1].retry.delays[0] (service "audit"): ..." — the source name goes in front when
/// given ("topology/x.json: ..."; malformed JSON as "topology/x.json:3:17: ...").
std::string to_string(const TopologyError& error, std::string_view source = {});

/// Checks everything about a model that does not depend on how it was written: names RabbitMQ
/// refuses or reserves, lengths (derived names too), delays and TTLs, modes, bindings, and names
/// that clash between services. Returns every problem found, in file order; empty when valid.
std::vector<TopologyError> validate(const Topology& topology);

/// The services named in `names`, in file order; throws std::invalid_argument naming an unknown
/// one. An empty `names` selects every service.
Topology select_services(const Topology& topology, const std::vector<std::string>& names);

// ---- Derived names. Every module (declarer, consumer, parking tool) finds objects by these. ----

const char* to_string(QueueType type);
const char* to_string(ExchangeType type);
const char* to_string(RetryMode mode);

/// The oldest RabbitMQ release (major, minor) that has what `service` needs of the broker:
/// {4, 3} for the in_queue retry mode (quorum queues' delayed retry), else {0, 0}.
std::pair<unsigned, unsigned> broker_needed(const Service& service);
const char* to_string(HeadersMatch match);

/// The input queue: `service.queue`, or the service name when that is empty.
const std::string& input_queue_name(const Service& service);
/// `N.wait`: direct, its alternate exchange is the parking exchange.
std::string wait_exchange_name(std::string_view service_name);
/// `N.wait.<label>`, for example `orders.wait.30s` (label: duration_label).
std::string wait_queue_name(std::string_view service_name, std::chrono::milliseconds delay);
/// `N.parking`, the parking exchange (fanout).
std::string parking_exchange_name(std::string_view service_name);
/// `N.parking`, the parking queue (same name as its exchange).
std::string parking_queue_name(std::string_view service_name);
/// `N.migration`: the fanout exchange through which a migration of the service tells its
/// instances each step, and the queue of the same name that keeps its newest record
/// (docs/migrate.md).
std::string migration_record_name(std::string_view service_name);
/// `N.migration.settling`: consumed by an instance while it settles what it took from a queue it
/// left, following a migration.
std::string migration_settling_queue_name(std::string_view service_name);
/// `N.migration.copied`: what a migration's moves back have copied (migrate/copied_log.hpp).
std::string migration_copied_queue_name(std::string_view service_name);
/// `<queue>.migrating`: the holding queue that stands in for `queue` while a migration makes it
/// again (docs/migrate.md); a retry counts the rejections of a message in either.
std::string holding_queue_name(std::string_view queue);
/// Whether `name` is holding_queue_name(queue), without making it (a delivery's headers are read
/// with it).
bool is_holding_queue_of(std::string_view name, std::string_view queue);
/// `N.breaker`, the fanout on which a service's instances share their breaker (docs/outage.md).
std::string breaker_exchange_name(std::string_view service_name);
/// `N.breaker.state`: holds the last breaker signal (an operator's pause, an open outage).
std::string breaker_state_queue_name(std::string_view service_name);
/// `N.breaker.token`: the probe token's single-active-consumer queue.
std::string breaker_token_queue_name(std::string_view service_name);
/// `N.breaker.instances`: holds nothing; each instance consumes it, so that its consumer count
/// is the number of instances connected.
std::string breaker_instances_queue_name(std::string_view service_name);
/// The vhost's audit stream: `retryloop.audit`.
std::string audit_stream_name();

/// The distinct delays of a service in first-use order: one wait queue each.
std::vector<std::chrono::milliseconds> wait_delays(const Service& service);
/// The delay after failed attempt `attempt` (1 = the first delivery failed): reject mode: the
/// single delay; republish: delays[min(attempt-1, last)]. Attempts below 1 count as 1.
std::chrono::milliseconds delay_after_attempt(const Service& service, int attempt);
/// The routing key on the wait exchange for that delay: its label, e.g. `30s`.
std::string wait_routing_key(const Service& service, int attempt);

}  // namespace retryloop::topology
