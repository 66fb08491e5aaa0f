#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/move/queue_walker.hpp"

namespace retryloop::move::detail {

/// The QueueWalker. Reads a queue once, from its head to the depth it had at the start, and
/// carries out a decision per message (queue_walker.hpp). Kept messages are held unacked until
/// the channel closes; when they fill half the window, the consumer is restarted, so that held
/// messages never stall the reading (prefetch counts per consumer). Once a channel holds
/// kHeldPerChannel messages, the next consumer reads on a new channel and the old one keeps its
/// messages: RabbitMQ looks an ack's delivery tag up by walking the channel's unacked messages from
/// the oldest, so acks behind a million held messages would cost a million steps each (a 1%
/// replay of 100,000 classic messages on RabbitMQ 4.0 took 31 s on one channel, 7.6 s so). The
/// old consumer is cancelled
/// only once no copy is in flight, and the new one starts once none is, so that at most `window`
/// copies ever await their confirms. A channel that holds kept messages closes no sooner than a
/// grace period after its last ack: RabbitMQ 3.10 quorum queues can drop acks that the close
/// overtakes, which would leave a moved message in the queue as well. `done` fires once the queue
/// counts the kept messages back (or after a few seconds in which the count did not grow), so that
/// a read that follows sees them.
class Walker : public QueueWalker, public std::enable_shared_from_this<Walker> {
 public:
  /// QueueWalker::start.
  static client::Error start(const std::shared_ptr<client::Connection>& connection,
                             WalkOptions options, Visitor visitor, DoneCallback done,
                             std::shared_ptr<QueueWalker>* handle);

  void stop() override;
  const Progress& progress() const override { return progress_; }

 private:
  Walker(std::shared_ptr<client::Connection> connection, WalkOptions options);

  void on_channel(std::shared_ptr<client::Channel> channel);
  /// With WalkOptions::publish_connection: opens the confirm channel copies go out on.
  void open_publish_channel();
  /// The channel copies are published on.
  client::Channel& publishing();
  /// Counts the queue to walk; a count of 0 is looked at again first (probe_empty, then
  /// WalkOptions::empty_answers), then the walk starts or ends.
  void count_queue();
  /// After a first count of 0: a basic.get, whose "empty" is the queue's own answer (a quorum
  /// queue's, its leader's), where a count of 0 may only mean that the leader could not be
  /// reached. It goes out on a connection of its own (probe_connection_), which the broker closes
  /// when the leader cannot be reached. Empty ends the walk at once; a message goes back to the
  /// queue when that connection closes, and the counts go on as before the probe.
  void probe_empty();
  /// The probe's basic.get, on `channel` of probe_connection_.
  void probe_get(std::shared_ptr<client::Channel> channel);
  /// The get failed or took too long: count and probe again on the next tick, or fail the walk
  /// once the gets have failed for kProbeRetryMs.
  void probe_unanswered(const client::Error& error);
  /// Closes the probe's connection.
  void end_probe();
  /// Ends a walk that found the queue empty.
  void end_empty();
  /// Reads on `channel`: its close ends the walk with the broker's reason.
  void adopt(std::shared_ptr<client::Channel> channel);
  /// Passive declare of the queue; `found` runs on a live walker, any error ends the walk.
  void look_up(std::function<void(const client::QueueInfo& info)> found);
  /// Confirms and prefetch on the channel, then the consumer.
  void start_reading();
  /// Starts the next consumer: on a new channel when this one holds enough messages.
  void next_consumer();
  void switch_channel();
  void consume();
  void restart_consumer();
  void cancel_consumer();
  void on_settled();
  /// Holds the message just read unacked until the channel closes.
  void hold();
  /// Runs grace_close_ after `delay_ms`.
  void close_after(uint64_t delay_ms);
  /// WalkOptions::done_before_grace: `done` once the consumer is cancelled, when no delivery is
  /// held; the close of `channels` follows after the grace, or at once when one of them ends
  /// (the connection's close), and the grace does not keep the loop running.
  void tell_before_grace(const std::vector<std::shared_ptr<client::Channel>>& channels);
  /// After the close: waits until the queue counts the held messages back, then `finish`.
  void await_returns(std::function<void()> finish);
  void check_returns();
  void finish_returns();
  void on_delivery(client::Delivery&& delivery);
  void move(uint64_t delivery_tag, Decision&& decision, std::string&& body);
  void copy(Decision&& decision, std::string&& body);
  /// A move's or copy's publish ended; `original_held`: a copy's original stays in the queue
  /// anyway.
  void copy_settled(const client::PublishOutcome& outcome, bool original_held);
  client::Error publish_move(const std::weak_ptr<Walker>& weak, uint64_t delivery_tag,
                             const Decision& decision, const std::string& body);
  /// WalkOptions::record_moved: a move's copy confirmed, its original acked once recorded.
  void copy_confirmed(std::shared_ptr<client::Channel> channel, uint64_t delivery_tag,
                      std::string key);
  /// Hands the confirmed copies not yet recorded to record_moved, unless a call is under way.
  void record_moved();
  /// record_moved answered for the copies of its call.
  void recorded(const client::Error& error);
  void finish_reading();
  void maybe_done();
  void fail(const client::Error& error);
  void report(const client::Error& error);
  void on_tick();
  /// After kIdleMs without a delivery: asks the broker whether the queue still has ready
  /// messages, and ends the reading only when it answers none (fewer messages than the count at
  /// the start, taken by someone else), or after ten such checks found messages ready that never
  /// came. A connection that has gone silent never answers, so the run then ends with the
  /// connection's error, not as finished.
  void check_idle();

  std::shared_ptr<client::Connection> connection_;
  /// WalkOptions::publish_connection, and the channel on it once open.
  std::shared_ptr<client::Connection> publish_connection_;
  std::shared_ptr<client::Channel> publish_channel_;
  std::string queue_;
  uint16_t window_;
  /// WalkOptions::empty_answers.
  int empty_answers_wanted_;
  /// WalkOptions::missing_hint and readers.
  std::string missing_hint_;
  std::string readers_;
  Visitor visitor_;
  DoneCallback done_;
  ProgressHandler on_progress_;
  bool done_before_grace_ = false;
  /// WalkOptions::record_moved, the confirmed copies it has not been told of, and those of its
  /// call under way.
  struct Confirmed {
    std::shared_ptr<client::Channel> channel;  // where the original was delivered
    uint64_t delivery_tag = 0;
    std::string key;
  };
  std::function<void(std::vector<std::string>, std::function<void(const client::Error&)>)>
      record_moved_;
  std::vector<Confirmed> unrecorded_;
  std::vector<Confirmed> recording_;
  bool record_call_open_ = false;
  /// Deliveries that came after the reading ended, held unread until the channel closes.
  size_t unread_ = 0;
  /// The channel that reads, and the earlier ones, kept open for the messages they hold.
  std::shared_ptr<client::Channel> channel_;
  std::vector<std::shared_ptr<client::Channel>> holding_channels_;
  size_t held_by_channel_ = 0;
  std::string consumer_tag_;
  bool consuming_ = false;
  bool restarting_ = false;
  /// A restart waits for the copies in flight before it cancels the consumer.
  bool cancel_when_settled_ = false;
  /// The old consumer is cancelled; the new one starts once no copy is in flight.
  bool consume_when_settled_ = false;
  /// When the last ack went out (loop time, ms); 0 before the first.
  uint64_t last_ack_ms_ = 0;
  /// Closes the channel once the grace after such acks is over.
  std::function<void()> grace_close_;
  std::function<void()> returns_finish_;
  /// The depth the queue has once the held messages are back: the start's, less what moved.
  uint64_t expected_depth_ = 0;
  /// The depth last seen while waiting; each rise pushes the deadline back.
  uint64_t returned_depth_ = 0;
  uint64_t returns_deadline_ms_ = 0;
  bool reading_done_ = false;
  bool interrupted_ = false;
  bool reported_ = false;
  /// Messages held unacked until the channel closes (kept, or whose copy was refused): all of
  /// them, and those of the current consumer.
  size_t held_ = 0;
  size_t held_by_consumer_ = 0;
  size_t publishes_in_flight_ = 0;
  uint64_t last_activity_ms_ = 0;
  bool checking_idle_ = false;
  int idle_checks_ = 0;
  /// Answers of 0 to the first count so far, and whether the next tick counts again.
  int empty_answers_ = 0;
  bool count_again_ = false;
  /// Whether probe_empty has had its answer, whether one is awaited, since when (loop time, ms),
  /// and when the first of the gets that failed in a row started failing (0: none did).
  bool probed_ = false;
  bool probing_ = false;
  uint64_t probe_started_ms_ = 0;
  uint64_t first_probe_failure_ms_ = 0;
  std::shared_ptr<client::Connection> probe_connection_;
  Progress progress_;
  uv_timer_t timer_{};
  std::shared_ptr<Walker> self_;
};

}  // namespace retryloop::move::detail
