#include "queue_walker_impl.hpp"

#include <spdlog/logger.h>

#include <algorithm>

#include "retryloop/move/error.hpp"
#include "retryloop/retry/history.hpp"
#include "retryloop/retry/move.hpp"

namespace retryloop::move {
namespace detail {
namespace {

using client::ClientError;
using client::Error;

/// With nothing arriving for this long, the queue holds fewer messages than it did at the start
/// (someone else took them): the walk ends.
constexpr uint64_t kIdleMs = 3000;
constexpr uint64_t kTickMs = 250;
/// How long the channel stays open after its last ack, so that a quorum queue applies the acks
/// before the close returns what the channel holds: it takes a channel's close ahead of the acks
/// still in its low-priority command queue, and returns those messages as if never acked
/// (rabbitmq-server issue 10327). Measured on RabbitMQ 3.10, a replay of a quorum parking queue
/// that kept 46 messages and moved 44: closed at once, the last 7 to 11 moved ones were back in
/// parking too; closed 1 s after the last ack, none were, in every run since. A walk that held
/// nothing back is no exception: on RabbitMQ 4.3 under load, a move of 1,000 messages out of a
/// quorum queue that closed at once left some of them in it for good.
constexpr uint64_t kAckGraceMs = 1000;
/// After the close, how long to wait for the queue to count the held messages back (a quorum queue
/// does so only after the close-ok: a read that follows at once saw an empty queue) while the
/// count does not grow, and how often to look. A large return takes as long as the count grows:
/// a classic queue on RabbitMQ 4.0 took 24 s to count 990,000 held messages back.
constexpr uint64_t kReturnsWaitMs = 3000;
constexpr uint64_t kReturnsPollMs = 50;
// WalkOptions::empty_answers, 5 by default: RabbitMQ answers a passive queue.declare with 0
// messages while a quorum queue has no leader it can reach. Measured on RabbitMQ 4.3, a 3-node
// cluster whose leader's node was stopping answered 0 once, 0.4 s in, and 100 (right) before and
// after, every 0.1 s for 8 s. A replay that trusted that answer ended at once with every message
// still parked. A basic.get's "empty" is trusted at once (Walker::probe_empty): it is the queue's
// own answer (a quorum queue's leader's), not a count the broker gives when it cannot ask. The get
// goes out on a connection of its own, since RabbitMQ closes the connection it comes on when the
// leader cannot be reached (541 "Cannot get a message from queue ...: nodedown", 4.3); the walk
// then counts and asks again each tick, for at most kProbeRetryMs.
/// How long a walk goes on asking a queue that counts 0 whether it is empty, while the get fails.
constexpr uint64_t kProbeRetryMs = 60000;
/// How long one such get may take; then it counts as failed.
constexpr uint64_t kProbeWaitMs = 5000;
/// Held messages after which the reading moves to a new channel (see Walker).
constexpr size_t kHeldPerChannel = 4096;
/// Channel numbers left free for the connection's other users (depth lookups open their own).
constexpr uint16_t kSpareChannels = 16;

}  // namespace

Walker::Walker(std::shared_ptr<client::Connection> connection, WalkOptions options)
    : connection_(std::move(connection)),
      publish_connection_(std::move(options.publish_connection)),
      queue_(std::move(options.queue)),
      window_(options.window == 0 ? 1 : options.window),
      empty_answers_wanted_(options.empty_answers < 1 ? 1 : options.empty_answers),
      missing_hint_(std::move(options.missing_hint)),
      readers_(std::move(options.readers)),
      on_progress_(std::move(options.on_progress)),
      done_before_grace_(options.done_before_grace),
      record_moved_(std::move(options.record_moved)) {}

Error Walker::start(const std::shared_ptr<client::Connection>& connection, WalkOptions options,
                    Visitor visitor, DoneCallback done, std::shared_ptr<QueueWalker>* handle) {
  if (!connection || !connection->is_open()) return Error(ClientError::not_open);
  if (options.publish_connection && !options.publish_connection->is_open()) {
    return Error(ClientError::not_open, "the connection copies go out on is not open");
  }
  std::shared_ptr<Walker> walker(new Walker(connection, std::move(options)));
  walker->visitor_ = std::move(visitor);
  walker->done_ = std::move(done);
  std::weak_ptr<Walker> weak = walker;
  Error error = connection->open_channel(
      [weak](const Error& error, std::shared_ptr<client::Channel> channel) {
        auto self = weak.lock();
        if (!self) return;
        if (error) return self->fail(error);
        self->on_channel(std::move(channel));
      });
  if (error) return error;
  walker->self_ = walker;
  uv_loop_t* loop = connection->loop();
  uv_timer_init(loop, &walker->timer_);
  walker->timer_.data = walker.get();
  uv_timer_start(
      &walker->timer_, [](uv_timer_t* timer) { static_cast<Walker*>(timer->data)->on_tick(); },
      kTickMs, kTickMs);
  walker->last_activity_ms_ = uv_now(loop);
  if (handle != nullptr) *handle = walker;
  return {};
}

void Walker::on_channel(std::shared_ptr<client::Channel> channel) {
  adopt(std::move(channel));
  if (publish_connection_) return open_publish_channel();
  count_queue();
}

void Walker::open_publish_channel() {
  std::weak_ptr<Walker> weak = weak_from_this();
  Error error = publish_connection_->open_channel(
      [weak](const Error& error, std::shared_ptr<client::Channel> channel) {
        auto self = weak.lock();
        if (!self || self->reported_) return;
        if (error) return self->fail(error);
        self->publish_channel_ = std::move(channel);
        self->publish_channel_->set_close_handler([weak](const Error& error) {
          if (auto self = weak.lock()) self->fail(error);
        });
        Error selected = self->publish_channel_->confirm_select([weak](const Error& error) {
          auto self = weak.lock();
          if (!self || self->reported_) return;
          if (error) return self->fail(error);
          self->count_queue();
        });
        if (selected) self->fail(selected);
      });
  if (error) fail(error);
}

client::Channel& Walker::publishing() {
  return publish_channel_ ? *publish_channel_ : *channel_;
}

void Walker::count_queue() {
  look_up([this](const client::QueueInfo& info) {
    if (info.message_count == 0 && empty_answers_wanted_ > 1 && !probed_) return probe_empty();
    if (info.message_count == 0 && ++empty_answers_ < empty_answers_wanted_) {
      count_again_ = true;  // on the next tick
      return;
    }
    progress_.total = info.message_count;
    if (info.message_count == 0) return end_empty();
    start_reading();
  });
}

void Walker::probe_empty() {
  probing_ = true;
  probe_started_ms_ = uv_now(connection_->loop());
  client::ConnectionOptions options = connection_->options_on_this_host();
  options.connection_name += options.connection_name.empty() ? "empty check" : " (empty check)";
  options.logger = nullptr;  // its loss is expected and handled here
  probe_connection_ = client::Connection::create(connection_->loop(), std::move(options));
  std::weak_ptr<Walker> weak = weak_from_this();
  Error error = probe_connection_->connect([weak](const Error& error) {
    auto self = weak.lock();
    if (!self || self->reported_ || !self->probing_) return;
    if (error) return self->probe_unanswered(error);
    Error opening = self->probe_connection_->open_channel(
        [weak](const Error& error, std::shared_ptr<client::Channel> channel) {
          auto self = weak.lock();
          if (!self || self->reported_ || !self->probing_) return;
          if (error) return self->probe_unanswered(error);
          self->probe_get(std::move(channel));
        });
    if (opening) self->probe_unanswered(opening);
  });
  if (error) probe_unanswered(error);
}

void Walker::probe_get(std::shared_ptr<client::Channel> channel) {
  std::weak_ptr<Walker> weak = weak_from_this();
  Error error = channel->get(
      queue_, false, [weak, channel](const Error& error, std::optional<client::GetResult>&& got) {
        auto self = weak.lock();
        if (!self || self->reported_ || !self->probing_) return;
        if (error) return self->probe_unanswered(error);
        // Not empty after all: the message goes back (redelivered), and the counts decide. The
        // nack goes out before the connection's close.
        if (got) static_cast<void>(channel->nack(got->delivery_tag, false, true));
        self->end_probe();
        if (!got) return self->end_empty();
        self->probed_ = true;
        self->count_again_ = true;
      });
  if (error) probe_unanswered(error);
}

void Walker::probe_unanswered(const Error& error) {
  end_probe();
  const uint64_t now = uv_now(connection_->loop());
  if (first_probe_failure_ms_ == 0) first_probe_failure_ms_ = now;
  if (now - first_probe_failure_ms_ >= kProbeRetryMs) {
    return fail(Error(MoveError::queue_unanswered,
                      "queue " + queue_ +
                          " counts 0 messages, and a basic.get to see whether it "
                          "is empty failed for " +
                          std::to_string(kProbeRetryMs / 1000) +
                          " s, the last time with: " + error.message()));
  }
  if (spdlog::logger* logger = connection_->logger()) {
    logger->info("queue {} counts 0 messages and did not answer a basic.get ({}); asking again",
                 queue_, error.message());
  }
  count_again_ = true;  // the next tick counts, and probes again on 0
}

void Walker::end_probe() {
  probing_ = false;
  if (auto probe = std::move(probe_connection_)) probe->close();
}

void Walker::end_empty() {
  progress_.total = 0;
  reading_done_ = true;
  maybe_done();
}

void Walker::adopt(std::shared_ptr<client::Channel> channel) {
  channel_ = std::move(channel);
  std::weak_ptr<Walker> weak = weak_from_this();
  channel_->set_close_handler([weak](const Error& error) {
    if (auto self = weak.lock()) self->fail(error);
  });
}

void Walker::look_up(std::function<void(const client::QueueInfo& info)> found) {
  std::weak_ptr<Walker> weak = weak_from_this();
  client::QueueOptions passive;
  passive.passive = true;
  Error error = channel_->queue_declare(
      queue_, passive,
      [weak, found = std::move(found)](const Error& error, const client::QueueInfo& info) {
        auto self = weak.lock();
        if (!self || self->reported_) return;
        if (error.reply_code == 404) {
          return self->fail(
              Error(MoveError::queue_missing,
                    "queue " + self->queue_ + " does not exist" + self->missing_hint_));
        }
        if (error.reply_code == 403) {
          // RabbitMQ 4.2.6 and 4.3 refuse a passive declare to a user without any permission
          // on the queue, and name configure, though read is enough.
          Error refused = error;
          refused.reply_text +=
              " (looking the queue up with a passive queue.declare, which "
              "takes any permission on it: read, which " +
              self->readers_ + " need, is enough)";
          return self->fail(refused);
        }
        if (error) return self->fail(error);
        found(info);  // the walker is alive: `self` holds it
      });
  if (error) fail(error);
}

void Walker::start_reading() {
  std::weak_ptr<Walker> weak = weak_from_this();
  Error error = channel_->confirm_select([weak](const Error& error) {
    if (auto self = weak.lock(); self && error) self->fail(error);
  });
  if (!error) {
    error = channel_->qos(window_, [weak](const Error& error) {
      auto self = weak.lock();
      if (!self || self->reported_) return;
      if (error) return self->fail(error);
      self->consume();
    });
  }
  if (error) fail(error);
}

void Walker::next_consumer() {
  const size_t channels = holding_channels_.size() + 1;
  const uint16_t channel_max = connection_->tuning().channel_max;
  const bool room = channel_max == 0 || channels + kSpareChannels < channel_max;
  if (held_by_channel_ >= kHeldPerChannel && room) return switch_channel();
  consume();
}

void Walker::switch_channel() {
  holding_channels_.push_back(std::move(channel_));
  held_by_channel_ = 0;
  std::weak_ptr<Walker> weak = weak_from_this();
  Error error = connection_->open_channel(
      [weak](const Error& error, std::shared_ptr<client::Channel> channel) {
        auto self = weak.lock();
        if (!self || self->reported_) return;
        if (error) return self->fail(error);
        self->adopt(std::move(channel));
        self->start_reading();
      });
  if (error) fail(error);
}

void Walker::consume() {
  if (reported_) return;
  std::weak_ptr<Walker> weak = weak_from_this();
  client::ConsumeOptions options;
  options.on_cancel = [weak](const std::string&) {
    if (auto self = weak.lock()) {
      self->fail(Error(ClientError::consumer_cancelled,
                       "while reading " + self->queue_ + " (was it deleted?)"));
    }
  };
  Error error = channel_->consume(
      queue_, std::move(options),
      [weak](client::Delivery&& delivery) {
        if (auto self = weak.lock()) self->on_delivery(std::move(delivery));
      },
      [weak](const Error& error, const std::string& tag) {
        auto self = weak.lock();
        if (!self) return;
        if (error) return self->fail(error);
        self->consumer_tag_ = tag;
        self->consuming_ = true;
        self->restarting_ = false;
        self->held_by_consumer_ = 0;
        self->last_activity_ms_ = uv_now(self->connection_->loop());
        if (self->reading_done_) self->finish_reading();
      });
  if (error) fail(error);
}

void Walker::restart_consumer() {
  restarting_ = true;
  consuming_ = false;
  if (publishes_in_flight_ > 0) {
    cancel_when_settled_ = true;
    return;
  }
  cancel_consumer();
}

void Walker::cancel_consumer() {
  std::weak_ptr<Walker> weak = weak_from_this();
  Error error = channel_->cancel(consumer_tag_, [weak](const Error& error) {
    auto self = weak.lock();
    if (!self) return;
    if (error) return self->fail(error);
    if (self->reading_done_) {
      self->restarting_ = false;
      return self->maybe_done();
    }
    // The old consumer's deliveries have all arrived; a new one is sent a full window at once.
    // Starting it only when no copy is in flight keeps the copies awaiting confirms within the
    // window.
    if (self->publishes_in_flight_ > 0) {
      self->consume_when_settled_ = true;
      return;
    }
    self->next_consumer();
  });
  if (error) fail(error);
}

void Walker::on_delivery(client::Delivery&& delivery) {
  last_activity_ms_ = uv_now(connection_->loop());
  idle_checks_ = 0;
  if (reading_done_ || reported_) {
    ++unread_;  // held: goes back to its place when the channel closes
    return;
  }
  const uint64_t delivery_tag = delivery.delivery_tag;
  WalkedMessage walked{progress_.scanned++, std::move(delivery)};
  Decision decision = visitor_(walked);
  switch (decision.kind) {
    case Decision::Kind::keep:
      hold();
      break;
    case Decision::Kind::remove:
      if (Error error = channel_->ack(delivery_tag)) return fail(error);
      last_ack_ms_ = uv_now(connection_->loop());
      ++progress_.moved;
      break;
    case Decision::Kind::move: {
      std::string body =
          decision.body ? std::move(*decision.body) : std::move(walked.delivery.message.body);
      move(delivery_tag, std::move(decision), std::move(body));
      break;
    }
    case Decision::Kind::copy: {
      hold();
      std::string body =
          decision.body ? std::move(*decision.body) : std::move(walked.delivery.message.body);
      copy(std::move(decision), std::move(body));
      break;
    }
  }
  if (reported_) return;
  if (decision.stop_after || progress_.scanned >= progress_.total) {
    finish_reading();
  } else if (held_by_consumer_ * 2 >= window_ && consuming_ && !restarting_) {
    restart_consumer();
  }
  if (on_progress_) on_progress_(progress_);
}

void Walker::hold() {
  ++held_;
  ++held_by_consumer_;
  ++held_by_channel_;
}

void Walker::move(uint64_t delivery_tag, Decision&& decision, std::string&& body) {
  ++publishes_in_flight_;
  std::weak_ptr<Walker> weak = weak_from_this();
  Error error = publish_move(weak, delivery_tag, decision, body);
  // A copy over frame_max gives up its oldest history entries first (unless the decision keeps
  // its properties whole); one that still does not fit stays in the queue, counted as failed.
  while (error.code == make_error_code(ClientError::properties_too_large) &&
         decision.shorten_history_to_fit && retry::shorten_history(decision.properties)) {
    error = publish_move(weak, delivery_tag, decision, body);
  }
  if (error.code == make_error_code(ClientError::properties_too_large)) {
    --publishes_in_flight_;
    ++progress_.failed;
    hold();
    return;
  }
  if (error) {
    --publishes_in_flight_;
    fail(error);
  }
}

Error Walker::publish_move(const std::weak_ptr<Walker>& weak, uint64_t delivery_tag,
                           const Decision& decision, const std::string& body) {
  if (record_moved_) {
    // Published as retry::move_delivery does; the ack waits for the record.
    return publishing().publish(
        decision.exchange, decision.routing_key, decision.properties, body, client::Mandatory::yes,
        [weak, channel = channel_, delivery_tag,
         key = decision.key](const client::PublishOutcome& outcome) mutable {
          auto self = weak.lock();
          if (!self) return;
          if (!outcome.ok()) return self->copy_settled(outcome, false);
          self->copy_confirmed(std::move(channel), delivery_tag, std::move(key));
        });
  }
  return retry::move_delivery(
      publishing(), channel_, delivery_tag,
      {decision.exchange, decision.routing_key, decision.properties, body},
      [weak](const client::PublishOutcome& outcome, const Error& ack_error) {
        auto self = weak.lock();
        if (!self) return;
        if (outcome.ok() && ack_error) {
          --self->publishes_in_flight_;
          ++self->progress_.uncertain;  // confirmed, but its original stays in the queue
          return self->fail(ack_error);
        }
        if (outcome.ok()) self->last_ack_ms_ = uv_now(self->connection_->loop());
        self->copy_settled(outcome, false);
      });
}

void Walker::copy_confirmed(std::shared_ptr<client::Channel> channel, uint64_t delivery_tag,
                            std::string key) {
  unrecorded_.push_back({std::move(channel), delivery_tag, std::move(key)});
  record_moved();
}

void Walker::record_moved() {
  if (record_call_open_ || unrecorded_.empty()) return;
  record_call_open_ = true;
  recording_ = std::move(unrecorded_);
  unrecorded_.clear();
  std::vector<std::string> keys;
  keys.reserve(recording_.size());
  for (const Confirmed& copy : recording_)
    keys.push_back(copy.key);
  std::weak_ptr<Walker> weak = weak_from_this();
  record_moved_(std::move(keys), [weak](const Error& error) {
    if (auto self = weak.lock()) self->recorded(error);
  });
}

void Walker::recorded(const Error& error) {
  record_call_open_ = false;
  std::vector<Confirmed> batch = std::move(recording_);
  recording_.clear();
  Error failed = error;
  for (const Confirmed& copy : batch) {
    if (!failed) failed = copy.channel->ack(copy.delivery_tag);
    --publishes_in_flight_;
    if (failed) {
      ++progress_.uncertain;  // confirmed, but its original stays in the queue
    } else {
      ++progress_.moved;
    }
  }
  if (!batch.empty() && !failed) last_ack_ms_ = uv_now(connection_->loop());
  if (failed) return fail(failed);
  if (on_progress_) on_progress_(progress_);
  if (publishes_in_flight_ == 0) on_settled();
  record_moved();
  maybe_done();
}

void Walker::copy_settled(const client::PublishOutcome& outcome, bool original_held) {
  --publishes_in_flight_;
  if (outcome.ok()) {
    ++progress_.moved;
  } else if (outcome.status == client::PublishStatus::failed) {
    // The channel ended first: the run ends with its error, not as finished, and the copy may
    // have reached the target all the same.
    ++progress_.uncertain;
    return fail(outcome.error ? outcome.error
                              : Error(ClientError::channel_closed,
                                      "the channel ended before a copy was confirmed"));
  } else {
    ++progress_.failed;  // returned or nacked: the original stays in the queue
    if (!original_held) hold();
  }
  if (on_progress_) on_progress_(progress_);
  if (publishes_in_flight_ == 0) on_settled();
  maybe_done();
}

void Walker::copy(Decision&& decision, std::string&& body) {
  ++publishes_in_flight_;
  std::weak_ptr<Walker> weak = weak_from_this();
  Error error =
      publishing().publish(decision.exchange, decision.routing_key, decision.properties, body,
                           client::Mandatory::yes, [weak](const client::PublishOutcome& outcome) {
                             if (auto self = weak.lock()) self->copy_settled(outcome, true);
                           });
  if (error) {
    --publishes_in_flight_;
    fail(error);
  }
}

void Walker::on_settled() {
  if (cancel_when_settled_) {
    cancel_when_settled_ = false;
    if (reading_done_ || reported_) {
      restarting_ = false;  // the walk ends without a cancel
    } else {
      cancel_consumer();
    }
  } else if (consume_when_settled_) {
    consume_when_settled_ = false;
    if (reading_done_ || reported_) {
      restarting_ = false;
    } else {
      next_consumer();
    }
  }
}

void Walker::stop() {
  interrupted_ = true;
  finish_reading();
}

void Walker::finish_reading() {
  if (reported_) return;
  // No cancel: deliveries from now on are ignored, and the channel's close puts them back.
  reading_done_ = true;
  maybe_done();
}

void Walker::maybe_done() {
  if (reported_ || !reading_done_ || publishes_in_flight_ > 0 || restarting_) return;
  report({});
}

void Walker::fail(const Error& error) {
  if (!reported_) report(error);
}

void Walker::report(const Error& error) {
  reported_ = true;
  end_probe();
  std::shared_ptr<Walker> self = shared_from_this();
  auto finish = [self, error] {
    DoneCallback done = std::move(self->done_);
    if (done) done(error, self->progress_, self->interrupted_);
    if (self->self_) {
      uv_close(reinterpret_cast<uv_handle_t*>(&self->timer_), [](uv_handle_t* handle) {
        std::shared_ptr<Walker> last = std::move(static_cast<Walker*>(handle->data)->self_);
      });
    }
  };
  // Newest first: a classic queue merges each channel's returned messages into those already
  // back, and the older messages of the next channel then go in at the front. Closed oldest
  // first, 500,000 held messages took 13 s to be counted back on RabbitMQ 4.0; newest first, 6.5.
  // The channel copies went out on closes with them: a copy whose confirm its close cuts short
  // is counted uncertain before `done` reports.
  std::vector<std::shared_ptr<client::Channel>> channels;
  if (publish_channel_) channels.push_back(publish_channel_);
  if (channel_) channels.push_back(channel_);
  channels.insert(channels.end(), holding_channels_.rbegin(), holding_channels_.rend());
  holding_channels_.clear();
  channels.erase(std::remove_if(channels.begin(), channels.end(),
                                [](const auto& channel) { return !channel->is_open(); }),
                 channels.end());
  if (!channels.empty()) {
    // Closing the channels puts every held message back in its place; report after the broker
    // has done so, so that a following read sees the queue as it was.
    for (const auto& channel : channels)
      channel->set_close_handler({});
    auto close = [self, finish, error, channels] {
      auto open = std::make_shared<size_t>(channels.size());
      auto closed = [self, finish, error, open](const Error&) {
        if (--*open > 0) return;
        if (self->held_ == 0 || error) return finish();
        self->await_returns(finish);
      };
      for (const auto& channel : channels) {
        if (!channel->is_open() || channel->close(closed)) closed({});
      }
    };
    const uint64_t now = uv_now(connection_->loop());
    const bool recent_acks = last_ack_ms_ != 0 && now - last_ack_ms_ < kAckGraceMs;
    if (!recent_acks) return close();
    grace_close_ = std::move(close);
    close_after(kAckGraceMs - (now - last_ack_ms_));
    if (done_before_grace_ && !error && held_ == 0) tell_before_grace(channels);
    return;
  }
  finish();
}

void Walker::close_after(uint64_t delay_ms) {
  uv_timer_stop(&timer_);
  uv_timer_start(
      &timer_,
      [](uv_timer_t* timer) {
        auto* walker = static_cast<Walker*>(timer->data);
        if (auto close = std::move(walker->grace_close_)) close();
      },
      delay_ms, 0);
}

void Walker::tell_before_grace(const std::vector<std::shared_ptr<client::Channel>>& channels) {
  std::shared_ptr<Walker> self = shared_from_this();
  // The grace no longer keeps the loop running, and a close of the connection (or any end of a
  // channel) ends it at once.
  uv_unref(reinterpret_cast<uv_handle_t*>(&timer_));
  std::weak_ptr<Walker> weak = self;
  for (const auto& channel : channels) {
    channel->set_close_handler([weak](const Error&) {
      auto self = weak.lock();
      if (!self || !self->grace_close_) return;
      uv_ref(reinterpret_cast<uv_handle_t*>(&self->timer_));
      self->close_after(0);
    });
  }
  auto tell = [self] {
    if (self->unread_ > 0) return;  // held until the close, which `done` then waits for
    DoneCallback done = std::move(self->done_);
    if (done) done({}, self->progress_, self->interrupted_);
  };
  if (!consuming_ || !channel_ || !channel_->is_open()) return tell();
  // After the cancel-ok no delivery comes: those that came after the reading ended are counted.
  Error error = channel_->cancel(consumer_tag_, [tell](const Error& error) {
    if (!error) tell();
  });
  static_cast<void>(error);  // the close after the grace, then `done`, as without this option
}

void Walker::await_returns(std::function<void()> finish) {
  returns_finish_ = std::move(finish);
  expected_depth_ = progress_.total > progress_.moved ? progress_.total - progress_.moved : 0;
  returns_deadline_ms_ = uv_now(connection_->loop()) + kReturnsWaitMs;
  check_returns();
}

void Walker::check_returns() {
  if (!connection_->is_open()) return finish_returns();
  std::weak_ptr<Walker> weak = weak_from_this();
  client::look_up_queue(
      connection_, queue_, [weak](const Error& error, const client::QueueInfo& info) {
        auto self = weak.lock();
        if (!self) return;
        const uint64_t now = uv_now(self->connection_->loop());
        if (error || info.message_count >= self->expected_depth_ ||
            now >= self->returns_deadline_ms_) {
          return self->finish_returns();
        }
        if (info.message_count > self->returned_depth_) {
          self->returned_depth_ = info.message_count;
          self->returns_deadline_ms_ = now + kReturnsWaitMs;
        }
        uv_timer_stop(&self->timer_);
        uv_timer_start(
            &self->timer_,
            [](uv_timer_t* timer) { static_cast<Walker*>(timer->data)->check_returns(); },
            kReturnsPollMs, 0);
      });
}

void Walker::finish_returns() {
  auto finish = std::move(returns_finish_);
  if (finish) finish();
}

void Walker::on_tick() {
  if (!reported_ && probing_ && uv_now(connection_->loop()) - probe_started_ms_ >= kProbeWaitMs) {
    return probe_unanswered(
        Error(MoveError::queue_unanswered,
              "no answer within " + std::to_string(kProbeWaitMs / 1000) + " s"));
  }
  if (!reported_ && count_again_) {
    count_again_ = false;
    return count_queue();
  }
  if (reported_ || !consuming_ || reading_done_ || publishes_in_flight_ > 0 || checking_idle_) {
    return;
  }
  if (uv_now(connection_->loop()) - last_activity_ms_ >= kIdleMs) check_idle();
}

void Walker::check_idle() {
  checking_idle_ = true;
  look_up([this](const client::QueueInfo& info) {
    checking_idle_ = false;
    if (info.message_count == 0 || ++idle_checks_ >= 10) return finish_reading();
    last_activity_ms_ = uv_now(connection_->loop());
  });
}

}  // namespace detail

client::Error QueueWalker::start(const std::shared_ptr<client::Connection>& connection,
                                 WalkOptions options, Visitor visitor, DoneCallback done,
                                 std::shared_ptr<QueueWalker>* handle) {
  return detail::Walker::start(connection, std::move(options), std::move(visitor), std::move(done),
                               handle);
}

}  // namespace retryloop::move
