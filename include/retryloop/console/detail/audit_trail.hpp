#pragma once

#include <spdlog/logger.h>
#include <nlohmann/json.hpp>

#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "retryloop/client/connection.hpp"
#include "retryloop/parking/audit.hpp"

namespace retryloop::console::detail {

/// The console's audit trail, on the loop thread: records go to the vhost's audit stream (when
/// the topology file declares one) and are read back from it, so that they outlive the console
/// and include other consoles' and the command line's; without a stream they are kept in memory
/// for this process only. The last `kept` records are held for the page.
class AuditTrail : public std::enable_shared_from_this<AuditTrail> {
 public:
  using Done = std::function<void(const std::string& error)>;

  AuditTrail(bool on_broker, std::shared_ptr<spdlog::logger> logger, size_t kept = 1000);

  /// Reads the stream on `connection` (after each connect of the console's first service), from
  /// 30 days back, or from where the last reader stopped.
  void attach(const std::shared_ptr<client::Connection>& connection);
  /// That connection was lost: reading stops until the next attach.
  void detach();

  /// Appends `record` (its id, time and via are set when empty) through `writer`, the calling
  /// service's own (null while it is not connected). `done` gets "" once it is kept: confirmed by
  /// the broker, or in memory; otherwise why not.
  void append(parking::AuditRecord record, parking::AuditWriter* writer, Done done);

  /// {"kept_on": stream or null, "connected" (the stream is being read), "error", "records":
  /// [newest first]}.
  nlohmann::json json(size_t limit) const;
  /// The newest note of each group of `service`: {group: record}.
  nlohmann::json notes(const std::string& service) const;

 private:
  void keep(parking::AuditRecord record);
  void failed(std::string why);

  bool on_broker_;
  std::shared_ptr<spdlog::logger> logger_;
  size_t kept_;
  std::shared_ptr<parking::AuditReader> reader_;
  std::optional<int64_t> last_offset_;
  std::string error_;
  std::deque<parking::AuditRecord> records_;
  /// id.state of the records held, so that a record appended here and read back is held once.
  std::set<std::string> held_;
};

}  // namespace retryloop::console::detail
