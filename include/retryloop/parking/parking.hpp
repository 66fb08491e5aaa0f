#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/client/error.hpp"
#include "retryloop/move/queue_walker.hpp"
#include "retryloop/parking/parked_message.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::parking {

// Operations on a service's parking queue, as the `retryloop parking` command uses them.
//
// Shared rules. Each operation takes an open connection (left open) and opens a channel of its
// own. It reads the parking queue once, up to the depth the queue had when it started, so that
// messages parked meanwhile (for example by a consumer failing replayed messages again) are
// never read in the same run. Messages it does not take are held unacked and go back to their
// place in the queue when its channel closes: order is kept, nothing is removed. (The broker
// marks them redelivered; a quorum queue also counts a delivery for each.) A call that returns
// an error has started nothing and never calls its callback; otherwise the callback is called
// exactly once, on the loop thread.

/// Messages read per round (prefetch) and, for replay, copies awaiting confirms at once.
inline constexpr uint16_t default_window = 500;

/// Told each message as it is read, in queue order.
using MessageHandler = std::function<void(ParkedMessage& message)>;

struct ListOptions {
  /// At most this many messages, from the head of the queue; 0: all.
  size_t limit = 0;
  uint16_t window = default_window;
  /// When set, each message goes to it as it is read and the callback's vector stays empty, so
  /// that the memory a listing takes does not grow with the depth of the queue.
  MessageHandler on_message;
};
using ListCallback =
    std::function<void(const client::Error& error, std::vector<ParkedMessage> messages)>;

/// Reads parked messages without removing or reordering them.
client::Error list(const std::shared_ptr<client::Connection>& connection,
                   const topology::Service& service, ListOptions options, ListCallback callback);

/// Progress of a read, replay or purge, reported as it goes (the walk of the move layer, which
/// the parking operations read with). `total`: the parking depth at the start, the most
/// messages this run reads. `moved`: for a replay, copies confirmed and their parked originals
/// acked; for a purge, messages deleted (for a dry run, or a purge without execute, what would
/// be). `skipped`: did not match the filter (or were past the limit), stay in parking. `failed`:
/// copies returned or nacked by the broker, whose originals stay in parking. `uncertain`: copies
/// published whose originals stay parked because the channel or connection ended before the
/// broker's confirm, or before the original's ack; each may be in the target as well.
/// `duplicates` stays 0.
using Progress = move::Progress;
using ProgressHandler = move::ProgressHandler;

/// The most distinct error lines Stats::by_error counts, so that a queue whose every message has
/// an error of its own (an id or a time in the text) costs bounded memory.
inline constexpr size_t max_error_groups = 10000;
/// The group that counts the messages of error lines past max_error_groups.
inline constexpr const char* other_errors_group = "(other errors, past the first 10000 distinct)";

/// The messages whose error lines share one error_fingerprint(): one cause.
struct ErrorCause {
  /// The fingerprint ("(none)" for messages without an error).
  std::string fingerprint;
  uint64_t count = 0;
  /// How many distinct first lines it groups.
  uint64_t distinct = 0;
  /// One of them: the most frequent (the first in text order among equals).
  std::string example;
};

struct Stats {
  /// Messages ready in the parking queue.
  uint32_t depth = 0;
  /// Messages read (the depth, unless messages came or went meanwhile).
  uint64_t scanned = 0;
  /// Of those, the ones that match StatsOptions::filter: the counts below are of these only.
  uint64_t matched = 0;
  /// Earliest `retryloop-parked-at` among them.
  std::optional<uint64_t> oldest_parked_at;
  /// Count per `retryloop-reason` ("(none)" when missing).
  std::map<std::string, uint64_t> by_reason;
  /// Count per first line of `retryloop-error`, most frequent first. At most max_error_groups
  /// distinct lines are counted; the messages of any further ones count under
  /// other_errors_group.
  std::vector<std::pair<std::string, uint64_t>> by_error;
  /// The same messages grouped by cause (error_fingerprint of the first line), most frequent
  /// first. The lines past max_error_groups stay in their own group.
  std::vector<ErrorCause> by_cause;
  /// Depths of the service's input queue, wait queues and delay level queues that exist (queue
  /// name -> depth). The delay levels are shared with the other services of the same base: their
  /// depths count every service's retries.
  std::map<std::string, uint32_t> loop_depths;
  /// Those of the queues above that the user may not look at (RabbitMQ 4.2.6 and 4.3 refuse a
  /// passive declare to a user without any permission on the queue): left out of loop_depths.
  std::vector<std::string> loop_not_permitted;
  /// The first StatsOptions::keep matching messages, in queue order.
  std::vector<ParkedMessage> messages;
};
/// Groups counts per error line (Stats::by_error, most frequent first) by cause.
std::vector<ErrorCause> causes_of(const std::vector<std::pair<std::string, uint64_t>>& by_error);

/// Gets the stats by value: a caller may keep them without a copy.
using StatsCallback = std::function<void(const client::Error& error, Stats stats)>;

struct StatsOptions {
  /// Count only the messages that match; the depth and `scanned` count every message.
  Filter filter;
  /// Keep up to this many matching messages, from the head, in Stats::messages (0: none). One
  /// read then both counts the queue and shows its head.
  size_t keep = 0;
  /// Of each kept message, Stats::messages holds at most this many bytes of the body, cut where
  /// no UTF-8 character is split (ParkedMessage::body_size keeps the size it had). nullopt: whole
  /// bodies, which may reach the broker's maximum message size each.
  std::optional<size_t> kept_body_bytes;
  /// Look up the depths of the service's input and wait queues afterwards.
  bool loop_depths = true;
  uint16_t window = default_window;
};

/// Counts the parked messages by reason and error, and the loop's queue depths.
client::Error stats(const std::shared_ptr<client::Connection>& connection,
                    const topology::Service& service, StatsCallback callback);
/// The same, counting only the messages that match `options.filter` and keeping the first ones;
/// `on_progress` (optional) is told after each message read.
client::Error stats(const std::shared_ptr<client::Connection>& connection,
                    const topology::Service& service, StatsOptions options, StatsCallback callback,
                    ProgressHandler on_progress = {});

struct ReplayOptions {
  /// At most this many messages move; 0: no limit.
  size_t limit = 0;
  Filter filter;
  /// The queue to move them to (through the default exchange); empty: the service's input
  /// queue, so other queues bound to its input exchange get no copy.
  std::string to_queue;
  /// Read and report what would move; move nothing.
  bool dry_run = false;
  uint16_t window = default_window;
  /// With dry_run: when set, each message that would move goes to it as it is read, and
  /// ReplayResult::would_move stays empty (memory that does not grow with the queue).
  MessageHandler on_would_move;
  /// Read the unrouted queue of the service's delay levels instead of its parking queue, and take
  /// only this service's retries (topology::is_delay_route_of): those whose input queue did not
  /// exist when their delay ended. The other services' retries there stay, in order.
  bool unrouted_retries = false;
  /// Who replays, for the `replayed` entry each copy's history gets.
  ActionNote note;
};

struct ReplayResult {
  Progress progress;
  /// Stopped early by Replay::stop().
  bool interrupted = false;
  /// Set when the run ended on a broker or connection error; what was confirmed before stays
  /// moved, the rest stays parked.
  client::Error error;
  /// With dry_run: the messages that would move, in queue order.
  std::vector<ParkedMessage> would_move;
};
using ReplayCallback = std::function<void(const ReplayResult& result)>;

/// A running replay. Each matching message is published to the target with confirm and
/// mandatory, and its parked original is acked only after the confirm arrives with no return.
/// A crash between the two leaves both copies (a duplicate, at most `window` of them), never
/// neither.
class Replay {
 public:
  virtual ~Replay() = default;
  /// Stops taking new messages; copies in flight settle, then the callback fires
  /// (`interrupted`).
  virtual void stop() = 0;
  virtual const Progress& progress() const = 0;
};

/// Starts a replay. `on_progress` (optional) is told after each settled message.
client::Error replay(const std::shared_ptr<client::Connection>& connection,
                     const topology::Service& service, ReplayOptions options,
                     ReplayCallback callback, std::shared_ptr<Replay>* handle = nullptr,
                     ProgressHandler on_progress = {});

struct PurgeOptions {
  Filter filter;
  /// false: count what would be deleted, delete nothing.
  bool execute = false;
  uint16_t window = default_window;
};
using PurgeCallback = std::function<void(const client::Error& error, const Progress& progress)>;

/// Deletes the parked messages that match `filter` (all, when it is empty), or only counts them
/// unless `execute`. `progress.moved` is the number deleted (or that would be). `on_progress`
/// (optional) is told after each message read.
client::Error purge(const std::shared_ptr<client::Connection>& connection,
                    const topology::Service& service, PurgeOptions options, PurgeCallback callback,
                    ProgressHandler on_progress = {});

/// The header that links an edited copy to the parked message it was made from (its message id).
inline constexpr std::string_view edited_from_header = "retryloop-edited-from";

struct EditOptions {
  /// The parked message to edit: the first one in the queue with this message id...
  std::string message_id;
  /// ...and, when set, this `retryloop-parked-at` (seconds since the epoch), so that of two
  /// parked messages with one id, the one the operator was shown is edited.
  std::optional<uint64_t> parked_at;
  /// The copy's body; nullopt: the original's, byte for byte.
  std::optional<std::string> body;
  /// Headers the copy gets instead of the original's, or in addition. A value of the same kind
  /// as the original's (an integer for an integer, a number for a float, a string for a string)
  /// keeps the original's AMQP type when it fits in it.
  amqp::FieldTable set_headers;
  /// Headers of the original the copy goes without.
  std::vector<std::string> remove_headers;
  /// The queue the copy goes to (through the default exchange); empty: the service's input
  /// queue.
  std::string to_queue;
  /// Leave the original parked (it is released, unchanged, when the walk ends); otherwise it is
  /// acked once the copy is confirmed.
  bool keep_original = false;
  /// Who edits it, for the copy's `edited` history entry.
  ActionNote note;
};

struct EditResult {
  client::Error error;
  /// Whether a parked message with the id was found.
  bool found = false;
  /// The copy was confirmed and not returned (it is in the target queue).
  bool sent = false;
  /// The copy was published, but the channel or connection ended before the broker confirmed it
  /// (or before the original's ack went out): it may be in the target queue. The original stays
  /// parked; an edit made again would send a second copy.
  bool may_have_been_sent = false;
  /// The original was acked (only after `sent`, and not with keep_original).
  bool original_removed = false;
  /// Edit::stop() ended the walk before the message was found.
  bool interrupted = false;
  /// The copy's message id: new and random.
  std::string new_message_id;
  /// The application headers the copy carries unchanged that header_editable_as_text() says no
  /// page could show as text (tables, arrays, byte arrays, timestamps, decimals, ...).
  std::vector<std::string> kept_not_editable;
};
using EditCallback = std::function<void(const EditResult& result)>;

/// A running edit.
class Edit {
 public:
  virtual ~Edit() = default;
  /// Reads no further; a copy already published settles (confirm or channel end) first, then the
  /// callback fires. Before the message was found, the result says `interrupted`.
  virtual void stop() = 0;
};

/// The name of `value`'s AMQP type as the console shows it ("long string", "int32", "timestamp",
/// "byte array", "table", ...).
const char* field_type_name(const amqp::FieldValue& value);

/// Whether an edit may change or remove header `name`: not retryloop's own (`retryloop-*`), nor
/// the broker's that no copy carries (death headers, x-delivery-count, x-acquired-count).
bool header_editable(std::string_view name);

/// Whether header `name` may be edited, and its value shown and typed back as text without
/// loss: a boolean, an integer, a float or double, or a long string that is UTF-8.
bool header_editable_as_text(std::string_view name, const amqp::FieldValue& value);

/// Why `options` cannot be carried out, naming the header at fault: a name that is empty or
/// longer than 255 bytes, one that header_editable() refuses, or one both set and removed.
client::Error check_edit(const EditOptions& options);

/// The copy an edit sends: the replay copy of `original` (make_replay_copy, with an `edited`
/// history entry, so the retryloop-* headers follow a replay's rules), with `options`' header
/// changes applied and every other header kept as it was, type and bytes, a new random message
/// id, and retryloop-edited-from naming the original's.
amqp::BasicProperties make_edited_copy(const amqp::BasicProperties& original,
                                       const EditOptions& options, const std::string& new_id);

/// Finds the parked message, publishes the edited copy with a confirm and mandatory, and acks
/// the original only after the broker confirmed the copy and did not return it (or keeps it).
/// Refuses options that check_edit() refuses. `handle`, when given, gets the running edit.
client::Error edit(const std::shared_ptr<client::Connection>& connection,
                   const topology::Service& service, EditOptions options, EditCallback callback,
                   std::shared_ptr<Edit>* handle = nullptr);

}  // namespace retryloop::parking
