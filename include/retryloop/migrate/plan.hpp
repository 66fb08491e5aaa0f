#pragma once

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::migrate {

/// What a look-up of one object found on the broker: missing, there with the file's arguments, or
/// there with others (a declare with the file's arguments was refused, 406).
enum class Found { missing, matches, differs };

/// One object of the service as the broker has it.
struct ObjectFound {
  std::string name;
  Found found = Found::missing;
  /// differs: the first argument the broker named (it compares one at a time), "x-queue-type" say.
  std::string argument;
  /// Queues: messages ready, and consumers, when looked up.
  uint64_t messages = 0;
  uint32_t consumers = 0;
};

/// What the broker has of one service, against what its file wants (docs/migrate.md): the driver
/// fills it from passive look-ups and comparing declares, before the first step. A migration
/// records it, so that a rerun after a kill carries out the same plan whatever it finds by then.
struct Survey {
  /// The exchanges the file declares for the service: its input exchange (unless "declare":
  /// false), the wait exchange and the parking exchange.
  std::vector<ObjectFound> exchanges;
  ObjectFound service_queue;
  /// The file's wait queues, one per delay level.
  std::vector<ObjectFound> wait_queues;
  /// Wait queues of the service that the file no longer has (named N.wait.<delay>), found by the
  /// management API or named by the file the service was applied from.
  std::vector<ObjectFound> stale_wait_queues;
  ObjectFound parking_queue;
};

nlohmann::json to_json(const Survey& survey);
/// nullopt, with `error` naming what is wrong, for JSON that is not a survey.
std::optional<Survey> survey_from_json(const nlohmann::json& json, std::string& error);

/// The holding queue that stands in for `queue` while it is made again: `<queue>.migrating`.
std::string holding_queue_name(const std::string& queue);

enum class StepKind {
  /// queue.declare `action` (a holding queue, or an object made again with the file's arguments).
  declare_queue,
  /// queue.bind as `action` says.
  bind_queue,
  /// queue.unbind of `action`'s binding: the queue no longer receives what it routed.
  unbind_queue,
  /// queue.bind as `action` says, then at once queue.unbind of the same binding from `target`:
  /// the binding passes from `target` to `action`'s queue. A publish in the round trip between
  /// the two reaches both queues (a duplicate, never a loss); nothing else comes between them.
  move_binding,
  /// Tells the service's instances (the record, published after the step) to consume `queue` (a
  /// holding queue) beside the service queue `target`, or, with `queue` empty, `target` alone
  /// again.
  announce,
  /// The mover: every message of `queue` into `target`, published with confirms in a window, each
  /// stamped with the migration's id, each original acked once its copy is confirmed.
  move,
  /// Waits until `queue` is empty and has no consumer: a wait queue no longer bound, whose messages
  /// go back to the service at their due times (at most `delay` after it was unbound), or a
  /// service queue whose instances are settling what they took from it.
  drain,
  /// queue.delete `queue`, once it is empty and has no consumer (never with messages in it).
  delete_queue,
};

const char* to_string(StepKind kind);

/// One step of a migration. Each can be run again after a kill with the same effect.
struct Step {
  StepKind kind = StepKind::declare_queue;
  /// declare_queue, bind_queue, unbind_queue, move_binding: the broker operation, as `topology
  /// apply` sends it.
  topology::Action action;
  /// announce, move, drain, delete_queue: the queue.
  std::string queue;
  /// move: the queue the messages go to (through the default exchange); announce: the service
  /// queue; move_binding: the queue the binding is taken from.
  std::string target;
  /// drain of a wait queue: its delay, the longest its messages still wait.
  std::chrono::milliseconds delay{0};
  /// delete_queue: the queue is, or may be, a quorum queue, which RabbitMQ deletes only without
  /// if-empty and if-unused (it refuses them, closing the connection): the driver relies on the
  /// look-up it makes just before.
  bool quorum = false;
  /// For people: "the service queue becomes quorum", "delay level 30s is removed".
  std::string why;
};

/// A change the migration does not make, and what to do instead.
struct Refusal {
  std::string object;
  std::string reason;
  std::string manual_steps;
};

struct MigrationPlan {
  std::string service;
  std::vector<Step> steps;
  std::vector<Refusal> refused;
  /// Messages the movers are expected to move (those waiting at the survey, each queue's counted
  /// once per move it takes part in).
  uint64_t messages_to_move = 0;
  /// How long the drains of wait queues take at most, one after another: each waits out its
  /// level's delay, when it held messages at the survey or the service queue had consumers then
  /// (running instances, whose retries may reach it meanwhile); otherwise it is empty at once.
  std::chrono::milliseconds drain_time{0};

  bool empty() const { return steps.empty(); }
};

/// The steps that bring the broker's objects of `service` (as `survey` found them) to what the
/// file wants, with the service handling throughout (docs/migrate.md, "How a queue is made
/// again"). Pure: no broker, no clock. A survey in which nothing differs gives an empty plan; an
/// object it cannot change safely (an exchange with other arguments) is refused, and so is the
/// whole plan then.
MigrationPlan make_migration_plan(const topology::Service& service, const Survey& survey);

/// "declare queue orders.migrating (quorum)", "move orders -> orders.migrating (300 messages)".
std::string describe(const Step& step);
/// The plan as JSON (`topology migrate --dry-run --json`).
nlohmann::json to_json(const MigrationPlan& plan);
/// A digest of what the plan does (its steps' kinds, objects and arguments), to tell whether a
/// rerun carries out the migration a record was made for.
std::string digest(const MigrationPlan& plan);

/// How long the plan should take with the movers at `messages_per_second`, counting the drains of
/// wait queues at their longest.
std::chrono::milliseconds estimate(const MigrationPlan& plan, double messages_per_second);

}  // namespace retryloop::migrate
