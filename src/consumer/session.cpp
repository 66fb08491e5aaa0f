#include "session.hpp"

#include <spdlog/spdlog.h>

#include "retryloop/consumer/error.hpp"
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

/// The first problem of a declare report as an error naming the object.
Error declare_problem(const topology::Report& report) {
  for (const auto& result : report.results) {
    const std::string object = topology::describe(result.action);
    switch (result.outcome) {
      case topology::Outcome::drifted: {
        std::string text = object + " exists with other arguments: ";
        if (result.drift) {
          text += result.drift->argument + " is " + result.drift->actual +
                  " on the broker, the topology wants " + result.drift->wanted;
        } else {
          text += result.error.message();
        }
        return Error(ConsumerError::topology_drift,
                     text + " (fix the broker or the file; nothing was changed)");
      }
      case topology::Outcome::failed: {
        Error error = result.error;
        error.reply_text = object + ": " + error.reply_text;
        return error;
      }
      case topology::Outcome::missing:
        return Error(ConsumerError::topology_missing,
                     object + " does not exist (it is declared elsewhere)");
      default:
        break;
    }
  }
  return report.connection_error;
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
    : options_(options), generation_(generation), events_(std::move(events)) {}

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
      if (++self.connected_ == 2) self.declare();
    }));
    if (error) return fail(error, true);  // the options cannot work (a CA file, say)
  }
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
  if (!options_.declare_topology) return open_publish_channel();
  topology::Plan plan = topology::make_plan(topology::Topology{{options_.service}});
  check(topology::apply(
      consume_connection_, plan, guarded([](Session& self, const topology::Report& report) {
        if (report.connection_error) return self.fail(report.connection_error);
        if (!report.ok()) {
          Error problem = declare_problem(report);
          return self.fail(problem, is_fatal(problem) || problem.reply_code == 406);
        }
        log_declared(self.options_.logger.get(), self.options_.service.name, report);
        self.open_publish_channel();
      })));
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
  check(channel->qos(options_.prefetch, then([](Session& self) { self.consume(); })));
}

void Session::stop_consuming(std::function<void()> done) {
  stopping_consuming_ = true;
  want_consuming_ = false;
  stopped_consuming_ = std::move(done);
  reconcile();
}

void Session::reconcile() {
  if (ended_ || consume_changing_) return;
  const bool consuming = !consumer_tag_.empty();
  if (want_consuming_ && !consuming) return consume();
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

void Session::consume() {
  consume_changing_ = true;
  const std::string& queue = topology::input_queue_name(options_.service);
  client::ConsumeOptions consume_options;
  // Up to the prefetch wait for a handler: their properties stay in wire form until it starts.
  consume_options.raw_properties = true;
  consume_options.on_cancel = guarded([queue](Session& self, const std::string&) {
    self.fail(Error(ClientError::consumer_cancelled, "was queue " + queue + " deleted?"));
  });
  check(consume_channel_->consume(
      queue, std::move(consume_options), guarded([](Session& self, client::Delivery&& delivery) {
        self.events_.delivery(std::move(delivery));
      }),
      then([](Session& self, const std::string& tag) { self.consuming(tag); })));
}

void Session::consuming(const std::string& consumer_tag) {
  consume_changing_ = false;
  consumer_tag_ = consumer_tag;
  if (!ready_sent_) {
    ready_sent_ = true;
    if (events_.ready) events_.ready();
  }
  reconcile();
}

}  // namespace retryloop::consumer::detail
