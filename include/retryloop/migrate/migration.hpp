#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "retryloop/migrate/plan.hpp"

namespace retryloop::migrate {

/// The queue that holds a service's migration record (one message, the newest): `N.migration`.
std::string record_queue_name(std::string_view service_name);
/// The exclusive queue a running migration holds, so that a second one of the same service is
/// refused (405 RESOURCE_LOCKED) and a killed one releases it: `N.migration.lock`.
std::string lock_queue_name(std::string_view service_name);
/// The queue an instance that leaves a queue it consumed (following an announce) consumes until
/// every delivery it took from it is settled: `N.migration.settling`. Nothing is published to it;
/// its consumers tell the migration that deliveries are still out, so that a queue is deleted
/// only once none is (a drain waits until it has no consumer).
std::string settling_queue_name(std::string_view service_name);
/// The header the mover stamps each moved message with: `<migration id>:id-<digest>` for
/// a message with a message id (move::stable_stamp), `<migration id>/<queue>/<run>:<sequence>` for
/// one without. A message with an id moved twice (a kill between its copy's confirm and its
/// original's ack, and a rerun) carries one stamp in both copies, and the move back keeps only
/// the first.
inline constexpr std::string_view stamp_header = "retryloop-migration";

/// A migration's progress, kept on the broker after every step (docs/migrate.md, "Resuming"): a
/// rerun reads it and goes on from the first step not recorded as done, with the plan the record
/// was made for (its survey, and the file the rerun is given).
struct Record {
  std::string service;
  /// Random, made when the migration began: the stamps' prefix.
  std::string id;
  /// digest() of the plan.
  std::string digest;
  Survey survey;
  /// The steps before it are done.
  size_t next_step = 0;
  int64_t started_at_ms = 0;
  int64_t updated_at_ms = 0;
  /// Messages the movers have moved so far.
  uint64_t moved = 0;
  /// The holding queue the service's instances consume beside the service queue while it is made
  /// again (from its first announce step to its second); empty otherwise. Instances that hear the
  /// record, or read it when they start, follow it.
  std::string holding;
  /// A drain under way: since when (wall clock) its queue has been waited for.
  std::optional<int64_t> draining_since_ms;
  /// Every step is done.
  bool finished = false;
};

std::string encode_record(const Record& record);
/// nullopt, with `error` naming what is wrong, for a body that is not a record.
std::optional<Record> decode_record(std::string_view body, std::string& error);

/// The migration's state machine: which step runs next, when a drain looks again, what is
/// recorded. No I/O and no clock: the driver (the `topology migrate` command) runs the steps on
/// the broker, records the record after each, and passes the time in (`now`: monotonic, for
/// timers; `wall_ms`: the wall clock, for the record).
class Migration {
 public:
  /// A new migration of `plan`, made from `survey`: `id` stamps what it moves.
  Migration(MigrationPlan plan, std::string id, Survey survey, int64_t wall_ms);
  /// Goes on with a recorded migration. nullopt, with `error` saying why, when the record is of
  /// another plan (another file, another survey) or another service.
  static std::optional<Migration> resume(MigrationPlan plan, Record record, std::string& error);

  /// The step to run, or nullptr when every step is done.
  const Step* current() const;
  size_t current_index() const { return record_.next_step; }
  /// When to run the current step (a drain that found its queue busy looks again later);
  /// nullopt: now.
  std::optional<std::chrono::milliseconds> wake_at() const { return wake_at_; }
  /// The current step is done: the next becomes current. Record the record before running it.
  void done(int64_t wall_ms);
  /// A drain found its queue not empty yet (or with consumers): it looks again after a while
  /// (a tenth of its delay, between 100 ms and 1 s).
  void not_yet(std::chrono::milliseconds now, int64_t wall_ms);
  /// A move moved `messages` more.
  void moved(uint64_t messages) { record_.moved += messages; }
  /// How long the current drain has waited; 0 when it is not a drain under way.
  std::chrono::milliseconds draining_for(int64_t wall_ms) const;
  /// Whether the current drain has waited well past what it should: a wait queue longer than its
  /// delay and 10 s (something else still routes to it), the service queue longer than
  /// `consumers_grace` (an instance that does not follow the migration still consumes it).
  bool overdue(int64_t wall_ms, std::chrono::milliseconds consumers_grace) const;

  const Record& record() const { return record_; }
  const MigrationPlan& plan() const { return plan_; }

 private:
  Migration(MigrationPlan plan, Record record);

  MigrationPlan plan_;
  Record record_;
  std::optional<std::chrono::milliseconds> wake_at_;
};

}  // namespace retryloop::migrate
