#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
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
  /// Whether it is known to come from a holder of the audit key: read back with a valid
  /// signature (audit_signature), or written by this process. Never read from the record itself.
  bool verified = false;
};

/// A record read back from the stream whose text is longer than this is skipped, unparsed.
/// retryloop's own records stay far below it (bound_audit_record).
inline constexpr size_t max_audit_record_bytes = 64 * 1024;
/// A record read back whose arrays and objects nest deeper than this is skipped, unparsed: the
/// JSON library copies and serializes recursively. A record with its filter needs four levels.
inline constexpr size_t max_audit_record_depth = 16;
/// A filter's array with more elements than this, or a string longer than
/// max_audit_filter_text_bytes, is kept in a record as a count and a digest (audit_filter).
inline constexpr size_t max_audit_filter_items = 16;
inline constexpr size_t max_audit_filter_text_bytes = 256;
/// A record keeps at most this much of its error text.
inline constexpr size_t max_audit_error_bytes = 1024;
/// The header that carries a record's signature: the lowercase hex HMAC-SHA256 of the message
/// body with the audit key.
inline constexpr const char* audit_signature_header = "retryloop-audit-signature";

nlohmann::json audit_json(const AuditRecord& record);
/// Reads a record written by audit_json (`verified` and `offset` are not read from it). Throws
/// std::invalid_argument naming what is wrong.
AuditRecord audit_from_json(const nlohmann::json& json);
/// Reads a record as the stream holds it: text longer than max_audit_record_bytes or nested
/// deeper than max_audit_record_depth is refused before it is parsed. Throws
/// std::invalid_argument naming what is wrong. The result is bounded (bound_audit_record).
AuditRecord audit_from_text(std::string_view text);

/// The filter as an audit record keeps it: each array with more than max_audit_filter_items
/// elements, and each string longer than max_audit_filter_text_bytes, becomes
/// {"count": elements or bytes, "sha256": hex digest of its compact JSON text}, so that a count of
/// a million message ids is recorded in a few hundred bytes. Other values are kept as they are.
nlohmann::json audit_filter(const nlohmann::json& filter);
/// Makes `record` small enough to keep: its filter through audit_filter, its error cut to
/// max_audit_error_bytes.
void bound_audit_record(AuditRecord& record);

/// Reads the audit key from `path`: its bytes without a trailing newline, at least 32 of them
/// (e.g. `openssl rand -hex 32 > FILE`). Throws std::invalid_argument naming the file and what is
/// wrong.
std::string read_audit_key(const std::string& path);
/// The lowercase hex HMAC-SHA256 of `body` with `key`.
std::string audit_signature(std::string_view key, std::string_view body);
/// Whether `signature` is `body`'s with `key`, compared in constant time; false for an empty key.
bool audit_signature_valid(std::string_view key, std::string_view body, std::string_view signature);

using AuditCallback = std::function<void(const client::Error& error)>;

/// Appends `record` to the vhost's audit stream (topology::audit_stream_name) through the default
/// exchange, persistent, mandatory, on `channel`, which must be in confirm mode, signed with `key`
/// unless it is empty. `done` gets no error only once the broker confirmed it and did not return
/// it; a missing stream is reported as an error that names it and says how to declare it.
client::Error append_audit(client::Channel& channel, const AuditRecord& record, AuditCallback done,
                           const std::string& key = {});

/// Appends records to the audit stream (append_audit) on a confirm channel of its own. Appends
/// made while the channel opens wait for it. Loop thread only.
class AuditWriter : public std::enable_shared_from_this<AuditWriter> {
 public:
  /// Opens the channel on `connection`. `on_error` is told once if it cannot open or ends; every
  /// append fails from then on. Records are signed with `key` unless it is empty.
  static std::shared_ptr<AuditWriter> open(const std::shared_ptr<client::Connection>& connection,
                                           AuditCallback on_error = {}, std::string key = {});
  /// Appends `record`, its id and time set when empty, bounded (bound_audit_record). `done` gets
  /// no error once the broker confirmed it, and is always called.
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
  std::string key_;
};

/// Reads the audit stream from a point on and keeps following it: each record, in stream order,
/// goes to `on_record`; a record that audit_from_text refuses is skipped and counted, and its
/// reason goes to `on_skipped`.
class AuditReader : public std::enable_shared_from_this<AuditReader> {
 public:
  using RecordHandler = std::function<void(AuditRecord&&)>;
  /// Why a record was skipped, with its offset when known.
  using SkippedHandler = std::function<void(const std::string& why, std::optional<int64_t>)>;

  /// Starts reading on a new channel of `connection`: after `after_offset` when given, else from
  /// `since_ms` (milliseconds since the epoch; the stream starts at a segment boundary, so a few
  /// older records may come too). `on_error` is told once if the channel ends or the stream is
  /// missing. A record is `verified` when it carries a valid signature with `key` (never with an
  /// empty key).
  static std::shared_ptr<AuditReader> start(const std::shared_ptr<client::Connection>& connection,
                                            uint64_t since_ms, std::optional<int64_t> after_offset,
                                            RecordHandler on_record, AuditCallback on_error,
                                            std::string key = {}, SkippedHandler on_skipped = {});
  void stop();
  /// The offset of the last record read, for a reader that resumes after it.
  std::optional<int64_t> last_offset() const { return last_offset_; }
  uint64_t unreadable() const { return unreadable_; }

  AuditReader(RecordHandler on_record, AuditCallback on_error, std::string key,
              SkippedHandler on_skipped);

 private:
  void fail(const client::Error& error);
  void read(const client::Message& message, std::optional<int64_t> offset);

  RecordHandler on_record_;
  AuditCallback on_error_;
  std::string key_;
  SkippedHandler on_skipped_;
  std::shared_ptr<client::Channel> channel_;
  std::optional<int64_t> last_offset_;
  uint64_t unreadable_ = 0;
  bool stopped_ = false;
};

}  // namespace retryloop::parking
