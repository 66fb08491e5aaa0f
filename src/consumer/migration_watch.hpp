#pragma once

#include <uv.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "retryloop/client/channel.hpp"
#include "retryloop/client/connection.hpp"
#include "retryloop/migrate/migration.hpp"

namespace retryloop::consumer::detail {

/// What a migration watch tells its session. Nothing fires after close().
struct MigrationWatchEvents {
  /// Once: the watch is set up and has read the service's record (nullopt: none), or it could
  /// not be set up or read the record within MigrationWatch::read_deadline (`error`). Past the
  /// deadline the watch goes on, and tells a record it then finds or hears as `heard`.
  std::function<void(const client::Error& error, const std::optional<migrate::Record>& record)>
      read;
  /// A record the migration published since.
  std::function<void(const migrate::Record& record)> heard;
  /// The watch's channel closed after it was set up.
  std::function<void(const client::Error& error)> lost;
};

/// Listens to a service's migration (docs/migrate.md, "The instances follow"): on a channel of
/// its own it declares the record's exchange, binds an exclusive queue of its own to it and
/// consumes it, then reads the record the migrator's record queue keeps. So a record published
/// after the read is heard, and one published before it is read: none is missed. The record
/// queue is the migrator's to declare: a classic queue whose node is down holds a declare for a
/// minute on RabbitMQ 4, and the instance would wait as long to consume again after losing its
/// node. Callbacks hold it weakly; its session holds it.
class MigrationWatch : public std::enable_shared_from_this<MigrationWatch> {
 public:
  static std::shared_ptr<MigrationWatch> start(
      const std::shared_ptr<client::Connection>& connection, std::string service,
      MigrationWatchEvents events);

  ~MigrationWatch();

  /// Stops listening; the channel closes with its connection or now.
  void close();

  /// Whether it still sets up or listens: neither failed nor closed.
  bool open() const { return !closed_; }

  /// How long the set-up and the read of the record may take before `read` fires with an error and
  /// the instance goes on without it (a record queue whose node is down, say).
  static constexpr std::chrono::milliseconds read_deadline{5000};

 private:
  MigrationWatch(std::shared_ptr<client::Connection> connection, std::string service,
                 MigrationWatchEvents events);

  template <class Next>
  auto then(Next next);
  void fail(const client::Error& error);
  void declare_listener();
  void listen(const std::string& queue);
  void read_record();
  /// The read's deadline: a timer of its own, closed once the read is in, so that it never keeps
  /// the loop running after the consumer has stopped.
  void start_deadline(uv_loop_t* loop);
  void stop_deadline();
  void read_late();
  void record_read(const client::Error& error, const std::optional<migrate::Record>& record);

  std::shared_ptr<client::Connection> connection_;
  std::string service_;
  MigrationWatchEvents events_;
  std::shared_ptr<client::Channel> channel_;
  /// Heard before the read came back: told after it.
  std::vector<migrate::Record> early_;
  uv_timer_t* deadline_ = nullptr;
  bool read_ = false;
  bool closed_ = false;
};

}  // namespace retryloop::consumer::detail
