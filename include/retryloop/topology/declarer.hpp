#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/topology/plan.hpp"

namespace retryloop::topology {

/// What became of one action.
enum class Outcome {
  created,       ///< apply: it did not exist and was declared
  existed,       ///< apply: it existed with the file's arguments (nothing changed)
  bound,         ///< apply: binding declared (idempotent; AMQP cannot tell whether it was new)
  matches,       ///< verify: it exists with the file's arguments
  exists,        ///< verify: it exists; its arguments were not compared (a "declare": false
                 ///< exchange, or VerifyOptions::compare_arguments is false)
  not_checked,   ///< verify: a binding; AMQP 0-9-1 cannot check one without creating it
  missing,       ///< verify: it does not exist; apply: a "declare": false exchange is missing
  drifted,       ///< it exists with other arguments (406 PRECONDITION_FAILED); see `drift`
  failed,        ///< the broker refused it for another reason (403, 404, 405, ...); see `error`
  not_run,       ///< the connection failed before this action ran
  deleted,       ///< delete: removed
  absent,        ///< delete: it was not there
  would_delete,  ///< delete without `execute`: it exists and would be removed
  not_empty,     ///< delete: refused, the queue holds messages (and `force` was not given)
  in_use,        ///< delete: refused, the queue has consumers (and `force` was not given)
  kept,          ///< delete: not removed because the run refused or stopped earlier
};

/// The outcome's name as in the enum ("created", "not_checked", ...), used in JSON reports.
const char* to_string(Outcome outcome);

/// An argument the broker holds with another value than the file wants.
struct Drift {
  /// As RabbitMQ names it: `x-message-ttl`, `alternate-exchange`, `durable`, `type`, ...
  std::string argument;
  /// What the file wants; "(not set)" when the file does not set it.
  std::string wanted;
  /// What the broker has; "(not set)" when the broker's object lacks it.
  std::string actual;
};

/// Parses RabbitMQ's 406 text, "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue
/// 'q' in vhost '/': received '5000' but current is '3000'" (and the "none" / "the value 'v' of
/// type 't'" forms). nullopt for any other text.
std::optional<Drift> parse_inequivalent_arg(std::string_view reply_text);

struct ActionResult {
  Action action;
  Outcome outcome = Outcome::not_run;
  /// For `drifted`.
  std::optional<Drift> drift;
  /// For drifted, missing, failed, not_empty: the broker's answer.
  client::Error error;
  /// Exchanges and queues: what the passive lookup found (nullopt when none was made, as for
  /// bindings, or when the lookup itself failed). A `failed` object with `exists` true was found
  /// and refused afterwards: in verify, by the declare that compares its arguments (403 when the
  /// user lacks configure permission).
  std::optional<bool> exists;
  /// Queues, when the broker reported them (declare-ok): messages ready and consumers.
  std::optional<uint32_t> messages;
  std::optional<uint32_t> consumers;
  /// apply and verify: default arguments (Action::defaults) that the existing object was declared
  /// without (`actual` "(not set)"). It is used as it is: the outcome does not count them.
  std::vector<Drift> defaults_missing;
  /// apply and verify: a wait queue that exists in the form older releases declared
  /// (Action::older_arguments). It works, but a retry whose Q is gone when its delay ends is
  /// dropped. The outcome does not count it (docs/topology.md, "Older queues").
  bool older_form = false;
};

struct Report {
  /// One per action, in plan order.
  std::vector<ActionResult> results;
  /// Set when the connection (not a channel) failed; the actions after it are `not_run`.
  client::Error connection_error;

  /// True when nothing is missing, drifted, failed, refused or left unrun.
  bool ok() const;
  size_t count(Outcome outcome) const;
};

/// Told once, on the loop thread, when the whole plan has been gone through.
using ReportCallback = std::function<void(const Report&)>;

// The three runners below share these rules. `connection` must be open; it stays owned by the
// caller and is not closed. Each runner opens its own channel and, when the broker closes it
// (404, 406, ...), opens another and goes on with the next action, so that one failure does not
// hide the later ones. Nothing is ever deleted or redeclared differently to "fix" a difference.
// Returns an error (and never calls `callback`) when it cannot start: the connection is not
// open. Otherwise `callback` is called exactly once, from a client callback on the loop thread.

/// Declares every action of a declare plan. Each exchange and queue is first looked up with a
/// passive declare (so the report can say `created` or `existed`), then declared with the plan's
/// arguments; a difference is `drifted`, with the argument named. The plan's lanes
/// (split_into_lanes) run on up to four channels at once, after the shared objects: every object
/// is still declared after the objects it names.
/// Why `action` cannot work on a broker of `version`, which would store an argument it does not
/// know and ignore it: `x-delayed-retry-type` (the in_queue retry mode) before RabbitMQ 4.3,
/// whose retries would then come back at once. Empty when it can, or when the version is unknown.
/// apply and verify report such an action as failed without sending it.
std::string unsupported_by_broker(const Action& action,
                                  const std::optional<client::BrokerVersion>& version);

client::Error apply(const std::shared_ptr<client::Connection>& connection, const Plan& plan,
                    ReportCallback callback);

struct VerifyOptions {
  /// true: compare the arguments of every existing object by declaring it with the plan's
  /// arguments (see verify). false: only look objects up with a passive declare, which never
  /// creates anything and needs no configure permission, but cannot see drift (`exists`).
  bool compare_arguments = true;
};

/// Checks a declare plan against the broker. Every exchange and queue is looked up with a passive
/// declare: a missing one is `missing` and nothing else is sent for it. An existing one is then,
/// with `compare_arguments`, declared with the plan's arguments: the broker compares them with its
/// own, so this is a no-op when they are equal and a 406 naming the first differing argument
/// (`drifted`) when not. Bindings are `not_checked`: AMQP 0-9-1 has no passive bind. Lanes run
/// at once, as in apply.
///
/// The trade-off of comparing by declaring, which is the only way AMQP 0-9-1 offers: (1) an object
/// that someone deletes between the lookup and the comparing declare (one round trip) is created
/// again, with exactly the plan's arguments; (2) the comparing declare needs configure permission
/// on the object, so a read-only user gets `failed` (403) for every existing object. Set
/// `compare_arguments` to false where neither is acceptable.
client::Error verify(const std::shared_ptr<client::Connection>& connection, const Plan& plan,
                     ReportCallback callback, VerifyOptions options = {});

struct DeleteOptions {
  /// false: delete nothing, report what would be deleted (`would_delete`, `absent`, `not_empty`).
  bool execute = false;
  /// Delete queues that hold messages, losing the messages.
  bool force = false;
};

/// Runs a delete plan (make_delete_plan). First every object is looked up; if a queue holds
/// messages or has consumers and `force` is not set, nothing is deleted (that queue is
/// `not_empty` or `in_use`, the rest `kept`). Otherwise objects are deleted in plan order, classic
/// queues with if-empty and if-unused unless `force` (so a message that arrives meanwhile is not
/// lost; RabbitMQ does not offer these for quorum queues, which rely on the lookup alone); the
/// first failure stops the run and leaves the rest `kept`.
client::Error remove(const std::shared_ptr<client::Connection>& connection, const Plan& plan,
                     DeleteOptions options, ReportCallback callback);

}  // namespace retryloop::topology
