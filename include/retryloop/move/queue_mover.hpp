#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/move/queue_walker.hpp"

namespace retryloop::move {

struct MoveOptions {
  /// The queue whose messages are moved.
  std::string from;
  /// Where the copies go; "" with routing_key = a queue's name: that queue.
  std::string exchange;
  std::string routing_key;
  /// Copies awaiting their confirms at once (and the prefetch).
  uint16_t window = 500;
  /// Non-empty: each copy carries the header `stamp_header` with "<stamp_prefix>:<n>" (a long
  /// string; n counts this move's copies from 1), unless the message already carries that
  /// header, which is kept as it is (a message moved twice keeps its first stamp). Give each
  /// move a prefix of its own (a run's id), so that no new stamp is one a message already has.
  std::string stamp_header;
  std::string stamp_prefix;
  /// Non-empty: a message with a message id gets "<stable_prefix>:<stable_stamp>" instead (see
  /// stable_stamp), the same stamp in every run of the move, so that a copy a killed run made
  /// and the rerun's copy of the same original carry one stamp and a later move with
  /// `deduplicate` keeps one of them. Give each move the same prefix in every run (the queue's
  /// and its migration's, say), and a prefix of its own per run to `stamp_prefix`.
  std::string stable_prefix;
  /// A message whose stamp (a string) this move has already copied (a duplicate left by a
  /// killed earlier move) is acked without a copy, counted in Progress::duplicates; so is a
  /// message without a stamp whose stable stamp this move has copied. Needs `stamp_header`.
  bool deduplicate = false;
  /// With `deduplicate`: stamps copied by an earlier run (read back from what its `copied`
  /// recorded), taken as copied by this move.
  std::vector<std::string> copied_before;
  /// Told the stamps of the copies made, once confirmed, before their originals are acked
  /// (WalkOptions::record_moved): a record that a rerun reads back into `copied_before`.
  std::function<void(std::vector<std::string> stamps,
                     std::function<void(const client::Error& error)> recorded)>
      copied;
  /// WalkOptions::done_before_grace: for a queue deleted after the move.
  bool done_before_grace = false;
  /// Told after each message read and each copy settled.
  std::function<void(const Progress&)> on_progress;
};

/// Told once how a move ended: the error it ended on (empty: it read what it was to read), its
/// progress, and whether the walker's stop() ended it.
using MoveCallback =
    std::function<void(const client::Error& error, const Progress& progress, bool interrupted)>;

/// Moves the messages of `from` (up to the depth it had when it started, as replay reads) into
/// the target: each copy published mandatory with confirms, its original acked only once the copy
/// is confirmed and not returned; a returned or nacked copy leaves its original in `from`,
/// counted in Progress::failed. Body and properties pass unchanged except the stamp header: the
/// broker's headers too (x-death, x-first-death-*, x-last-death-*, x-delivery-count), byte for
/// byte, where a replay starts a message afresh. A message whose properties this client could not
/// decode, or whose stamped copy needs a header frame over frame_max, stays in `from`, counted
/// failed. Order is kept: the copies are published in queue order, and a message that stays
/// keeps its place. A crash between a copy's confirm and its original's ack leaves both (at most
/// `window` of them), and a move run again copies the original again: when it carried its stamp
/// already, or has a message id and the move `stable_prefix`, both copies carry one stamp, and a
/// later move with `deduplicate` keeps the first.
///
/// An exchange that does not exist makes the broker close the channel: the move ends with that
/// error. Returns an error (and never calls done) when it cannot start: no open connection, no
/// `from`, a `stamp_header` that is not a header name (1 to 255 bytes), or `deduplicate`
/// without one. Otherwise done is called once on the loop thread. `handle`, when given, gets the
/// walker, whose stop() ends the move after what is in flight has settled.
client::Error move_queue(const std::shared_ptr<client::Connection>& connection, MoveOptions options,
                         MoveCallback done, std::shared_ptr<QueueWalker>* handle = nullptr);

}  // namespace retryloop::move
