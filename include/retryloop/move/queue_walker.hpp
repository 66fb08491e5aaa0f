#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "retryloop/amqp/properties.hpp"
#include "retryloop/client/connection.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/client/message.hpp"

namespace retryloop::move {

/// Progress of a walk, reported as it goes. The walker counts `total`, `scanned`, `moved`,
/// `failed` and `uncertain`; the operation built on it counts the rest (and may count `moved`
/// its own way: a dry run counts what would move).
struct Progress {
  /// The queue's depth at the start: the most messages the walk reads.
  uint64_t total = 0;
  uint64_t scanned = 0;
  /// Copies confirmed and their originals acked, and messages removed (acked without a copy).
  uint64_t moved = 0;
  /// Messages the operation did not take (a filter, a limit): they stay in the queue.
  uint64_t skipped = 0;
  /// Copies returned or nacked by the broker: their originals stay in the queue.
  uint64_t failed = 0;
  /// Copies published whose originals stay because the channel or connection ended before
  /// the broker's confirm, or before the original's ack: each may be in the target as well.
  uint64_t uncertain = 0;
  /// Messages acked without a copy because the move had already copied one with their stamp
  /// (move_queue with MoveOptions::deduplicate).
  uint64_t duplicates = 0;
};
using ProgressHandler = std::function<void(const Progress& progress)>;

/// One message as the walk read it.
struct WalkedMessage {
  /// Its 0-based place in the queue when it was read: the messages read before it in this walk.
  uint64_t index = 0;
  /// The delivery as it arrived, properties decoded. The visitor may take what it needs from it
  /// (moving the message out); for a move or copy without Decision::body, the walker publishes
  /// `delivery.message.body` as the visitor leaves it.
  client::Delivery delivery;
};

/// What to do with one message.
struct Decision {
  enum class Kind {
    keep,    ///< leave it in the queue, in its place
    remove,  ///< ack it: it is deleted
    move,    ///< publish `properties` + its body to `exchange`/`routing_key`, ack after the confirm
    copy,    ///< publish as `move` does, and keep the original in the queue
  };
  Kind kind = Kind::keep;
  std::string exchange;
  std::string routing_key;
  amqp::BasicProperties properties;
  /// The body to publish instead of the message's own.
  std::optional<std::string> body;
  /// Read no further message after this one.
  bool stop_after = false;
  /// A move's name for its copy, told to WalkOptions::record_moved (a stamp, say).
  std::string key;
  /// A move whose copy's properties need a header frame over frame_max drops the oldest entries
  /// of its `retryloop-history` (retry::shorten_history) until it fits; false: it stays in the
  /// queue at once, counted as failed, its properties never changed.
  bool shorten_history_to_fit = true;
};

/// What a walk reads and how it words the errors of a queue it cannot look up.
struct WalkOptions {
  /// The queue to walk.
  std::string queue;
  /// Messages read per round (the prefetch), and copies awaiting their confirms at once.
  uint16_t window = 500;
  /// Told after each message read and each copy settled.
  ProgressHandler on_progress;
  /// Added to the error of a queue that does not exist, after "queue NAME does not exist" (for
  /// example " (run `retryloop topology apply`)").
  std::string missing_hint;
  /// Who needs the read permission, in the note added to a refused look-up: "read, which
  /// READERS need, is enough".
  std::string readers = "its reads";
  /// Where copies are published: a connection to another broker (a transfer), on a confirm
  /// channel of the walk's own; none: the walk's reading channel. A copy is confirmed there
  /// before its original is acked here.
  std::shared_ptr<client::Connection> publish_connection;
  /// How many answers of 0, one tick (250 ms) apart, the first count takes before the walk ends
  /// on an empty queue: RabbitMQ answers 0 for a quorum queue whose leader it cannot reach. Above
  /// 1, the first answer of 0 is checked at once with a basic.get, whose "empty" is the queue's
  /// own and ends the walk; a message it finds goes back to the queue (redelivered; before
  /// RabbitMQ 4.3, a quorum queue counts that as a delivery) and the answers are counted. 1
  /// suits a caller that reads the queue again soon anyway (a transfer's --follow).
  int empty_answers = 5;
  /// For a queue that is deleted after the walk (a migration's moves): `done` fires once the last
  /// copies are confirmed and their originals acked and the consumer is cancelled, when no
  /// message is held, before the grace the walk otherwise waits after its last ack before it
  /// closes its channel (RabbitMQ can drop acks that the close overtakes, leaving the originals
  /// in the queue as well: src/move/queue_walker_impl.hpp); the channel closes after the grace.
  /// A caller that closes the connection, or exits, before then may leave such originals behind.
  bool done_before_grace = false;
  /// Records what is moved before the originals are acked: told the keys (Decision::key) of
  /// moves whose copies are confirmed, one call at a time (the keys confirmed meanwhile come in
  /// the next); their originals are acked once it answers without an error (with one, they stay
  /// in the queue, counted uncertain, and the walk ends with it). Until then they count against
  /// the window, so that a kill leaves at most `window` originals whose copies the record lacks.
  /// An ack that the broker drops (RabbitMQ can, when the channel's close overtakes it) or that
  /// a kill cuts short is then of a message the record has: a caller that reads the record back
  /// tells such originals from messages still to move.
  std::function<void(std::vector<std::string> keys,
                     std::function<void(const client::Error& error)> recorded)>
      record_moved;
};

/// Reads a queue once, from its head to the depth it had at the start, and carries out the
/// visitor's decision for each message, in queue order. Messages it does not take stay in their
/// place: they are held unacked until the walk ends and go back when its channels close (the
/// broker marks them redelivered; a quorum queue also counts a delivery for each). Copies are
/// published with confirms and mandatory, and a moved original is acked only once its copy is
/// confirmed and not returned (retry::move_delivery); at most `window` copies await their
/// confirms at once. `done` fires once the queue counts the held messages back, so that a read
/// that follows sees them. How it does so, and why (held messages spread over channels, the
/// consumer restarted, a grace before the close, the returns waited for), is told in
/// src/move/queue_walker_impl.hpp.
///
/// A queue that does not exist ends the walk with MoveError::queue_missing. All calls and
/// callbacks happen on the connection's loop thread; the connection is left open.
class QueueWalker {
 public:
  using Visitor = std::function<Decision(WalkedMessage& message)>;
  /// Called once: the error the walk ended on (empty: it read what it was to read), its
  /// progress, and whether stop() ended it.
  using DoneCallback =
      std::function<void(const client::Error& error, const Progress& progress, bool interrupted)>;

  /// Starts a walk. Returns an error when it cannot start (then `done` is never called);
  /// `handle`, when given, gets the running walk.
  static client::Error start(const std::shared_ptr<client::Connection>& connection,
                             WalkOptions options, Visitor visitor, DoneCallback done,
                             std::shared_ptr<QueueWalker>* handle = nullptr);

  virtual ~QueueWalker() = default;
  /// Reads no more; what is in flight settles, then `done` fires with interrupted = true.
  virtual void stop() = 0;
  virtual const Progress& progress() const = 0;
};

}  // namespace retryloop::move
