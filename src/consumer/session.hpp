#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "migration_watch.hpp"
#include "retryloop/client/channel.hpp"
#include "retryloop/client/connection.hpp"
#include "retryloop/consumer/consumer.hpp"
#include "retryloop/migrate/follower.hpp"
#include "retryloop/topology/declarer.hpp"

namespace retryloop::consumer::detail {

/// What a session tells its consumer. No event fires after the session failed or was closed.
struct SessionEvents {
  /// Every step succeeded: the consumer is consuming.
  std::function<void()> ready;
  /// The session cannot go on. `fatal`: reconnecting cannot fix it (refused credentials or
  /// permissions, topology drift). The consumer then closes it.
  std::function<void(const client::Error& error, bool fatal)> failed;
  std::function<void(client::Delivery&& delivery)> delivery;
  /// The broker blocked (true) or unblocked publishing on the publish connection.
  std::function<void(bool blocked, const std::string& reason)> blocked;
  /// The session no longer consumes the queue it left for another (it follows a migration): the
  /// deliveries from it that wait for a handler go back now. `mark` is theirs (mark_of).
  std::function<void(const void* mark)> left;
  /// What the consumer should log once per process: the service's objects differ from its file
  /// since a migration, and the session went on without declaring them.
  std::function<void(const std::string& text)> drifted;
};

/// One connected attempt of a consumer: a connection that consumes and acks, and one that
/// publishes copies (so that a broker alarm, which blocks publishers, never stalls acks).
///
/// It sets itself up as one flat sequence of steps: connect both connections, declare the
/// service's topology (when asked to), open the publish channel and put it in confirm mode,
/// open the consume channel and set its prefetch, consume. Every callback it hands out passes
/// through one guard (`guarded`), which drops it once the session has failed or was closed;
/// a step that fails, a lost connection, a closed channel or a broker-side cancel fail the
/// session once.
///
/// Ownership, the rule of the consumer and the parking walker: an object hands out callbacks
/// that hold a weak_ptr to it, never a strong one, so that no callback keeps it alive or forms
/// a cycle with the connection or channel that stores it. What must outlive its caller holds
/// itself (`self_`) until its last handle is closed; a session is held by its consumer.
class Session : public std::enable_shared_from_this<Session> {
 public:
  /// Connects, sets up and consumes; `events.ready` fires once it consumes.
  static std::shared_ptr<Session> start(uv_loop_t* loop, const ConsumerOptions& options,
                                        uint64_t generation, SessionEvents events);

  /// Closes both connections (the broker requeues what is unacked); no event fires after this
  /// call. `done` fires once both are closed.
  void close(std::function<void()> done = {});

  uint64_t generation() const { return generation_; }
  /// Failed or closed: nothing it holds may be used to settle a delivery any more.
  bool ended() const { return ended_; }
  const std::shared_ptr<client::Connection>& consume_connection() const {
    return consume_connection_;
  }
  const std::shared_ptr<client::Channel>& consume_channel() const { return consume_channel_; }
  /// Null until the publish channel is open and in confirm mode.
  const std::shared_ptr<client::Channel>& publish_channel() const { return publish_channel_; }
  /// After a nack: opens a fresh publish channel in confirm mode, and publish_channel() is that
  /// one from then on. RabbitMQ 3.10 nacks every later publish on a channel whose first publish
  /// to a quorum queue came while the queue was between leaders (its leader's node lost); a new
  /// channel reaches the new leader. The replaced channel stays open until the confirms it awaits
  /// are in (close_drained_channels). One renewal at a time; a failure fails the session.
  void renew_publish_channel();
  /// Closes the replaced publish channels that await no confirm.
  void close_drained_channels();
  /// Stops consuming for good (a graceful stop): `done` fires once the broker has no consumer of
  /// this session any more, or at once when it had none.
  void stop_consuming(std::function<void()> done);

  /// The mark of the deliveries of `consumer_tag`, held by each until it is settled: once the
  /// session has left that consumer's queue (following a migration) and the last delivery from
  /// it lets its mark go, the session tells the migration (docs/migrate.md, "The instances
  /// follow"). Null for a tag the session does not know.
  std::shared_ptr<void> mark_of(const std::string& consumer_tag) const;
  /// The queue it consumes, or last asked to: the service queue, or a migration's holding queue.
  const std::string& queue() const { return follower_.queue(); }

 private:
  /// What each delivery holds until it is settled (mark_of); tells the session once the last one
  /// let it go, if the session left its queue by then.
  struct DeliveryMark {
    std::function<void()> settled;
    ~DeliveryMark() {
      if (settled) settled();
    }
  };

  Session(const ConsumerOptions& options, uint64_t generation, SessionEvents events);

  template <class Next>
  auto guarded(Next next);
  template <class Next>
  auto then(Next next);
  void check(const client::Error& error);
  void fail(const client::Error& error);
  void fail(const client::Error& error, bool fatal);
  void watch(const std::shared_ptr<client::Channel>& channel);

  void connect(uv_loop_t* loop);
  /// Starts the migration watch; declare() follows once it has read the service's record.
  void watch_migration();
  void migration_read(const client::Error& error, const std::optional<migrate::Record>& record);
  /// Logs why it cannot follow migrations and drops the watch; the session runs on without it.
  void stop_following(const client::Error& error);
  void declare();
  void declared(const topology::Report& report);
  void open_publish_channel();
  void select_confirms(std::shared_ptr<client::Channel> channel);
  void open_consume_channel();
  void set_prefetch(std::shared_ptr<client::Channel> channel);
  void consume();
  void consuming(const std::string& consumer_tag);
  void cancel();
  /// Follows the migration to the queue it names: consumes it, consumes the settling queue, then
  /// cancels the consumer of the queue it leaves, whose deliveries settle meanwhile.
  void switch_queue();
  void leave(const std::string& consumer_tag, std::shared_ptr<DeliveryMark> mark);
  std::shared_ptr<DeliveryMark> new_mark();
  client::ConsumeOptions consume_options(const std::string& queue);
  /// Issues the consume or cancel that brings the session to what was asked, when none is under
  /// way; runs the stop's `done` once nothing consumes.
  void reconcile();

  const ConsumerOptions options_;
  uint64_t generation_;
  SessionEvents events_;
  std::shared_ptr<client::Connection> consume_connection_;
  std::shared_ptr<client::Connection> publish_connection_;
  std::shared_ptr<client::Channel> consume_channel_;
  std::shared_ptr<client::Channel> publish_channel_;
  std::vector<std::shared_ptr<client::Channel>> replaced_channels_;
  bool renewing_ = false;
  std::shared_ptr<MigrationWatch> migration_watch_;
  migrate::Follower follower_;
  /// The migration record's read did not come back in time: the topology is not declared, since a
  /// migration may be under way.
  bool record_unread_ = false;
  /// The queue the consumer consumes (consumer_tag_), and the mark of its deliveries.
  std::string consumed_queue_;
  std::shared_ptr<DeliveryMark> mark_;
  /// Consumers being cancelled for a migration (their cancel-ok has not come), and their marks.
  std::unordered_map<std::string, std::shared_ptr<DeliveryMark>> leaving_;
  /// Every mark it made: close() disarms those still held, so that one let go later (by a
  /// worker thread that outlived the consumer's stop) tells nobody.
  std::vector<std::weak_ptr<DeliveryMark>> marks_;
  /// The broker's consumer tag while it consumes; empty when it does not.
  std::string consumer_tag_;
  bool want_consuming_ = true;
  /// A basic.consume or basic.cancel awaits its reply.
  bool consume_changing_ = false;
  /// The consume channel is open with its prefetch set.
  bool consume_channel_ready_ = false;
  bool ready_sent_ = false;
  bool stopping_consuming_ = false;
  std::function<void()> stopped_consuming_;
  int connected_ = 0;
  bool ended_ = false;
};

}  // namespace retryloop::consumer::detail
