#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/move/queue_walker.hpp"
#include "retryloop/topology/topology.hpp"
#include "retryloop/transfer/plan.hpp"

namespace retryloop::transfer {

/// The header each moved copy carries, kept from the first transfer that moved it: "<service
/// queue>:id-<digest>" for a message with a message id (move::stable_stamp), the same when a
/// killed transfer's rerun moves the message again; "<run id>:<n>" for one without.
inline constexpr std::string_view stamp_header = "retryloop-transfer";

/// `N.transfer.lock`: the exclusive queue a running transfer of service N, or of scheduled queue N
/// (transfer_scheduled_queue), holds on the old broker. A service is usually named as its queue,
/// so that one file's transfer of the queue as a service and another's of it as a scheduled queue
/// never read it at once.
std::string lock_queue_name(std::string_view name);

struct TransferOptions {
  /// The file's schedule (its top-level `delay_levels`): what its levels hold for the service's
  /// queue is moved too, with its due times kept (level_ladders).
  std::optional<topology::Schedule> schedule;
  /// The base of the levels moved retries wait in on the new broker (transfer_schedule).
  std::chrono::milliseconds precision = default_precision;
  /// Keep reading the old queues until a pass has moved nothing and left no retry to come due, for
  /// `settle`, or stop().
  bool follow = false;
  std::chrono::milliseconds settle{10'000};
  /// Pause between two passes over the old queues when following.
  std::chrono::milliseconds pass_interval{500};
  /// How long a lock another transfer holds is waited for (client::take_queue_lock).
  std::chrono::milliseconds lock_wait{5000};
  /// Copies awaiting their confirms at once, per queue read.
  uint16_t window = 500;
  /// The run's id, which prefixes the stamps; empty: a random one.
  std::string id;
  /// Milliseconds since the epoch; the system clock when empty.
  std::function<int64_t()> now_ms;
};

/// What one read of one old queue did.
struct SourceResult {
  Source source;
  /// The walk's counts: `moved` copies confirmed on the new broker and acked on the old one.
  move::Progress progress;
  /// Of those moved: straight to the service queue (due already, or not a retry).
  uint64_t to_queue = 0;
  /// Through the levels, with what was left of their delay.
  uint64_t to_levels = 0;
  /// Of those, the retries whose due time the message did not carry: they wait their whole delay
  /// again.
  uint64_t due_unknown = 0;
  /// Left on the old broker to come due there (following, due time unknown).
  uint64_t left = 0;
  /// A delay level: messages of other queues, left where they are (held for the read).
  uint64_t others = 0;
  /// Kept on the old broker because their properties could not be decoded (counted in neither
  /// `progress.moved` nor `progress.failed`).
  uint64_t undecodable = 0;
  /// The longest remaining delay given to a moved retry.
  std::chrono::milliseconds longest_delay{0};
};

struct TransferEvents {
  /// A read of an old queue starts (pass counts from 1).
  std::function<void(const Source& source, int pass)> reading;
  std::function<void(const SourceResult& result, int pass)> read;
  /// Following: a pass found every old queue empty; `empty_for` is how long they have been.
  std::function<void(std::chrono::milliseconds empty_for)> idle;
};

/// How a transfer of one service ended.
struct TransferResult {
  /// Every read, in order.
  std::vector<SourceResult> reads;
  int passes = 0;
  /// stop() ended it.
  bool interrupted = false;
  /// The run's id (the stamps' prefix).
  std::string id;
  /// What the last read of each old queue left there: retries to come due there, and messages
  /// that could not move (the new broker refused their copies, or their properties could not be
  /// decoded). A transfer with any `stuck` is not finished.
  uint64_t left = 0;
  uint64_t stuck = 0;
  uint64_t moved() const;
};
using TransferCallback = std::function<void(const client::Error& error, const TransferResult&)>;

/// A running transfer; stop() ends it once what is in flight has settled.
class Transfer {
 public:
  virtual ~Transfer() = default;
  virtual void stop() = 0;
};

/// Moves `service`'s messages from the broker of `from` to the broker of `to` (docs/transfer.md):
/// takes `N.transfer.lock` on the old broker (client::take_queue_lock: a second transfer of the
/// service is refused), keeps it until `from` closes, declares on the new one the levels moved
/// retries wait in (transfer_schedule; the service's topology, and service_schedule of the file's
/// schedule, must be there already: `topology apply`), then reads the old queues
/// (transfer_sources, with the levels of level_ladders) once each, or with `follow` again and
/// again: each message is published to the new broker with confirms and mandatory, and acked on the
/// old one only once confirmed and not returned. A retry goes where place() says, with what
/// transfer_copy() makes of it. A copy the new broker returns or refuses leaves its original where
/// it was. Both connections must be open and stay the caller's. `done` is called once, on the loop
/// thread; `handle`, when given, gets the running transfer.
client::Error transfer_service(const std::shared_ptr<client::Connection>& from,
                               const std::shared_ptr<client::Connection>& to,
                               const topology::Service& service, TransferOptions options,
                               TransferEvents events, TransferCallback done,
                               std::shared_ptr<Transfer>* handle = nullptr);

/// Moves what the old broker holds for `queue`, a queue of the file's schedule
/// (TransferOptions::schedule) that no service declares (unowned_scheduled_queues), as
/// transfer_service does for a service: takes `Q.transfer.lock`, then reads
/// scheduled_queue_sources: the queue's messages go to the same queue on the new broker, in order
/// and as they are; the messages the delay levels hold for it wait out what is left of their delay
/// in the same levels there, never less; those in the set's unrouted queue go to it. The queue and
/// its schedule's levels and binding must be on the new broker already (`topology apply`, once the
/// queue's owner has declared it there). Returns invalid_argument when the schedule does not
/// deliver to `queue`.
client::Error transfer_scheduled_queue(const std::shared_ptr<client::Connection>& from,
                                       const std::shared_ptr<client::Connection>& to,
                                       const std::string& queue, TransferOptions options,
                                       TransferEvents events, TransferCallback done,
                                       std::shared_ptr<Transfer>* handle = nullptr);

}  // namespace retryloop::transfer
