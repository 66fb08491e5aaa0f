#include "retryloop/schedule/stats.hpp"

#include <algorithm>
#include <utility>

#include "retryloop/client/channel.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/schedule/scheduler.hpp"
#include "retryloop/topology/delay_levels.hpp"

namespace retryloop::schedule {

namespace {

constexpr uint16_t not_found = 404;
constexpr uint16_t access_refused = 403;

/// Counts the queues one after another, reopening the channel a refused declare closed.
class StatsRun : public std::enable_shared_from_this<StatsRun> {
 public:
  StatsRun(std::shared_ptr<client::Connection> connection, const topology::Schedule& schedule,
           bool peek_heads, StatsCallback done)
      : connection_(std::move(connection)),
        schedule_(schedule),
        // A read hands the message back, and a quorum queue may count that toward its delivery
        // limit, past which it dead-letters the message to the level below: early.
        peek_heads_(peek_heads && schedule.queue_type == topology::QueueType::classic),
        done_(std::move(done)) {
    stats_.heads_read = peek_heads_;
    const topology::Service levels = topology::schedule_target(schedule, std::string());
    stats_.set = topology::delay_set_name(levels);
    unrouted_ = topology::delay_unrouted_name(levels);
    for (int k = 0; k < schedule.levels.levels; ++k) {
      LevelDepth level;
      level.level = k;
      level.queue = topology::delay_level_name(levels, k);
      level.holds = schedule.levels.base * (int64_t(1) << k);
      stats_.levels.push_back(std::move(level));
    }
  }

  void start() {
    with_channel([self = shared_from_this()] { self->next(); });
  }

 private:
  size_t steps() const { return stats_.levels.size() + 1 + schedule_.queues.size(); }

  void with_channel(std::function<void()> then) {
    if (channel_ && channel_->is_open()) return then();
    auto self = shared_from_this();
    client::Error error = connection_->open_channel(
        [self, then = std::move(then)](const client::Error& error,
                                       std::shared_ptr<client::Channel> channel) {
          if (error) return self->finish(error);
          self->channel_ = std::move(channel);
          then();
        });
    if (error) finish(error);
  }

  void next() {
    if (step_ == steps()) return finish({});
    const size_t levels = stats_.levels.size();
    const std::string& queue = step_ < levels    ? stats_.levels[step_].queue
                               : step_ == levels ? unrouted_
                                                 : schedule_.queues[step_ - levels - 1];
    client::QueueOptions options;
    options.passive = true;
    auto self = shared_from_this();
    client::Error error = channel_->queue_declare(
        queue, options, [self](const client::Error& error, const client::QueueInfo& info) {
          self->counted(error, info);
        });
    if (error) finish(error);
  }

  void counted(const client::Error& error, const client::QueueInfo& info) {
    const size_t levels = stats_.levels.size();
    const bool scheduled_queue = step_ > levels;
    if (error && scheduled_queue &&
        (error.reply_code == not_found || error.reply_code == access_refused)) {
      stats_.queues_not_counted.emplace_back(schedule_.queues[step_ - levels - 1],
                                             error.reply_text);
      return advance();
    }
    if (error) return finish(error);
    if (step_ < levels) {
      stats_.levels[step_].messages = info.message_count;
      stats_.waiting += info.message_count;
      if (peek_heads_ && info.message_count > 0) return peek(stats_.levels[step_].queue);
    } else if (step_ == levels) {
      stats_.unrouted = info.message_count;
    } else {
      stats_.queues.emplace_back(schedule_.queues[step_ - levels - 1], info.message_count);
    }
    advance();
  }

  void peek(const std::string& queue) {
    auto self = shared_from_this();
    client::Error error = channel_->get(
        queue, false,
        [self](const client::Error& error, std::optional<client::GetResult>&& result) {
          if (error) return self->finish(error);
          if (result) {
            self->note_head(result->message.properties);
            // Handed back at once; a classic queue has no delivery limit to count it toward.
            if (client::Error nack = self->channel_->nack(result->delivery_tag, false, true)) {
              return self->finish(nack);
            }
          }
          self->advance();
        });
    if (error) finish(error);
  }

  void note_head(const amqp::BasicProperties& properties) {
    if (!properties.headers) return;
    const amqp::FieldValue* due = properties.headers->find(header::due_at);
    if (due == nullptr) due = properties.headers->find(retry::header::retry_due);
    if (due == nullptr) return;
    auto at = due->as_int64();
    if (!at) return;
    stats_.levels[step_].head_due_at_ms = *at;
    stats_.earliest_head_due_at_ms = std::min(stats_.earliest_head_due_at_ms.value_or(*at), *at);
  }

  void advance() {
    ++step_;
    with_channel([self = shared_from_this()] { self->next(); });
  }

  void finish(const client::Error& error) {
    if (!done_) return;
    auto done = std::move(done_);
    done_ = nullptr;
    if (channel_ && channel_->is_open()) (void)channel_->close();
    done(error, stats_);
  }

  std::shared_ptr<client::Connection> connection_;
  topology::Schedule schedule_;
  bool peek_heads_;
  StatsCallback done_;
  std::shared_ptr<client::Channel> channel_;
  std::string unrouted_;
  ScheduleStats stats_;
  size_t step_ = 0;
};

}  // namespace

client::Error stats(const std::shared_ptr<client::Connection>& connection,
                    const topology::Schedule& schedule, bool peek_heads, StatsCallback done) {
  if (!connection) return client::Error(client::ClientError::invalid_argument, "no connection");
  std::make_shared<StatsRun>(connection, schedule, peek_heads, std::move(done))->start();
  return {};
}

}  // namespace retryloop::schedule
