#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::schedule {

/// One level queue of the schedule's set.
struct LevelDepth {
  int level = 0;
  std::string queue;
  /// How long the level holds a message: base * 2^level.
  std::chrono::milliseconds holds{0};
  uint64_t messages = 0;
  /// `retryloop-due-at` of the message at the level's head, when read (ScheduleStats::heads_read)
  /// and it has one (a service's retry carries `retryloop-retry-due` instead, also read).
  std::optional<int64_t> head_due_at_ms;
};

/// What the schedule's delay levels hold now.
struct ScheduleStats {
  /// The set's name, `retryloop.delay.<base>[.quorum]`.
  std::string set;
  /// Level 0 first.
  std::vector<LevelDepth> levels;
  /// Messages in all levels together: scheduled messages and the retries of services that share
  /// the set.
  uint64_t waiting = 0;
  /// Messages whose queue was gone when they were due: they wait in `<set>.unrouted`.
  uint64_t unrouted = 0;
  /// Whether the heads of the non-empty levels were read: asked for, and the levels are classic
  /// queues (quorum levels are never read, see stats()).
  bool heads_read = false;
  /// The earliest due time among the levels' heads: the next arrival is at most this far off
  /// unless a message behind a head is due sooner (each level is first in, first out by the
  /// time it leaves the level, not by its due time).
  std::optional<int64_t> earliest_head_due_at_ms;
  /// Each scheduled queue and the messages ready in it.
  std::vector<std::pair<std::string, uint64_t>> queues;
  /// Scheduled queues the broker would not count for this user (RabbitMQ 4.3 refuses a passive
  /// declare without permission on the queue), with the broker's reply.
  std::vector<std::pair<std::string, std::string>> queues_not_counted;
};

using StatsCallback = std::function<void(const client::Error& error, const ScheduleStats& stats)>;

/// Counts the schedule's level queues, its unrouted queue and its scheduled queues, on a channel
/// of its own. With `peek_heads` and classic levels, reads the message at the head of each
/// non-empty level (basic.get, then basic.nack with requeue): it stays where it was and keeps its
/// expiry. Quorum levels are only counted, never read: every message handed back to a quorum
/// queue may count toward its delivery limit (RabbitMQ 3.10 and 4.0 count each nack, every version
/// counts a channel that closes first), and a message past it would leave its level early. A
/// level queue that does not exist ends the call with its error (the topology is not applied).
/// Loop thread; `done` is called once, unless the call returns an error at once.
client::Error stats(const std::shared_ptr<client::Connection>& connection,
                    const topology::Schedule& schedule, bool peek_heads, StatsCallback done);

}  // namespace retryloop::schedule
