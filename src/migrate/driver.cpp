#include "retryloop/migrate/driver.hpp"

#include <uv.h>

#include <chrono>
#include <iterator>
#include <optional>
#include <utility>

#include "retryloop/client/channel.hpp"
#include "retryloop/client/timer.hpp"
#include "retryloop/migrate/copied_log.hpp"
#include "retryloop/move/queue_mover.hpp"
#include "retryloop/random/os_random.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/duration.hpp"

namespace retryloop::migrate {
namespace {

using client::Error;

/// The broker's answer when another connection holds an exclusive queue.
constexpr uint16_t resource_locked = 405;
constexpr uint16_t not_found = 404;

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

amqp::BasicProperties record_properties() {
  amqp::BasicProperties properties;
  properties.content_type = "application/json";
  properties.delivery_mode = 2;
  properties.type = "retryloop.migration.record";
  return properties;
}

ObjectFound object_of(const topology::ActionResult& result) {
  ObjectFound object;
  object.name = result.action.name;
  object.messages = result.messages.value_or(0);
  object.consumers = result.consumers.value_or(0);
  switch (result.outcome) {
    case topology::Outcome::missing:
      object.found = Found::missing;
      break;
    case topology::Outcome::drifted:
      object.found = Found::differs;
      if (result.drift) object.argument = result.drift->argument;
      break;
    default:
      object.found = Found::matches;
      break;
  }
  return object;
}

class DriverImpl final : public Driver {
 private:
  template <class Next>
  auto guarded(Next next) {
    return [weak = weak_from_this(), next](auto&&... args) {
      auto self = std::static_pointer_cast<DriverImpl>(weak.lock());
      if (!self || self->ended_) return;
      next(*self, std::forward<decltype(args)>(args)...);
    };
  }

 public:
  DriverImpl(std::shared_ptr<client::Connection> connection, topology::Service service,
             DriverOptions options, DriverEvents events, DriverDone done)
      : connection_(std::move(connection)),
        service_(std::move(service)),
        options_(std::move(options)),
        events_(std::move(events)),
        done_(std::move(done)) {}

  void begin() {
    client::take_queue_lock(
        connection_, lock_queue_name(service_.name), options_.lock_wait,
        guarded([](DriverImpl& self, const Error& error) {
          if (error.reply_code == resource_locked) {
            return self.finish(Error(client::ClientError::channel_closed,
                                     "another `retryloop topology migrate` of " +
                                         self.service_.name + " is running (it holds " +
                                         lock_queue_name(self.service_.name) + ", and has for " +
                                         topology::duration_label(self.options_.lock_wait) + ")"));
          }
          if (error) return self.finish(error);
          self.open_channel();
        }));
  }

  void stop() override { stopping_ = true; }

 private:
  void open_channel() {
    Error error = connection_->open_channel(
        guarded([](DriverImpl& self, const Error& error, std::shared_ptr<client::Channel> channel) {
          if (error) return self.finish(error);
          self.channel_ = std::move(channel);
          Error selected =
              self.channel_->confirm_select(self.guarded([](DriverImpl& self, const Error& error) {
                if (error) return self.finish(error);
                self.declare_record_objects();
              }));
          if (selected) self.finish(selected);
        }));
    if (error) finish(error);
  }

  void declare_record_objects() {
    Error error = migrate::declare_record_objects(channel_, service_.name,
                                                  guarded([](DriverImpl& self, const Error& error) {
                                                    if (error) return self.finish(error);
                                                    self.read_existing_record();
                                                  }));
    if (error) finish(error);
  }

  void read_existing_record() {
    Error error = read_record(
        connection_, service_.name,
        guarded([](DriverImpl& self, const Error& error, const std::optional<Record>& record) {
          if (error) return self.finish(error);
          if (record && !record->finished) return self.resume(*record);
          self.survey_broker();
        }));
    if (error) finish(error);
  }

  void resume(const Record& record) {
    std::string why;
    auto migration = Migration::resume(make_migration_plan(service_, record.survey), record, why);
    if (!migration) return finish(Error(client::ClientError::invalid_argument, why));
    migration_.emplace(std::move(*migration));
    if (events_.planned) events_.planned(*migration_, true);
    run_next();
  }

  void survey_broker() {
    Error error = survey(
        connection_, service_, options_.old_delays,
        guarded([](DriverImpl& self, const Error& error, const Survey& survey) {
          if (error) return self.finish(error);
          MigrationPlan plan = make_migration_plan(self.service_, survey);
          if (!plan.refused.empty()) {
            self.migration_.emplace(std::move(plan), std::string(), survey, wall_ms());
            return self.finish(Error{}, true);
          }
          std::string id = self.options_.id;
          if (id.empty()) {
            std::error_code random_error;
            id = random::random_id(random_error).substr(0, 12);
            if (random_error) {
              return self.finish(Error(client::ClientError::invalid_argument,
                                       "no migration id: getrandom: " + random_error.message()));
            }
          }
          self.migration_.emplace(std::move(plan), std::move(id), survey, wall_ms());
          if (self.events_.planned) self.events_.planned(*self.migration_, false);
          if (self.migration_->plan().empty()) return self.finish(Error{});
          self.publish_record([](DriverImpl& self) { self.run_next(); });
        }));
    if (error) finish(error);
  }

  /// Publishes the record through N.migration (the record queue keeps the newest), confirmed.
  void publish_record(void (*next)(DriverImpl& self)) {
    Error error =
        channel_->publish(record_queue_name(service_.name), "", record_properties(),
                          encode_record(migration_->record()), client::Mandatory::yes,
                          guarded([next](DriverImpl& self, const client::PublishOutcome& outcome) {
                            if (!outcome.ok()) return self.finish(outcome.error);
                            next(self);
                          }));
    if (error) finish(error);
  }

  std::chrono::milliseconds now() const {
    return std::chrono::milliseconds(uv_now(connection_->loop()));
  }

  void run_next() {
    if (stopping_) {
      return finish(Error(client::ClientError::closed_by_client,
                          "stopped; run `retryloop topology migrate` again to finish"));
    }
    const Step* step = migration_->current();
    if (step == nullptr) return forget_copied();
    if (const auto at = migration_->wake_at(); at && *at > now()) {
      client::run_after(connection_->loop(), *at - now(),
                        guarded([](DriverImpl& self) { self.run_next(); }));
      return;
    }
    if (events_.step_started && !migration_->wake_at()) events_.step_started(*migration_, *step);
    run(*step);
  }

  /// Every step is done: the log of what the moves back copied is of no more use.
  void forget_copied() {
    Error error =
        channel_->queue_delete(topology::migration_copied_queue_name(service_.name), false, false,
                               guarded([](DriverImpl& self, const Error& error, uint32_t) {
                                 // Left behind, it does no harm: a later migration reads only its
                                 // own entries.
                                 static_cast<void>(error);
                                 self.finish(Error{});
                               }));
    if (error) finish(Error{});
  }

  /// The step is done: record it, then go on.
  void step_done() {
    migration_->done(wall_ms());
    publish_record([](DriverImpl& self) {
      const size_t index = self.migration_->current_index() - 1;
      if (self.events_.step_done) {
        self.events_.step_done(*self.migration_, self.migration_->plan().steps[index]);
      }
      self.run_next();
    });
  }

  void run(const Step& step) {
    Error error;
    auto completed = guarded([](DriverImpl& self, const Error& error) {
      if (error) return self.finish(error);
      self.step_done();
    });
    switch (step.kind) {
      case StepKind::declare_queue: {
        client::QueueOptions options;
        options.durable = step.action.durable;
        options.arguments = step.action.arguments;
        error = channel_->queue_declare(
            step.queue, options,
            [completed](const Error& error, const client::QueueInfo&) { completed(error); });
        break;
      }
      case StepKind::bind_queue:
        error = channel_->queue_bind(step.queue, step.action.exchange, step.action.routing_key,
                                     step.action.arguments, completed);
        break;
      case StepKind::unbind_queue:
        error = channel_->queue_unbind(step.queue, step.action.exchange, step.action.routing_key,
                                       step.action.arguments, completed);
        break;
      case StepKind::move_binding: {
        // The unbind goes out as soon as the bind is confirmed: no record in between.
        auto unbind = [completed](DriverImpl& self) {
          const Step& step = *self.migration_->current();
          Error error = self.channel_->queue_unbind(
              step.target, step.action.exchange, step.action.routing_key, step.action.arguments,
              [completed](const Error& error) { completed(error); });
          if (error) self.finish(error);
        };
        error = channel_->queue_bind(step.queue, step.action.exchange, step.action.routing_key,
                                     step.action.arguments,
                                     guarded([unbind](DriverImpl& self, const Error& error) {
                                       if (error) return self.finish(error);
                                       unbind(self);
                                     }));
        break;
      }
      case StepKind::announce: {
        // The record published after the step says it (Record::holding). The instances that
        // follow it consume the settling queue while they settle what they took from the queue
        // they leave, so it is there first.
        client::QueueOptions settling;
        error = channel_->queue_declare(
            settling_queue_name(service_.name), settling,
            [completed](const Error& error, const client::QueueInfo&) { completed(error); });
        break;
      }
      case StepKind::move:
        return move(step.queue, step.target);
      case StepKind::drain:
      case StepKind::delete_queue:
        return look_up(step);
    }
    if (error) finish(error);
  }

  /// options_.move, or the move layer's, telling events_.moving how far it is.
  MoveFunction move_function() {
    if (options_.move) return options_.move;
    return mover([weak = std::weak_ptr<DriverImpl>(self_)](uint64_t moved, uint64_t total) {
      auto self = weak.lock();
      if (!self || self->ended_ || !self->events_.moving || !self->migration_->current()) return;
      self->events_.moving(*self->migration_, *self->migration_->current(), moved, total);
    });
  }

  /// A move request of the migration's: back into a queue the migration made again, a stamp seen
  /// twice is moved once.
  MoveRequest move_request(const std::string& from, const std::string& to) {
    MoveRequest request;
    request.from = from;
    request.to = to;
    request.stamp_prefix = migration_->record().id;
    request.deduplicate = from == holding_queue_name(to);
    if (request.deduplicate) request.service = service_.name;
    return request;
  }

  void move(const std::string& from, const std::string& to) {
    Error error = move_function()(
        connection_, move_request(from, to),
        guarded([](DriverImpl& self, const Error& error, const MoveResult& result) {
          self.migration_->moved(result.moved);
          if (self.events_.moved) {
            self.events_.moved(*self.migration_, *self.migration_->current(), result.moved);
          }
          if (error) return self.finish(error);
          if (result.failed > 0) {
            return self.finish(Error(client::ClientError::invalid_argument,
                                     "the broker refused " + std::to_string(result.failed) +
                                         " copies; their messages are still in " +
                                         self.migration_->current()->queue +
                                         "; run the migration again"));
          }
          self.step_done();
        }));
    if (error) finish(error);
  }

  void look_up(const Step& step) {
    client::QueueOptions passive;
    passive.passive = true;
    const std::string queue = step.queue;
    Error error = channel_->queue_declare(
        queue, passive,
        guarded([](DriverImpl& self, const Error& error, const client::QueueInfo& info) {
          const Step& step = *self.migration_->current();
          if (error.reply_code == not_found) {
            // Gone already (deleted before a kill): the passive declare closed the channel.
            return self.reopen([](DriverImpl& self) { self.step_done(); });
          }
          if (error) return self.finish(error);
          if (info.message_count == 0 && info.consumer_count == 0) {
            if (step.kind == StepKind::delete_queue) return self.delete_queue(step);
            if (step.delay.count() > 0) return self.step_done();
            return self.look_up_settling();
          }
          self.busy(step, info.message_count, info.consumer_count);
        }));
    if (error) finish(error);
  }

  /// A service queue drained of messages and consumers: done once no instance that left it still
  /// settles what it took from it (each consumes the settling queue until then).
  void look_up_settling() {
    client::QueueOptions passive;
    passive.passive = true;
    Error error = channel_->queue_declare(
        settling_queue_name(service_.name), passive,
        guarded([](DriverImpl& self, const Error& error, const client::QueueInfo& info) {
          if (error.reply_code == not_found) {
            // No instance has followed an announce (none runs, or the plan has none).
            return self.reopen([](DriverImpl& self) { self.step_done(); });
          }
          if (error) return self.finish(error);
          if (info.consumer_count == 0) return self.step_done();
          self.busy(*self.migration_->current(), 0, info.consumer_count, true);
        }));
    if (error) finish(error);
  }

  /// A queue to drain or delete still holds messages or has consumers; `settling`: it has neither,
  /// and `consumers` instances still settle deliveries they took from it.
  void busy(const Step& step, uint64_t messages, uint32_t consumers, bool settling = false) {
    const size_t index = migration_->current_index();
    const Step* before = index > 0 ? &migration_->plan().steps[index - 1] : nullptr;
    if (step.kind == StepKind::drain && !settling && consumers == 0 && messages > 0 &&
        before != nullptr && before->kind == StepKind::move && before->queue == step.queue) {
      // Messages its consumers gave back after the move read it: moved again.
      return move_leftovers(before->queue, before->target);
    }
    if (events_.waiting) events_.waiting(*migration_, step, messages, consumers);
    if (migration_->overdue(wall_ms(), options_.consumers_grace)) {
      const std::string waited = topology::duration_label(migration_->draining_for(wall_ms()));
      if (settling) {
        return finish(Error(client::ClientError::invalid_argument,
                            std::to_string(consumers) + " instances still settle deliveries " +
                                "they took from " + step.queue + " after " + waited +
                                " (each consumes " + settling_queue_name(service_.name) +
                                " until it has): run the migration again once their handlers " +
                                "have returned"));
      }
      return finish(Error(
          client::ClientError::invalid_argument,
          step.queue + " still has " + std::to_string(messages) + " messages and " +
              std::to_string(consumers) + " consumers after " + waited +
              (step.delay.count() > 0
                   ? ": something else still routes to it"
                   : ": instances that do not follow the migration consume it; stop them, then "
                     "run the migration again to finish it")));
    }
    migration_->not_yet(now(), wall_ms());
    run_next();
  }

  void move_leftovers(const std::string& from, const std::string& to) {
    Error error =
        move_function()(connection_, move_request(from, to),
                        guarded([](DriverImpl& self, const Error& error, const MoveResult& result) {
                          self.migration_->moved(result.moved);
                          if (error) return self.finish(error);
                          self.migration_->not_yet(self.now(), wall_ms());
                          self.run_next();
                        }));
    if (error) finish(error);
  }

  void delete_queue(const Step& step) {
    // Looked up empty and unused just now. RabbitMQ refuses if-empty and if-unused for quorum
    // queues, closing the connection; those rely on the look-up (the queue is unbound, and its
    // consumers are gone).
    const bool careful = !step.quorum;
    Error error = channel_->queue_delete(
        step.queue, careful, careful, guarded([](DriverImpl& self, const Error& error, uint32_t) {
          if (error.reply_code == 406) {
            // Not empty or not unused after all: look again.
            return self.reopen([](DriverImpl& self) {
              self.migration_->not_yet(self.now(), wall_ms());
              self.run_next();
            });
          }
          if (error) return self.finish(error);
          self.step_done();
        }));
    if (error) finish(error);
  }

  /// A passive look-up or a careful delete that the broker refused closed the channel: a new one
  /// in confirm mode, then `next`.
  void reopen(void (*next)(DriverImpl& self)) {
    Error error = connection_->open_channel(guarded(
        [next](DriverImpl& self, const Error& error, std::shared_ptr<client::Channel> channel) {
          if (error) return self.finish(error);
          self.channel_ = std::move(channel);
          Error selected =
              self.channel_->confirm_select(self.guarded([next](DriverImpl& self, const Error& e) {
                if (e) return self.finish(e);
                next(self);
              }));
          if (selected) self.finish(selected);
        }));
    if (error) finish(error);
  }

  void finish(const Error& error, bool refused = false) {
    if (ended_) return;
    ended_ = true;
    if (channel_ && channel_->is_open()) static_cast<void>(channel_->close());
    DriverDone done = std::move(done_);
    if (done) done(error, migration_ ? &*migration_ : nullptr, refused);
    self_.reset();
  }

 public:
  std::shared_ptr<DriverImpl> self_;

 private:
  std::shared_ptr<client::Connection> connection_;
  topology::Service service_;
  DriverOptions options_;
  DriverEvents events_;
  DriverDone done_;
  std::shared_ptr<client::Channel> channel_;
  std::optional<Migration> migration_;
  bool stopping_ = false;
  bool ended_ = false;
};

/// Reads the record queue on a channel of its own: the newest record, requeued.
/// How long an empty read of the record queue waits before it reads again: another reader (an
/// instance starting, `service status`) holds its message for a round trip.
constexpr std::chrono::milliseconds empty_read_delays[] = {
    std::chrono::milliseconds(50), std::chrono::milliseconds(100), std::chrono::milliseconds(200)};

struct RecordReader : std::enable_shared_from_this<RecordReader> {
  std::shared_ptr<client::Channel> channel;
  uv_loop_t* loop = nullptr;
  std::string queue;
  RecordCallback done;
  std::optional<Record> last;
  uint64_t last_tag = 0;
  int read = 0;
  size_t empty_reads = 0;

  void next() {
    if (read++ == 8) return finish();
    Error error = channel->get(
        queue, false,
        [self = shared_from_this()](const Error& error, std::optional<client::GetResult>&& got) {
          if (error.reply_code == not_found) return self->end(Error{});
          if (error) return self->end(error);
          if (!got) return self->empty();
          self->last_tag = got->delivery_tag;
          std::string why;
          if (auto record = decode_record(got->message.body, why)) self->last = std::move(record);
          self->next();
        });
    if (error) end(error);
  }

  void empty() {
    if (last_tag != 0 || empty_reads == std::size(empty_read_delays)) return finish();
    client::run_after(loop, empty_read_delays[empty_reads++], [self = shared_from_this()] {
      if (!self->channel->is_open()) {
        return self->end(Error(client::ClientError::not_open, "the channel closed"));
      }
      self->read = 0;
      self->next();
    });
  }

  void finish() {
    if (last_tag != 0) static_cast<void>(channel->nack(last_tag, true, true));
    end(Error{});
  }

  void end(const Error& error) {
    RecordCallback callback = std::move(done);
    if (channel->is_open()) static_cast<void>(channel->close());
    if (callback) callback(error, error ? std::nullopt : last);
  }
};

}  // namespace

MoveFunction mover(MoveProgress progress) {
  return
      [progress](const std::shared_ptr<client::Connection>& connection, const MoveRequest& request,
                 std::function<void(const client::Error& error, const MoveResult& result)> done) {
        move::MoveOptions options;
        if (progress) {
          options.on_progress = [progress](const move::Progress& at) {
            progress(at.moved + at.duplicates, at.total);
          };
        }
        options.from = request.from;
        options.routing_key = request.to;
        options.stamp_header = std::string(stamp_header);
        // A message with a message id gets the same stamp in every run and from every queue, so
        // that the copy a killed run made and the rerun's, or the two copies a binding move routed
        // to both queues, are one on the way back. Any other gets a prefix of its own per
        // run: the count restarts with each run, and deduplication must never take two messages
        // for one (docs/migrate.md, "Resuming").
        std::error_code random_error;
        std::string run = random::random_id(random_error).substr(0, 8);
        if (random_error)
          run = std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
        options.stamp_prefix = request.stamp_prefix + "/" + request.from + "/" + run;
        options.stable_prefix = request.stamp_prefix;
        options.deduplicate = request.deduplicate;
        // Every move of a migration is followed by a wait until its queue is empty, which moves
        // again what comes back, and by the queue's delete.
        options.done_before_grace = true;
        auto moved = [done](const client::Error& error, const move::Progress& progress, bool) {
          done(error, MoveResult{progress.moved, progress.failed});
        };
        if (request.service.empty()) return move::move_queue(connection, std::move(options), moved);
        // A move back: what an earlier run copied is not copied again, and what this one copies is
        // logged before its originals are acked.
        return CopiedLog::open(
            connection, request.service, request.stamp_prefix, request.to,
            [connection, options = std::move(options), moved](
                const client::Error& error, std::shared_ptr<CopiedLog> log,
                std::vector<std::string> copied) mutable {
              if (error) return moved(error, move::Progress{}, false);
              options.copied_before = std::move(copied);
              options.copied = [log](std::vector<std::string> stamps,
                                     std::function<void(const client::Error&)> recorded) {
                log->append(stamps, std::move(recorded));
              };
              client::Error started =
                  move::move_queue(connection, std::move(options),
                                   [log, moved](const client::Error& error,
                                                const move::Progress& progress, bool interrupted) {
                                     log->close();
                                     moved(error, progress, interrupted);
                                   });
              if (started) {
                log->close();
                moved(started, move::Progress{}, false);
              }
            });
      };
}

client::Error survey(const std::shared_ptr<client::Connection>& connection,
                     const topology::Service& service,
                     const std::vector<std::chrono::milliseconds>& old_delays,
                     SurveyCallback done) {
  topology::Topology single;
  single.services = {service};
  topology::Plan plan = topology::make_plan(single);
  // The levels the file no longer has: looked up (a passive declare makes nothing).
  std::vector<std::string> stale;
  for (std::chrono::milliseconds delay : old_delays) {
    const std::string name = topology::wait_queue_name(service.name, delay);
    bool kept = false;
    for (const topology::Action& action : plan.actions)
      kept = kept || (action.kind == topology::ActionKind::declare_queue && action.name == name);
    if (kept) continue;
    stale.push_back(name);
    topology::Action look;
    look.kind = topology::ActionKind::check_queue;
    look.role = topology::Role::wait_queue;
    look.services = {service.name};
    look.name = name;
    plan.actions.push_back(std::move(look));
  }
  const topology::Service described = service;
  return topology::verify(
      connection, plan,
      [described, stale, done](const topology::Report& report) {
        if (report.connection_error) return done(report.connection_error, Survey{});
        Survey survey;
        const std::string queue = topology::input_queue_name(described);
        const std::string parking = topology::parking_queue_name(described.name);
        for (const topology::ActionResult& result : report.results) {
          const topology::Action& action = result.action;
          if (result.outcome == topology::Outcome::failed) {
            return done(result.error, Survey{});
          }
          if (action.kind == topology::ActionKind::declare_exchange) {
            survey.exchanges.push_back(object_of(result));
          } else if (action.kind == topology::ActionKind::check_queue) {
            if (result.outcome != topology::Outcome::missing) {
              ObjectFound object = object_of(result);
              object.found = Found::matches;
              survey.stale_wait_queues.push_back(std::move(object));
            }
          } else if (action.kind == topology::ActionKind::declare_queue) {
            if (action.name == queue) {
              survey.service_queue = object_of(result);
            } else if (action.name == parking) {
              survey.parking_queue = object_of(result);
            } else if (action.role == topology::Role::wait_queue) {
              survey.wait_queues.push_back(object_of(result));
            }
          }
        }
        done(client::Error{}, survey);
      },
      topology::VerifyOptions{});
}

std::shared_ptr<Driver> Driver::start(const std::shared_ptr<client::Connection>& connection,
                                      topology::Service service, DriverOptions options,
                                      DriverEvents events, DriverDone done) {
  auto driver = std::make_shared<DriverImpl>(connection, std::move(service), std::move(options),
                                             std::move(events), std::move(done));
  driver->self_ = driver;  // lives until it has finished
  driver->begin();
  return driver;
}

client::Error declare_record_exchange(const std::shared_ptr<client::Channel>& channel,
                                      const std::string& service_name,
                                      client::CompletionCallback done) {
  return channel->exchange_declare(record_queue_name(service_name), "fanout",
                                   client::ExchangeOptions{}, std::move(done));
}

client::Error declare_record_objects(const std::shared_ptr<client::Channel>& channel,
                                     const std::string& service_name,
                                     client::CompletionCallback done) {
  const std::string name = record_queue_name(service_name);
  return declare_record_exchange(channel, service_name, [channel, name, done](const Error& error) {
    if (error) return done(error);
    client::QueueOptions options;
    options.arguments.append("x-max-length", amqp::FieldValue(int64_t(1)));
    options.arguments.append("x-overflow", amqp::FieldValue(std::string("drop-head")));
    Error declared = channel->queue_declare(
        name, options, [channel, name, done](const Error& error, const client::QueueInfo&) {
          if (error) return done(error);
          Error bound = channel->queue_bind(name, name, "", {}, done);
          if (bound) done(bound);
        });
    if (declared) done(declared);
  });
}

client::Error read_record(const std::shared_ptr<client::Connection>& connection,
                          const std::string& service_name, RecordCallback done) {
  auto reader = std::make_shared<RecordReader>();
  reader->queue = record_queue_name(service_name);
  reader->loop = connection->loop();
  reader->done = std::move(done);
  return connection->open_channel(
      [reader](const client::Error& error, std::shared_ptr<client::Channel> channel) {
        if (error) {
          RecordCallback callback = std::move(reader->done);
          if (callback) callback(error, std::nullopt);
          return;
        }
        reader->channel = std::move(channel);
        reader->next();
      });
}

}  // namespace retryloop::migrate
