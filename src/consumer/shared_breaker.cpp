#include "retryloop/consumer/shared_breaker.hpp"

#include <spdlog/spdlog.h>
#include <uv.h>

#include <chrono>
#include <iterator>
#include <utility>
#include <vector>

#include "breaker_link.hpp"
#include "retryloop/client/timer.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::consumer {
namespace {

using client::Error;

/// How many messages a state read looks at: the queue holds one, and a few more only for the
/// moment a signal arrives while another instance reads it.
constexpr int state_read_limit = 16;
/// How long an empty state read waits before each read again (docs/outage.md: 350 ms in all).
constexpr std::chrono::milliseconds empty_read_delays[] = {
    std::chrono::milliseconds(50), std::chrono::milliseconds(100), std::chrono::milliseconds(200)};

amqp::BasicProperties signal_properties(const char* type) {
  amqp::BasicProperties properties;
  properties.content_type = "application/json";
  properties.delivery_mode = 2;
  properties.type = type;
  return properties;
}

/// One declaration or binding: returns an error when it could not be sent, else calls `next`.
using Step = std::function<Error(client::CompletionCallback next)>;

/// Runs `steps` from `index` one after another; `done` hears the first error, or none.
void run_steps(const std::shared_ptr<std::vector<Step>>& steps, size_t index,
               client::CompletionCallback done) {
  if (index == steps->size()) return done(Error{});
  Error error = (*steps)[index]([steps, index, done](const Error& error) {
    if (error) return done(error);
    run_steps(steps, index + 1, done);
  });
  if (error) done(error);
}

/// Reads the state queue one message at a time, keeping the last signal in the queue's order (the
/// newest: the queue keeps one, and more only while a signal arrives during a read), then
/// requeues all. Another reader holds the message for a round trip, and this one then finds the
/// queue empty: an empty read is tried again a few times, spaced out, before it is believed.
struct StateReader : std::enable_shared_from_this<StateReader> {
  std::shared_ptr<client::Channel> channel;
  uv_loop_t* loop = nullptr;
  std::string queue;
  StateCallback done;
  std::optional<outage::Signal> last;
  uint64_t last_tag = 0;
  int read = 0;
  size_t empty_reads = 0;

  void next() {
    if (read == state_read_limit) return finish();
    ++read;
    Error error = channel->get(
        queue, false,
        [self = shared_from_this()](const Error& error, std::optional<client::GetResult>&& got) {
          if (error) return self->done(error, std::nullopt);
          if (!got) return self->empty();
          self->last_tag = got->delivery_tag;
          std::string why;
          if (auto signal = outage::decode_signal(got->message.body, why)) {
            self->last = std::move(signal);
          }
          self->next();
        });
    if (error) done(error, std::nullopt);
  }

  void empty() {
    if (last_tag != 0 || loop == nullptr || empty_reads == std::size(empty_read_delays)) {
      return finish();
    }
    const std::chrono::milliseconds delay = empty_read_delays[empty_reads++];
    read = 0;
    client::run_after(loop, delay, [self = shared_from_this()] {
      if (self->channel->is_open()) {
        self->next();
      } else {
        self->done(Error(client::ClientError::not_open, "the channel closed"), std::nullopt);
      }
    });
  }

  void finish() {
    if (last_tag != 0) {
      if (Error error = channel->nack(last_tag, true, true)) return done(error, std::nullopt);
    }
    done(Error{}, last);
  }
};

}  // namespace

void declare_shared_breaker(const std::shared_ptr<client::Channel>& channel,
                            const std::string& service, client::CompletionCallback done) {
  const std::string exchange = topology::breaker_exchange_name(service);
  const std::string state = topology::breaker_state_queue_name(service);
  client::QueueOptions state_options;
  state_options.arguments.append("x-max-length", amqp::FieldValue(int64_t(1)));
  state_options.arguments.append("x-overflow", amqp::FieldValue(std::string("drop-head")));
  client::QueueOptions token_options;
  token_options.arguments.append("x-queue-type", amqp::FieldValue(std::string("quorum")));
  token_options.arguments.append("x-single-active-consumer", amqp::FieldValue(true));
  client::QueueOptions instances_options;
  instances_options.arguments.append("x-max-length", amqp::FieldValue(int64_t(0)));
  auto declare_queue = [channel](std::string name, client::QueueOptions options) -> Step {
    return [channel, name, options](client::CompletionCallback next) {
      return channel->queue_declare(
          name, options, [next](const Error& error, const client::QueueInfo&) { next(error); });
    };
  };
  auto steps = std::make_shared<std::vector<Step>>(std::vector<Step>{
      [channel, exchange](client::CompletionCallback next) {
        return channel->exchange_declare(exchange, "fanout", client::ExchangeOptions{}, next);
      },
      declare_queue(state, state_options),
      [channel, state, exchange](client::CompletionCallback next) {
        return channel->queue_bind(state, exchange, "", {}, next);
      },
      declare_queue(topology::breaker_token_queue_name(service), token_options),
      declare_queue(topology::breaker_instances_queue_name(service), instances_options),
  });
  run_steps(steps, 0, std::move(done));
}

void read_shared_breaker_state(const std::shared_ptr<client::Channel>& channel, uv_loop_t* loop,
                               const std::string& service, StateCallback done) {
  auto reader = std::make_shared<StateReader>();
  reader->channel = channel;
  reader->loop = loop;
  reader->queue = topology::breaker_state_queue_name(service);
  reader->done = std::move(done);
  reader->next();
}

const char* shared_breaker_state(const std::optional<outage::Signal>& last) {
  if (!last) return "closed";
  switch (last->kind) {
    case outage::SignalKind::open:
    case outage::SignalKind::probing:
      return "open";
    case outage::SignalKind::paused:
      return "paused";
    case outage::SignalKind::resumed:
      return "resuming";
    case outage::SignalKind::recovered:
      return "closed";
  }
  return "closed";
}

void read_shared_breaker_status(const std::shared_ptr<client::Channel>& channel, uv_loop_t* loop,
                                const std::string& service, StatusCallback done) {
  auto shared = std::make_shared<StatusCallback>(std::move(done));
  auto status = std::make_shared<SharedBreakerStatus>();
  // Looks up `queue` passively, and hands its counts to `next`.
  auto look_up = [channel, shared](const std::string& queue, auto next) {
    client::QueueOptions passive;
    passive.passive = true;
    Error error = channel->queue_declare(
        queue, passive, [shared, next](const Error& error, const client::QueueInfo& info) {
          if (error) return (*shared)(error, SharedBreakerStatus{});
          next(info);
        });
    if (error) (*shared)(error, SharedBreakerStatus{});
  };
  read_shared_breaker_state(
      channel, loop, service,
      [service, status, shared, look_up](const Error& error,
                                         const std::optional<outage::Signal>& last) {
        if (error) return (*shared)(error, SharedBreakerStatus{});
        status->last = last;
        look_up(topology::breaker_token_queue_name(service),
                [service, status, shared, look_up](const client::QueueInfo& token) {
                  status->tokens_waiting = token.message_count;
                  look_up(topology::breaker_instances_queue_name(service),
                          [status, shared](const client::QueueInfo& instances) {
                            status->instances = instances.consumer_count;
                            (*shared)(Error{}, *status);
                          });
                });
      });
}

void publish_breaker_signal(client::Channel& channel, const std::string& service,
                            const outage::Signal& signal, client::PublishCallback done) {
  Error error = channel.publish(topology::breaker_exchange_name(service), "",
                                signal_properties("retryloop.breaker.signal"),
                                outage::encode_signal(signal), client::Mandatory::yes, done);
  if (error && done) done(client::PublishOutcome{client::PublishStatus::failed, 0, error});
}

void publish_probe_token(client::Channel& channel, const std::string& service,
                         const outage::Token& token, client::PublishCallback done) {
  Error error = channel.publish("", topology::breaker_token_queue_name(service),
                                signal_properties("retryloop.breaker.token"),
                                outage::encode_token(token), client::Mandatory::yes, done);
  if (error && done) done(client::PublishOutcome{client::PublishStatus::failed, 0, error});
}

namespace {

class Watch final : public SharedBreakerWatch, public std::enable_shared_from_this<Watch> {
  // Wraps a callback so that it runs only while the watch lives and has not ended.
  template <class Next>
  auto guarded(Next next) {
    return [weak = weak_from_this(), next](auto&&... args) {
      auto self = weak.lock();
      if (!self || self->ended_) return;
      next(*self, std::forward<decltype(args)>(args)...);
    };
  }

 public:
  Watch(std::string service, ChangeCallback changed, FailureCallback failed)
      : service_(std::move(service)), changed_(std::move(changed)), failed_(std::move(failed)) {}

  void open(const std::shared_ptr<client::Connection>& connection) {
    loop_ = connection->loop();
    Error error = connection->open_channel(
        guarded([](Watch& self, const Error& error, std::shared_ptr<client::Channel> channel) {
          if (error) return self.fail(error);
          self.channel_ = std::move(channel);
          self.channel_->set_close_handler(
              self.guarded([](Watch& self, const Error& error) { self.fail(error); }));
          self.bind();
        }));
    if (error) fail(error);
  }

  void refresh() override {
    if (ended_ || !listening_ || counting_) return;
    counting_ = true;
    count(topology::breaker_token_queue_name(service_),
          [](Watch& self, uint32_t messages, uint32_t) {
            self.status_.tokens_waiting = messages;
            self.count(topology::breaker_instances_queue_name(self.service_),
                       [](Watch& self, uint32_t, uint32_t consumers) {
                         self.status_.instances = consumers;
                         self.counting_ = false;
                         self.changed_(self.status_);
                       });
          });
  }

  bool ended() const override { return ended_; }
  bool found() const override { return found_; }

  void close() override {
    if (ended_) return;
    ended_ = true;
    if (channel_ && channel_->is_open()) static_cast<void>(channel_->close());
  }

 private:
  void fail(const Error& error) {
    if (ended_) return;
    ended_ = true;
    if (channel_ && channel_->is_open()) static_cast<void>(channel_->close());
    if (failed_) failed_(error);
  }

  // The exchange is looked up before a queue is made: a service without a breaker fails here,
  // and leaves no queue behind on the watcher's connection.
  void bind() {
    client::ExchangeOptions passive;
    passive.passive = true;
    Error error = channel_->exchange_declare(topology::breaker_exchange_name(service_), "fanout",
                                             passive, guarded([](Watch& self, const Error& error) {
                                               if (error) return self.fail(error);
                                               self.found_ = true;
                                               self.bind_own_queue();
                                             }));
    if (error) fail(error);
  }

  void bind_own_queue() {
    client::QueueOptions options;
    options.durable = false;
    options.exclusive = true;
    options.auto_delete = true;
    // A watch that failed after its queue was made does not leave it for the connection's life.
    options.arguments.append("x-expires", int64_t(60000));
    Error error = channel_->queue_declare(
        "", options, guarded([](Watch& self, const Error& error, const client::QueueInfo& info) {
          if (error) return self.fail(error);
          self.own_queue_ = info.name;
          Error bound = self.channel_->queue_bind(
              self.own_queue_, topology::breaker_exchange_name(self.service_), "", {},
              self.guarded([](Watch& self, const Error& error) {
                if (error) return self.fail(error);
                self.read_state();
              }));
          if (bound) self.fail(bound);
        }));
    if (error) fail(error);
  }

  // Bound first, read second: a signal sent in between is not missed.
  void read_state() {
    read_shared_breaker_state(
        channel_, loop_, service_,
        guarded([](Watch& self, const Error& error, const std::optional<outage::Signal>& last) {
          if (error) return self.fail(error);
          self.status_.last = last;
          self.listen();
        }));
  }

  void listen() {
    client::ConsumeOptions options;
    options.no_ack = true;
    options.exclusive = true;
    Error error = channel_->consume(
        own_queue_, options, guarded([](Watch& self, client::Delivery&& delivery) {
          std::string why;
          // Heard after the state was read: newer than what was read, whatever its clock says.
          if (auto signal = outage::decode_signal(delivery.message.body, why)) {
            self.status_.last = std::move(signal);
            if (self.listening_) self.changed_(self.status_);
          }
        }),
        guarded([](Watch& self, const Error& error, const std::string&) {
          if (error) return self.fail(error);
          self.listening_ = true;
          self.refresh();
        }));
    if (error) fail(error);
  }

  template <class Next>
  void count(const std::string& queue, Next next) {
    client::QueueOptions passive;
    passive.passive = true;
    Error error = channel_->queue_declare(
        queue, passive,
        guarded([next](Watch& self, const Error& error, const client::QueueInfo& info) {
          if (error) return self.fail(error);
          next(self, info.message_count, info.consumer_count);
        }));
    if (error) fail(error);
  }

  std::string service_;
  ChangeCallback changed_;
  FailureCallback failed_;
  uv_loop_t* loop_ = nullptr;
  std::shared_ptr<client::Channel> channel_;
  std::string own_queue_;
  SharedBreakerStatus status_;
  bool listening_ = false;
  bool counting_ = false;
  bool found_ = false;
  bool ended_ = false;
};

}  // namespace

std::shared_ptr<SharedBreakerWatch> SharedBreakerWatch::start(
    const std::shared_ptr<client::Connection>& connection, const std::string& service,
    ChangeCallback changed, FailureCallback failed) {
  auto watch = std::make_shared<Watch>(service, std::move(changed), std::move(failed));
  watch->open(connection);
  return watch;
}

namespace detail {

template <class Next>
auto BreakerLink::guarded(Next next) {
  return [weak = weak_from_this(), next](auto&&... args) {
    auto self = weak.lock();
    if (!self || self->ended_) return;
    next(*self, std::forward<decltype(args)>(args)...);
  };
}

std::shared_ptr<BreakerLink> BreakerLink::start(
    const std::shared_ptr<client::Connection>& connection, std::string service,
    std::shared_ptr<spdlog::logger> logger, BreakerLinkEvents events) {
  std::shared_ptr<BreakerLink> link(
      new BreakerLink(std::move(service), std::move(logger), std::move(events)));
  link->loop_ = connection->loop();
  Error error = connection->open_channel(
      link->guarded([](BreakerLink& self, const Error& error, std::shared_ptr<client::Channel> c) {
        if (error) return self.fail(error);
        self.channel_ = std::move(c);
        self.channel_->set_close_handler(
            self.guarded([](BreakerLink& self, const Error& error) { self.fail(error); }));
        self.declare();
      }));
  if (error) link->fail(error);
  return link;
}

BreakerLink::BreakerLink(std::string service, std::shared_ptr<spdlog::logger> logger,
                         BreakerLinkEvents events)
    : service_(std::move(service)), logger_(std::move(logger)), events_(std::move(events)) {}

void BreakerLink::fail(const Error& error) {
  if (ended_) return;
  ended_ = true;
  if (channel_ && channel_->is_open()) static_cast<void>(channel_->close());
  if (events_.failed) events_.failed(error);
}

void BreakerLink::close() {
  if (ended_) return;
  ended_ = true;
  if (channel_ && channel_->is_open()) static_cast<void>(channel_->close());
}

void BreakerLink::ack_token(uint64_t delivery_tag) {
  if (!ended_ && channel_) static_cast<void>(channel_->ack(delivery_tag));
}

void BreakerLink::declare() {
  declare_shared_breaker(channel_, service_, guarded([](BreakerLink& self, const Error& error) {
                           if (error) return self.fail(error);
                           self.bind_own_queue();
                         }));
}

void BreakerLink::bind_own_queue() {
  client::QueueOptions options;
  options.durable = false;
  options.exclusive = true;
  options.auto_delete = true;
  Error error = channel_->queue_declare(
      "", options,
      guarded([](BreakerLink& self, const Error& error, const client::QueueInfo& info) {
        if (error) return self.fail(error);
        self.own_queue_ = info.name;
        Error bound = self.channel_->queue_bind(
            self.own_queue_, topology::breaker_exchange_name(self.service_), "", {},
            self.guarded([](BreakerLink& self, const Error& error) {
              if (error) return self.fail(error);
              self.read_state();
            }));
        if (bound) self.fail(bound);
      }));
  if (error) fail(error);
}

void BreakerLink::read_state() {
  // After the bind: a signal sent while the state is read waits in this instance's queue.
  read_shared_breaker_state(
      channel_, loop_, service_,
      guarded([](BreakerLink& self, const Error& error, const std::optional<outage::Signal>& last) {
        if (error) return self.fail(error);
        self.consume_signals(last);
      }));
}

void BreakerLink::consume_signals(const std::optional<outage::Signal>& last) {
  client::ConsumeOptions options;
  options.no_ack = true;
  options.exclusive = true;
  Error error = channel_->consume(
      own_queue_, options, guarded([](BreakerLink& self, client::Delivery&& delivery) {
        self.on_signal(std::move(delivery));
      }),
      guarded([last](BreakerLink& self, const Error& error, const std::string&) {
        if (error) return self.fail(error);
        self.consume_tokens(last);
      }));
  if (error) fail(error);
}

void BreakerLink::consume_tokens(const std::optional<outage::Signal>& last) {
  Error error =
      channel_->qos(1, guarded([last](BreakerLink& self, const Error& error) {
                      if (error) return self.fail(error);
                      self.subscribe_tokens([last](BreakerLink& self) { self.count_in(last); });
                    }));
  if (error) fail(error);
}

void BreakerLink::subscribe_tokens(std::function<void(BreakerLink& self)> subscribed) {
  client::ConsumeOptions options;
  options.on_cancel = guarded([](BreakerLink& self, const std::string&) {
    self.fail(Error(client::ClientError::consumer_cancelled,
                    "the broker cancelled the probe token consumer"));
  });
  Error error = channel_->consume(
      topology::breaker_token_queue_name(service_), options,
      guarded([](BreakerLink& self, client::Delivery&& delivery) {
        self.on_token(std::move(delivery));
      }),
      guarded([subscribed](BreakerLink& self, const Error& error, const std::string& tag) {
        if (error) return self.fail(error);
        self.token_consumer_ = tag;
        if (subscribed) subscribed(self);
      }));
  if (error) fail(error);
}

void BreakerLink::pass_token(uint64_t delivery_tag) {
  if (ended_ || !channel_ || token_consumer_.empty()) return;
  const std::string consumer = std::exchange(token_consumer_, std::string());
  Error error =
      channel_->cancel(consumer, guarded([delivery_tag](BreakerLink& self, const Error& error) {
                         if (error) return self.fail(error);
                         // Cancelled first, so that the requeued token goes to the next consumer in
                         // line, not back here; then at the end of the line again.
                         if (Error rejected = self.channel_->reject(delivery_tag, true))
                           return self.fail(rejected);
                         self.subscribe_tokens(nullptr);
                       }));
  if (error) fail(error);
}

void BreakerLink::count_in(const std::optional<outage::Signal>& last) {
  client::ConsumeOptions options;
  options.no_ack = true;
  Error error = channel_->consume(
      topology::breaker_instances_queue_name(service_), options,
      [](client::Delivery&&) {},  // the queue holds nothing
      guarded([last](BreakerLink& self, const Error& error, const std::string&) {
        if (error) return self.fail(error);
        if (self.events_.joined) self.events_.joined(last);
      }));
  if (error) fail(error);
}

void BreakerLink::on_signal(client::Delivery&& delivery) {
  std::string why;
  auto signal = outage::decode_signal(delivery.message.body, why);
  if (!signal) {
    if (logger_) {
      logger_->warn("service={} ignored a message on {} that is not a breaker signal: {}", service_,
                    topology::breaker_exchange_name(service_), why);
    }
    return;
  }
  if (events_.signal) events_.signal(*signal);
}

void BreakerLink::on_token(client::Delivery&& delivery) {
  if (events_.token) {
    events_.token(delivery.delivery_tag, outage::decode_token(delivery.message.body));
  }
}

}  // namespace detail
}  // namespace retryloop::consumer
