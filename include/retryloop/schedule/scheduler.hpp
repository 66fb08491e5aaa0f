#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "retryloop/amqp/properties.hpp"
#include "retryloop/client/channel.hpp"
#include "retryloop/client/publish.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::schedule {

// Scheduled delivery: a message handed to a queue after a delay or at a time, without a broker
// plugin. It waits in the topology's delay levels (topology/delay_levels.hpp): any delay up to
// the levels' maximum, to a whole number of their base, never less than asked, in at most as many
// queues as there are levels, and no message waits behind a longer one. docs/scheduling.md.

namespace header {
/// When the message was scheduled: milliseconds since the Unix epoch (int64).
inline constexpr std::string_view scheduled_at = "retryloop-scheduled-at";
/// When it is due in its queue: milliseconds since the Unix epoch (int64). It arrives then or
/// later (the broker's lateness: milliseconds per level it passes).
inline constexpr std::string_view due_at = "retryloop-due-at";
}  // namespace header

/// A scheduled message's route and properties, as make_scheduled_copy() builds them.
struct ScheduledCopy {
  /// Where to publish: a level's exchange, or for a delay that rounds to zero the queue itself
  /// through the default exchange (so that a missing queue is returned, not kept).
  std::string exchange;
  std::string routing_key;
  amqp::BasicProperties properties;
  /// The wait it gets: the request rounded up to the base.
  std::chrono::milliseconds delay{0};
  int64_t scheduled_at_ms = 0;
  int64_t due_at_ms = 0;
};

/// The copy that schedules a message for `queue` in `delay` (negative counts as zero) from
/// `now_ms`: its properties with the two schedule headers set, the broker's death headers
/// (`x-death`, `x-first-death-*`, `x-last-death-*`, which belong to the queues it came from)
/// removed, and an `expiration` moved to `retryloop-original-expiration` (a per-message TTL
/// would cut its wait short, so that it arrived early). Throws std::invalid_argument when
/// `queue` is not one of the schedule's queues, naming them, and when `delay` is longer than the
/// levels' maximum: a scheduled message is never cut short (a retry is, see
/// topology::delay_route), so it would arrive early.
ScheduledCopy make_scheduled_copy(const topology::Schedule& schedule, const std::string& queue,
                                  const amqp::BasicProperties& properties,
                                  std::chrono::milliseconds delay, int64_t now_ms);

/// The longest delay the schedule's levels wait: DelayLevels::max, or all the levels spell.
std::chrono::milliseconds longest_schedule_delay(const topology::Schedule& schedule);

/// How a schedule call ended.
struct ScheduleResult {
  /// `acked`: the broker holds the message (confirmed); otherwise it does not (see
  /// client::PublishOutcome: returned, nacked, or failed with the outcome unknown).
  client::PublishOutcome publish;
  std::string message_id;
  std::chrono::milliseconds delay{0};
  int64_t due_at_ms = 0;
  bool ok() const { return publish.ok(); }
};
using ScheduleCallback = std::function<void(const ScheduleResult& result)>;

/// Schedules messages on one channel: each is published with `mandatory` and confirmed, so that
/// ScheduleResult::ok() means the broker holds it. The channel must be in confirm mode, and the
/// topology's schedule applied (`retryloop topology apply`). Loop thread only, like the channel.
///
/// A message whose queue is gone when it is due waits in the set's `.unrouted` queue, never lost
/// (`retryloop schedule stats` counts it).
class Scheduler {
 public:
  Scheduler(client::Channel& channel, topology::Schedule schedule);

  /// Schedules `body` with `properties` for `queue` in `delay`. A message without a message-id
  /// gets a random one (32 hex digits), which the result names and a cancel uses. Returns an
  /// error at once (and never calls `done`) for a queue the schedule does not name, a delay
  /// longer than the levels' maximum, or a channel that cannot publish; otherwise `done` is
  /// called once.
  client::Error schedule_in(const std::string& queue, amqp::BasicProperties properties,
                            std::string_view body, std::chrono::milliseconds delay,
                            ScheduleCallback done);
  /// As schedule_in, due at `at` (a time in the past is due at once).
  client::Error schedule_at(const std::string& queue, amqp::BasicProperties properties,
                            std::string_view body, std::chrono::system_clock::time_point at,
                            ScheduleCallback done);

  const topology::Schedule& schedule() const { return schedule_; }

 private:
  client::Channel& channel_;
  topology::Schedule schedule_;
};

/// Milliseconds since the Unix epoch.
int64_t now_ms();

}  // namespace retryloop::schedule
