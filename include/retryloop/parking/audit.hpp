#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "retryloop/client/channel.hpp"
#include "retryloop/client/connection.hpp"

namespace retryloop::parking {

/// One entry of the audit trail (docs/operators.md, "Audit trail"): an action on parked messages,
/// or a note on a group of them. An action writes a `started` record before it touches a message
/// and a record with how it ended after, both with the same `id`.
struct AuditRecord {
  /// Shared by the records of one action (random::random_id()).
  std::string id;
  /// Milliseconds since the epoch.
  uint64_t at_ms = 0;
  /// The console's caller (`NAME at ADDRESS`) or the command line's user@host.
  std::string who;
  /// `console` or `cli`.
  std::string via;
  /// `replay`, `purge`, `count`, `edit` or `note`.
  std::string action;
  /// `started`, then `done`, `failed` or `stopped`; a note is `done`.
  std::string state;
  std::string service;
  /// The filter, as the caller gave it; null for none.
  nlohmann::json filter;
  /// How many messages the caller was shown and confirmed, when known.
  std::optional<uint64_t> asked;
  /// How many were replayed, purged, counted or edited.
  std::optional<uint64_t> done;
  /// Copies the broker returned or refused (their originals stayed parked).
  uint64_t failed = 0;
  std::string error;
  /// A note: its text and the group (error cause) it is about.
  std::string note;
  std::string group;
  /// An edit: the parked message and the id of the edited copy.
  std::string message_id;
  std::string new_message_id;
  /// Where the stream keeps it (`x-stream-offset`); set on records read back.
  std::optional<int64_t> offset;
};

nlohmann::json audit_json(const AuditRecord& record);
/// Reads a record written by audit_json. Throws std::invalid_argument naming what is wrong.
AuditRecord audit_from_json(const nlohmann::json& json);

using AuditCallback = std::function<void(const client::Error& error)>;

/// Appends `record` to the vhost's audit stream (topology::audit_stream_name) through the default
/// exchange, persistent, mandatory, on `channel`, which must be in confirm mode. `done` gets no
/// error only once the broker confirmed it and did not return it; a missing stream is reported as
/// an error that names it and says how to declare it.
client::Error append_audit(client::Channel& channel, const AuditRecord& record, AuditCallback done);

/// Appends records to the audit stream (append_audit) on a confirm channel of its own. Appends
/// made while the channel opens wait for it. Loop thread only.
class AuditWriter : public std::enable_shared_from_this<AuditWriter> {
 public:
  /// Opens the channel on `connection`. `on_error` is told once if it cannot open or ends; every
  /// append fails from then on.
  static std::shared_ptr<AuditWriter> open(const std::shared_ptr<client::Connection>& connection,
                                           AuditCallback on_error = {});
  /// Appends `record`, its id and time set when empty. `done` gets no error once the broker
  /// confirmed it, and is always called.
  void append(AuditRecord record, AuditCallback done);
  /// True once the channel is in confirm mode, until it ends.
  bool ready() const { return ready_; }
  /// Closes the channel; waiting and later appends fail.
  void close();

 private:
  void send(const AuditRecord& record, AuditCallback done);
  void fail(const client::Error& error);

  std::shared_ptr<client::Channel> channel_;
  bool ready_ = false;
  client::Error error_;
  std::vector<std::pair<AuditRecord, AuditCallback>> waiting_;
  AuditCallback on_error_;
};

/// Reads the audit stream from a point on and keeps following it: each record, in stream order,
/// goes to `on_record`; a record that is not JSON retryloop wrote is skipped (and counted).
class AuditReader : public std::enable_shared_from_this<AuditReader> {
 public:
  using RecordHandler = std::function<void(AuditRecord&&)>;

  /// Starts reading on a new channel of `connection`: after `after_offset` when given, else from
  /// `since_ms` (milliseconds since the epoch; the stream starts at a segment boundary, so a few
  /// older records may come too). `on_error` is told once if the channel ends or the stream is
  /// missing.
  static std::shared_ptr<AuditReader> start(const std::shared_ptr<client::Connection>& connection,
                                            uint64_t since_ms, std::optional<int64_t> after_offset,
                                            RecordHandler on_record, AuditCallback on_error);
  void stop();
  /// The offset of the last record read, for a reader that resumes after it.
  std::optional<int64_t> last_offset() const { return last_offset_; }
  uint64_t unreadable() const { return unreadable_; }

  AuditReader(RecordHandler on_record, AuditCallback on_error);

 private:
  void fail(const client::Error& error);

  RecordHandler on_record_;
  AuditCallback on_error_;
  std::shared_ptr<client::Channel> channel_;
  std::optional<int64_t> last_offset_;
  uint64_t unreadable_ = 0;
  bool stopped_ = false;
};

}  // namespace retryloop::parking
