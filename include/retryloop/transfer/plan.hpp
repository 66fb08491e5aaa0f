#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/amqp/properties.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::transfer {

// What `retryloop topology transfer` moves from the old broker to the new one, and where each
// waiting retry goes so that it comes back when it was due (docs/transfer.md). Pure: no broker,
// and the time is passed in.

/// A queue a transfer reads on the old broker.
struct Source {
  enum class Kind {
    service_queue,    ///< the service's input queue: its messages go to the same queue, in order
    wait_queue,       ///< a wait queue: each retry waits out what is left of its delay
    delay_level,      ///< a shared delay level: the service's own messages wait out what is left
                      ///< of their delay, every other queue's stay where they are
    unrouted,         ///< a set's unrouted queue: the service's own messages (due already, its
                      ///< queue gone when they came due) go to its queue, every other queue's stay
    parking,          ///< the parking queue: moved as it is, reason, error and history intact
    scheduled_queue,  ///< a scheduled queue no service declares: its messages go to the same
                      ///< queue, in order, as they are
  };
  Kind kind = Kind::service_queue;
  std::string queue;
  /// A wait queue's delay, or a delay level's (both their `x-message-ttl`).
  std::chrono::milliseconds delay{0};
  /// A delay level: its number in its set; a delay level or a set's unrouted queue: the ladders
  /// (indexes into those given to transfer_sources) whose messages it may hold.
  int level = 0;
  std::vector<size_t> ladders;
};

/// The part of a file's `schedule` that delivers to `queue`: the schedule with its queues cut to
/// `queue`; nullopt when it does not name it.
std::optional<topology::Schedule> queue_schedule(const std::string& queue,
                                                 const std::optional<topology::Schedule>& schedule);

/// queue_schedule of the service's input queue.
std::optional<topology::Schedule> service_schedule(
    const topology::Service& service, const std::optional<topology::Schedule>& schedule);

/// The queues of the file's schedule (its top-level `delay_levels`) that no service of the file
/// declares: queues someone else owns, which `topology apply` only checks for and binds to the
/// levels. In the file's order.
std::vector<std::string> unowned_scheduled_queues(const topology::Topology& topology);

/// The delay levels on the old broker that hold messages of `service`, each as the service its
/// messages there are routed for (topology::delay_route): the service itself when it has delay
/// levels (its retries), and topology::schedule_target of `schedule` when the schedule names the
/// service's queue (messages scheduled for it). Two ladders may share a set.
std::vector<topology::Service> level_ladders(const topology::Service& service,
                                             const std::optional<topology::Schedule>& schedule);

/// The queues of `service` a transfer reads, in order: the service queue, its wait queues
/// (shortest delay first), the delay levels of `ladders` (level_ladders; each set once, as deep
/// as its deepest ladder, the longest level first, so that a message that passes to a shorter
/// level meanwhile is still read, then the set's unrouted queue), then its parking queue. A
/// service in `in_queue` mode has no wait queue (its retries wait in the service queue itself).
std::vector<Source> transfer_sources(const topology::Service& service,
                                     const std::vector<topology::Service>& ladders = {});

/// The ladder the delay levels on the old broker hold messages scheduled for `queue` by:
/// topology::schedule_target of queue_schedule; none when the schedule does not deliver to it.
std::vector<topology::Service> queue_level_ladders(
    const std::string& queue, const std::optional<topology::Schedule>& schedule);

/// The queues a transfer reads for a scheduled queue no service declares
/// (unowned_scheduled_queues), in order: the queue itself, then the levels of `ladders` that may
/// hold messages scheduled for it (the ladder of its queue_schedule: topology::schedule_target),
/// longest first, then the set's unrouted queue.
std::vector<Source> scheduled_queue_sources(const std::string& queue,
                                            const std::vector<topology::Service>& ladders);

/// The ladder of `ladders` (those given to transfer_sources) that `routing_key`, read from the
/// level or unrouted queue `source`, was routed through; nullptr when none is (another queue's
/// message, which the transfer leaves where it is).
const topology::Service* ladder_of(const std::vector<topology::Service>& ladders,
                                   const Source& source, std::string_view routing_key);

/// The longest a message read from delay level `source` of `ladder` with `routing_key` may still
/// wait: the whole of that level and every shorter level its routing key passes through. A
/// message that says nothing of its due time waits this long on the new broker: never early, late
/// by at most what it had already waited in that level.
std::chrono::milliseconds level_wait_bound(const topology::Service& ladder, const Source& source,
                                           std::string_view routing_key);

/// The default precision of the levels the moved retries wait in on the new broker.
inline constexpr std::chrono::milliseconds default_precision{100};

/// The delay levels a moved retry waits out the rest of its delay in on the new broker: the
/// service's own (`retry.delay_levels`) when it has them; otherwise a schedule
/// (topology::Schedule, the machinery of `retryloop send`) whose base is `precision`, reaching
/// the service's longest wait delay, of the service's queue type, delivering to its queue.
/// nullopt when the service has its own levels, or no wait queue.
std::optional<topology::Schedule> transfer_schedule(const topology::Service& service,
                                                    std::chrono::milliseconds precision);

/// The service whose levels carry the moved retries (topology::delay_route takes it): the service
/// itself when it has delay levels, else topology::schedule_target of transfer_schedule.
topology::Service ladder_service(const topology::Service& service,
                                 std::chrono::milliseconds precision);

/// When a retry waiting in `source` is due back in `service_queue`, in milliseconds since the
/// epoch, from what it carries; nullopt when it carries nothing that says:
/// - `retryloop-retry-due` (a republished retry, or one transferred before): that time;
/// - in a delay level, `retryloop-due-at` (a scheduled message): that time;
/// - otherwise its `x-death` entry for `service_queue` with reason `rejected` (a reject-mode retry)
///   when that entry's count is 1: its `time` (whole seconds, so up to 1 s before the rejection)
///   plus 1 s plus the wait queue's delay, never before it is due. RabbitMQ keeps the `time` of
///   the first dead-lettering when it raises a count, so a later retry's entry says nothing of
///   when it entered the wait queue (measured on 3.10 and 4.3).
std::optional<int64_t> due_time(const amqp::BasicProperties& properties, const Source& source,
                                const std::string& service_queue);

/// Where a waiting retry goes on the new broker.
struct Placement {
  enum class Kind {
    service_queue,  ///< due already: straight to the service queue
    levels,         ///< through the levels, for `delay`
    leave,          ///< left to come due on the old broker (a transfer that follows moves it then)
  };
  Kind kind = Kind::service_queue;
  std::chrono::milliseconds delay{0};
  /// When it is due (ms since the epoch): known from the message, or the bound used for it.
  int64_t due_ms = 0;
  /// The due time came from the message; false: it waits its whole delay again from `now_ms`
  /// (never early, up to that delay late).
  bool due_known = true;
};

/// The placement of a retry due at `due_ms` (nullopt: not known) at `now_ms`. A retry whose due
/// time is not known waits `whole_delay` again on the new broker (a wait queue's delay, or
/// level_wait_bound); with `follow`, it is left where it is, to come due on the old broker,
/// whose service queue the transfer keeps moving.
Placement place(const std::optional<int64_t>& due_ms, std::chrono::milliseconds whole_delay,
                int64_t now_ms, bool follow);

/// The copy of a message read from `source` for the new broker. A retry (read from a wait queue,
/// or from the service queue with rejections recorded in `x-death`) becomes a republish-mode
/// retry: the death headers, which a RabbitMQ 4 broker would not count on, are replaced by
/// `retryloop-retries` = the attempts made so far, so that its next delivery is the attempt it
/// would have been on the old broker; the original exchange, routing key and first failure are
/// recorded; `retryloop-retry-due` is `due_ms` when above 0. A message read from a delay level or
/// a set's unrouted queue keeps its properties (its due time is in them) but the headers the old
/// broker's levels wrote (the death headers, and a quorum level's delivery counts). Anything else
/// (a parked message, a message never retried, a message in a scheduled queue no service
/// declares) keeps its properties as they are.
/// `delivery_exchange` and `delivery_routing_key` are those the message was delivered with.
amqp::BasicProperties transfer_copy(const amqp::BasicProperties& properties, const Source& source,
                                    const std::string& service_queue,
                                    const std::string& delivery_exchange,
                                    const std::string& delivery_routing_key, uint64_t now_seconds,
                                    int64_t due_ms);

}  // namespace retryloop::transfer
