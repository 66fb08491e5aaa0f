#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "retryloop/client/channel.hpp"
#include "retryloop/client/connection.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/migrate/migration.hpp"
#include "retryloop/migrate/plan.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::migrate {

/// What became of a survey: what the broker has of the service, or why it could not be read.
using SurveyCallback = std::function<void(const client::Error& error, const Survey& survey)>;

/// Looks at what the broker has of `service` against what its file wants (topology::verify of the
/// service's objects: passive look-ups, then declares with the file's arguments, which the broker
/// refuses naming the first argument that differs). `old_delays`: the delays the service's wait
/// queues had (the file it was applied from), to find the levels the file no longer has; those
/// that exist are `stale_wait_queues`. `connection` must be open; `done` fires once on the loop
/// thread, unless an error is returned.
client::Error survey(const std::shared_ptr<client::Connection>& connection,
                     const topology::Service& service,
                     const std::vector<std::chrono::milliseconds>& old_delays, SurveyCallback done);

/// What the mover reports of one move.
struct MoveResult {
  uint64_t moved = 0;
  /// Copies the broker refused (nacked, returned): their originals stay where they were.
  uint64_t failed = 0;
};
/// One move of a migration's messages.
struct MoveRequest {
  /// Every message of this queue is moved into `to`.
  std::string from;
  std::string to;
  /// Each copy is stamped (Migration's stamp header, "<stamp_prefix>:<n>"), a stamp already there
  /// kept.
  std::string stamp_prefix;
  /// A stamp seen twice is moved once.
  bool deduplicate = false;
  /// With `deduplicate`: the service whose copied log (CopiedLog) records the stamps copied
  /// before their originals are acked, and gives a rerun those an earlier run copied.
  std::string service;
};
/// Carries out `request`; `done` fires once. mover() is the move layer's (move::move_queue).
using MoveFunction = std::function<client::Error(
    const std::shared_ptr<client::Connection>& connection, const MoveRequest& request,
    std::function<void(const client::Error& error, const MoveResult& result)> done)>;

/// How far a move is: messages moved (or, deduplicated, left out) of the queue's depth at its
/// start.
using MoveProgress = std::function<void(uint64_t moved, uint64_t total)>;

/// The move layer's mover, as a MoveFunction; `progress` hears it as it goes.
MoveFunction mover(MoveProgress progress = {});

struct DriverOptions {
  /// The move layer's (mover()) unless set (tests put a failing one in its place).
  MoveFunction move;
  /// The delays the service had, to find the levels a new migration retires (see survey).
  std::vector<std::chrono::milliseconds> old_delays;
  /// How long a drain of the service queue waits for its consumers to leave before the driver
  /// says which consumers hold it (they do not follow the migration).
  std::chrono::milliseconds consumers_grace = std::chrono::seconds(60);
  /// How long the driver waits for the service's lock when another connection holds it (a run
  /// that has just ended frees it once the broker has seen its connection close).
  std::chrono::milliseconds lock_wait = std::chrono::seconds(5);
  /// A new migration's id (random when empty).
  std::string id;
};

/// What the driver tells as it goes, on the loop thread.
struct DriverEvents {
  /// The migration to run: a new plan, or an unfinished one resumed from its record.
  std::function<void(const Migration& migration, bool resumed)> planned;
  std::function<void(const Migration& migration, const Step& step)> step_started;
  /// The step is done and recorded.
  std::function<void(const Migration& migration, const Step& step)> step_done;
  /// A drain waits (once per look): how long it has waited, the messages and consumers found.
  std::function<void(const Migration& migration, const Step& step, uint64_t messages,
                     uint32_t consumers)>
      waiting;
  /// A move is done: the messages it moved.
  std::function<void(const Migration& migration, const Step& step, uint64_t moved)> moved;
  /// A move under way (the move layer's, when DriverOptions::move is not set): messages moved of
  /// the queue's depth at its start, as each is.
  std::function<void(const Migration& migration, const Step& step, uint64_t moved, uint64_t total)>
      moving;
};

/// How the run ended: `error` is empty when every step is done. `refused`: the plan refused a
/// change (nothing was done). `migration` is what ran (empty plan when nothing differed).
using DriverDone =
    std::function<void(const client::Error& error, const Migration* migration, bool refused)>;

/// Runs a service's migration on the broker (docs/migrate.md): takes the service's lock (an
/// exclusive queue, so a second run is refused), reads its record and goes on with an unfinished
/// migration, or surveys the broker and starts a new one; runs each step, and publishes the record
/// after each (confirmed) through the exchange `N.migration` to the record queue of the same name
/// and to the instances that listen. A killed run leaves the record, and a rerun finishes it.
class Driver : public std::enable_shared_from_this<Driver> {
 public:
  static std::shared_ptr<Driver> start(const std::shared_ptr<client::Connection>& connection,
                                       topology::Service service, DriverOptions options,
                                       DriverEvents events, DriverDone done);
  /// Stops after the current step (a move stops reading; what is in flight settles).
  virtual void stop() = 0;
  virtual ~Driver() = default;

 protected:
  Driver() = default;
};

/// Declares the fanout exchange `N.migration` through which a migration tells each step: the
/// migrator, and each instance that follows, binding a queue of its own to it. `done` fires once
/// unless an error is returned.
client::Error declare_record_exchange(const std::shared_ptr<client::Channel>& channel,
                                      const std::string& service_name,
                                      client::CompletionCallback done);

/// Declares the objects that carry a service's migration record (the migrator's): the exchange
/// (declare_record_exchange) and the queue of the same name bound to it, which keeps one message,
/// the newest. `done` fires once unless an error is returned.
client::Error declare_record_objects(const std::shared_ptr<client::Channel>& channel,
                                     const std::string& service_name,
                                     client::CompletionCallback done);

/// Reads a service's migration record without taking it (nullopt: none), for the migrator, the
/// instances, `topology verify` and `service status`. An empty read is read again after 50, 100
/// and 200 ms, since another reader holds the message for a round trip. `done` fires once on the
/// loop thread unless an error is returned.
using RecordCallback =
    std::function<void(const client::Error& error, const std::optional<Record>& record)>;
client::Error read_record(const std::shared_ptr<client::Connection>& connection,
                          const std::string& service_name, RecordCallback done);

}  // namespace retryloop::migrate
