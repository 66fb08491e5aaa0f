#pragma once

#include <spdlog/logger.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "retryloop/client/connection.hpp"
#include "retryloop/parking/audit.hpp"

namespace retryloop::console::detail {

/// The console's audit trail, on the loop thread: records go to the vhost's audit stream (when
/// the topology file declares one) and are read back from it, so that they outlive the console
/// and include other consoles' and the command line's; without a stream they are kept in memory
/// for this process only. The newest records are held for the page, at most `max_bytes` of them
/// (record_bytes), and the newest note of each group is held however old it is, within the same
/// bound.
class AuditTrail : public std::enable_shared_from_this<AuditTrail> {
 public:
  using Done = std::function<void(const std::string& error)>;

  /// `key` (read_audit_key) signs the records appended and verifies the ones read back; empty:
  /// every record read back is unverified.
  AuditTrail(bool on_broker, std::shared_ptr<spdlog::logger> logger, std::string key = {},
             size_t max_bytes = 4 * 1024 * 1024);

  /// Reads the stream on `connection` (after each connect of the console's first service), from
  /// 30 days back, or from where the last reader stopped.
  void attach(const std::shared_ptr<client::Connection>& connection);
  /// That connection was lost: reading stops until the next attach.
  void detach();

  /// Appends `record` (its id, time and via are set when empty) through `writer`, the calling
  /// service's own (null while it is not connected). `done` gets "" once it is kept: confirmed by
  /// the broker, or in memory; otherwise why not.
  void append(parking::AuditRecord record, parking::AuditWriter* writer, Done done);

  /// {"kept_on": stream or null, "connected" (the stream is being read), "error", "skipped"
  /// (records read back that could not be read), "skipped_last" (why the last one was skipped,
  /// or null), "signed" (whether records are signed), "records": [newest first]}.
  nlohmann::json json(size_t limit) const;
  /// The newest note of each group of `service`: {group: record}.
  nlohmann::json notes(const std::string& service) const;
  /// The audit trail's counters in Prometheus text form.
  std::string metrics() const;

  /// Keeps `record` as if it had been read back; for the tests of the bound.
  void keep(parking::AuditRecord record);
  /// The bytes the records held take, as the bound counts them.
  size_t bytes() const { return bytes_; }

  /// What a record held takes: its fields' bytes and a fixed share for the structures.
  static size_t record_bytes(const parking::AuditRecord& record);

 private:
  void failed(std::string why);
  void skipped(const std::string& why, std::optional<int64_t> offset);
  void evict();

  bool on_broker_;
  std::shared_ptr<spdlog::logger> logger_;
  std::string key_;
  size_t max_bytes_;
  size_t bytes_ = 0;
  std::shared_ptr<parking::AuditReader> reader_;
  std::optional<int64_t> last_offset_;
  std::string error_;
  uint64_t skipped_ = 0;
  std::string skipped_last_;
  /// In order of time, oldest first.
  std::deque<parking::AuditRecord> records_;
  /// A copy of the newest note of each (service, group), which outlives its record in records_.
  std::map<std::pair<std::string, std::string>, parking::AuditRecord> notes_;
  /// id.state of the records held, so that a record appended here and read back is held once.
  std::set<std::string> held_;
};

}  // namespace retryloop::console::detail
