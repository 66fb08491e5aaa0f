#include "migration_watch.hpp"

#include <utility>
#include <vector>

#include "retryloop/migrate/driver.hpp"

namespace retryloop::consumer::detail {

using client::Error;

MigrationWatch::MigrationWatch(std::shared_ptr<client::Connection> connection, std::string service,
                               MigrationWatchEvents events)
    : connection_(std::move(connection)),
      service_(std::move(service)),
      events_(std::move(events)) {}

template <class Next>
auto MigrationWatch::then(Next next) {
  return [weak = weak_from_this(), next](const Error& error, auto&&... args) {
    auto self = weak.lock();
    if (!self || self->closed_) return;
    if (error) return self->fail(error);
    next(*self, std::forward<decltype(args)>(args)...);
  };
}

std::shared_ptr<MigrationWatch> MigrationWatch::start(
    const std::shared_ptr<client::Connection>& connection, std::string service,
    MigrationWatchEvents events) {
  std::shared_ptr<MigrationWatch> watch(
      new MigrationWatch(connection, std::move(service), std::move(events)));
  Error error = connection->open_channel(
      watch->then([](MigrationWatch& self, std::shared_ptr<client::Channel> channel) {
        self.channel_ = std::move(channel);
        self.channel_->set_close_handler(self.then([](MigrationWatch& self) {
          self.fail(Error(client::ClientError::not_open, "the channel closed"));
        }));
        Error declared = migrate::declare_record_exchange(
            self.channel_, self.service_,
            self.then([](MigrationWatch& self) { self.declare_listener(); }));
        if (declared) self.fail(declared);
      }));
  if (error) {
    watch->fail(error);
  } else {
    watch->start_deadline(connection->loop());
  }
  return watch;
}

MigrationWatch::~MigrationWatch() {
  stop_deadline();
}

void MigrationWatch::start_deadline(uv_loop_t* loop) {
  deadline_ = new uv_timer_t;
  uv_timer_init(loop, deadline_);
  deadline_->data = new std::weak_ptr<MigrationWatch>(weak_from_this());
  uv_timer_start(
      deadline_,
      [](uv_timer_t* timer) {
        auto self = static_cast<std::weak_ptr<MigrationWatch>*>(timer->data)->lock();
        if (!self) return;
        self->stop_deadline();
        if (!self->closed_ && !self->read_) self->read_late();
      },
      uint64_t(read_deadline.count()), 0);
}

void MigrationWatch::stop_deadline() {
  if (deadline_ == nullptr) return;
  uv_timer_stop(deadline_);
  uv_close(reinterpret_cast<uv_handle_t*>(deadline_), [](uv_handle_t* handle) {
    delete static_cast<std::weak_ptr<MigrationWatch>*>(handle->data);
    delete reinterpret_cast<uv_timer_t*>(handle);
  });
  deadline_ = nullptr;
}

void MigrationWatch::fail(const Error& error) {
  if (closed_) return;
  closed_ = true;
  stop_deadline();
  if (!read_) {
    read_ = true;
    if (events_.read) events_.read(error, std::nullopt);
  } else if (events_.lost) {
    events_.lost(error);
  }
}

void MigrationWatch::close() {
  closed_ = true;
  stop_deadline();
  if (channel_ && channel_->is_open()) {
    channel_->set_close_handler({});
    (void)channel_->close();
  }
}

void MigrationWatch::declare_listener() {
  client::QueueOptions options;
  options.durable = false;
  options.exclusive = true;
  options.auto_delete = true;
  Error error = channel_->queue_declare(
      "", options, then([](MigrationWatch& self, const client::QueueInfo& info) {
        const std::string queue = info.name;
        Error bound = self.channel_->queue_bind(
            queue, migrate::record_queue_name(self.service_), "", {},
            self.then([queue](MigrationWatch& self) { self.listen(queue); }));
        if (bound) self.fail(bound);
      }));
  if (error) fail(error);
}

void MigrationWatch::listen(const std::string& queue) {
  client::ConsumeOptions options;
  options.no_ack = true;
  options.exclusive = true;
  Error error = channel_->consume(
      queue, std::move(options),
      [weak = weak_from_this()](client::Delivery&& delivery) {
        auto self = weak.lock();
        if (!self || self->closed_) return;
        std::string why;
        auto record = migrate::decode_record(delivery.message.body, why);
        if (!record) return;
        if (!self->read_) {
          self->early_.push_back(std::move(*record));  // told after the read
        } else if (self->events_.heard) {
          self->events_.heard(*record);
        }
      },
      then([](MigrationWatch& self, const std::string&) { self.read_record(); }));
  if (error) fail(error);
}

void MigrationWatch::read_record() {
  std::weak_ptr<MigrationWatch> weak = weak_from_this();
  Error error = migrate::read_record(
      connection_, service_,
      [weak](const Error& error, const std::optional<migrate::Record>& record) {
        auto self = weak.lock();
        if (!self || self->closed_) return;
        if (!self->read_) {
          if (error) return self->fail(error);
          return self->record_read(Error{}, record);
        }
        // A read that came back after the deadline: what it found is news.
        if (!error && record && self->events_.heard) self->events_.heard(*record);
      });
  if (error) fail(error);
}

void MigrationWatch::read_late() {
  record_read(Error(std::make_error_code(std::errc::timed_out),
                    "the read of " + migrate::record_queue_name(service_) + " took over " +
                        std::to_string(read_deadline.count()) + " ms"),
              std::nullopt);
}

void MigrationWatch::record_read(const Error& error, const std::optional<migrate::Record>& record) {
  read_ = true;
  stop_deadline();
  if (events_.read) events_.read(error, record);
  std::vector<migrate::Record> early = std::move(early_);
  for (const migrate::Record& heard : early) {
    if (closed_) return;
    if (events_.heard) events_.heard(heard);
  }
}

}  // namespace retryloop::consumer::detail
