#include "session.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "retryloop/client/timer.hpp"
#include "retryloop/consumer/error.hpp"
#include "retryloop/migrate/driver.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/plan.hpp"

namespace retryloop::consumer::detail {
namespace {

using client::ClientError;
using client::Error;

/// Errors that reconnecting cannot fix: the consumer stops instead of looping. (A 406 is fatal
/// only on declare, where it means drift; later it ends the session like any channel error.)
bool is_fatal(const Error& error) {
  return error.code == make_error_code(ClientError::authentication_failed) ||
         error.code == make_error_code(ClientError::vhost_refused) ||
         error.code == make_error_code(ClientError::tls_failed) ||
         error.code == make_error_code(ConsumerError::topology_drift) ||
         error.code == make_error_code(ConsumerError::broker_too_old) || error.reply_code == 403;
}

/// What one result of a declare report says is wrong, naming the object; empty when nothing is.
std::string problem_text(const topology::ActionResult& result) {
  const std::string object = topology::describe(result.action);
  switch (result.outcome) {
    case topology::Outcome::drifted:
      if (result.drift) {
        return object + " exists with other arguments: " + result.drift->argument + " is " +
               result.drift->actual + " on the broker, the topology wants " + result.drift->wanted;
      }
      return object + " exists with other arguments: " + result.error.message();
    case topology::Outcome::failed:
      return object + ": " + result.error.reply_text;
    case topology::Outcome::missing:
      return object + " does not exist (it is declared elsewhere)";
    default:
      return {};
  }
}

/// The problems of a declare report as one error: the first one's kind, every object named (a
/// file that drifted from the broker seldom drifted in one queue only).
Error declare_problem(const topology::Report& report) {
  const topology::ActionResult* first = nullptr;
  std::string text;
  for (const auto& result : report.results) {
    std::string problem = problem_text(result);
    if (problem.empty()) continue;
    if (first == nullptr) first = &result;
    text += (text.empty() ? "" : "; ") + problem;
  }
  if (first == nullptr) return report.connection_error;
  switch (first->outcome) {
    case topology::Outcome::drifted:
      return Error(ConsumerError::topology_drift,
                   text + " (fix the broker or the file; nothing was changed)");
    case topology::Outcome::missing:
      return Error(ConsumerError::topology_missing, text);
    default: {
      Error error = first->error;
      error.reply_text = text;
      return error;
    }
  }
}

void log_declared(spdlog::logger* log, const std::string& service, const topology::Report& report) {
  if (log == nullptr) return;
  for (const auto& result : report.results) {
    if (result.outcome == topology::Outcome::created) {
      log->info("service={} created {}", service, topology::describe(result.action));
    }
    for (const auto& missing : result.defaults_missing) {
      log->warn(
          "service={} {} was declared without {} (new ones get {}); used as it is, see "
          "docs/topology.md, \"Older queues\"",
          service, topology::describe(result.action), missing.argument, missing.wanted);
    }
  }
}

}  // namespace

std::shared_ptr<Session> Session::start(uv_loop_t* loop, const ConsumerOptions& options,
                                        uint64_t generation, SessionEvents events) {
  std::shared_ptr<Session> session(new Session(options, generation, std::move(events)));
  session->connect(loop);
  return session;
}

Session::Session(const ConsumerOptions& options, uint64_t generation, SessionEvents events)
    : options_(options),
      generation_(generation),
      events_(std::move(events)),
      follower_(options.service.name, topology::input_queue_name(options.service)) {}

template <class Next>
auto Session::guarded(Next next) {
  return [weak = weak_from_this(), next](auto&&... args) {
    auto self = weak.lock();
    if (!self || self->ended_) return;
    next(*self, std::forward<decltype(args)>(args)...);
  };
}

template <class Next>
auto Session::then(Next next) {
  return guarded([next](Session& self, const Error& error, auto&&... args) {
    if (error) return self.fail(error);
    next(self, std::forward<decltype(args)>(args)...);
  });
}

void Session::check(const Error& error) {
  if (error) fail(error);
}

void Session::fail(const Error& error) {
  fail(error, is_fatal(error));
}

void Session::fail(const Error& error, bool fatal) {
  if (ended_) return;
  ended_ = true;
  if (events_.failed) events_.failed(error, fatal);
}

void Session::watch(const std::shared_ptr<client::Channel>& channel) {
  channel->set_close_handler(guarded([](Session& self, const Error& error) { self.fail(error); }));
}

void Session::close(std::function<void()> done) {
  ended_ = true;
  if (migration_watch_) migration_watch_->close();
  for (const auto& weak : marks_) {
    if (auto mark = weak.lock()) mark->settled = nullptr;
  }
  auto remaining = std::make_shared<int>(2);
  auto closed = [remaining, done = std::move(done)](const Error&) {
    if (--*remaining == 0 && done) done();
  };
  consume_connection_->close(closed);
  publish_connection_->close(closed);
}

// ---- the steps, in order ----------------------------------------------------------------------

void Session::connect(uv_loop_t* loop) {
  client::ConnectionOptions base = options_.connection;
  if (!base.logger) base.logger = options_.logger;
  if (base.connection_name.empty()) base.connection_name = "retryloop " + options_.service.name;
  client::ConnectionOptions consume_options = base;
  consume_options.connection_name += " (consume)";
  client::ConnectionOptions publish_options = base;
  publish_options.connection_name += " (publish)";
  consume_connection_ = client::Connection::create(loop, consume_options);
  publish_connection_ = client::Connection::create(loop, publish_options);

  publish_connection_->set_blocked_handler(
      guarded([](Session& self, bool blocked, const std::string& reason) {
        if (self.events_.blocked) self.events_.blocked(blocked, reason);
      }));
  for (const auto& connection : {consume_connection_, publish_connection_}) {
    connection->set_lost_handler(
        guarded([](Session& self, const Error& error) { self.fail(error); }));
    Error error = connection->connect(then([](Session& self) {
      if (++self.connected_ != 2) return;
      if (!self.options_.follow_migrations) return self.declare();
      self.watch_migration();
    }));
    if (error) return fail(error, true);  // the options cannot work (a CA file, say)
  }
}

void Session::watch_migration() {
  MigrationWatchEvents events;
  events.read =
      guarded([](Session& self, const Error& error, const std::optional<migrate::Record>& record) {
        self.migration_read(error, record);
      });
  events.heard = guarded([](Session& self, const migrate::Record& record) {
    if (!self.follower_.heard(record)) return;
    if (auto* log = self.options_.logger.get()) {
      log->info("service={} {}: consuming {} from now on", self.options_.service.name,
                self.follower_.describe(), self.follower_.queue());
    }
    self.reconcile();
  });
  events.lost = guarded([](Session& self, const Error& error) {
    // Refused while it was still setting up, past the read's deadline: as before the deadline.
    if (error.reply_code == 403) return self.stop_following(error);
    self.fail(error);
  });
  migration_watch_ =
      MigrationWatch::start(consume_connection_, options_.service.name, std::move(events));
}

void Session::migration_read(const Error& error, const std::optional<migrate::Record>& record) {
  if (error && migration_watch_ && migration_watch_->open()) {
    // Slow (a record queue whose node is down): it goes on without the record, and follows one it
    // reads or hears later. A migration may be under way meanwhile, so it declares nothing.
    record_unread_ = true;
    if (auto* log = options_.logger.get()) {
      log->warn(
          "service={} has not read its migration record yet ({}): consuming without declaring "
          "its topology, and following a migration as soon as its record is read or heard",
          options_.service.name, error.message());
    }
  } else if (error) {
    stop_following(error);
  } else if (record) {
    follower_.heard(*record);
    if (auto* log = options_.logger.get(); log && follower_.migrating()) {
      log->info("service={} {} is under way: consuming {}, and the topology is left to it",
                options_.service.name, follower_.describe(), follower_.queue());
    }
  }
  declare();
}

void Session::stop_following(const Error& error) {
  // The service's permissions may not cover the migration's objects: it runs as before, and a
  // migration of its service queue waits for it to be stopped (docs/migrate.md).
  if (auto* log = options_.logger.get()) {
    log->warn(
        "service={} cannot follow a migration of its queue ({}): a migration waits for this "
        "instance to stop{}",
        options_.service.name, error.message(),
        error.reply_code == 403
            ? "; grant it configure, write and read on " + options_.service.name + ".migration*"
            : std::string());
  }
  if (migration_watch_) migration_watch_->close();
  migration_watch_.reset();
}

void Session::declare() {
  // A queue argument the broker does not know is stored and ignored, so an in_queue service on
  // a broker without delayed retry would retry at once, in a hot loop: it stops first.
  const auto [major, minor] = topology::broker_needed(options_.service);
  const auto version = consume_connection_->broker_version();
  if (version && !version->at_least(major, minor)) {
    return fail(Error(ConsumerError::broker_too_old,
                      "service " + options_.service.name + ": retry mode " +
                          topology::to_string(options_.service.retry.mode) + " needs RabbitMQ " +
                          std::to_string(major) + "." + std::to_string(minor) +
                          " or later (a quorum queue's delayed retry), and the broker is "
                          "RabbitMQ " +
                          version->text()),
                true);
  }
  // Mid-migration a queue may be gone until the migration declares it again, with the new file's
  // arguments: an instance of either file declares nothing then.
  if (!options_.declare_topology || follower_.migrating() || record_unread_) {
    return open_publish_channel();
  }
  topology::Plan plan = topology::make_plan(topology::Topology{{options_.service}});
  check(topology::apply(
      consume_connection_, plan,
      guarded([](Session& self, const topology::Report& report) { self.declared(report); })));
}

void Session::declared(const topology::Report& report) {
  if (report.connection_error) return fail(report.connection_error);
  if (!report.ok()) {
    Error problem = declare_problem(report);
    const bool drift =
        problem.code == make_error_code(ConsumerError::topology_drift) || problem.reply_code == 406;
    if (!drift || !follower_.migrated()) {
      return fail(problem, is_fatal(problem) || problem.reply_code == 406);
    }
    // An instance of the file from before a migration: it consumes what the migration made.
    if (events_.drifted) {
      events_.drifted(problem.message() + "; the broker has it so since " + follower_.describe() +
                      ": consuming as it is (update this instance's file)");
    }
  } else {
    log_declared(options_.logger.get(), options_.service.name, report);
  }
  open_publish_channel();
}

void Session::open_publish_channel() {
  check(publish_connection_->open_channel(
      then([](Session& self, std::shared_ptr<client::Channel> channel) {
        self.select_confirms(std::move(channel));
      })));
}

void Session::select_confirms(std::shared_ptr<client::Channel> channel) {
  watch(channel);
  check(channel->confirm_select(then([channel](Session& self) {
    self.publish_channel_ = channel;
    self.open_consume_channel();
  })));
}

void Session::renew_publish_channel() {
  if (renewing_ || ended_ || !publish_channel_) return;
  renewing_ = true;
  check(publish_connection_->open_channel(
      then([](Session& self, std::shared_ptr<client::Channel> channel) {
        self.watch(channel);
        self.check(channel->confirm_select(self.then([channel](Session& self) {
          self.replaced_channels_.push_back(std::move(self.publish_channel_));
          self.publish_channel_ = channel;
          self.renewing_ = false;
          self.close_drained_channels();
        })));
      })));
}

void Session::close_drained_channels() {
  for (auto it = replaced_channels_.begin(); it != replaced_channels_.end();) {
    if ((*it)->unconfirmed_count() != 0) {
      ++it;
      continue;
    }
    (*it)->set_close_handler({});  // closed on purpose: not a failure of the session
    (void)(*it)->close();
    it = replaced_channels_.erase(it);
  }
}

void Session::open_consume_channel() {
  check(consume_connection_->open_channel(
      then([](Session& self, std::shared_ptr<client::Channel> channel) {
        self.set_prefetch(std::move(channel));
      })));
}

void Session::set_prefetch(std::shared_ptr<client::Channel> channel) {
  watch(channel);
  consume_channel_ = channel;
  check(channel->qos(options_.prefetch, then([](Session& self) {
                       self.consume_channel_ready_ = true;
                       self.reconcile();
                     })));
}

void Session::stop_consuming(std::function<void()> done) {
  stopping_consuming_ = true;
  want_consuming_ = false;
  stopped_consuming_ = std::move(done);
  reconcile();
}

void Session::reconcile() {
  if (ended_ || consume_changing_) return;
  // A record heard while the session sets itself up waits for the consume channel.
  if (want_consuming_ && !consume_channel_ready_) return;
  const bool consuming = !consumer_tag_.empty();
  if (want_consuming_ && !consuming) return consume();
  if (want_consuming_ && consumed_queue_ != follower_.queue()) return switch_queue();
  if (!want_consuming_ && consuming) return cancel();
  if (!consuming && stopped_consuming_) {
    std::function<void()> done = std::move(stopped_consuming_);
    stopped_consuming_ = nullptr;
    done();
  }
}

void Session::cancel() {
  consume_changing_ = true;
  check(consume_channel_->cancel(consumer_tag_, then([](Session& self) {
                                   self.consume_changing_ = false;
                                   self.consumer_tag_.clear();
                                   self.reconcile();
                                 })));
}

client::ConsumeOptions Session::consume_options(const std::string& queue) {
  client::ConsumeOptions options;
  // Up to the prefetch wait for a handler: their properties stay in wire form until it starts.
  options.raw_properties = true;
  options.on_cancel = guarded([queue](Session& self, const std::string&) {
    self.fail(Error(ClientError::consumer_cancelled, "was queue " + queue + " deleted?"));
  });
  return options;
}

void Session::consume() {
  consume_changing_ = true;
  const std::string queue = follower_.queue();
  check(consume_channel_->consume(queue, consume_options(queue),
                                  guarded([](Session& self, client::Delivery&& delivery) {
                                    self.events_.delivery(std::move(delivery));
                                  }),
                                  then([queue](Session& self, const std::string& tag) {
                                    self.consumed_queue_ = queue;
                                    self.consuming(tag);
                                  })));
}

void Session::switch_queue() {
  consume_changing_ = true;
  const std::string queue = follower_.queue();
  check(consume_channel_->consume(
      queue, consume_options(queue), guarded([](Session& self, client::Delivery&& delivery) {
        self.events_.delivery(std::move(delivery));
      }),
      then([queue](Session& self, const std::string& tag) {
        if (auto* log = self.options_.logger.get()) {
          log->info("service={} queue={} consuming; leaving {} once its deliveries are settled",
                    self.options_.service.name, queue, self.consumed_queue_);
        }
        const std::string left = std::move(self.consumer_tag_);
        std::shared_ptr<DeliveryMark> mark = std::move(self.mark_);
        self.consumer_tag_ = tag;
        self.consumed_queue_ = queue;
        self.mark_ = self.new_mark();
        self.leave(left, std::move(mark));
      })));
}

void Session::leave(const std::string& consumer_tag, std::shared_ptr<DeliveryMark> mark) {
  // While a delivery from the queue it leaves is unsettled, the session consumes the settling
  // queue: the migration deletes a queue only once nobody does (its drain waits).
  struct Settling {
    std::string tag;
    bool settled = false;
  };
  auto settling = std::make_shared<Settling>();
  auto end_settling = [](Session& self, Settling& settling) {
    if (settling.tag.empty()) return;
    self.check(self.consume_channel_->cancel(settling.tag, self.then([](Session&) {})));
    settling.tag.clear();
  };
  mark->settled = [weak = weak_from_this(), settling, end_settling,
                   loop = consume_connection_->loop()] {
    // Run from the last delivery's destructor: the cancel goes out on the loop's next turn.
    client::run_after(loop, std::chrono::milliseconds(0), [weak, settling, end_settling] {
      settling->settled = true;
      auto self = weak.lock();
      if (self && !self->ended_) end_settling(*self, *settling);
    });
  };
  leaving_[consumer_tag] = mark;
  const std::string queue = migrate::settling_queue_name(options_.service.name);
  check(consume_channel_->queue_declare(
      queue, client::QueueOptions{},
      then([queue, consumer_tag, settling, end_settling](Session& self, const client::QueueInfo&) {
        client::ConsumeOptions options;
        options.no_ack = true;
        self.check(self.consume_channel_->consume(
            queue, std::move(options), [](client::Delivery&&) {},
            self.then(
                [consumer_tag, settling, end_settling](Session& self, const std::string& tag) {
                  settling->tag = tag;
                  if (settling->settled) end_settling(self, *settling);
                  self.check(self.consume_channel_->cancel(
                      consumer_tag, self.then([consumer_tag](Session& self) {
                        auto it = self.leaving_.find(consumer_tag);
                        std::shared_ptr<DeliveryMark> mark = std::move(it->second);
                        self.leaving_.erase(it);
                        if (self.events_.left) self.events_.left(mark.get());
                        mark.reset();  // the last reference, when nothing from it is unsettled
                        self.consume_changing_ = false;
                        self.reconcile();
                      })));
                })));
      })));
}

std::shared_ptr<Session::DeliveryMark> Session::new_mark() {
  auto mark = std::make_shared<DeliveryMark>();
  marks_.erase(std::remove_if(marks_.begin(), marks_.end(),
                              [](const std::weak_ptr<DeliveryMark>& m) { return m.expired(); }),
               marks_.end());
  marks_.push_back(mark);
  return mark;
}

std::shared_ptr<void> Session::mark_of(const std::string& consumer_tag) const {
  if (consumer_tag == consumer_tag_) return mark_;
  if (auto it = leaving_.find(consumer_tag); it != leaving_.end()) return it->second;
  return nullptr;
}

void Session::consuming(const std::string& consumer_tag) {
  consume_changing_ = false;
  consumer_tag_ = consumer_tag;
  mark_ = new_mark();
  if (!ready_sent_) {
    ready_sent_ = true;
    if (events_.ready) events_.ready();
  }
  reconcile();
}

}  // namespace retryloop::consumer::detail
