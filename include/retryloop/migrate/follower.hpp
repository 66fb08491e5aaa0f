#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "retryloop/migrate/migration.hpp"

namespace retryloop::migrate {

/// Which queue an instance of a service consumes while a migration makes its service queue again
/// (docs/migrate.md, "The instances follow"): the holding queue from the migration's first
/// announce to its second, the service queue otherwise. It hears the records the migration
/// publishes after each step, and the one an instance reads when it starts, in whatever order
/// they come, and keeps the newest. No I/O.
class Follower {
 public:
  Follower(std::string service, std::string service_queue);

  /// A record read or heard. Returns whether the queue to consume changed. A record older than
  /// the newest one heard (of the same migration at an earlier step, or of a migration begun
  /// earlier) changes nothing; neither does one of another service.
  bool heard(const Record& record);

  /// The queue to consume now.
  const std::string& queue() const { return queue_; }
  /// A migration of the service is under way: the topology is left to it (an instance declares
  /// nothing, so that it never makes a queue again with other arguments mid-way).
  bool migrating() const { return newest_ && !newest_->finished; }
  /// The broker has a record of a migration of the service, finished or not: its objects may have
  /// other arguments than an instance's file says, and such drift does not stop the instance.
  bool migrated() const { return newest_.has_value(); }
  /// The newest record heard; nullopt before any.
  const std::optional<Record>& newest() const { return newest_; }
  /// "migration 3f2a…: at step 5" or "migration 3f2a…: finished".
  std::string describe() const;

 private:
  std::string service_;
  std::string service_queue_;
  std::string queue_;
  std::optional<Record> newest_;
};

}  // namespace retryloop::migrate
